#!/usr/bin/env python3
"""Python's garbage collections in every process of a ``convert`` (the command and its workers): how many of each
generation, how long the full ones held the GIL, and when they came.

    python3 benchmarks/worker_gc.py --src FOLDER [--runs 3] [--dst DIR] [--tree DIR] [--env NAME=VALUE ...] \\
        -- CONVERT-OPTIONS

Why: a full collection walks every object the process holds with the GIL held, and meanwhile no other thread of
the process runs Python; in the training loader such collections held the decoders' threads 60-140 ms at a time
(benchmarks/RESULTS.md, 2026-12-02 "09:01 to 09:47"). A GPU worker imports CuPy, nvImageCodec's bindings and
gpubatch (and ``trace_convert.py``'s hook PyTorch): in a CUPTI trace of one, every thread of the worker made no CUDA
call for 187 ms inside its first batch (2026-12-04).

Runs ``python -m gpubatch convert SRC DST OPTIONS --overwrite -q --json`` ``--runs`` times (the first untimed), each
with a ``sitecustomize`` module first on the path that registers a ``gc.callbacks`` hook in every process started
from the command (spawned ones import it; forked ones inherit the hook). Each process appends a line per
collection of generation 1 or 2 (and one every 200 of generation 0) to a file of its own: the generation, its
milliseconds, when it came (seconds since the command started), the objects frozen by then (``gc.freeze``), the
young collections so far and the process's name. Prints per run and per
process the count and milliseconds of each generation's collections, the longest, and the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HOOK = r'''
import gc, json, os, time

_DIR = os.environ.get("GPUBATCH_GC_LOG")
if _DIR:
    _T0 = float(os.environ["GPUBATCH_GC_T0"])
    _state = {"t": 0.0, "young": [0, 0.0]}

    def _name():
        try:
            import multiprocessing
            return multiprocessing.current_process().name
        except Exception:
            return "?"

    def _hook(phase, info):
        if phase == "start":
            _state["t"] = time.perf_counter()
            return
        ms = (time.perf_counter() - _state["t"]) * 1e3
        gen = info.get("generation", 0)
        if gen == 0:
            young = _state["young"]
            young[0] += 1
            young[1] += ms
            if young[0] % 200:
                return
            line = {"gen": 0, "count": young[0], "ms": round(young[1], 3)}
        else:
            line = {"gen": gen, "ms": round(ms, 3), "at": round(time.time() - _T0, 4),
                    "frozen": gc.get_freeze_count(), "collected": info.get("collected", 0),
                    "count": _state["young"][0], "young_ms": round(_state["young"][1], 3)}
        line["pid"], line["name"] = os.getpid(), _name()
        with open(os.path.join(_DIR, f"gc-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")

    gc.callbacks.append(_hook)
'''


def summarize(log: Path) -> dict:
    """Per process: collections of each generation (count, ms), the longest full one, when the full ones came."""
    out = {}
    for f in sorted(log.glob("gc-*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if not lines:
            continue
        full = [x for x in lines if x["gen"] == 2]
        mid = [x for x in lines if x["gen"] == 1]
        last = max(lines, key=lambda x: x["count"])  # (gen 0 counted as of the process's last line)
        out[f"{lines[-1]['name']} ({lines[-1]['pid']})"] = {
            "gen 0 (count, ms; as of its last line)": [last["count"], round(last.get("young_ms", last["ms"]), 1)],
            "gen 1 (count, ms)": [len(mid), round(sum(x["ms"] for x in mid), 1)],
            "gen 2 (count, ms)": [len(full), round(sum(x["ms"] for x in full), 1)],
            "gen 2 longest ms": round(max((x["ms"] for x in full), default=0.0), 1),
            "gen 2 at s (ms)": [[x["at"], round(x["ms"], 1)] for x in full][:12],
            "frozen at the last": (full or mid or [{}])[-1].get("frozen"),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--dst", type=Path, default=Path(tempfile.gettempdir()) / "gpubatch-gc-out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the command's environment")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the gpubatch tree to run (a checkout, or a folder that "
                    "holds the gpubatch package; this checkout by default)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the convert command's options")
    a = ap.parse_args()
    opts = [x for x in a.args if x != "--"]
    runs = []
    with tempfile.TemporaryDirectory() as hook:
        Path(hook, "sitecustomize.py").write_text(HOOK)
        base = {**os.environ, **dict(e.split("=", 1) for e in a.env),
                "PYTHONPATH": os.pathsep.join([hook, str(a.tree.resolve()), os.environ.get("PYTHONPATH", "")])}
        for r in range(a.runs):
            log = Path(tempfile.mkdtemp(prefix="gc-log-"))
            t0 = time.time()
            env = {**base, "GPUBATCH_GC_LOG": str(log), "GPUBATCH_GC_T0": repr(t0)}
            cmd = [sys.executable, "-m", "gpubatch", "convert", str(a.src), str(a.dst), *opts, "--overwrite", "-q",
                   "--json"]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
            wall = time.time() - t0
            if done.returncode:
                sys.exit(f"convert failed ({done.returncode}): {done.stderr[-2000:]}")
            procs = summarize(log)
            shutil.rmtree(log, ignore_errors=True)
            if not r and a.runs > 1:
                continue  # (untimed: page cache, bytecode)
            runs.append({"wall_s": round(wall, 3), "processes": procs})
            print(f"run {r}: {wall:.3f} s")
            for name, p in procs.items():
                print(f"  {name}: gen 0 {p['gen 0 (count, ms; as of its last line)']}, gen 1 {p['gen 1 (count, ms)']}, "
                      f"gen 2 {p['gen 2 (count, ms)']} (longest {p['gen 2 longest ms']} ms, at {p['gen 2 at s (ms)']}), "
                      f"frozen {p['frozen at the last']}")
    walls = [x["wall_s"] for x in runs]
    result = {"command": ["convert", str(a.src), "DST", *opts], "env": a.env, "runs": runs,
              "wall_s_median": statistics.median(walls) if walls else None,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
