"""A compressed shard's decompressed copy, made once and shared by every process that reads it.

A run's workers each open the source themselves (``RunContext.opener``). Each decompressed a ``.tar.gz`` it read
into a temporary file of its own, so a run of 16 workers over one big compressed tar (Food-101's 5 GB
``food-101.tar.gz``, read with ``--from folder``) decompressed it 17 times, the listing's included, and held 17
copies in the temporary folder at once. Here the copy lies in ``<tmp>/gpubatch-unpacked-<uid>/``, named by the
shard's path, size, inode and modification time: the first process that needs it decompresses it (under a lock of
its own, ``<key>.lock``; the others wait there, then open the copy), and each process holds a shared ``flock`` on
the copy while it reads it. The last to let it go (its exclusive lock granted) removes it. A copy left by processes
that were killed is taken by the next run of the same shard, or removed by the next copy made, where no process holds
it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"gpubatch-unpacked-{os.getuid() if hasattr(os, 'getuid') else 0}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _key(path: Path) -> str:
    st = os.stat(path)
    name = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}"
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


@contextlib.contextmanager
def _making(folder: Path, key: str, wait: bool = True) -> Any:
    """The lock under which the copy ``key`` is made, opened or removed (None where ``wait`` is False and another
    process holds it)."""
    fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def _sweep(folder: Path, keep: str) -> None:
    """Copies no process holds (left by killed processes, or of shards since changed) removed, but ``keep``'s."""
    for copy in folder.glob("*.tar-*"):
        key = copy.name.split(".", 1)[0]
        if key == keep:
            continue
        with _making(folder, key, wait=False) as lock:
            if lock is None:
                continue
            try:
                fd = os.open(copy, os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                copy.unlink()
            except (BlockingIOError, OSError):
                pass
            finally:
                os.close(fd)


def shared_copy(path: Path, kind: str, decompress: Callable[[Path, str, Any], bool]) -> tuple[int, bool]:
    """A descriptor of ``path``'s decompressed copy (``decompress(path, kind, file)`` makes one and says whether its
    data ended whole) and that flag, the copy held (a shared lock) until :func:`let_go`."""
    folder = _folder()
    key = _key(path)
    with _making(folder, key) as _:
        for copy in (folder / f"{key}.tar-whole", folder / f"{key}.tar-cut"):
            try:
                fd = os.open(copy, os.O_RDONLY)
            except FileNotFoundError:
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            return fd, copy.name.endswith("whole")
        for stale in folder.glob(f"{key}.partial-*"):  # (a copy begun by a process killed while it made it)
            stale.unlink(missing_ok=True)
        _sweep(folder, key)
        tmp = folder / f"{key}.partial-{os.getpid()}"
        try:
            with open(tmp, "w+b") as f:
                whole = decompress(Path(path), kind, f)
                f.flush()
            copy = folder / f"{key}.tar-{'whole' if whole else 'cut'}"
            os.replace(tmp, copy)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fd = os.open(copy, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd, whole


def let_go(path: Path, fd: int) -> None:
    """This process's hold on ``path``'s copy given up (``fd`` closed); the copy removed where no other process
    holds it."""
    folder = _folder()
    try:
        key = _key(path)
    except OSError:  # (the shard is gone: its copy is swept by the next one made)
        os.close(fd)
        return
    with _making(folder, key) as _:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # (another process reads it still: the last one removes it)
            pass
        else:
            for copy in (folder / f"{key}.tar-whole", folder / f"{key}.tar-cut"):
                with contextlib.suppress(FileNotFoundError):
                    if os.path.samestat(os.fstat(fd), os.stat(copy)):
                        copy.unlink()
        finally:
            os.close(fd)
