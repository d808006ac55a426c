"""Video datasets: a folder of clips as class folders (UCF101 / Kinetics ``root/<class>/<clip>``), a flat
folder, DALI's file list (``path label [start end]``) or a CSV of ``path,label[,start,end]``.

Reading:
- ``root/file_list.txt`` (or a ``.txt`` list given as the source): DALI's ``readers.video`` list, one
  ``path label [start_s end_s]`` a line, whitespace-separated; paths relative to the list's folder or
  absolute; ``start = end = 0`` (or none) is the whole video, a negative time counts from its end.
- a ``.csv`` (the source itself, or the one CSV in the root): columns ``path``/``filename``/``video``,
  ``label``/``class``, optional ``start``/``time_start`` and ``end``/``time_end``. Kinetics' own CSV
  (``label,youtube_id,time_start,time_end,split``) maps to ``<label>/<youtube_id>_<start:06d>_<end:06d>.mp4``,
  the downloaders' layout. Names as labels are numbered in sorted order.
- sub-folders holding clips: classes are the sorted folder names (as DALI's ``file_root``).
- otherwise every clip under the root, unlabeled.

Writing (``--to video``): the clips in class folders with a ``file_list.txt`` in DALI's form (paths
relative to the dataset's folder), as they were or re-encoded.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from .._paths import read_head, read_listing, safe_relpath
from ..errors import FormatError
from ..types import IMAGE_EXTENSIONS as _IMAGE_EXT
from ..types import VIDEO_EXTENSIONS, DatasetInfo, Media, Record, class_table
from . import fields, register_format
from .base import Damaged, Format, Reader, WriteOptions, Writer
from .files import (
    _kinds,
    _strip_ext,
    _walk_images,
    read_csv_table,
    read_listed_file,
    said_left_out,
    unlisted_files,
)
from .folder import a_tar, class_folders, place_file, safe_component
from .listing import walk
from .manifest import MANIFEST_NAME, read_manifest

FILE_LIST = "file_list.txt"
_PATH_COLS = ("path", "filename", "file", "video", "clip", "video_path")
_LABEL_COLS = ("label", "class", "category", "target")
_START_COLS = ("start", "time_start", "start_s", "start_time")
_END_COLS = ("end", "time_end", "end_s", "end_time")


def is_video_name(name: str) -> bool:
    return "." in name and name.rsplit(".", 1)[1].lower() in VIDEO_EXTENSIONS


def _one_csv(root: Path) -> Path | None:
    found = [p for p in root.glob("*.csv") if p.is_file()]
    return found[0] if len(found) == 1 else None


#: a time no video reaches (about 31 years): a CSV's start or end beyond it (1e308, inf) is its row's error
_MAX_SECONDS = 1e9


def _seconds(value: Any, what: str) -> float:
    """A CSV cell of seconds (empty: 0); ValueError where it is no finite number within :data:`_MAX_SECONDS` (infinity
    had ended the run in an OverflowError where Kinetics' names are made of it)."""
    t = float((value or "0").strip() or 0)
    if not math.isfinite(t) or abs(t) > _MAX_SECONDS:
        raise ValueError(f"{what} {value.strip()[:40]!r} is no time in seconds")
    return t


class VideoReader(Reader):
    """Reads a folder of video files (see the module's docstring for the layouts)."""

    media = "video"

    def __init__(self, path: Path):
        super().__init__(path)
        p = Path(path)
        self.list_file: Path | None = None
        self.csv_file: Path | None = None
        self.single: Path | None = None  # one video file given as the source: a dataset of one clip
        if p.is_file() and is_video_name(p.name):
            self.single, self.root = p, p.parent
        elif p.is_file():
            if p.suffix.lower() == ".csv":
                self.csv_file = p
            else:
                self.list_file = p
            self.root = p.parent
        else:
            self.root = p
            if (p / FILE_LIST).is_file():
                self.list_file = p / FILE_LIST
            else:
                self.csv_file = _one_csv(p)
        self._classes: Any = ()

    def roots(self) -> list[Path]:
        return [self.single] if self.single is not None else [self.root]

    def _scan(self) -> list[Any]:
        if self.single is not None:
            return [(self.single.name, None, 0.0, 0.0)]
        manifest = read_manifest(self.root) or {}
        listing = self.list_file or self.csv_file
        if listing is not None:
            entries = self._scan_list(manifest) if self.list_file is not None else self._scan_csv()
            if Path(self.path).is_dir():  # a list found in the folder: the clips it does not name are said
                self.left_out = unlisted_files(self, self.root, entries, listing.name, ("video file", "video files"),
                                               f"a partial list? Pass {listing} to read the list alone",
                                               accept=is_video_name)
            return entries
        damaged: list[Damaged] = []  # folders that cannot be listed, clips that are no regular files
        others: list[str] = []  # files that are no clips (notes, a poster image, a container it cannot read)
        hidden: list[str] = []  # hidden folders and clips (``._clip.mp4``)
        files = _walk_images(self.root, damaged, others=others, accept=is_video_name, hidden=hidden)
        self.left_out = said_left_out(self, self.root, {**_kinds(others), "hidden": sorted(hidden)}, "video")
        tops = sorted({f.split("/", 1)[0] for f in files if "/" in f})
        if tops:
            self._classes = tuple(tops)
            index = {c: i for i, c in enumerate(tops)}
            loose = [f for f in files if "/" not in f]
            if loose:
                self.warnings.append(f"left out of {self.root}, as no records: {len(loose)} video file"
                                     f"{'s' if len(loose) > 1 else ''} outside the class folders ({', '.join(loose[:3])})")
            return [*damaged, *((f, index[f.split("/", 1)[0]], 0.0, 0.0) for f in files if "/" in f)]
        return [*damaged, *((f, None, 0.0, 0.0) for f in files)]

    def _scan_list(self, manifest: dict) -> list[Any]:
        text = read_listing(self.list_file, "a file list ('path label [start end]' lines)").decode("utf-8",
                                                                                                  "surrogateescape")
        entries: list[Any] = []
        labels = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{self.list_file}:{n}"
            parts = line.split()
            try:
                if len(parts) not in (2, 3, 4):
                    raise ValueError(f"expected 'path label [start end]', got {line[:80]!r}")
                label = fields.label(int(parts[1]), "label")
                start = float(parts[2]) if len(parts) > 2 else 0.0
                end = float(parts[3]) if len(parts) > 3 else 0.0
                if not (math.isfinite(start) and math.isfinite(end)):
                    raise ValueError("start and end must be numbers of seconds")
                path = parts[0] if os.path.isabs(parts[0]) else safe_relpath(parts[0])
            except ValueError as e:
                entries.append(Damaged(f"line {n}", where, str(e)))
                continue
            if start == end and start != 0:
                entries.append(Damaged(_strip_ext(path), where, f"start = end = {start:g} s: an empty stretch (DALI skips it)"))
                continue
            entries.append((path, label, start, end))
            if label is not None:
                labels.append(label)
        self._classes = class_table(manifest.get("classes") or (), labels)
        return entries

    def _scan_csv(self) -> list[Any]:
        rows, cols = read_csv_table(self.csv_file)

        def col(names: tuple[str, ...]) -> str | None:
            return next((cols[n] for n in names if n in cols), None)

        pc, lc, sc, ec = col(_PATH_COLS), col(_LABEL_COLS), col(_START_COLS), col(_END_COLS)
        kinetics = pc is None and "youtube_id" in cols and sc and ec
        if pc is None and not kinetics:
            raise FormatError(f"{self.csv_file}: no path column (one of {', '.join(_PATH_COLS)}), nor Kinetics' "
                              "youtube_id,time_start,time_end")
        raw_labels = [(r.get(lc) or "").strip() for r in rows] if lc else []
        numeric = all(re.fullmatch(r"-?\d+", v) for v in raw_labels if v)
        names = sorted({v for v in raw_labels if v}) if not numeric else []
        index = {v: i for i, v in enumerate(names)}
        entries: list[Any] = []
        for n, r in enumerate(rows, 2):
            where = f"{self.csv_file}:{n}"
            try:
                lab = (r.get(lc) or "").strip() if lc else ""
                label = (int(lab) if numeric else index[lab]) if lab else None
                if label is not None:
                    fields.label(label, "label")
                start = _seconds(r.get(sc), "start") if sc else 0.0
                end = _seconds(r.get(ec), "end") if ec else 0.0
                if kinetics:
                    youtube_id = (r.get(cols["youtube_id"]) or "").strip()
                    if not youtube_id or start < 0 or end < 0:
                        raise ValueError(f"youtube_id {youtube_id!r}, time_start {start:g}, time_end {end:g}: no clip's "
                                         "name")
                    path = f"{lab}/{youtube_id}_{int(start):06d}_{int(end):06d}.mp4"
                    start = end = 0.0  # the downloaders cut the clip to those times already
                else:
                    path = (r.get(pc) or "").strip()
                path = path if os.path.isabs(path) else safe_relpath(path)
            except (ValueError, KeyError) as e:
                entries.append(Damaged(f"row {n}", where, f"bad row: {e}"))
                continue
            entries.append((path, label, start, end))
        self._classes = tuple(names) if names else class_table((), [e[1] for e in entries
                                                                     if isinstance(e, tuple) and e[1] is not None])
        return entries

    def info(self) -> DatasetInfo:
        self.entries()
        manifest = read_manifest(self.root) or {}
        classes = tuple(manifest.get("classes") or ()) or self._classes
        return DatasetInfo(classes=classes)

    def where(self, entry: Any) -> tuple[str, str]:
        return _strip_ext(entry[0]), str(self.root / entry[0])

    def list_given(self) -> Path | None:
        p = Path(self.path)
        return p if p.is_file() and p in (self.list_file, self.csv_file) else None

    def _read(self, entry: tuple[str, int | None, float, float]) -> Record:
        path, label, start, end = entry
        key, full, data = read_listed_file(self, self.root, path)
        from ..engine.codecs.video_probe import sniff_container

        ext = path.rsplit(".", 1)[-1].lower()
        meta: dict[str, Any] = {"filename": path.rsplit("/", 1)[-1]}
        if start or end:
            meta["start"], meta["end"] = start, end
        return Record(key=key, data=data, media=Media.VIDEO, codec=sniff_container(data) or VIDEO_EXTENSIONS.get(ext, ext),
                      label=label, meta=meta, origin=str(full))


class VideoWriter(Writer):
    """Clips in class folders (``<class>/<clip>.<ext>``) with DALI's ``file_list.txt`` beside them."""

    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, info, options)
        self._folders = dict(enumerate(class_folders(info.classes))) if info.classes else {}
        self._used: set[str] = set()
        self._lines: list[str] = []

    def write(self, record: Record) -> None:
        name = record.filename
        stem, ext = name.rsplit(".", 1)
        if "/" in record.key and record.meta.get("clip"):  # a clip of a video: <video>_<k>
            stem = f"{Path(record.meta.get('source') or stem).stem}_{record.key.rsplit('/', 1)[1]}"
        folder = (self._folders.get(record.label) or str(record.label)) if record.label is not None else ""
        rel = f"{folder}/{safe_component(stem)}.{ext}" if folder else f"{safe_component(stem)}.{ext}"
        rel = place_file(self.root, rel, record.data, self._used, (FILE_LIST, MANIFEST_NAME), no_spaces=True)
        start, end = record.meta.get("start"), record.meta.get("end")
        times = f" {start:g} {end:g}" if isinstance(start, (int, float)) and isinstance(end, (int, float)) else ""
        self._lines.append(f"{rel} {-1 if record.label is None else record.label}{times}\n")
        self.count += 1
        self.bytes += len(record.data)

    def close(self) -> None:
        if any(not line.split()[1].startswith("-") for line in self._lines):
            (self.root / FILE_LIST).write_text("".join(self._lines), encoding="utf-8")


@register_format
class VideoFormat(Format):
    name = "video"
    description = ("video files (mp4, mkv, webm, mov, avi...): class folders, flat, one file, DALI file_list.txt or a "
                   "CSV; class folders in a ZIP or a tar (--from video)")
    media = (Media.VIDEO,)
    detect_priority = 80  # before the image folder, which would take a file_list.txt

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        if path.is_file():
            if path.suffix.lower() == ".csv":
                return True
            if is_video_name(path.name):  # one clip
                return True
            if path.suffix.lower() == ".txt":
                first = next((ln.split()[0] for ln in read_head(path, 1 << 16).decode("utf-8", "replace").splitlines()[:20]
                              if ln.strip() and not ln.startswith("#")), "")
                return is_video_name(first)
            return False
        if (path / FILE_LIST).is_file():
            return cls.detect(path / FILE_LIST)
        for folder in walk(path):  # (one walk for every format's check: listing.py)
            if not folder.shown_exts.isdisjoint(VIDEO_EXTENSIONS):  # the first folder with a clip decides
                return folder.shown_exts.isdisjoint(_IMAGE_EXT)
        return False

    @classmethod
    def accepts(cls, path: Path) -> bool:
        from .zip_folder import is_zip

        return cls.detect(path) or a_tar(path) or is_zip(path)

    @classmethod
    def reader(cls, path: Path) -> Reader:
        from .zip_folder import ZipFolderReader, is_zip

        if a_tar(path):  # a tar of a video folder's tree (class folders of clips): read as once extracted
            from .webdataset import WebDatasetReader

            return WebDatasetReader(path, folder_classes="video")
        if is_zip(path):  # the video folder a ZIP holds, read where it lies
            return ZipFolderReader(path, "video")
        return VideoReader(path)

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        return VideoWriter(root, info, options)

