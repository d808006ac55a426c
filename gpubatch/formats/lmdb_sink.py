"""How a run writes an LMDB: by its workers, one transaction a shard, in shard order.

An LMDB is one B-tree in one file, written by one writer at a time. A worker frames its shard's Datums
into a spool file as it makes them (``<IQ`` lengths, the record's key, the Datum). At the shard's commit,
under the database's lock (``.gpubatch/lmdb/turn.lock``), the shard whose turn it is (every shard before
it is in the database) goes in as one transaction, synced, followed by the spools of the shards after it
that came early and wait; a shard that comes before its turn is fsynced and renamed as a spool and waits
there. A record's key (``%08d_<key>``) takes its index from the records in the database before it. The
same transactions in the same order whichever worker makes them: the same file for any number of
workers. The database's own count of records, checked against ``state.json`` whenever the lock is
taken, tells a transaction that went in before a kill could note it.

Runs whose workers share a staging folder across machines (``--executor ray``, ``--num-parts``) leave
every shard in its spool (an LMDB must not be written from several machines); ``finalize`` puts in
whatever still waits, in order, and moves the file into place.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._commit import WRITEBACK_BYTES, fsync_dir, partial_name, start_writeback, write_json
from ..errors import GpubatchError
from ..types import DatasetInfo, Record
from .lmdb_datum import _lmdb, datum_key, datum_parts, needed_bytes
from .sinks import RUN_DIR, ShardSink

#: a spool's frame before each record: the lengths of its key and of its Datum
_FRAME = struct.Struct("<IQ")
#: the map the database is first written with, doubled whenever a transaction finds it full (the file is
#: as long as its map while it is written, its blocks allocated as pages are written; finalize cuts it to
#: its last page). The map grows at the same records whoever writes them: the same file.
MAP_SIZE = 1 << 32
#: as far as 10^8 records keys are appended (full pages, no search): their 8 digits sort in record order
APPEND_UNTIL = 10**8

_ENVS: dict[tuple[int, str], Any] = {}  # this process's open databases (an LMDB is opened once a process)


def _parts(items: list, size: int = WRITEBACK_BYTES) -> Iterator[list]:
    """``items`` (key, value) in runs of about ``size`` bytes of values."""
    part, n = [], 0
    for kv in items:
        part.append(kv)
        n += len(kv[1])
        if n >= size:
            yield part
            part, n = [], 0
    if part:
        yield part


def _folder(root: Path) -> Path:
    return Path(root) / RUN_DIR / "lmdb"


def spool_of(root: Path, index: int) -> Path:
    """Where shard ``index`` waits for its turn."""
    return _folder(root) / "spool" / f"{index:06d}.datums"


def _env(db: Path) -> Any:
    key = (os.getpid(), str(db))
    env = _ENVS.get(key)
    if env is None:
        db.mkdir(parents=True, exist_ok=True)
        lmdb = _lmdb()
        # writemap: pages are written in the file's map, so what a page holds besides its records (LMDB leaves
        # the gap between a page's pointers and its nodes as it found it) comes from the file itself, the
        # same whichever process writes it (a process's own page buffers hold what it wrote before).
        # sync=False: a commit does not sync; each shard's transaction is synced once (Turn.put)
        try:
            env = lmdb.open(str(db), map_size=MAP_SIZE, subdir=True, writemap=True, max_dbs=0, sync=False,
                            metasync=False, readahead=False)
        except lmdb.Error as e:
            raise OSError(f"LMDB: {e}") from None
        _ENVS[key] = env
    return env


def _close_env(db: Path) -> None:
    env = _ENVS.pop((os.getpid(), str(db)), None)
    if env is not None:
        env.close()


def _frames(path: Path) -> tuple[Any, list[tuple[bytes, memoryview]]]:
    """A spool mapped, and its (key, Datum) pairs as views into the map (None and [] for an empty one)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return None, []
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    view, at, out = memoryview(m), 0, []
    while at < size:
        kn, vn = _FRAME.unpack_from(m, at)
        at += _FRAME.size
        out.append((bytes(view[at : at + kn]), view[at + kn : at + kn + vn]))
        at += kn + vn
    return (m, view), out


class Turn:
    """The database while this process holds its lock: which shard goes in next, the records in it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.db = _folder(root) / "db"
        self.state_file = _folder(root) / "state.json"
        self.env = _env(self.db)
        self._fd: int | None = None  # the database file, for its writeback (opened at the first)
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
            self.next, self.count = int(state["next"]), int(state["count"])
        except FileNotFoundError:
            self.next, self.count = 0, 0
        except (ValueError, KeyError, TypeError) as e:
            raise GpubatchError(f"{self.state_file} is damaged ({e}): pass --overwrite to start over") from None
        entries = self.env.stat()["entries"]
        if entries > self.count:  # shard `next` went in, and the run was stopped before it could note it
            spool = spool_of(root, self.next)
            self._advance(entries - self.count)
            with contextlib.suppress(FileNotFoundError):
                spool.unlink()
        elif entries < self.count:
            raise GpubatchError(f"the LMDB being written in {self.db} holds {entries:,} records, its shards "
                                f"{self.count:,}: pass --overwrite to start over")

    def _append(self, txn: Any, items: list) -> int:
        """``items`` appended in runs of about 8 MiB, the map's pages starting to the disk after each (the
        transaction's sync then waits for less): how many went in."""
        added = 0
        for part in _parts(items):
            added += txn.cursor().putmulti(part, dupdata=False, overwrite=True, append=True)[1]
            self._writeback()
        return added

    def _writeback(self) -> None:
        """Start writing the database's dirty pages to disk (the transaction's sync then waits for less)."""
        if self._fd is None:
            self._fd = os.open(self.db / "data.mdb", os.O_RDONLY)
        start_writeback(self._fd, 0, 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _advance(self, records: int) -> None:
        self.next, self.count = self.next + 1, self.count + records
        write_json(self.state_file, {"next": self.next, "count": self.count})

    def put(self, spool: Path) -> None:
        """The next shard's records (its spool) in one transaction, synced; its turn passed on."""
        mapped, frames = _frames(spool)
        try:
            if frames:  # (a shard without records makes no transaction: none to find again after a kill)
                lmdb = _lmdb()
                items = [(datum_key(self.count + i, k.decode("utf-8", "surrogateescape")), v)
                         for i, (k, v) in enumerate(frames)]
                while True:
                    try:
                        with self.env.begin(write=True) as txn:
                            if self.count + len(items) <= APPEND_UNTIL:
                                added = self._append(txn, items)
                            else:
                                added = sum(bool(txn.put(k, v, overwrite=True)) for k, v in items)
                            if added != len(items):
                                raise lmdb.Error(f"{len(items) - added} keys written twice")
                        self.env.sync(True)
                        break
                    except lmdb.MapFullError:  # (the transaction is undone: written again in a map twice as large)
                        self.env.set_mapsize(self.env.info()["map_size"] * 2)
                    except lmdb.MapResizedError:  # another process grew it: take its size
                        self.env.set_mapsize(0)
                    except lmdb.Error as e:  # a full disk, an I/O error: the run's write error, in one line
                        raise OSError(f"LMDB: {e}") from None
                del items
        finally:
            n = len(frames)
            del frames
            if mapped is not None:
                mapped[1].release()
                mapped[0].close()
        self._advance(n)

    def drain(self) -> None:
        """The spools that wait, as long as the next shard's is there."""
        while (spool := spool_of(self.root, self.next)).exists():
            self.put(spool)
            spool.unlink()


@contextlib.contextmanager
def turn(root: Path) -> Iterator[Turn]:
    """The database's lock, held for the block (every process that writes it takes it)."""
    import fcntl

    folder = _folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "turn.lock", os.O_RDWR | os.O_CREAT, 0o644)
    t = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        t = Turn(root)
        yield t
    finally:
        if t is not None:
            t.close()
        os.close(fd)


class LmdbSink(ShardSink):
    """A shard of an LMDB: its records' Datums spooled as written, put into the database at commit when
    its turn has come (see the module's docstring)."""

    def __init__(self, root: Path, task: Any, info: DatasetInfo, options: Any):
        super().__init__(root, task, info, options)
        #: whether this worker writes the database (False where the staging folder is shared across machines)
        self.direct = not (getattr(options, "extra", None) or {}).get("shared_stage")
        self.path = spool_of(root, task.index)
        self.tmp = partial_name(self.path)
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit or abort

    def write(self, record: Record) -> None:
        key = record.key.encode("utf-8", "surrogateescape")
        data = record.data
        head, tail = datum_parts(len(data), -1 if record.label is None else int(record.label))  # (no copy of data)
        self.f.write(_FRAME.pack(len(key), len(head) + len(data) + len(tail)) + key + head)
        self.f.write(data)
        self.f.write(tail)
        self.count += 1
        self.bytes += len(data)

    def _keep(self) -> None:
        """The spool made durable under its name, to wait for its turn."""
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)

    def commit(self) -> tuple[dict[str, list], dict[str, Any]]:
        self.f.flush()
        if not self.direct:
            self._keep()
            return {}, {}
        with turn(self.root) as t:
            if t.next == self.task.index:
                t.put(self.tmp)
                self.abort()
                t.drain()
            elif t.next > self.task.index:  # in the database already (a shard run again after a kill)
                self.abort()
            else:
                self._keep()
        return {}, {}

    def abort(self) -> None:
        if not self.f.closed:
            self.f.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


def finalize(root: Path, shards: list[Any]) -> list[str]:
    """Every shard that still waits put in, in order; the database moved to ``root/data.mdb``."""
    root = Path(root)
    db = _folder(root) / "db"
    if (db / "data.mdb").exists() or not (root / "data.mdb").exists():  # (else a finalize killed after the move)
        with turn(root) as t:
            t.drain()
            if t.next < len(shards):
                raise GpubatchError(f"shard {shards[t.next].name} of the LMDB is neither in the database nor waiting "
                                    "in its spool: run the command again with --overwrite")
            t.env.sync(True)
            _close_env(db)
        data = db / "data.mdb"
        need = needed_bytes(data)
        with open(data, "r+b") as f:  # (the map's length: cut to the last page, which is all a reader reads)
            f.truncate(need)
            os.fsync(f.fileno())
        os.replace(data, root / "data.mdb")
        fsync_dir(root)
    shutil.rmtree(_folder(root), ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / RUN_DIR).rmdir()  # (gone where nothing else of a run is in it)
    return []
