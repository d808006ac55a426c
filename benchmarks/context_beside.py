#!/usr/bin/env python3
"""A CUDA context made in a spawned process (as a GPU worker's start makes it, through the driver) while its parent
does something else at once: whether the command's own device probe (``cuInit``, gpubatch's ``gpu_problem``) or its
imports slow the worker's context.

    python3 benchmarks/context_beside.py MODE      # one fresh process a run; run each mode a few times, in turn

Modes: ``none`` (the parent waits), ``probe`` (the parent's ``cuInit`` and device count at once), ``probe-at-S``
(the same after S seconds), ``probe-late`` (after 0.4 s), ``gpubatch-probe`` (``engine.device.gpu_problem(0)``),
``imports`` (NumPy, click, rich, ``gpubatch.api`` and ``gpubatch.runner``). Prints the child's (start, ``cuInit``,
context) seconds and the parent's part. Found (H200, 2026-12-04, benchmarks/RESULTS.md "16:56 to 17:29"): the context
took 0.10-0.13 s in every mode; the parent's probe made the child's ``cuInit`` shorter, not longer.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def child(q, t0):
    t = time.time()
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    t1 = time.time()
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    t2 = time.time()
    q.put((round(t - t0, 3), round(t1 - t, 3), round(t2 - t1, 3)))


def probe():
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    n = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(n))


if __name__ == "__main__":
    mode = sys.argv[1]
    t0 = time.time()
    spawn = mp.get_context("spawn")
    q = spawn.Queue()
    p = spawn.Process(target=child, args=(q, t0))
    p.start()
    tp = time.time()
    if mode == "probe":
        probe()
    elif mode.startswith("probe-at-"):
        time.sleep(float(mode[9:]))
        probe()
    elif mode == "probe-late":
        time.sleep(0.4)
        probe()
    elif mode == "gpubatch-probe":
        from gpubatch.engine.device import gpu_problem
        gpu_problem(0)
    elif mode == "imports":
        import click  # noqa: F401
        import numpy  # noqa: F401
        import rich.console  # noqa: F401

        import gpubatch.api  # noqa: F401
        import gpubatch.runner  # noqa: F401
    took = round(time.time() - tp, 3)
    got = q.get()
    p.join()
    print(mode, "child (start, cuInit, context):", got, "parent's part:", took, flush=True)
