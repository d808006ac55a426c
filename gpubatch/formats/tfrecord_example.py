"""A TFRecord record's ``tf.train.Example``: the feature keys gpubatch writes and the ones it reads
(its own, the TF Object Detection API's, TensorFlow Datasets'), reading an image, its label and boxes
out of an Example, and writing one deterministically (the same record is the same bytes on every run:
resumed and re-run shards compare equal), framed with its masked CRC-32C. The shards themselves are
read and written in :mod:`.tfrecord`.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DependencyError
from ..types import sniff_image_codec

_OLD_PROTOBUF = ("the installed tfrecord package does not work with this protobuf ({}: Descriptors cannot be "
                 "created directly): pip install -U 'tfrecord>=1.14.6'")


_LOADING = threading.Lock()


def example_pb2() -> Any:
    """The ``tfrecord`` package's ``tf.train.Example`` protobuf module, loaded without running the
    package's ``__init__``: that imports ``tfrecord.torch``, so PyTorch wherever it is installed (1.3 s of
    every worker process that writes or reads TFRecord, on the 2-core CI machine with torch 2.13 CPU).
    Once loaded whole it goes into ``sys.modules`` under its own name, where a later ``import tfrecord``
    finds it (the message types are registered once). Threads that ask at once wait for one load."""
    mod = sys.modules.get("tfrecord.example_pb2")
    if mod is not None:
        return mod
    with _LOADING:
        mod = sys.modules.get("tfrecord.example_pb2")
        if mod is not None:
            return mod
        found = importlib.util.find_spec("tfrecord")  # (finding a top-level package runs none of it)
        path = Path(next(iter(found.submodule_search_locations or ()), "")) / "example_pb2.py" if found else None
        if path is None or not path.is_file():  # pragma: no cover - a core dependency
            raise DependencyError("the tfrecord format needs: pip install tfrecord")
        spec = importlib.util.spec_from_file_location("tfrecord.example_pb2", path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except TypeError as e:  # old generated protobuf code against a newer protobuf runtime
            raise DependencyError(_OLD_PROTOBUF.format(e.__class__.__name__)) from None
        sys.modules["tfrecord.example_pb2"] = mod  # (whole: no thread sees it half made)
        return mod


def _masked_crc(data: bytes) -> bytes:
    """TFRecord's masked CRC-32C of ``data``, as the 4 little-endian bytes a record holds."""
    try:
        from crc32c import crc32c
    except ImportError:  # pragma: no cover - a core dependency
        from tfrecord.writer import TFRecordWriter

        return TFRecordWriter.masked_crc(data)
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)



_IMAGE_KEYS = ("image/encoded", "image", "image_raw", "img", "jpeg", "encoded")
_LABEL_KEYS = ("image/class/label", "label")
_NAME_KEYS = ("image/filename", "file_name", "filename")
# Every feature the reader takes besides the image's (the writer's keys among them). ``image/key/sha256``
# (the TF Object Detection API's hash of the encoded bytes) is dropped without a word: gpubatch keeps the
# bytes themselves. Any other feature is named in a warning, as it does not reach the output.
_READ_KEYS = frozenset(_LABEL_KEYS + _NAME_KEYS + (
    "image/format", "image/source_id", "image/height", "image/width", "image/class/text",
    "image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax", "image/object/bbox/ymax",
    "image/object/class/label", "image/object/class/text", "image/object/is_crowd", "image/object/area",
    "gpubatch/meta", "image/key/sha256", "image/object/keypoint/x", "image/object/keypoint/y",
    "image/object/keypoint/visibility", "image/object/keypoint/num", "image/object/keypoint/text",
    "video/encoded", "video/format", "video/filename", "video/source_id", "video/class/label", "video/class/text",
    "audio/encoded", "audio/format", "audio/filename", "audio/source_id", "audio/class/label", "audio/class/text",
    "audio/sample_rate", "audio/text"))


def _first_bytes(feats: Any, keys: tuple[str, ...]) -> bytes | None:
    return next((v[0] for v in (_bytes(feats, k) for k in keys) if v), None)


def _image_key(feats: Any) -> str | None:
    """Where the record's encoded image is: a known key, else the one bytes feature that is an image."""
    key = next((k for k in _IMAGE_KEYS if _bytes(feats, k)), None)
    if key is not None:
        return key
    found = [k for k in sorted(feats) for v in [_bytes(feats, k)] if v and sniff_image_codec(v[0][:16])]
    return found[0] if len(found) == 1 else None


def _image_bytes(feats: Any) -> bytes | None:
    key = _image_key(feats)
    return None if key is None else _bytes(feats, key)[0]


def _object_keypoints(feats: Any, n: int, h: int, w: int,
                      extra: tuple) -> tuple[tuple[dict, ...], list[list[str]]]:
    """The TF Object Detection API's ``image/object/keypoint/*`` features as COCO ``keypoints`` (pixels,
    ``[x, y, v]`` per point) and ``num_keypoints`` in each box's extra fields, and each box's keypoint
    names (from ``keypoint/text``; empty lists without it). A point without a visibility is labeled
    (2) unless its coordinates are NaN, as the Object Detection API's decoder takes them."""
    xs, ys = _floats(feats, "image/object/keypoint/x"), _floats(feats, "image/object/keypoint/y")
    if not n or len(xs) != len(ys) or len(xs) % n:
        raise ValueError(f"{len(xs)} keypoint x and {len(ys)} y values do not split evenly among {n} objects")
    k = len(xs) // n
    vis = _ints(feats, "image/object/keypoint/visibility")
    if len(vis) != len(xs):
        vis = [0 if np.isnan(x) or np.isnan(y) else 2 for x, y in zip(xs, ys)]
    shown = _ints(feats, "image/object/keypoint/num")
    text = [b.decode("utf-8", "replace") for b in _bytes(feats, "image/object/keypoint/text")]
    out, names = [], []
    for i in range(n):
        e = dict(extra[i]) if extra else {}
        names.append(text[i * k : (i + 1) * k] if len(text) == len(xs) else [])
        if names[-1] and not any(names[-1]):  # no names: a box padded to the others' count (see the writer)
            out.append(e)
            continue
        flat = []
        for j in range(i * k, (i + 1) * k):
            v = int(vis[j]) if vis[j] > 0 and not (np.isnan(xs[j]) or np.isnan(ys[j])) else 0
            flat += [round(float(xs[j]) * w, 2), round(float(ys[j]) * h, 2), v] if v else [0, 0, 0]
        e["keypoints"] = [int(v) if float(v).is_integer() else v for v in flat]
        e["num_keypoints"] = int(shown[i]) if len(shown) == n else sum(1 for v in flat[2::3] if v)
        out.append(e)
    return tuple(out), names


def _label(feats: Any) -> int | None:
    return next((v[0] for v in (_ints(feats, k) for k in _LABEL_KEYS) if v), None)


def _bytes(feats: Any, key: str) -> list[bytes]:
    return list(feats[key].bytes_list.value) if key in feats else []


def _ints(feats: Any, key: str) -> list[int]:
    return [int(v) for v in feats[key].int64_list.value] if key in feats else []


def _floats(feats: Any, key: str) -> np.ndarray:
    return np.asarray(feats[key].float_list.value, np.float32) if key in feats else np.zeros(0, np.float32)


def serialize_example(datum: dict[str, tuple[Any, str]]) -> bytes:
    """A ``tf.train.Example`` of ``datum`` (feature -> (value, "byte" | "float" | "int")), serialized with
    its feature map in key order (protobuf's deterministic mode): the same record is the same bytes in
    every process (a map's order otherwise follows a hash seed of each process)."""
    ex = example_pb2().Example()
    feats = ex.features.feature
    for key, (value, kind) in datum.items():
        if not isinstance(value, (list, tuple, np.ndarray)):
            value = [value]
        getattr(feats[key], _LISTS[kind]).value.extend(value)  # (in place: no list message made and copied)
    return ex.SerializeToString(deterministic=True)


_LISTS = {"byte": "bytes_list", "float": "float_list", "int": "int64_list"}


def frame_parts(data: bytes) -> tuple[bytes, bytes]:
    """TFRecord's framing of one record: what goes before ``data`` (its length and the length's masked
    CRC-32C) and after it (the data's masked CRC-32C); a writer writes the three as they are, no copy of
    the data made."""
    length = struct.pack("<Q", len(data))
    return length + _masked_crc(length), _masked_crc(data)
