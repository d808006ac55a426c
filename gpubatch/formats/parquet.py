"""Parquet in the layout Hugging Face ``datasets`` writes and reads: one file a shard
(``NAME-00000-of-00004.parquet``), a row a record, the schema's ``huggingface`` metadata naming the features.

- ``image`` / ``audio`` / ``video``: the ``Image`` / ``Audio`` / ``Video`` feature's struct
  ``{bytes, path}``, the record's encoded bytes and its file name.
- ``label``: ``ClassLabel`` with the dataset's class names (an int64 ``Value`` where it has none); -1 none.
- ``objects``: boxes, as detection sets on the Hub keep them: ``{bbox: [[x, y, w, h], ...] (pixels, COCO's
  order), category: [...]}``; categories as ``ClassLabel`` names where the dataset names them (their COCO ids
  then come back through the names' order and gpubatch.json); and ``fields``, per box a JSON text of the
  rest gpubatch keeps (``iscrowd``, segmentation polygons and masks, keypoints).
- ``key`` (string) and ``meta`` (JSON text: what else gpubatch keeps of the record).

Row groups hold at most :data:`ROW_GROUP` records, so a reader streams a shard a group at a time: reading a
record reads its row group, kept until another group of that file is asked for. Reads in order (``convert``,
``info``) read each group once; a shuffled training loader reads a whole group for each record. A dataset
saved by ``datasets`` (``to_parquet``, ``push_to_hub``'s ``data/train-00000-of-00001.parquet``) is read the
same way (an image kept as a local path only, as ``to_parquet`` keeps files, is read from that path): its media column is the first ``Image``, ``Audio`` or ``Video`` feature (else the first struct
column of ``bytes``), its label the first ``ClassLabel``. pyarrow is the ``[parquet]`` extra.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from .._paths import open_fetched, read_regular, source_files
from ..errors import DependencyError, FormatError
from ..types import Boxes, DatasetInfo, Media, Record, sniff_image_codec
from . import fields, register_format
from .base import Damaged, Format, Reader, WriteOptions
from .listing import walk
from .sinks import ShardFile, ShardSink

#: records a row group holds at most (as ``datasets`` writes media: small groups stream)
ROW_GROUP = 100
_MEDIA_FEATURE = {"image": "Image", "audio": "Audio", "video": "Video"}


def pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DependencyError("Parquet needs pyarrow: pip install 'gpubatch[parquet]'") from None
    return pa


def parquet_files(path: Path) -> list[Path]:
    """The Parquet files of a dataset: a file, a pattern, or every ``*.parquet`` under a folder (sorted)."""
    matched = source_files(path)
    if matched is not None:
        return [p for p in matched if p.suffix == ".parquet"]
    path = Path(path)
    if path.is_file():
        return [path] if path.suffix == ".parquet" else []
    return sorted(p for p in path.rglob("*.parquet") if p.is_file() and ".gpubatch" not in p.parts) if path.is_dir() else []


def _features(schema: Any) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        return dict(json.loads(raw)["info"]["features"]) if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}


def _parquet_file(pa: Any, path: Path, handles: list) -> Any:
    """``path`` opened for pyarrow through the descriptor :func:`~.._paths.open_fetched` checked (a remote
    file's placeholder fetched first): the file read is the one fetched, though this process's cache of a
    store's files turns it back into a placeholder meanwhile (its oldest shards go back as later ones come;
    opened again by its path, a read-ahead's eviction between the two made pyarrow read a placeholder). The
    file object goes to ``handles``, for the reader to close."""
    f = os.fdopen(open_fetched(path), "rb")
    handles.append(f)
    try:
        return pa.parquet.ParquetFile(f)
    except UnicodeDecodeError as e:  # (pyarrow's own: a damaged footer's column name, read as text)
        raise OSError(f"its footer names a column in bytes that are no UTF-8 text ({e.reason} at byte {e.start})"
                      ) from None


class _Undecodable:
    """A cell of a row whose text is not valid UTF-8 (a damaged page): the row's error, the others read."""

    def __init__(self, reason: str):
        self.reason = reason


def _cells(table: Any) -> list[dict[str, Any]]:
    """A row group's rows where some text cell cannot be decoded: each column whole where it can be, else cell
    by cell, a cell that cannot be an :class:`_Undecodable` (only its row lost, not the row group's)."""
    cols: dict[str, list] = {}
    for name in table.column_names:
        col = table.column(name)
        try:
            cols[name] = col.to_pylist()
        except UnicodeDecodeError:
            cols[name] = []
            for r in range(len(col)):
                try:
                    cols[name].append(col[r].as_py())
                except UnicodeDecodeError as e:
                    cols[name].append(_Undecodable(f"its {name} cell is not valid UTF-8 text (byte {e.start}: "
                                                   f"{e.reason}; the file is damaged)"))
    return [{n: v[r] for n, v in cols.items()} for r in range(table.num_rows)]


class ParquetReader(Reader):
    def __init__(self, path: Path):
        pa = pyarrow()
        self.pa = pa
        self.files = parquet_files(Path(path))
        if not self.files:
            raise FormatError(f"no .parquet files at {path}")
        super().__init__(Path(path) if Path(path).is_dir() else self.files[0].parent)
        self.files_given = not Path(path).is_dir()
        self._handles: list[Any] = []  # (the files opened, closed with the reader)
        self._unreadable: dict[int, str] = {}  # files whose footer cannot be read: why (their records are lost)
        first = None
        for i, f in enumerate(self.files):  # (the schema from the first file that opens)
            try:
                first = _parquet_file(pa, f, self._handles)
                break
            except (OSError, pa.ArrowException) as e:
                self._unreadable[i] = str(e)
        if first is None:
            raise FormatError(f"cannot read {self.files[0]}: {self._unreadable[0]}")
        self.schema = first.schema_arrow
        feats = _features(self.schema)
        names = self.schema.names
        self.column = next((n for n in names if (feats.get(n) or {}).get("_type") in _MEDIA_FEATURE.values()), None)
        if self.column is None:
            self.column = next((f.name for f in self.schema if pa.types.is_struct(f.type)
                                and f.type.get_field_index("bytes") >= 0), None)
        if self.column is None:
            raise FormatError(f"{self.files[0]} holds no image, audio or video column (a struct of bytes)")
        kind = (feats.get(self.column) or {}).get("_type")
        self._media = {"Audio": "audio", "Video": "video"}.get(kind, "image" if kind == "Image" else self.column)
        if self._media not in ("image", "audio", "video"):
            self._media = "image"
        self.label = next((n for n in names if (feats.get(n) or {}).get("_type") == "ClassLabel"), None)
        if self.label is None and "label" in names and pa.types.is_integer(self.schema.field("label").type):
            self.label = "label"
        self.classes = tuple((feats.get(self.label) or {}).get("names") or ()) if self.label else ()
        objects = feats.get("objects") or {}
        cat = ((objects.get("feature") or objects).get("category") or {}) if isinstance(objects, dict) else {}
        from .manifest import read_manifest

        self.manifest = read_manifest(self.path) or {}
        names_ = list(cat.get("names") or ())
        known = sorted(int(c["id"]) for c in self.manifest.get("categories") or ())
        ids = known if len(known) == len(names_) else list(range(1, len(names_) + 1))
        self.categories = tuple({"id": i, "name": n, "supercategory": ""} for i, n in zip(ids, names_))
        self._cat_ids = ids  # (a ClassLabel's index k is category ids[k]; gpubatch.json keeps the ids)
        self._cache: dict[int, tuple[int, Any]] = {}  # per file: (row group, its rows) last read
        self._open: dict[int, Any] = {len(self._unreadable): first}  # (opened once for its schema and its rows)
        self._lock = threading.Lock()

    @property
    def media(self) -> str:  # type: ignore[override]
        return self._media

    def _file(self, i: int) -> Any:
        with self._lock:
            if i not in self._open:
                self._open[i] = _parquet_file(self.pa, self.files[i], self._handles)
            return self._open[i]

    def close(self) -> None:
        with self._lock:
            for f in self._handles:
                f.close()
            self._handles.clear()
            self._open.clear()

    def _scan(self) -> list[Any]:
        from .manifest import expected_records

        out: list[Any] = []
        for i, f in enumerate(self.files):
            try:
                if i in self._unreadable:
                    raise OSError(self._unreadable[i])
                meta = self._file(i).metadata
            except (OSError, self.pa.ArrowException) as e:  # (a damaged footer: the file's records, said lost)
                n = expected_records(self.manifest, f)
                why = f"cannot read {f.name} ({e}): its records are lost"
                out += ([Damaged(f"{f.stem}#lost-{k}", str(f), f"{why} (the dataset's gpubatch.json counts {n:,})")
                         for k in range(n)] if n else
                        [Damaged(f"{f.stem}#unreadable", str(f), f"{why} (how many the file held is not known)")])
                continue
            for g in range(meta.num_row_groups):
                out += [(i, g, r) for r in range(meta.row_group(g).num_rows)]
        return out

    def where(self, entry: Any) -> tuple[str, str]:
        i, g, r = entry
        return f"{self.files[i].stem}/{g}/{r}", f"{self.files[i]}#row-group-{g}/{r}"

    def info(self) -> DatasetInfo:
        cats = self.manifest.get("categories") or self.categories
        return DatasetInfo(classes=tuple(self.manifest.get("classes") or self.classes), categories=tuple(cats))

    def shard_paths(self) -> list[Path]:
        return list(self.files)

    def roots(self) -> list[Path]:
        return [self.path]

    def _rows(self, i: int, g: int) -> Any:
        with self._lock:
            got = self._cache.get(i)
        if got is None or got[0] != g:
            cols = [c for c in (self.column, self.label, "key", "meta", "objects") if c and c in self.schema.names]
            # one thread: pyarrow's pool decoding columns from a Python file object (the descriptor opened here)
            # aborted the process at its exit, now and then ("terminate called without an active exception",
            # apache/arrow#34314; pyarrow 21): a script that read a Parquet dataset ended in SIGABRT
            table = self._file(i).read_row_group(g, columns=cols, use_threads=False)
            try:
                rows = table.to_pylist()
            except UnicodeDecodeError:  # (a damaged text cell: Arrow reads it, Python cannot decode it)
                rows = _cells(table)
            got = (g, rows)
            with self._lock:
                self._cache[i] = got
        return got[1]

    def _read(self, entry: Any) -> Record:
        i, g, r = entry
        key, origin = self.where(entry)
        try:
            row = self._rows(i, g)[r]
        except (OSError, self.pa.ArrowException, IndexError) as e:
            raise self.record_error(key, origin, e) from None
        bad = next((v for v in row.values() if isinstance(v, _Undecodable)), None)
        if bad is not None:
            raise self.record_error(key, origin, bad.reason)
        key = str(row.get("key") or key)
        cell = row.get(self.column) or {}
        data = cell.get("bytes")
        if not data and cell.get("path"):  # (datasets' to_parquet keeps a local file's path, not its bytes)
            where = Path(str(cell["path"]))
            where = where if where.is_absolute() else self.files[i].parent / where
            try:
                data = read_regular(where)
            except (OSError, ValueError) as e:
                raise self.record_error(key, str(where), f"its {self.column} is a path only, and "
                                        f"{getattr(e, 'strerror', None) or e}") from None
        if not data:
            raise self.record_error(key, origin, f"its {self.column} holds no bytes")
        try:
            meta = json.loads(row["meta"]) if row.get("meta") else {}
        except ValueError:
            meta = {}
        if cell.get("path"):
            meta.setdefault("filename", str(cell["path"]).rsplit("/", 1)[-1])
        label = row.get(self.label) if self.label else None
        label = int(label) if isinstance(label, int) and label >= 0 else None
        media, codec = self._codec(data)
        boxes = None
        objects = row.get("objects")
        if media is Media.IMAGE and isinstance(objects, dict) and objects.get("bbox") is not None:
            boxes = self._boxes(objects, data, key, origin)
        return Record(key=key, data=data, codec=codec, label=label, boxes=boxes, meta=meta, origin=origin, media=media)

    def _codec(self, data: bytes) -> tuple[Media, str]:
        if data[:6] == b"\x93NUMPY" and self._media in ("audio", "video"):  # features, waveforms or clips gpubatch wrote
            return Media(self._media), "npy"
        if self._media == "audio":
            from ..engine.codecs.audio_io import sniff_audio

            return Media.AUDIO, sniff_audio(data) or "unknown"
        if self._media == "video":
            from ..engine.codecs.video_probe import sniff_container

            return Media.VIDEO, sniff_container(data) or "unknown"
        return Media.IMAGE, sniff_image_codec(data) or "unknown"

    def _boxes(self, objects: dict, data: bytes, key: str, origin: str) -> Boxes:
        from ..engine.codecs.headers import probe

        try:
            hdr = probe(data)
            xyxy = [[float(x), float(y), float(x) + float(w), float(y) + float(h)] for x, y, w, h in objects["bbox"]]
            cats = [self._cat_ids[int(c)] if self._cat_ids else int(c) for c in objects.get("category") or [0] * len(xyxy)]
        except (ValueError, TypeError) as e:
            raise self.record_error(key, origin, f"objects: {e}") from None
        extra = []
        for text in objects.get("fields") or [None] * len(xyxy):  # (gpubatch's own: segmentation, iscrowd...)
            try:
                extra.append(dict(json.loads(text)) if text else {})
            except (ValueError, TypeError):
                extra.append({})
        crowd = [int(e.pop("iscrowd", 0) or 0) for e in extra]
        return Boxes(xyxy, cats, (hdr.height, hdr.width), crowd, tuple(extra))


class _Out:
    """A :class:`ShardFile` as the file pyarrow writes into."""

    def __init__(self, f: ShardFile):
        self.f, self.closed = f, False

    def write(self, data: Any) -> int:
        self.f.write(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class ParquetSink(ShardSink):
    def __init__(self, root: Path, task: Any, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, task, info, options)
        self.pa = pyarrow()
        self.file = ShardFile(self.root, task.name)
        self.files.append(self.file)
        self.rows: list[dict[str, Any]] = []
        self.writer: Any = None
        self.media: str | None = None
        self._cats = sorted(int(c["id"]) for c in info.categories)
        self.boxes = bool(info.categories)  # (an objects column: every shard alike where the dataset has categories)

    def _schema(self, media: str, boxes: bool) -> Any:
        pa = self.pa
        cell = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        fields = [("key", pa.string()), (media, cell), ("label", pa.int64())]
        feats: dict[str, Any] = {"key": {"dtype": "string", "_type": "Value"},
                                 media: {"_type": _MEDIA_FEATURE[media]}}
        classes = list(self.info.classes)[:100_000] if self.info.classes else []
        feats["label"] = {"names": classes, "_type": "ClassLabel"} if classes else {"dtype": "int64", "_type": "Value"}
        if boxes:
            fields.append(("objects", pa.struct([("bbox", pa.list_(pa.list_(pa.float32(), 4))),
                                                 ("category", pa.list_(pa.int64())),
                                                 ("fields", pa.list_(pa.string()))])))
            names = {int(c["id"]): str(c["name"]) for c in self.info.categories}
            cat = ({"names": [names[c] for c in self._cats], "_type": "ClassLabel"} if self._cats
                   else {"dtype": "int64", "_type": "Value"})
            feats["objects"] = {"feature": {"bbox": {"feature": {"dtype": "float32", "_type": "Value"}, "length": 4,
                                                     "_type": "Sequence"}, "category": cat,
                                            "fields": {"dtype": "string", "_type": "Value"}}, "_type": "Sequence"}
        fields.append(("meta", pa.string()))
        feats["meta"] = {"dtype": "string", "_type": "Value"}
        meta = {b"huggingface": json.dumps({"info": {"features": feats}}).encode()}
        return pa.schema(fields, metadata=meta)

    def write(self, record: Record) -> None:
        media = str(getattr(record.media, "value", record.media))
        if self.media is None:
            self.media = media
            self.boxes = self.boxes or record.boxes is not None
        elif media != self.media:
            raise ValueError(f"a {media} record in a shard of {self.media} records")
        for text in (record.key, record.filename):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                raise ValueError(f"its name holds bytes that are not UTF-8 ({shown}), which Parquet's string "
                                 "columns cannot hold: rename the file, or write another format") from None
        row: dict[str, Any] = {"key": record.key, media: {"bytes": bytes(record.data), "path": record.filename},
                               "label": -1 if record.label is None else int(record.label),
                               "meta": fields.json_text(record.meta, sort_keys=True, default=str) if record.meta else None}
        if self.boxes:
            b = record.boxes
            n = len(b) if b is not None else 0
            cats = [int(b.labels[k]) for k in range(n)]
            if self._cats:
                missing = [c for c in cats if c not in self._cats]
                if missing:
                    raise ValueError(f"a box of category {missing[0]}, which the dataset does not name")
                cats = [self._cats.index(c) for c in cats]
            row["objects"] = {"bbox": [[float(x0), float(y0), float(x1 - x0), float(y1 - y0)]
                                       for x0, y0, x1, y1 in (b.xyxy.tolist() if n else [])], "category": cats,
                              "fields": [fields.json_text({**dict(b.extra[k] if k < len(b.extra) else {}),
                                                     "iscrowd": int(b.iscrowd[k])}, sort_keys=True, default=str)
                                         for k in range(n)]}
        self.rows.append(row)
        self.count += 1
        self.bytes += len(record.data)
        if len(self.rows) >= ROW_GROUP:
            self._flush()

    def _writer(self) -> Any:
        """The shard's Parquet writer, made with its first rows (their media and boxes set its schema)."""
        if self.writer is None:
            pa = self.pa
            self.schema = self._schema(self.media or "image", self.boxes)
            self.writer = pa.parquet.ParquetWriter(pa.PythonFile(_Out(self.file), mode="w"), self.schema,
                                                   compression="none")
        return self.writer

    def _flush(self) -> None:
        if self.rows:
            self._writer().write_table(self.pa.Table.from_pylist(self.rows, schema=self.schema),
                                       row_group_size=ROW_GROUP)
            self.rows = []

    def _close(self) -> dict[str, Any]:
        self._flush()
        if not self.count:  # (a shard of no records: an empty table of the schema)
            self._writer().write_table(self.schema.empty_table())
        self._writer().close()
        return {"samples": self.count}


@register_format
class ParquetFormat(Format):
    name = "parquet"
    description = "Parquet shards as Hugging Face datasets writes them (Image/Audio/Video structs, ClassLabel)"
    media = (Media.IMAGE, Media.AUDIO, Media.VIDEO)
    carries_boxes = True
    carries_text = True  # (in its meta column)
    detect_priority = 35
    sharded = True

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        if source_files(path) is not None or not path.is_dir():
            return bool(parquet_files(path)[:1])
        # a folder: the first Parquet file found will do (the files found are sorted where they are read)
        for folder in walk(path):  # (one walk for every format's check: listing.py)
            folder.dirs[:] = [d for d in folder.dirs if d != ".gpubatch"]
            if "parquet" in folder.exts and any(f.endswith(".parquet") and os.path.isfile(os.path.join(folder.path, f))
                                                for f in folder.files):
                return True
        return False

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return ParquetReader(path)

    @classmethod
    def shard_names(cls, count: int, options: WriteOptions) -> list[str]:
        return [f"{options.name}-{i:05d}-of-{count:05d}.parquet" for i in range(count)]

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> ShardSink:
        return ParquetSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        return []
