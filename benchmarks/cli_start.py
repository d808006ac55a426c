#!/usr/bin/env python3
"""When the ``gpubatch`` command reaches the points where a GPU image run's workers start: ``execute.early.sniff``
(the command's first step, from its arguments) and ``execute.early.prestart`` (once its options are checked), in
seconds from the script's start and with the modules imported by then; each run a fresh process.

    python3 benchmarks/cli_start.py [--runs 5] -- convert SRC DST --to webdataset --resize-shorter 256

The command runs as it would (its output hidden); prestart is only timed, never changed. Found (the 2-core CI
machine, 2026-12-04, benchmarks/RESULTS.md "16:56 to 17:29"): the sniff at 0.013 s (98 modules), prestart at
0.21-0.27 s (398).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys, time
t0 = time.perf_counter()
from gpubatch.engine.execute import early
seen = {}
for name in ("sniff", "prestart"):
    def timed(*a, _name=name, _real=getattr(early, name), **k):
        seen.setdefault(_name, [round(time.perf_counter() - t0, 4), len(sys.modules)])
        return _real(*a, **k)
    setattr(early, name, timed)
sys.argv = ["gpubatch", *ARGS]
try:
    import gpubatch.cli as cli
    cli.main()
except SystemExit:
    pass
finally:
    print("CLI_START " + json.dumps(seen), file=sys.__stderr__, flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the command's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        sys.exit("give the command's arguments after --")
    runs = []
    for _ in range(a.runs):
        done = subprocess.run([sys.executable, "-c", PROBE.replace("ARGS", repr(args))], cwd=ROOT,
                              capture_output=True, text=True)
        line = next((ln for ln in done.stderr.splitlines() if ln.startswith("CLI_START ")), None)
        if line is None:
            sys.exit(f"no timing from the command (exit {done.returncode}):\n{done.stderr[-2000:]}")
        runs.append(json.loads(line[len("CLI_START "):]))
    out = {}
    for name in ("sniff", "prestart"):
        got = [r[name] for r in runs if name in r]
        if got:
            out[name] = {"seconds": [g[0] for g in got], "median_s": statistics.median(g[0] for g in got),
                         "modules": statistics.median(g[1] for g in got)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
