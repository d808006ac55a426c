"""Image folders: ImageNet layout ``root/<class>/<file>`` or a flat folder with a DALI-style file list.

Reading:
- ``root/file_list.txt`` present: one ``relative/path label`` per line (split at the last space),
  integer labels, ``-1`` for none; class names come from the manifest when gpubatch wrote it, else
  ``str(label)``.
- sub-folders holding images: ImageNet layout; classes are the sorted sub-folder names, labels their
  index (as torchvision's ImageFolder and DALI's ``file_root`` do). Files directly in the root are ignored.
- otherwise: every image under the root, unlabeled.

Writing: ImageNet layout when records carry labels (plus ``file_list.txt``), a flat folder otherwise;
``layout="flat"`` forces a flat folder with ``file_list.txt``. Each class gets a folder of its own
(:func:`class_folders`); where the folders' sorted order is not the labels' order, the run warns, since
ImageFolder-style readers number classes by it. Records without a label among labeled ones go in the
root, outside every class folder, and ``file_list.txt`` lists them with ``-1``.
"""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._commit import note_moved
from .._paths import read_listing, read_regular, safe_join, safe_relpath
from ..types import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    ClassNames,
    DatasetInfo,
    Record,
    class_table,
    other_media_message,
    sniff_image_codec,
)
from . import fields, register_format
from .base import Damaged, Format, Reader, WriteOptions, Writer, names_a_split
from .files import (
    _IMAGE_EXT,
    _OWN_FILES,
    _is_image_name,
    _kinds,
    _list_folder,
    _note_hidden,
    _strip_ext,
    _walk_images,
    is_tar_name,
    said_left_out,
    unlisted_files,
)
from .listing import walk
from .manifest import MANIFEST_NAME, read_manifest
from .sinks import RUN_DIR

FILE_LIST = "file_list.txt"
# Detection layouts whose images sit in a folder beside their boxes' folder: (images, boxes, box suffix, name)
_DETECTION_LAYOUTS = (("JPEGImages", "Annotations", ".xml", "Pascal VOC", "voc"), ("images", "labels", ".txt", "YOLO", "yolo"))


def _detection_layout(root: Path, folders: set[str]) -> str | None:
    """Why ``root`` is not an image folder, where its images lie in a Pascal VOC ``JPEGImages/`` beside
    ``Annotations/*.xml`` or a YOLO ``images/`` beside ``labels/*.txt``: read as class folders, those
    sets would lose every box and take ``JPEGImages`` or ``images`` for a class. None otherwise.
    ``folders`` are the image files' folders, relative to ``root``."""
    for rel in sorted(folders):
        parts = rel.split("/")
        for i, part in enumerate(parts):
            for images, boxes, suffix, name, fmt in _DETECTION_LAYOUTS:
                if part != images:
                    continue
                beside = root.joinpath(*parts[:i], boxes)
                if beside.is_dir() and any(p.suffix == suffix for p in beside.rglob(f"*{suffix}")):
                    found = "/".join(parts[: i + 1])
                    return (f"{root} is laid out as {name} ({found}/ beside {beside.relative_to(root)}/*{suffix}): "
                            f"as class folders it would lose its boxes; read it as {name} with --from {fmt} "
                            f"{root.joinpath(*parts[:i])}, or pass {root.joinpath(*parts)} to take those images alone")
    return None


def _folders_of(classes: list[str], per_class: dict[str, list[str]]) -> set[str]:
    """The folders (relative to the root) that hold the image files ``per_class`` lists under each class folder."""
    folders: set[str] = set()
    for c in classes:
        nested = [f for f in per_class[c] if "/" in f]
        if len(nested) < len(per_class[c]):  # (some lie in the class folder itself)
            folders.add(c)
        folders.update(f"{c}/{f.rsplit('/', 1)[0]}" for f in nested)
    return folders


def free_name(rel: str, used: set[str], reserved: tuple[str, ...], no_spaces: bool = False) -> str:
    """``rel``, or ``<stem>_<n>.<ext>`` where that name is taken (``used``, case-insensitively, or one of
    ``reserved``) or, with ``no_spaces``, holds a space; the name taken is added to ``used``."""
    ext = rel.rsplit(".", 1)[1]
    base, n = rel, 1
    while rel.casefold() in used or rel in reserved or (no_spaces and " " in rel):
        rel = f"{base.rsplit('.', 1)[0]}_{n}.{ext}"
        if no_spaces:
            rel = rel.replace(" ", "_")
        n += 1
    used.add(rel.casefold())
    return rel


def place_file(root: Path, rel: str, data: bytes, used: set[str], reserved: tuple[str, ...],
               no_spaces: bool = False) -> str:
    """Write ``data`` at ``rel`` under ``root``, or at ``<stem>_<n>.<ext>`` where that name is taken
    (``used``, case-insensitively, or one of ``reserved``) or, with ``no_spaces``, holds a space (a
    whitespace-separated file list names it); the name written."""
    rel = free_name(rel, used, reserved, no_spaces)
    path = safe_join(root, rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return rel


def label_names(labels: list[int], known: Any = None) -> tuple[str, ...] | ClassNames:
    """Class names for integer labels: the known names, extended with ``str(i)`` where missing
    (:func:`~gpubatch.types.class_table`: no table sized by an absurd label)."""
    return class_table(known or (), labels)


#: a character that sorts before "." (a space, "-", "+", ","...)
_BEFORE_DOT = re.compile(r"[\x00-\x2d]")


def _in_order(entries: list[tuple[str, int | None]], damaged: list[Damaged]) -> list:
    """Image entries (their paths sorted) and damaged ones merged in key order (a key is the path without its
    extension). Where nothing is damaged and no path holds a character that sorts before "." or a dot
    besides its extension's, the paths' order is the keys' already (100,000 images in 100 class folders
    listed in 0.16-0.17 s without the sort, 0.21-0.22 s with it, on the CI machine:
    ``benchmarks/list_entries.py --folder``, benchmarks/RESULTS.md)."""
    if not damaged and entries:
        joined = "/".join(e[0] for e in entries)
        if joined.count(".") == len(entries) and not _BEFORE_DOT.search(joined):
            return entries
    return sorted([*entries, *damaged], key=lambda e: e.key if isinstance(e, Damaged) else _strip_ext(e[0]))


class FolderReader(Reader):
    def __init__(self, path: Path):
        path = Path(path)
        self.list_file: Path | None = None
        self._list_found = False  # the folder's own list, not one given as the source
        if path.is_file():
            self.list_file, path = path, path.parent
        elif (path / FILE_LIST).is_file():
            self.list_file, self._list_found = path / FILE_LIST, True
        super().__init__(path)
        self._root_text = str(self.path)  # (a record's origin and file are joined to it: no Path a record)
        self._classes: tuple[str, ...] | ClassNames = ()
        self.left_out: dict[str, dict] = {}  # files that are no records, by kind (see left_out_warning)

    def _scan(self) -> list[tuple[str, int | None] | Damaged]:
        manifest = read_manifest(self.path) or {}
        if self.list_file is not None:
            return self._scan_list(manifest)
        from ..errors import FormatError

        try:
            listed = _list_folder(str(self.path))
        except OSError as e:
            raise FormatError(f"cannot list {self.path}: {e.strerror or e}") from None
        top = [e for e in listed if not e.name.startswith(".")]
        subdirs = sorted(e.name for e in top if e.is_dir())
        per_class: dict[str, list[str]] = {}
        damaged: dict[str, list[Damaged]] = {}
        others: list[str] = []
        hidden: list[str] = []
        for d in subdirs:
            damaged[d] = []
            per_class[d] = _walk_images(self.path / d, damaged[d], f"{d}/", others, hidden=hidden)
        # a class folder that could not be listed stays a class, so the classes after it keep their labels
        classes = [d for d in subdirs if per_class[d] or damaged[d]]
        layout = _detection_layout(self.path, _folders_of(classes, per_class))
        splits = [c for c in classes if per_class[c] and names_a_split(c) and all("/" in f for f in per_class[c])]
        if splits and not layout:  # root/train/<class>/..., root/val/<class>/...: each split would be one class
            layout = (f"{self.path} holds split folders ({', '.join(c + '/' for c in splits)}) with class folders "
                      f"inside: read as class folders, each split would become one class; pass one split, e.g. "
                      f"{self.path / splits[0]}")
        if layout:
            raise FormatError(layout)
        if classes:
            self._classes = tuple(classes)
            left = _kinds(others)
            outside = sorted(e.name for e in top if not e.is_dir() and e.name not in _OWN_FILES)
            left["outside"] = [f for f in outside if _is_image_name(f)]
            for kind, names in _kinds([f for f in outside if not _is_image_name(f)]).items():
                left.setdefault(kind, []).extend(names)
            for e in listed:
                if e.name.startswith(".") and e.name != RUN_DIR:
                    _note_hidden(e, e.name, _is_image_name, hidden)
            left["hidden"] = sorted(hidden)
            self._left_out(left)
            return [e for i, c in enumerate(classes) for e in _in_order(
                [(f"{c}/{f}", i) for f in per_class[c]], damaged[c])]
        self._classes = manifest.get("classes") or ()
        flat: list[Damaged] = []
        others, hidden = [], []
        entries = _in_order([(f, None) for f in _walk_images(self.path, flat, "", others, hidden=hidden)], flat)
        self._left_out({**_kinds(others), "hidden": sorted(hidden)})
        return entries

    def _left_out(self, left: dict[str, list[str]]) -> None:
        self.left_out = said_left_out(self, self.path, left)

    def _scan_list(self, manifest: dict) -> list[tuple[str, int | None] | Damaged]:
        """The entries of a DALI-style file list; a line that names no record becomes a Damaged entry."""
        from ..errors import FormatError

        raw = read_listing(self.list_file, "a file list ('relative/path label' lines)")
        lines = raw.decode("utf-8", "surrogateescape").splitlines()  # names as the file system holds them
        firsts = [ln.split()[0] for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        media = other_media_message(self.path, firsts)
        clips = sum(1 for f in firsts if "." in f and f.rsplit(".", 1)[1].lower() in VIDEO_EXTENSIONS)
        if clips and not media:  # DALI's video lists: path label [start end]
            media = (f"{self.list_file} lists video files ({clips:,} of {len(firsts):,} lines), not images: read it "
                     "with --from video")
        if media and not any(_is_image_name(f) for f in firsts):
            raise FormatError(media)
        entries: list[tuple[str, int | None] | Damaged] = []
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{self.list_file}:{n}"
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2 or not re.fullmatch(r"-?\d+", parts[1]):
                entries.append(Damaged(f"line {n}", where, f"expected 'relative/path label', got {line[:80]!r}"))
                continue
            try:
                rel = safe_relpath(parts[0])
                label = fields.label(int(parts[1]))  # -1: unlabeled
            except ValueError as e:
                entries.append(Damaged(_strip_ext(parts[0])[:200], where, str(e)))
                continue
            entries.append((rel, label))
        self._classes = label_names([e[1] for e in entries if isinstance(e, tuple) and e[1] is not None],
                                    manifest.get("classes"))
        if self._list_found:  # the folder's own list: images it does not name are said
            self.left_out = unlisted_files(self, self.path, entries, FILE_LIST, ("image file", "image files"),
                                           f"a damaged or partial list? Pass {self.path / FILE_LIST} to read the "
                                           "list alone")
        return entries

    def info(self) -> DatasetInfo:
        self.entries()
        manifest = read_manifest(self.path) or {}
        return DatasetInfo(classes=self._classes, categories=tuple(manifest.get("categories") or ()))

    def where(self, entry: tuple[str, int | None]) -> tuple[str, str]:
        return _strip_ext(entry[0]), str(self.path / entry[0])

    def list_given(self) -> Path | None:
        return None if self._list_found else self.list_file

    def peek(self, entry: Any, n: int) -> tuple[bytes, int, int | None] | None:
        """The first ``n`` bytes of ``entry``'s image file, the file's size and the record's label (``info``
        reads headers so); None where the entry is no regular file (:meth:`read` says why)."""
        if isinstance(entry, Damaged):
            return None
        rel, label = entry
        try:
            fd = os.open(safe_join(self._root_text, rel), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (OSError, ValueError):
            return None
        try:
            st = os.fstat(fd)
            return (os.pread(fd, n, 0), st.st_size, label) if stat.S_ISREG(st.st_mode) else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def _read(self, entry: tuple[str, int | None]) -> Record:
        rel, label = entry
        root = self._root_text
        origin = os.path.join(root, rel)
        try:
            data = read_regular(safe_join(root, rel))
        except OSError as e:
            raise self.record_error(_strip_ext(rel), origin, e.strerror or e) from None
        except ValueError as e:
            raise self.record_error(_strip_ext(rel), origin, e) from None
        ext = rel.rsplit(".", 1)[-1].lower() if "." in rel else ""
        codec = sniff_image_codec(data) or IMAGE_EXTENSIONS.get(ext, ext)
        return Record(
            key=_strip_ext(rel),
            data=data,
            codec=codec,
            label=label,
            meta={"filename": rel.rsplit("/", 1)[-1]},
            origin=origin,
        )


_UNSAFE = re.compile(r"[^\w.\-]+")


def safe_component(name: str) -> str:
    """A file or folder name made of letters and digits of any script, ``_``, ``.`` and ``-``.

    Everything else (spaces, separators, punctuation, control characters) becomes ``_``; the name is
    NFC-normalized and cut to 200 characters, in its stem where it has an extension.
    """
    out = _UNSAFE.sub("_", unicodedata.normalize("NFC", name)).strip(".") or "_"
    if len(out) > 200:  # (cut in its stem: the extension stays)
        stem, dot, ext = out.rpartition(".")
        out = f"{stem[: 199 - len(ext)]}.{ext}" if dot and stem and len(ext) <= 16 else out[:200]
    return out


def class_folders(classes: tuple[str, ...] | list[str]) -> list[str]:
    """One distinct folder name per class, in label order.

    Names that would meet on disk (after :func:`safe_component`, compared case-insensitively, as on
    macOS and Windows) get ``_2``, ``_3``... in label order, so two classes never share a folder.
    Classes named by their numbers alone (``0``, ``1``, ... ``11``: a file list without names) are
    zero-padded (``00`` ... ``11``), so the folders sort in label order.
    """
    classes = list(classes)
    if len(classes) > 10 and classes == [str(i) for i in range(len(classes))]:
        width = len(classes[-1])
        classes = [c.zfill(width) for c in classes]
    used: set[str] = set()
    out = []
    for name in classes:
        base = safe_component(name)
        folder, n = base, 1
        while folder.casefold() in used:
            n += 1
            folder = f"{base}_{n}"
        used.add(folder.casefold())
        out.append(folder)
    return out


def numbered_as_sorted(folders: dict[int, str]) -> bool:
    """True when label ``i`` is the i-th of the sorted folder names, for every label written.

    That is how torchvision's ImageFolder and DALI's ``file_root`` number classes.
    """
    order = sorted(folders, key=lambda label: folders[label])
    return order == list(range(len(order)))


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


class FolderWriter(Writer):
    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, info, options)
        self.flat = options.extra.get("layout", "imagenet") == "flat"
        self._used: set[str] = set()  # relative paths written, case-folded (as case-insensitive disks compare)
        self._lines: list[str] = []
        self._unlabelled = 0
        if isinstance(info.classes, ClassNames):  # labels far beyond the names: folders for the named ones
            labels = sorted(info.classes.named)
            self._folders = dict(zip(labels, class_folders([info.classes.named[k] for k in labels])))
        else:
            self._folders = dict(enumerate(class_folders(info.classes)))
        self._written: dict[int, str] = {}  # label -> its folder, for the labels written
        self._dirs: set[str] = set()  # folders made (not one mkdir a record)
        self._root = str(root)  # (paths as strings on the per-record path: no Path a record)

    def _class_dir(self, label: int) -> str:
        if label not in self._written:
            if label in self._folders:
                folder = self._folders[label]
            else:  # a label without a class name: its number, kept apart from every named folder
                taken = {f.casefold() for f in (*self._folders.values(), *self._written.values())}
                folder, n = str(label), 1
                while folder.casefold() in taken:
                    n += 1
                    folder = f"{label}_{n}"
            self._written[label] = folder
        return self._written[label]

    def write(self, record: Record) -> None:
        self.place(record.filename, record.key, record.label, lambda path: _write_file(path, record.data))
        self.bytes += len(record.data)

    def place(self, name: str, key: str, label: int | None, put: Callable[[Path], Any]) -> str:
        """Name a record's file (its class folder, its stem, a free name) and have ``put`` make it there
        (write its bytes, or move a shard's part into place): the name given."""
        stem, ext = name.rsplit(".", 1)
        key_dir = key.rsplit("/", 1)[0] if "/" in key else ""
        if label is not None and not self.flat:
            rel = f"{self._class_dir(label)}/{safe_component(stem)}.{ext}"
        elif self.flat or label is None and self.info.classes:
            # one folder (--layout flat), or unlabeled among classes: in the root, named after the key's
            # folders too (cat/0001 -> cat_0001), where no class folder takes it in
            rel = safe_component(f"{key_dir.replace('/', '_')}_{stem}" if key_dir else stem) + f".{ext}"
            self._unlabelled += label is None
        else:
            parts = [safe_component(p) for p in key_dir.split("/") if p]
            rel = "/".join([*parts, f"{safe_component(stem)}.{ext}"])
            self._unlabelled += label is None
        rel = free_name(rel, self._used, (FILE_LIST, MANIFEST_NAME))
        path = safe_join(self._root, rel)
        parent = os.path.dirname(path)
        if parent not in self._dirs:
            os.makedirs(parent, exist_ok=True)
            self._dirs.add(parent)
        put(path)
        self._lines.append(f"{rel} {-1 if label is None else label}\n")
        self.count += 1
        return rel

    def close(self) -> None:
        if self._unlabelled < self.count:  # some record has a label: the list holds every record, -1 unlabeled
            (self.root / FILE_LIST).write_text("".join(self._lines), encoding="utf-8")
            if self._unlabelled:
                self.warnings.append(
                    f"folder: {self._unlabelled} of {self.count} records have no label: {FILE_LIST} lists them "
                    "with label -1" + ("" if self.flat else ", and they lie in the root, outside the class folders"))
        if self._written and not numbered_as_sorted(self._written):
            self.warnings.append(
                "folder: the class folders' sorted order does not give the labels (torchvision's ImageFolder "
                f"and DALI's file_root would number them otherwise); {FILE_LIST} holds the labels")


def a_tar(path: Path) -> bool:
    """Whether ``path`` is a tar file (plain, or compressed: ``.tar.gz``...), which ``--from folder`` (``audio``,
    ``video``) reads as the media folder it holds."""
    return Path(path).is_file() and is_tar_name(Path(path).name)


@register_format
class FolderFormat(Format):
    name = "folder"
    description = ("image files: ImageNet layout root/<class>/<file>, or flat with a file_list.txt; such a folder in a "
                   "ZIP, or in a tar (--from folder)")
    detect_priority = 90
    listed_ahead = True  # (its reader holds its path, classes, entries and what it left out: gpubatch._prescan)
    auto_units = 256  # (each task's files are moved to their names at the end: the cut leaves no trace)

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        if path.is_file():
            from .zip_folder import holds, is_zip

            return path.name == FILE_LIST or (is_zip(path) and holds(path, "image"))
        if (path / FILE_LIST).is_file():
            return True
        return any(not folder.exts.isdisjoint(_IMAGE_EXT) for folder in walk(path))  # (listing.py)

    @classmethod
    def accepts(cls, path: Path) -> bool:
        from .zip_folder import is_zip

        return cls.detect(path) or a_tar(path) or is_zip(path)

    @classmethod
    def reader(cls, path: Path) -> Reader:
        from .zip_folder import ZipFolderReader, is_zip

        if a_tar(path):  # a tar of an image folder's tree: its class folders read as classes, as once extracted
            from .webdataset import WebDatasetReader

            return WebDatasetReader(path, folder_classes="image")
        if is_zip(path):  # the image folder a ZIP holds, read where it lies
            return ZipFolderReader(path)
        return FolderReader(path)

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> Any:
        from .sinks import PartsSink

        return PartsSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        """Every shard's files moved to their names in shard order (no byte copied), then the file list."""
        return FolderFinalize(root, info, options, [s.index for s in shards]).finish(shards)

    @classmethod
    def begin_finalize(cls, root: Path, info: DatasetInfo, options: WriteOptions, order: list[int]) -> Any:
        """The finalize begun as the run's shards commit (:class:`FolderFinalize`)."""
        return FolderFinalize(root, info, options, order)


def _moved(src: str, dst: str) -> None:
    """A shard's part moved to its name, or found there already (moved by a run that was then interrupted: the
    names follow from the shards alone, so a part's name is the same in every run)."""
    try:
        os.replace(src, dst)
    except FileNotFoundError:
        if os.path.lexists(src) or not os.path.isfile(dst):
            raise


class FolderFinalize:
    """The folder format's finalize, which a local run begins while its workers write: each committed shard's
    files moved to their names (renames) once every shard before it in plan order (``order``: the shards'
    indexes) has been, so the names are those one finalize over every shard at the end would give; the file list,
    the folders' sync and the warnings at :meth:`finish`. Where the staging folder already held files outside the
    run's own folder when it began (a run interrupted during its finalize, resumed), a part already moved is found
    at its name, and :meth:`finish` removes whatever else is there."""

    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions, order: list[int]):
        self.root, self.order, self.at = Path(root), list(order), 0
        self.writer = FolderWriter(self.root, info, options)
        self.waiting: dict[int, Any] = {}
        self.placed: set[int] = set()
        self.names: set[str] = set()
        self.dirty = any(p.name != RUN_DIR for p in self.root.iterdir())
        self.noting = (self.root / RUN_DIR).is_dir()  # (a run's staging folder: its journal's)

    def committed(self, shard: Any) -> None:
        """Shard ``shard`` (a :class:`~gpubatch.types.ShardResult`) is committed: it, and those after it in plan
        order that wait for it, moved into place."""
        from .sinks import parts_of

        if shard.index not in self.placed:
            self.waiting[shard.index] = shard
        while self.at < len(self.order) and self.order[self.at] in self.waiting:
            index = self.order[self.at]
            if self.noting:  # (before its files leave the places its journal entry names: a resume still takes it)
                note_moved(self.root, index)
            for path, name, key, label in parts_of(self.root, self.waiting.pop(index)):
                self.names.add(self.writer.place(name, key, label, lambda dst, src=path: _moved(src, dst)))
            self.placed.add(index)
            self.at += 1

    def finish(self, shards: list[Any]) -> list[str]:
        """Every shard of ``shards`` (each committed, in plan order) in place, the file list written and the folders
        synced; the warnings."""
        from .sinks import fsync_dir

        for shard in shards:
            self.committed(shard)
        if self.at < len(self.order):  # (a shard of the plan with no result: the run's own error, never the user's)
            raise RuntimeError(f"folder: shard {self.order[self.at]} was never committed")
        self.writer.close()
        if self.dirty:
            self._sweep()
        for folder in self.writer._dirs:
            fsync_dir(folder)
        return list(self.writer.warnings)

    def _sweep(self) -> None:
        """Whatever an interrupted run left outside the run's folder that is not this dataset's, removed."""
        from .sinks import RUN_DIR

        keep = self.names | {FILE_LIST, MANIFEST_NAME}
        for top, _dirs, files in os.walk(self.root, topdown=False):
            rel_top = os.path.relpath(top, self.root)
            if rel_top == RUN_DIR or rel_top.startswith(RUN_DIR + os.sep):
                continue
            for f in files:
                rel = f if rel_top == "." else f"{rel_top}/{f}".replace(os.sep, "/")
                if rel not in keep:
                    os.unlink(os.path.join(top, f))
            if rel_top != "." and not os.listdir(top):
                os.rmdir(top)

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        return FolderWriter(root, info, options)
