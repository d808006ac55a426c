#!/usr/bin/env python3
"""Why the hardware JPEG calls slow down inside the pipeline: the routed decoder under each condition.

    python3 benchmarks/decode_variants.py [--images 2048] [--data DIR]

Conditions: called from the main thread; from a worker thread; with a 16-thread file reader running
alongside; with the fused resample launched from the main thread alongside; with fewer CUDA-decoder
threads; with the CUDA share fixed. Prints images/s and the decoder's own stage seconds.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _data import DEFAULT_DATA, load_blobs  # noqa: E402  (benchmarks/_data.py, beside this script)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    args = ap.parse_args()
    import cupy as cp

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder
    from gpubatch.engine.device import resolve
    from gpubatch.engine.gpu_engine import GpuEngine
    from gpubatch.engine.pipeline import chain_windows
    from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop
    from gpubatch.engine.plan import Plan
    files, blobs, batches = load_blobs(args.data, args.images)
    eng = GpuEngine(resolve("gpu"), cpu_threads=16)
    plan = Plan(ops=(RandomResizedCrop(224), Flip(), Normalize()))

    def run(dec: GpuImageDecoder, passes: int = 2) -> float:
        for b in batches[:2]:
            dec.decode(b, eng.stream)
        for k in dec.timings:
            dec.timings[k] = 0.0
        t0 = time.perf_counter()
        for _ in range(passes):
            for b in batches:
                dec.decode(b, eng.stream)
        return passes * len(blobs) / (time.perf_counter() - t0)

    def report(name: str, dec: GpuImageDecoder, rate: float) -> None:
        tm = {k: round(v, 3) for k, v in dec.timings.items()}
        print(f"{name:44s} {rate:8,.0f} img/s  share {dec.cuda_share:.2f}  {tm}", flush=True)

    def in_thread(fn):
        out = []
        t = threading.Thread(target=lambda: out.append(fn()))
        t.start()
        t.join()
        return out[0]

    dec = eng.decoder
    report("main thread", dec, run(dec))
    report("worker thread", dec, in_thread(lambda: run(dec)))

    stop = threading.Event()
    io = ThreadPoolExecutor(16)

    def reader():
        while not stop.is_set():
            list(io.map(Path.read_bytes, files[:256]))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    report("worker thread + 16-thread reader", dec, in_thread(lambda: run(dec)))
    stop.set()
    t.join()

    res = dec.decode(batches[0], eng.stream)
    arrays = [a for a in res.arrays if a is not None]
    wins, norm = [], None
    for i, a in enumerate(arrays):
        w, norm = chain_windows(plan.ops, plan.draw(str(i), *a.shape[:2]), *a.shape[:2])
        wins.append(w)
    stop = threading.Event()

    def launcher():
        while not stop.is_set():
            eng.launch.resample(arrays, wins, norm)
            eng.stream.synchronize()

    t = threading.Thread(target=launcher, daemon=True)
    t.start()
    report("main thread + resample loop alongside", dec, run(dec))
    stop.set()
    t.join()

    for threads in (4, 8):
        d = GpuImageDecoder(0, threads)
        report(f"CUDA decoder with {threads} threads", d, run(d))
        d.close()
    for share in (0.0, 0.25, 0.5):
        d = GpuImageDecoder(0, 8, cuda_share=share)
        d._step = 0.0
        d._adapt = lambda a, b: None
        report(f"fixed CUDA share {share}", d, run(d))
        d.close()
    d = GpuImageDecoder(0, 8, hw_decoder=False)
    report("CUDA decoder only", d, run(d))
    d.close()
    print("cupy", cp.__version__)


if __name__ == "__main__":
    main()
