"""MXNet RecordIO: ``NAME.rec`` + ``NAME.idx`` (``key<TAB>offset`` per record).

Framing follows dmlc-core: ``u32 magic 0xCED7230A | u32 (cflag << 29 | length) | payload | pad to 4``,
a payload holding the magic at a 4-aligned offset split into parts (cflag 1, 2, 3) with the magic
dropped, as dmlc's writer does, so MXNet's chunked reader never sees a false record start.

Payload: 24-byte IRHeader ``<IfQQ`` (flag, label, id, id2) then the image bytes.
- classification: flag 0, label = class index (-1 when unlabeled).
- detection: flag = label count, then float32 labels in MXNet's detection layout
  ``[A, B, <image label>, (cls, xmin, ymin, xmax, ymax) * N]`` with header width A = 3, object width
  B = 5 and corners normalized to [0, 1] (``ImageDetRecordIter``'s convention).

Several shards are ``NAME-00000.rec`` + ``.idx`` each, plus ``NAME-dali.idx`` with offsets global
across the concatenated shards, which is the one index DALI's ``readers.mxnet`` takes for several files.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from .._paths import MAX_RECORD_BYTES, open_fetched, read_head, read_regular, source_files, source_root
from ..errors import FormatError
from ..types import Boxes, DatasetInfo, Record, class_table, sniff_image_codec
from . import fields, register_format
from .base import (
    OPENCV_AND_DALI_CODECS,
    Damaged,
    Format,
    OpenShards,
    Reader,
    WriteOptions,
    check_one_split,
    shortfall,
)
from .manifest import expected_records, read_manifest
from .sinks import ShardFile, ShardSink

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_IR = struct.Struct("<IfQQ")
_DET_HEADER = 3  # A: [A, B, image label]
_DET_OBJECT = 5  # B: class + 4 corners


def _pad(n: int) -> int:
    return (4 - n % 4) % 4


def frame(payload: bytes) -> bytes:
    """Frame one record, splitting at every 4-aligned occurrence of the magic (dmlc's rule)."""
    import numpy as np

    words = np.frombuffer(payload, "<u4", count=len(payload) // 4)
    cuts = (np.flatnonzero(words == MAGIC) * 4).tolist()  # (only aligned words count: one vector compare)
    if not cuts:  # the common case: one part, one copy
        if len(payload) >= 1 << 29:
            raise ValueError("record too large for RecordIO (2^29 bytes)")
        return b"".join((_MAGIC_BYTES, struct.pack("<I", len(payload)), payload, b"\x00" * _pad(len(payload))))
    parts, start = [], 0
    for pos in cuts:
        parts.append(payload[start:pos])
        start = pos + 4
    parts.append(payload[start:])
    out = []
    for i, part in enumerate(parts):
        cflag = 1 if i == 0 else (3 if i == len(parts) - 1 else 2)
        if len(part) >= 1 << 29:
            raise ValueError("record too large for RecordIO (2^29 bytes)")
        out += [_MAGIC_BYTES, struct.pack("<I", (cflag << 29) | len(part)), part, b"\x00" * _pad(len(part))]
    return b"".join(out)


def label_array(record: Record) -> list[float] | None:
    """The label array a RecordIO record came with (``meta["labels"]``, MXNet's multi-label layout), or None."""
    labels = record.meta.get("labels")
    if isinstance(labels, list) and labels and all(isinstance(v, (int, float)) for v in labels):
        return [float(v) for v in labels]
    return None


def pack_payload(record: Record, index: int) -> bytes:
    import numpy as np

    label = -1.0 if record.label is None else float(record.label)
    if record.boxes is None:
        labels = label_array(record)
        if labels is not None:  # a multi-label record (im2rec --pack-label) keeps its array
            return _IR.pack(len(labels), 0.0, index, 0) + np.asarray(labels, "<f4").tobytes() + record.data
        return _IR.pack(0, label, index, 0) + record.data
    nb = record.boxes.normalized()
    cls = record.boxes.labels.astype(np.float32)[:, None]
    objs = np.concatenate([cls, nb], axis=1).reshape(-1)
    labels = np.concatenate([np.array([_DET_HEADER, _DET_OBJECT, label], np.float32), objs]).astype("<f4")
    return _IR.pack(len(labels), 0.0, index, 0) + labels.tobytes() + record.data


def _part(f: Any, pos: int, size: int) -> tuple[int, int] | None:
    """(cflag, whole length with header and padding) of the record part at ``pos``, or None where no
    part header holds there (no magic, or a part that would pass the end of the file)."""
    f.seek(pos)
    head = f.read(8)
    if len(head) < 8:
        return None
    magic, lrec = struct.unpack("<II", head)
    if magic != MAGIC:
        return None
    length = lrec & ((1 << 29) - 1)
    total = 8 + length + _pad(length)
    return (lrec >> 29, total) if pos + 8 + length <= size else None


def _resync(f: Any, start: int, size: int) -> int | None:
    """The first 4-aligned offset at or after ``start`` where a record begins (the magic, then a part of
    flag 0 or 1 that fits the file), as MXNet's chunked reader finds record heads; None if none."""
    pos = start + (-start % 4)
    while pos < size:
        f.seek(pos)
        buf = f.read(1 << 20)
        if not buf:
            return None
        i = buf.find(_MAGIC_BYTES)
        while i >= 0:
            at = pos + i
            if at % 4 == 0:
                part = _part(f, at, size)
                if part is not None and part[0] in (0, 1):
                    return at
            i = buf.find(_MAGIC_BYTES, i + 1)
        pos += max(len(buf) - 3, 4)
        pos += -pos % 4
    return None


def scan_rec(rec: Path) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The offsets where the records of a ``.rec`` file begin, walking its part headers, and its damaged
    stretches (start, end, what): where no part header holds, or a split record's parts do not follow
    each other, the walk goes on at the next record head (:func:`_resync`), keeping the records after it."""
    starts: list[int] = []
    damage: list[tuple[int, int, str]] = []
    with os.fdopen(open_fetched(rec), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos, open_at = 0, None  # open_at: where the split record being walked began
        while pos < size:
            part = _part(f, pos, size)
            if part is not None and (part[0] in (0, 1)) == (open_at is None):
                cflag, total = part
                if cflag in (0, 1):
                    open_at = pos
                if cflag in (0, 3):
                    starts.append(open_at)
                    open_at = None
                pos += total
                continue
            bad = open_at if open_at is not None else pos
            nxt = _resync(f, pos + 1, size)
            f.seek(pos)
            if open_at is not None:
                what = "a split record whose parts break off"
            elif nxt is None and f.read(4) == _MAGIC_BYTES:
                what = "a truncated last record"
            else:
                what = "no readable record header"
            damage.append((bad, nxt if nxt is not None else size, what))
            open_at = None
            if nxt is None:
                break
            pos = nxt
        if open_at is not None:
            damage.append((open_at, size, "a split record whose last part is missing"))
    return starts, damage


class RecordIOReader(Reader):
    def __init__(self, path: Path):
        path = Path(path)
        matched = source_files(path)
        if matched is not None:  # a pattern: its .rec files
            self.recs = [p for p in matched if p.suffix == ".rec"]
        elif path.is_file():
            self.recs = [path]
        else:
            self.recs = sorted(p for p in path.glob("*.rec") if p.is_file())
            check_one_split(self.recs, path)
        super().__init__(source_root(path))
        self.files_given = not Path(path).is_dir()
        if not self.recs:
            raise FormatError(f"no .rec files in {path}")
        self.files = OpenShards(self.recs)
        self.manifest = read_manifest(self.path) or {}

    def _scan(self) -> list[tuple[int, int, str] | Damaged]:
        entries: list[tuple[int, int, str] | Damaged] = []
        for s, rec in enumerate(self.recs):
            starts, damage = scan_rec(rec)
            keys, named = self._index_keys(rec, starts, damage)
            events = [(off, (s, off, keys.get(off, str(i)) if keys else str(i))) for i, off in enumerate(starts)]
            events += [(a, Damaged(f"{rec.name}@{a}", f"{rec}@{a}", f"damaged file: bytes {a:,}-{b:,} hold {what}; "
                                   "the records there are lost")) for a, b, what in damage]
            found = [e for _, e in sorted(events, key=lambda e: e[0])]
            entries.extend(shortfall(rec, found, expected_records(self.manifest, rec), named))
        return entries

    def _index_keys(self, rec: Path, starts: list[int],
                    damage: list[tuple[int, int, str]]) -> tuple[dict[int, str], list[tuple[str, str]]]:
        """Record offset -> key from the ``.idx`` beside ``rec`` (im2rec's keys), and (key, reason) of each
        record the index lists at or past the end of what the scan read whole (the file was cut short).
        An index that names no record start otherwise is said in a warning."""
        idx = rec.with_suffix(".idx")
        if not idx.is_file():
            return {}, []
        keys: dict[int, str] = {}
        try:
            for ln in read_regular(idx).decode("utf-8", "replace").splitlines():
                if ln.strip():
                    k, off = ln.split("\t") if "\t" in ln else ln.split()
                    keys[int(off)] = k.strip()
        except (OSError, ValueError):
            keys = {}
        named: list[tuple[str, str]] = []
        if set(keys) != set(starts):
            known = set(starts)
            size = rec.stat().st_size
            tail = damage[-1][0] if damage and damage[-1][1] >= size else size  # where the whole records end
            lost = sorted((off, k) for off, k in keys.items() if off not in known and off >= tail)
            # (no more than the index lists past what the file holds: an offset damaged to a number past the end,
            # beside a record the scan read whole, is a damaged index, not a lost record)
            lost = lost[max(0, len(lost) - (len(keys) - len(starts))):]
            named = [(f"{rec.stem}_{k}", f"the index {idx.name} lists this record at byte {off:,}, but the file "
                      f"holds {size:,} bytes{' and stops inside it' if off < size else ''}: it is cut short and the "
                      "record is lost") for off, k in lost]
            if len(lost) + len(known & set(keys)) != len(keys) or not known <= set(keys):
                self.warnings.append(f"the index {idx.name} does not match {rec.name} (it names {len(keys):,} records, "
                                     f"the file holds {len(starts):,}): every record in the file was read")
            keys = {off: k for off, k in keys.items() if off in known}
            taken = set(keys.values())
            keys.update({off: f"@{off}" for off in starts if off not in keys and f"@{off}" not in taken})
        return keys, named

    def _payload(self, s: int, off: int) -> bytes:
        with self.files.reading(s) as fd:
            return self._payload_from(fd, off)

    def _payload_from(self, fd: int, off: int) -> bytes:
        parts, total = [], 0
        while True:
            head = os.pread(fd, 8, off)
            if len(head) < 8:
                raise ValueError("truncated record header")
            magic, lrec = struct.unpack("<II", head)
            if magic != MAGIC:
                raise ValueError("wrong magic number")
            cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
            total += length
            if total > MAX_RECORD_BYTES:
                raise ValueError(f"a record of more than {MAX_RECORD_BYTES:,} bytes, the bound on one record")
            body = os.pread(fd, length, off + 8)
            if len(body) < length:
                raise ValueError("truncated record")
            parts.append(body)
            if cflag in (0, 3):
                return _MAGIC_BYTES.join(parts)
            if (cflag == 1) != (len(parts) == 1):
                raise ValueError(f"bad continuation flag {cflag}")
            off += 8 + length + _pad(length)

    def _ir_header(self, fd: int, off: int) -> tuple[int, int, int, float] | None:
        """(the record's first part's length and continuation flag, its IRHeader's flag and label) from its first
        32 bytes, or None where they are no record's (:meth:`_payload_from` says what is wrong)."""
        head = os.pread(fd, 8 + _IR.size, off)
        if len(head) < 8 + _IR.size:
            return None
        magic, lrec = struct.unpack_from("<II", head)
        length = lrec & ((1 << 29) - 1)
        if magic != MAGIC or length < _IR.size:
            return None
        flag, label, _, _ = _IR.unpack_from(head, 8)
        return length, lrec >> 29, flag, label

    def peek(self, entry: Any, n: int) -> tuple[bytes, int, int | None] | None:
        """The first ``n`` bytes of a record's image, its size and its label (``info`` reads headers so), for a
        record of one part and a scalar label; None for any other (read whole, with its checks)."""
        if isinstance(entry, Damaged):
            return None
        s, off, _ = entry
        with self.files.reading(s) as fd:
            got = self._ir_header(fd, off)
            if got is None or got[1] != 0 or got[2] != 0:
                return None
            length, _, _, label = got
            try:
                lab = fields.label(float(label))
            except ValueError:
                return None
            size = length - _IR.size
            head = os.pread(fd, min(n, size), off + 8 + _IR.size)
        return (head, size, lab) if len(head) == min(n, size) else None

    def shard_paths(self) -> list[Path]:
        return list(self.recs)

    def where(self, entry: tuple[int, int, str]) -> tuple[str, str]:
        s, off, k = entry
        return f"{self.recs[s].stem}_{k}", f"{self.recs[s]}@{off}"

    def _read(self, entry: tuple[int, int, str]) -> Record:
        import numpy as np

        s, off, k = entry
        key, origin = self.where(entry)
        try:
            payload = self._payload(s, off)
            if len(payload) < _IR.size:
                raise ValueError("record shorter than its 24-byte IRHeader")
            flag, label, _id, _id2 = _IR.unpack_from(payload)
            if _IR.size + 4 * flag > len(payload):
                raise ValueError(f"header announces {flag} labels beyond the record")
            labels = np.frombuffer(payload, "<f4", count=flag, offset=_IR.size).copy()
            if not np.isfinite(labels).all():
                raise ValueError("the label array holds values that are not finite numbers")
            data = payload[_IR.size + 4 * flag :]
            boxes, meta = None, {}
            img_label = None if flag else label
            if flag >= 2 and labels[0] >= 2 and labels[1] >= 5 and (flag - labels[0]) % labels[1] == 0:
                a, b = int(labels[0]), int(labels[1])
                if a >= 3:
                    img_label = labels[2]
                objs = labels[a:].reshape(-1, b)
                from ..engine.codecs.headers import probe

                hdr = probe(data)
                h, w = hdr.height, hdr.width
                xyxy = objs[:, 1:5] * np.array([w, h, w, h], np.float32)
                cats = [fields.ident(float(c), "a box's class") for c in objs[:, 0]]
                boxes = Boxes(xyxy, cats, (h, w))
            elif flag:
                meta["labels"] = labels.tolist()
                img_label = labels[0]
            lab = fields.label(None if img_label is None else float(img_label))
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        return Record(key=key, data=data, codec=sniff_image_codec(data) or "unknown", label=lab,
                      boxes=boxes, meta=meta, origin=origin)

    def info(self) -> DatasetInfo:
        if self.manifest.get("classes") is not None:
            return DatasetInfo(classes=self.manifest["classes"], categories=tuple(self.manifest.get("categories") or ()))
        labels = []
        for e in self.entries():  # (each record's IRHeader: its first 32 bytes, not the record)
            if isinstance(e, Damaged):
                continue
            with self.files.reading(e[0]) as fd:
                got = self._ir_header(fd, e[1])
            try:
                label = fields.label(float(got[3])) if got is not None else None
            except ValueError:
                continue
            if got is not None and got[2] == 0 and label is not None:
                labels.append(label)
        return DatasetInfo(classes=class_table((), labels))

    def close(self) -> None:
        self.files.close()


class RecordIOSink(ShardSink):
    """One ``.rec`` shard and its ``.idx`` (``key<TAB>offset``; keys count the shard's records from 0, the
    IRHeader's id the same)."""

    def __init__(self, root: Path, task: Any, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, task, info, options)
        self._rec = ShardFile(root, task.name)
        self.files.append(self._rec)
        self._idx: list[str] = []

    def write(self, record: Record) -> None:
        blob = frame(pack_payload(record, self.count))
        self._idx.append(f"{self.count}\t{self._rec.size}\n")
        self._rec.write(blob)
        self.count += 1
        self.bytes += len(record.data)

    def _close(self) -> dict[str, Any]:
        idx = ShardFile(self.root, Path(self.task.name).with_suffix(".idx").name)
        idx.write("".join(self._idx).encode("ascii"))
        self.files.append(idx)
        return {}


@register_format
class RecordIOFormat(Format):
    image_codecs = OPENCV_AND_DALI_CODECS
    name = "recordio"
    description = "MXNet RecordIO .rec + .idx (IRHeader labels; detection label arrays for boxes)"
    carries_boxes = True
    carries_label_arrays = True
    detect_priority = 30
    sharded = True

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        recs = [path] if path.is_file() else sorted(path.glob("*.rec")) if path.is_dir() else []
        if not recs:
            return False
        return read_head(recs[0], 4) == _MAGIC_BYTES

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return RecordIOReader(path)

    @classmethod
    def shard_names(cls, count: int, options: WriteOptions) -> list[str]:
        if count == 1:
            return [f"{options.name}.rec"]
        return [f"{options.name}-{i:05d}.rec" for i in range(count)]

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> ShardSink:
        return RecordIOSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        """Several shards: ``NAME-dali.idx``, the one index DALI's ``readers.mxnet`` takes for them all
        (keys counted across the shards, offsets into their concatenation)."""
        if len(shards) < 2:
            return []
        lines, key, base = [], 0, 0
        for shard in shards:
            rec = Path(root) / shard.name
            for ln in rec.with_suffix(".idx").read_text().splitlines():
                if ln.strip():
                    lines.append(f"{key}\t{base + int(ln.split(chr(9))[1])}\n")
                    key += 1
            size = (shard.files.get(shard.name) or [None])[0]  # (as committed: a shard sent to a store is gone here)
            base += int(size) if size is not None else rec.stat().st_size
        out = ShardFile(root, f"{options.name}-dali.idx")
        out.write("".join(lines).encode("ascii"))
        out.commit()
        return []
