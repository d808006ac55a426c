#!/usr/bin/env python3
"""How fast this machine's host is at what the GPU pipeline's pace-setting thread does.

    python3 benchmarks/host_probe.py [--data .bench-data/mixed] [--calls 60] [--json out.json]

The training chain's pace is the one thread that drives the hardware JPEG engine (RESULTS.md,
2026-11-22), and its speed varies from machine to machine far more than the
GPU's. This probe times, on one thread bound to one core, the primitives that thread is made of, so
that a slow run can be told apart by cause:

- ``python``: ns per iteration of a plain Python loop (the interpreter's speed: the core's clock);
- ``syscall``: us per ``os.read(fd, 0)`` (the kernel's entry and exit);
- ``memcpy``: GB/s copying 90 KB blocks (a JPEG's size) out of 256 MiB into one buffer (memory
  bandwidth, as nvJPEG copies each call's bitstreams into its pinned buffer);
- ``event``, ``launch``, ``copy``: us per CUDA event record + query, per launch of an empty kernel, per
  4 KiB asynchronous host-to-device copy from pinned memory (the driver's calls);
- ``nvjpeg``: host ms per ``nvjpegDecodeBatched`` call on the hardware engine (two instances in turn,
  as the pipeline makes them; each call's wait for its instance's previous one left out), at two call
  sizes and at two JPEG sizes of the same images (re-encoded by Pillow at quality 50 and 95, 4:2:0):
  the cost per call, per image and per KB.

Every figure is the median of its repeats. A machine whose ``nvjpeg`` figures are high while
``python`` is not points at the driver or at memory, not at the interpreter.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time

from _data import DEFAULT_DATA, jpeg_set, run_beside_busy  # (benchmarks/_data.py, beside this script)


def _median_rate(fn, n: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of the seconds per unit of ``fn(n)`` (which does ``n`` units)."""
    fn(n)  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def host_figures() -> dict:
    import numpy as np

    def loop(n: int) -> None:
        x = 0
        for i in range(n):
            x += i

    fd = os.open("/dev/zero", os.O_RDONLY)

    def reads(n: int) -> None:
        for _ in range(n):
            os.read(fd, 0)

    src = np.random.default_rng(0).integers(0, 255, 256 << 20, dtype=np.uint8)
    dst = np.empty(90 << 10, np.uint8)
    blocks = len(src) // len(dst)

    def copies(n: int) -> None:
        for k in range(n):
            s = (k * 7919) % blocks * len(dst)
            np.copyto(dst, src[s : s + len(dst)])

    out = {"python_ns": _median_rate(loop, 200_000) * 1e9, "syscall_us": _median_rate(reads, 20_000) * 1e6,
           "memcpy_gbs": len(dst) / _median_rate(copies, 2_000) / 1e9}
    os.close(fd)
    return out


def driver_figures(cp) -> dict:
    stream = cp.cuda.Stream(non_blocking=True)
    ev = cp.cuda.Event(disable_timing=True)
    empty = cp.RawKernel(r'extern "C" __global__ void nothing() {}', "nothing")
    pinned = cp.cuda.alloc_pinned_memory(4096)
    dev = cp.empty(4096, cp.uint8)

    def events(n: int) -> None:
        for _ in range(n):
            ev.record(stream)
            _ = ev.done  # (cudaEventQuery)
        stream.synchronize()

    def launches(n: int) -> None:
        with stream:
            for _ in range(n):
                empty((1,), (1,), ())
        stream.synchronize()

    def copies(n: int) -> None:
        for _ in range(n):
            cp.cuda.runtime.memcpyAsync(dev.data.ptr, pinned.ptr, 4096, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        stream.synchronize()

    return {"event_us": _median_rate(events, 2_000) * 1e6, "launch_us": _median_rate(launches, 2_000) * 1e6,
            "copy_us": _median_rate(copies, 2_000) * 1e6}


def nvjpeg_figures(cp, blobs: list[bytes], calls: int) -> dict:
    """Host ms per hardware-engine call: 4:2:0 images of the set, re-encoded at two qualities."""
    import numpy as np
    from PIL import Image

    from gpubatch.engine.codecs.headers import jpeg_kind
    from gpubatch.engine.codecs.nvjpeg_hw import HwBatchDecoder

    chosen = [b for b in blobs if jpeg_kind(b)[0] == "baseline/4:2:0"][:86]

    def reencode(quality: int) -> list[bytes]:
        out = []
        for b in chosen:
            buf = io.BytesIO()
            Image.open(io.BytesIO(b)).convert("RGB").save(buf, "JPEG", quality=quality, subsampling=2)
            out.append(buf.getvalue())
        return out

    sets = {"set": chosen, "q50": reencode(50), "q95": reencode(95)}
    dims = [jpeg_kind(b)[1:] for b in chosen]
    stream = cp.cuda.Stream(non_blocking=True)
    slabs = [cp.empty(sum(w * h * 3 for w, h in dims), cp.uint8) for _ in range(2)]
    decs = [HwBatchDecoder(cp) for _ in range(2)]
    out: dict = {}
    try:
        for name, n in (("set", 86), ("set", 22), ("q50", 86), ("q95", 86)):
            data = sets[name][:n]
            host = [np.frombuffer(b, np.uint8) for b in data]
            sources = [(h.ctypes.data, h.nbytes) for h in host]
            places = []
            for slab in slabs:
                off, p = 0, []
                for w, h in dims[:n]:
                    p.append((slab.data.ptr + off, w * 3))
                    off += w * h * 3
                places.append(p)
            times = []
            for k in range(calls + 4):
                dec = decs[k % 2]
                if dec.done is not None:
                    dec.done.synchronize()  # (the instance's previous call: not host work)
                t0 = time.perf_counter()
                dec.decode(sources, places[k % 2], stream)
                if k >= 4:
                    times.append(time.perf_counter() - t0)
            stream.synchronize()
            t = statistics.median(times)
            kb = sum(len(b) for b in data) / n / 1024
            out[f"{name}_{n}"] = {"call_ms": t * 1e3, "per_image_us": t / n * 1e6, "kb_per_image": kb,
                                  "p90_ms": sorted(times)[int(0.9 * len(times))] * 1e3}
    finally:
        for d in decs:
            d.close()
    a, b = out["q50_86"], out["q95_86"]
    out["us_per_kb"] = (b["per_image_us"] - a["per_image_us"]) / max(1e-9, b["kb_per_image"] - a["kb_per_image"])
    s86, s22 = out["set_86"], out["set_22"]
    out["per_call_ms"] = (s22["call_ms"] * 86 - s86["call_ms"] * 22) / (86 - 22)  # the intercept
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--json", default="")
    run_beside_busy(ap, _run)


def _run(args: argparse.Namespace) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[-1]})  # one core, as the pipeline gives the hardware engine's thread
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    res = {"host": platform.node(), "kernel": platform.release(), "cpu": model, "cores": len(cores),
           **host_figures()}
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001  (no GPU: the host figures alone)
        print(f"no GPU ({e}): host figures only", file=sys.stderr)
    else:
        res["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        res.update(driver_figures(cp))
        blobs = [f.read_bytes() for f in jpeg_set(args.data, 4096)[:512]]
        res["nvjpeg"] = nvjpeg_figures(cp, blobs, args.calls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    flat = {k: v for k, v in res.items() if not isinstance(v, dict)}
    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in flat.items()))
    for k, v in res.get("nvjpeg", {}).items():
        print(f"nvjpeg {k}: " + (" ".join(f"{a}={b:.3g}" for a, b in v.items()) if isinstance(v, dict) else f"{v:.3g}"))


if __name__ == "__main__":
    main()
