#!/usr/bin/env python3
"""Where the GPU train chain spends its time: each stage alone, the GPU synchronized per batch.

    python3 benchmarks/profile_stages.py [--images 2048] [--batch-size 256] [--data DIR]

Stages: nvImageCodec decode per backend and per chroma subsampling, gpubatch's routed decoder, the
DLPack hand-off, host-side parameter drawing, and the fused resample kernel (CUDA events).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _data import DEFAULT_DATA, load_blobs  # noqa: E402  (benchmarks/_data.py, beside this script)


def rate(fn, batches, repeats=3) -> float:
    fn(batches[0])
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = 0
        for b in batches:
            fn(b)
            n += len(b)
        out.append(n / (time.perf_counter() - t0))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    args = ap.parse_args()
    import cupy as cp
    from nvidia import nvimgcodec as nic

    from gpubatch.engine.codecs.headers import jpeg_subsampling
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder
    from gpubatch.engine.device import resolve
    from gpubatch.engine.gpu_engine import GpuEngine
    from gpubatch.engine.pipeline import chain_windows
    from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop
    from gpubatch.engine.plan import Plan
    B = args.batch_size
    _, blobs, batches = load_blobs(args.data, args.images, B)
    subs = [jpeg_subsampling(b) for b in blobs]
    print("subsampling mix:", {s: subs.count(s) for s in set(subs)})
    stream = cp.cuda.Stream(non_blocking=True)
    params = nic.DecodeParams(apply_exif_orientation=True, color_spec=nic.ColorSpec.SRGB)

    def dec_fn(decoder):
        def f(b):
            decoder.decode(b, params=params, cuda_stream=stream.ptr)
            stream.synchronize()
        return f

    hw_opts = (f"nvjpeg_hw_decoder:preallocate_batch_size={B} nvjpeg_hw_decoder:preallocate_width_hint=640 "
               "nvjpeg_hw_decoder:preallocate_height_hint=640")
    decoders = {
        "default Decoder()": nic.Decoder(),
        "HW_GPU_ONLY": nic.Decoder(backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)], options=hw_opts),
        "HYBRID gpu-huffman": nic.Decoder(backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)],
                                          options="nvjpeg_cuda_decoder:hybrid_huffman_threshold=0"),
        "HYBRID cpu-huffman": nic.Decoder(backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)]),
    }
    for name, d in decoders.items():
        print(f"{name:28s} mixed: {rate(dec_fn(d), batches):8,.0f} img/s", flush=True)
    for s in ("4:2:0", "4:2:2", "4:4:4"):
        only = [b for b, k in zip(blobs, subs) if k == s]
        ob = [only[i : i + B] for i in range(0, len(only), B)]
        for name in ("HW_GPU_ONLY", "HYBRID gpu-huffman"):
            print(f"{name:28s} {s}: {rate(dec_fn(decoders[name]), ob):8,.0f} img/s", flush=True)
    del decoders

    dev = resolve("gpu")
    eng = GpuEngine(dev, cpu_threads=16)
    dec: GpuImageDecoder = eng.decoder

    def routed(b):
        r = dec.decode(b, eng.stream)
        eng.stream.synchronize()
        return r

    print(f"{'gpubatch routed decode':28s} mixed: {rate(routed, batches):8,.0f} img/s  "
          f"(hw takes {sorted(dec.hw_takes)}, refuses {sorted(dec.hw_refuses)})", flush=True)
    plan = Plan(ops=(RandomResizedCrop(224), Flip(), Normalize()))
    t0 = time.perf_counter()
    for i in range(len(blobs)):
        plan.draw(f"k{i}", 400, 500)
    print(f"{'plan.draw per image':28s} {1e6 * (time.perf_counter() - t0) / len(blobs):8.1f} us", flush=True)
    res = routed(batches[0])
    t0 = time.perf_counter()
    for img in res.keep:
        cp.from_dlpack(img)
    print(f"{'from_dlpack per image':28s} {1e6 * (time.perf_counter() - t0) / max(len(res.keep), 1):8.1f} us")
    arrays = res.arrays
    wins, norm = [], None
    for i, a in enumerate(arrays):
        w, norm = chain_windows(plan.ops, plan.draw(f"k{i}", *a.shape[:2]), *a.shape[:2])
        wins.append(w)
    out = None
    for _ in range(3):
        out = eng.launch.resample(arrays, wins, norm, out=None if out is None else out.buffer)
    eng.stream.synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        e0.record(eng.stream)
        out = eng.launch.resample(arrays, wins, norm, out=out.buffer)
        e1.record(eng.stream)
        host_ms = 1e3 * (time.perf_counter() - t0)
        e1.synchronize()
        times.append((cp.cuda.get_elapsed_time(e0, e1), host_ms))
    gpu_ms = statistics.median(t[0] for t in times)
    host_ms = statistics.median(t[1] for t in times)
    print(f"{'resample train (256)':28s} gpu {gpu_ms:.2f} ms, host launch path {host_ms:.2f} ms per batch")
    eng.close()


if __name__ == "__main__":
    main()
