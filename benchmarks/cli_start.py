#!/usr/bin/env python3
"""Where the ``gpubatch`` command's time goes outside its run: when it reaches ``execute.early.sniff`` (its first
step, from its arguments) and ``execute.early.prestart`` (once its options are checked), in seconds from its
first line and with the modules imported by then; and, around the run, when the run began and returned
(``runner.execute``), when the command's code returned, when its exit handlers were done, and when its process was
gone as its parent saw it. Each run a fresh process.

    python3 benchmarks/cli_start.py [--runs 5] -- convert SRC DST --to webdataset --resize-shorter 256 [--json]

With ``--json`` among the command's options the run's own seconds (its summary's) are read too, and the time
outside them is split: before the run, the run's end after its summary's clock stopped (its manifest, the dataset
moved into place, its workers let go), the command's output, the exit handlers, and the process's end after them
(the interpreter's finalization and the kernel's); ``--plain`` runs the command as it is too, in turn, so that the
probe's own cost shows. The command runs as it would (its output kept from the
terminal); prestart is only timed, never changed; DST is removed before each run. Found (the 2-core CI machine,
2026-12-04, benchmarks/RESULTS.md "16:56 to 17:29"): the sniff at 0.013 s (98 modules), prestart at 0.21-0.27 s
(398).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys, time
w0, t0 = time.time(), time.perf_counter()
import atexit
seen = {}

def mark(name):
    seen.setdefault(name, [round(time.perf_counter() - t0, 4), len(sys.modules)])

def report():
    mark("exit handlers done")
    print("CLI_START " + json.dumps({**seen, "w0": w0}), file=sys.__stderr__, flush=True)

atexit.register(report)  # (the first registered: the last to run)
import os
_exit, _pid = os._exit, os.getpid()

def ending(code):  # (the command's own last handler ends its process with os._exit: the report comes first)
    if os.getpid() == _pid:
        atexit.unregister(report)
        report()
    _exit(code)

os._exit = ending
atexit._ncallbacks = lambda: 0  # (the command's fast end stays on beside this probe's handler: gpubatch.cli._ending)
from gpubatch.engine.execute import early
for name in ("sniff", "prestart"):
    def timed(*a, _name=name, _real=getattr(early, name), **k):
        mark(_name)
        return _real(*a, **k)
    setattr(early, name, timed)
import builtins
_import = builtins.__import__

def execute_timed(real):
    def execute(*a, **k):
        mark("run begins")
        try:
            return real(*a, **k)
        finally:
            mark("run returned")
    execute.timed = True
    return execute

def importing(*a, **k):  # (runner.execute timed once the command itself has imported the runner: no import moved)
    module = _import(*a, **k)
    runner = sys.modules.get("gpubatch.runner")
    if runner is not None and hasattr(runner, "execute") and not getattr(runner.execute, "timed", False):
        runner.execute = execute_timed(runner.execute)
    return module

builtins.__import__ = importing
sys.argv = ["gpubatch", *ARGS]
try:
    import gpubatch.cli as cli
    cli.main()
finally:
    mark("command returned")
"""

#: the points, in the order they come
POINTS = ("sniff", "prestart", "run begins", "run returned", "command returned", "exit handlers done", "process gone")


def one(args: list[str]) -> dict:
    dst = next((Path(a) for a in args[2:3]), None) if args[:1] in (["convert"], ["augment"]) else None
    if dst is not None:
        shutil.rmtree(dst, ignore_errors=True)
    launched = time.time()
    done = subprocess.run([sys.executable, "-c", PROBE.replace("ARGS", repr(args))], cwd=ROOT, capture_output=True,
                          text=True)
    gone = time.time()
    line = next((ln for ln in done.stderr.splitlines() if ln.startswith("CLI_START ")), None)
    if line is None:
        sys.exit(f"no timing from the command (exit {done.returncode}):\n{done.stderr[-2000:]}")
    seen = json.loads(line[len("CLI_START "):])
    w0 = seen.pop("w0")
    seen["interpreter start"] = [round(w0 - launched, 4), 0]
    seen["process gone"] = [round(gone - w0, 4), 0]
    if "--json" in args:
        try:
            seen["run's own seconds"] = [json.loads(done.stdout)["seconds"], 0]
        except (ValueError, KeyError, TypeError):
            pass
    return seen


def plain(args: list[str]) -> float:
    """``python -m gpubatch ARGS --json`` as it is, no probe: its process's seconds less its run's own."""
    dst = Path(args[2]) if args[:1] in (["convert"], ["augment"]) and len(args) > 2 else None
    if dst is not None:
        shutil.rmtree(dst, ignore_errors=True)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpubatch", *args], cwd=ROOT, capture_output=True, text=True)
    whole = time.perf_counter() - t
    if done.returncode:
        sys.exit(f"the command failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return whole - json.loads(done.stdout)["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    ap.add_argument("--plain", action="store_true",
                    help="with --json among the command's options: also run the command as it is, no probe, in turn "
                         "with the probed runs, and give its time outside the run beside theirs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the command's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        sys.exit("give the command's arguments after --")
    runs, plains = [], []
    for _ in range(a.runs):
        runs.append(one(args))
        if a.plain and "--json" in args:
            plains.append(plain(args))
    out: dict = {"command": args, "runs": a.runs}
    for name in ("interpreter start", *POINTS, "run's own seconds"):
        got = [r[name] for r in runs if name in r]
        if got:
            out[name] = {"seconds": [g[0] for g in got], "median_s": statistics.median(g[0] for g in got)}
            if name in ("sniff", "prestart"):
                out[name]["modules"] = statistics.median(g[1] for g in got)
    if all("run's own seconds" in r and "run begins" in r for r in runs):  # the time outside the run, split
        parts = {
            "before the run": [r["run begins"][0] for r in runs],
            "the run's end after its own clock": [r["run returned"][0] - r["run begins"][0] - r["run's own seconds"][0]
                                                  for r in runs],
            "the command's output": [r["command returned"][0] - r["run returned"][0] for r in runs],
            "exit handlers": [r["exit handlers done"][0] - r["command returned"][0] for r in runs],
            "the process's end after them": [r["process gone"][0] - r["exit handlers done"][0] for r in runs],
        }
        out["outside the run (medians, s)"] = {k: round(statistics.median(v), 4) for k, v in parts.items()}
        out["outside the run, probed (s)"] = [round(r["process gone"][0] - r["run's own seconds"][0], 4) for r in runs]
    if plains:  # (the probe's own cost: the command as it is, outside its run)
        out["outside the run, the command as it is (s)"] = [round(x, 4) for x in plains]
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
