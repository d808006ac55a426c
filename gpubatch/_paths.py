"""Path safety and atomic output.

Every dataset gpubatch writes is built in a staging folder beside the destination and renamed into
place only when complete, so an interrupted or failed run never leaves something that looks finished.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from .errors import UsageError

STAGING_MARK = ".gpubatch-partial-"


def safe_relpath(name: str) -> str:
    """Validate a member or file name from a dataset and return it in normalized POSIX form.

    Raises:
        ValueError: the name is empty, absolute, or climbs out of the dataset root (``..``).
    """
    if not name or "\x00" in name:
        raise ValueError(f"invalid name {name!r}")
    posix = name.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        raise ValueError(f"absolute path {name!r} is not allowed inside a dataset")
    parts = [p for p in PurePosixPath(posix).parts if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise ValueError(f"path {name!r} escapes the dataset root")
    return "/".join(parts)


def safe_join(root: Path, name: str) -> Path:
    """``root / name`` after :func:`safe_relpath` validation."""
    return Path(root) / safe_relpath(name)


# A glob (``train-*.tar``) or WebDataset's brace form (``train-{000000..000099}.tar``, ``{a,b}``)
_BRACES = re.compile(r"\{[^{}]*(?:,|\.\.)[^{}]*\}")
_PATTERN = re.compile(r"[*?\[]|" + _BRACES.pattern)


def source_files(path: Path) -> list[Path] | None:
    """The files a source pattern names (a glob, or WebDataset's brace form), sorted; None where
    ``path`` exists as it is, or holds no pattern."""
    path = Path(path)
    if path.exists() or not _PATTERN.search(str(path)):
        return None
    patterns = [str(path)]
    if _BRACES.search(str(path)):
        try:
            from braceexpand import braceexpand
        except ImportError:  # pragma: no cover - a core dependency
            from .errors import DependencyError

            raise DependencyError("brace patterns need braceexpand: pip install braceexpand") from None
        patterns = list(braceexpand(str(path)))
    return sorted({Path(p) for one in patterns for p in glob.glob(one) if os.path.isfile(p)})


def require_source(path: Path) -> None:
    """A one-line error where the source neither exists nor is a pattern that names some file."""
    matched = source_files(path)
    if matched is None and not Path(path).exists():
        raise UsageError(f"source {path} does not exist")
    if matched == []:
        raise UsageError(f"no file matches the source pattern {path}")


def source_root(path: Path) -> Path:
    """The folder a source lies in: the folder itself, a file's folder, or the folder holding a
    pattern's files."""
    path = Path(path)
    matched = source_files(path)
    if matched:
        return Path(os.path.commonpath([str(p.parent) for p in matched]))
    return path.parent if path.is_file() else path


def is_within(path: Path, root: Path) -> bool:
    """True when ``path`` is ``root`` or lies inside it (symlinks resolved)."""
    path, root = Path(path).resolve(), Path(root).resolve()
    return path == root or root in path.parents


def check_output(src: Path | None, dst: Path, overwrite: bool) -> None:
    """Refuse destinations that would lose data: an existing one without --overwrite, or one that
    overlaps the source."""
    dst = Path(dst)
    if src is not None:
        if is_within(dst, src):
            raise UsageError(f"output {dst} is the source or lies inside it: choose a destination outside {src}")
        if overwrite and dst.exists() and is_within(src, dst):
            raise UsageError(f"--overwrite would delete the source {src}, which lies inside {dst}")
    if dst.exists() or dst.is_symlink():
        if not overwrite:
            raise UsageError(f"output {dst} already exists: pass --overwrite to replace it")
    for folder in (dst.parent, *dst.parent.parents):  # made when the run starts (mkdir -p), unless a file is there
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(f"{folder} is not a folder: the output {dst} cannot go under it")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise UsageError(f"cannot write in {folder}: the output {dst} cannot go there")
            break


@contextmanager
def staged_output(dst: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a fresh staging folder; on success it replaces ``dst`` (atomically where the OS allows).

    Missing folders above ``dst`` are made first (as ``mkdir -p``). On any exception (KeyboardInterrupt
    included) the staging folder is removed, so are the folders made for it where they are still empty,
    and ``dst`` is left as it was.
    """
    dst = Path(dst)
    made = [f for f in (dst.parent, *dst.parent.parents) if not f.exists()]  # deepest first

    def take_back_made() -> None:  # the folders made for this output, where nothing else came in
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break

    stage = dst.parent / f".{dst.name}{STAGING_MARK}{uuid.uuid4().hex[:8]}"
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        stage.mkdir()
    except OSError as e:
        take_back_made()
        raise UsageError(f"cannot create the output {dst}: {e.strerror or e}") from None
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        take_back_made()
        raise
    old = None
    if dst.exists() or dst.is_symlink():
        if not overwrite:
            shutil.rmtree(stage, ignore_errors=True)
            raise UsageError(f"output {dst} appeared while the run was going: pass --overwrite to replace it")
        old = dst.parent / f".{dst.name}.gpubatch-old-{uuid.uuid4().hex[:8]}"
        os.replace(dst, old)
    os.replace(stage, dst)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
