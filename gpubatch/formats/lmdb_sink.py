"""How a run writes an LMDB: by its workers, a shard's pages at a time, in shard order.

An LMDB is one B-tree in one file. gpubatch makes its pages itself (:mod:`.lmdb_write`) and writes them with plain
writes, as a tar shard is written: no transaction of the LMDB library, no map. A worker holds its shard's Datums in
memory as it makes them (past :data:`HOLD` bytes, it frames them into a spool file: ``<IQ`` lengths, the record's key,
the Datum). At the shard's commit, under the database's lock (``.gpubatch/lmdb/turn.lock``), the shard whose turn it
is (every shard before it has its pages) takes the page range its records need from the file's next free page, writes
its pages there and notes the turn in the log of turns (``turns``), followed by the spools of the shards after it
that came early and wait; a shard that comes before its turn waits for it in memory for a while (:data:`TURN_WAIT_S`;
its worker goes on with its next shard), then, if its turn has not come, is fsynced and renamed as a spool and waits there. The file is
synced after the lock is released, each worker its own pages and the log, before its commit ends. A record's key
(``%08d_<key>``) takes its index from the records before it, and a shard's first leaf page is its own: the same pages
at the same places whichever worker writes a shard, so the same file for any number of workers, and a shard run again
(after a kill) writes the same pages where its turn placed them. A spool is removed only once its pages are
synced: a spool found for a shard already placed is written again at its place. The finalize step writes the branch
pages over every shard's leaves (``leaves/NNNNNN.json``, each shard's, written with its pages) and the meta pages.
Under ``--sync end|off`` no turn is synced: the file ``unsynced`` beside the log then names the machine's boot, and a
database left so in another boot (its pages lost in any order) is refused, to be started over.

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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._commit import durable, fsync_dir, partial_name, syncing, trusted, unsynced_mark, write_json
from ..errors import GpubatchError
from ..types import DatasetInfo, Record
from .lmdb_datum import datum_key, datum_parts
from .lmdb_write import FIRST_PAGE, PS, shard_pages, tree_pages
from .sinks import RUN_DIR, ShardSink

#: a spool's frame before each record: the lengths of its key and of its Datum
_FRAME = struct.Struct("<IQ")
#: a shard's Datums are held in memory up to this many bytes of records, and spooled past it (or where the shard
#: must wait for its turn): most shards go into the database from memory, written once
HOLD = 32 << 20
#: a shard's note in the log of turns (``turns``), one a shard in shard order: the shard, the records before it, its
#: first page, its records, its pages (so shard k's note lies at ``k * _TURN.size``, and the next shard's turn is
#: the log's size over it)
_TURN = struct.Struct("<QQQQQ")
#: how long a shard that comes before its turn waits for it, outside the lock (its worker going on with its
#: next shard meanwhile), before it is spooled instead: twice the time the shard took to make, within these
#: bounds (seconds). Spooled, it is written to disk and read back under the lock by the worker whose turn
#: it is, and two workers once out of step stay so: a pass-through of 16,384 JPEGs on the 2-core CI machine
#: (``--sync off``) spooled 39-41 of its 64 shards and took 2.33-2.38 s in such runs, against 1.8-1.9 s in step
#: (RESULTS.md, 2026-12-05)
TURN_WAIT_S = (0.5, 30.0)


def _folder(root: Path) -> Path:
    return Path(root) / RUN_DIR / "lmdb"


def spool_of(root: Path, index: int) -> Path:
    """Where shard ``index`` waits for its turn."""
    return _folder(root) / "spool" / f"{index:06d}.datums"


def leaves_of(root: Path, index: int) -> Path:
    """Where shard ``index``'s leaves (page, first key) and counts lie, for the finalize step's branch pages."""
    return _folder(root) / "leaves" / f"{index:06d}.json"


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


def _pwrite_all(fd: int, buffers: list[Any], offset: int) -> None:
    """``buffers`` written one after the other at ``offset`` (``pwritev`` a few at a time, short writes resumed)."""
    batch: list[Any] = []
    for b in buffers:
        batch.append(b)
        if len(batch) == 64:
            offset = _pwritev(fd, batch, offset)
            batch = []
    if batch:
        _pwritev(fd, batch, offset)


def _pwritev(fd: int, batch: list[Any], offset: int) -> int:
    views = [memoryview(b).cast("B") for b in batch]
    while views:
        n = os.pwritev(fd, views, offset)
        offset += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
    return offset


class Turn:
    """The database while this process holds its lock: which shard's pages go next, where, and the records before.

    A shard's pages are written under the lock and its turn noted in the log of turns, neither synced there:
    :func:`turn` syncs the file and the log once the lock is released (the next worker's pages go in meanwhile), and
    only then removes the spools written (:attr:`drained`); the shard's commit, and its journal entry, come after
    that sync. The log keeps every turn
    (shard, records before it, its first page, its records, its pages), so that a shard run again (its journal entry
    never written: its pages may not have reached the disk) is written again where its pages lie, and a spool still
    there for a shard already placed (the sync not ended) is written again at its place."""

    def __init__(self, root: Path):
        self.root = Path(root)
        folder = _folder(root)
        self.db = folder / "db"
        self.log = folder / "turns"
        self.fd: int | None = None  # the database's file, opened at the first write
        self.dirty = False  # pages were written: the file is synced when the lock is released
        self.appended = False  # turns were noted: the log is synced with the file
        self.drained: list[Path] = []  # spools written, removed once the file is synced
        self.held: list[int] = []  # locks on those spools (their files' descriptors), let go once they are removed
        self.times: dict[str, float] = {}  # (turn's: how long this process waited for the lock, held it, synced)
        self.noting = 0.0  # the seconds the turns' notes took under the lock (:meth:`_advance`)
        if (folder / "state.json").exists():
            raise GpubatchError(f"the LMDB being written in {self.db} was begun by an older gpubatch: pass --overwrite "
                                "to start over")
        self.log_fd = os.open(self.log, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(self.log_fd).st_size
            if size % _TURN.size:  # (a note cut short by a kill or a lost machine: its shard was never journaled)
                os.ftruncate(self.log_fd, size - size % _TURN.size)
            self.next, self.count, self.page = size // _TURN.size, 0, FIRST_PAGE
            if self.next:
                _, count, page, records, pages = self._line(self.next - 1)
                self.count, self.page = count + records, page + pages
            mark = folder / "unsynced"
            was = mark.read_text(encoding="utf-8").strip() if mark.exists() else None
            if not trusted(was):  # (its pages may be lost in any order: no turn of it can be taken as it is)
                raise GpubatchError(f"the LMDB being written in {self.db} was not synced (--sync end or off) and "
                                    "the machine restarted since: pass --overwrite to start over")
            if was is None and unsynced_mark():  # (noted once, before the first turn not synced, until the end)
                with open(mark, "w", encoding="utf-8") as f:
                    f.write(unsynced_mark()["unsynced"])
                    f.flush()
                    os.fsync(f.fileno())
                fsync_dir(folder, final=True)
            # a spool is removed once its pages are synced, its turn's process holding a lock on it until then: one
            # still there and not held, for a shard placed already, is a turn that ended before (its process killed,
            # the machine lost): its pages are written again here (the same pages at the same place)
            spools = spool_of(root, 0).parent
            for spool in sorted(spools.glob("*.datums")) if spools.is_dir() else []:
                index = int(spool.stem)
                if index < self.next and self._hold(spool, wait=False):
                    self._write(spool, None, index, *self.placed(index))
                    self.drained.append(spool)
        except BaseException:
            self.close()
            raise

    def _line(self, index: int) -> tuple[int, int, int, int, int]:
        """The log's note of shard ``index``'s turn: (shard, records before it, its first page, its records, its
        pages)."""
        line = _TURN.unpack(os.pread(self.log_fd, _TURN.size, index * _TURN.size))
        if line[0] != index:
            raise GpubatchError(f"{self.log} is damaged (its note {index} names shard {line[0]}): pass --overwrite "
                                "to start over")
        return line

    def placed(self, index: int) -> tuple[int, int] | None:
        """(records before it, its first page) of shard ``index``, where its turn placed it (None: not yet)."""
        return self._line(index)[1:3] if index < self.next else None

    def _write(self, spool: Path | None, held: list | None, index: int, count: int, page: int) -> dict:
        """Shard ``index``'s records (its spool, then ``held``: (key, Datum) pairs) written as pages from ``page`` (a
        full disk: ENOSPC, the run's write error), its keys numbered from ``count``; its leaves noted; its counts."""
        mapped, frames = _frames(spool) if spool is not None else (None, [])
        frames = frames + held if held else frames
        try:
            items = [(datum_key(count + i, k.decode("utf-8", "surrogateescape")), v) for i, (k, v) in enumerate(frames)]
            buffers, leaves, counts = shard_pages(items, page)
            if buffers:
                if self.fd is None:
                    self.db.mkdir(parents=True, exist_ok=True)
                    self.fd = os.open(self.db / "data.mdb", os.O_RDWR | os.O_CREAT, 0o644)
                _pwrite_all(self.fd, buffers, page * PS)
                self.dirty = True
            del items, buffers
        finally:
            n = len(frames)
            del frames
            if mapped is not None:
                mapped[1].release()
                mapped[0].close()
        counts["entries"] = n
        write_json(leaves_of(self.root, index), {"leaves": [[p, k.hex()] for p, k in leaves], **counts})
        return counts

    def _advance(self, records: int, pages: int) -> None:
        """The turn passed on: the shard placed noted in the log of turns (appended, not synced: :meth:`sync` syncs it
        with the pages, before the shard's commit ends). Written under the lock, a JSON state replaced and fsynced
        each turn took 0.12 s of the 1.69 s the lock was held, in sum, in a pass-through of 16,384 JPEGs on the 2-core
        CI machine; noted so, the run went from 10,992 to 12,536 records/s on an H100 host's 16 cores and from 6,956
        to 7,313 on two, in turn (RESULTS.md, 2026-12-06 "21:58 to 22:41")."""
        t = time.perf_counter()
        line = _TURN.pack(self.next, self.count, self.page, records, pages)
        if os.write(self.log_fd, line) != len(line):
            raise OSError(f"{self.log}: a short write")
        self.appended = True
        self.next, self.count, self.page = self.next + 1, self.count + records, self.page + pages
        self.noting += time.perf_counter() - t

    def put(self, spool: Path | None, held: list | None = None) -> None:
        """The next shard's records (its spool, then ``held``) written as its pages at the file's next free page
        (not synced: :func:`turn` syncs them), its turn passed on. Under the lock: written beside the other workers'
        (after the lock, each its own) the run was slower, 7,862 records/s against 9,618 (16,384 JPEGs, the 2-core CI
        machine, 2026-12-05: a worker's sync then flushes the other's pages as they are written), and again on
        2026-12-06 with the turn noted in the log: 11,176 against 12,536 records/s on 16 cores, 6,560 against 7,313
        on two, in turn."""
        counts = self._write(spool, held, self.next, self.count, self.page)
        self._advance(counts["entries"], counts["pages"])

    def again(self, index: int, spool: Path | None, held: list | None) -> None:
        """A shard placed already (run again after a kill) written again where it lies (the same pages)."""
        self._write(spool, held, index, *self.placed(index))  # (called only for a shard placed: t.next > index)

    def _hold(self, spool: Path, wait: bool = True) -> bool:
        """A lock on ``spool`` (shared; ``wait=False``: exclusive, only where no process holds it), kept until its
        pages are synced and it is removed (:meth:`sync`); False where another process holds it, or it is gone."""
        import fcntl

        try:
            fd = os.open(spool, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # (its turn's process syncs it now, and removes it after)
            os.close(fd)
            return False
        self.held.append(fd)
        return True

    def drain(self) -> None:
        """The spools that wait, as long as the next shard's is there (a shard spooled was journaled as it was
        spooled: its spool is all that can write its pages again, so it is held until they are synced)."""
        while (spool := spool_of(self.root, self.next)).exists():
            self._hold(spool)
            self.put(spool)
            self.drained.append(spool)

    def sync(self) -> None:
        """The file and the log of turns synced where they were written (and the run syncs as it goes); then the
        spools written removed, and let go. A sync that fails lets them go unremoved: the shards placed are written
        again where they lie (:meth:`again`, or a spool not held)."""
        try:
            if self.fd is not None and self.dirty and syncing():
                os.fdatasync(self.fd)
            if self.appended and syncing():
                os.fdatasync(self.log_fd)
        except BaseException:
            self.close()
            raise
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.dirty = self.appended = False
        for spool in self.drained:
            with contextlib.suppress(FileNotFoundError):
                spool.unlink()
        self.drained = []
        self.close()

    def close(self) -> None:
        """The file, the log and the spools held let go (without a sync: a turn that failed, its spools left to be
        written again)."""
        for name in ("fd", "log_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        for fd in self.held:
            os.close(fd)
        self.held = []


@contextlib.contextmanager
def turn(root: Path) -> Iterator[Turn]:
    """The database's lock, held for the block (every process that writes it takes it); the file synced once
    it is released (:meth:`Turn.sync`), unless the block raised."""
    import fcntl

    folder = _folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "turn.lock", os.O_RDWR | os.O_CREAT, 0o644)
    t: Turn | None = None
    try:
        asked = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = time.perf_counter()
        t = Turn(root)
        yield t
    except BaseException:
        if t is not None:
            t.close()
        raise
    finally:
        os.close(fd)
    released = time.perf_counter()
    t.sync()
    t.times = {"lmdb: waiting for the lock": held - asked, "lmdb: holding the lock": released - held,
               "lmdb: holding the lock: noting the turn": t.noting,
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
        """Wait, outside the lock, for the shards before this one to be placed (the log of turns' size says the
        next shard), at most :data:`TURN_WAIT_S` says: the seconds waited."""
        t0 = time.perf_counter()
        limit = min(TURN_WAIT_S[1], max(TURN_WAIT_S[0], 2 * (t0 - self.started)))
        log, pause = _folder(self.root) / "turns", 0.001
        while time.perf_counter() - t0 < limit:
            try:
                nxt = os.stat(log).st_size // _TURN.size
            except FileNotFoundError:
                nxt = 0
            except OSError:  # (the turn says what is wrong, in one line)
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
        waited = self._await_turn()
        with turn(self.root) as t:
            if t.next == self.task.index:
                t.put(self.tmp if self.f is not None else None, self.held)
                self.abort()
                t.drain()
            elif t.next > self.task.index:  # placed already (a shard run again after a kill): the same pages again
                t.again(self.task.index, self.tmp if self.f is not None else None, self.held)
                self.abort()
            else:
                self._keep()
        self.timings = {"lmdb: waiting for its turn": waited, **t.times}
        return {}, {}

    def abort(self) -> None:
        self.held, self.held_bytes = [], 0
        if self.f is not None:
            if not self.f.closed:
                self.f.close()
            with contextlib.suppress(FileNotFoundError):
                self.tmp.unlink()


def finalize(root: Path, shards: list[Any]) -> list[str]:
    """Every shard that still waits written, in order; the branch pages over every shard's leaves and the meta pages
    written (:func:`~.lmdb_write.tree_pages`), the file synced and moved to ``root/data.mdb``."""
    root = Path(root)
    db = _folder(root) / "db"
    if (db / "data.mdb").exists() or not (root / "data.mdb").exists():  # (else a finalize killed after the move)
        with turn(root) as t:
            t.drain()
            if t.next < len(shards):
                raise GpubatchError(f"shard {shards[t.next].name} of the LMDB is neither in the database nor waiting "
                                    "in its spool: run the command again with --overwrite")
            leaves: list[tuple[int, bytes]] = []
            counts = {"leaf_pages": 0, "overflow_pages": 0, "entries": 0}
            for index in range(len(shards)):
                try:
                    doc = json.loads(leaves_of(root, index).read_text(encoding="utf-8"))
                    leaves += [(int(p), bytes.fromhex(k)) for p, k in doc["leaves"]]
                    for k in counts:
                        counts[k] += int(doc[k])
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise GpubatchError(f"the leaves of shard {shards[index].name} of the LMDB are lost ({e}): run the "
                                        "command again with --overwrite") from None
            branches, metas, pages = tree_pages(leaves, t.page, counts)
            db.mkdir(parents=True, exist_ok=True)
            with open(db / "data.mdb", "r+b" if (db / "data.mdb").exists() else "w+b") as f:
                _pwrite_all(f.fileno(), [branches], t.page * PS)
                _pwrite_all(f.fileno(), [metas], 0)
                f.truncate(pages * PS)
                durable(f)
        os.replace(db / "data.mdb", root / "data.mdb")
        fsync_dir(root)
    shutil.rmtree(_folder(root), ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / RUN_DIR).rmdir()  # (gone where nothing else of a run is in it)
    return []
