"""A TFRecord record's ``tf.train.Example``: the feature keys gpubatch writes and the ones it reads
(its own, the TF Object Detection API's, TensorFlow Datasets'), reading an image, its label and boxes
out of an Example, and writing one deterministically (the same record is the same bytes on every run:
resumed and re-run shards compare equal), framed with its masked CRC-32C. The shards themselves are
read and written in :mod:`.tfrecord`.
"""

from __future__ import annotations

import importlib.util
import math
import operator
import struct
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DependencyError
from ..types import sniff_image_codec

if TYPE_CHECKING:  # (NumPy imported where a record holds floats: a pass-through never loads it)
    import numpy as np

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
    return _masked_crc_parts([data])


def _masked_crc_parts(parts: list[Any]) -> bytes:
    """:func:`_masked_crc` of ``parts`` joined, without joining them."""
    try:
        from crc32c import crc32c
    except ImportError:  # pragma: no cover - a core dependency
        from tfrecord.writer import TFRecordWriter

        return TFRecordWriter.masked_crc(b"".join(parts))
    crc = 0
    for p in parts:
        crc = crc32c(p, crc)
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
        vis = [0 if math.isnan(x) or math.isnan(y) else 2 for x, y in zip(xs, ys)]
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
            v = int(vis[j]) if vis[j] > 0 and not (math.isnan(xs[j]) or math.isnan(ys[j])) else 0
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
    import numpy as np

    return np.asarray(feats[key].float_list.value, np.float32) if key in feats else np.zeros(0, np.float32)


def serialize_example(datum: dict[str, tuple[Any, str]]) -> bytes:
    """A ``tf.train.Example`` of ``datum`` (feature -> (value, "byte" | "float" | "int")), serialized:
    the bytes :func:`example_parts` gives, joined."""
    return b"".join(example_parts(datum)[0])


def example_parts(datum: dict[str, tuple[Any, str]]) -> tuple[list[Any], int]:
    """The serialized ``tf.train.Example`` of ``datum`` as parts to write one after the other, and their
    size: a large value (an image's bytes) is a part of its own, never copied, and the rest is joined
    around it. The bytes are those protobuf's deterministic mode writes with its default (upb) runtime,
    the feature map in upb's key order (byte order, a key that begins a longer one after it; a map's
    order otherwise follows a hash seed of each process), so the same record is the same bytes in every
    process and whatever protobuf runtime is installed (``tests/formats/test_tfrecord_wire.py`` checks
    them against protobuf). Writing them here, not through protobuf's objects, saves the copies of the
    image into and out of the message; an entry whose value is small and repeats from record to record
    (the format, a height, an empty object list) is made once. Raises ``ValueError`` for an integer
    outside int64 and ``TypeError`` for a value of the wrong type, as protobuf does."""
    if not datum:
        return [b""], 0  # (no feature: protobuf writes nothing at all)
    keys = tuple(datum)
    order = _ORDERS.get(keys)
    if order is None:
        order = _ORDERS[keys] = sorted(keys, key=_upb_key)
    parts: list[Any] = []
    run: list[bytes] = []
    entries = _ENTRIES
    for key in order:
        value, kind = datum[key]
        t = type(value)
        if t is int or (t is bytes and len(value) <= _SMALL) or ((t is list or t is tuple) and not value):
            memo = (key, kind, value if t is int or t is bytes else ())
            entry = entries.get(memo)
            if entry is None:
                if len(entries) >= _MEMO_MAX:
                    entries.clear()
                entry = entries[memo] = _entry(key, value, kind)
            run.append(entry)
        elif kind == "byte" and not isinstance(value, (list, tuple, str)) and not _is_array(value) and len(value) > _SMALL:
            if t is not bytes:
                value = memoryview(value).cast("B")  # (its bytes, whatever its item size)
            run.append(_large_bytes_head(key, value))
            parts.append(b"".join(run))
            parts.append(value)
            run = []
        else:
            run.append(_entry(key, value, kind))
    parts.append(b"".join(run))
    size = sum(len(p) for p in parts)
    head = b"\x0a" + _varint(size)
    parts[0] = head + parts[0]
    return parts, size + len(head)


_SMALL = 256  # bytes: a value this long or shorter may repeat (a format, a class name); longer, its own part
_MEMO_MAX = 8192  # entries kept from record to record at most
_ENTRIES: dict[tuple[str, str, Any], bytes] = {}
_ORDERS: dict[tuple[str, ...], list[str]] = {}
_VARINT1 = [bytes([i]) for i in range(128)]
_INT64 = (-(1 << 63), 1 << 63)


def _upb_key(key: str) -> list[int]:
    return [*key.encode(), 256]  # (256 sorts after every byte: "ab" before "a")


def _varint(n: int) -> bytes:
    if n < 128:
        return _VARINT1[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _int64(v: Any) -> int:
    n = operator.index(v)  # (a float or a string is a TypeError, as protobuf makes it)
    if not _INT64[0] <= n < _INT64[1]:
        raise ValueError(f"Value out of range: {n}")
    return n & 0xFFFFFFFFFFFFFFFF


def _is_array(value: Any) -> bool:
    """Whether ``value`` is a NumPy array (none is where NumPy was never imported)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _feature(value: Any, kind: str) -> bytes:
    """A ``Feature`` message: its one list (packed where numbers), present even where empty."""
    if not isinstance(value, (list, tuple)) and not _is_array(value):
        value = [value]
    if kind == "byte":
        values = [v if type(v) is bytes else memoryview(v).tobytes() for v in value]  # (bytes-like only, as protobuf)
        return _field(b"\x0a", b"".join([b"\x0a" + _varint(len(v)) + v for v in values]))
    if kind == "int":
        packed = b"".join([_varint(_int64(v)) for v in value])
        return _field(b"\x1a", _field(b"\x0a", packed) if packed else b"")
    if kind == "float":
        try:
            packed = struct.pack(f"<{len(value)}f", *value)
        except OverflowError:  # beyond float32: infinite, as protobuf stores it
            import numpy as np

            with np.errstate(over="ignore"):
                packed = np.asarray(value, np.float64).astype("<f4").tobytes()
        return _field(b"\x12", _field(b"\x0a", packed) if packed else b"")
    raise ValueError(f"unknown feature kind {kind!r}")


def _entry(key: str, value: Any, kind: str) -> bytes:
    """One entry of the ``Features`` map, as the map field's element (tag, size, key, value)."""
    k = key.encode()
    entry = b"\x0a" + _varint(len(k)) + k + _field(b"\x12", _feature(value, kind))
    return b"\x0a" + _varint(len(entry)) + entry


def _large_bytes_head(key: str, value: Any) -> bytes:
    """What comes before a one-value bytes feature's value in its map entry."""
    n = len(value)
    listed = n + 1 + len(_varint(n))  # the BytesList
    feature = listed + 1 + len(_varint(listed))
    k = key.encode()
    inner = b"\x0a" + _varint(len(k)) + k + b"\x12" + _varint(feature) + b"\x0a" + _varint(listed) + b"\x0a" + _varint(n)
    return b"\x0a" + _varint(len(inner) + n) + inner


def frame_parts(data: Any, size: int | None = None) -> tuple[bytes, bytes]:
    """TFRecord's framing of one record: what goes before ``data`` (its length and the length's masked
    CRC-32C) and after it (the data's masked CRC-32C); a writer writes the three as they are, no copy of
    the data made. ``data`` may be a list of parts (:func:`example_parts`) of ``size`` bytes in all."""
    parts = data if isinstance(data, list) else [data]
    length = struct.pack("<Q", size if size is not None else sum(len(p) for p in parts))
    return length + _masked_crc(length), _masked_crc_parts(parts)
