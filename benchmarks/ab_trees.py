#!/usr/bin/env python3
"""One ``convert`` command on two or more gpubatch trees in turn: whole-process wall time and the run's own
``--json`` timings, per tree, side by side on one machine.

    python3 benchmarks/ab_trees.py --src DIR --tree OLD --tree NEW [--repeats 3] [--json out.json] \\
        -- --to webdataset --resize-shorter 256 --center-crop 224 --quality 90 --device gpu

A tree may carry settings for its runs: ``--tree NEW::GPUBATCH_DECODE_AHEAD=3,GPUBATCH_SHARD_WRITER=thread`` (the same
tree with and without them are then two contenders), and options of its own after ``++``, added to the command's:
``--tree "NEW++--gpu-procs 2"``. Each round runs every tree once, in turn (the machine's drift falls on each alike), each round beginning with the
next tree (since 2026-12-06; ``--fixed-order``: the order given, every round, as before); the first round is
untimed (page cache, CuPy's kernel cache, each tree's bytecode). A tree is a checkout, or a folder that holds
the ``gpubatch`` package (``git archive REV gpubatch | tar -x -C DIR``); its modules are byte-compiled first,
as an install has them. Prints, per tree, images/s of the median run, each run's seconds, and the medians of
the summary's timings (the first batch, the GPU start's steps, the stages); with ``--steps``, instead, per tree its
runs and when each step of the run came (the medians of its ``wall`` timings, the GPU worker's ``wall (worker): NAME``
among them, in the order they came). The commands run from a folder
outside every tree: ``python -m`` puts the working directory first on the path, so a run from a checkout
imports that checkout's gpubatch whatever PYTHONPATH names.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def count(src: Path) -> int:
    return sum(1 for p in src.rglob("*") if p.is_file() and not p.name.startswith("."))


def compiled(trees: list[Path]) -> None:
    """Each tree's modules byte-compiled, as an install has them (under ``PYTHONDONTWRITEBYTECODE`` every
    run compiled them from source)."""
    for t in trees:
        compileall.compile_dir(str(t / "gpubatch"), quiet=1)


def _contender(spec: str) -> tuple[str, Path, dict[str, str]]:
    """(its name, the tree, its settings) of ``PATH[::VAR=VALUE,...]``; a value may hold commas
    (``GPUBATCH_CUDA_KINDS=baseline/4:4:4,baseline/4:2:2``): a setting begins only where ``NAME=`` does."""
    path, _, settings = spec.partition("::")
    tree = Path(path).resolve()
    parts = re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", settings) if settings else []
    bad = [kv for kv in parts if "=" not in kv]
    if bad:
        raise SystemExit(f"--tree {spec!r}: settings are VAR=VALUE, comma-separated (not {bad[0]!r})")
    env = dict(kv.split("=", 1) for kv in parts)
    return (f"{tree}::{settings}" if settings else str(tree)), tree, env


def _with_args(spec: str) -> tuple[str, list[str]]:
    """(the contender without its own options, those options) of ``PATH[::VAR=VALUE,...][++OPTIONS]``; the options
    are split as a shell would."""
    import shlex

    head, sep, tail = spec.partition("++")
    return (head, shlex.split(tail)) if sep else (spec, [])


def steps(report: dict) -> str:
    """Per tree: images/s of the median run, its runs' seconds, and the medians of its ``wall`` timings in the order
    they came (seconds from the run's or its tasks' start; the plan's and the finalize's, durations, left out)."""
    lines = [f"{report['records']} records, {report['date']}"]
    for name, t in report["trees"].items():
        lines.append(f"{name}: {t['images_per_s']:,.1f} images/s (runs {', '.join(f'{x:.3f}' for x in t['runs'])} s)")
        walls = {k: v for k, v in t["timings_median"].items()
                 if k.startswith("wall") and k not in ("wall: plan", "wall: finalize")}  # (those two: durations)
        lines += [f"    {v:8.4f}  {k}" for k, v in sorted(walls.items(), key=lambda kv: kv[1])]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True,
                    help="a gpubatch tree, maybe with settings and options: PATH[::VAR=VALUE,...][++OPTIONS] (repeat)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--fixed-order", action="store_true", help="every round in the order given (before 2026-12-06)")
    ap.add_argument("--steps", action="store_true",
                    help="print when each step of the runs came (their wall timings' medians), not the whole JSON")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the convert command's options")
    a = ap.parse_args()
    extra = a.args[1:] if a.args[:1] == ["--"] else a.args
    own = [_with_args(t) for t in a.tree]
    contenders = [(_contender(head)[0] + (f"++{' '.join(args)}" if args else ""), *_contender(head)[1:])
                  for head, args in own]
    options = {name: args for (name, _, _), (_, args) in zip(contenders, own)}
    a.src = a.src.resolve()  # (the runs start in a folder of their own)
    compiled(sorted({t for _, t, _ in contenders}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    n = count(a.src)
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in contenders}
    with tempfile.TemporaryDirectory(prefix="ab-trees-", dir=a.src.parent) as tmp:
        out = Path(tmp) / "out"
        for i in range(a.repeats + 1):
            k = 0 if a.fixed_order else i % len(contenders)  # (each round begins with the next tree: no tree always
            for name, t, settings in contenders[k:] + contenders[:k]:  # runs right after the same one)
                shutil.rmtree(out, ignore_errors=True)
                os.sync()
                path = os.pathsep.join([str(t), env.get("PYTHONPATH", "")])
                t0 = time.perf_counter()
                cmd = [sys.executable, "-m", "gpubatch", "convert", str(a.src), str(out), *extra, *options[name], "--json"]
                p = subprocess.run(cmd,
                                   env={**env, **settings, "PYTHONPATH": path}, capture_output=True, text=True, cwd=tmp)
                wall = time.perf_counter() - t0
                if p.returncode:
                    sys.exit(f"{name}: exit {p.returncode}: {p.stderr.strip()[-1500:]}")
                if i:
                    summary = json.loads(p.stdout)
                    runs[name].append({"seconds": round(wall, 3), "timings": summary.get("timings", {}),
                                       "gpu_memory": summary.get("gpu_memory") or {}})
                    n = n or int(summary.get("records_in") or 0)  # (a file source, a tar: its records as the run read them)
    report: dict = {"records": n, "command": ["convert", str(a.src), "OUT", *extra, "--json"], "cores": os.cpu_count(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "trees": {}}
    for t, r in runs.items():
        keys = sorted({k for x in r for k in x["timings"]})
        report["trees"][t] = {
            "images_per_s": round(n / statistics.median(x["seconds"] for x in r), 1),
            "runs": [x["seconds"] for x in r],
            "timings_median": {k: round(statistics.median(x["timings"].get(k, 0.0) for x in r), 4) for k in keys},
            "gpu_memory": [x["gpu_memory"] for x in r]}
    text = json.dumps(report, indent=1)
    print(steps(report) if a.steps else text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
