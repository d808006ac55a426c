#!/usr/bin/env python3
"""What the GPU does during a run, stream by stream: a CUDA activity trace (CUPTI, through PyTorch's
profiler) of the ResNet-50 training or validation chain, run by gpubatch's GPU path or by DALI.

    python3 benchmarks/timeline.py [--contender gpubatch-gpu|dali|dali-defaults] [--chain train|val]
        [--seconds 1] [--images 4096] [--share 0.35] [--trace trace.json.gz]

After one untimed pass over the set, the batches of ``--seconds`` are traced: every kernel, copy and
memset on the device and every CUDA runtime and driver call on the host, whoever made them
(nvImageCodec's threads, CuPy, DALI's). Printed:

- how busy the GPU was (anything running; two or more kernels at once);
- per stream, how busy it was and what ran on it;
- the host calls that took longest, per thread (thread names from ``/proc``);
- how long kernels waited between their launch call and their start, per stream;
- during the host's synchronizing calls (the waits), what the GPU was doing.

The hardware JPEG engine's own work is not a kernel and does not appear: a decoder thread waiting
while no stream runs anything is waiting for it (or for the host). Tracing slows the run (every launch
is recorded): read shares and orders from it, not rates. gpubatch's knobs that are environment
variables (``GPUBATCH_HW_DECODERS``, ``GPUBATCH_SYNC``...) apply. Needs PyTorch, whose profiler carries
CUPTI.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from _data import DEFAULT_DATA, ROOT, jpeg_set, run_beside_busy  # noqa: F401  (benchmarks/_data.py, beside this script)

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
WAITS = ("Synchronize", "cuStreamQuery", "cudaStreamQuery", "cuEventQuery", "cudaEventQuery")


def thread_names() -> dict[int, str]:
    """{thread id: name} of this process's threads: the kernel's ids and names (``comm``), and for
    Python's threads their names under both the kernel's id and the low 32 bits of ``pthread_self``,
    which is the id CUPTI gives host calls."""
    names = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as fh:
                    names[int(tid)] = fh.read().strip()
            except OSError:
                pass
    except OSError:
        pass
    for t in threading.enumerate():
        if t.native_id is not None:
            names[t.native_id] = t.name
        if t.ident is not None:
            names[t.ident & 0xFFFFFFFF] = t.name
    return names


def record(step: Callable[[], int], seconds: float, sync: Callable[[], None]) -> tuple[list[dict], float, int]:
    """Run ``step`` (one batch; returns its images) for ``seconds`` under PyTorch's CUDA activity
    profiler; (the trace's events, wall seconds, images)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        images = 0
        while time.perf_counter() - t0 < seconds:
            images += step()
        sync()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
    return events, wall, images


def _short(name: str, width: int = 60) -> str:
    """A kernel's name without its template arguments and parameter list."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip().removeprefix("void ")
    return s[:width] or name[:width]


def merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` spans as disjoint sorted spans."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in merge(spans))


def at_least(spans: list[tuple[float, float]], k: int) -> float:
    """Time during which at least ``k`` of ``spans`` overlap."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    depth, last, total = 0, None, 0.0
    for t, d in edges:
        if depth >= k and last is not None:
            total += t - last
        depth += d
        last = t
    return total


def overlap(spans: list[tuple[float, float]], within: list[tuple[float, float]]) -> float:
    """Time of merged ``within`` that merged ``spans`` cover too."""
    a, b = merge(spans), merge(within)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(events: list[dict], names: dict[int, str] | None = None, top: int = 6) -> dict:
    """What the trace's GPU work and host CUDA calls add up to (times in ms, shares of the window)."""
    names = names or {}
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS and "dur" in e]
    api = [e for e in events if e.get("ph") == "X" and e.get("cat") in API_CATS and "dur" in e]
    if not gpu:
        return {"error": "no GPU activity in the trace"}
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    window = max(t1 - t0, 1e-9)
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in gpu]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if e["cat"] == "kernel"]
    out: dict = {"window_ms": round(window / 1e3, 1), "gpu_events": len(gpu), "api_calls": len(api),
                 "gpu_busy": round(covered(spans) / window, 3),
                 "kernels_2plus": round(at_least(kernels, 2) / window, 3)}
    launch = {e["args"].get("correlation"): e for e in api if "correlation" in e.get("args", {})}
    by_stream: dict[int, list[dict]] = defaultdict(list)
    for e in gpu:
        by_stream[e.get("args", {}).get("stream", -1)].append(e)
    stream_spans = {sid: [(e["ts"], e["ts"] + e["dur"]) for e in evs] for sid, evs in by_stream.items()}
    streams = {}
    for sid, evs in sorted(by_stream.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        per_name: dict[str, list[float]] = defaultdict(list)
        for e in evs:
            per_name[_short(e["name"]) if e["cat"] == "kernel" else e["cat"]].append(e["dur"])
        delays = [e["ts"] - launch[c]["ts"] for e in evs
                  if (c := e.get("args", {}).get("correlation")) in launch and e["cat"] == "kernel"]
        launchers = defaultdict(int)
        for e in evs:
            c = e.get("args", {}).get("correlation")
            if c in launch:
                launchers[names.get(launch[c].get("tid"), str(launch[c].get("tid")))] += 1
        streams[str(sid)] = {
            "events": len(evs), "busy": round(covered(stream_spans[sid]) / window, 3),
            "launched_by": dict(sorted(launchers.items(), key=lambda kv: -kv[1])[:3]),
            "launch_to_start_us": ({"p50": round(statistics.median(delays), 1),
                                    "p90": round(sorted(delays)[int(0.9 * (len(delays) - 1))], 1)} if delays else None),
            "top": [{"name": n, "n": len(d), "ms": round(sum(d) / 1e3, 2), "mean_us": round(sum(d) / len(d), 1)}
                    for n, d in sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:top]]}
    out["streams"] = streams
    per_thread: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in api:
        per_thread[names.get(e.get("tid"), str(e.get("tid")))][e["name"]].append(e["dur"])
    threads = {}
    for t, calls in sorted(per_thread.items(), key=lambda kv: -sum(sum(v) for v in kv[1].values())):
        total = sum(sum(v) for v in calls.values())
        threads[t] = {"ms": round(total / 1e3, 1), "share": round(total / window, 3),
                      "top": [{"name": n, "n": len(d), "ms": round(sum(d) / 1e3, 1)}
                              for n, d in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:top]]}
    out["host_calls"] = threads
    waits: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in api:
        if any(w in e["name"] for w in WAITS) and e["dur"] > 50:
            waits[names.get(e.get("tid"), str(e.get("tid")))].append((e["ts"], e["ts"] + e["dur"]))
    during = {}
    for t, w in sorted(waits.items(), key=lambda kv: -covered(kv[1])):
        total = covered(w)
        shares = {sid: overlap(s, w) / total for sid, s in stream_spans.items()}
        during[t] = {"wait_ms": round(total / 1e3, 1),
                     "gpu_idle": round(1 - overlap(spans, w) / total, 3),
                     "streams_busy": {sid: round(v, 3) for sid, v in shares.items() if v >= 0.02}}
    out["during_waits"] = during
    return out


def show(s: dict) -> None:
    if "error" in s:
        print(s["error"])
        return
    print(f"window {s['window_ms']} ms: {s['gpu_events']} GPU events, {s['api_calls']} host CUDA calls; "
          f"GPU busy {s['gpu_busy']:.0%} of the window, two or more kernels at once {s['kernels_2plus']:.0%}")
    print("streams (busy share of the window; launch-to-start delay of their kernels):")
    for sid, st in s["streams"].items():
        print(f"  stream {sid}: busy {st['busy']:.0%}, {st['events']} events, launched by {st['launched_by']}, "
              f"launch-to-start {st['launch_to_start_us']} us")
        for k in st["top"]:
            print(f"      {k['ms']:9.2f} ms  {k['n']:6d} x {k['mean_us']:8.1f} us  {k['name']}")
    print("host CUDA calls per thread (ms in calls; share of the window):")
    for t, th in list(s["host_calls"].items())[:12]:
        print(f"  {t}: {th['ms']} ms ({th['share']:.0%}): "
              + ", ".join(f"{c['name']} {c['n']}x {c['ms']} ms" for c in th["top"]))
    print("during each thread's synchronizing calls over 50 us: GPU idle, and each stream's busy share")
    for t, d in s["during_waits"].items():
        print(f"  {t}: {d['wait_ms']} ms waiting; GPU idle {d['gpu_idle']:.0%}; streams {d['streams_busy']}")


def _bench_args(args: argparse.Namespace) -> dict:
    """The bench contenders' arguments for this run (the data set made first)."""
    jpeg_set(args.data, args.images)
    return {"model": "resnet50", "chain": args.chain, "data": args.data, "images": args.images,
            "batch_size": args.batch, "gpu": 0}


def gpubatch_step(args: argparse.Namespace) -> tuple[Callable[[], int], Callable[[], None], Callable[[], None]]:
    """(one batch, synchronize, close) for gpubatch's GPU path with its defaults, warmed up as the bench
    warms it (one pass over the set)."""
    from gpubatch.bench import chain_ops, get_model
    from gpubatch.bench.contenders import data_files, file_keys
    from gpubatch.bench.measure import warmup_batches
    from gpubatch.engine.pipeline import ImagePipeline

    a = _bench_args(args)
    files = data_files(a["data"], a["images"])
    pipe = ImagePipeline(chain_ops(get_model("resnet50").chains[args.chain]), device="gpu", seed=0)
    if args.share is not None:
        pipe.engine.decoder.cuda_share = args.share
    it = pipe.iterate_files(files, file_keys(files), args.batch, repeat=True)
    for _ in range(warmup_batches(a)):
        next(it)
    pipe.engine.stream.synchronize()

    def close() -> None:
        it.close()
        pipe.close()

    return (lambda: len(next(it))), pipe.engine.stream.synchronize, close


def dali_step(args: argparse.Namespace, setting: str) -> tuple[Callable[[], int], Callable[[], None], Callable[[], None]]:
    """The same for DALI's pipeline (gpubatch.bench.contenders.dali_pipeline), warmed up."""
    import cupy as cp

    from gpubatch.bench.contenders import dali_pipeline
    from gpubatch.bench.measure import warmup_batches

    a = _bench_args(args)
    p = dali_pipeline(a, setting)
    if isinstance(p, str):
        sys.exit(p)
    for _ in range(warmup_batches(a)):
        p.run()
    cp.cuda.runtime.deviceSynchronize()
    return (lambda: (p.run(), args.batch)[1]), cp.cuda.runtime.deviceSynchronize, lambda: None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contender", default="gpubatch-gpu", choices=["gpubatch-gpu", "dali", "dali-defaults"])
    ap.add_argument("--chain", default="train", choices=["train", "val"])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--trace", default=None, help="also write the raw trace here (Chrome trace JSON; .gz: gzipped)")
    ap.add_argument("--json", default=None, help="write the summary here as JSON")
    ap.add_argument("--share", type=float, default=None, help="gpubatch: the CUDA decoder's share of each batch")
    run_beside_busy(ap, _run)


def _run(args: argparse.Namespace) -> None:
    if args.contender == "gpubatch-gpu":
        step, sync, close = gpubatch_step(args)
    else:
        step, sync, close = dali_step(args, "best" if args.contender == "dali" else "defaults")
    events, wall, images = record(step, args.seconds, sync)
    names = thread_names()
    close()
    print(f"{args.contender}, {args.chain} chain: {images} images in {wall:.2f} s traced "
          f"({images / wall:,.0f} images/s under tracing)")
    summary = summarize(events, names)
    summary.update({"contender": args.contender, "chain": args.chain, "traced_images_per_s": round(images / wall)})
    show(summary)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    if args.trace:
        opener = gzip.open if args.trace.endswith(".gz") else open
        with opener(args.trace, "wt") as fh:
            json.dump({"traceEvents": events, "threadNames": {str(k): v for k, v in names.items()}}, fh)


if __name__ == "__main__":
    main()
