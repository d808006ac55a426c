"""Feeding the GPU process from worker processes: file reads, JPEG headers and parameter draws.

nvImageCodec's decode calls take the GIL back once per image while they run, so any Python thread
busy in the same process slows them several-fold (one CPU-bound thread cut a routed decode that
runs at about 16,000 images/s alone to 641 images/s at a 1 ms switch interval;
the decode study (docs/engine.md), group "gil", and benchmarks/RESULTS.md). So the
host work that is Python (reading files or dataset records, parsing JPEG headers, drawing each
record's random parameters) runs here, in worker processes, and the process that drives the GPU
decodes straight out of shared memory and launches.

Each worker reads a whole batch into its slot of a shared-memory ring (files with ``readinto``: one
copy), parses each JPEG's frame header and EXIF orientation to know the decoded size, and draws the
record's parameters from (seed, key, size): exactly what the GPU process would draw, so outputs do
not change. A record whose decoded size differs from its header's is drawn again after decode.
:class:`FileFeed` serves :meth:`~gpubatch.pipelines.image.ImagePipeline.iterate_files`,
:class:`RecordFeed` the GPU path of ``convert`` and ``augment`` (:mod:`gpubatch.engine.gpu.images`).
"""

from __future__ import annotations

import os
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ...types import Record
from ..plan import Plan
from ..processes import die_with_parent, shm_free, started_pool, unlink_semaphores
from ..run import Job, RecordSource, outputs_of, read_counted, read_row
from .slot_views import SlotViews

SLOT_BYTES = 64 << 20  # one batch's encoded bytes by default (Settings.feed_slot_bytes); more comes back pickled
_W: dict[str, Any] = {}


def preload() -> None:
    """What a reader runs, imported before its run comes (a reader its worker's boot started: :mod:`.feed_start`)."""
    from ...errors import RunStats  # noqa: F401 - (imported now, used by the reads)
    from .. import windows  # noqa: F401
    from ..codecs import headers  # noqa: F401


@dataclass
class FedBatch:
    """One batch from a :class:`FileFeed`.

    Attributes:
        blobs: the encoded bytes of each file (b"" where it could not be read).
        keys: record keys.
        sizes: per record the (height, width) its header says it decodes to, or None.
        params: per record the drawn op parameters (None without a plan, or where the size is unknown).
        errors: per record None or why it could not be read.
        headers: per record (GPU-decodable JPEG kind or None, width, height), as the GPU decoder routes by.
        windows: the chain's leading window segment folded per record (geometry (N, 4), output sizes
            (N, 2); :func:`~gpubatch.engine.windows.leading_windows`), or None.
        regions: per record the (y0, x0, y1, x1) region to decode, or None (a whole image); the
            record's window and size are then the region's.
        release: in views mode, returns the batch's slot to the feed (call :meth:`done`).
        epoch: the pass over the files the batch belongs to (``repeat``), which the draws were made for.
    """

    blobs: list[bytes]
    keys: list[str]
    sizes: list[tuple[int, int] | None]
    params: list[Any] | None
    errors: list[str | None]
    headers: list[tuple[str | None, int, int]] | None = None
    windows: tuple[Any, Any] | None = None
    regions: list[tuple[int, int, int, int] | None] | None = None
    release: Any = None
    epoch: int = 0

    def done(self) -> None:
        """Hand the batch's shared-memory slot back (views mode; a no-op otherwise). Dropping the
        batch does it too, so a consumer that stops early never leaves the feed waiting for a slot."""
        if self.release is not None:
            self.release()
            self.release = None

    def __del__(self) -> None:
        self.done()

    def __len__(self) -> int:
        return len(self.blobs)


def fit_slots(depth: int, slot_bytes: int) -> int:
    """A slot size for a ring of ``depth`` slots that takes at most half of the free shared memory.

    Touching shared memory beyond what /dev/shm holds kills the process (SIGBUS; containers often
    give 64 MiB). Smaller slots only cost speed: a batch that does not fit travels pickled instead.
    """
    free = shm_free()
    if free is None:
        return slot_bytes
    return max(1 << 20, min(slot_bytes, free // (2 * max(depth, 1))))


#: seconds a feed's reader waits for the others to map the ring (their start: imports, a reader opened)
ATTACH_TIMEOUT = 300.0


def _init(shm_name: str, plan: Plan | None, slot_bytes: int, opener: Callable[[], RecordSource] | None = None,
          attached: Any = None) -> None:
    from multiprocessing.shared_memory import SharedMemory

    # Spawned workers share the parent's resource tracker, which keeps one entry per name: this
    # mapping adds nothing, and the parent's unlink removes it (unregistering it here as well made the
    # tracker fail on that second removal).
    shm = SharedMemory(name=shm_name)
    if attached is not None:  # (no reader takes a task before every reader has the ring mapped: Feed.__init__)
        attached.wait(ATTACH_TIMEOUT)
    _W.update(shm=shm, plan=plan, slot=slot_bytes)
    die_with_parent()  # (a run killed with kill -9 leaves no reader behind it)
    if opener is not None:  # a RecordFeed: each worker opens the dataset itself
        reader = opener()
        if not getattr(reader, "reads_without_scan", True):  # (LMDB's reads need its page walk)
            reader.entries()
        _W["reader"] = reader


class _Slot:
    """A worker's writer into one slot of the ring: bytes go in back to back; a batch that does not fit
    comes back pickled instead (``overflow``)."""

    def __init__(self, slot: int):
        self.buf = _W["shm"].buf
        self.cap = _W["slot"]
        self.base, self.pos = slot * self.cap, 0
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.overflow: list[bytes] | None = None
        self._room: Any = None  # (what reserve() gave last)

    def _spill(self) -> None:
        if self.overflow is None:
            b = self.base
            self.overflow = [bytes(self.buf[b + o : b + o + n]) for o, n in zip(self.offsets, self.lengths)]

    def _add(self, n: int) -> None:
        self.offsets.append(self.pos)
        self.lengths.append(n)
        if self.overflow is None:
            self.pos += n

    def put(self, data: bytes) -> None:
        n = len(data)
        if self.overflow is None and self.pos + n <= self.cap:
            a = self.base + self.pos
            self.buf[a : a + n] = data
        else:
            self._spill()
            self.overflow.append(bytes(data))  # type: ignore[union-attr]
        self._add(n)

    def reserve(self, n: int) -> Any:
        """Room for the next item's ``n`` bytes, which the caller writes (a reader's ``preadv``): a view of
        the slot, or a buffer of its own once the batch no longer fits. :meth:`commit` keeps it."""
        if self.overflow is None and self.pos + n <= self.cap:
            a = self.base + self.pos
            self._room = self.buf[a : a + n]
        else:
            self._room = memoryview(bytearray(n))
        return self._room

    def commit(self, data: Any) -> None:
        """The next item: the room :meth:`reserve` gave last (which ``data`` is, once written), or bytes."""
        room, self._room = self._room, None
        if data is not room:
            self.put(data)
        elif room.obj is self.buf.obj and self.overflow is None:  # (written in place)
            self._add(len(room))
        else:
            self._spill()
            self.overflow.append(bytes(room))  # type: ignore[union-attr]
            self._add(len(room))

    def read_file(self, path: str) -> bytes:
        """Read a whole file into the slot (``readinto``: one copy); returns its first 64 KiB."""
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if self.overflow is None and self.pos + size <= self.cap:
                a = self.base + self.pos
                with self.buf[a : a + size] as view:
                    got = f.readinto(view)
                head = bytes(self.buf[a : a + min(got, 65536)])
            else:
                self._spill()
                data = f.read()
                self.overflow.append(data)  # type: ignore[union-attr]
                got, head = len(data), data[:65536]
        self._add(got)
        return head

    def skip(self) -> None:
        """An empty item (a file that could not be read)."""
        if self.overflow is not None:
            self.overflow.append(b"")
        self._add(0)

    def layout(self) -> tuple[list[int], list[int], list[bytes] | None]:
        return self.offsets, self.lengths, self.overflow


def _draws(plan: Plan | None) -> bool:
    return plan is not None and any(op.random for op in plan.ops)


@dataclass
class FileReads:
    """What a :class:`FileFeed` worker made of a batch of files, besides their bytes in the slot.

    Attributes:
        sizes: per file the (height, width) its header says it decodes to, or None.
        params: per file the drawn op parameters (None without random ops, or where the size is unknown).
        errors: per file None or why it could not be read.
        headers: per file its JPEG kind and stored size (:func:`~.codecs.headers.jpeg_kind`).
        windows: the chain's leading window segment folded per file, or None.
        regions: per file the region to decode, or None (whole images).
    """

    sizes: list[tuple[int, int] | None]
    params: list[Any] | None
    errors: list[str | None]
    headers: list[tuple[str | None, int, int]]
    windows: tuple[Any, Any] | None
    regions: list[Any] | None


@dataclass
class RecordReads:
    """What a :class:`RecordFeed` worker made of a batch of dataset entries, besides the sources' bytes
    in the slot.

    Attributes:
        sizes, headers: per source its header's decoded (height, width) or None, and its JPEG kind.
        sources: per source its record's (key, origin), for errors.
        jobs: the outputs to make on the GPU (:class:`Job`).
        results: every output of the batch in order: a finished Record / RecordError (passed-through
            records, read errors), or the index of the job that makes it.
        windows: the chain's leading window segment folded per job (or None).
        counts: RunStats counters of the reads and pass-throughs.
        seconds: the worker's time on the batch.
    """

    sizes: list[tuple[int, int] | None]
    headers: list[tuple[str | None, int, int]]
    sources: list[tuple[str, str]]
    jobs: list[Job]
    results: list[Any]
    windows: tuple[Any, Any] | None
    counts: dict[str, int]
    seconds: float


def _read(slot: int, paths: list[str], keys: list[str], regions: bool = False,
          epoch: int = 0) -> tuple[tuple, FileReads]:
    """Read ``paths`` into ``slot``: (the slot's layout, what else the batch needs).

    With ``regions``, records whose leading window reads only part of the image get the region to
    decode (see :func:`~gpubatch.engine.windows.leading_regions`; upright JPEGs only): their window
    is moved into the region and their size is the region's, the size the decoder will return."""
    from ..codecs.headers import jpeg_facts
    from ..windows import leading_windows

    plan: Plan | None = _W["plan"]
    out = _Slot(slot)
    sizes, errors, params, headers, upright = [], [], [], [], []
    for path, key in zip(paths, keys):
        err, head = None, b""
        try:
            head = out.read_file(path)
        except OSError as e:
            err = f"cannot read {path}: {e.strerror or e}"
            out.skip()
        hw, kind, turn = jpeg_facts(head) if head else (None, (None, 0, 0), 1)
        upright.append(regions and hw is not None and turn == 1)
        headers.append(kind)
        sizes.append(hw)
        errors.append(err)
        # (a tuple: once the collector sees it holds only numbers it stops tracking it, which a list it never
        # does; the consumer's process holds fewer objects for its full collections to walk)
        params.append(tuple(plan.draw(key, hw[0], hw[1], epoch=epoch)) if plan is not None and hw is not None
                      else None)
    windows = leading_windows(plan.ops, params, sizes) if plan is not None else None
    cut = _cut_regions(windows, sizes, upright) if regions and windows is not None else None
    return out.layout(), FileReads(sizes, params if _draws(plan) else None, errors, headers, windows, cut)


def _cut_regions(windows: tuple[Any, Any], sizes: list[Any], upright: list[bool]) -> list[Any]:
    """Per record the region of its image the chain's leading window reads (see
    :func:`~gpubatch.engine.windows.leading_regions`), or None where it is not ``upright`` (a JPEG decoded as
    stored) or the whole image is read; each record cut has its window moved into the region and its size
    made the region's (``windows`` and ``sizes`` changed in place), the size the decoder will return."""
    from ..windows import leading_regions

    cut = [r if ok else None for r, ok in zip(leading_regions(windows, sizes), upright)]
    for i, r in enumerate(cut):
        if r is not None:
            y0, x0, y1, x1 = r
            windows[0][i, 0] -= y0
            windows[0][i, 2] -= x0
            sizes[i] = (y1 - y0, x1 - x0)
    return cut


def _read_records(slot: int, entries: list[Any]) -> tuple[tuple, RecordReads]:
    """Read dataset ``entries`` for ``convert``/``augment`` on the GPU (see :class:`RecordFeed`): each
    record's outputs from the run flow (:func:`~.run.outputs_of`), its jobs' parameters drawn for its
    header's size, and the bytes of each source with a job in the slot, once however many it has."""
    from ...errors import RunStats
    from ..codecs.headers import jpeg_facts
    from ..windows import leading_windows

    t0 = time.perf_counter()
    plan: Plan = _W["plan"]
    reader = _W["reader"]
    stats = RunStats()
    out = _Slot(slot)
    headers, sizes, keys = [], [], []
    results: list[Any] = []
    jobs: list[Job] = []
    for entry in entries:
        record = read_counted(reader, entry, stats)
        if not isinstance(record, Record):
            results.append(record)
            continue
        size, kind, _ = jpeg_facts(record.data[:65536])
        outs = outputs_of(record, plan, stats, source=len(sizes), size=size)
        if any(isinstance(o, Job) for o in outs):  # decoded once however many variants it has
            out.put(record.data)
            sizes.append(size)
            headers.append(kind)
            keys.append((record.key, record.origin))
        for o in outs:
            if isinstance(o, Job):
                jobs.append(o)
                o = len(jobs) - 1
            results.append(o)
    windows = leading_windows(plan.ops, [j.params for j in jobs], [sizes[j.source] for j in jobs])
    counts = {k: getattr(stats, k) for k in ("records_in", "bytes_in", "passthrough", "first_frames")}
    return out.layout(), RecordReads(sizes, headers, keys, jobs, results, windows, counts, time.perf_counter() - t0)


class Feed:
    """Batches prepared in ``workers`` processes into a shared-memory ring of ``depth`` slots, in order.

    Subclasses say what a batch is (:meth:`_submit`) and what comes back (:meth:`_batch`).
    ``views=True`` hands the bytes over without a copy, as NumPy uint8 views of the slot (nvImageCodec
    decodes from them directly): the consumer calls ``done()`` on the batch (or drops it) once it no
    longer needs them, and the feed reuses a slot only after that. Copying a 256-image batch out took
    about 5 ms of the consuming thread (the pipeline study (docs/engine.md), "read_wait" of source feed-inline).
    """

    def __init__(self, spans: list[tuple[int, int]], plan: Plan | None, workers: int | None, depth: int,
                 repeat: bool, slot_bytes: int, views: bool, opener: Callable[[], RecordSource] | None = None,
                 prestarted: Callable[[int, tuple], Any] | None = None):
        import multiprocessing
        from multiprocessing.shared_memory import SharedMemory

        from ..processes import default_readers

        self.spans = spans
        self.repeat = repeat
        self.views = views
        self._returned: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        self._primed: tuple | None = None
        self.depth = max(1, depth)
        workers = workers or default_readers()
        self.slot_bytes = fit_slots(self.depth, int(slot_bytes))
        self.shm = SharedMemory(create=True, size=self.depth * self.slot_bytes)
        try:
            taken = prestarted(workers, (self.shm.name, plan, self.slot_bytes, opener)) if prestarted else None
            self.prestarted = taken is not None
            if taken is not None:  # (the worker's boot started them: feed_start.taken)
                self.pool, attached = taken
            else:
                attached = multiprocessing.get_context("spawn").Barrier(workers)
                self.pool = started_pool(workers, "spawn", _init, (self.shm.name, plan, self.slot_bytes, opener,
                                                                    attached))
            # so are the barrier's and the pool's queues' semaphores: a GPU worker ended without waiting for it
            # (processes.leave_dying) would leave them to the resource tracker, which warns of them on the terminal
            unlink_semaphores(attached, self.pool)
        finally:
            # every reader has mapped the ring (started_pool's first tasks ran, and none runs before the barrier
            # let all readers through): its name goes from /dev/shm now, and its memory with the last process
            # that maps it, however the run ends (a killed process group took the resource tracker with it,
            # which left each GPU worker's ring, 512 MiB, in /dev/shm until the machine restarted)
            self.shm.unlink()

    def _submit(self, slot: int, a: int, b: int, epoch: int = 0) -> Future:
        raise NotImplementedError

    def _batch(self, blobs: list[Any], a: int, b: int, extra: Any, release: Any, epoch: int = 0) -> Any:
        raise NotImplementedError

    def close(self, wait: bool = True, unmap: bool = True) -> None:
        """The reader processes stopped, the shared memory unlinked and (``unmap``) unmapped; ``wait=False`` does not wait
        for the processes to end (every batch read: 0.13 s of a GPU worker's end on an H200 host)."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
        try:
            if unmap:
                self.shm.close()
        except BufferError:  # views of a batch are still alive: the mapping goes with the last of them
            self.shm.close = lambda: None  # type: ignore[method-assign]  (its __del__ would retry)
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cycle(self) -> Iterator[tuple[int, int, int]]:
        """(start, end, epoch) of each batch: the spans once, or pass after pass with ``repeat``."""
        epoch = 0
        while True:
            yield from ((a, b, epoch) for a, b in self.spans)
            if not self.repeat or not self.spans:
                return
            epoch += 1

    def stop(self) -> None:
        """Make a running iteration end at its next step, even one waiting for a slot to come back."""
        self._stopped = True
        self._returned.put(None)

    def start(self) -> None:
        """Start the first reads now (the workers start up meanwhile); iterating does it otherwise."""
        if self._primed is None:
            self._primed = self._state()
            self._fill(self._primed, block=False)

    def _state(self) -> tuple:
        self._returned = queue.SimpleQueue()  # slots handed back (views mode); None: stop
        self._stopped = False
        spans = self._cycle()
        return spans, deque(), list(range(self.depth)), [next(spans, None)]

    def _fill(self, state: tuple, block: bool) -> None:
        """Start reads into free slots; wait for one only when nothing else can be yielded."""
        spans, pending, free, nxt = state
        returned = self._returned
        while nxt[0] is not None and not self._stopped:
            while True:
                try:
                    got = returned.get_nowait()
                except queue.Empty:
                    break
                if got is not None:
                    free.append(got)
            if not free:
                if pending or not block:
                    return
                got = returned.get()  # every slot is with the consumer: wait for one
                if got is None:
                    return
                free.append(got)
            slot = free.pop()
            a, b, epoch = nxt[0]
            pending.append((slot, a, b, epoch, self._submit(slot, a, b, epoch)))
            nxt[0] = next(spans, None)

    def __iter__(self) -> Iterator[Any]:
        state, self._primed = self._primed or self._state(), None
        _, pending, free, _ = state
        buf = self.shm.buf
        while True:
            self._fill(state, block=True)
            if self._stopped or not pending:
                return
            slot, a, b, epoch, fut = pending.popleft()
            (offsets, lengths, overflow), extra = fut.result()
            release = None
            base = slot * self.slot_bytes
            if overflow is not None:
                blobs = overflow
                free.append(slot)
            elif self.views:
                blobs = SlotViews(buf, base, self.slot_bytes, offsets, lengths)
                release = partial(self._returned.put, slot)
            else:
                blobs = [bytes(buf[base + o : base + o + n]) for o, n in zip(offsets, lengths)]
                free.append(slot)
            yield self._batch(blobs, a, b, extra, release, epoch)


def _spans(n: int, batch_size: int) -> list[tuple[int, int]]:
    b = max(1, int(batch_size))
    return [(a, min(a + b, n)) for a in range(0, n, b)]


class FileFeed(Feed):
    """Batches of files read, header-parsed and drawn for in ``workers`` processes, in order.

    >>> with FileFeed(paths, keys, batch_size=256, plan=plan) as feed:
    ...     for fed in feed:  # FedBatch
    ...         ...

    ``repeat`` cycles over the files forever (benchmarks). ``depth`` batches are in flight, each in a
    shared-memory slot of ``slot_bytes``; ``views`` as for :class:`Feed`. ``regions`` asks for the
    region of each image the chain's leading crop reads (``FedBatch.regions``).
    """

    def __init__(self, files: Sequence[str | Path], keys: Sequence[str] | None = None, batch_size: int = 256,
                 plan: Plan | None = None, workers: int | None = None, depth: int = 4, repeat: bool = False,
                 slot_bytes: int = SLOT_BYTES, views: bool = False, regions: bool = False):
        self.files = [str(f) for f in files]
        self.regions = regions
        self.keys = list(keys) if keys is not None else [Path(f).stem for f in self.files]
        if len(self.keys) != len(self.files):
            raise ValueError("FileFeed: one key per file")
        super().__init__(_spans(len(self.files), batch_size), plan, workers, depth, repeat, slot_bytes, views)

    def _submit(self, slot: int, a: int, b: int, epoch: int = 0) -> Future:
        return self.pool.submit(_read, slot, self.files[a:b], self.keys[a:b], self.regions, epoch)

    def _batch(self, blobs: list[Any], a: int, b: int, extra: FileReads, release: Any, epoch: int = 0) -> FedBatch:
        return FedBatch(blobs, self.keys[a:b], extra.sizes, extra.params, extra.errors, extra.headers, extra.windows,
                        extra.regions, release, epoch)


@dataclass
class FedRecords(RecordReads):
    """One batch of dataset records from a :class:`RecordFeed`: a worker's :class:`RecordReads` with
    ``blobs``, the encoded bytes of each source image that goes through the chain (views of the slot,
    given back by :meth:`done`)."""

    blobs: list[Any] = field(default_factory=list)
    release: Any = None

    done = FedBatch.done
    __del__ = FedBatch.__del__


class RecordFeed(Feed):
    """Batches of dataset entries for ``convert``/``augment`` on the GPU, prepared in ``workers`` processes.

    Each worker opens the dataset itself, reads its batch's records, checks and finishes those that
    pass through untouched, and for every output that goes through the chain puts the source's bytes
    in the slot (once per source), parses its JPEG header and draws the output's parameters (and moves
    its boxes) for the header's size. The process driving the GPU then only decodes, launches and encodes.
    """

    def __init__(self, opener: Callable[[], RecordSource], entries: Sequence[Any], plan: Plan, batch_size: int = 256,
                 workers: int | None = None, depth: int = 4, slot_bytes: int = SLOT_BYTES, views: bool = True,
                 spans: list[tuple[int, int]] | None = None, prestarted: Callable[[int, tuple], Any] | None = None):
        """``opener``: makes the dataset's reader in each worker process (picklable: a module-level
        function and its arguments, as ``functools.partial(open_reader, path, format)``); ``spans``: the
        batches as [start, end) ranges of ``entries`` (by default ``batch_size`` entries each); ``prestarted``:
        hands over readers started before (:func:`.feed_start.taken`), else the feed starts its own."""
        self.entries = list(entries)
        spans = spans if spans is not None else _spans(len(self.entries), batch_size)
        super().__init__(spans, plan, workers, depth, False, slot_bytes, views, opener, prestarted)

    def _submit(self, slot: int, a: int, b: int, epoch: int = 0) -> Future:
        return self.pool.submit(_read_records, slot, self.entries[a:b])

    def _batch(self, blobs: list[Any], a: int, b: int, extra: RecordReads, release: Any,
               epoch: int = 0) -> FedRecords:
        return FedRecords(**vars(extra), blobs=blobs, release=release)


@dataclass
class LoaderReads:
    """What a :class:`LoaderFeed` worker made of a batch of dataset entries, besides the images' bytes.

    Attributes:
        keys, sizes, params, headers, windows: per record read, as :class:`FileReads` has them per file
            (``params`` drawn from (seed, the record's key, epoch)).
        labels, origins: per record read, its label (-1: none) and where it was read from.
        metas, boxes: per record read, its meta and its boxes, where the loader asks for them (else None).
        failed: the entries that could not be read: key, origin, reason.
        regions: per record read the part of its image to decode, or None (a whole image), where the feed
            cuts regions (its window and size are then the region's); else None.

    A batch's records travel as these columns, not as an object a record: the process driving the GPU
    holds fewer objects for Python's garbage collector to walk (gpubatch.training's ``_Rows``).
    """

    keys: list[str]
    sizes: list[tuple[int, int] | None]
    params: list[Any] | None
    headers: list[tuple[str | None, int, int]]
    windows: tuple[Any, Any] | None
    labels: list[int]
    origins: list[str]
    metas: list[dict[str, Any]] | None
    boxes: list[Any] | None
    failed: list[dict[str, str]]
    regions: list[tuple[int, int, int, int] | None] | None = None


def _read_loader(slot: int, entries: list[Any], epoch: int, fields: tuple[bool, bool] = (True, True),
                 regions: bool = False) -> tuple[tuple, LoaderReads]:
    """Read a training batch's dataset ``entries`` into ``slot`` (see :class:`LoaderFeed`): a reader that
    can reads each image straight into the slot. ``fields``: whether the metas and the boxes are sent;
    ``regions``: cut each upright JPEG to the part the chain's leading window reads (as :func:`_read`)."""
    from ..codecs.headers import jpeg_facts
    from ..windows import leading_windows

    plan: Plan = _W["plan"]
    reader = _W["reader"]
    out = _Slot(slot)
    metas: list[Any] | None = [] if fields[0] else None
    boxes: list[Any] | None = [] if fields[1] else None
    keys, sizes, params, headers, labels, origins, failed, upright = [], [], [], [], [], [], [], []
    for entry in entries:
        r = read_row(reader, entry, into=out.reserve)
        if not isinstance(r, Record):
            failed.append(r)
            continue
        out.commit(r.data)
        hw, kind, turn = jpeg_facts(r.data[:65536])
        upright.append(regions and hw is not None and turn == 1)
        keys.append(r.key)
        sizes.append(hw)
        headers.append(kind)
        params.append(tuple(plan.draw(r.key, hw[0], hw[1], epoch=epoch)) if hw is not None else None)  # (as _read)
        labels.append(-1 if r.label is None else int(r.label))
        origins.append(r.origin)
        if metas is not None:
            metas.append(dict(r.meta))
        if boxes is not None:
            boxes.append(r.boxes)
        del r  # (its bytes may be a view of the slot)
    windows = leading_windows(plan.ops, params, sizes)
    cut = _cut_regions(windows, sizes, upright) if regions and windows is not None else None
    return out.layout(), LoaderReads(keys, sizes, params if _draws(plan) else None, headers, windows, labels,
                                     origins, metas, boxes, failed, cut)


@dataclass
class FedRows(FedBatch):
    """One batch of a :class:`LoaderFeed`: a :class:`FedBatch` of the records read, with their columns
    (:class:`LoaderReads`) and the entries that ``failed``."""

    labels: list[int] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    metas: list[dict[str, Any]] | None = None
    boxes: list[Any] | None = None
    failed: list[dict[str, str]] = field(default_factory=list)


class LoaderFeed(Feed):
    """A training loader's batches of dataset entries, read in ``workers`` processes (each opens the dataset
    itself): records parsed, images' bytes into the shared-memory ring, JPEG headers read and parameters
    drawn for the epoch, so that the process driving the GPU only decodes and launches. The processes
    last from epoch to epoch: :meth:`reading` sets what the next iteration reads, a stream of batches that
    may run on from one epoch into the next (the loader reads the next epoch's first batches while the
    last ones of this epoch decode, as a reader that never stops would)."""

    def __init__(self, opener: Callable[[], RecordSource], plan: Plan, workers: int | None = None, depth: int = 4,
                 slot_bytes: int = SLOT_BYTES, fields: Sequence[str] | None = None, regions: bool = False):
        self.regions = regions  # each upright JPEG cut to the part the chain's leading window reads
        # what the loader hands over besides keys, images and labels (None: all of it): metas (asked for
        # as "meta" or by a member's name) and boxes
        known = {"key", "image", "label", "boxes"}
        self.fields = (True, True) if fields is None else (any(f not in known for f in fields), "boxes" in fields)
        self._batches: Iterator[tuple[int, list[Any]]] = iter(())
        self._queued: dict[int, list[Any]] = {}  # a batch's entries from its planning to its read's start
        self._inflight: list[Future] = []  # reads submitted and perhaps not done (an iteration stopped early)
        super().__init__([], plan, workers, depth, False, slot_bytes, True, opener)

    def reading(self, batches: Iterable[tuple[int, Sequence[Any]]]) -> LoaderFeed:
        """Read ``batches``, (epoch, entries) each and as many as it gives, at the next iteration (once the
        reads an iteration left behind, stopped early, are done: their slots are the next iteration's)."""
        from concurrent.futures import wait

        wait(self._inflight)
        self._inflight, self._queued = [], {}
        self._batches = iter(batches)
        return self

    def _cycle(self) -> Iterator[tuple[int, int, int]]:
        for n, (epoch, entries) in enumerate(self._batches):
            self._queued[n] = list(entries)
            yield n, n + 1, int(epoch)

    def _submit(self, slot: int, a: int, b: int, epoch: int = 0) -> Future:
        fut = self.pool.submit(_read_loader, slot, self._queued.pop(a), epoch, self.fields, self.regions)
        self._inflight = [f for f in self._inflight if not f.done()] + [fut]
        return fut

    def _batch(self, blobs: list[Any], a: int, b: int, extra: LoaderReads, release: Any, epoch: int = 0) -> FedRows:
        return FedRows(blobs, extra.keys, extra.sizes, extra.params, [None] * len(blobs), extra.headers,
                       extra.windows, extra.regions, release, epoch, labels=extra.labels, origins=extra.origins,
                       metas=extra.metas, boxes=extra.boxes, failed=extra.failed)
