#!/usr/bin/env python3
"""The hardware JPEG engine's first real calls after a warm-up: what a ``convert`` worker's first batches cost its
hardware thread, by what the warm-up decoded and how long the engine then sat idle.

    python3 benchmarks/hw_cold.py --data FOLDER_OF_JPEGS [--variants tiny,real,none] [--idle 0,0.3] \\
        [--repeats 2] [--batches 24] [--json OUT]

Why: in a CUPTI trace of a ``convert`` worker (``results/2026-12-04-convert-worker-trace-4096-036fdd6-h200.json.gz``)
the hardware thread's first ~120 ms of real calls were slow: inside nvJPEG's calls, between an image's bitstream
copy and its colour-conversion kernel, it stopped for 1-12 ms, 25 times (0.2 s in all), with no CUDA call and little
GPU work, on streams the warm-up had used already (with its 64x64 images), and not afterwards. The run's first
batch takes 0.19-0.25 s to decode against 0.016 s for a later one (benchmarks/RESULTS.md, 2026-12-04).

Each variant runs in a fresh process (``--one``), as a worker would: the context, three hardware instances
(``HwBatchDecoder``, one per kind, as ``convert``'s hardware route has them), the warm-up, ``--idle`` seconds of
nothing, then ``--batches`` batches of 256 of the folder's JPEGs (read once into page-locked memory, as the feed
holds them), each batch split by kind into one call per kind on that kind's instance, each call first waiting
for its instance's previous call (as the decoder does). Warm-ups (``tiny`` and ``tiny1``: a call of each kind on
each instance, as the decoder's warm-up calls its instances; ``real`` and ``large``: a call of its own kind on each):

- ``tiny``: gpubatch's own warm-up images (64x64, every kind; ``GpuImageDecoder.warm_up``), from pageable memory;
- ``tiny1``: one of those a kind (``GPUBATCH_HW_WARM_IMAGES=1``);
- ``real``: 64 of the folder's JPEGs of the kind (files the timed batches do not use), from page-locked memory;
- ``large``: 64 synthetic 512x512 JPEGs of the kind (what a warm-up could make without the run's files);
- ``none``: no warm-up.

Reported per run: each batch's milliseconds (host time in the calls, then the batch waited for on the GPU), the
first eight batches' excess over eight times the median of the later ones ("cold excess"), and the warm-up's own
milliseconds. The folder must hold at least 12 whole batches past the real warm-up's 192 files.

Found (H200, 2026-12-04, benchmarks/RESULTS.md "21:36 to 22:45"; 4,096 ImageNet-like JPEGs, 15 batches): a later batch
11.0-11.7 ms (about 22,500 images/s, three instances, one thread); the first 21-24 ms after the real warm-up, 25-31
after the large one, 37-46 after gpubatch's tiny one and 42-49 with none; the first eight batches' excess 25-34 ms,
36-52, 45-64 and 52-65. So an instance's cold first calls cost tens of milliseconds, not the 0.2 s a ``convert``
worker's first batch takes to decode.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("baseline/4:2:0", "baseline/4:2:2", "baseline/4:4:4")


def _synthetic(kind: str, n: int, size: int = 512) -> list[bytes]:
    import numpy as np
    from PIL import Image

    sub = {"baseline/4:4:4": 0, "baseline/4:2:2": 1, "baseline/4:2:0": 2}[kind]
    y, x = np.mgrid[0:size, 0:size]
    rng = np.random.default_rng(0)
    pixels = ((x[..., None] * (1 + np.arange(3)) + y[..., None] * 2) % 256).astype(np.uint8)
    pixels = np.clip(pixels.astype(np.int16) + rng.integers(-20, 21, pixels.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90, subsampling=sub)
    return [buf.getvalue()] * n


def one(a: argparse.Namespace) -> dict:
    """One variant, in this process."""
    import numpy as np

    t_start = time.perf_counter()
    import cupy as cp

    from gpubatch.engine.codecs import headers
    from gpubatch.engine.codecs import nvjpeg_hw as nh
    from gpubatch.engine.codecs.image_gpu import tiny_jpegs

    files = sorted(Path(a.data).rglob("*.jpg"))
    by_kind: dict[str, list[bytes]] = {k: [] for k in KINDS}
    timed: list[tuple[str, bytes]] = []
    need = 256 * a.batches
    mh = mw = 0
    for f in files:
        data = f.read_bytes()
        kind, w, h = headers.jpeg_kind(data)
        if kind not in KINDS:
            continue
        mh, mw = max(mh, h), max(mw, w)
        if len(by_kind[kind]) < 64:  # the real warm-up's files, apart from the timed ones
            by_kind[kind].append(data)
            continue
        if len(timed) < need:
            timed.append((kind, data))
        if len(timed) >= need and all(len(v) >= 64 for v in by_kind.values()):
            break
    cp.cuda.Device(0).use()
    cp.cuda.runtime.memGetInfo()
    t_ctx = time.perf_counter()
    decs = {k: nh.HwBatchDecoder(cp) for k in KINDS}
    streams = {k: cp.cuda.Stream(non_blocking=True) for k in KINDS}
    t_made = time.perf_counter()
    # the timed files once in page-locked memory
    synth = {k: _synthetic(k, 1)[0] for k in KINDS} if a.variant == "large" else {}
    total = (sum(len(d) for _, d in timed) + sum(len(d) for v in by_kind.values() for d in v)
             + sum(len(d) for d in synth.values()))
    pinned = cp.cuda.alloc_pinned_memory(total)
    host = np.frombuffer(pinned, np.uint8, total)
    at = 0

    def place(d: bytes) -> tuple[int, int]:
        nonlocal at
        host[at : at + len(d)] = np.frombuffer(d, np.uint8)
        at += len(d)
        return pinned.ptr + at - len(d), len(d)

    timed_places = [(k, place(d)) for k, d in timed]
    real_places = {k: [place(d) for d in v] for k, v in by_kind.items()}
    synth_places = {k: [place(d)] * 64 for k, d in synth.items()}
    pitch = max(mw, 512) * 3
    slot = max(mh, 512) * pitch
    out = cp.empty(256 * slot, cp.uint8)
    keep: list = []

    def call(kind: str, srcs: list[tuple[int, int]], base: int) -> float:
        dec = decs[kind]
        if dec.done is not None:
            dec.done.synchronize()
        t = time.perf_counter()
        outputs = [(out.data.ptr + (base + j) * slot, pitch) for j in range(len(srcs))]
        dec.decode(srcs, outputs, streams[kind])
        return time.perf_counter() - t

    t0 = time.perf_counter()
    if a.variant in ("tiny", "tiny1"):
        tiny = tiny_jpegs(256 if a.variant == "tiny" else 4)
        arrays = [np.frombuffer(b, np.uint8) for b in tiny]
        keep.extend(arrays)
        groups: dict[str, list[tuple[int, int]]] = {}
        for b, arr in zip(tiny, arrays):
            groups.setdefault(headers.jpeg_kind(b)[0], []).append((arr.ctypes.data, len(b)))
        for k in KINDS:
            for kind, srcs in groups.items():
                if kind in KINDS:
                    decs[k].decode(srcs, [(out.data.ptr + j * slot, 64 * 3) for j in range(len(srcs))], streams[k])
                    streams[k].synchronize()
    elif a.variant in ("real", "large"):
        for k in KINDS:
            srcs = real_places[k] if a.variant == "real" else synth_places[k]
            decs[k].decode(srcs, [(out.data.ptr + j * slot, pitch) for j in range(len(srcs))], streams[k])
            streams[k].synchronize()
    for s in streams.values():
        s.synchronize()
    warm_ms = (time.perf_counter() - t0) * 1e3
    time.sleep(a.idle)
    batches = []
    for b in range(min(a.batches, len(timed_places) // 256)):  # (whole batches of the files there are)
        part = timed_places[b * 256 : (b + 1) * 256]
        t = time.perf_counter()
        host_s = 0.0
        base = 0
        for k in KINDS:
            srcs = [p for kind, p in part if kind == k]
            if srcs:
                host_s += call(k, srcs, base)
                base += len(srcs)
        for s in streams.values():
            s.synchronize()
        batches.append((round(host_s * 1e3, 2), round((time.perf_counter() - t) * 1e3, 2)))
    if len(batches) < 12:
        raise SystemExit(f"{len(timed_places)} images make {len(batches)} batches of 256: give a folder with more")
    later = statistics.median(w for _, w in batches[8:])
    for d in decs.values():
        d.close()
    return {"variant": a.variant, "idle_s": a.idle, "warm_up_ms": round(warm_ms, 1),
            "context_s": round(t_ctx - t_start, 3), "instances_s": round(t_made - t_ctx, 3),
            "first_batch_ms": batches[0][1], "batches_2_to_8_ms": round(sum(w for _, w in batches[1:8]), 2),
            "later_batch_ms (median)": later,
            "cold_excess_ms": round(sum(w for _, w in batches[:8]) - 8 * later, 1),
            "batches_ms (host in calls, whole)": batches, "images": len(timed_places)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--variants", default="tiny,tiny1,real,large,none")
    ap.add_argument("--idle", default="0,0.3", help="seconds idle after the warm-up, comma-separated")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between the processes (the engine idle)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        a.variant, a.idle = a.one, float(a.idle)
        print(json.dumps(one(a)))
        return
    runs = []
    for r in range(a.repeats):
        for v in a.variants.split(","):
            for idle in a.idle.split(","):
                time.sleep(a.pause)
                p = subprocess.run([sys.executable, __file__, "--data", str(a.data), "--one", v, "--idle", idle,
                                    "--batches", str(a.batches)], capture_output=True, text=True, env=os.environ)
                if p.returncode:
                    print(p.stderr[-3000:], file=sys.stderr)
                    sys.exit(p.returncode)
                res = json.loads(p.stdout.strip().splitlines()[-1])
                res["round"] = r
                runs.append(res)
                print(f"round {r} {v:6s} idle {idle:>4s}: warm-up {res['warm_up_ms']:7.1f} ms, first batch "
                      f"{res['first_batch_ms']:7.2f} ms, batches 2-8 {res['batches_2_to_8_ms']:7.2f} ms, later "
                      f"{res['later_batch_ms (median)']} ms, cold excess {res['cold_excess_ms']} ms", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"data": str(a.data), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
