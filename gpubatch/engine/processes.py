"""Processes of a run: the worker pools that CPU paths start (one BLAS thread each, freed memory kept)
and this process's allocator. Light on purpose: the command line imports it at start."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
# glibc's malloc: arrays up to 32 MiB from the heap, kept when freed, instead of a fresh mmap (and its
# page faults) for every array above 128 KiB
_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def keep_freed_memory() -> bool:
    """In this process, glibc's malloc keeps freed memory for the next arrays (what ``_MALLOC`` asks of
    worker processes, set through ``mallopt`` in a running one): per-record arrays above 128 KiB then
    stop costing a fresh ``mmap`` and its page faults each (a one-thread CPU convert to log-mel: 0.651 ->
    0.357 s, benchmarks/audio_cpu.py). The command line calls it for its own process; a library never
    changes its caller's allocator. False where the C library has no ``mallopt`` (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))


@contextlib.contextmanager
def _worker_env() -> Iterator[None]:
    """Processes started inside get the workers' settings (one BLAS thread, freed memory kept) in their
    environment; this process's own is left as it was."""
    saved = {k: os.environ.get(k) for k in (*_ONE_THREAD, *_MALLOC)}
    os.environ.update(dict.fromkeys(_ONE_THREAD, "1"))
    os.environ.update(_MALLOC)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def single_threaded_pool(workers: int) -> Any:
    """A spawn-started process pool whose workers run NumPy's BLAS and FFT on one thread each (a process
    a core already: 16 processes each starting 16 BLAS threads oversubscribe the cores), and reuse freed
    memory for their per-record arrays (an audio record's frames and spectra: 6.11 -> 3.75 ms an
    audio-clf record on one CI core, benchmarks/audio_cpu.py). The workers are started at once, with these settings in their environment only."""
    import multiprocessing as mp
    import time
    from concurrent.futures import ProcessPoolExecutor

    with _worker_env():
        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
        for f in [pool.submit(time.sleep, 0.2) for _ in range(workers)]:  # none idle: every worker starts now
            f.result()
    return pool


def worker_processes(target: Any, args: tuple, count: int) -> list[Any]:
    """``count`` spawn-started daemon processes running ``target(*args)``, with the pools' settings (one
    BLAS thread, freed memory kept) in their environment only."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with _worker_env():
        procs = [ctx.Process(target=target, args=args, daemon=True, name=f"gpubatch-worker-{i}") for i in range(count)]
        for p in procs:
            p.start()
    return procs
