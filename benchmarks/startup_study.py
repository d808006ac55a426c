#!/usr/bin/env python3
"""What a GPU worker spends before its first batch, and whether warming the decoders with tiny images
takes the first real batch's extra cost away.

    python3 benchmarks/startup_study.py [--images 1024] [--warm none,none,tiny,tiny256]
    python3 benchmarks/startup_study.py --warm pipe0,pipe256,pipe0,pipe256

Each warm-up mode runs in its own process (cold, like a ``convert`` worker): imports, the engine (CUDA
context, decoders with the hardware decoder preallocated as the workers do), the kernels' first load,
then the warm-up (``tiny``: one 64x64 JPEG of each subsampling through each decoder; ``tiny256``: 256
of them, as ``GpuEngine.warm_up`` does), then the real batches of the synthetic mixed set (256 each, the stream synchronized after
every batch). Seconds per step. The first process compiles the kernels CuPy has not cached yet, so the
default runs "none" twice.

``pipeN`` times the public API instead: making ``ImagePipeline`` (the ResNet-50 training chain,
``warm_up=N``, so ``pipe256`` is the default and ``pipe0`` skips the warm-up), then its first batches
(``pipe(blobs)``, synchronized). What the warm-up costs is the difference in "pipeline made"; what it
saves shows in the first batches.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _data import DEFAULT_DATA, jpeg_set, load_blobs  # noqa: E402  (benchmarks/_data.py, beside this script)


def pipeline(a: argparse.Namespace) -> dict:
    t = {}
    t0 = time.perf_counter()
    import cupy as cp

    from gpubatch.engine.pipeline import ImagePipeline
    from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop

    t["imports"] = time.perf_counter() - t0
    _, _, batches = load_blobs(a.data, a.images)
    t1 = time.perf_counter()
    pipe = ImagePipeline([RandomResizedCrop(224), Flip(p=0.5), Normalize(layout="CHW", dtype="float16")],
                         device="gpu", warm_up=int(a.warm[4:]))
    cp.cuda.Device().synchronize()
    t["pipeline made"] = time.perf_counter() - t1
    for b, blobs in enumerate(batches[:4]):
        t1 = time.perf_counter()
        out = pipe(blobs)
        cp.cuda.Device().synchronize()
        t[f"batch {b}"] = time.perf_counter() - t1
        del out
    t["total"] = time.perf_counter() - t0
    pipe.close()
    return t


def one(a: argparse.Namespace) -> dict:
    if a.warm.startswith("pipe"):
        return pipeline(a)
    t = {}
    t0 = time.perf_counter()
    import cupy as cp
    from nvidia import nvimgcodec  # noqa: F401

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.gpu_engine import GpuEngine

    t["imports"] = time.perf_counter() - t0
    _, _, batches = load_blobs(a.data, a.images)
    t1 = time.perf_counter()
    engine = GpuEngine(Device(DeviceKind.GPU, 0, reason="study"), 15, None, hw_preallocate=(256, 640, 640))
    t["engine"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    from gpubatch.engine.kernels import kernel

    kernel("resample", "resample_f16_chw")
    kernel("resample", "resample_u8_hwc")
    t["kernels (resample)"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    engine.encoder.encode([cp.zeros((64, 64, 3), cp.uint8)], "jpeg", 90, engine.stream)
    t["JPEG encoder, first use"] = time.perf_counter() - t1
    dec = engine.decoder
    if a.warm != "none":
        from gpubatch.engine.codecs.image_gpu import _tiny_jpegs  # what GpuEngine.warm_up decodes

        tiny = _tiny_jpegs(3 if a.warm == "tiny" else 256)
        for name, d, s in (("hw", dec.hw, dec.hw_stream), ("cuda", dec.cuda, dec.cuda_stream)):
            t1 = time.perf_counter()
            dec._call(d, s, tiny)
            s.synchronize()
            t[f"warm-up {a.warm} ({name})"] = time.perf_counter() - t1
    for b, blobs in enumerate(batches[:4]):
        t1 = time.perf_counter()
        res = dec.decode(blobs, engine.stream)
        engine.stream.synchronize()
        t[f"batch {b}"] = time.perf_counter() - t1
        del res
    t["total"] = time.perf_counter() - t0
    engine.close()
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--warm", default="none,none,tiny,tiny256")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a)), flush=True)
        return
    jpeg_set(a.data, a.images)
    for mode in a.warm.split(","):
        p = subprocess.run([sys.executable, __file__, "--one", "--warm", mode, "--images", str(a.images),
                            "--data", a.data], capture_output=True, text=True)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{mode}: failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        r = json.loads(line[7:])
        print(f"warm-up {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
