#!/usr/bin/env python3
"""Engine benchmark: ResNet-50 train and val chains, transcode, the CPU path and a PyTorch DataLoader.

    python3 benchmarks/bench_engine.py [--images 4096] [--batch-size 256] [--repeats 5] [--json OUT]

Data: a synthetic ImageNet-like JPEG set (gpubatch.synthetic: ~500x400, mixed 4:2:0/4:2:2/4:4:4,
quality 75-97), generated once under --data and read from disk (page cache warm: it was just written
or read by the warm-up). Each contender runs in its own process, so its GPU memory is measured as
device memory in use (NVML) during the run minus before the process touched CUDA, context included.
Each figure is the median images/s of --repeats timed passes over the whole set after a warm-up pass;
the GPU is synchronized before every clock read. The files are read as ``ImagePipeline.iterate_files``
reads them (reader processes feeding the GPU path; the CPU path's worker processes read their own).
``batch_ms_p50``/``p99`` are the times between batches handed over (their kernels enqueued).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpubatch.bench.measure import GpuSampler  # noqa: E402
from gpubatch.bench.runner import environment  # noqa: E402

CONTENDERS = ["gpu-train", "gpu-val", "gpu-transcode", "cpu-train", "torch-dataloader-train"]


def files_of(data: Path, n: int) -> list[Path]:
    files = sorted(data.rglob("*.jpg"))[:n]
    if len(files) < n:
        raise SystemExit(f"{data} holds {len(files)} JPEGs, fewer than --images {n}")
    return files


def run_pipeline(name: str, args) -> dict:
    mem = GpuSampler()  # before CUDA is touched in this process
    from gpubatch.engine.ops import CenterCrop, Flip, Normalize, RandomResizedCrop, ResizeShorter
    from gpubatch.pipelines.image import ImagePipeline

    files = files_of(Path(args.data), args.images)
    keys = [f.name for f in files]
    chain = name.split("-", 1)[1]
    ops = ([RandomResizedCrop(224), Flip(p=0.5), Normalize(layout="CHW", dtype="float16")] if chain == "train"
           else [ResizeShorter(256), CenterCrop(224), Normalize(layout="CHW", dtype="float16")])
    device = "gpu" if name.startswith("gpu") else "cpu"
    B = args.batch_size
    per_pass = -(-len(files) // B)

    with ImagePipeline(ops, device=device, seed=0) as pipe:
        sync = pipe.engine.stream.synchronize if pipe.engine else (lambda: None)
        # the files read as every user of the pipeline reads them (iterate_files: reader processes on the
        # GPU path, the pipeline's worker processes on the CPU path), cycled; a pass is one set's batches
        it = pipe.iterate_files(files, keys, B, repeat=True)
        for _ in range(per_pass):  # the warm-up pass (the decoders' buffers grow to the set's sizes)
            next(it)
        sync()
        rates, lat = [], []
        for _ in range(args.repeats):  # the GPU synchronized before each pass's clock reads, not per batch:
            sync()                     # that would stop the next batches' decode overlapping this one's kernels
            t0 = time.perf_counter()
            last, n = t0, 0
            for _ in range(per_pass):
                n += len(next(it))
                now = time.perf_counter()
                lat.append(now - last)  # the time until each batch is handed over (its kernels enqueued)
                last = now
            sync()
            rates.append(n / (time.perf_counter() - t0))
        it.close()
        stats = dict(pipe.stats)
        timings = {k: round(v, 3) for k, v in pipe.timings.items()}
        if pipe.engine is not None:
            timings.update({f"decoder_{k}": round(v, 3) for k, v in pipe.engine.decoder.timings.items()})
            timings["cuda_share"] = round(pipe.engine.decoder.cuda_share, 3)
    lat.sort()
    return {"images_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "gpu_mem_gib": mem.summary()["gpu_mem_gib"], "hw_share": stats["hw"] / max(stats["gpu"], 1) if device == "gpu" else None,
            "fallbacks": stats["fallbacks"], "batch_ms_p50": 1e3 * lat[len(lat) // 2],
            "batch_ms_p99": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], "stage_seconds": timings}


def run_transcode(args) -> dict:
    mem = GpuSampler()
    import gpubatch

    data = Path(args.data)
    n = len(files_of(data, args.images))
    rates, e2e, stages = [], [], []
    with tempfile.TemporaryDirectory(dir=data.parent) as tmp:
        for rep in range(args.repeats + 1):
            stamps = []

            def progress(total, stamps=stamps):
                return lambda k: stamps.append(time.perf_counter())

            t0 = time.perf_counter()
            s = gpubatch.convert(data, Path(tmp) / f"out{rep}", to="folder", resize_shorter=256, quality=90,
                                 device="gpu", batch_size=args.batch_size, limit=args.images, progress=progress,
                                 gpu_procs=args.gpu_procs)
            if rep == 0:
                continue  # warm-up (kernel compile cache, page cache)
            assert s.records_out == n, s
            e2e.append(n / (time.perf_counter() - t0))
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
            stages.append({k: round(v, 3) for k, v in s.timings.items()})
    return {"images_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "end_to_end_images_per_s": statistics.median(e2e), "gpu_mem_gib": mem.summary()["gpu_mem_gib"],
            "stage_seconds": stages}


def run_dataloader(args) -> dict:
    try:
        import torch
        import torchvision.transforms as T
        from torchvision.datasets import ImageFolder
    except ImportError as e:
        return {"skipped": f"torch/torchvision not importable: {e}"}
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torch.utils.data.Subset(ImageFolder(args.data, transform=tf), range(args.images))
    workers = os.cpu_count()
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=workers,
                                     persistent_workers=True, prefetch_factor=4)
    for _ in dl:
        pass
    rates = []
    for _ in range(max(2, args.repeats // 2)):
        t0 = time.perf_counter()
        for _ in dl:
            pass
        rates.append(args.images / (time.perf_counter() - t0))
    return {"images_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "workers": workers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", default=str(ROOT / ".bench-data" / "mixed"))
    ap.add_argument("--only", default=",".join(CONTENDERS))
    ap.add_argument("--gpu-procs", type=int, default=None, help="GPU worker processes of the transcode (default: auto)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        fn = {"gpu-transcode": run_transcode, "torch-dataloader-train": run_dataloader}.get(args.run)
        res = fn(args) if fn else run_pipeline(args.run, args)
        print("RESULT " + json.dumps(res))
        return
    from gpubatch.synthetic import make_jpeg_set

    t0 = time.perf_counter()
    data = Path(args.data)
    # a folder of JPEGs made otherwise (no set marker, e.g. benchmarks/_data.linked_set's hard links) is taken as
    # it is: make_jpeg_set would write its files anew, through the links into the files they share
    if not (data.is_dir() and not any(data.glob(".complete-*")) and sum(1 for _ in data.rglob("*.jpg")) >= args.images):
        make_jpeg_set(data, args.images)
    print(f"data: {args.images} JPEGs in {args.data} (made or checked in {time.perf_counter() - t0:.1f} s)", flush=True)
    results = {"environment": environment(), "args": {k: v for k, v in vars(args).items() if k != "run"},
               "results": {}}
    for name in args.only.split(","):
        cmd = [sys.executable, "-X", "faulthandler", __file__, "--run", name, "--images", str(args.images), "--batch-size",
               str(args.batch_size), "--repeats", str(args.repeats), "--data", args.data]
        if args.gpu_procs:
            cmd += ["--gpu-procs", str(args.gpu_procs)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        res = json.loads(line[7:]) if line else {
            "error": f"exit {p.returncode}: " + " | ".join((p.stderr + p.stdout).strip().splitlines()[-12:])}
        results["results"][name] = res
        print(f"{name:24s} {json.dumps(res)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print("\n| contender | images/s (median) | min-max | GPU mem (GiB) |")
    print("|---|---|---|---|")
    for name, r in results["results"].items():
        if "images_per_s" in r:
            mem = f"{r['gpu_mem_gib']:.2f}" if r.get("gpu_mem_gib") is not None else "-"
            print(f"| {name} | {r['images_per_s']:,.0f} | {r['min']:,.0f}-{r['max']:,.0f} | {mem} |")
        else:
            print(f"| {name} | {r.get('skipped') or r.get('error')} | | |")


if __name__ == "__main__":
    main()
