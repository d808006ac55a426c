"""Images on the GPU for ``convert`` and ``augment``: the work unit a GPU's worker process runs
(:class:`GpuImageUnit`: its tasks through feed -> decode -> chain -> encode -> its shards) and the
batch's transform (:func:`transform_fed`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import GpubatchError, RecordError, Stage
from ...types import Record
from ..execute.worker import finish, released
from ..execute.writer import shard_writer
from ..plan import Plan
from ..processes import cores
from ..usage import cpu_since, thread_cpu
from ..windows import fed_windows, segments
from .engine import GpuEngine
from .marks import Marks


def transform_fed(engine: GpuEngine, plan: Plan, fed: Any, res: Any, stats: Any, sink: Any = None,
                  clock: LoopClock | None = None) -> list[Record | RecordError]:
    """The outputs of one :class:`~gpubatch.engine.gpu.feed.FedRecords` batch, in order: its jobs run through
    the chain and are encoded from the decoded sources ``res`` (:class:`Settled` says which, with what). With a ``sink``
    (:class:`~gpubatch.engine.codecs.jpeg_gpu.Sink`) JPEG records hold an ``EncodedSpan`` of it as data; a
    ``clock`` (:class:`LoopClock`) times the batch."""
    res.order(engine.stream)  # this batch's kernels wait for its decode, and no later one's
    if clock is not None:
        clock.begin()
    settled = Settled(plan, fed, res.arrays, res.errors, stats)
    if clock is not None:
        clock.lap("settle")
    stats.add(fallbacks=res.fallbacks)
    if settled.rows:
        settled.encoded(_resample_encode(engine, plan, settled.codecs, settled.arrays, settled.params,
                                         settled.first, sink, clock))
    if clock is not None:
        clock.end()
    return settled.outputs()


class LoopClock:
    """Where a GPU worker's loop thread spends its batches, and what the GPU's stream does meanwhile,
    summed until :meth:`take`: the thread's seconds settling a batch's jobs, launching its chain and
    encoding it (the encoder waits for the batch's decode and kernels on the GPU), and, from CUDA events
    on the engine's stream, the chain's kernels ("gpu: chain") and the stream's time between one batch's
    end and the next one's start ("gpu: between batches": waiting for a decode or for this thread)."""

    def __init__(self, cp: Any, stream: Any):
        self.cp, self.stream = cp, stream
        self.host: dict[str, float] = {}
        self.events: list[tuple[Any, Any, Any]] = []
        self._t = 0.0
        self._open: list[Any] = []
        self._last: Any = None

    def _event(self) -> Any:
        ev = self.cp.cuda.Event()
        ev.record(self.stream)
        return ev

    def begin(self) -> None:
        self._t = time.perf_counter()
        self._open = [self._event()]

    def lap(self, name: str, event: bool = False) -> None:
        now = time.perf_counter()
        self.host[name] = self.host.get(name, 0.0) + now - self._t
        self._t = now
        if event:
            self._open.append(self._event())

    def end(self) -> None:
        if len(self._open) == 2:  # (a batch whose every record failed has no chain)
            self.events.append((self._open[0], self._open[1], self._event()))
        self._open = []

    def take(self) -> dict[str, float]:
        """The sums since the last take, as summary stage names, and start again."""
        out = {f"loop: {k}": v for k, v in self.host.items()}
        chain = between = 0.0
        prev = self._last
        for start, chained, end in self.events:
            end.synchronize()
            chain += self.cp.cuda.get_elapsed_time(start, chained) / 1e3
            if prev is not None:
                between += self.cp.cuda.get_elapsed_time(prev, start) / 1e3
            prev = end
        out.update({"gpu: chain": chain, "gpu: between batches": between})
        self.host = {}
        self.events, self._last = [], prev  # (the next shard's first gap starts at this one's end)
        return out


class Settled:
    """A fed batch's jobs settled against their decoded sources (``arrays``, None where a source failed
    with ``errors``): which go through the chain (``rows``, with their ``arrays``, ``params``, output
    ``codecs`` and leading windows ``first``), and every other output's error, in order.

    A record that failed to decode gives one error however many variants it has. Each job's parameters
    come from :meth:`~.run.Job.settle`: those the feed drew for the source's header size where the decoded
    size matches, else drawn here. The output's size is checked against its codec's limit from the
    folded windows where the chain is one window segment (the feed folded them), else op by op. The
    per-record Python here runs on the thread that feeds the GPU: it is kept to a few dictionary
    lookups a record (``benchmarks/gpu_loop_host.py`` times it)."""

    def __init__(self, plan: Plan, fed: Any, arrays: Any, errors: Any, stats: Any):
        self.plan = plan
        out: list[Any] = list(fed.results)
        self.out = out
        where = {r: pos for pos, r in enumerate(out) if isinstance(r, int)}
        rows: list[int] = []
        self.arrays, self.params, self.jobs, self.codecs = [], [], [], []
        redrawn: list[int] = []
        failed: set[int] = set()
        dropped = 0
        whole = fed.windows is not None and _whole_window(plan)  # (sizes from the folded windows, else op by op)
        out_codec = plan.out_codec
        for j, job in enumerate(fed.jobs):
            pos = where[j]
            a = arrays[job.source]
            if a is None:
                out[pos] = None
                if job.source not in failed:  # one error per source record, not one per variant
                    failed.add(job.source)
                    key, origin = fed.sources[job.source]
                    out[pos] = RecordError(key, origin, Stage.DECODE, errors[job.source] or "decode failed")
                continue
            t = job.template
            shape = a.shape
            hw = (int(shape[0]), int(shape[1]))
            again = job.size != hw  # the header said otherwise (or nothing): drawn for the decoded size
            try:
                drawn, boxes, d = job.settle(plan, *hw)
            except Exception as e:  # noqa: BLE001 - the record boundary: an op too large, hostile boxes
                out[pos] = RecordError(t.key, t.origin, Stage.TRANSFORM, f"{e}")
                continue
            codec = out_codec(t.codec)
            if not whole:
                try:
                    plan.check_encodable(codec, *plan.out_hw(hw[0], hw[1], drawn))
                except ValueError as e:
                    out[pos] = RecordError(t.key, t.origin, Stage.ENCODE, str(e))
                    continue
            if again:
                redrawn.append(len(rows))
            dropped += d
            if plan.augmenting:  # (an augment's parameters, by output key: the writer takes them)
                stats.drawn[t.key] = drawn
            rows.append(j)
            self.arrays.append(a)
            self.params.append(drawn)
            self.codecs.append(codec)
            self.jobs.append((pos, t, boxes))
        if dropped:
            stats.add(boxes_dropped=dropped)
        self.rows, self.stats = rows, stats
        self.first = fed_windows(plan.ops, fed.windows, rows, redrawn, self.params, self.arrays) if rows else None
        if whole and rows:
            self._check_sizes()

    def _check_sizes(self) -> None:
        """Drop the rows whose output (the folded windows' size) their codec cannot hold, as errors."""
        bad: list[int] = []
        for k, (codec, (h, w)) in enumerate(zip(self.codecs, self.first[1].tolist())):
            try:
                self.plan.check_encodable(codec, h, w)
            except ValueError as e:
                pos, t, _ = self.jobs[k]
                self.out[pos] = RecordError(t.key, t.origin, Stage.ENCODE, str(e))
                bad.append(k)
        if bad:
            gone = set(bad)
            keep = [k for k in range(len(self.codecs)) if k not in gone]
            for name in ("arrays", "params", "codecs", "jobs"):
                setattr(self, name, [getattr(self, name)[k] for k in keep])
            self.first = (self.first[0][keep], self.first[1][keep])
            self.rows = [self.rows[k] for k in keep]

    def encoded(self, encoded: list[Any]) -> None:
        """Take the encoder's results for the rows, in order (bytes, an ``EncodedSpan``, or why it failed)."""
        done = 0
        out = self.out
        for (pos, t, boxes), codec, data in zip(self.jobs, self.codecs, encoded):
            if isinstance(data, str):
                out[pos] = RecordError(t.key, t.origin, Stage.ENCODE, data)
                continue
            out[pos] = t.with_(data=data, codec=codec, boxes=boxes)
            done += 1
        self.stats.add(transcoded=done)

    def outputs(self) -> list[Record | RecordError]:
        return [r for r in self.out if r is not None]


def _whole_window(plan: Plan) -> bool:
    """Whether ``plan``'s chain is one window segment (then maybe a normalize): the feed's folded windows
    then give each output's size."""
    segs = [sg for sg in segments(plan.ops) if sg[0] != "normalize"]
    return len(segs) == 1 and segs[0][0] == "window"


def _resample_encode(engine: GpuEngine, plan: Plan, codecs: list[str], arrays: list, params: list,
                     first: tuple[np.ndarray, np.ndarray] | None = None, sink: Any = None,
                     clock: LoopClock | None = None) -> list:
    """Run the chain (``first``: its leading windows, already folded) then encode, in output order
    (bytes, or why the encoder failed); a batch that does not fit the memory cap is split in halves."""
    from ..batch import Ragged
    from .chain import run_chain

    cp = engine.cp
    try:
        dev = run_chain(engine, plan.ops, Ragged.from_items(cp, arrays), params, first=first)
        if clock is not None:
            clock.lap("chain", event=True)
        results: list[Any] = [None] * len(dev)
        by_codec: dict[str, list[int]] = {}
        for k, c in enumerate(codecs):
            by_codec.setdefault(plan.out_codec(c), []).append(k)
        for codec, idx in by_codec.items():
            enc = engine.encoder.encode_batch(dev, idx, codec, plan.jpeg_quality, engine.stream, sink)
            for k, data in zip(idx, enc):
                results[k] = data if data is not None else f"the GPU {codec} encoder failed"
        if clock is not None:
            clock.lap("encode")
        return results
    except cp.cuda.memory.OutOfMemoryError:
        if len(arrays) <= 1:
            raise GpubatchError(
                f"one image does not fit the GPU memory cap ({engine.memory_limit >> 20} MiB): raise --gpu-memory"
            ) from None
        engine.stream.synchronize()
        cp.get_default_memory_pool().free_all_blocks()
        h = len(arrays) // 2
        halves = [None, None] if first is None else [(first[0][:h], first[1][:h]), (first[0][h:], first[1][h:])]
        return (_resample_encode(engine, plan, codecs[:h], arrays[:h], params[:h], halves[0], sink)
                + _resample_encode(engine, plan, codecs[h:], arrays[h:], params[h:], halves[1], sink))


class GpuImageUnit:
    """Images on the GPU, in a worker process of its own (a GPU's worker): the tasks it is given in shard
    order, their entries read ahead by reader processes (a :class:`~.feed.RecordFeed`, across the tasks'
    boundaries) which pass untouched records through and draw every output's parameters, decoded on the
    GPU a batch ahead (:func:`~.engine.decode_ahead`), run through the chain and the JPEG encoder
    (:func:`transform_fed`), and written in order into each task's shard, which this process commits.

    Batches never span two tasks. The decode route is the one the run names (the runner asks for the
    hardware route, which gives each decoder its images by their kind: the bytes written do not depend on
    the host's load, the cap or the number of workers). Under ``--gpu-memory`` the engine is built first,
    what it took measured, and batches and decoding ahead sized to the worker's share of the cap for the
    largest image of a sample of the tasks' headers; below what one image needs it refuses, naming the
    parts."""

    def __init__(self, ctx: Any, slot: int):
        self.ctx, self.slot = ctx, slot

    @classmethod
    def make(cls, ctx: Any, slot: int) -> GpuImageUnit:
        return cls(ctx, slot)

    def close(self) -> None:
        pass

    def run(self, reader: Any, tasks: Any, writing: Callable[[Any], Any], done: Callable[[Any], None]) -> None:
        from ..device import Device, DeviceKind
        from ..execute.boot import TIMES as BOOT_TIMES
        from ..media import DEVICE
        from . import memory as gm
        from . import start
        from .engine import decode_ahead
        from .feed import RecordFeed

        ctx, plan, settings = self.ctx, self.ctx.plan, self.ctx.settings
        plan.validate(DEVICE)
        tasks = [t for t in tasks]  # (this GPU's tasks, in shard order: the feed reads ahead across them)
        for task in [t for t in tasks if not t.entries]:  # (a task of no entries: an empty shard)
            done(finish(writing(task)))
        tasks = [t for t in tasks if t.entries]
        if not tasks:
            return
        procs = max(1, ctx.gpu_procs)  # (the processes sharing this GPU)
        gpu = ctx.device.index
        entries = [e for t in tasks for e in t.entries]
        batch = ctx.batch_size
        t0 = time.perf_counter()
        marks = Marks(ctx.started)  # (when this worker's steps came, from the run's start: the summary's "wall (worker)")
        have = cores()
        host = ctx.host_procs  # (the GPU processes sharing this host's cores: every GPU's)
        route_cores = have / host  # (the route follows this worker's share of the cores, not their load)
        # the context, the hardware decoder's instances, nvImageCodec and the kernels start in threads now,
        # beside the readers' start and this thread's imports (engine/gpu/start.py), unless the worker's
        # boot began them already (and reserved the hardware decoder's core before them)
        booted, reserved = start.booted(gpu)  # (booted: the seconds the boot's start has run already)
        if booted is None:  # (a unit made without a worker's boot: the same start, begun now)
            start.boot(start.early("image", ctx))
            reserved = start.booted(gpu)[1]
        elif reserved is not None and max(1, ctx.gpu_procs) > 1:  # (booted as the GPU's one process, the run
            reserved.release()  # took another beside it: no core of its own, as none of several takes one)
            reserved = None
        for name, when in BOOT_TIMES.items():  # (the boot's steps: its run came, unpickled)
            marks.at(name, when)
        marks.mark("unit start", booted)
        readers = start.feed_readers(have, host, settings)  # (those the worker's boot started, where it did)
        threads = max(2, have // host)
        feed = engine = unpin = current = out_writer = starting = None
        finished = False
        try:
            pinned: list[Any] = []  # (the ring page-locked by the feed's start: (its address, its unlock))

            def start_feed(b: int, pin: bool = False) -> RecordFeed:
                return record_feed(ctx, tasks, b, readers, marks, pinned if pin else None)

            def make_engine(preallocate: tuple[int, int, int] | None) -> GpuEngine:
                return GpuEngine(Device(DeviceKind.GPU, gpu, reason="worker"), threads, ctx.gpu_memory, share=procs,
                                 deterministic=True, cores=reserved, hw_preallocate=preallocate, route_cores=route_cores,
                                 decode_route=settings.decode_route, settings=settings)

            ahead = max(1, settings.decode_ahead)
            feed_secs = 0.0
            mem: dict[str, Any] = {}
            if ctx.gpu_memory is None:
                # the reader processes start (a thread waits for them) while CUDA and the decoders do
                starting = _Started(lambda: start_feed(batch, pin=settings.pin_feed))
                # the hardware decoder's buffers reserved for a batch of 640x640 images up front (the worker study)
                engine = make_engine((batch, settings.hw_preallocate, settings.hw_preallocate))
                gpu_init = time.perf_counter() - t0
                marks.mark("engine made")
                start.kernels_ready(gpu)  # (the kernels its start compiles in threads: loaded once)
                marks.mark("kernels ready")
                # (while the reader processes start and read; this unit decodes neither into planes nor regions)
                warm = engine.warm_up(batch, encoder=True, planes=False, cuda_later=True)
                marks.mark("warm-up done")
                feed, feed_secs = starting.result()
                marks.at("feed started", starting.finished)
                unpin = engine.unpinning(pinned[0]) if pinned else None
            else:
                engine = make_engine(None)
                gpu_init = time.perf_counter() - t0
                marks.mark("engine made")
                start.kernels_ready(gpu)
                warm = engine.warm_up(16, encoder=True, planes=False)  # a small batch: its buffers come before the cap is planned
                fixed, parts = engine.fixed_memory()
                need = gm.sample_need(reader.read, entries, plan)
                try:
                    mem_plan = gm.plan_memory(engine.cap, fixed, parts, need, batch, spec=str(ctx.gpu_memory))
                except gm.CapTooSmall as e:
                    raise GpubatchError(str(e) + (f" (for each of {procs} GPU worker processes: pass fewer "
                                                  "--gpu-procs)" if procs > 1 else "")) from None
                engine.apply(mem_plan)
                ahead, batch = mem_plan.ahead, mem_plan.batch
                mem = {"cap_mib": engine.cap >> 20, "processes": procs, "plan": mem_plan.describe()}
                feed = start_feed(batch)
                unpin = engine.pin_host(feed.shm.buf) if settings.pin_feed else None
            tm = {"read_wait": 0.0, "decode": 0.0, "decode_wait": 0.0}
            first = {"gpu_init": gpu_init, "warm_up": warm, "gpu_init: feed start": round(feed_secs, 4),
                     **({"gpu_init: begun by the boot (s before the unit)": round(booted, 4)} if booted is not None else {}),
                     **{f"gpu_init: {k}": v for k, v in getattr(engine, "init_times", {}).items()},
                     **{f"warm_up: {k}": v for k, v in getattr(engine, "warm_times", {}).items()},
                     **{f"gpu_init (thread): {k}": v for k, v in start.kernels_ready(gpu).items()}}

            def decode(fed: Any) -> Any:
                marks.once("first batch read")
                return engine.decoder.decode(fed.blobs, engine.stream, plan.max_pixels, order=False,
                                             headers=fed.headers, wait=False)

            owners = _owners(tasks, batch)
            quarters = {k: f"batch {k + 1}" for k in (1, 3, 7) if k < len(owners) // 4}  # (the ramp)
            quarters.update({len(owners) * q // 4: f"batch {25 * q}%" for q in (1, 2, 3)})
            current = None
            out_writer = shard_writer(ctx, done)  # the shards' files written in a thread or a process of their own
            seen = dict(tm)
            stage = GpuStage(engine, plan, out_writer, pinned=unpin is not None)
            for k, (fed, res) in enumerate(decode_ahead(decode, feed, ahead, tm, gpu)):
                task, last = owners[k]
                if current is None:
                    current = writing(task)
                    shard_t = {**first, "read (feed workers)": 0.0}
                    first = {}
                    if not k:  # (the first batch is on its way: the summary's "wall: first batch")
                        marks.mark("first batch")
                stats = current.stats
                stats.add(**fed.counts)
                res.wait()  # (the decoders' threads have handed every image over)
                marks.once("first batch decoded")
                tm["decode_wait"] += res.waited
                shard_t["read (feed workers)"] += fed.seconds
                commit = None
                if last:
                    for name, v in tm.items():
                        shard_t[name] = shard_t.get(name, 0.0) + v - seen[name]
                    seen = dict(tm)
                    # (the peak: the run samples its workers' device memory, runner._memory_watch)
                    extra = {"gpu_memory": dict(mem)} if mem else {}
                    for name, when in start.step_walls(gpu).items():  # (the GPU's start, step by step)
                        marks.at(f"gpu start: {name}", when)
                    if steps := marks.take():
                        extra["marks"] = steps
                    commit = extra or None
                stage.run(fed, res, current, shard_t, last, commit)
                marks.once("first batch through the chain")
                if k in quarters:
                    marks.mark(quarters[k])
                del fed, res
                if last:
                    current = None
            if out_writer is not None:
                out_writer.close()
            finished = True
        except BaseException:
            if out_writer is not None:
                out_writer.close(abort=current)
            elif current is not None:
                current.abort()
            raise
        finally:
            if finished:  # every shard committed: the executor hears it first (released), the teardown comes after
                if engine is not None:  # (nothing is in flight: every batch went through the chain)
                    engine.drain()
                if feed is not None:  # its readers told to end, its name unlinked; its pages unlocked below
                    feed.close(wait=False, unmap=unpin is None)
                if starting is not None:
                    starting.release()
                released()  # (before: the ring's unlock, 0.10-0.13 s of the run's end on H200 hosts, 2026-12-04)
            if unpin is not None:  # (drains the decoders first)
                unpin()
            elif engine is not None:  # no decode reads the feed's memory any more
                engine.drain()
            if feed is None and starting is not None:  # (the engine failed while the feed started)
                try:
                    feed = starting.result()[0]
                except BaseException:  # noqa: BLE001 - the engine's error is the one raised
                    feed = None
                if pinned:  # (no decode read it: the engine failed first)
                    pinned[0][1]()
            if feed is not None:
                feed.close(wait=not finished)  # (once finished, its mapping unmapped: unlocked by now)
            if starting is not None:
                starting.release()
            if engine is not None:
                engine.close()


class GpuStage:
    """A GPU worker's batches through the chain and the encoder (:func:`transform_fed`), in order: their
    sources released, their outputs handed to the shards' writer as they come (the JPEGs as spans of one
    buffer a batch, made into files by the writer: :func:`~gpubatch.engine.codecs.jpeg_gpu.assembled`), and
    each shard committed after its last batch with its stage times, the loop's and the decoders' among
    them (:class:`LoopClock`)."""

    def __init__(self, engine: GpuEngine, plan: Plan, out_writer: Any, pinned: bool):
        self.engine, self.plan, self.out_writer, self.pinned = engine, plan, out_writer, pinned
        self.clock = LoopClock(engine.cp, engine.stream)
        self._dec_seen = dict(engine.decoder.timings)
        self._cpu_seen = thread_cpu()

    def run(self, fed: Any, res: Any, shard: Any, shard_t: dict, last: bool, extra: dict | None) -> None:
        """One batch of ``shard`` (``last``: its last; then it is committed with ``shard_t``, its stage
        times, and ``extra``)."""
        from ..codecs.jpeg_gpu import Sink, assembled

        engine = self.engine
        t1 = time.perf_counter()
        # the JPEGs come back as spans of one buffer, made into files by the shards' writer
        sink = Sink(None)
        out = transform_fed(engine, self.plan, fed, res, shard.stats, sink=sink, clock=self.clock)
        del res  # the decoded images go once the kernels reading them are done
        if self.pinned:  # the GPU may still be copying this batch's bytes
            engine.stream.synchronize()
        fed.done()  # the source bytes (views of the feed's shared memory) are no longer read
        shard_t["ops+encode"] = shard_t.get("ops+encode", 0.0) + time.perf_counter() - t1
        t1 = time.perf_counter()
        self.out_writer.put(shard, out if sink.view is None else functools.partial(assembled, out, sink.view[: sink.pos]))
        shard_t["loop: put"] = shard_t.get("loop: put", 0.0) + time.perf_counter() - t1
        if last:
            shard_t.update(self.clock.take())
            dec = engine.decoder.timings  # (the decoders' threads' seconds, summed)
            shard_t.update({f"decoder: {k}": v - self._dec_seen.get(k, 0.0) for k, v in dec.items() if v})
            self._dec_seen = dict(dec)
            cpu = thread_cpu()  # (each thread's CPU seconds: those running Python hold the hardware thread's lock)
            shard_t.update(cpu_since(self._cpu_seen, cpu))
            self._cpu_seen = cpu
            self.out_writer.commit(shard, shard_t, extra)


#: Linux's madvise advice that faults a range's pages in as if written, writing nothing (Linux 5.14 on)
MADV_POPULATE_WRITE = 23


def allocated(shm: Any) -> bool:
    """The pages of shared memory ``shm`` made and mapped now (``madvise(MADV_POPULATE_WRITE)``, else its file
    ``posix_fallocate``d; outside the interpreter's lock), so that page-locking it later (``cudaHostRegister``, which
    holds the CUDA driver's lock: the GPU's start waited 0.25 s for it on 512 MiB, H200 host, 2026-12-04) finds them
    made; False where neither could be done."""
    import ctypes
    import os

    view = np.frombuffer(shm.buf, np.uint8)
    addr, size = view.ctypes.data, view.nbytes
    del view  # (no export of the buffer may outlive this call)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(size), MADV_POPULATE_WRITE) == 0:
            return True
    except (OSError, AttributeError):
        pass
    fd = getattr(shm, "_fd", -1)
    if fd < 0 or not hasattr(os, "posix_fallocate"):
        return False
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        return False
    return True


class _Started:
    """``make()`` run in a thread from now on; :meth:`result` waits for it: (what it made, seconds it took).
    The thread lives on until :meth:`release`: processes it started are asked to die with their parent,
    and Linux sends that signal when the *thread* that started them ends."""

    def __init__(self, make: Callable[[], Any]):
        import threading

        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.finished: float | None = None  # (its time.time() once made)
        self.ready, self.done = threading.Event(), threading.Event()

        def run() -> None:
            t = time.perf_counter()
            try:
                self.value = make()
            except BaseException as e:  # noqa: BLE001 - raised by result()
                self.error = e
            self.seconds = time.perf_counter() - t
            self.finished = time.time()
            self.ready.set()
            self.done.wait()

        self.thread = threading.Thread(target=run, name="gpubatch-feed-start", daemon=True)
        self.thread.start()

    def result(self) -> tuple[Any, float]:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        return self.value, self.seconds

    def release(self) -> None:
        self.done.set()


def record_feed(ctx: Any, tasks: list[Any], batch: int, readers: int, marks: Marks, pinned: list | None = None) -> Any:
    """The GPU image unit's feed (:class:`~.feed.RecordFeed`) over ``tasks``' entries in batches of at most ``batch``,
    never across two tasks, read by ``readers`` processes (those the worker's boot started where it did:
    :func:`.feed_start.taken`), its first reads begun. With ``pinned`` (a list) its ring is page-locked for the run's
    GPU, (address, unlock) appended to it: once the GPU start's first hardware instance is made (beside that start
    the lock slowed it), its pages made first (:func:`allocated`: the lock then only maps them, outside the driver's
    lock they held it 0.25 s on 512 MiB)."""
    from . import feed_start, start
    from .feed import RecordFeed

    settings = ctx.settings
    f = RecordFeed(ctx.opener, [e for t in tasks for e in t.entries], ctx.plan, batch, workers=readers,
                   depth=max(settings.feed_depth, 8), slot_bytes=settings.feed_slot_bytes, spans=_task_spans(tasks, batch),
                   prestarted=feed_start.taken)
    try:
        if pinned is not None and allocated(f.shm):
            marks.mark("feed allocated")
        f.start()
        if pinned is not None:
            from ..device import page_lock

            marks.mark("feed readers ready")
            start.hardware_first(ctx.device.index)
            if (locked := page_lock(f.shm.buf, ctx.device.index)) is not None:
                pinned.append(locked)
                marks.mark("feed pinned")
    except BaseException:
        f.close()
        raise
    return f


def _task_spans(tasks: list[Any], batch: int) -> list[tuple[int, int]]:
    """The feed's batches over the tasks' entries laid end to end: ``batch`` entries at most, never across
    two tasks."""
    spans, pos = [], 0
    for t in tasks:
        n = len(t.entries)
        spans += [(pos + a, pos + min(a + batch, n)) for a in range(0, n, batch)]
        pos += n
    return spans


def _owners(tasks: list[Any], batch: int) -> list[tuple[Any, bool]]:
    """Per batch of :func:`_task_spans`: its task, and whether it is the task's last."""
    out = []
    for t in tasks:
        k = -(-len(t.entries) // batch)
        out += [(t, i == k - 1) for i in range(k)]
    return out

