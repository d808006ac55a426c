"""``gpubatch info`` on one dataset by its two header-reading paths, side by side: threads of the command's
process (``PROCESSES_FROM`` raised past the set) and a process a core (the default from 4,096 records).
Each run is a whole process; the paths take turns, after one untimed round.

    python3 benchmarks/info_paths.py SRC [--repeats 5]

Prints the median wall seconds of each path and each run's, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CODE = ("import sys, gpubatch.report.info as i; i.PROCESSES_FROM = int(sys.argv[1]); "
        "from gpubatch.cli import main; sys.argv = ['gpubatch', 'info', sys.argv[2]]; main()")
PATHS = (("threads", 10**9), ("processes", 4096))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    runs: dict[str, list[float]] = {name: [] for name, _ in PATHS}
    for r in range(a.repeats + 1):
        for name, first in PATHS:
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", CODE, str(first), a.src], capture_output=True, text=True)
            wall = time.perf_counter() - t
            if p.returncode:
                sys.exit(f"info exited {p.returncode}: {p.stderr.strip()[-2000:]}")
            if r:
                runs[name].append(round(wall, 3))
    print(json.dumps({k: {"median": statistics.median(v), "runs": v} for k, v in runs.items()}))


if __name__ == "__main__":
    main()
