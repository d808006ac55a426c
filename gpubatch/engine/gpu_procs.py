"""``convert`` / ``augment`` on the GPU: GPU worker processes fed by reader processes, written in order here.

Nothing that is Python may share a process with the decoders: nvImageCodec's calls take the GIL back
once per image, so one busy Python thread beside them cuts decode several-fold (see
:mod:`gpubatch.engine.feed`). So the work is split over processes:

- this process starts ``procs`` GPU workers, takes their finished batches in dataset order and writes
  them (the writer's Python stays here);
- each GPU worker owns a :class:`~gpubatch.engine.gpu_executor.GpuEngine` (its CUDA context, decoders,
  encoder and share of the memory cap) and a :class:`~gpubatch.engine.feed.RecordFeed` whose reader
  processes read its batches, pass untouched records through, parse the JPEG headers and draw every
  output's parameters; the worker decodes batch N+1 from the feed's shared memory (a thread) while
  batch N runs through the chain and the JPEG encoder, and sends the encoded records back.

Batch ``c`` goes to worker ``c % procs`` and is split the same way whatever ``procs`` is, so the output
bytes do not depend on the number of workers. Workers start with ``spawn`` (CUDA must not be
initialised before a fork).
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import ErrorRouter, GpubatchError, RecordError, RunStats
from ..formats.base import Writer
from ..types import Record
from .device import Device
from .plan import Plan

QUEUE_DEPTH = 3  # finished batches a worker may have waiting for the writer
OUT_SLOTS = QUEUE_DEPTH + 2  # output slots: the queued batches, the one being written, the one being made
OUT_SLOT_BYTES = 32 << 20  # a batch's encoded JPEG data; a batch that does not fit travels pickled
FEED_DEPTH = 4  # batches a worker's reader processes prepare ahead
HW_PREALLOCATE = 640  # height and width the hardware decoder's buffers are reserved for


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Stopped(Exception):
    pass


def _put(q: Any, stop: Any, msg: tuple) -> None:
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


def _worker(device_index: int, src: str, fmt: str, plan: Plan, entries: list[Any], batch_size: int,
            feed_workers: int, threads: int, gpu_memory: Any, procs: int, out: Any, stop: Any,
            out_shm: str, slot_bytes: int, returns: Any) -> None:
    """One GPU worker process: its batches through feed -> decode -> chain -> encode -> ``out``.

    Encoded JPEG data goes straight from the device into a slot of the ``out_shm`` ring (the records
    sent hold :class:`~gpubatch.engine.codecs.jpeg_gpu.EncodedSpan` values): pickling the bytes instead
    cost this process 13-20% of its throughput (benchmarks/worker_study.py ``--pickle``). The writer
    hands a slot back through ``returns`` once it has made the files."""
    from multiprocessing.shared_memory import SharedMemory

    import numpy as np

    from . import affinity
    from .codecs.jpeg_gpu import Sink
    from .device import Device, DeviceKind
    from .feed import RecordFeed
    from .gpu_executor import GpuEngine, decode_ahead, pin_feed, transform_fed

    feed = engine = unpin = None
    shm = SharedMemory(name=out_shm)
    free = list(range(OUT_SLOTS))
    try:
        t0 = time.perf_counter()
        # the decode route follows this worker's share of the cores, not their load, so written bytes do not
        # vary with what else runs (counted before the reservation below narrows this thread's cores)
        route_cores = _cores() / procs
        # the hardware decoder's thread gets a core of its own, which the reader processes started below leave
        cores = affinity.reserve(device_index) if procs == 1 else None
        feed = RecordFeed(src, fmt, entries, plan, batch_size, workers=feed_workers, depth=FEED_DEPTH)
        feed.start()  # the reader processes start up while CUDA does
        # the hardware decoder's buffers reserved for a batch of 640x640 images up front: transcode ran at
        # 9,675-10,125 images/s with them against 8,597-9,085 without (benchmarks/worker_study.py)
        engine = GpuEngine(Device(DeviceKind.GPU, device_index, reason="worker"), threads, gpu_memory,
                           share=procs, deterministic=True, cores=cores,  # written bytes must not vary
                           hw_preallocate=(batch_size, HW_PREALLOCATE, HW_PREALLOCATE), route_cores=route_cores)
        gpu_init = time.perf_counter() - t0
        # the decoders copy encoded bytes straight from the ring by DMA (GpuEngine.pin_host); a slot then
        # goes back only once this process's stream is past the batch (below)
        unpin = engine.pin_host(feed.shm.buf) if pin_feed() else None
        warm = engine.warm_up(batch_size, encoder=True)  # while the reader processes start and read
        tm = {"read_wait": 0.0, "decode": 0.0, "decode_wait": 0.0}
        first = {"gpu_init": gpu_init, "warm_up": warm}

        def decode(fed: Any) -> Any:
            return engine.decoder.decode(fed.blobs, engine.stream, plan.max_pixels, order=False, headers=fed.headers,
                                         wait=False)

        seen = dict(tm)
        for fed, res in decode_ahead(decode, feed, 2, tm, device_index):
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
            _put(out, stop, ("batch", done, stats.drawn, counts, timings, slot))
    except _Stopped:
        return
    except BaseException as e:  # noqa: BLE001 - the parent reports it; nothing else would see it
        msg = ("error", str(e)) if isinstance(e, GpubatchError) else ("crash", traceback.format_exc())
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


def run_device(device: Device, src: Path, fmt: str, entries: list[Any], writer: Writer, plan: Plan,
               router: ErrorRouter, procs: int, workers: int, batch_size: int = 256,
               gpu_memory: Any = None, progress: Callable[[int], None] | None = None) -> None:
    """Run ``plan`` over ``entries`` in ``procs`` GPU worker processes; write in order in this one.

    One worker is the default: with the batched JPEG encoder, one outran two on an H200 (augment
    9,242 against 7,016 output images/s; benchmarks/RESULTS.md), as two CUDA contexts time-slice the GPU.
    """
    import multiprocessing as mp
    from multiprocessing.shared_memory import SharedMemory

    from .executor import default_readers, write_results
    from .feed import fit_slots, shm_free
    from .registry import DEVICE

    plan.validate(DEVICE)
    stats = router.stats
    ctx = mp.get_context("spawn")
    chunks = [entries[i : i + batch_size] for i in range(0, len(entries), batch_size)]
    procs = max(1, min(procs, len(chunks)))
    # cores: the decoders' and the encoder's threads in each worker, then its reader processes
    threads = max(2, workers // procs)
    feed_workers = default_readers(max(1, _cores() // procs))
    stop = ctx.Event()
    queues = [ctx.Queue(maxsize=QUEUE_DEPTH) for _ in range(procs)]
    returns = [ctx.Queue() for _ in range(procs)]
    slot_bytes = fit_slots(OUT_SLOTS * procs, OUT_SLOT_BYTES)
    if slot_bytes < OUT_SLOT_BYTES:
        stats.warn(f"shared memory (/dev/shm) has {shm_free() >> 20} MiB free: batches travel pickled, which is "
                   "slower; give it more (a container's --shm-size)")
    t_start = time.perf_counter()
    rings: list[Any] = []
    children: list[Any] = []

    def start() -> None:
        for k in range(procs):
            rings.append(SharedMemory(create=True, size=OUT_SLOTS * slot_bytes))
            mine = [e for chunk in chunks[k::procs] for e in chunk]
            p = ctx.Process(target=_worker, name=f"gpubatch-gpu{k}",
                            args=(device.index, str(src), fmt, plan, mine, batch_size, feed_workers, threads,
                                  gpu_memory, procs, queues[k], stop, rings[k].name, slot_bytes, returns[k]))
            p.start()
            children.append(p)

    def receive(k: int) -> tuple:
        while True:
            try:
                return queues[k].get(timeout=1.0)
            except queue.Empty:
                if not children[k].is_alive():
                    raise GpubatchError(f"GPU worker process {k} ended unexpectedly (exit code "
                                        f"{children[k].exitcode})") from None

    def results() -> Iterator[Record | RecordError]:
        for c in range(len(chunks)):
            msg = receive(c % procs)
            if c == 0:
                stats.timed("start (to the first batch)", time.perf_counter() - t_start)
            if msg[0] == "error":
                raise GpubatchError(msg[1])
            if msg[0] == "crash":
                raise GpubatchError(f"a GPU worker process failed:\n{msg[1]}")
            _, out, drawn, counts, timings, slot = msg
            if slot is not None:  # make the files whose data the worker left in its output ring
                k = c % procs
                view = rings[k].buf[slot * slot_bytes : (slot + 1) * slot_bytes]
                out = [r.with_(data=r.data.assemble(view)) if isinstance(r, Record) and not isinstance(r.data, bytes)
                       else r for r in out]
                view.release()
                returns[k].put(slot)
            stats.add(**counts)
            stats.drawn.update(drawn)
            for name, v in timings.items():
                stats.timed(name, v)
            yield from out

    try:
        start()
        write_results(results(), writer, router, progress)
    finally:
        stop.set()
        for p in children:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
        for ring in rings:
            ring.close()
            ring.unlink()
