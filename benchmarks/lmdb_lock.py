#!/usr/bin/env python3
"""How long an LMDB pass-through holds the database's lock, and its wall time, for one or more trees.

    python3 benchmarks/lmdb_lock.py --src DIR [--tree PATH ...] [--repeats 3] [--workers N] [--json out.json]

The workers of an LMDB run put their shards into the one database in turn, under its lock
(``gpubatch/formats/lmdb_sink.py``): the time the lock is held, summed over a run's shards, is the part of
the run that no number of cores shortens (on 16 cores the LMDB pass-through ran at that bound). Each tree
(a gpubatch checkout; by default this one) runs ``python3 -m gpubatch convert SRC OUT --to lmdb`` in turn,
``--repeats`` times after one untimed run, each after the previous output is removed and ``sync``. The lock's
time is measured from outside the code, the same way for any tree: a ``sitecustomize`` put on the
workers' path notes when ``Turn`` is made (the lock just taken) and when the lock is given back (``Turn.close``
in trees that sync under the lock, ``Turn.sync`` in those that sync after it). Prints, per tree, the
records/s and the seconds under the lock, each run and their medians.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_trees import compiled, count  # noqa: E402  (the trees' bytecode and the source's records, as ab_trees has them)

PROBE = '''
import os, time
if os.environ.get("GPUBATCH_LOCK_LOG"):
    from gpubatch.formats import lmdb_sink as m
    made = m.Turn.__init__
    def __init__(self, *a, **kw):
        self._taken = time.perf_counter()
        made(self, *a, **kw)
    m.Turn.__init__ = __init__
    def given_back(name):
        real = getattr(m.Turn, name)
        def wrapped(self, *a, **kw):
            if not getattr(self, "_noted", False):
                self._noted = True
                with open(os.environ["GPUBATCH_LOCK_LOG"], "a") as f:
                    f.write(f"{time.perf_counter() - self._taken:.6f}\\n")
            return real(self, *a, **kw)
        setattr(m.Turn, name, wrapped)
    for name in ("close", "sync"):
        if hasattr(m.Turn, name):
            given_back(name)
'''


def run(tree: Path, src: Path, out: Path, probe: Path, log: Path, workers: int | None) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{probe}{os.pathsep}{tree}", "GPUBATCH_LOCK_LOG": str(log)}
    cmd = [sys.executable, "-m", "gpubatch", "convert", str(src), str(out), "--to", "lmdb", "-q"]
    if workers:
        cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    # (from a folder outside every tree: ``python -m`` puts the working directory first on the path, so run
    # from a checkout it would import that checkout's gpubatch whatever PYTHONPATH says)
    subprocess.run(cmd, env=env, check=True, cwd=probe)
    wall = time.perf_counter() - t0
    held = sum(float(x) for x in log.read_text().split()) if log.exists() else float("nan")
    return wall, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="a folder of images (the pass-through's source)")
    ap.add_argument("--tree", type=Path, action="append", help="a gpubatch checkout (repeat to compare)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    trees = [t.resolve() for t in (a.tree or [ROOT])]
    a.src = a.src.resolve()  # (the runs start in a folder of their own)
    compiled(trees)
    n = count(a.src)
    with tempfile.TemporaryDirectory(prefix="lmdb-lock-") as tmp:
        tmp = Path(tmp)
        (tmp / "probe").mkdir()
        (tmp / "probe" / "sitecustomize.py").write_text(PROBE)
        runs: dict[str, list[tuple[float, float]]] = {str(t): [] for t in trees}
        for i in range(a.repeats + 1):
            for t in trees:  # (the trees in turn: the machine's drift falls on each alike)
                got = run(t, a.src, tmp / "out", tmp / "probe", tmp / "lock.log", a.workers)
                if i:
                    runs[str(t)].append(got)
    report = {"records": n, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "trees": {t: {"records_per_s": round(n / statistics.median(w for w, _ in r), 1),
                            "lock_held_s": round(statistics.median(h for _, h in r), 3),
                            "runs": [{"seconds": round(w, 3), "lock_held_s": round(h, 3)} for w, h in r]}
                        for t, r in runs.items()}}
    print(json.dumps(report, indent=1))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
