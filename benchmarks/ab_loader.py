#!/usr/bin/env python3
"""The training loader on two or more gpubatch trees, round after round, and the ratio of each to the first
taken round by round: an effect of a few percent told apart from a machine whose runs spread by a fifth.

    python3 benchmarks/ab_loader.py --data DATASET --tree OLD --tree NEW[::VAR=VALUE,...] [--rounds 8] \\
        [--seconds 4] [--chain train] [--device gpu] [--dali] [--json out.json]

Each run is ``benchmarks/loader_alone.py`` (this checkout's) in a process of its own, importing the tree's
``gpubatch`` (as ``ab_trees.py`` has trees: a checkout or a folder holding the package; settings after ``::``
are the run's environment): one untimed epoch, then ``--seconds`` of batches of the bench's ResNet-50 chain. A
round runs every contender once, in an order that turns over from round to round (the first contender first in
even rounds, last in odd ones), so that neither the machine's drift nor a run's place in the round falls on one
tree alone. The verdict is the median over rounds of each round's ratio to the first contender, with a 90%
interval of that median (10,000 resamplings of the rounds, a fixed seed): an interval that holds 1.0 is no
effect told apart. The bench's rounds (``gpubatch bench --data``) time a contender once per call, and the runs
of one tree spread 14,700-21,200 images/s on one H200 machine (benchmarks/RESULTS.md, 2026-12-03 "21:48 to
22:25"): seven pairs could not tell apart an effect of 5%.

``--dali`` puts DALI's reader of the dataset's format (``loader_alone.py --contender dali-reader``: the bench's
``dali-reader``, its peak GPU memory read through NVML per process, as the loader's runs read theirs) first in every
round, as the reference: each tree's ratio is then to DALI, round by round, and so is its memory. One tree is
then enough.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_trees import _contender, compiled  # noqa: E402  (trees and their settings, as ab_trees has them)

DALI = "dali-reader"  # (--dali: the reference contender's name)


def median_interval(ratios: list[float], level: float = 0.9, resamples: int = 10_000, seed: int = 0
                    ) -> tuple[float, float]:
    """A ``level`` percentile interval of the median of ``ratios`` (resampled with replacement, a fixed seed)."""
    import numpy as np

    r = np.asarray(ratios, float)
    rng = np.random.default_rng(seed)
    meds = np.median(r[rng.integers(0, len(r), (resamples, len(r)))], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a dataset gpubatch wrote (webdataset shards, say)")
    ap.add_argument("--tree", action="append", required=True,
                    help="a gpubatch tree, maybe with settings: PATH[::VAR=VALUE,...] (repeat; the first is the reference)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--chain", default="train", choices=("train", "val"))
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    ap.add_argument("--dali", action="store_true", help="DALI's reader of the format as the reference, each round")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    contenders = [_contender(t) for t in a.tree]
    if len(contenders) < 2 - a.dali:
        sys.exit("ab_loader: name two trees or more (--tree OLD --tree NEW), or one with --dali")
    compiled(sorted({t for _, t, _ in contenders}))
    if a.dali:  # (run with the first tree on the path: the bench's reader and chain)
        contenders.insert(0, (DALI, contenders[0][1], {}))
    script = ROOT / "benchmarks" / "loader_alone.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = [sys.executable, str(script), "--data", str(a.data.resolve()), "--seconds", str(a.seconds), "--chain",
           a.chain, "--batch-size", str(a.batch_size), "--device", a.device, "--json"]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in contenders}
    with tempfile.TemporaryDirectory(prefix="ab-loader-") as tmp:  # (run outside every tree: see ab_trees)
        for r in range(a.rounds):
            for name, tree, settings in (contenders if r % 2 == 0 else contenders[::-1]):
                path = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])
                extra = ["--contender", DALI] if name == DALI else []
                p = subprocess.run(cmd + extra, env={**env, **settings, "PYTHONPATH": path}, capture_output=True,
                                   text=True, cwd=tmp)
                if p.returncode:
                    sys.exit(f"{name}: exit {p.returncode}: {p.stderr.strip()[-1500:]}")
                got = json.loads(p.stdout.strip().splitlines()[-1])
                runs[name].append({"round": r, **{k: got.get(k) for k in ("images_per_s", "images", "seconds", "decode_wait",
                                                                                  "gpu_memory_mib", "cpu_cores")}})
    first = contenders[0][0]
    report: dict = {"data": str(a.data), "chain": a.chain, "device": a.device, "seconds": a.seconds,
                    "batch_size": a.batch_size, "rounds": a.rounds, "cores": os.cpu_count(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reference": first, "trees": {}}
    for name, rs in runs.items():
        rates = [x["images_per_s"] for x in rs]
        entry = {"images_per_s_median": round(statistics.median(rates), 1), "min": round(min(rates), 1),
                 "max": round(max(rates), 1), "gpu_memory_mib_max": max((x["gpu_memory_mib"] or 0) for x in rs), "runs": rs}
        cores = [x["cpu_cores"] for x in rs if x.get("cpu_cores") is not None]
        entry["cpu_cores_median"] = round(statistics.median(cores), 2) if cores else None
        if name != first:
            ratios = [x["images_per_s"] / y["images_per_s"] for x, y in zip(rs, runs[first])]
            lo, hi = median_interval(ratios)
            entry.update(ratio_median=round(statistics.median(ratios), 4), ratio_interval_90=[round(lo, 4), round(hi, 4)],
                         told_apart=not lo <= 1.0 <= hi)
        report["trees"][name] = entry
    text = json.dumps(report, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    for name, e in report["trees"].items():
        ratio = (f"  {e['ratio_median']:.3f}x the first, 90% interval {e['ratio_interval_90'][0]:.3f}-"
                 f"{e['ratio_interval_90'][1]:.3f}" + ("" if e["told_apart"] else " (not told apart)")
                 if "ratio_median" in e else "  (the reference)")
        print(f"{name}: {e['images_per_s_median']:,.0f} images/s (median; {e['min']:,.0f}-{e['max']:,.0f}), "
              f"GPU memory at most {e['gpu_memory_mib_max']} MiB, {e['cpu_cores_median']} CPU cores{ratio}")


if __name__ == "__main__":
    main()
