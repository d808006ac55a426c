"""``convert`` / ``augment`` on the GPU from several worker processes.

One Python process cannot keep a GPU busy on this work: reading, JPEG header parsing, parameter draws
and record building are Python, and every decoder call needs the GIL back to hand its results on, so
the GPU stage runs at the pace of the busiest Python thread (benchmarks/RESULTS.md has the figures).
Here each worker process owns a GpuEngine (its own CUDA context, decoders, encoder and memory cap) and
its own reader over the source: the parent sends batches of *entries* (names, offsets), a worker reads,
decodes, transforms and encodes them and sends the finished records back, and the parent writes them in
dataset order. Workers start with ``spawn`` (CUDA must not be initialised before a fork).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import ErrorRouter, RecordError, RunStats
from ..formats.base import Writer
from ..types import Record
from .device import Device
from .plan import Plan

_W: dict[str, Any] = {}
_COUNTS = ("records_in", "bytes_in", "passthrough", "transcoded", "fallbacks", "boxes_dropped")


def auto_procs(entries: int, batch_size: int) -> int:
    """Worker processes for a run: one per 4 cores, at most 2, and no more than the batches justify.

    Two doubled augment throughput on an H200; four were slower than two, as the processes' CUDA
    contexts time-slice the GPU (benchmarks/RESULTS.md).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(2, cores // 4, -(-entries // (2 * batch_size))))


def _init(device_index: int, src: str, fmt: str, plan: Plan, threads: int, gpu_memory: Any, procs: int) -> None:
    from ..formats import open_reader
    from .device import Device, DeviceKind
    from .gpu_executor import GpuEngine

    reader = open_reader(Path(src), fmt)
    reader.entries()  # the reader's own scan sets up shard handles the entries refer to
    device = Device(DeviceKind.GPU, device_index, reason="worker")
    _W.update(reader=reader, plan=plan, engine=GpuEngine(device, threads, gpu_memory, share=procs, deterministic=True))


def _work(entries: list[Any]) -> tuple[list[Any], dict[str, Any], dict[str, int], dict[str, float]]:
    import time

    from .executor import read_counted
    from .gpu_executor import _transform_batch

    stats = RunStats()
    t0 = time.perf_counter()
    batch = [read_counted(_W["reader"], e, stats) for e in entries]
    stats.timed("read", time.perf_counter() - t0)
    out = _transform_batch(_W["engine"], _W["plan"], batch, stats)
    return out, stats.drawn, {k: getattr(stats, k) for k in _COUNTS}, stats.timings


def run_device_procs(device: Device, src: Path, fmt: str, entries: list[Any], writer: Writer, plan: Plan,
                     router: ErrorRouter, procs: int, workers: int, batch_size: int = 256,
                     gpu_memory: Any = None, progress: Callable[[int], None] | None = None) -> None:
    """Run ``plan`` over ``entries`` in ``procs`` GPU worker processes; write in order in this one."""
    import multiprocessing as mp

    from .executor import write_results

    stats = router.stats
    threads = max(2, workers // procs)
    pool = ProcessPoolExecutor(max_workers=procs, mp_context=mp.get_context("spawn"), initializer=_init,
                               initargs=(device.index, str(src), fmt, plan, threads, gpu_memory, procs))
    chunks = [entries[i : i + batch_size] for i in range(0, len(entries), batch_size)]

    def results() -> Iterator[Record | RecordError]:
        pending: deque[Future] = deque()
        it = iter(chunks)
        for chunk in it:
            pending.append(pool.submit(_work, chunk))
            if len(pending) >= 2 * procs:
                break
        while pending:
            out, drawn, counts, timings = pending.popleft().result()
            for chunk in it:
                pending.append(pool.submit(_work, chunk))
                break
            stats.add(**counts)
            stats.drawn.update(drawn)
            for k, v in timings.items():
                stats.timed(k, v)
            yield from out

    try:
        write_results(results(), writer, router, progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

