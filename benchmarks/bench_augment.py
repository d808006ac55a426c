#!/usr/bin/env python3
"""Augment benchmark: decode + augment + JPEG encode + write, output images per second.

    python3 benchmarks/bench_augment.py [--images 4096] [--preset resnet50-train] [--copies 2]
                                        [--to webdataset] [--device gpu] [--repeats 3] [--json OUT]

Data: the synthetic ImageNet-like JPEG set of gpubatch.synthetic (~500x400, mixed 4:2:0/4:2:2/4:4:4,
quality 75-97), generated once under --data and read from disk (page cache warm after the warm-up run).
Each timed run is a whole ``gpubatch.augment`` call, output staged and renamed as users get it, to a
fresh folder under --out. Two figures per run: steady state (records written between the first and the
last write, what a long run converges to) and end to end (records / wall seconds of the whole call,
engine start-up included). The headline is the median steady-state rate of --repeats runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--preset", default="resnet50-train")
    ap.add_argument("--ops", default=None, help="a chain instead of --preset")
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--to", default="webdataset")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-procs", type=int, default=None)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "gpubatch-bench")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "gpubatch-bench-out")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import gpubatch
    from gpubatch.synthetic import make_jpeg_set

    src = make_jpeg_set(a.data / f"jpeg-{a.images}", a.images)
    chain = {"ops": a.ops} if a.ops else {"preset": a.preset}
    kw = dict(copies=a.copies, to=a.to, device=a.device, batch_size=a.batch_size, quality=a.quality,
              overwrite=True, gpu_procs=a.gpu_procs, **chain)
    a.out.mkdir(parents=True, exist_ok=True)
    gpubatch.augment(src, a.out / "warmup", limit=min(a.images, 4 * a.batch_size), **kw)
    runs = []
    for i in range(a.repeats):
        dst = a.out / f"run{i}"
        stamps: list[float] = []

        def progress(total, stamps=stamps):
            return lambda k: stamps.append(time.perf_counter())

        t0 = time.perf_counter()
        s = gpubatch.augment(src, dst, progress=progress, **kw)
        dt = time.perf_counter() - t0
        steady = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        runs.append({"seconds": dt, "records_in": s.records_in, "records_out": s.records_out,
                     "out_per_s": steady, "end_to_end_out_per_s": s.records_out / dt, "device": s.device,
                     "skipped": len(s.skipped), "stage_seconds": s.timings})
        shutil.rmtree(dst, ignore_errors=True)
        print(f"run {i}: {s.records_out} images out in {dt:.2f} s: steady {steady:,.0f} images/s, "
              f"end to end {s.records_out / dt:,.0f} ({s.device})")
        print("   stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in s.timings.items()))
    med = statistics.median(r["out_per_s"] for r in runs)
    result = {"benchmark": "augment", "chain": a.ops or a.preset, "copies": a.copies, "to": a.to,
              "images_in": a.images, "batch_size": a.batch_size, "quality": a.quality,
              "median_out_per_s": round(med, 1), "runs": runs, "host": platform.node(),
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"median: {med:,.0f} output images/s ({a.ops or a.preset}, copies {a.copies}, -> {a.to})")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
