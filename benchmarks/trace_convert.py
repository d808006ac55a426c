#!/usr/bin/env python3
"""A CUPTI trace (PyTorch's profiler, kineto) of a GPU ``convert`` worker, and what it shows of nvJPEG's hardware calls.

    python3 benchmarks/trace_convert.py --src FOLDER --trace OUT.json [--dst DIR] [--python] -- CONVERT-OPTIONS
    python3 benchmarks/trace_convert.py --summarize OUT.json[.gz]

The first form runs ``python3 -m gpubatch convert FOLDER DIR CONVERT-OPTIONS --overwrite -q --json`` twice (once
untimed) with, the second time, the GPU image unit's ``run`` inside ``torch.profiler.profile`` in the worker process,
then writes the trace and summarizes it. The hook is a ``sitecustomize`` module put first on the worker's path: it
wraps ``GpuImageUnit.run`` when ``gpubatch.engine.gpu.images`` is imported, and keeps the worker from telling the
executor it is done before the trace is written. Needs torch (its profiler) beside gpubatch's GPU packages.

The summary (the second form reads a trace already made): the CUDA runtime calls of the busiest threads by name, the
GPU's work by name, and for the thread that makes the most copies (the hardware decoder's, inside nvJPEG's calls) how
long its kernels waited from launch to start and how long its event synchronizations took; the streams with GPU work
and those of its kernels; and its kernels' waits split by whether a kernel of the chain's stream (the stream of the
most kernels that are not nvJPEG's) was running at their launch.

Found (H200, 2026-12-04, benchmarks/RESULTS.md "11:53 to 11:55"; trace
``results/2026-12-04-convert-worker-trace-4096-036fdd6-h200.json.gz``): inside nvJPEG's hardware calls, a copy, a
colour-conversion kernel, an event record and an event synchronization for each image.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# put first on the worker's path: wraps the GPU image unit's run in the profiler where GPUBATCH_TRACE names a file
SITECUSTOMIZE = '''
import importlib.abc, importlib.util, os, sys

TARGET = "gpubatch.engine.gpu.images"


def _patch(mod):
    run = mod.GpuImageUnit.run

    def traced(self, *a, **k):
        from torch.profiler import ProfilerActivity, profile
        stack = os.environ.get("GPUBATCH_TRACE_PYTHON") == "1"  # (the Python tracer: every Python call an event)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stack) as prof:
            out = run(self, *a, **k)
        prof.export_chrome_trace(os.environ["GPUBATCH_TRACE"])
        return out

    mod.GpuImageUnit.run = traced
    mod.released = lambda: None  # (the executor waits for this worker until the trace is written)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("GPUBATCH_TRACE"):
    sys.meta_path.insert(0, _Finder())
'''


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        tr = json.load(f)
    return tr["traceEvents"] if isinstance(tr, dict) else tr


def summarize(path: Path) -> dict:
    """The trace's figures (printed, and returned for a JSON)."""
    ev = [e for e in _events(path) if e.get("ph") == "X"]
    out: dict = {"categories": dict(collections.Counter(e.get("cat") for e in ev))}
    api: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            d = api[e.get("tid")][e["name"]]
            d[0] += 1
            d[1] += e.get("dur", 0)
    threads = sorted(api.items(), key=lambda kv: -sum(v[1] for v in kv[1].values()))[:4]
    out["threads"] = {str(tid): {n: {"calls": c, "seconds": round(t / 1e6, 4)} for n, (c, t) in
                                 sorted(d.items(), key=lambda kv: -kv[1][1])[:8]} for tid, d in threads}
    gpu: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            g = gpu[f"{e['cat']}: {e['name'][:70]}"]
            g[0] += 1
            g[1] += e.get("dur", 0)
    out["gpu"] = {n: {"count": c, "seconds": round(t / 1e6, 4)} for n, (c, t) in
                  sorted(gpu.items(), key=lambda kv: -kv[1][1])[:12]}
    # the hardware decoder's thread: the one whose runtime calls make the most copies
    copies = {tid: d["cudaMemcpyAsync"][0] for tid, d in api.items() if "cudaMemcpyAsync" in d}
    if copies:
        hw = max(copies, key=copies.get)
        calls = [e for e in ev if e.get("cat") == "cuda_runtime" and e.get("tid") == hw]
        by_corr = {e["args"]["correlation"]: e for e in calls if "correlation" in e.get("args", {})}
        kernels = [k for k in ev if k.get("cat") == "kernel" and k.get("args", {}).get("correlation") in by_corr]
        waits = [k["ts"] - by_corr[k["args"]["correlation"]]["ts"] for k in kernels]
        syncs = [e["dur"] for e in calls if e["name"] == "cudaEventSynchronize"]
        # the chain's stream (its resample and the JPEG encoder's kernels): the stream of the most kernels not nvJPEG's
        all_kernels = [k for k in ev if k.get("cat") == "kernel"]
        others = collections.Counter(k["args"].get("stream") for k in all_kernels if "nvjpeg" not in k["name"])
        chain_stream = others.most_common(1)[0][0] if others else None
        chain = sorted((k["ts"], k["ts"] + k.get("dur", 0)) for k in all_kernels
                       if others and k["args"].get("stream") == chain_stream)
        starts, ends = [a for a, _ in chain], [b for _, b in chain]
        beside: dict[bool, list[float]] = {True: [], False: []}  # launched while a chain kernel ran, or not
        right_after = 0  # started within 3 us of a chain kernel's end
        for k, w in zip(kernels, waits):
            at = by_corr[k["args"]["correlation"]]["ts"]
            i = bisect.bisect_right(starts, at)
            beside[i > 0 and chain[i - 1][1] > at].append(w)
            j = bisect.bisect_right(ends, k["ts"])
            right_after += j > 0 and k["ts"] - ends[j - 1] <= 3.0
        per_stream: dict = collections.defaultdict(list)  # its kernels' waits by stream
        for k, w in zip(kernels, waits):
            per_stream[k["args"].get("stream")].append(w)
        stream_medians = [statistics.median(v) for v in per_stream.values()]
        single = [k for k in all_kernels if "DecodeSingleGPU" in k["name"]]  # (the CUDA decoder's nvJPEG kernels)
        # inside a call, the host's pause between an image's bitstream copy and its colour-conversion kernel (long in the
        # first real calls of a trace at 036fdd6: the engine's submission, most likely, which makes no CUDA call)
        calls.sort(key=lambda e: e["ts"])
        t_first = calls[0]["ts"] if calls else 0
        gaps = [((b["ts"] - a["ts"] - a.get("dur", 0)) / 1e3, (a["ts"] - t_first) / 1e3) for a, b in zip(calls, calls[1:])
                if a["name"] == "cudaMemcpyAsync" and b["name"] == "cudaLaunchKernel"]
        long_gaps = [g for g in gaps if g[0] > 1.0]
        # its longest pauses between any two of its CUDA calls, and the CUDA calls of the worker's other threads in them
        api_calls = sorted((e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
        api_ts = [e["ts"] for e in api_calls]
        idle = sorted(((b["ts"] - a["ts"] - a.get("dur", 0), a["ts"] + a.get("dur", 0), b["ts"]) for a, b in
                       zip(calls, calls[1:])), reverse=True)[:3]
        pauses = [[round((t0 - t_first) / 1e3, 1), round(g / 1e3, 1),
                   sum(1 for e in api_calls[bisect.bisect_left(api_ts, t0):bisect.bisect_left(api_ts, t1)]
                       if e.get("tid") != hw)] for g, t0, t1 in idle]
        # with --python: the Python calls of any thread that overlap the longest pause most (what held it)
        py = [e for e in ev if e.get("cat") == "python_function"]
        held = []
        if py and idle:
            _, p0, p1 = idle[0]
            over = [(min(p1, e["ts"] + e.get("dur", 0)) - max(p0, e["ts"]), e) for e in py]
            held = [[round(o / 1e3, 1), e.get("tid"), e["name"][:90]] for o, e in sorted(over, key=lambda x: -x[0])[:10]
                    if o > 0]
        out["hardware thread"] = {
            "runtime calls": len(calls), "seconds in them": round(sum(e.get("dur", 0) for e in calls) / 1e6, 4),
            "span s": round((max(e["ts"] + e.get("dur", 0) for e in calls) - min(e["ts"] for e in calls)) / 1e6, 4),
            "copies": copies[hw], "kernels": len(kernels),
            "kernels by name": dict(collections.Counter(k["name"][:40] for k in kernels).most_common(4)),
            "kernel launch to start us (median, p90)": [round(statistics.median(waits), 1),
                                                        round(statistics.quantiles(waits, n=10)[-1], 1)] if len(waits) > 1 else None,
            "event syncs": len(syncs),
            "event sync us (median, p95, max)": [round(statistics.median(syncs), 1),
                                                 round(statistics.quantiles(syncs, n=20)[-1], 1), round(max(syncs), 1)]
            if len(syncs) > 1 else None,
            "event syncs over 50 us, s": round(sum(s for s in syncs if s > 50) / 1e6, 4),
            "streams with GPU work": len({k["args"].get("stream") for k in ev
                                          if k.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}),
            "streams of its kernels": len({k["args"].get("stream") for k in kernels}),
            "its kernels launched while a chain kernel ran: count, launch to start us (median)":
                [len(beside[True]), round(statistics.median(beside[True]), 1) if beside[True] else None],
            "the others: count, launch to start us (median)":
                [len(beside[False]), round(statistics.median(beside[False]), 1) if beside[False] else None],
            "its kernels starting within 3 us of a chain kernel's end": right_after,
            "its streams' median launch to start us (least, most)":
                [round(min(stream_medians), 1), round(max(stream_medians), 1)] if stream_medians else None,
            "copy-to-kernel pauses over 1 ms: count, ms in all, ms in its first 200 ms, last at ms":
                [len(long_gaps), round(sum(g for g, _ in long_gaps), 1),
                 round(sum(g for g, at in long_gaps if at < 200), 1), round(max((at for _, at in long_gaps), default=0), 1)],
            "longest pauses between its CUDA calls: at ms, ms, other threads' CUDA calls in them": pauses,
            "the Python calls in the longest (--python): ms in it, thread, function": held,
            "CUDA decoder kernels: count, streams, span ms":
                [len(single), len({k["args"].get("stream") for k in single}),
                 round((max(k["ts"] + k.get("dur", 0) for k in single) - min(k["ts"] for k in single)) / 1e3, 1)
                 if single else None]}
    print(json.dumps(out, indent=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path)
    ap.add_argument("--dst", type=Path, default=Path(tempfile.gettempdir()) / "gpubatch-trace-out")
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--summarize", type=Path, help="summarize this trace (made already) and stop")
    ap.add_argument("--python", action="store_true", help="trace every Python call too (PyTorch's Python tracer, "
                    "with_stack): the summary names those in the hardware thread's longest pause; slows the run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the convert command's options")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize)
        return
    if a.src is None or a.trace is None:
        ap.error("--src and --trace (or --summarize)")
    opts = [x for x in a.args if x != "--"]
    with tempfile.TemporaryDirectory() as hook:
        Path(hook, "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([hook, str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "gpubatch", "convert", str(a.src), str(a.dst), *opts, "--overwrite", "-q", "--json"]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)  # (untimed: caches, kernels)
        a.trace.unlink(missing_ok=True)
        traced = {**env, "GPUBATCH_TRACE": str(a.trace), "GPUBATCH_TRACE_PYTHON": "1" if a.python else "0"}
        done = subprocess.run(cmd, env=traced, check=True, capture_output=True,
                              text=True)
    timings = json.loads(done.stdout)["timings"]
    print({k: round(v, 3) for k, v in timings.items() if k.startswith(("decoder: hw", "wall: shards"))})
    summarize(a.trace)


if __name__ == "__main__":
    main()
