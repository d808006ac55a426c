#!/usr/bin/env python3
"""Where the CPU path's time goes: per-image stage costs of the train chain, and how results get back
from the worker processes (pickled through the pool's pipes, or through shared memory as now).

    python3 benchmarks/cpu_study.py [--images 512] [--workers N] [--repeats 3] [--batches 16]

Data: the synthetic mixed JPEG set (``gpubatch.synthetic``), generated under --data. Stage costs are
milliseconds per image in this process (median of --repeats passes); transfer figures are images/s
with --workers processes (median of --repeats passes after one warm-up pass); pipeline figures are
images/s over --batches batches of 256 after 4 untimed ones, with the CPU cores used.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _data import ROOT  # noqa: F401  (puts the project on sys.path)


def _result_array(_: bytes):
    import numpy as np

    return np.zeros((3, 224, 224), np.float16)  # one train-chain result


def _result_none(_: bytes) -> None:
    return None


def per_image_ms(fn, items, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i, x in enumerate(items):
            fn(i, x)
        runs.append(1e3 * (time.perf_counter() - t) / len(items))
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=16, help="timed batches of the pipeline runs")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "gpubatch-cpu-study")
    a = ap.parse_args()

    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import numpy as np

    from gpubatch.engine.codecs import image as host
    from gpubatch.engine.gpu_executor import (
        ImagePipeline,
        _cpu_chain_chunk,
        _cpu_chain_one,
        _take_chunk,
        cpu_chunk,
    )
    from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop
    from gpubatch.engine.ops.normalize import _values, normalize_cpu
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.registry import HOST, get_kernel
    from gpubatch.synthetic import make_jpeg_set

    src = make_jpeg_set(a.data / f"jpeg-{a.images}", a.images)
    files = sorted(src.rglob("*.jpg"))[: a.images]
    blobs = [f.read_bytes() for f in files]
    keys = [f.stem for f in files]
    ops = (RandomResizedCrop(224), Flip(), Normalize(layout="CHW", dtype="float16"))
    plan = Plan(ops=ops, seed=0)
    print(f"{a.images} images, {a.workers} worker processes, {os.cpu_count()} cores")

    # 1. per-image stage costs in this process
    pixels = [host.decode(b) for b in blobs]
    crop = [get_kernel(ops[0].name, HOST)(ops[0], [p], [plan.draw(k, *p.shape[:2])[0]])[0]
            for p, k in zip(pixels, keys)]
    norm = ops[2]
    print(f"decode                      {per_image_ms(lambda i, b: host.decode(b), blobs, a.repeats):6.2f} ms/image")
    print(f"random resized crop 224     {per_image_ms(lambda i, p: get_kernel(ops[0].name, HOST)(ops[0], [p], [plan.draw(keys[i], *p.shape[:2])[0]]), pixels, a.repeats):6.2f} ms/image")
    print(f"normalize, table (now)      {per_image_ms(lambda i, c: normalize_cpu(c, norm), crop, a.repeats):6.2f} ms/image")
    print(f"normalize, per-pixel float64 {per_image_ms(lambda i, c: np.ascontiguousarray(_values(c, norm).transpose(2, 0, 1)), crop, a.repeats):5.2f} ms/image")
    print(f"whole chain, one image      {per_image_ms(lambda i, b: _cpu_chain_one(plan, b, keys[i]), blobs, a.repeats):6.2f} ms/image")

    # 2. results back from worker processes: pickled (pool.map) or through shared memory (chunks)
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    step = max(1, 256 // (4 * a.workers))  # the CPU path's chunks before cpu_chunk()
    with ProcessPoolExecutor(a.workers, mp_context=ctx) as pool:
        def pickled() -> None:
            for s in range(0, len(blobs), 256):
                list(pool.map(_cpu_chain_one, [plan] * len(blobs[s : s + 256]), blobs[s : s + 256],
                              keys[s : s + 256], chunksize=step))

        def shared(chunk: int = step) -> None:
            for s in range(0, len(blobs), 256):
                futs = [pool.submit(_cpu_chain_chunk, plan, blobs[c : c + chunk], keys[c : c + chunk])
                        for c in range(s, min(s + 256, len(blobs)), chunk)]
                [r for f in futs for r in _take_chunk(*f.result())]

        def shared_even() -> None:
            shared(cpu_chunk(256, a.workers))

        for name, task in (("nothing", _result_none), ("a 224x224 fp16 array", _result_array)):
            list(pool.map(task, blobs, chunksize=step))
            runs = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                list(pool.map(task, blobs, chunksize=step))
                runs.append(1e3 * (time.perf_counter() - t) / len(blobs))
            print(f"pool.map returning {name:22s} {statistics.median(runs):6.3f} ms/image (no work: the hand-off)")
        for name, fn in (("results pickled (pool.map)", pickled),
                         (f"shared memory, chunks of {step}", shared),
                         (f"shared memory, chunks of {cpu_chunk(256, a.workers)} (now)", shared_even)):
            fn()
            runs = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                fn()
                runs.append(len(blobs) / (time.perf_counter() - t))
            print(f"{name:40s} {statistics.median(runs):8,.0f} images/s")

    # 3. the pipeline as users run it: batches of 256 over the set again and again, after 4 untimed
    # batches; with more batches in flight (prefetch), and with a shorter GIL switch interval in this
    # process (the pool's thread that hands out tasks waits for the GIL)
    from gpubatch.bench.measure import CpuUse

    for prefetch, interval in ((1, None), (4, None), (1, 0.0005)):
        old = sys.getswitchinterval()
        if interval:
            sys.setswitchinterval(interval)
        with ImagePipeline(list(ops), device="cpu", seed=0, cpu_threads=a.workers) as pipe:
            it = pipe.iterate_files(files, keys, batch_size=256, repeat=True, prefetch=prefetch)
            for _ in range(4):
                next(it)
            cpu, t, n = CpuUse(), time.perf_counter(), 0
            for _ in range(a.batches):
                n += len(next(it))
            rate, cores = n / (time.perf_counter() - t), cpu.stop()
            it.close()
        sys.setswitchinterval(old)
        name = f"iterate_files, prefetch {prefetch}" + (f", switch interval {interval * 1e3:g} ms" if interval else "")
        print(f"{name:40s} {rate:8,.0f} images/s, {cores:4.1f} cores")

if __name__ == "__main__":
    main()
