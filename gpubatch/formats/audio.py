"""Audio datasets: class folders (Speech Commands ``root/<word>/<clip>.wav``), a folder with a CSV of
metadata (ESC-50 ``meta/esc50.csv``, UrbanSound8K ``metadata/UrbanSound8K.csv``, or any CSV with path
and label columns), LibriSpeech-style transcripts (``*.trans.txt``) or a flat folder.

Reading:
- a CSV or TSV (the source itself, the one in the root, or the one in ``meta/`` or ``metadata/``; Common Voice's
  ``train.tsv``, split at tabs without quoting, its clips found by name under the root): the
  path column is ``path``/``filename``/``file``/``audio``/``audio_filepath``/``slice_file_name`` (or
  ``path_column``), the label column ``label``/``category``/``class``/``target``/``classID`` (or
  ``label_column``); a ``text``/``transcript``/``sentence`` column is kept as the record's text. A name
  column and a number column that agree (ESC-50's ``category`` and ``target``, UrbanSound8K's ``class``
  and ``classID``) give the dataset's own numbering with its names; names alone are numbered in sorted
  order. A bare file name is looked for under the root (ESC-50 keeps its clips in ``audio/``).
- a NeMo manifest (the source itself, or ``manifest.json`` or ``*.jsonl`` in the root: JSON lines with
  ``audio_filepath``, ``duration``, ``text``, optional ``offset``): every clip unlabeled, its ``text``, ``duration`` and
  ``offset`` kept in the record's metadata (paths relative to the manifest's folder).
- ``*.trans.txt`` files anywhere (LibriSpeech: ``<utt-id> TRANSCRIPT`` a line): every clip unlabeled,
  with its transcript as ``text``.
- sub-folders holding clips: classes are the sorted folder names; folders whose name starts with ``_``
  (Speech Commands' ``_background_noise_``) are left out, and said so.
- otherwise every clip under the root, unlabeled.

Writing (``--to audio``): clips in class folders (``<class>/<key>.<ext>``) with ``metadata.csv``
(``path,label,class,text``) beside them, which reads back as the CSV layout.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path
from typing import Any

from .._paths import read_head, read_listing, read_regular, safe_relpath
from ..errors import FormatError
from ..types import AUDIO_EXTENSIONS, DatasetInfo, Media, Record, class_table
from . import fields, register_format
from .base import Damaged, Format, Reader, WriteOptions, Writer
from .files import (
    _kinds,
    _strip_ext,
    _walk_images,
    csv_rows,
    read_csv_table,
    read_listed_file,
    said_left_out,
    unlisted_files,
)
from .folder import a_tar, class_folders, place_file, safe_component
from .listing import walk
from .manifest import MANIFEST_NAME, read_manifest
from .manifest import audio_facts as manifest_audio

METADATA = "metadata.csv"
PATH_COLUMNS = ("path", "filename", "file", "file_name", "audio", "audio_filepath", "slice_file_name", "fname")
LABEL_COLUMNS = ("label", "category", "class", "word", "target", "classid", "class_id")
TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence")


#: video containers that audio datasets hold as recordings: WebM, what yt-dlp and browsers write for audio alone
#: (a WebM with a picture is read for its sound)
SOUND_CONTAINERS = frozenset({"webm"})


def is_audio_name(name: str) -> bool:
    ext = name.rsplit(".", 1)[1].lower() if "." in name else ""
    return ext in AUDIO_EXTENSIONS or ext in SOUND_CONTAINERS


def webm_sound(path: Path) -> bool:
    """Whether the folder ``path`` holds WebM files and no other video files: a folder of sound that ``--from audio``
    reads (its WebM files audio alone, as yt-dlp writes them), though the WebM files make it look like video."""
    from ..types import VIDEO_EXTENSIONS

    exts = {f.name.rsplit(".", 1)[1].lower() for f in Path(path).rglob("*.*") if f.is_file()}
    return "webm" in exts and not (exts - SOUND_CONTAINERS).intersection(VIDEO_EXTENSIONS)


def _csvs(root: Path) -> list[Path]:
    for folder in (root, root / "meta", root / "metadata"):
        tables = [*folder.glob("*.csv"), *folder.glob("*.tsv")] if folder.is_dir() else []
        found = sorted(p for p in tables if p.is_file())
        if found:
            return found
    return []


class AudioReader(Reader):
    """Reads a folder of audio files (see the module's docstring for the layouts)."""

    media = "audio"

    def __init__(self, path: Path, path_column: str | None = None, label_column: str | None = None):
        """``path_column``, ``label_column``: the CSV's columns to read paths and labels from (else found
        by their usual names)."""
        super().__init__(path)
        p = Path(path)
        self.path_column, self.label_column = path_column, label_column
        self.csv_file: Path | None = None
        self.nemo_file: Path | None = None  # a NeMo manifest given as the source
        self.single: Path | None = None  # one recording given as the source: a dataset of one record
        if p.is_file() and is_audio_name(p.name):
            self.single, self.root = p, p.parent
        elif p.is_file() and _is_nemo(p):
            self.nemo_file, self.root = p, p.parent
        elif p.is_file():
            self.csv_file, self.root = p, p.parent
            if p.parent.name in ("meta", "metadata"):
                self.root = p.parent.parent
        else:
            self.root = p
            found = _csvs(p)
            if len(found) == 1:
                self.csv_file = found[0]
            elif len(found) > 1:
                self.warnings.append(f"{len(found)} CSV or TSV files in {found[0].parent}; none taken as metadata "
                                     "(give the one to read as the source)")
        self._classes: Any = ()
        self._by_name: dict[str, str] | None = None

    def roots(self) -> list[Path]:
        return [self.single] if self.single is not None else [self.root]

    def _scan(self) -> list[Any]:
        if self.single is not None:
            return [(self.single.name, None, None)]
        listing = self.nemo_file or self.csv_file or self._nemo_manifest()
        if listing is not None:
            entries = self._scan_csv() if listing == self.csv_file else self._scan_nemo(listing)
            if self.path.is_dir():  # a list found in the folder: the clips it does not name are said
                self.left_out = unlisted_files(self, self.root, entries, listing.name, ("audio file", "audio files"),
                                               f"a partial list? Pass {listing} to read the list alone",
                                               accept=is_audio_name)
            return entries
        damaged: list[Damaged] = []
        others: list[str] = []  # files that are no recordings (notes, a cover image, a codec it cannot read)
        hidden: list[str] = []  # hidden folders and recordings (``._clip.wav``)
        files = _walk_images(self.root, damaged, others=others, accept=is_audio_name, hidden=hidden)
        left = _kinds([f for f in others if not f.endswith(".trans.txt")])
        self.left_out = said_left_out(self, self.root, {**left, "hidden": sorted(hidden)}, "audio")
        texts, named = self._transcripts()
        if texts:
            have = {_strip_ext(f).rsplit("/", 1)[-1] for f in files}
            gone = [Damaged(f"{folder}/{utt}" if folder != "." else utt, where, f"its transcript ({Path(where).name}) "
                            "names it, but no recording of it is in the folder: it is lost")
                    for utt, (folder, where) in named.items() if utt not in have]
            return [*damaged, *((f, None, texts.get(_strip_ext(f).rsplit("/", 1)[-1])) for f in files), *gone]
        tops = sorted({f.split("/", 1)[0] for f in files if "/" in f and not f.startswith("_")})
        if tops:
            self._classes = tuple(tops)
            index = {c: i for i, c in enumerate(tops)}
            left = [f for f in files if "/" not in f or f.startswith("_")]
            if left:
                self.warnings.append(f"left out of {self.root}, as no records: {len(left)} audio file"
                                     f"{'s' if len(left) > 1 else ''} outside the class folders or in folders "
                                     f"named _... ({', '.join(left[:3])})")
            return [*damaged, *((f, index[f.split("/", 1)[0]], None) for f in files
                                if "/" in f and not f.startswith("_"))]
        return [*damaged, *((f, None, None) for f in files)]

    def _nemo_manifest(self) -> Path | None:
        return next((p for p in [self.root / "manifest.json", *sorted(self.root.glob("*.jsonl"))]
                     if p.is_file() and _is_nemo(p)), None)

    def _scan_nemo(self, manifest: Path) -> list[Any]:
        text = read_listing(manifest, "a NeMo manifest (JSON lines)", 1 << 30).decode("utf-8", "replace")
        entries: list[Any] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{manifest}:{n}"
            try:
                doc = fields.json_object(line, "the line")  # (nested too deeply: this line's error)
                path = str(doc.get("audio_filepath") or doc.get("audio_filename") or "")
                if not path:
                    raise ValueError("no audio_filepath")
                path = path if os.path.isabs(path) else safe_relpath(path)
                extra = {k: fields.number(doc[k], k) for k in ("duration", "offset") if doc.get(k) is not None}
                if extra.get("offset", 0) < 0 or extra.get("duration", 1) <= 0:
                    raise ValueError(f"a segment of offset {extra.get('offset', 0):g} s and duration "
                                     f"{extra.get('duration', 0):g} s")
            except ValueError as e:
                entries.append(Damaged(f"line {n}", where, f"bad manifest line: {e}"))
                continue
            entries.append((path, None, str(doc.get("text") or "") or None, extra))
        return entries

    def _transcripts(self) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
        """LibriSpeech's ``*.trans.txt``: utterance id -> transcript, and utterance id -> (its transcript file's folder
        under the root, that file), by which an utterance a transcript names and no recording holds is listed as lost
        (a partial extraction had lost it with no word). A transcript file that cannot be read is said."""
        out: dict[str, str] = {}
        named: dict[str, tuple[str, str]] = {}
        for dirpath, _dirs, names in os.walk(self.root):
            for name in sorted(names):
                if name.endswith(".trans.txt"):
                    where = Path(dirpath) / name
                    try:
                        text = read_regular(where).decode("utf-8", "replace")
                    except (OSError, ValueError) as e:
                        self.warnings.append(f"cannot read {where} ({getattr(e, 'strerror', None) or e}): its "
                                             "recordings are written without their transcripts")
                        continue
                    folder = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                    for line in text.splitlines():
                        utt, *words = line.split(maxsplit=1) or [""]
                        if utt and "/" not in utt and "\0" not in utt:
                            out[utt] = words[0].strip() if words else ""
                            named.setdefault(utt, (folder, str(where)))
        return out, named

    def _find(self, name: str) -> str:
        """A CSV's path as a path under the root: as written, else a file of that name under the root."""
        rel = safe_relpath(name)
        if (self.root / rel).is_file() or "/" in rel:
            return rel
        if self._by_name is None:
            self._by_name = {}
            for f in _walk_images(self.root, [], accept=is_audio_name):
                self._by_name.setdefault(f.rsplit("/", 1)[-1], f)
        return self._by_name.get(rel, rel)

    def _scan_csv(self) -> list[Any]:
        rows, cols = read_csv_table(self.csv_file)

        def col(given: str | None, names: tuple[str, ...], what: str) -> str | None:
            if given:
                if given.strip().lower() not in cols:
                    raise FormatError(f"{self.csv_file}: no {what} column {given!r} (columns: {', '.join(cols.values())})")
                return cols[given.strip().lower()]
            return next((cols[n] for n in names if n in cols), None)

        pc = col(self.path_column, PATH_COLUMNS, "path")
        if pc is None:
            raise FormatError(f"{self.csv_file}: no path column (one of {', '.join(PATH_COLUMNS)}); name it with "
                              "--path-column")
        tc = col(None, TEXT_COLUMNS, "text")
        labels = self._labels(rows, cols, col(self.label_column, LABEL_COLUMNS, "label"))
        entries: list[Any] = []
        for n, (r, label) in enumerate(zip(rows, labels), 2):
            where = f"{self.csv_file}:{n}"
            try:
                path = (r.get(pc) or "").strip()
                if not path:
                    raise ValueError("empty path")
                path = path if os.path.isabs(path) else self._find(path)
                if isinstance(label, Exception):
                    raise label
            except ValueError as e:
                entries.append(Damaged(f"row {n}", where, f"bad row: {e}"))
                continue
            entries.append((path, label, (r.get(tc) or "").strip() if tc else None))
        return entries

    def _labels(self, rows: list[dict], cols: dict[str, str], lc: str | None) -> list[Any]:
        """Each row's label (an int, None, or the ValueError of a bad one); sets the class names."""
        if lc is None:
            return [None] * len(rows)
        raw = [(r.get(lc) or "").strip() for r in rows]
        if all(re.fullmatch(r"-?\d+", v) for v in raw if v):
            numbers = [int(v) if v else None for v in raw]
            names: dict[int, str] = {}
            for other in (c for c in cols.values() if c != lc and c.strip().lower() in LABEL_COLUMNS):
                pairs = {(int(v), (r.get(other) or "").strip()) for r, v in zip(rows, raw) if v}
                if pairs and len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs}):
                    names = dict(pairs)  # a number column and a name column that agree
                    break
            self._classes = class_table(names, [x for x in numbers if x is not None])
            return [_label(x) for x in numbers]
        # names: if a number column agrees with them, its numbering; else sorted order
        for other in (c for c in cols.values() if c != lc and c.strip().lower() in LABEL_COLUMNS):
            nums = [(r.get(other) or "").strip() for r in rows]
            if all(re.fullmatch(r"\d+", v) for v in nums if v):
                pairs = {(int(v), name) for v, name in zip(nums, raw) if v and name}
                if pairs and len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs}):
                    index = {name: num for num, name in pairs}
                    self._classes = class_table(dict(pairs), list(index.values()))
                    return [_label(index[v]) if v else None for v in raw]
        names_sorted = sorted({v for v in raw if v})
        index = {v: i for i, v in enumerate(names_sorted)}
        self._classes = tuple(names_sorted)
        return [index[v] if v else None for v in raw]

    def info(self) -> DatasetInfo:
        self.entries()
        manifest = read_manifest(self.root) or {}
        return DatasetInfo(classes=tuple(manifest.get("classes") or ()) or self._classes)

    def where(self, entry: Any) -> tuple[str, str]:
        return _strip_ext(entry[0]), str(self.root / entry[0])

    def list_given(self) -> Path | None:
        p = Path(self.path)
        return p if p.is_file() and p in (self.csv_file, self.nemo_file) else None

    def _read(self, entry: tuple) -> Record:
        path, label, text = entry[:3]
        key, full, data = read_listed_file(self, self.root, path)
        from ..engine.codecs.audio_io import sniff_audio

        ext = path.rsplit(".", 1)[-1].lower()
        meta: dict[str, Any] = {"filename": path.rsplit("/", 1)[-1]}
        if text:
            meta["text"] = text
        codec = sniff_audio(data) or AUDIO_EXTENSIONS.get(ext, ext)
        if ext == "npy":  # an array gpubatch wrote: its rate and features are the dataset's (gpubatch.json)
            codec = "npy"
            meta.update({k: v for k, v in self.audio_facts().items() if v and k in ("sample_rate", "features")})
        if len(entry) > 3 and entry[3]:
            meta.update(entry[3])
            key, data, codec = self._segment(key, str(full), data, meta)
        return Record(key=key, data=data, media=Media.AUDIO, codec=codec, label=label, meta=meta, origin=str(full))

    def audio_facts(self) -> dict[str, Any]:
        """The sample rate and features every ``.npy`` array of the dataset shares (its manifest's ``audio``)."""
        if not hasattr(self, "_audio"):
            self._audio = manifest_audio(self.root)
        return self._audio

    def _segment(self, key: str, origin: str, data: bytes, meta: dict) -> tuple[str, bytes, str]:
        """A NeMo line's segment (``offset``, ``duration`` in seconds) of its recording: (key, bytes, codec) of
        the segment cut out (:func:`~gpubatch.engine.codecs.audio_io.cut_audio`, exact samples for WAV and
        FLAC), keyed ``<file>_<offset in ms>ms``; the recording as it is where the line names all of it.
        ``meta`` keeps the segment's place in its recording (``segment``) and its own ``duration``."""
        from ..engine.codecs.audio_io import SEGMENT_SLACK, cut_audio, probe_audio, sniff_audio

        offset = float(meta.pop("offset", 0.0))
        try:
            info = probe_audio(data)
            end = offset + meta["duration"] if "duration" in meta else info.duration
            if offset <= 0 and end >= info.duration - SEGMENT_SLACK and end <= info.duration + SEGMENT_SLACK:
                return key, data, sniff_audio(data) or info.codec  # the whole recording
            data, codec = cut_audio(data, info, offset, end)
        except ValueError as e:
            raise self.record_error(key, origin, f"the manifest's segment (offset {offset:g} s): {e}") from None
        meta["segment"] = {"offset": offset, "duration": round(end - offset, 6)}
        meta["duration"] = round(end - offset, 6)
        return f"{key}_{int(round(offset * 1000))}ms", data, codec


def _label(x: int | None) -> Any:
    if x is None:
        return None
    try:
        return fields.label(x, "label")
    except ValueError as e:
        return e


class AudioWriter(Writer):
    """Clips in class folders (``<class>/<clip>.<ext>``) with ``metadata.csv`` beside them."""

    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, info, options)
        self.classes = info.classes
        self._folders = dict(enumerate(class_folders(info.classes))) if info.classes else {}
        self._used: set[str] = set()
        self._rows: list[list[str]] = []

    def write(self, record: Record) -> None:
        if record.media is not Media.AUDIO:
            raise ValueError(f"the audio format holds audio, not {getattr(record.media, 'value', record.media)}")
        name = record.filename
        stem, ext = name.rsplit(".", 1)
        folder = (self._folders.get(record.label) or str(record.label)) if record.label is not None else ""
        rel = f"{folder}/{safe_component(stem)}.{ext}" if folder else f"{safe_component(stem)}.{ext}"
        rel = place_file(self.root, rel, record.data, self._used, (METADATA, MANIFEST_NAME))
        cls = ""
        if record.label is not None and self.classes:
            try:
                cls = str(self.classes[record.label])
            except (IndexError, KeyError, TypeError):
                cls = ""
        text = record.meta.get("text")
        self._rows.append([rel, "" if record.label is None else str(record.label), cls,
                           text if isinstance(text, str) else ""])
        self.count += 1
        self.bytes += len(record.data)

    def close(self) -> None:
        if self._rows:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(["path", "label", "class", "text"])
            w.writerows(self._rows)
            (self.root / METADATA).write_text(buf.getvalue(), encoding="utf-8")


def _is_nemo(path: Path) -> bool:
    """Whether ``path`` is a NeMo manifest: JSON lines, the first naming ``audio_filepath``."""
    if path.suffix.lower() not in (".json", ".jsonl"):
        return False
    try:
        head = read_head(path, 1 << 16).decode("utf-8", "replace")
    except (OSError, ValueError):
        return False
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return '"audio_filepath"' in first or '"audio_filename"' in first


def _csv_is_audio(path: Path) -> bool:
    try:
        rows = list(csv_rows(read_head(path, 20000).decode("utf-8-sig", "replace"), path))[:20]
    except (OSError, csv.Error):
        return False
    for r in rows:
        for k, v in r.items():
            if k and k.strip().lower() in PATH_COLUMNS and isinstance(v, str) and is_audio_name(v.strip()):
                return True
    return False


@register_format
class AudioFormat(Format):
    name = "audio"
    description = ("audio files (wav, flac, ogg, opus, mp3, m4a, aiff...): class folders, a CSV of metadata (ESC-50, "
                   "UrbanSound8K) or TSV (Common Voice), LibriSpeech transcripts, NeMo manifests, flat, one file; class "
                   "folders in a ZIP or a tar (--from audio)")
    media = (Media.AUDIO,)
    carries_record_meta = False  # (metadata.csv: path, label, class, text)
    carries_text = True
    detect_priority = 75  # before the video CSV and the image folder

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        if path.is_file():  # (one recording; a WebM file alone is a clip, unless --from audio says so)
            if is_audio_name(path.name):
                return path.suffix.lower().lstrip(".") not in SOUND_CONTAINERS
            return (path.suffix.lower() in (".csv", ".tsv") and _csv_is_audio(path)) or _is_nemo(path)
        if (path / METADATA).is_file():
            return True
        found = _csvs(path)
        if len(found) == 1 and _csv_is_audio(found[0]):
            return True
        from ..types import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

        for folder in walk(path):  # (one walk for every format's check: listing.py)
            folder.dirs[:] = sorted(d for d in folder.dirs if not d.startswith("."))
            video = folder.shown_exts.intersection(VIDEO_EXTENSIONS)
            if not folder.shown_exts.isdisjoint(IMAGE_EXTENSIONS) or video - SOUND_CONTAINERS:
                return False  # the first folder with media files decides
            if not folder.shown_exts.isdisjoint(AUDIO_EXTENSIONS):  # (WebM files beside recordings: sound too)
                return True
            if video:  # (WebM files alone: video, unless --from audio says so)
                return False
        return False

    @classmethod
    def accepts(cls, path: Path) -> bool:
        p = Path(path)
        from .zip_folder import is_zip

        return cls.detect(p) or (p.is_dir() and webm_sound(p)) or (p.is_file() and is_audio_name(p.name)) or a_tar(p) \
            or is_zip(p)

    @classmethod
    def reader(cls, path: Path, **options: Any) -> Reader:
        from .zip_folder import ZipFolderReader, is_zip

        if a_tar(path) and not options:  # a tar of an audio folder's tree (Speech Commands'): read as once extracted
            from .webdataset import WebDatasetReader

            return WebDatasetReader(path, folder_classes="audio")
        if is_zip(path) and not options:  # the audio folder a ZIP holds, read where it lies
            return ZipFolderReader(path, "audio")
        return AudioReader(path, **options)

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        return AudioWriter(root, info, options)
