#!/usr/bin/env python3
"""Where a GPU worker's start goes: each step of a GPU image engine's start timed on its own (imports,
the CUDA context, nvImageCodec's C library, each hardware-engine instance, the CUDA decoder, the JPEG
encoder, the warm-up), then the decoders made again from threads at once, to see what overlaps.

    python3 benchmarks/gpu_start.py [--instances 3] [--json OUT]
    python3 benchmarks/gpu_start.py --hw-first --quick   # the instances before the library, once each
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=3, help="hardware-engine instances (the hardware route's)")
    ap.add_argument("--threads", type=int, default=8, help="CPU threads of the CUDA decoder")
    ap.add_argument("--hw-first", action="store_true", help="make the hardware instances before the C library")
    ap.add_argument("--quick", action="store_true", help="only the first part (each step once, in order)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    out: dict = {}
    t = time.perf_counter()

    def step(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[name] = round(now - t, 4)
        t = now

    import cupy as cp

    step("import cupy")
    from gpubatch.engine.codecs import nvimgcodec_c, nvjpeg_hw

    step("import gpubatch codecs")
    cp.cuda.Device(0).use()
    cp.cuda.runtime.memGetInfo()
    step("CUDA context")
    made = []

    def hw() -> None:
        for k in range(a.instances):
            made.append(nvjpeg_hw.HwBatchDecoder(cp))
            step(f"hardware instance {k + 1}")

    if a.hw_first:
        hw()
    lib = nvimgcodec_c.library()
    step("nvImageCodec C library")
    if not a.hw_first:
        hw()
    cuda = lib.decoder(0, a.threads, nvimgcodec_c.BACKEND_HYBRID_CPU_GPU, "")
    step("CUDA decoder")
    for d in made:
        d.close()
    del cuda
    step("closed")
    if a.quick:
        print(json.dumps(out))
        return

    def one_hw(_: int) -> float:
        s = time.perf_counter()
        made.append(nvjpeg_hw.HwBatchDecoder(cp))
        return time.perf_counter() - s

    made.clear()
    s0 = time.perf_counter()
    with ThreadPoolExecutor(a.instances + 1) as pool:
        futs = [pool.submit(one_hw, k) for k in range(a.instances)]
        fc = pool.submit(lambda: lib.decoder(0, a.threads, nvimgcodec_c.BACKEND_HYBRID_CPU_GPU, ""))
        each = [round(f.result(), 4) for f in futs]
        fc.result()
    out["all decoders at once (threads)"] = round(time.perf_counter() - s0, 4)
    out["each hardware instance, at once"] = each
    for d in made:
        d.close()
    t = time.perf_counter()
    from gpubatch.engine.device import resolve
    from gpubatch.engine.gpu.engine import GpuEngine

    eng = GpuEngine(resolve("gpu"), 8, decode_route="hardware",
                    hw_preallocate=(256, 640, 640))
    step("GpuEngine (whole)")
    out["GpuEngine steps"] = eng.init_times
    w = eng.warm_up(256, encoder=True)
    out["warm_up (256, encoder)"] = round(w, 4)
    eng.close()
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text)


if __name__ == "__main__":
    main()
