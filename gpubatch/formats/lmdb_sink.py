"""How a run writes an LMDB: by its workers, one transaction a shard, in shard order.

An LMDB is one B-tree in one file, written by one writer at a time. A worker holds its shard's Datums in
memory as it makes them (past :data:`HOLD` bytes, it frames them into a spool file: ``<IQ`` lengths, the
record's key, the Datum). At the shard's commit, under the database's lock (``.gpubatch/lmdb/turn.lock``),
the shard whose turn it is (every shard before it is in the database) goes in as one transaction,
followed by the spools of the shards after it that came early and wait; a shard that comes before its
turn waits for it in memory for a while (:data:`TURN_WAIT_S`; its worker goes on with its next shard),
then, if its turn has not come, is fsynced and renamed as a spool and waits there. The lock is held for the copies alone: the pages
a transaction will take are faulted in before it (:func:`prefault`), and the database is synced after
it (:meth:`Turn.sync`), each worker its own, before its commit ends. A record's key (``%08d_<key>``)
takes its index from the records in the database before it. The same transactions in the same order
whichever worker makes them: the same file for any number of workers. The database's own count of
records, checked against ``state.json`` whenever the lock is taken, tells a transaction that went in
before a kill could note it, or one the machine lost before it was synced. Under ``--sync end|off`` no
turn is synced: ``state.json`` then names the machine's boot, and a database left so in another boot
(its pages lost in any order) is refused, to be started over.

Runs whose workers share a staging folder across machines (``--executor ray``, ``--num-parts``) leave
every shard in its spool (an LMDB must not be written from several machines); ``finalize`` puts in
whatever still waits, in order, and moves the file into place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._commit import durable, fsync_dir, partial_name, syncing, trusted, unsynced_mark, write_json
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
#: a shard's Datums are held in memory up to this many bytes of records, and spooled past it (or where the shard
#: must wait for its turn): most shards go into the database from memory, written once
HOLD = 32 << 20
#: the turns ``state.json`` keeps (shard, records before it): as far back as a database that lost its last
#: transactions with the machine may go (one a worker at most is not synced yet)
HISTORY = 256
#: as far as 10^8 records keys are appended (full pages, no search): their 8 digits sort in record order
APPEND_UNTIL = 10**8
#: how long a shard that comes before its turn waits for it, outside the lock (its worker going on with its
#: next shard meanwhile), before it is spooled instead: twice the time the shard took to make, within these
#: bounds (seconds). Spooled, it is written to disk and read back under the lock by the worker whose turn
#: it is, and two workers once out of step stay so: a pass-through of 16,384 JPEGs on the 2-core CI machine
#: (``--sync off``) spooled 39-41 of its 64 shards and took 2.33-2.38 s in such runs, against 1.8-1.9 s in step
#: (RESULTS.md, 2026-12-05)
TURN_WAIT_S = (0.5, 30.0)

_ENVS: dict[tuple[int, str], Any] = {}  # this process's open databases (an LMDB is opened once a process)
_BUFFER: dict[int, memoryview] = {}  # this process's buffer for prefault's reads


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
        # sync=False: a commit does not sync; the database is synced once a turn, after its lock (Turn.sync)
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


def prefault(root: Path, index: int, nbytes: int, records: int) -> None:
    """Before shard ``index`` waits for the database's lock: the file's pages its records are likely to take
    (after the database's last page, and after a shard ahead of it still going in) read once, outside the
    lock. They are holes, so reading them puts pages of zeros in the page cache, clean; the transaction then
    copies its records into pages that are there. Its page faults had been most of a transaction's time,
    every other worker waiting for the lock (``benchmarks/lmdb_lock.py`` measures that time). Nothing is
    written: the file is the same, and a guess that misses costs only time."""
    folder = _folder(root)
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        ahead = index - int(state["next"])
        if not trusted(state.get("unsynced")):  # (the turn refuses it, in one line)
            return
    except FileNotFoundError:
        ahead = index
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if not 0 <= ahead <= 1:  # (in already, or bound to wait in its spool for shards not yet made)
        return
    if not (folder / "db" / "data.mdb").is_file():  # (a database is made under its lock, not beside it)
        return
    env = _env(folder / "db")
    psize = env.stat()["psize"]
    guess = nbytes + records * psize + (64 << 10)  # (each record's pages rounded up; its keys)
    slack = guess // 8
    start = max(0, (env.info()["last_pgno"] + 1) * psize + ahead * guess - slack) // psize * psize
    end = min(start + guess + 2 * slack, env.info()["map_size"])
    buf = _BUFFER.get(os.getpid())
    if buf is None:
        buf = _BUFFER[os.getpid()] = memoryview(bytearray(1 << 20))
    try:
        fd = os.open(folder / "db" / "data.mdb", os.O_RDONLY)
    except OSError:
        return
    try:
        while start < end and os.preadv(fd, [buf[: min(len(buf), end - start)]], start) > 0:
            start += len(buf)
    except OSError:
        pass
    finally:
        os.close(fd)


def transaction_bytes(items: list[tuple[bytes, Any]], psize: int) -> int:
    """At most the bytes of new pages a transaction of ``items`` (key, Datum) appends to the file: a value too
    large for a node in a leaf page takes overflow pages of its own (LMDB's ``OVPAGES``), a smaller one its
    node in a leaf; 1 MiB more for the branch pages, the meta page and the free list."""
    nodemax = ((psize - 16) // 2 & -2) - 2  # (LMDB's largest node in a page: ``me_nodemax``)
    need = 1 << 20
    for k, v in items:
        node = 8 + len(k) + len(v)
        need += ((len(v) + 15) // psize + 1) * psize + len(k) + 18 if node > nodemax else node + 2
    return need


def room(db: Path, items: list[tuple[bytes, Any]], psize: int) -> None:
    """Raise ENOSPC, as a write would, where the file system under ``db`` has no room for the pages a
    transaction of ``items`` (key, Datum) takes. The database is written in its file's map: a page the disk has no
    block for is not a write error there but a bus error that kills the process (SIGBUS), the transaction
    half made. Asked before each transaction, under the database's lock; another program filling the disk
    meanwhile still ends the run that way (the run then names the signal and this cause)."""
    need = transaction_bytes(items, psize)
    try:
        st = os.statvfs(db if db.exists() else db.parent)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device: the LMDB's next {len(items):,} records need "
                      f"{need / 2**20:,.1f} MiB, {free / 2**20:,.1f} MiB are free", str(db / "data.mdb"))


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
    """The database while this process holds its lock: which shard goes in next, the records in it.

    Its transactions are not synced under the lock: :func:`turn` syncs the database once the lock is
    released (the next worker's transaction goes in meanwhile), and only then removes the spools put in
    (:attr:`drained`); the shard's commit, and its journal entry, come after that sync. ``state.json``
    keeps the last :data:`HISTORY` turns (shard, records before it), so that a database that lost its
    last transactions with the machine (the state noted them, the sync had not ended) goes back to the
    turn it holds: those shards' journal entries were never written (their spools are still there)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.db = _folder(root) / "db"
        self.state_file = _folder(root) / "state.json"
        self.dirty = False  # a transaction went in: the database is synced when the lock is released
        self.drained: list[Path] = []  # spools put in, removed once the database is synced
        self.times: dict[str, float] = {}  # (turn's: how long this process waited for the lock, held it, synced)
        self.noting = 0.0  # the seconds ``state.json`` took to write under the lock (:meth:`_advance`)
        self.history: list[list[int]] = []
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
            self.next, self.count = int(state["next"]), int(state["count"])
            self.history = [[int(n), int(c)] for n, c in state.get("history", [])]
            was = state.get("unsynced")
        except FileNotFoundError:
            self.next, self.count, was = 0, 0, None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise GpubatchError(f"{self.state_file} is damaged ({e}): pass --overwrite to start over") from None
        if not trusted(was):  # (its pages may be lost in any order: no turn of it can be taken as it is)
            raise GpubatchError(f"the LMDB being written in {self.db} was not synced (--sync end or off) and the "
                                "machine restarted since: pass --overwrite to start over")
        #: what state.json notes of this process's transactions where they are not synced: the machine's boot
        #: (once a turn not synced went in, the state says so until the database is finished)
        self.unsynced = unsynced_mark() or ({"unsynced": was} if was else {})
        self.env = _env(self.db)
        entries = self.env.stat()["entries"]
        if entries > self.count:  # shard `next` went in, and the run was stopped before it could note it
            self.drained.append(spool_of(root, self.next))
            self.dirty = True
            self._advance(entries - self.count)
        elif entries < self.count:  # the machine was lost before the last transactions were synced
            back = [h for h in self.history if h[1] == entries]
            if not back:
                raise GpubatchError(f"the LMDB being written in {self.db} holds {entries:,} records, its shards "
                                    f"{self.count:,}: pass --overwrite to start over")
            self.next, self.count = back[-1]
            self.history = self.history[: self.history.index(back[-1]) + 1]
            write_json(self.state_file, self._state())

    def _state(self) -> dict[str, Any]:
        return {"next": self.next, "count": self.count, "history": self.history[-HISTORY:], **self.unsynced}

    def _advance(self, records: int) -> None:
        t = time.perf_counter()
        self.history.append([self.next, self.count])
        self.next, self.count = self.next + 1, self.count + records
        write_json(self.state_file, self._state())
        self.noting += time.perf_counter() - t

    def put(self, spool: Path | None, held: list | None = None) -> None:
        """The next shard's records (its spool, then ``held``: (key, Datum) pairs) in one transaction (not
        synced: :func:`turn` syncs it); its turn passed on."""
        mapped, frames = _frames(spool) if spool is not None else (None, [])
        frames = frames + held if held else frames
        try:
            if frames:  # (a shard without records makes no transaction: none to find again after a kill)
                lmdb = _lmdb()
                items = [(datum_key(self.count + i, k.decode("utf-8", "surrogateescape")), v)
                         for i, (k, v) in enumerate(frames)]
                room(self.db, items, self.env.stat()["psize"])
                while True:
                    try:
                        with self.env.begin(write=True) as txn:
                            if self.count + len(items) <= APPEND_UNTIL:
                                added = txn.cursor().putmulti(items, dupdata=False, overwrite=True, append=True)[1]
                            else:
                                added = sum(bool(txn.put(k, v, overwrite=True)) for k, v in items)
                            if added != len(items):
                                raise lmdb.Error(f"{len(items) - added} keys written twice")
                        self.dirty = True
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
            self.drained.append(spool)

    def sync(self) -> None:
        """The database synced (where a transaction went in, and the run syncs as it goes), then the spools
        put in removed."""
        if self.dirty:
            if syncing():
                self.env.sync(True)
            self.dirty = False
        for spool in self.drained:
            with contextlib.suppress(FileNotFoundError):
                spool.unlink()
        self.drained = []


@contextlib.contextmanager
def turn(root: Path) -> Iterator[Turn]:
    """The database's lock, held for the block (every process that writes it takes it); the database
    synced once it is released (:meth:`Turn.sync`), unless the block raised."""
    import fcntl

    folder = _folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "turn.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        asked = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = time.perf_counter()
        t = Turn(root)
        yield t
    finally:
        os.close(fd)
    released = time.perf_counter()
    t.sync()
    t.times = {"lmdb: waiting for the lock": held - asked, "lmdb: holding the lock": released - held,
               "lmdb: holding the lock: state.json": t.noting,
               "lmdb: sync": time.perf_counter() - released}


class LmdbSink(ShardSink):
    """A shard of an LMDB: its records' Datums held as written (spooled past :data:`HOLD` bytes), put into
    the database at commit when its turn has come, or spooled to wait for it (see the module's docstring)."""

    def __init__(self, root: Path, task: Any, info: DatasetInfo, options: Any):
        super().__init__(root, task, info, options)
        #: whether this worker writes the database (False where the staging folder is shared across machines)
        self.direct = not (getattr(options, "extra", None) or {}).get("shared_stage")
        self.path = spool_of(root, task.index)
        self.tmp = partial_name(self.path)
        self.held: list[tuple[bytes, bytes]] = []  # (key, Datum): the records not spooled
        self.held_bytes = 0
        self.f: Any = None  # the spool, opened where the held records pass HOLD bytes
        self.started = time.perf_counter()  # (how long a shard waits for its turn: TURN_WAIT_S)

    def _spool(self) -> Any:
        """The spool (opened at the first call), the records held so far written into it."""
        if self.f is None:
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit or abort
        for key, datum in self.held:
            self.f.write(_FRAME.pack(len(key), len(datum)) + key)
            self.f.write(datum)
        self.held, self.held_bytes = [], 0
        return self.f

    def write(self, record: Record) -> None:
        key = record.key.encode("utf-8", "surrogateescape")
        data = record.data
        head, tail = datum_parts(len(data), -1 if record.label is None else int(record.label))
        if self.f is None and self.held_bytes + len(data) <= HOLD:
            self.held.append((key, b"".join((head, data, tail))))
            self.held_bytes += len(data)
        else:
            f = self._spool()
            f.write(_FRAME.pack(len(key), len(head) + len(data) + len(tail)) + key + head)
            f.write(data)
            f.write(tail)
        self.count += 1
        self.bytes += len(data)

    def _await_turn(self) -> float:
        """Wait, outside the lock, for the shards before this one to go in (``state.json``'s next shard, read
        as it changes), at most :data:`TURN_WAIT_S` says: the seconds waited."""
        t0 = time.perf_counter()
        limit = min(TURN_WAIT_S[1], max(TURN_WAIT_S[0], 2 * (t0 - self.started)))
        state, pause = _folder(self.root) / "state.json", 0.001
        while time.perf_counter() - t0 < limit:
            try:
                nxt = int(json.loads(state.read_text(encoding="utf-8"))["next"])
            except FileNotFoundError:
                nxt = 0
            except (OSError, ValueError, KeyError, TypeError):  # (the turn says what is wrong, in one line)
                break
            if nxt >= self.task.index:
                break
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        return time.perf_counter() - t0

    def _keep(self) -> None:
        """The spool made durable under its name, to wait for its turn."""
        f = self._spool()
        durable(f)
        f.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)

    def commit(self) -> tuple[dict[str, list], dict[str, Any]]:
        if not self.direct:
            self._keep()
            return {}, {}
        if self.f is not None:
            self.f.flush()
        t0 = time.perf_counter()
        prefault(self.root, self.task.index, self.bytes, self.count)
        prefaulted = time.perf_counter() - t0
        waited = self._await_turn()
        with turn(self.root) as t:
            if t.next == self.task.index:
                t.put(self.tmp if self.f is not None else None, self.held)
                self.abort()
                t.drain()
            elif t.next > self.task.index:  # in the database already (a shard run again after a kill)
                self.abort()
            else:
                self._keep()
        self.timings = {"lmdb: prefault": prefaulted, "lmdb: waiting for its turn": waited, **t.times}
        return {}, {}

    def abort(self) -> None:
        self.held, self.held_bytes = [], 0
        if self.f is not None:
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
            t.sync()
            _close_env(db)
        data = db / "data.mdb"
        need = needed_bytes(data)
        with open(data, "r+b") as f:  # (the map's length: cut to the last page, which is all a reader reads)
            f.truncate(need)
            durable(f)
        os.replace(data, root / "data.mdb")
        fsync_dir(root)
    shutil.rmtree(_folder(root), ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / RUN_DIR).rmdir()  # (gone where nothing else of a run is in it)
    return []
