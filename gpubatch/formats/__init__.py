"""Dataset formats: a registry of :class:`~gpubatch.formats.base.Format` classes.

Adding a format is one module with a ``@register_format`` class and one line in ``_MODULES``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from .._paths import missing_shards, require_source, source_files
from ..errors import FormatError, GpubatchError, UsageError, did_you_mean, register_once
from ..types import other_media_message
from .base import Format, Reader, WriteOptions, Writer

FORMATS: dict[str, type[Format]] = {}
#: What people call the formats, to suggest the name gpubatch knows them by (never taken silently).
FORMAT_ALIASES = {"wds": "webdataset", "tar": "webdataset", "tfr": "tfrecord", "tfrecords": "tfrecord",
                  "tf": "tfrecord", "rec": "recordio", "mxnet": "recordio", "caffe": "lmdb", "imagefolder": "folder",
                  "images": "folder", "imagenet": "folder", "json": "coco",
                  "pascal": "voc", "pascalvoc": "voc", "ultralytics": "yolo", "pq": "parquet",
                  "hf": "parquet", "huggingface": "parquet"}
_MODULES = ("folder", "lmdb", "tfrecord", "recordio", "coco", "voc", "yolo", "webdataset", "parquet", "video", "audio")
_loaded = False


def register_format(cls: type[Format]) -> type[Format]:
    """Class decorator: make a format available under ``cls.name``."""
    return register_once(FORMATS, cls.name, cls, "format")


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(f"{__name__}.{mod}")
        _loaded = True


def format_names() -> list[str]:
    _load()
    return sorted(FORMATS)


def get_format(name: str) -> type[Format]:
    """The format called ``name``; an unknown name is a one-line error listing the known ones."""
    _load()
    fmt = FORMATS.get(name.lower().strip())
    if fmt is None:
        hint = did_you_mean(name, format_names(), FORMAT_ALIASES)
        raise UsageError(f"unknown format {name!r}{hint}; supported: {', '.join(format_names())}")
    return fmt


def _some_file_names(path: Path, most: int = 1000) -> list[str]:
    """Up to ``most`` file names under ``path`` (or its own name when it is a file)."""
    if path.is_file():
        return [path.name]
    names: list[str] = []
    for _dirpath, _dirs, files in os.walk(path):
        names.extend(files)
        if len(names) >= most:
            break
    return names[:most]


def _lfs_pointers(path: Path, most: int = 200) -> str | None:
    """Where the files of ``path`` are Git LFS pointers (a clone made without git-lfs), one line that says
    so; None otherwise."""
    from .._paths import lfs_pointer, read_head

    files = [path] if path.is_file() else [Path(d) / f for d, _, fs in os.walk(path) for f in fs][:most]
    pointers = [f for f in files if lfs_pointer(read_head(f, 200))]
    if not pointers:
        return None
    if len(pointers) == 1:
        return f"{path}: {pointers[0].name} is {lfs_pointer(read_head(pointers[0], 200))}"
    return (f"{path}: {len(pointers)} of the {len(files)} files looked at ({pointers[0].name}, ...) are Git LFS "
            "pointers, not their data (the clone was made without git-lfs): run 'git lfs pull' first")


def detect(path: Path) -> type[Format]:
    """Recognize the format of the dataset at ``path`` (its manifest first, then each format's check)."""
    return _detect(Path(path))[0]


def _detect(path: Path) -> tuple[type[Format], str | None]:
    """The format of the dataset at ``path``, and a warning where its manifest named another one (the formats'
    checks walk its folders once between them: :mod:`.listing`)."""
    from .listing import shared_walk

    with shared_walk():
        return _detected(path)


def _detected(path: Path) -> tuple[type[Format], str | None]:
    _load()
    require_source(path)
    from .manifest import read_manifest

    matched = source_files(path)
    if matched:  # a pattern of shards: told by the manifest beside its first file, or by that file
        manifest = read_manifest(matched[0])
        fmt = FORMATS.get((manifest or {}).get("format"))
        if fmt is None or not fmt.sharded:
            fmt = next((f for f in sorted(FORMATS.values(), key=lambda f: f.detect_priority)
                        if f.sharded and f.detect(matched[0])), None)
        if fmt is None:
            raise FormatError(f"{matched[0]}, the first file {path} names, is no webdataset, tfrecord or recordio "
                              "shard: a source pattern picks shards of those formats")
        return fmt, None
    manifest = read_manifest(path) or {}
    said = FORMATS.get(manifest.get("format"))
    if said is not None and said.detect(path):
        return said, None
    for fmt in sorted(FORMATS.values(), key=lambda f: f.detect_priority):
        if fmt.detect(path):
            warning = None
            if said is not None:  # what is on disk wins over the sidecar
                warning = (f"{path}'s gpubatch.json says {said.name}, but its files are a {fmt.name} dataset: read "
                           f"as {fmt.name}")
            return fmt, warning
    media = other_media_message(path, _some_file_names(path))
    if media:
        raise FormatError(media)
    lfs = _lfs_pointers(path)
    if lfs:
        raise FormatError(lfs)
    if path.is_dir() and not any(f.is_file() for f in path.rglob("*")):  # (nothing to tell it by)
        raise FormatError(f"{path} holds no files: nothing to read")
    if path.is_file():
        from .._paths import archive_kind, read_head, unpack_hint
        from ..types import IMAGE_EXTENSIONS

        kind = archive_kind(read_head(path, 8))
        if kind == "a ZIP archive":  # (a ZIP of images is the image folder it holds: FolderFormat took it)
            from .zip_folder import holds, listed

            listed(path)  # (a damaged ZIP says so, not that it holds no such file)
            media = next((m for m in ("audio", "video") if holds(path, m)), None)
            if media:
                raise FormatError(f"{path} is a ZIP archive of {media} files: read it with --from {media}")
            raise FormatError(f"{path} is a ZIP archive that holds no image, audio or video file: "
                              f"{unpack_hint(path, kind)}")
        if kind and not any(ext in path.name.lower() for ext in (".tar", ".tgz")):
            raise FormatError(f"{path} is {kind}, which gpubatch does not read: {unpack_hint(path, kind)}")
        if "." in path.name and path.name.rsplit(".", 1)[1].lower() in IMAGE_EXTENSIONS:
            raise FormatError(f"{path} is one image: gpubatch reads datasets; pass the folder that holds it "
                              f"({path.parent})")
    raise FormatError(
        f"cannot tell the format of {path}: name it with --from ({', '.join(format_names())})"
    )


def open_reader(path: Path, fmt: str | None = None, options: dict | None = None,
                detected: tuple[type[Format], str | None] | None = None) -> Reader:
    """A reader for the dataset at ``path``, its format detected unless ``fmt`` names it (``detected``: what
    :func:`_detect` said of it already); ``options`` (an audio CSV's ``path_column``/``label_column``) go to readers
    that take them."""
    path = Path(path)
    require_source(path)
    cls, warning = (get_format(fmt), None) if fmt else detected or _detect(path)
    if fmt and not source_files(path) and not cls.accepts(path):
        try:
            found = _detect(path)[0]
        except GpubatchError:  # nothing else recognizes it either: the named reader has its say
            found = None
        if found is not None and found is not cls:
            raise UsageError(f"{path} is not {cls.name} data: it looks like a dataset of the {found.name} format; "
                             f"leave --from out to read it as that, or pass --from {found.name}")
    if source_files(path) and not cls.sharded:
        raise UsageError(f"a source pattern picks shards of webdataset, tfrecord or recordio; {cls.name} takes "
                         "its folder (or file) itself")
    given = {k: v for k, v in (options or {}).items() if v is not None}
    if given and cls.name != "audio":
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in given)} name columns of an audio dataset's "
                         f"CSV; {path} is {cls.name} data")
    reader = cls.reader(path, **given) if given else cls.reader(path)
    reader.format_name = cls.name
    reader.missing = missing_shards(path)
    if path.is_dir():  # a folder of numbered shards (-00003-of-00016) that lacks some
        from .base import numbered_gaps

        reader.missing += numbered_gaps(reader.shard_paths())
        if cls.sharded:  # (a shard the dataset's manifest lists, gone from the folder)
            from .manifest import lost_shards

            reader.missing += lost_shards(getattr(reader, "manifest", None) or {}, path, reader.shard_paths(),
                                          [m for m, _ in reader.missing])
    if warning:
        reader.warnings.insert(0, warning)
    return reader


__all__ = [
    "FORMATS",
    "Format",
    "Reader",
    "WriteOptions",
    "Writer",
    "detect",
    "format_names",
    "get_format",
    "open_reader",
    "register_format",
]
