#!/usr/bin/env python3
"""Where a GPU worker of ``convert``/``augment`` spends its time: its loop (RecordFeed -> decode thread ->
chain -> JPEG encode) run here, in one process, batch by batch, over several passes of the set.

    python3 benchmarks/worker_study.py [--images 4096] [--preset resnet50-train] [--copies 2]
        [--transcode] [--passes 3] [--modes full,chain,decode] [--feed-workers 2] [--threads 8]
        [--jpeg-encoder batched|nvimagecodec]

Modes: ``full`` as a worker runs (outputs encoded); ``chain`` the chain without the encode (the stream
synchronized per batch); ``decode`` decode only. Per pass: source and output images/s; per batch of
the first pass: decode-thread and chain+encode milliseconds, to see how long the decoders take to warm up.
Each mode runs in its own process (its own CUDA context, cold like a ``convert`` run).
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

from _data import DEFAULT_DATA, ROOT  # noqa: E402  (benchmarks/_data.py, beside this script)


def one(a: argparse.Namespace) -> dict:
    from gpubatch.engine import spec
    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.feed import RecordFeed
    from gpubatch.engine.gpu_engine import GpuEngine, decode_ahead
    from gpubatch.engine.gpu_worker import transform_fed
    from gpubatch.engine.plan import Plan, make_plan
    from gpubatch.errors import RunStats
    from gpubatch.formats import open_reader
    from gpubatch.synthetic import make_jpeg_set

    src = make_jpeg_set(Path(a.data), a.images)
    reader = open_reader(src, "folder")
    entries = reader.entries()[: a.images]
    entries = entries[a.rotate * 256 :] + entries[: a.rotate * 256]  # which batch comes first
    if a.transcode:
        plan = make_plan(resize_shorter=256, quality=90)
    else:
        plan = Plan(ops=spec.preset(a.preset), quality=90, copies=a.copies)
    t0 = time.perf_counter()
    feed = RecordFeed(src, "folder", entries * a.passes, plan, 256, workers=a.feed_workers, depth=4)
    feed.start()
    pre = tuple(int(x) for x in a.hw_preallocate.split("x")) if a.hw_preallocate else None
    engine = GpuEngine(Device(DeviceKind.GPU, 0, reason="study"), a.threads, None, deterministic=True,
                       jpeg_encoder=a.jpeg_encoder, hw_preallocate=pre, decoder_options=a.decoder_options or "")
    if a.release_threshold is not None:  # the driver pool nvImageCodec allocates decoded images from
        pool = engine.cp.cuda.runtime.deviceGetDefaultMemPool(0)
        engine.cp.cuda.runtime.memPoolSetAttribute(pool, 4, a.release_threshold)
    init = time.perf_counter() - t0
    tm = {"read_wait": 0.0, "decode": 0.0, "decode_wait": 0.0}
    per_batch, passes = [], []
    nb = -(-len(entries) // 256)
    t_pass, n_src, n_out = time.perf_counter(), 0, 0

    def decode(fed):
        if a.mode == "feed":
            return None
        return engine.decoder.decode(fed.blobs, engine.stream, plan.max_pixels, order=False, headers=fed.headers)

    last = dict(tm)
    for b, (fed, res) in enumerate(decode_ahead(decode, feed, 2, tm)):
        t1 = time.perf_counter()
        if a.mode == "full":
            out = transform_fed(engine, plan, fed, res, RunStats())
            n_out += len(out)
            if a.pickle:  # what sending the batch to the writer process costs this one
                pickle.dumps(("batch", out), protocol=pickle.HIGHEST_PROTOCOL)
        elif a.mode == "chain":
            from gpubatch.engine.batch import Ragged
            from gpubatch.engine.gpu_chain import run_chain

            res.order(engine.stream)
            arrays = [res.arrays[j.source] for j in fed.jobs]
            run_chain(engine, plan.ops, Ragged.from_items(engine.cp, arrays), [j.params for j in fed.jobs],
                      first=fed.windows)
            engine.stream.synchronize()
            n_out += len(fed.jobs)
        elif a.mode == "decode":
            res.order(engine.stream)
            engine.stream.synchronize()
        del res
        fed.done()
        n_src += len(fed.blobs)
        if b < nb:
            per_batch.append({"decode_ms": round(1e3 * (tm["decode"] - last["decode"]), 1),
                              "wait_ms": round(1e3 * (tm["decode_wait"] - last["decode_wait"]), 1),
                              "work_ms": round(1e3 * (time.perf_counter() - t1), 1)})
        last = dict(tm)
        if (b + 1) % nb == 0:
            dt = time.perf_counter() - t_pass
            passes.append({"sources_per_s": round(n_src / dt), "outputs_per_s": round(n_out / dt)})
            t_pass, n_src, n_out = time.perf_counter(), 0, 0
    feed.close()
    return {"mode": a.mode, "init_s": round(init, 2), "passes": passes, "first_pass": per_batch,
            "decoder_timings": {k: round(v, 2) for k, v in engine.decoder.timings.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--preset", default="resnet50-train")
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--transcode", action="store_true", help="resize-shorter 256, JPEG q90 (convert's transcode)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--modes", default="full,chain,decode")
    ap.add_argument("--feed-workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--jpeg-encoder", default="batched", help="batched (gpubatch's kernels) or nvimagecodec")
    ap.add_argument("--hw-preallocate", default=None, help="BxHxW: the hardware decoder's preallocation hints")
    ap.add_argument("--decoder-options", default="", help="extra nvImageCodec decoder options")
    ap.add_argument("--rotate", type=int, default=0, help="start at this batch of the set")
    ap.add_argument("--release-threshold", type=int, default=None, help="bytes the driver pool keeps")
    ap.add_argument("--pickle", action="store_true", help="full: also pickle each finished batch")
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mode:
        print("RESULT " + json.dumps(one(a)))
        return
    for mode in a.modes.split(","):
        cmd = [sys.executable, __file__, "--mode", mode] + [x for x in sys.argv[1:]]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(mode, "failed:", (p.stderr + p.stdout)[-2000:])
            continue
        r = json.loads(line[7:])
        print(f"{mode:7s} init {r['init_s']} s, passes {r['passes']}, decoder {r['decoder_timings']}")
        print("        first pass per batch (decode/wait/work ms): "
              + " ".join(f"{x['decode_ms']:.0f}/{x['wait_ms']:.0f}/{x['work_ms']:.0f}" for x in r["first_pass"]))


if __name__ == "__main__":
    main()
