"""Files written whole or not at all: under a temporary name, digested as written, fsynced and renamed
into place (a shard's files, its journal entry, a parameter log).

The digest is CRC-32C (the ``crc32c`` package's, on the CPU's own CRC instruction: several times faster
than zlib's CRC-32, which had been a worker's largest cost of a pass-through after its reads and writes;
BLAKE2b had taken 12% of such a run) with the size beside it, in the shard's journal entry: what the
shard was when committed.
``--resume`` checks the sizes (reading every committed shard again would cost a resume its writes), and
the digests too of a shard written under ``--sync end|off`` in another boot of its machine (:func:`trusted`).

How much of that a run syncs is its ``--sync`` (:data:`SYNC_MODES`, :func:`syncing`): every fsync here and in
the sinks goes through :func:`durable` and :func:`fsync_dir`, which do nothing unless the run syncs as it goes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PARTIAL = ".partial"

#: a run's ``--sync``: "shard" (each file fsynced as it is committed, each folder after its renames: a shard
#: is on disk before it counts as done, and a run cut off by a power loss resumes from the shards it
#: committed), "end" (nothing synced as the run goes; its file system synced once before the dataset is
#: renamed into place: the same dataset on disk when the command returns), "off" (never synced, as ``cp``
#: and ``tar`` do: the OS writes the pages when it will)
SYNC_MODES = ("shard", "end", "off")
_SYNC = ["shard"]  # this process's run's mode (the command's, and each worker's from its sinks' options)


def set_sync(mode: str | None) -> str:
    """This process's ``--sync`` from now on (None: "shard"); the mode it had."""
    mode = mode or "shard"
    if mode not in SYNC_MODES:
        from .errors import UsageError

        raise UsageError(f"unknown --sync {mode!r}; supported: {', '.join(SYNC_MODES)}")
    was, _SYNC[0] = _SYNC[0], mode
    return was


@contextlib.contextmanager
def sync_as(mode: str | None) -> Iterator[None]:
    """This process syncs as ``mode`` says for the block (a run), as before it after."""
    was = set_sync(mode)
    try:
        yield
    finally:
        _SYNC[0] = was


def sync_mode() -> str:
    return _SYNC[0]


def syncing() -> bool:
    """Whether this process's run makes each file durable as it commits it (``--sync shard``)."""
    return _SYNC[0] == "shard"


def durable(f: Any) -> None:
    """Flush the open file ``f`` and, where the run syncs as it goes, fsync it."""
    f.flush()
    if _SYNC[0] == "shard":
        os.fsync(f.fileno())


_BOOT: list[str | None] = []


def boot_id() -> str | None:
    """This machine's boot (Linux's random boot id; None elsewhere): pages a run left unsynced are on disk
    or in the page cache of the same boot, whatever killed the run; in another boot they may be lost."""
    if not _BOOT:
        try:
            _BOOT.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None)
        except OSError:
            _BOOT.append(None)
    return _BOOT[0]


def unsynced_mark() -> dict[str, Any]:
    """What a journal entry (or LMDB's state) notes of a commit not synced: {"unsynced": the boot}, or {}
    where the run syncs as it goes."""
    return {} if _SYNC[0] == "shard" else {"unsynced": boot_id() or "unknown"}


def trusted(mark: Any) -> bool:
    """Whether what a commit wrote can be taken as it was left: synced, or not synced but in this boot of
    the machine (the page cache holds what the disk may not)."""
    return mark is None or (mark != "unknown" and mark == boot_id())


def sync_filesystem(path: Path) -> None:
    """Make every file written under ``path``'s file system durable in one call (Linux ``syncfs``; else
    ``sync``): a shard of many small files is committed without an fsync each."""
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = _libc()
        if libc is None or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    import ctypes

    try:  # (the process's own symbols, the C library's among them: ctypes.util's search cost 7-9 ms)
        lib = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return lib if hasattr(lib, "syncfs") else None


def fsync_dir(path: Path, final: bool = False) -> None:
    """Make the names in ``path`` durable (after renames into it), where the run syncs as it goes; ``final``
    (the dataset renamed into place): unless it never syncs."""
    if _SYNC[0] == "off" or (_SYNC[0] == "end" and not final):
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - a system without directory descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - a file system that cannot sync a folder
        pass
    finally:
        os.close(fd)


def partial_name(path: Path) -> Path:
    """The temporary name ``path`` is written under: ``NAME.<pid>-<random>.partial``, one a writer, so that
    two writers of one shard (a task retried while the first attempt still runs on a node cut off from
    the cluster) never write into the same file; the last rename wins, with the same bytes. What a
    killed writer leaves is swept before a dataset is finalized (:func:`sweep_partials`)."""
    return path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}{PARTIAL}")


def sweep_partials(root: Path) -> int:
    """Remove the temporary files killed writers left under ``root``: how many."""
    n = 0
    for p in Path(root).rglob(f"*{PARTIAL}"):
        if p.is_file():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
    return n


def remove_tree(path: Path) -> None:
    """Remove the folder ``path`` as one step: renamed away first (then deleted), so that a kill leaves it
    whole or gone, never a part of it (a run's journal with some of its entries: a resume would write
    those shards again into a finalized dataset)."""
    path = Path(path)
    gone = partial_name(path)
    try:
        os.rename(path, gone)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
    shutil.rmtree(gone, ignore_errors=True)

#: a file's bytes whose writing to disk :class:`ShardFile` starts as it goes (see :func:`start_writeback`)
WRITEBACK_BYTES = 8 << 20
#: a part :meth:`ShardFile.write_parts` writes on its own, not copied into a joined buffer
OWN_WRITE = 1 << 16

_SYNC_RANGE: list[Any] = []  # libc's sync_file_range, or None where there is none (looked up once)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing ``length`` bytes of ``fd`` from ``offset`` to disk, without waiting
    (Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; nothing elsewhere). The commit's fsync then has
    little left to wait for, and the writer is not throttled for a pile of dirty pages: 24 files of 64 MiB,
    each fsynced, on the 2-core CI machine: 1.80-3.29 s written as they came, 1.28-1.33 s with writeback
    started every 8 MiB (their fsyncs 0.83-0.85 s and 0.24-0.25 s; ``benchmarks/writeback.py``)."""
    if not _SYNC_RANGE:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _SYNC_RANGE.append(fn)
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            _SYNC_RANGE.append(None)
    fn = _SYNC_RANGE[0]
    if fn is not None and _SYNC[0] != "off":
        fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE (a failure only leaves the work to fsync)


class ShardFile:
    """One file written under ``name.partial`` and digested as it is written (CRC-32C of its bytes), its
    writeback to disk started every :data:`WRITEBACK_BYTES`; :meth:`commit` makes it ``name``."""

    def __init__(self, folder: Path, name: str):
        self.path = Path(folder) / name
        self.tmp = partial_name(self.path)
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit or abort
        self.crc = 0
        self.size = 0
        self._written_back = 0  # bytes whose writeback was started

    def write(self, data: Any) -> None:
        self.f.write(data)
        self.crc = crc32c(data, self.crc)
        self.size += memoryview(data).nbytes
        if self.size - self._written_back >= WRITEBACK_BYTES:
            self.f.flush()
            start_writeback(self.f.fileno(), self._written_back, self.size - self._written_back)
            self._written_back = self.size

    def write_parts(self, parts: list[Any]) -> None:
        """Write ``parts`` (bytes-like) one after the other: the small ones joined into one write, a large
        one (:data:`OWN_WRITE` bytes and more) written on its own, not copied."""
        run: list[Any] = []
        for p in parts:
            if len(p) >= OWN_WRITE:
                if run:
                    self.write(b"".join(run))
                    run = []
                self.write(p)
            else:
                run.append(p)
        if run:
            self.write(b"".join(run))

    def commit(self) -> tuple[str, list]:
        """Flush, fsync (:func:`durable`) and rename into place: (the file's name, [bytes, digest])."""
        if _SYNC[0] == "end":  # (its tail's writeback started too: the run's one sync at its end finds it done)
            self.f.flush()
            start_writeback(self.f.fileno(), self._written_back, 0)
        durable(self.f)
        self.f.close()
        os.replace(self.tmp, self.path)
        return self.path.name, [self.size, crc_text(self.crc)]

    def abort(self) -> None:
        if not self.f.closed:
            self.f.close()
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass


def crc_text(crc: int) -> str:
    return f"crc32c:{crc:08x}"


def stream_digest(f: Any, chunk: int = 1 << 20, done: Any = None) -> list:
    """[bytes, digest] of what a binary file object gives from where it stands to its end, as :class:`ShardFile`
    gives them; ``done(n)`` hears of each ``n`` bytes read."""
    crc, size = 0, 0
    while data := f.read(chunk):
        crc = crc32c(data, crc)
        size += len(data)
        if done is not None:
            done(len(data))
    return [size, crc_text(crc)]


def file_digest(path: Path) -> list:
    """[bytes, digest] of a file (one a library wrote by its path), as :class:`ShardFile` gives them."""
    with open(path, "rb") as f:
        return stream_digest(f)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` at ``path`` in place, fsynced where the run syncs as it goes (:func:`durable`): a
    dataset-wide file that finalize writes into the staging folder, renamed into place whole with it."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        durable(f)


def write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` as JSON at ``path``: to a temporary name, fsynced (:func:`durable`), then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_name(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, sort_keys=True))  # (one write: json.dump writes each token on its own)
        durable(f)
    os.replace(tmp, path)


#: a staging folder's note of the shards whose files a finalize begun during the run has moved out of them (the
#: folder format's: ``formats.folder.FolderFinalize``), one shard index a line, under the run's own folder
MOVED = ".gpubatch/moved"


def note_moved(stage: Path, index: int) -> None:
    """Note, before its files are moved to their names, that shard ``index``'s files leave the places its journal
    entry names: a resume takes the shard as committed without finding them there (:func:`moved_shards`), and its
    finalize finds each file at its name or where it was. Appended in one write, not synced: lost, the shard
    runs again, to the same files."""
    fd = os.open(Path(stage) / MOVED, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{index}\n".encode())
    finally:
        os.close(fd)


def moved_shards(stage: Path) -> set[int]:
    """The shards :func:`note_moved` noted in ``stage`` (whole lines only: a write cut short names none)."""
    try:
        text = (Path(stage) / MOVED).read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    return {int(line) for line in text.split("\n")[:-1] if line.isdigit()}


def crc32c(data: Any, crc: int = 0) -> int:
    """The ``crc32c`` package's CRC-32C of ``data`` continued from ``crc``, the package imported at the first call
    (its import takes 20-25 ms, mostly ``importlib.metadata``: a command that digests nothing, a pass-through's
    own process, never pays it)."""
    if not _CRC:
        from crc32c import crc32c as real

        _CRC.append(real)
    return _CRC[0](data, crc)


_CRC: list[Any] = []  # (the package's function, once imported)
