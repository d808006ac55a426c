"""Dataset formats: a registry of :class:`~gpubatch.formats.base.Format` classes.

Adding a format is one module with a ``@register_format`` class and one line in ``_MODULES``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..errors import FormatError, UsageError
from .base import Format, Reader, WriteOptions, Writer

FORMATS: dict[str, type[Format]] = {}
_MODULES = ("folder", "lmdb", "tfrecord", "recordio", "coco", "webdataset")
_loaded = False


def register_format(cls: type[Format]) -> type[Format]:
    """Class decorator: make a format available under ``cls.name``."""
    FORMATS[cls.name] = cls
    return cls


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
        raise UsageError(f"unknown format {name!r}; supported: {', '.join(format_names())}")
    return fmt


def detect(path: Path) -> type[Format]:
    """Recognize the format of the dataset at ``path`` (its manifest first, then each format's check)."""
    _load()
    path = Path(path)
    if not path.exists():
        raise UsageError(f"source {path} does not exist")
    from .manifest import read_manifest

    manifest = read_manifest(path)
    if manifest and manifest.get("format") in FORMATS:
        return FORMATS[manifest["format"]]
    for fmt in sorted(FORMATS.values(), key=lambda f: f.detect_priority):
        if fmt.detect(path):
            return fmt
    raise FormatError(
        f"cannot tell the format of {path}: name it with --from ({', '.join(format_names())})"
    )


def open_reader(path: Path, fmt: str | None = None) -> Reader:
    """A reader for the dataset at ``path``, its format detected unless ``fmt`` names it."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"source {path} does not exist")
    cls = get_format(fmt) if fmt else detect(path)
    reader = cls.reader(path)
    reader.format_name = cls.name
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
