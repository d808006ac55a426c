"""A GPU worker process of ``convert`` and ``augment``: its batches through feed -> decode -> chain ->
encode, the encoded records sent back to the writing process (:mod:`.gpu_run`).
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GpubatchError, RecordError, RunStats, Stage
from ..types import Record
from .gpu_engine import GpuEngine
from .plan import Plan
from .run import RecordSource
from .settings import Settings
from .windows import fed_windows


def transform_fed(engine: GpuEngine, plan: Plan, fed: Any, res: Any, stats: Any,
                  sink: Any = None) -> list[Record | RecordError]:
    """The outputs of one :class:`~gpubatch.engine.feed.FedRecords` batch, in order: its jobs run through
    the chain and are encoded from the decoded sources ``res``; a record that failed to decode gives one
    error however many variants it has. Each job's parameters come from :meth:`~.run.Job.settle`: those
    the feed drew for the source's header size where the decoded size matches, else drawn here. With a ``sink``
    (:class:`~gpubatch.engine.codecs.jpeg_gpu.Sink`) JPEG records hold an ``EncodedSpan`` of it as data."""
    res.order(engine.stream)  # this batch's kernels wait for its decode, and no later one's
    out: list[Any] = list(fed.results)
    where = {r: pos for pos, r in enumerate(out) if isinstance(r, int)}
    rows: list[int] = []
    arrays, params, jobs, redrawn = [], [], [], []
    failed: set[int] = set()
    dropped = 0
    for j, job in enumerate(fed.jobs):
        pos = where[j]
        a = res.arrays[job.source]
        if a is None:
            out[pos] = None
            if job.source not in failed:  # one error per source record, not one per variant
                failed.add(job.source)
                key, origin = fed.sources[job.source]
                out[pos] = RecordError(key, origin, Stage.DECODE, res.errors[job.source] or "decode failed")
            continue
        t = job.template
        hw = (int(a.shape[0]), int(a.shape[1]))
        again = job.size != hw  # the header said otherwise (or nothing): drawn for the decoded size
        try:
            drawn, boxes, d = job.settle(plan, *hw)
        except Exception as e:  # noqa: BLE001 - the record boundary: an op too large, hostile boxes
            out[pos] = RecordError(t.key, t.origin, Stage.TRANSFORM, f"{e}")
            continue
        try:
            plan.check_encodable(plan.out_codec(t.codec), *plan.out_hw(hw[0], hw[1], drawn))
        except ValueError as e:
            out[pos] = RecordError(t.key, t.origin, Stage.ENCODE, str(e))
            continue
        if again:
            redrawn.append(len(rows))
        dropped += d
        if plan.augmenting:
            stats.drawn[t.key] = drawn
        rows.append(j)
        arrays.append(a)
        params.append(drawn)
        jobs.append((pos, t, boxes))
    if dropped:
        stats.add(boxes_dropped=dropped)
    stats.add(fallbacks=res.fallbacks)
    if rows:
        first = fed_windows(plan.ops, fed.windows, rows, redrawn, params, arrays)
        encoded = _resample_encode(engine, plan, [t.codec for _, t, _ in jobs], arrays, params, first, sink)
        done = 0
        for (pos, t, boxes), data in zip(jobs, encoded):
            if isinstance(data, str):
                out[pos] = RecordError(t.key, t.origin, Stage.ENCODE, data)
                continue
            out[pos] = t.with_(data=data, codec=plan.out_codec(t.codec), boxes=boxes)
            done += 1
        stats.add(transcoded=done)
    return [r for r in out if r is not None]


def _resample_encode(engine: GpuEngine, plan: Plan, codecs: list[str], arrays: list, params: list,
                     first: tuple[np.ndarray, np.ndarray] | None = None, sink: Any = None) -> list:
    """Run the chain (``first``: its leading windows, already folded) then encode, in output order
    (bytes, or why the encoder failed); a batch that does not fit the memory cap is split in halves."""
    from .batch import Ragged
    from .gpu_chain import run_chain

    cp = engine.cp
    try:
        dev = run_chain(engine, plan.ops, Ragged.from_items(cp, arrays), params, first=first)
        results: list[Any] = [None] * len(dev)
        by_codec: dict[str, list[int]] = {}
        for k, c in enumerate(codecs):
            by_codec.setdefault(plan.out_codec(c), []).append(k)
        for codec, idx in by_codec.items():
            enc = engine.encoder.encode_batch(dev, idx, codec, plan.jpeg_quality, engine.stream, sink)
            for k, data in zip(idx, enc):
                results[k] = data if data is not None else f"the GPU {codec} encoder failed"
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


class _Stopped(Exception):
    pass


def _put(q: Any, stop: Any, msg: Any) -> None:
    while True:
        try:
            q.put(msg, timeout=0.5)
            return
        except queue.Full:
            if stop.is_set():
                q.cancel_join_thread()  # the writer is gone: exit without flushing to it
                raise _Stopped from None


def _free_slot(free: list[int], returns: Any, stop: Any) -> int:
    """An output slot the writer has handed back (waits for one when all are in flight)."""
    while True:
        try:
            while True:
                free.append(returns.get_nowait())
        except queue.Empty:
            pass
        if free:
            return free.pop()
        try:
            free.append(returns.get(timeout=0.5))
        except queue.Empty:
            if stop.is_set():
                raise _Stopped from None


@dataclass
class WorkerBatch:
    """A worker's finished batch, as the writing process receives it.

    Attributes:
        records: the batch's outputs in order (Record or RecordError); JPEG data may be an
            :class:`~gpubatch.engine.codecs.jpeg_gpu.EncodedSpan` of output slot ``slot``.
        drawn: output key -> the parameters drawn for it (augment runs).
        counts: RunStats counters of the batch.
        timings: seconds per stage of the batch.
        slot: the output slot holding its encoded data, or None.
    """

    records: list[Record | RecordError]
    drawn: dict[str, Any]
    counts: dict[str, int]
    timings: dict[str, float]
    slot: int | None


@dataclass
class WorkerReady:
    """A worker under ``--gpu-memory`` has built its engine: ``fixed`` bytes on the device (context,
    decoders, encoder, kernels; from NVML), by part in MiB; ``cap``: its share of the cap, bytes."""

    fixed: int
    parts: dict[str, int]
    cap: int


def _take(q: Any, stop: Any) -> Any:
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            if stop.is_set():
                raise _Stopped from None


@dataclass
class WorkerFailed:
    """A worker's end: a GpubatchError's one line, or (``crash``) a traceback."""

    message: str
    crash: bool = False


def _worker(device_index: int, opener: Callable[[], RecordSource], plan: Plan, entries: list[Any], batch_size: int,
            feed_workers: int, threads: int, gpu_memory: Any, procs: int, out: Any, stop: Any,
            out_shm: str, slot_bytes: int, returns: Any, settings: Settings, control: Any = None) -> None:
    """One GPU worker process: its batches through feed -> decode -> chain -> encode -> ``out``.

    Encoded JPEG data goes straight from the device into a slot of the ``out_shm`` ring (the records
    sent hold :class:`~gpubatch.engine.codecs.jpeg_gpu.EncodedSpan` values): pickling the bytes instead
    cost this process 13-20% of its throughput (the worker study (docs/engine.md) ``--pickle``). The writer
    hands a slot back through ``returns`` once it has made the files.

    With ``control`` (a run under ``--gpu-memory``) the worker reads nothing at first: it builds its
    engine, sends :class:`WorkerReady` with what that took on the device, and takes ``(entries,
    batch_size, plan)`` (:class:`~.gpu_memory.MemoryPlan`) or None (not needed) from ``control``."""
    from multiprocessing.shared_memory import SharedMemory

    import numpy as np

    from . import affinity
    from .codecs.jpeg_gpu import Sink
    from .device import Device, DeviceKind
    from .feed import RecordFeed
    from .gpu_engine import decode_ahead

    feed = engine = unpin = None
    shm = SharedMemory(name=out_shm)
    free = list(range(settings.out_slots))
    try:
        t0 = time.perf_counter()
        # the decode route follows this worker's share of the cores, not their load, so written bytes do not
        # vary with what else runs (counted before the reservation below narrows this thread's cores)
        route_cores = _cores() / procs
        # the hardware decoder's thread gets a core of its own, which the reader processes started below leave
        cores = affinity.reserve(device_index, settings) if procs == 1 else None
        ahead = 2

        def start_feed(entries: list[Any], batch: int) -> RecordFeed:
            f = RecordFeed(opener, entries, plan, batch, workers=feed_workers, depth=settings.feed_depth,
                           slot_bytes=settings.feed_slot_bytes)
            f.start()
            return f

        def make_engine(preallocate: tuple[int, int, int] | None, route: str | None = None) -> GpuEngine:
            return GpuEngine(Device(DeviceKind.GPU, device_index, reason="worker"), threads, gpu_memory,
                             share=procs, deterministic=True, cores=cores,  # written bytes must not vary
                             hw_preallocate=preallocate, route_cores=route_cores, decode_route=route,
                             settings=settings)

        if control is None:
            feed = start_feed(entries, batch_size)  # the reader processes start up while CUDA does
            # the hardware decoder's buffers reserved for a batch of 640x640 images up front: transcode ran at
            # 9,675-10,125 images/s with them against 8,597-9,085 without (the worker study (docs/engine.md))
            engine = make_engine((batch_size, settings.hw_preallocate, settings.hw_preallocate))
            gpu_init = time.perf_counter() - t0
            warm = engine.warm_up(batch_size, encoder=True)  # while the reader processes start and read
        else:
            # under --gpu-memory: the engine first, what it took measured and sent to the writing process,
            # which answers with this worker's entries and the batch the cap leaves room for (or None)
            # the hardware route (unless one is named): it gives the decoders their images by kind, not by
            # a share of each batch, so the bytes written do not depend on the batch the cap leaves room for
            engine = make_engine(None, "hardware" if settings.decode_route == "auto" else None)
            gpu_init = time.perf_counter() - t0
            warm = engine.warm_up(16, encoder=True)  # a small batch: its buffers come before the cap is planned
            fixed, parts = engine.fixed_memory()
            _put(out, stop, WorkerReady(fixed, parts, engine.cap))
            got = _take(control, stop)
            if got is None:
                return
            entries, batch_size, mem_plan = got
            engine.apply(mem_plan)
            ahead = mem_plan.ahead
            feed = start_feed(entries, batch_size)
        # the decoders copy encoded bytes straight from the ring by DMA (GpuEngine.pin_host); a slot then
        # goes back only once this process's stream is past the batch (below)
        unpin = engine.pin_host(feed.shm.buf) if settings.pin_feed else None
        tm = {"read_wait": 0.0, "decode": 0.0, "decode_wait": 0.0}
        first = {"gpu_init": gpu_init, "warm_up": warm}

        def decode(fed: Any) -> Any:
            return engine.decoder.decode(fed.blobs, engine.stream, plan.max_pixels, order=False, headers=fed.headers,
                                         wait=False)

        seen = dict(tm)
        for fed, res in decode_ahead(decode, feed, ahead, tm, device_index):
            if stop.is_set():
                out.cancel_join_thread()
                return
            stats = RunStats()
            slot = _free_slot(free, returns, stop)
            sink = Sink(np.frombuffer(shm.buf, np.uint8, slot_bytes, slot * slot_bytes))
            t1 = time.perf_counter()
            done = transform_fed(engine, plan, fed, res, stats, sink)
            waited = res.waited  # transform_fed waited this long for the decoders' threads first
            tm["decode_wait"] += waited
            if sink.pos == 0:  # nothing went into the slot (no JPEG, or a batch too big for it)
                free.append(slot)
                slot = None
            del sink
            del res  # the decoded images go once the kernels reading them are done
            if unpin is not None:  # the GPU may still be copying this batch's bytes (in practice the encode waited)
                engine.stream.synchronize()
            fed.done()  # the source bytes (views of the feed's shared memory) are no longer read
            timings = {k: v - seen[k] for k, v in tm.items()}
            seen = dict(tm)
            timings.update(first, **{"ops+encode": time.perf_counter() - t1 - waited, "read (feed workers)": fed.seconds})
            first = {}
            counts = {**fed.counts, **{k: getattr(stats, k) for k in ("transcoded", "fallbacks", "boxes_dropped")}}
            _put(out, stop, WorkerBatch(done, stats.drawn, counts, timings, slot))
    except _Stopped:
        return
    except BaseException as e:  # noqa: BLE001 - the parent reports it; nothing else would see it
        msg = WorkerFailed(str(e)) if isinstance(e, GpubatchError) else WorkerFailed(traceback.format_exc(), True)
        try:
            _put(out, stop, msg)
        except _Stopped:
            pass
    finally:
        if engine is not None:
            if unpin is not None:
                unpin()
            engine.close()
        if feed is not None:
            feed.close()
        try:
            shm.close()
        except BufferError:  # a slot view is still referenced: the mapping goes with the process
            shm.close = lambda: None  # type: ignore[method-assign]




def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
