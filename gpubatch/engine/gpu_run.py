"""The GPU executor of the run flow (:mod:`.run`): ``convert`` / ``augment`` in GPU worker processes fed
by reader processes, the outputs written in order here.

Nothing that is Python may share a process with the decoders: nvImageCodec's calls take the GIL back
once per image, so one busy Python thread beside them cuts decode several-fold (see
:mod:`gpubatch.engine.feed`). So the work is split over processes:

- this process starts ``procs`` GPU workers, takes their finished batches in dataset order and writes
  them (the writer's Python stays here);
- each GPU worker owns a :class:`~gpubatch.engine.gpu_engine.GpuEngine` (its CUDA context, decoders,
  encoder and share of the memory cap) and a :class:`~gpubatch.engine.feed.RecordFeed` whose reader
  processes read its batches, pass untouched records through, parse the JPEG headers and draw every
  output's parameters; the worker decodes batch N+1 from the feed's shared memory (a thread) while
  batch N runs through the chain and the JPEG encoder, and sends the encoded records back.

Batch ``c`` goes to worker ``c % procs`` and is split the same way whatever ``procs`` is, so the output
bytes do not depend on the number of workers. Workers start with ``spawn`` (CUDA must not be
initialised before a fork).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ErrorRouter, GpubatchError, RecordError
from ..types import Record
from . import gpu_memory as gm
from .device import Device
from .gpu_worker import WorkerFailed, _cores, _worker
from .plan import Plan
from .processes import detached_main
from .run import RecordSink, RecordSource
from .settings import Settings


def run_device(device: Device, opener: Callable[[], RecordSource], entries: list[Any], writer: RecordSink, plan: Plan,
               router: ErrorRouter, procs: int, workers: int, batch_size: int = 256,
               gpu_memory: Any = None, progress: Callable[[int], None] | None = None,
               settings: Settings | None = None, read: Callable[[Any], Any] | None = None) -> None:
    """Run ``plan`` over ``entries`` in ``procs`` GPU worker processes; write in order in this one.
    ``settings``: the engine's knobs (by default from the environment), handed to every worker.

    Under ``gpu_memory`` (a cap on what every process of the run takes on the device) the workers
    build their engines before anything is read and report what that took; this process then sizes
    batches, decoding ahead and the pools to fit the cap, for the largest image among a sample of
    headers (read with ``read``), using fewer workers where the cap cannot hold them all; below
    what one worker and one image need it refuses, naming the parts. The plan lands in
    ``router.stats.gpu_memory`` (the caller samples the run's memory: :func:`~.gpu_memory.watch`).

    One worker is the default: with the batched JPEG encoder, one outran two on an H200 (augment
    9,242 against 7,016 output images/s; benchmarks/RESULTS.md), as two CUDA contexts time-slice the GPU.
    """
    import multiprocessing as mp
    from multiprocessing.shared_memory import SharedMemory

    from .executor import default_readers
    from .feed import fit_slots, shm_free
    from .registry import DEVICE
    from .run import write_results

    plan.validate(DEVICE)
    settings = settings or Settings.from_env()
    stats = router.stats
    ctx = mp.get_context("spawn")
    chunks = [entries[i : i + batch_size] for i in range(0, len(entries), batch_size)]
    procs = max(1, min(procs, len(chunks)))
    # cores: the decoders' and the encoder's threads in each worker, then its reader processes
    threads = max(2, workers // procs)
    feed_workers = default_readers(max(1, _cores() // procs), settings=settings)
    stop = ctx.Event()
    queues = [ctx.Queue(maxsize=settings.queue_depth) for _ in range(procs)]
    returns = [ctx.Queue() for _ in range(procs)]
    slot_bytes = fit_slots(settings.out_slots * procs, settings.out_slot_bytes)
    if slot_bytes < settings.out_slot_bytes:
        stats.warn(f"shared memory (/dev/shm) has {shm_free() >> 20} MiB free: batches travel pickled, which is "
                   "slower; give it more (a container's --shm-size)")
    t_start = time.perf_counter()
    rings: list[Any] = []
    children: list[Any] = []
    capped = gpu_memory is not None
    controls = [ctx.Queue() for _ in range(procs)] if capped else [None] * procs

    def start() -> None:
        with detached_main():  # (a caller's script without a __main__ guard is not run again in the workers)
            start_workers()

    def start_workers() -> None:
        for k in range(procs):
            rings.append(SharedMemory(create=True, size=settings.out_slots * slot_bytes))
            mine = None if capped else [e for chunk in chunks[k::procs] for e in chunk]
            p = ctx.Process(target=_worker, name=f"gpubatch-gpu{k}",
                            args=(device.index, opener, plan, mine, batch_size, feed_workers, threads,
                                  gpu_memory, procs, queues[k], stop, rings[k].name, slot_bytes, returns[k],
                                  settings, controls[k]))
            p.start()
            children.append(p)

    def fit_cap() -> list[Any]:
        """The workers' reports, the plan per worker that fits the cap, the entries handed out: the
        chunks of the planned batch. Workers beyond those the cap holds are let go."""
        nonlocal chunks, procs
        ready = [receive(k) for k in range(procs)]
        for msg in ready:
            if isinstance(msg, WorkerFailed):
                raise GpubatchError(f"a GPU worker process failed:\n{msg.message}" if msg.crash else msg.message)
        need = gm.sample_need(read, entries, plan) if read is not None else gm.image_need(*gm.DEFAULT_IMAGE)
        total = sum(msg.cap for msg in ready)
        refusal: gm.CapTooSmall | None = None
        for p in range(procs, 0, -1):
            try:
                plans = [gm.plan_memory(total // p, msg.fixed, msg.parts, need, batch_size, spec=str(gpu_memory))
                         for msg in ready[:p]]
                break
            except gm.CapTooSmall as e:
                refusal = refusal or e
        else:
            raise GpubatchError(str(refusal))
        if p < procs:
            stats.warn(f"--gpu-memory {gpu_memory}: room for {p} of {procs} GPU worker processes")
        batch = min(mp_.batch for mp_ in plans)
        chunks = [entries[i : i + batch] for i in range(0, len(entries), batch)]
        for k in range(procs):
            controls[k].put(([e for chunk in chunks[k::p] for e in chunk], batch, plans[k]) if k < p else None)
        procs = p
        return plans

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
            if isinstance(msg, WorkerFailed):
                raise GpubatchError(f"a GPU worker process failed:\n{msg.message}" if msg.crash else msg.message)
            out, slot = msg.records, msg.slot
            if slot is not None:  # make the files whose data the worker left in its output ring
                k = c % procs
                view = rings[k].buf[slot * slot_bytes : (slot + 1) * slot_bytes]
                out = [r.with_(data=r.data.assemble(view)) if isinstance(r, Record) and not isinstance(r.data, bytes)
                       else r for r in out]
                view.release()
                returns[k].put(slot)
            stats.add(**msg.counts)
            stats.drawn.update(msg.drawn)
            for name, v in msg.timings.items():
                stats.timed(name, v)
            yield from out

    try:
        start()
        if capped:
            plans = fit_cap()
            stats.gpu_memory.update(cap_mib=sum(p.cap for p in plans) >> 20, processes=len(plans),
                                    plan=plans[0].describe())
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
