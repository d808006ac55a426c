"""Path safety and atomic output.

Every dataset gpubatch writes is built in a staging folder beside the destination and renamed into
place only when complete, so an interrupted or failed run never leaves something that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from . import _remote
from ._commit import fsync_dir
from ._remote import PLACEHOLDER_NS, is_placeholder
from .errors import GpubatchError, UsageError

STAGING_MARK = ".gpubatch-partial-"
#: how long a part (``--num-parts``) waits for the output's lock that another part holds for a moment
PARTS_LOCK_WAIT_S = 60.0


def safe_relpath(name: str) -> str:
    """Validate a member or file name from a dataset and return it in normalized POSIX form.

    Raises:
        ValueError: the name is empty, absolute, or climbs out of the dataset root (``..``).
    """
    if ("\\" not in name and "\x00" not in name and name[1:2] != ":"
            and all(p not in ("", ".", "..") for p in name.split("/"))):
        return name  # (the common case, at a record's cost: already normal and inside the root)
    if not name or "\x00" in name:
        raise ValueError(f"invalid name {name!r}")
    posix = name.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        raise ValueError(f"absolute path {name!r} is not allowed inside a dataset")
    parts = [p for p in PurePosixPath(posix).parts if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise ValueError(f"path {name!r} escapes the dataset root")
    return "/".join(parts)


#: The most bytes one record may take: every read is bounded by it (a link to /dev/zero, a length field
#: of 2^60), far above any image's encoded size (an 89-megapixel 16-bit PNG is under 600 MiB).
MAX_RECORD_BYTES = 1 << 30

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, from its ``st_mode``."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


# --- placeholders: the local files standing for a remote source's files (gpubatch._remote) ---------------
#
# A placeholder is known by its modification time's nanoseconds (a stat the reads make anyway) and then its
# first bytes; open_fetched, read_range, read_regular and read_head give a placeholder's remote bytes
# instead of its own.

def open_fetched(path: Path | str) -> int:
    """A read-only descriptor of the file at ``path``; a remote file's placeholder is fetched whole into
    its place first (a shard read by offset)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if is_placeholder(os.fstat(fd), fd):
        os.close(fd)
        fd = _remote.fetch(path)  # (the fetched file's own descriptor: the cache may give the path back at once)
    return fd


def older(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether the file of ``a`` was modified before the one of ``b``; never said where either holds a store's
    time (a remote file's placeholder, or a file fetched from a store: whole seconds), which tells when each
    object was uploaded, in whatever order a copy made them."""
    if {a.st_mtime_ns % 1_000_000_000, b.st_mtime_ns % 1_000_000_000} & {0, PLACEHOLDER_NS}:
        return False
    return a.st_mtime_ns < b.st_mtime_ns


def fetched(path: Path | str) -> Path | str:
    """``path``, a remote file's placeholder fetched into its place first (for a library that opens the
    file by its path: LMDB, whose source is that one file; the cache gives a fetched file back as a
    placeholder once :data:`~._remote.KEEP` later ones are fetched, so a reader of several files opens each
    through :func:`open_fetched`'s descriptor, as Parquet's does)."""
    os.close(open_fetched(path))
    return path


def read_range(path: Path | str, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset`` of the file at ``path`` (of the remote file where it is a placeholder)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if is_placeholder(os.fstat(fd), fd):
            return _remote.read_range(path, offset, n)
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


#: archives and compressed files by their first bytes: what a text listing or a dataset is not
_ARCHIVES = ((b"PK\x03\x04", "a ZIP archive"), (b"PK\x05\x06", "a ZIP archive"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
             (b"Rar!\x1a\x07", "a RAR archive"), (b"\x1f\x8b", "a gzip file"), (b"BZh", "a bzip2 file"),
             (b"\xfd7zXZ\x00", "an xz file"), (b"\x28\xb5\x2f\xfd", "a zstd file"))


def archive_kind(head: bytes) -> str | None:
    """What archive or compressed file ``head`` (a file's first bytes) begins, in words ("a ZIP archive"), or
    None."""
    return next((name for magic, name in _ARCHIVES if head.startswith(magic)), None)


def unpack_hint(path: Path | str, kind: str) -> str:
    """How to unpack an archive gpubatch does not read, to pass its folder instead."""
    stem = Path(path).name.split(".")[0] or "data"
    tool = {"a ZIP archive": f"unzip {path} -d {stem}", "a 7-Zip archive": f"7z x {path} -o{stem}",
            "a RAR archive": f"unrar x {path} {stem}/"}.get(kind)
    return f"unpack it ({tool}) and pass the folder" if tool else "unpack it and pass what it holds"


def read_listing(path: Path | str, what: str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of a text listing (``what``: "a file list", "a CSV"...), refused in one line where it cannot be
    read or holds binary data (an archive, an image passed where a list goes), instead of each of its "lines"
    becoming a damaged record.

    Raises:
        FormatError: as above.
    """
    from .errors import FormatError

    try:
        raw = read_regular(path, limit)
    except (OSError, ValueError) as e:
        raise FormatError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 with its byte-order mark (Excel's "Unicode text")
        try:
            return raw.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{path} is not {what}: it begins as UTF-16 text but is not ({e.reason})") from None
    if b"\0" in raw[:1 << 16] or archive_kind(raw[:8]):
        kind = archive_kind(raw[:8])
        said = f"it is {kind}: {unpack_hint(path, kind)}" if kind else "it holds binary data"
        raise FormatError(f"{path} is not {what}: {said}")
    return raw


def read_regular(path: Path | str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (links followed), at most ``limit`` of them.

    Opened without blocking and checked before reading, so a FIFO, a device (a link to /dev/zero) or a
    socket named like an image neither hangs nor fills memory.

    Raises:
        OSError: the file cannot be opened or read.
        ValueError: it is not a regular file, or holds more than ``limit`` bytes.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{file_kind(st.st_mode)}, not a regular file")
        if is_placeholder(st, fd):
            return _remote.read_whole(path, limit)
        if st.st_size > limit:
            raise ValueError(f"{st.st_size:,} bytes, above the {limit:,}-byte bound on one record")
        chunks, total = [], 0
        while True:
            want = st.st_size - total if total < st.st_size else 1 << 20  # then EOF, or what it grew by
            chunk = os.read(fd, min(want, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ValueError(f"more than the {limit:,}-byte bound on one record")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


#: how a Git LFS pointer file starts (a clone made without ``git lfs``: the file's text stands in for its data)
LFS_MAGIC = b"version https://git-lfs.github.com/spec/"


def lfs_pointer(head: bytes) -> str | None:
    """Where ``head`` (a file's first bytes) is a Git LFS pointer, what to say of it; else None."""
    if not head.startswith(LFS_MAGIC):
        return None
    size = next((ln.split()[1] for ln in head.decode("ascii", "replace").splitlines() if ln.startswith("size ")), "")
    of = f" of a {int(size):,}-byte file" if size.isdigit() else ""
    return f"a Git LFS pointer{of}, not its data (the clone was made without git-lfs): run 'git lfs pull' first"


def read_head(path: Path | str, n: int) -> bytes:
    """The first ``n`` bytes of the regular file at ``path``; b"" for anything else (a FIFO, a device, a
    socket, a folder) or a file that cannot be opened. Format detection reads through this: it never
    blocks on a FIFO named like a dataset file, nor reads a device."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        if is_placeholder(st, fd):
            return _remote.read_range(path, 0, n)
        return os.pread(fd, n, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


def safe_join(root: Path | str, name: str) -> Path | str:
    """``root / name`` after :func:`safe_relpath` validation (a string for a string ``root``: no Path a
    record on the hot paths)."""
    if isinstance(root, str):
        return os.path.join(root, safe_relpath(name))
    return Path(root) / safe_relpath(name)


# A glob (``train-*.tar``) or WebDataset's brace form (``train-{000000..000099}.tar``, ``{a,b}``)
_BRACES = re.compile(r"\{[^{}]*(?:,|\.\.)[^{}]*\}")
_GLOB = re.compile(r"[*?\[]")
_PATTERN = re.compile(_GLOB.pattern + "|" + _BRACES.pattern)


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


def missing_shards(path: Path) -> list[tuple[str, str]]:
    """The files a brace pattern spells out in full (``train-{000000..000099}.tar``: no glob character
    in the name) that do not exist, each with its reason: shards the user named whose records cannot be
    read, never left out without a word. Empty where ``path`` exists or holds no brace form."""
    path = Path(path)
    if path.exists() or not _BRACES.search(str(path)):
        return []
    from braceexpand import braceexpand

    why = "the source pattern names this shard, but there is no such file: its records are not read"
    return [(p, why) for p in braceexpand(str(path)) if not _GLOB.search(p) and not os.path.isfile(p)]


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


def source_paths(path: Path) -> list[Path]:
    """What a source is read from, for :func:`check_output`: a pattern's files, a file itself, or a folder (a file's
    records may lie beside it: the readers that read them there, a COCO JSON's, a file list's, name that folder in
    their ``roots``). An output beside a shard given alone (``convert train.tar out``) is no overlap."""
    matched = source_files(Path(path))
    return list(matched) if matched else [Path(path)]


def is_within(path: Path, root: Path) -> bool:
    """True when ``path`` is ``root`` or lies inside it (symlinks resolved)."""
    path, root = Path(path).resolve(), Path(root).resolve()
    return path == root or root in path.parents


def output_path(dst: Path) -> Path:
    """``dst`` made absolute (``.`` and ``..`` folded, the last link not followed), so that the staging
    folder and the lock go beside it; the current folder, or a folder holding it, is refused: gpubatch
    builds DST beside itself and replaces it as a whole, which cannot be done to where the run stands."""
    out = Path(os.path.abspath(dst))
    if out == out.parent or not out.name:
        raise UsageError(f"output {dst} is a file-system root: name a folder to create")
    here = Path.cwd()
    if out.exists() and (out == here or out in here.parents):
        raise UsageError(f"output {dst} is the current folder, or holds it: gpubatch builds a new folder and renames "
                         "it into place, which cannot replace the folder a command runs in; name a new folder")
    return out


def check_output(sources: Path | list[Path] | None, dst: Path, overwrite: bool) -> None:
    """Refuse destinations that would lose data: an existing one without --overwrite, or one that
    overlaps any folder the source is read from (a COCO file's image folder included)."""
    dst = output_path(dst)
    roots = [] if sources is None else [sources] if isinstance(sources, (str, Path)) else list(sources)
    for src in roots:
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


# --- staging, the output lock, and the swap into place -------------------------------------------------
#
# Beside DST a run makes ``.DST.gpubatch-lock`` (held with flock for the whole run: a second run to the same
# DST is refused), its staging folder ``.DST.gpubatch-partial-<pid>-<rand>``, and, only while --overwrite
# swaps on a file system without an atomic exchange, ``.DST.gpubatch-old-<pid>-<rand>``. Whatever of these
# a killed run left is put right by the next run to DST, which says what it did.

OLD_MARK = ".gpubatch-old-"
LOCK_MARK = ".gpubatch-lock"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _beside(dst: Path, mark: str) -> Path:
    return dst.parent / f".{dst.name}{mark}{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux's renameat2 with ``flags``: True when done, False where the system or the file system
    does not offer it (the caller falls back to plain renames); other failures raise OSError."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*"))


@contextmanager
def _output_lock(dst: Path, wait: float = 0.0) -> Iterator[None]:
    """Hold ``.DST.gpubatch-lock`` for the run; another run holding it is a one-line error (after waiting
    up to ``wait`` seconds for it: the parts of one run take it for a moment each)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        yield
        return
    lock = dst.parent / f".{dst.name}{LOCK_MARK}"
    until = time.monotonic() + wait
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            if time.monotonic() < until:
                time.sleep(0.05)
                continue
            raise GpubatchError(f"another gpubatch run{f' (pid {owner})' if owner.isdigit() else ''} is writing "
                                f"{dst}: wait for it to end, or choose another destination") from None
        try:  # the holder before us may have removed the file as we opened it: lock the one on disk
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def recover_output(dst: Path, warn: Callable[[str], None], spare: Path | None = None) -> None:
    """Put right what a killed run to ``dst`` left beside it (called with the output lock held, so no
    run that is still going owns any of it): an ``--overwrite`` killed between moving the old DST aside
    and renaming the new one in gets the old DST back; staging folders and old copies are removed, but
    ``spare`` (the staging folder a run may resume in: its caller decides)."""
    prefix = f".{dst.name}"
    left = sorted((p for p in dst.parent.iterdir() if p.name.startswith(prefix) and p != spare
                   and any(p.name.startswith(prefix + m) for m in (STAGING_MARK.rstrip("-"), OLD_MARK))),
                  key=lambda p: p.lstat().st_mtime)
    if not left:
        return
    olds = [p for p in left if p.name.startswith(prefix + OLD_MARK)]
    if olds and not (dst.exists() or dst.is_symlink()):
        os.replace(olds[-1], dst)
        left.remove(olds[-1])
        warn(f"{dst} was restored from {olds[-1].name}, where an --overwrite run that was killed mid-swap had "
             "moved it")
    if left:
        size = sum(_size(p) for p in left)
        for p in left:
            _remove(p)
        names = ", ".join(p.name for p in left[:3]) + (", ..." if len(left) > 3 else "")
        warn(f"removed {len(left)} unfinished output folder{'s' if len(left) > 1 else ''} of killed runs to {dst.name} "
             f"({names}; {size / 2**20:,.1f} MiB)")


def _swap_in(stage: Path, dst: Path, overwrite: bool) -> None:
    """Rename the finished ``stage`` to ``dst``, replacing an existing ``dst`` only with ``overwrite``.

    Where the file system can exchange two names atomically (Linux renameat2), there is no moment
    without a DST; elsewhere the old DST is moved aside first, and a kill in between leaves it for
    :func:`recover_output` to restore."""
    exists = dst.exists() or dst.is_symlink()
    if exists and not overwrite:
        raise UsageError(f"output {dst} appeared while the run was going: pass --overwrite to replace it")
    if not exists:
        try:
            if not _renameat2(stage, dst, _RENAME_NOREPLACE):
                os.rename(stage, dst)  # pragma: no cover - a file system without renameat2
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another program's output landed there just now
                raise UsageError(f"output {dst} appeared while the run was going: pass --overwrite to replace it"
                                 ) from None
            raise
        return
    if _renameat2(stage, dst, _RENAME_EXCHANGE):
        _remove(stage)  # the old DST, under the staging name
        return
    old = _beside(dst, OLD_MARK)  # pragma: no cover - a file system without renameat2
    os.replace(dst, old)
    os.replace(stage, dst)
    _remove(old)


@contextmanager
def staged_output(dst: Path, overwrite: bool, warn: Callable[[str], None] | None = None,
                  resume: Callable[[Path], bool] | None = None,
                  keep: Callable[[Path, BaseException], str | None] | None = None) -> Iterator[Path]:
    """Yield the staging folder of ``dst``; on success it replaces ``dst`` (atomically where the OS allows).

    Missing folders above ``dst`` are made first (as ``mkdir -p``). The run holds ``dst``'s lock
    throughout, and first puts right what a killed run to ``dst`` left (:func:`recover_output`; ``warn``
    is told). The staging folder is ``.DST.gpubatch-partial``: where an interrupted run left one,
    ``resume(stage)`` says whether this run carries on in it (True) or starts over (False: it is removed);
    it may raise to refuse. On an exception the staging folder is removed, unless ``keep(stage, error)``
    says why it stays (a run interrupted with shards committed, to resume); the folders made for it go
    where they are still empty, and ``dst`` is left as it was.
    """
    dst = output_path(dst)
    made = [f for f in (dst.parent, *dst.parent.parents) if not f.exists()]  # deepest first

    def take_back_made() -> None:  # the folders made for this output, where nothing else came in
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break

    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        take_back_made()
        raise UsageError(f"cannot create the output {dst}: {e.strerror or e}") from None
    try:
        with _output_lock(dst):
            said: list[str] = []
            stage = dst.parent / f".{dst.name}{STAGING_MARK.rstrip('-')}"
            recover_output(dst, lambda message: (said.append(message), warn and warn(message)), spare=stage)
            if (dst.exists() or dst.is_symlink()) and not overwrite:
                raise UsageError(f"output {dst} already exists: pass --overwrite to replace it"
                                 + "".join(f" ({m})" for m in said))
            if stage.exists() and not (resume is not None and resume(stage)):
                _remove(stage)
            try:
                stage.mkdir(exist_ok=True)
            except OSError as e:
                raise UsageError(f"cannot create the output {dst}: {e.strerror or e}") from None
            try:
                yield stage
                _swap_in(stage, dst, overwrite)
                fsync_dir(dst.parent, final=True)  # (the dataset's name on disk, as its files: --sync)
            except BaseException as e:
                why = keep(stage, e) if keep is not None else None
                if why is None:
                    _remove(stage)
                else:  # the one line the command prints for the interruption says it
                    e.gpubatch_kept = why  # type: ignore[attr-defined]
                raise
    except BaseException:
        take_back_made()
        raise


def staging_folder(dst: Path) -> Path:
    """The staging folder a run to ``dst`` writes in (``.DST.gpubatch-partial``)."""
    dst = output_path(dst)
    return dst.parent / f".{dst.name}{STAGING_MARK.rstrip('-')}"


@contextmanager
def shared_stage(dst: Path, overwrite: bool, warn: Callable[[str], None], claim: Callable[[Path], None]) -> Iterator[Path]:
    """The staging folder of ``dst`` shared by the parts of one run (``--num-parts``), each a process of its
    own, on this machine or others that see the same file system. Under ``dst``'s lock, for a moment only
    (parts run side by side): the folder is made where missing, and ``claim(stage)`` checks that it is
    this run's or starts its journal (it may raise to refuse). Whatever happens after, the folder stays:
    it holds the other parts' shards; ``gpubatch finish DST`` makes the dataset from it."""
    dst = output_path(dst)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the output {dst}: {e.strerror or e}") from None
    stage = staging_folder(dst)
    with _output_lock(dst, wait=PARTS_LOCK_WAIT_S):
        recover_output(dst, warn, spare=stage)
        if (dst.exists() or dst.is_symlink()) and not overwrite:
            raise UsageError(f"output {dst} already exists: pass --overwrite to replace it (when the run finishes)")
        try:
            stage.mkdir(exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create the output {dst}: {e.strerror or e}") from None
        claim(stage)
    yield stage
