#!/usr/bin/env python3
"""The in-memory pipeline (``ImagePipeline.iterate``) under the conditions that decide its speed:
where the bytes come from (pre-read in memory; read from disk by reader threads; read by reader
processes, ``iterate_files``; the same with decode and ops inline in one thread) and the GIL switch
interval the engine sets. Each condition runs in its own process.

    python3 benchmarks/pipeline_study.py [--images 4096] [--chain train|val]
        [--intervals 0.001,0.0002,0.00005] [--sources memory,files,feed,feed-inline]

Images/s over 2 passes of the set after 3 warm-up batches, batch 256, the stream synchronized after
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

from _data import DEFAULT_DATA, load_blobs  # noqa: E402  (benchmarks/_data.py, beside this script)


def one(args: argparse.Namespace) -> None:
    from gpubatch.bench import chain_ops, get_model
    from gpubatch.engine.gpu_executor import ImagePipeline

    files, blobs, batches = load_blobs(args.data, args.images)
    keys = [f"{p.parent.name}/{p.stem}" for p in files]
    key_batches = [keys[i : i + 256] for i in range(0, len(keys), 256)]
    ops = chain_ops(get_model("resnet50").chains[args.chain])
    pipe = ImagePipeline(ops, device="gpu", seed=0)
    io = ThreadPoolExecutor(4)

    def source():
        for b in itertools.cycle(range(len(batches))):
            if args.source == "memory":
                yield batches[b], key_batches[b]
            else:
                yield list(io.map(Path.read_bytes, files[b * 256 : (b + 1) * 256])), key_batches[b]

    if args.source == "feed":
        it = pipe.iterate_files(files, keys, 256, repeat=True)
    elif args.source == "feed-inline":  # no prefetch threads: read processes, then decode and ops in turn
        from gpubatch.engine.feed import FileFeed

        feed = FileFeed(files, keys, 256, pipe.plan, repeat=True)

        def inline():
            for fed in feed:
                yield pipe.process(pipe.decode(fed.blobs), fed.keys, fed.params, fed.sizes)

        it = inline()
    else:
        it = pipe.iterate(source())
    for _ in range(3):
        next(it)
    pipe.stream.synchronize()
    for k in pipe.timings:
        pipe.timings[k] = 0.0
    for k in pipe.engine.decoder.timings:
        pipe.engine.decoder.timings[k] = 0.0
    n, t0 = 0, time.perf_counter()
    for _ in range(2 * len(batches)):
        n += len(next(it))
        pipe.stream.synchronize()
    rate = n / (time.perf_counter() - t0)
    it.close()
    out = {"source": args.source, "interval": sys.getswitchinterval(), "chain": args.chain,
           "images_per_s": round(rate),
           "stages_s": {k: round(v, 2) for k, v in pipe.timings.items()},
           "decoder_s": {k: round(v, 2) for k, v in pipe.engine.decoder.timings.items()},
           "cuda_share": pipe.engine.decoder.cuda_share}
    print("RESULT " + json.dumps(out), flush=True)
    pipe.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--chain", default="train")
    ap.add_argument("--intervals", default="0.001,0.0002,0.00005")
    ap.add_argument("--sources", default="memory,files,feed,feed-inline")
    ap.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.source:
        return one(args)
    load_blobs(args.data, args.images)
    for source in args.sources.split(","):
        for interval in args.intervals.split(","):
            env = dict(os.environ, GPUBATCH_SWITCH_INTERVAL=interval)
            cmd = [sys.executable, __file__, "--images", str(args.images), "--data", args.data,
                   "--chain", args.chain, "--source", source]
            try:
                p = subprocess.run(cmd, env=env, timeout=120, capture_output=True, text=True)
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
                print(lines[-1][7:] if lines else f"{source} {interval}: failed\n{p.stderr[-1500:]}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{source} {interval}: did not finish in 120 s", flush=True)


if __name__ == "__main__":
    main()
