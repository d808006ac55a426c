#!/usr/bin/env python3
"""The in-memory pipeline (``ImagePipeline.iterate``) under the conditions that decide its speed:
where the bytes come from (pre-read in memory; read from disk by reader threads; read by reader
processes, ``iterate_files``; the same with decode and ops inline in one thread) and the GIL switch
interval the engine sets. Each condition runs in its own process.

    python3 benchmarks/pipeline_study.py [--images 4096] [--chain train|val] [--sync batch|lag]
        [--intervals 0.001,0.0002,0.00005] [--sources memory,memory-inline,files,feed,feed-inline]
        [--region-decode]

Images/s over 2 passes of the set after one warm-up pass (``--warmup N`` batches instead), batch 256, the stream synchronized after
every batch (as ``gpubatch bench`` does), with the stage and decoder seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _data import DEFAULT_DATA, jpeg_set, load_blobs  # noqa: E402  (benchmarks/_data.py, beside this script)


def one(args: argparse.Namespace) -> None:
    from gpubatch.bench import chain_ops, get_model
    from gpubatch.engine.pipeline import ImagePipeline

    files, blobs, batches = load_blobs(args.data, args.images)
    keys = [f"{p.parent.name}/{p.stem}" for p in files]
    key_batches = [keys[i : i + 256] for i in range(0, len(keys), 256)]
    ops = chain_ops(get_model("resnet50").chains[args.chain])
    pipe = ImagePipeline(ops, device="gpu", seed=0, region_decode=args.region_decode)
    io = ThreadPoolExecutor(4)

    def source():
        for b in itertools.cycle(range(len(batches))):
            if args.source == "memory":
                yield batches[b], key_batches[b]
            else:
                yield list(io.map(Path.read_bytes, files[b * 256 : (b + 1) * 256])), key_batches[b]

    if args.source == "feed":
        it = pipe.iterate_files(files, keys, 256, repeat=True)
    elif args.source == "decode-inline":  # decode only, results held 2 batches (no kernels)
        held: list = []

        class _N:
            def __init__(self, n: int) -> None:
                self.n = n

            def __len__(self) -> int:
                return self.n

        pipe.chunk = 0  # whole batches: the results are held, not read chunk by chunk

        def decode_only():
            for b in itertools.cycle(range(len(batches))):
                res = pipe.decode(batches[b])
                res.order(pipe.stream)
                held.append(res)
                if len(held) > 2:
                    held.pop(0)
                yield _N(len(batches[b]))

        it = decode_only()
    elif args.source == "memory-inline":  # no threads at all: decode then ops in turn, bytes in memory

        def inline_memory():
            for b in itertools.cycle(range(len(batches))):
                yield pipe.process(pipe.decode(batches[b]), key_batches[b])

        it = inline_memory()
    elif args.source in ("feed-inline", "feed-worker"):  # no prefetch threads: read processes, then decode and ops in turn
        from gpubatch.engine.feed import FileFeed

        feed = FileFeed(files, keys, 256, pipe.plan, repeat=True, views=True, depth=6)

        def inline():
            tm = pipe.timings
            t = time.perf_counter()
            for fed in feed:
                t1 = time.perf_counter()
                tm["read_wait"] += t1 - t
                dec = pipe.decode(fed.blobs, fed.headers)
                t2 = time.perf_counter()
                tm["decode"] += t2 - t1
                out = pipe.process(dec, fed.keys, fed.params, fed.sizes, fed.windows)
                fed.done()
                t = time.perf_counter()
                tm["ops"] += t - t2
                yield out

        it = inline()
        if args.source == "feed-worker":  # the same, in one worker thread; this thread only consumes
            from gpubatch.engine.executor import prefetched

            it = prefetched(inline(), 2)
    else:
        it = pipe.iterate(source())
    for _ in range(args.warmup if args.warmup >= 0 else len(batches)):
        next(it)
    pipe.stream.synchronize()
    for k in pipe.timings:
        pipe.timings[k] = 0.0
    for k in pipe.engine.decoder.timings:
        pipe.engine.decoder.timings[k] = 0.0
    n, t0 = 0, time.perf_counter()
    lag: list = []
    for _ in range(2 * len(batches)):
        n += len(next(it))
        if args.sync == "batch":
            pipe.stream.synchronize()
        else:  # a consumer that keeps 2 batches in flight: wait for the one before last
            lag.append(pipe.stream.record())
            if len(lag) > 2:
                lag.pop(0).synchronize()
    pipe.stream.synchronize()
    rate = n / (time.perf_counter() - t0)
    it.close()  # no decode thread may run beside the measurement below
    host_ms = []
    if args.source != "decode-inline":  # host time of process() on decoded in-memory batches (draws here)
        import cupy as cp

        for b in range(4):
            res = pipe.decode(batches[b])
            cp.cuda.runtime.deviceSynchronize()
            h0 = time.perf_counter()
            pipe.process(res, key_batches[b])
            host_ms.append(1e3 * (time.perf_counter() - h0))
            pipe.stream.synchronize()
    out = {"source": args.source, "region_decode": args.region_decode, "sync": args.sync,
           "interval": sys.getswitchinterval(), "chain": args.chain,
           "images_per_s": round(rate),
           "stages_s": {k: round(v, 2) for k, v in pipe.timings.items()},
           "decoder_s": {k: round(v, 2) for k, v in pipe.engine.decoder.timings.items()},
           "cuda_share": pipe.engine.decoder.cuda_share,
           "process_host_ms": [round(x, 2) for x in host_ms]}
    print("RESULT " + json.dumps(out), flush=True)
    pipe.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--chain", default="train")
    ap.add_argument("--intervals", default="0.001,0.0002,0.00005")
    ap.add_argument("--sources", default="memory,files,feed,feed-inline")
    ap.add_argument("--warmup", type=int, default=-1, help="warm-up batches (default: one pass of the set)")
    ap.add_argument("--sync", default="batch", choices=("batch", "lag"),
                    help="synchronize after every batch, or keep 2 batches in flight")
    ap.add_argument("--region-decode", action="store_true", help="feed sources: decode only the crops' regions")
    ap.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.source:
        return one(args)
    jpeg_set(args.data, args.images)
    for source in args.sources.split(","):
        for interval in args.intervals.split(","):
            env = dict(os.environ, GPUBATCH_SWITCH_INTERVAL=interval)
            cmd = [sys.executable, __file__, "--images", str(args.images), "--data", args.data,
                   "--chain", args.chain, "--source", source, "--sync", args.sync, "--warmup", str(args.warmup)]
            if args.region_decode:
                cmd.append("--region-decode")
            try:
                p = subprocess.run(cmd, env=env, timeout=120, capture_output=True, text=True)
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
                print(lines[-1][7:] if lines else f"{source} {interval}: failed\n{p.stderr[-1500:]}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{source} {interval}: did not finish in 120 s", flush=True)


if __name__ == "__main__":
    main()
