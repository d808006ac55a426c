#!/usr/bin/env python3
"""FLAC decoded on the GPU (``kernels/flac.cu``) beside libsndfile on the CPU, on the same clips.

    python3 benchmarks/flac_gpu.py [--clips 2048] [--batches 64,256,1024] [--reps 7] [--kernel NAME=PATH ...] \\
        [--stack BYTES] [--data-root DIR] [--json out.json]

The clips: gpubatch.synthetic's speech-like 10-s FLAC at 16 kHz (the convert bench's), made once under
``--data-root``. Prints, per kernel source (the package's, and any ``--kernel`` given, compiled alike) and batch size,
the kernel's time a batch (CUDA events around the launch, one untimed launch first, the median of ``--reps``) and its
clips/s, with every frame's status and every record checked against libsndfile's float32, bit for bit; the whole
``decode_on_gpu`` call (the table, the launch, the status read back, the outputs' views) a batch; the host's share:
finding the frames (``flac_gpu.pack``) and, for scale, libsndfile's whole decode, per clip on one core.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=2048)
    ap.add_argument("--batches", default="64,256,1024")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--kernel", action="append", default=[], help="NAME=PATH: another flac.cu to time beside")
    ap.add_argument("--stack", type=int, default=0, help="also time each kernel with the CUDA stack limit (bytes a "
                    "thread) set to this, after the default")
    ap.add_argument("--data-root", default=".bench-data")
    ap.add_argument("--json")
    args = ap.parse_args()

    import cupy as cp
    import soundfile as sf

    from gpubatch.engine.codecs import flac_gpu
    from gpubatch.engine.kernels import source
    from gpubatch.synthetic import make_audio_set

    paths = make_audio_set(Path(args.data_root) / f"flac-{args.clips}", args.clips, seconds=(10.0, 10.0), fmt="flac")
    blobs = [p.read_bytes() for p in paths]
    out: dict = {"clips": len(blobs), "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "kernels": {}}

    t = time.perf_counter()
    packed = [flac_gpu.pack(b) for b in blobs]
    out["pack_ms_per_clip"] = round((time.perf_counter() - t) / len(blobs) * 1e3, 4)
    sample = blobs[: min(200, len(blobs))]
    t = time.perf_counter()
    refs = [sf.read(io.BytesIO(b), dtype="float32", always_2d=True)[0].T for b in sample]
    out["libsndfile_ms_per_clip"] = round((time.perf_counter() - t) / len(sample) * 1e3, 4)
    print(f"host, one core: frames found {out['pack_ms_per_clip']} ms a clip; libsndfile's decode "
          f"{out['libsndfile_ms_per_clip']} ms a clip")

    sources = {"package": source("flac")}
    for spec in args.kernel:
        name, path = spec.split("=", 1)
        sources[name] = Path(path).read_text()
    batches = [int(x) for x in args.batches.split(",")]
    for name, text in sources.items():
        fn = cp.RawModule(code=text, options=("-std=c++17", "-DKEEP_flac_frames")).get_function("flac_frames")
        attrs = {a: getattr(fn, a, None) for a in ("num_regs", "local_size_bytes", "shared_size_bytes", "const_size_bytes")}
        print(f"{name:>10}: {attrs}")
        res = {"attributes": attrs}
        runs = [(n, 0) for n in batches] + ([(n, args.stack) for n in batches] if args.stack else [])
        for n, stack in runs:
            if stack:
                cp.cuda.runtime.deviceSetLimit(0x00, stack)  # (cudaLimitStackSize)
            limit = cp.cuda.runtime.deviceGetLimit(0x00)
            n = min(n, len(blobs))
            items = list(zip(np.cumsum([0] + [len(b) for b in blobs[: n - 1]]).tolist(), [p.samples for p in packed[:n]]))
            buf = cp.asarray(np.frombuffer(b"".join(blobs[:n]) + bytes(flac_gpu.PAD), np.uint8))
            table, places = flac_gpu.table(items)
            dev_t = cp.asarray(table)
            outf = cp.empty(sum(c * nd for _, c, nd in places), cp.float32)
            status = cp.empty(len(table), cp.int32)
            grid = ((len(table) + 31) // 32,)
            fn(grid, (32,), (buf, dev_t, outf, status, np.int32(len(table))))
            cp.cuda.Device().synchronize()
            times = []
            for _ in range(args.reps):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                fn(grid, (32,), (buf, dev_t, outf, status, np.int32(len(table))))
                b.record()
                b.synchronize()
                times.append(cp.cuda.get_elapsed_time(a, b))
            st = status.get()
            host = outf.get()
            exact = all(np.array_equal(host[o: o + c * nd].reshape(c, nd), refs[i])
                        for i, (o, c, nd) in enumerate(places[: len(refs)]))
            ms = statistics.median(times)
            res[f"{n}/stack {limit}"] = {"frames": len(table), "kernel_ms": round(ms, 3),
                                         "kernel_clips_per_s": round(n / ms * 1e3),
                                         "refused_frames": int((st != 0).sum()), "bit_exact": bool(exact)}
            print(f"{name:>10} batch {n:5d} stack {limit:5d}: {len(table):6d} frames, kernel {ms:8.3f} ms "
                  f"({n / ms * 1e3:10,.0f} clips/s), frames refused {int((st != 0).sum())}, libsndfile's samples: {exact}")
        out["kernels"][name] = res
    # the whole call, as the GPU audio unit makes it, with the package's kernel
    n = min(256, len(blobs))
    items = [(int(o), p) for o, p in zip(np.cumsum([0] + [len(b) for b in blobs[: n - 1]]), packed[:n])]
    buf = cp.asarray(np.frombuffer(b"".join(blobs[:n]) + bytes(flac_gpu.PAD), np.uint8))
    flac_gpu.decode_on_gpu(buf, items)
    times = []
    for _ in range(args.reps):
        t = time.perf_counter()
        flac_gpu.decode_on_gpu(buf, items)
        times.append(time.perf_counter() - t)
    out["decode_on_gpu_ms_batch_256"] = round(statistics.median(times) * 1e3, 3)
    print(f"decode_on_gpu, a batch of {n}: {out['decode_on_gpu_ms_batch_256']} ms (table, launch, status back, views)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
