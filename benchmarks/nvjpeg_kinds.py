#!/usr/bin/env python3
"""nvJPEG's hardware-backend calls over a mix of JPEG kinds, as ``convert`` makes them: does going from one kind
to another cost the hardware engine?

Why: under ``convert`` (one GPU process, 16,384 images) the hardware calls take about 64 us an image even with no
kernel of the chain or the encoder running beside them (``GPUBATCH_HW_GATE`` at 4ab9bc1, benchmarks/RESULTS.md
2026-12-04 "11:15 to 11:23"), where ``nvjpeg_calls.py`` measured 39.4 us on the set's mix, weighting each kind's
calls made alone ("07:28 to 08:11"). ``convert`` splits each batch by kind and makes a call a kind, each kind on an
instance of its own (``codecs/hw_instances.py``), so its calls go 4:2:0, 4:2:2, 4:4:4, 4:2:0, ... where those
measurements made one kind's calls back to back.

Modes, the same images in the same calls (``--batch`` a round, split by the set's mix):

- ``interleaved``: each round a call a kind in turn, each kind on its own instance (``convert``'s order);
- ``grouped``: the same calls, every round's 4:2:0 call first, then the 4:2:2 ones, then the 4:4:4 ones;
- ``one-call``: each round's images in one call of mixed kinds on one instance (two instances in turn).

Each call first waits for its instance's previous call to end on the GPU (as ``HwBatchDecoder.decode`` does),
timed apart from the call. Reported per mode: images a second over the timed rounds, the host time in nvJPEG's
calls per image, the calling thread's CPU time in them, and the wait.

``--beside memcpy``: the modes again while half the cores' processes copy 64 MiB arrays over and over (the memory
and the caches busy, as ``convert``'s reader processes and shard writer keep them; spinning Python beside the calls
changed nothing, ``nvjpeg_calls.py --beside cpu``).

    python3 benchmarks/nvjpeg_kinds.py --data FOLDER [--batch 256] [--rounds 100] [--repeats 3] [--beside memcpy]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))
from nvjpeg_calls import load  # noqa: E402

KINDS = ("4:2:0", "4:2:2", "4:4:4")
MODES = ("interleaved", "grouped", "one-call")


def calls_of(mode: str, rounds: int, split: list[int]) -> list[tuple[int, list[tuple[int, int]]]]:
    """The calls of ``rounds`` rounds in ``mode``'s order: (instance, [(kind, count), ...]) each."""
    if mode == "one-call":
        return [(r % 2, [(k, n) for k, n in enumerate(split)]) for r in range(rounds)]
    if mode == "interleaved":
        return [(k, [(k, n)]) for _ in range(rounds) for k, n in enumerate(split)]
    if mode == "grouped":
        return [(k, [(k, n)]) for k, n in enumerate(split) for _ in range(rounds)]
    raise ValueError(mode)


def run_mode(cp, mode: str, sets: list[list[tuple[int, int]]], mh: int, mw: int, a, split: list[int]) -> dict:
    from gpubatch.engine.codecs import nvjpeg_hw as nh

    decs = [nh.HwBatchDecoder(cp) for _ in KINDS]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in decs]
    slot = mh * mw * 3
    outs = [cp.empty(sum(split) * slot, cp.uint8) for _ in decs]
    at = [0] * len(KINDS)
    plan = calls_of(mode, a.warmup + a.rounds, split)
    warm = len(calls_of(mode, a.warmup, split))
    if mode == "grouped":  # (the warm-up: a round of each kind first, then the timed rounds grouped)
        plan = calls_of("interleaved", a.warmup, split) + calls_of(mode, a.rounds, split)
    host_ns = wait_ns = cpu_ns = images = 0
    t0 = time.perf_counter()
    for c, (i, parts) in enumerate(plan):
        if c == warm:
            for s in streams:
                s.synchronize()
            t0, host_ns, wait_ns, cpu_ns, images = time.perf_counter(), 0, 0, 0, 0
        srcs = []
        for k, n in parts:
            srcs += [sets[k][(at[k] + j) % len(sets[k])] for j in range(n)]
            at[k] += n
        outputs = [(outs[i].data.ptr + j * slot, mw * 3) for j in range(len(srcs))]
        args = nh.call_args(srcs, outputs)
        s0 = time.perf_counter_ns()
        if decs[i].done is not None:
            decs[i].done.synchronize()
        s1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        decs[i].decode(srcs, outputs, streams[i], args=args)
        host_ns += time.perf_counter_ns() - s1
        cpu_ns += time.thread_time_ns() - c1
        wait_ns += s1 - s0
        images += len(srcs)
    for s in streams:
        s.synchronize()
    seconds = time.perf_counter() - t0
    for d in decs:
        d.close()
    return {"images_per_s": round(images / seconds, 1), "host_us_per_image": round(host_ns / 1e3 / images, 2),
            "cpu_us_per_image": round(cpu_ns / 1e3 / images, 2), "wait_us_per_image": round(wait_ns / 1e3 / images, 2),
            "images": images}


def _copying(stop) -> None:
    a = np.ones(64 << 20, np.uint8)
    b = np.empty_like(a)
    while not stop.is_set():
        np.copyto(b, a)
        np.copyto(a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a folder of JPEGs of the three kinds (searched recursively)")
    ap.add_argument("--images", type=int, default=4096,
                    help="distinct files of each kind at most (repeated as the calls need); the split follows their counts")
    ap.add_argument("--batch", type=int, default=256, help="images a round, split by the set's mix of kinds")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--beside", default="", help="memcpy: the modes again beside processes copying memory")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import cupy as cp

    loaded = [load(a.data, a.images, k) for k in KINDS]
    if not all(f for f, _, _ in loaded):
        sys.exit(f"the three kinds {KINDS} are not all under {a.data}")
    mh, mw = max(h for _, h, _ in loaded), max(w for _, _, w in loaded)
    counted = [len(f) for f, _, _ in loaded]
    split = [max(1, round(a.batch * n / sum(counted))) for n in counted]
    # every file once in page-locked memory, as convert's feed holds a batch's bytes
    total = sum(len(x) for f, _, _ in loaded for x in f)
    pinned = cp.cuda.alloc_pinned_memory(total)
    host = np.frombuffer(pinned, np.uint8, total)
    sets, pos = [], 0
    for files, _, _ in loaded:
        places = []
        for x in files:
            host[pos : pos + len(x)] = np.frombuffer(x, np.uint8)
            places.append((pinned.ptr + pos, len(x)))
            pos += len(x)
        sets.append(places)
    modes = a.modes.split(",")
    besides = ["none", *[b for b in a.beside.split(",") if b]]
    if set(besides) - {"none", "memcpy"}:
        sys.exit(f"unknown --beside {a.beside!r}")
    runs: dict[str, list[dict]] = {(m if b == "none" else f"{m}+{b}"): [] for b in besides for m in modes}
    for _ in range(a.repeats):  # the modes in turn, each repeat
        for b in besides:
            ctx = mp.get_context("fork")
            stop = ctx.Event()
            procs = [ctx.Process(target=_copying, args=(stop,), daemon=True)
                     for _ in range((os.cpu_count() or 2) // 2 if b == "memcpy" else 0)]
            for p in procs:
                p.start()
            time.sleep(0.5 if procs else 0.0)
            try:
                for m in modes:
                    runs[m if b == "none" else f"{m}+{b}"].append(run_mode(cp, m, sets, mh, mw, a, split))
            finally:
                stop.set()
                for p in procs:
                    p.join()
    res = {"files": dict(zip(KINDS, counted)), "split": dict(zip(KINDS, split)), "max_hw": [mh, mw],
           "rounds": a.rounds, "modes": {}}
    for m, rs in runs.items():
        res["modes"][m] = {k: statistics.median(r[k] for r in rs)
                           for k in ("images_per_s", "host_us_per_image", "cpu_us_per_image", "wait_us_per_image")}
        res["modes"][m]["runs"] = rs
        v = res["modes"][m]
        print(f"{m:19s} {v['images_per_s']:>10,.0f} images/s  {v['host_us_per_image']:6.1f} us/image in the calls "
              f"({v['cpu_us_per_image']:5.1f} of CPU), {v['wait_us_per_image']:6.1f} waiting for the instance", flush=True)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
