"""TFRecord shards of ``tf.train.Example`` records, built on the ``tfrecord`` package.

Shards are ``NAME-00000-of-000NN.tfrecord`` with a DALI/``tfrecord``-package index
``NAME-00000-of-000NN.idx`` beside each (``<offset> <size>`` per record). Framing (masked CRC-32C of
length and data) and Example serialization come from the ``tfrecord`` package; reading checks both
CRCs, as TensorFlow does, so a damaged record is reported rather than half-parsed.

Features written to every record (every key in every record, as TF's FixedLenFeature and older
DALI need): ``image/encoded``, ``image/format``, ``image/filename``, ``image/source_id``,
``image/height``, ``image/width``, ``image/class/label`` (0-based class index, -1 when unlabeled),
``image/class/text``, ``image/object/bbox/{xmin,ymin,xmax,ymax}`` (normalized to [0, 1], as the TF
Object Detection API writes them), ``image/object/class/label`` (category ids),
``image/object/class/text``, ``image/object/is_crowd``, ``image/object/area`` and ``gpubatch/meta``
(JSON of the per-record fields no standard key holds, e.g. COCO segmentation; other readers ignore it).
Where the dataset's categories name keypoints, COCO keypoints are also written (and read) as the TF
Object Detection API's ``image/object/keypoint/{x,y,visibility,num,text}``.

Reading also takes TensorFlow Datasets' layout (``NAME-train.tfrecord-00000-of-00016`` shards whose
Examples hold ``image``, ``label`` and ``file_name``, class names in ``label.labels.txt`` beside them)
and, failing known keys, the one bytes feature that holds an image.
"""

from __future__ import annotations

import os
import re
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from .._paths import MAX_RECORD_BYTES, open_fetched, read_head, read_regular, source_files, source_root
from ..errors import DependencyError, FormatError
from ..types import Boxes, DatasetInfo, Media, Record, class_table, keypoint_flips, sniff_image_codec
from . import fields, register_format
from .base import (
    Damaged,
    Format,
    OpenShards,
    Reader,
    WriteOptions,
    check_one_split,
    compression,
    image_size,
    shortfall,
)
from .manifest import expected_records, read_manifest
from .sinks import ShardFile, ShardSink
from .tfrecord_example import (
    _NAME_KEYS,
    _READ_KEYS,
    _bytes,
    _first_bytes,
    _floats,
    _image_bytes,
    _image_key,
    _ints,
    _label,
    _masked_crc,
    _object_keypoints,
    example_parts,
    example_pb2,
    frame_parts,
)

_SHARD = re.compile(r".*-\d{5}-of-\d{5}$")
_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")  # TensorFlow's, its tutorials' and Kaggle's names


def _header_ok(head: bytes, pos: int, size: int) -> int:
    """The whole length (16 + data) of the record whose 12-byte header ``head`` starts at byte ``pos``
    of a ``size``-byte shard, or 0 where the length's CRC fails or the record would pass the end."""
    if len(head) < 12 or _masked_crc(head[:8]) != head[8:12]:
        return 0
    (length,) = struct.unpack("<Q", head[:8])
    return 16 + length if pos + 16 + length <= size else 0


def _resync(f: Any, start: int, size: int) -> int | None:
    """The first byte at or after ``start`` where a record header holds (its length's CRC, a length that
    fits the shard), or None: where a damaged shard's readable records start again."""
    chunk = 1 << 20
    pos = start
    while pos + 16 <= size:
        f.seek(pos)
        buf = f.read(chunk + 11)
        for i in range(0, min(chunk, len(buf) - 11)):
            if _header_ok(buf[i : i + 12], pos + i, size):
                return pos + i
        pos += chunk
    return None


def _is_shard_name(name: str) -> bool:
    """``*.tfrecord``, ``*.tfrecords``, ``*.tfrec`` or ``NAME-00000-of-00010[.tfrecord]``, gzipped or not."""
    base = name.removesuffix(".gz")
    return base.endswith(_SUFFIXES) or bool(_SHARD.match(base.removesuffix(".tfrecord")))


def _looks_like_tfrecord(path: Path) -> bool:
    """A first record header whose length CRC holds, or a gzipped file named as a shard (the reader then
    says how to unpack it)."""
    head = read_head(path, 12)
    if compression(head):
        return _is_shard_name(path.name)
    try:
        return len(head) == 12 and _masked_crc(head[:8]) == head[8:12]
    except DependencyError:  # the tfrecord package cannot load: its names tell (its reader then says why)
        return _is_shard_name(path.name)


def shard_files(path: Path, one_split: bool = True) -> list[Path]:
    """The shards a source names: a file, a pattern's shard-named files, or a folder's (refused where
    they are several splits' and ``one_split``: :func:`~gpubatch.formats.base.check_one_split`)."""
    path = Path(path)
    matched = source_files(path)
    if matched is not None:
        return [p for p in matched if _is_shard_name(p.name)]
    if path.is_file():
        return [path]
    shards = sorted(p for p in path.iterdir() if p.is_file() and _is_shard_name(p.name))
    if one_split:
        check_one_split(shards, path)
    return shards


def _index_of(shard: Path) -> Path:
    return shard.with_suffix(".idx") if shard.suffix == ".tfrecord" else shard.with_name(shard.name + ".idx")


def _refuse_compressed(shard: Path) -> None:
    kind = compression(read_head(shard, 6))
    if kind:
        raise FormatError(
            f"{shard} is {kind}-compressed (TFRecordOptions compression_type='GZIP' writes such shards): unpack the "
            "shards first (gunzip, or `gzip -dc SHARD > SHARD.tfrecord`; unxz, bunzip2, unzstd for the others); "
            "gpubatch, like DALI, reads records by offset, which compressed shards do not allow")


def _describes(rows: list[tuple[int, int]], size: int) -> bool:
    """True where index ``rows`` describe a ``size``-byte shard exactly: every record one after the other
    from byte 0 to its end."""
    pos = 0
    for off, ln in rows:
        if off != pos or ln < 16:
            return False
        pos += ln
    return pos == size and (bool(rows) or not size)


def _pread(f: Any, pos: int, n: int) -> bytes:
    f.seek(pos)
    return f.read(n)


class TFRecordReader(Reader):
    def __init__(self, path: Path):
        super().__init__(source_root(path))
        self.files_given = not Path(path).is_dir()
        self.shards = shard_files(path)
        if not self.shards:
            raise FormatError(f"no .tfrecord shards in {path}")
        self.files = OpenShards(self.shards)
        self.manifest = read_manifest(self.path) or {}
        self.keypoint_flip = keypoint_flips(self.manifest.get("categories"))

    def _scan(self) -> list[tuple[int, int, int] | Damaged]:
        entries: list[tuple[int, int, int] | Damaged] = []
        for s, shard in enumerate(self.shards):
            _refuse_compressed(shard)
            size = shard.stat().st_size
            listed = self._index(shard)
            if listed is not None and _describes(listed, size):
                rows: list[Any] = list(listed)
                named: list[tuple[str, str]] = []
            else:
                rows = self._scan_shard(shard, size)
                named = self._index_shortfall(shard, listed, rows, size)
            found = [r if isinstance(r, Damaged) else (s, r[0], r[1]) for r in rows]
            entries.extend(shortfall(shard, found, expected_records(self.manifest, shard), named))
        return entries

    def _index(self, shard: Path) -> list[tuple[int, int]] | None:
        """The rows (offset, length) of the index beside ``shard``, or None where there is none (or it is
        no index: a warning says so)."""
        idx = _index_of(shard)
        if not idx.is_file():
            return None
        try:
            return [(int(a), int(b)) for a, b, *_ in (ln.split() for ln in read_regular(idx).decode("ascii").splitlines()
                                                      if ln.strip())]
        except (OSError, ValueError):
            self.warnings.append(f"the index {idx.name} beside {shard.name} is unreadable: the shard was scanned")
            return None

    def _index_shortfall(self, shard: Path, listed: list[tuple[int, int]] | None, rows: list[Any],
                         size: int) -> list[tuple[str, str]]:
        """Where the index does not describe the shard: (key, reason) of each record it lists at or past
        the end of what the scan read whole (the shard was cut short), with a warning where it is stale
        in other ways."""
        if listed is None:
            return []
        idx = _index_of(shard)
        whole = max((off + ln for off, ln in (r for r in rows if not isinstance(r, Damaged))), default=0)
        known = {r[0] for r in rows if not isinstance(r, Damaged)}
        lost = [(off, ln) for off, ln in listed if off >= whole and off not in known]
        if not lost or any(off not in known for off, _ in listed if off < whole):
            self.warnings.append(f"the index {idx.name} does not describe {shard.name} (empty, stale or damaged): "
                                 "the shard was scanned instead")
        return [(f"{shard.name}@{off}", f"the shard's index {idx.name} lists a record at byte {off:,}, but the "
                 f"shard holds {size:,} bytes{' and stops inside it' if off < size else ''}: it is cut short and "
                 "the record is lost") for off, _ in lost]

    @staticmethod
    def _scan_shard(shard: Path, size: int) -> list[tuple[int, int] | Damaged]:
        """Every record's (offset, length) by walking the headers; a stretch where no header holds (a
        damaged length, a truncated end) becomes one Damaged entry, and the walk goes on at the next
        byte where a record header holds again, keeping the complete records after the damage."""
        rows: list[tuple[int, int] | Damaged] = []
        pos = 0
        with os.fdopen(open_fetched(shard), "rb") as f:
            while pos < size:
                f.seek(pos)
                total = _header_ok(f.read(12), pos, size)
                if total:
                    rows.append((pos, total))
                    pos += total
                    continue
                nxt = _resync(f, pos + 1, size)
                lost = (nxt if nxt is not None else size) - pos
                what = ("a truncated last record" if nxt is None and pos + 12 <= size and
                        _masked_crc(_pread(f, pos, 8)) == _pread(f, pos + 8, 4) else "no readable record header")
                rows.append(Damaged(f"{shard.name}@{pos}", f"{shard}@{pos}",
                                    f"damaged shard: bytes {pos:,}-{pos + lost:,} hold {what}; the records there "
                                    "are lost"))
                if nxt is None:
                    break
                pos = nxt
        return rows

    def info(self) -> DatasetInfo:
        if self.manifest.get("classes") is not None:
            return DatasetInfo(classes=self.manifest["classes"], categories=tuple(self.manifest.get("categories") or ()))
        labels, texts, cats = [], {}, {}
        dropped: Counter[str] = Counter()
        for entry in self.entries():
            if isinstance(entry, Damaged):
                continue
            try:
                feats = self._features(entry)
                lab = fields.label(_label(feats))
            except ValueError:
                continue
            image_key = _image_key(feats)
            dropped.update(k for k in feats if k not in _READ_KEYS and k != image_key)
            if lab is not None:
                labels.append(lab)
                txt = _bytes(feats, "image/class/text")
                if txt:
                    texts[lab] = txt[0].decode("utf-8", "replace")
            objects = _ints(feats, "image/object/class/label")
            for cid, name in zip(objects, _bytes(feats, "image/object/class/text")):
                cats.setdefault(cid, {"name": name.decode("utf-8", "replace")})
            names = _bytes(feats, "image/object/keypoint/text")
            if objects and names and len(names) % len(objects) == 0:
                k = len(names) // len(objects)
                for i, cid in enumerate(objects):
                    own = [b.decode("utf-8", "replace") for b in names[i * k : (i + 1) * k]]
                    if any(own):
                        cats.setdefault(cid, {"name": str(cid)}).setdefault("keypoints", own)
        names = self._tfds_names()
        if names and max(labels, default=-1) < len(names) and not texts:
            texts = dict(enumerate(names))
        classes = class_table(texts, labels)
        categories = tuple({"id": c, "supercategory": "", **more} for c, more in sorted(cats.items()))
        if dropped:
            named = ", ".join(f"{k} ({n} record{'s' if n > 1 else ''})" for k, n in sorted(dropped.items()))
            self.warnings.append(f"features gpubatch does not carry over, left out of the output: {named}")
        return DatasetInfo(classes=classes, categories=categories)

    def _features(self, entry: tuple[int, int, int]) -> Any:
        s, off, ln = entry
        if ln > MAX_RECORD_BYTES + 16:
            raise ValueError(f"a record of {ln - 16:,} bytes, above the {MAX_RECORD_BYTES:,}-byte bound on one record")
        buf = self.files.pread(s, ln, off)
        if len(buf) != ln:
            raise ValueError("truncated record")
        if _masked_crc(buf[:8]) != buf[8:12]:
            raise ValueError("corrupt record length (CRC mismatch)")
        (length,) = struct.unpack("<Q", buf[:8])
        if 16 + length != ln:
            raise ValueError("record length disagrees with the index")
        data = buf[12 : 12 + length]
        if _masked_crc(data) != buf[12 + length :]:
            raise ValueError("corrupt record data (CRC mismatch)")
        try:
            ex = example_pb2().Example.FromString(data)
        except Exception as e:  # protobuf's DecodeError and friends
            raise ValueError(f"not a tf.train.Example: {e}") from None
        return ex.features.feature

    def _tfds_names(self) -> list[str]:
        """Class names of a TensorFlow Datasets folder (``label.labels.txt``, one a line), or none."""
        folder = self.path if self.path.is_dir() else self.path.parent
        try:
            text = read_regular(folder / "label.labels.txt", 1 << 28).decode("utf-8")
        except (OSError, ValueError):
            return []
        return [ln.strip() for ln in text.splitlines() if ln.strip()]

    def shard_paths(self) -> list[Path]:
        return list(self.shards)

    def where(self, entry: tuple[int, int, int]) -> tuple[str, str]:
        s, off, _ = entry
        return f"{self.shards[s].name}@{off}", f"{self.shards[s]}@{off}"

    def _read(self, entry: tuple[int, int, int]) -> Record:
        s, off, _ = entry
        origin = f"{self.shards[s]}@{off}"
        try:
            feats = self._features(entry)
        except ValueError as e:
            raise self.record_error(f"{self.shards[s].name}@{off}", origin, e) from None
        data = _image_bytes(feats)
        if data is None and _bytes(feats, "video/encoded"):
            return self._video(feats, s, off, origin)
        if data is None and _bytes(feats, "audio/encoded"):
            return self._video(feats, s, off, origin, "audio")
        if data is None:
            raise self.record_error(f"{self.shards[s].name}@{off}", origin,
                                    f"no image feature (has: {', '.join(sorted(feats)) or 'none'})")
        fname = (_first_bytes(feats, _NAME_KEYS) or b"").decode("utf-8", "surrogateescape")
        source_id = (_bytes(feats, "image/source_id") or [b""])[0].decode("utf-8", "surrogateescape")
        key = source_id or (fname.rsplit(".", 1)[0] if fname else f"{self.shards[s].stem}_{off}")
        try:
            meta, label, boxes = self._fields(feats, data)
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        if fname:
            meta.setdefault("filename", fname)
        codec = sniff_image_codec(data) or "unknown"
        return Record(key=key, data=data, codec=codec, label=label, boxes=boxes, meta=meta, origin=origin)

    @property
    def media(self) -> str:  # type: ignore[override]
        """"video" where the first record read holds ``video/encoded`` (a video or clip dataset), "audio" where
        it holds ``audio/encoded``, else "image"."""
        def of(entry: Any) -> str:
            feats = self._features(entry)
            return "video" if _bytes(feats, "video/encoded") else "audio" if _bytes(feats, "audio/encoded") else "image"

        def named(entry: Any) -> str:  # (the feature names in the record's bytes, whatever else is damaged: the
            s, off, ln = entry  # media's ``encoded`` key comes before its bytes, in the record's first MiB)
            buf = self.files.pread(s, min(ln, 1 << 20), off)
            for media in ("video", "audio", "image"):
                if f"{media}/encoded".encode() in buf:
                    return media
            raise ValueError("no media's feature named")

        # (where every first record is damaged, the feature names in their bytes still tell: each record's own
        # error comes when it is read, rather than the run refused for its options' media)
        return self.first_media(of, "") or self.first_media(named)

    def _video(self, feats: Any, s: int, off: int, origin: str, media: str = "video") -> Record:
        """A record of a video (or audio) dataset: ``video/encoded`` (a video file's bytes, or a clip's
        .npy) with its ``video/format``, ``video/filename``, ``video/source_id`` and ``video/class/label``;
        the same under ``audio/`` with ``audio/text`` (a transcript)."""
        from ..engine.codecs.audio_io import sniff_audio
        from ..engine.codecs.video_probe import sniff_container

        data = _bytes(feats, f"{media}/encoded")[0]
        fmt = (_bytes(feats, f"{media}/format") or [b""])[0].decode("ascii", "replace").lower()
        fname = (_bytes(feats, f"{media}/filename") or [b""])[0].decode("utf-8", "surrogateescape")
        key = (_bytes(feats, f"{media}/source_id") or [b""])[0].decode("utf-8", "replace") or f"{self.shards[s].stem}_{off}"
        meta_raw = (_bytes(feats, "gpubatch/meta") or [b""])[0]
        try:
            meta = fields.json_object(meta_raw, "gpubatch/meta") if meta_raw else {}
            label = fields.label((_ints(feats, f"{media}/class/label") or [-1])[0], f"{media}/class/label")
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        if fname:
            meta.setdefault("filename", fname)
        text = (_bytes(feats, "audio/text") or [b""])[0].decode("utf-8", "replace") if media == "audio" else ""
        if text:
            meta.setdefault("text", text)
        sniff = sniff_container if media == "video" else sniff_audio
        codec = "npy" if data[:6] == b"\x93NUMPY" else sniff(data) or fmt or ("mp4" if media == "video" else "wav")
        return Record(key=key, data=data, media=Media(media), codec=codec, label=label, meta=meta, origin=origin)

    def _fields(self, feats: Any, data: bytes) -> tuple[dict, int | None, Boxes | None]:
        """The record's metadata, class and boxes, each field checked (a ValueError names the one at fault)."""
        import numpy as np

        meta_raw = (_bytes(feats, "gpubatch/meta") or [b""])[0]
        meta = fields.json_object(meta_raw, "gpubatch/meta") if meta_raw else {}
        box_extra = meta.pop("box_extra", None)
        has_boxes = meta.pop("has_boxes", None)
        label = fields.label(_label(feats), "image/class/label")
        xmin = _floats(feats, "image/object/bbox/xmin")
        if not len(xmin) and not ("image/object/bbox/xmin" in feats and has_boxes):
            return meta, label, None
        h = fields.side((_ints(feats, "image/height") or [0])[0], "image/height")
        w = fields.side((_ints(feats, "image/width") or [0])[0], "image/width")
        if not h or not w:
            from ..engine.codecs.headers import probe

            hdr = probe(data)
            h, w = hdr.height, hdr.width
        corners = [xmin, *(_floats(feats, f"image/object/bbox/{k}") for k in ("ymin", "xmax", "ymax"))]
        n = len(xmin)
        if any(len(c) != n for c in corners):
            raise ValueError("image/object/bbox/{xmin,ymin,xmax,ymax} hold " + ", ".join(str(len(c)) for c in corners)
                             + " values: one each per box is due")
        if not np.isfinite(np.stack(corners)).all():
            raise ValueError("image/object/bbox holds values that are not finite numbers")
        xyxy = (np.stack(corners, axis=1) if n else np.zeros((0, 4), np.float32)) * np.array([w, h, w, h], np.float32)
        crowd = _ints(feats, "image/object/is_crowd") or [0] * n
        labels = _ints(feats, "image/object/class/label") or [0] * n
        if len(crowd) != n or len(labels) != n:
            raise ValueError(f"{n} boxes, but {len(labels)} image/object/class/label and {len(crowd)} "
                             "image/object/is_crowd values")
        extra = tuple(box_extra) if isinstance(box_extra, list) and len(box_extra) == n and all(
            isinstance(e, dict) for e in box_extra) else ()
        flips = self.keypoint_flip
        if not any("keypoints" in e for e in extra) and _floats(feats, "image/object/keypoint/x").size:
            extra, names = _object_keypoints(feats, n, h, w, extra)
            cats = [{"id": int(c), "keypoints": k} for c, k in zip(labels, names)]
            flips = {**keypoint_flips(cats), **flips}
        return meta, label, Boxes(xyxy, labels, (h, w), crowd, extra, flips)

    def close(self) -> None:
        self.files.close()


#: a record without boxes: its object features, empty (as a record with boxes has them, in every record)
_NO_OBJECTS: dict[str, tuple[Any, str]] = {
    **{f"image/object/bbox/{k}": ([], "float") for k in ("xmin", "ymin", "xmax", "ymax")},
    "image/object/class/label": ([], "int"),
    "image/object/class/text": ([], "byte"),
    "image/object/is_crowd": ([], "int"),
    "image/object/area": ([], "float"),
}


class TFRecordSink(ShardSink):
    """One TFRecord shard ``NAME-00000-of-000NN.tfrecord`` and its index (``<offset> <size>`` a record):
    ``tf.train.Example`` records of the ``tfrecord`` package's protobuf, serialized deterministically."""

    def __init__(self, root: Path, task: Any, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, task, info, options)
        self._f = ShardFile(root, task.name)
        self.files.append(self._f)
        self._index: list[str] = []
        self._cat_names = {int(c["id"]): str(c.get("name", "")) for c in info.categories}
        self._kp_names = {int(c["id"]): [str(n) for n in c["keypoints"]] for c in info.categories
                          if isinstance(c.get("keypoints"), list)}

    def write(self, record: Record) -> None:
        (error,) = self.write_many([record])
        if error is not None:
            raise error

    def write_many(self, records: list[Record]) -> list[BaseException | None]:
        # each record's framing around its serialized Example, not a framed copy of it; a batch's parts
        # written together (ShardFile.write_parts)
        parts: list[Any] = []
        errors: list[BaseException | None] = []
        at = self._f.size
        for record in records:
            try:
                data, size = example_parts(self._datum(record))
            except (ValueError, RecursionError) as e:
                errors.append(e)
                continue
            head, tail = frame_parts(data, size)
            n = len(head) + size + len(tail)
            self._index.append(f"{at} {n}\n")
            at += n
            parts += (head, *data, tail)
            self.count += 1
            self.bytes += len(record.data)
            errors.append(None)
        self._f.write_parts(parts)
        return errors

    def _close(self) -> dict[str, Any]:
        idx = ShardFile(self.root, _index_of(Path(self.task.name)).name)
        idx.write("".join(self._index).encode("ascii"))
        self.files.append(idx)
        return {}

    def _datum(self, r: Record) -> dict[str, tuple[Any, str]]:
        if r.media in (Media.VIDEO, Media.AUDIO):
            return self._video_datum(r)
        meta = dict(r.meta)
        h, w = image_size(r)
        classes = self.info.classes
        text = classes[r.label] if r.label is not None and 0 <= r.label < len(classes) else ""
        b = r.boxes
        fname = r.filename
        common = {
            "image/encoded": (r.data, "byte"),
            "image/format": (r.codec.upper().encode() if r.codec == "jpeg" else r.codec.encode(), "byte"),
            "image/filename": (fname.encode("utf-8", "surrogateescape"), "byte"),  # (a name's bytes as they were)
            "image/source_id": (r.key.encode("utf-8", "surrogateescape"), "byte"),
            "image/height": (h, "int"),
            "image/width": (w, "int"),
            "image/class/label": (-1 if r.label is None else int(r.label), "int"),
            "image/class/text": (text.encode(), "byte"),
        }
        if b is None:  # (no boxes: the object features empty, as the detection readers expect them)
            return {**self._keypoints(b), **common, **_NO_OBJECTS,
                    "gpubatch/meta": (fields.json_text(meta, sort_keys=True, default=str).encode(), "byte")}
        nb = b.normalized()
        meta["has_boxes"] = True
        if any(b.extra):
            meta["box_extra"] = [dict(e) for e in b.extra]
        cats = [int(c) for c in b.labels]
        return {**self._keypoints(b), **common, **{
            "image/object/bbox/xmin": (nb[:, 0].tolist(), "float"),
            "image/object/bbox/ymin": (nb[:, 1].tolist(), "float"),
            "image/object/bbox/xmax": (nb[:, 2].tolist(), "float"),
            "image/object/bbox/ymax": (nb[:, 3].tolist(), "float"),
            "image/object/class/label": (cats, "int"),
            "image/object/class/text": ([self._cat_names.get(c, str(c)).encode() for c in cats], "byte"),
            "image/object/is_crowd": ([int(x) for x in b.iscrowd], "int"),
            "image/object/area": ([float((x1 - x0) * (y1 - y0)) for x0, y0, x1, y1 in b.xyxy], "float"),
            "gpubatch/meta": (fields.json_text(meta, sort_keys=True, default=str).encode(), "byte"),
        }}

    def _video_datum(self, r: Record) -> dict[str, tuple[Any, str]]:
        """A video record (a file's bytes, or a clip as .npy) under ``video/*`` keys, with its class; an
        audio record (a file's bytes, or features as .npy) the same under ``audio/*``, with its sample
        rate and transcript."""
        classes = self.info.classes
        text = classes[r.label] if r.label is not None and 0 <= r.label < len(classes) else ""
        m = r.media.value
        out = {
            f"{m}/encoded": (r.data, "byte"),
            f"{m}/format": (r.codec.encode(), "byte"),
            f"{m}/filename": (r.filename.encode("utf-8", "surrogateescape"), "byte"),
            f"{m}/source_id": (r.key.encode("utf-8", "surrogateescape"), "byte"),
            f"{m}/class/label": (-1 if r.label is None else int(r.label), "int"),
            f"{m}/class/text": (text.encode(), "byte"),
            "gpubatch/meta": (fields.json_text(dict(r.meta), sort_keys=True, default=str).encode(), "byte"),
        }
        if r.media is Media.AUDIO:
            rate = r.meta.get("sample_rate")
            if not isinstance(rate, (int, float)) and r.codec != "npy":  # passed through: its header says
                from ..engine.codecs.audio import info_of  # (the probe its check made, where kept)
                from ..errors import RecordError

                try:
                    rate = info_of(r).rate
                except RecordError:
                    rate = 0
            out["audio/sample_rate"] = (int(rate) if isinstance(rate, (int, float)) else 0, "int")
            said = r.meta.get("text")
            out["audio/text"] = ((said if isinstance(said, str) else "").encode(), "byte")
        return out

    def _keypoints(self, b: Boxes | None) -> dict[str, tuple[Any, str]]:
        """COCO keypoints as the TF Object Detection API's ``image/object/keypoint/*`` features, in every
        record of a dataset whose categories name keypoints. Its decoder reshapes them per object, so
        every box gets the same number: a box without keypoints gets unlabeled ones (``v = 0``), with
        empty names in ``keypoint/text``. Boxes with different numbers of keypoints are left to
        ``gpubatch/meta``."""
        import numpy as np

        kps = [e.get("keypoints") for e in b.extra] if b is not None else []
        kps = [k if isinstance(k, list) and k and len(k) % 3 == 0 else None for k in kps]
        sizes = {len(k) for k in kps if k is not None}
        if len(sizes) > 1 or not self._kp_names and not sizes:
            return {}
        pts = np.zeros((0, 0, 3))
        if len(sizes) == 1:
            (size,) = sizes
            pts = np.asarray([k if k is not None else [0] * size for k in kps], np.float64).reshape(len(kps), -1, 3)
        h, w = b.canvas if b is not None else (1, 1)
        out = {
            "image/object/keypoint/x": ((pts[..., 0] / max(w, 1)).ravel().tolist(), "float"),
            "image/object/keypoint/y": ((pts[..., 1] / max(h, 1)).ravel().tolist(), "float"),
            "image/object/keypoint/visibility": (pts[..., 2].astype(np.int64).ravel().tolist(), "int"),
            "image/object/keypoint/num": ([int(np.count_nonzero(p[:, 2])) for p in pts], "int"),
        }
        k = pts.shape[1]
        names = [self._kp_names.get(int(c)) for c in b.labels] if len(pts) else []
        names = [n if n is not None and len(n) == k else None for n in names]
        if any(names):  # "" for each point of a box whose category names none: the reader leaves those out
            out["image/object/keypoint/text"] = ([x.encode() for n in names for x in (n or [""] * k)], "byte")
        return out


@register_format
class TFRecordFormat(Format):
    name = "tfrecord"
    media = (Media.IMAGE, Media.VIDEO, Media.AUDIO)
    description = "TFRecord shards of tf.train.Example (image/encoded, labels, boxes) with DALI .idx files"
    carries_boxes = True
    carries_label_arrays = True  # in the record's metadata
    carries_members = True  # in gpubatch/meta
    carries_text = True
    detect_priority = 20
    sharded = True

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        if path.is_file():
            return path.name.endswith(_SUFFIXES) or _looks_like_tfrecord(path)
        try:
            shards = shard_files(path, one_split=False)
        except OSError:
            return False
        return bool(shards) and _looks_like_tfrecord(shards[0])

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return TFRecordReader(path)

    @classmethod
    def shard_names(cls, count: int, options: WriteOptions) -> list[str]:
        return [f"{options.name}-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> ShardSink:
        return TFRecordSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        return []

