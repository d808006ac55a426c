"""One walk of a source folder for every format's check.

Telling a folder's format walks it: Parquet's check looks for a ``.parquet`` file anywhere, the video folder's
for a clip, the audio and image folders' for their files. On a folder of images Parquet's and the video folder's
checks each walked every folder with ``os.walk``, a Python test a file name, so a source of 16,384 images was
listed twice in full (and in part by the other checks) before its reader listed it for its records (detecting a
folder of 16,384 files in 16 class folders took 0.039-0.053 s on the 2-core CI machine, 0.017-0.024 s with one walk:
``benchmarks/list_entries.py --folder --images 16384 --classes 16``, 2026-12-06; an ImageNet train folder holds 78
times as many files). Inside :func:`shared_walk` (``formats.detect`` holds it)
each folder is listed once, as a :class:`Folder`: its sub-folders, its file names and the set of their
extensions, so that a check asks a folder's extensions once instead of each of its names. Only names are kept
(about 75 bytes a file), and only for the checks: the reader's own scan lists the folder again, with what it
needs of each entry (links, kinds) for its records.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import NamedTuple


class Folder(NamedTuple):
    """One folder of a walk. ``dirs`` is the caller's to prune or reorder in place (as ``os.walk``'s): the walk
    goes into the sub-folders it holds when the caller asks for the next folder."""

    path: str
    dirs: list[str]
    files: list[str]  # (every entry that is no folder: regular files, links to files, broken links, others; the
    # walk's own list, shared by every walk in the scope: read it, never change it)
    exts: frozenset[str]  # the files' extensions, lowercased ("jpg" of "a.JPG"; none of a name without a dot)
    shown_exts: frozenset[str]  # the same of the files whose names do not begin with a dot


class _Listed(NamedTuple):
    dirs: tuple[str, ...]
    links: frozenset[str]  # the sub-folders that are links (never walked into, as os.walk's default)
    files: list[str]
    exts: frozenset[str]
    shown_exts: frozenset[str]


_SHARED: ContextVar[dict[str, _Listed] | None] = ContextVar("gpubatch_walk", default=None)


@contextlib.contextmanager
def shared_walk() -> Iterator[None]:
    """Inside it each folder is listed once, whichever walk asks; nested, the outer scope's listings serve."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def walk(top: str | os.PathLike) -> Iterator[Folder]:
    """The folders under ``top`` and ``top`` itself, as ``os.walk(top)`` visits them: top-down, each folder's
    sub-folders in the order listed (or as the caller left ``dirs``), links to folders not followed, folders
    that cannot be listed left out."""
    yield from _walk(os.fspath(top))


def _walk(top: str) -> Iterator[Folder]:
    listed = _listed(top)
    if listed is None:
        return
    folder = Folder(top, list(listed.dirs), listed.files, listed.exts, listed.shown_exts)
    yield folder
    known = set(listed.dirs)
    for name in folder.dirs:
        path = os.path.join(top, name)
        if name in listed.links or (name not in known and os.path.islink(path)):
            continue
        yield from _walk(path)


def _listed(path: str) -> _Listed | None:
    memo = _SHARED.get()
    if memo is not None and path in memo:
        return memo[path]
    try:
        with os.scandir(path) as it:
            items = list(it)
    except OSError:
        return None  # (not remembered: a later walk tries again)
    dirs: list[str] = []
    links: list[str] = []
    files: list[str] = []
    for entry in items:
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            files.append(entry.name)
            continue
        dirs.append(entry.name)
        try:
            if entry.is_symlink():
                links.append(entry.name)
        except OSError:
            links.append(entry.name)
    exts = {n.rpartition(".")[2].lower() for n in files if "." in n}
    shown = exts if not any(n[:1] == "." for n in files) else \
        {n.rpartition(".")[2].lower() for n in files if "." in n and n[:1] != "."}
    listed = _Listed(tuple(dirs), frozenset(links), files, frozenset(exts), frozenset(shown))
    if memo is not None:
        memo[path] = listed
    return listed
