#!/usr/bin/env python3
"""A webdataset reader's cost a record on the host, on one or more gpubatch trees in turn: every record of a dataset
read once through ``reader.read(entry)`` (the byte path: ``convert``'s CPU path, ``info``) and through
``reader.read(entry, into)`` (the buffer path the GPU feed and the loader take), the median of ``--passes`` passes,
each tree in a process of its own, rounds in turn.

    python3 benchmarks/reader_cost.py --data SHARDS --tree OLD --tree NEW [--rounds 3] [--passes 7]

A tree is a checkout or a folder holding the ``gpubatch`` package (``git archive REV gpubatch | tar -x -C DIR``).
SHARDS: webdataset shards gpubatch wrote (``python3 -m gpubatch convert IMAGES SHARDS --to webdataset``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_ONE = r"""
import json, statistics, sys, time
from gpubatch.formats.webdataset import WebDatasetReader
reader = WebDatasetReader(sys.argv[1])
entries = reader.entries()
buf = memoryview(bytearray(1 << 24))
into = lambda n: buf[:n]
out = {}
for path, kw in (("bytes", {}), ("buffer", {"into": into})):
    runs = []
    for _ in range(int(sys.argv[2]) + 1):  # (the first pass untimed: the page cache, the bytecode)
        t = time.perf_counter()
        for e in entries:
            reader.read(e, **kw)
        runs.append((time.perf_counter() - t) / len(entries) * 1e6)
    out[path] = statistics.median(runs[1:])
print(json.dumps({"records": len(entries), **out}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=7)
    args = ap.parse_args()
    got: dict[str, list[dict]] = {t: [] for t in args.tree}
    for r in range(args.rounds):
        for tree in args.tree if r % 2 == 0 else args.tree[::-1]:  # (turned order: drift falls on each alike)
            p = subprocess.run([sys.executable, "-c", _ONE, str(args.data), str(args.passes)], capture_output=True,
                               text=True, check=True, env={"PYTHONPATH": str(Path(tree).resolve())}, cwd="/")
            got[tree].append(json.loads(p.stdout))
    for tree, runs in got.items():
        print(f"{tree}: {runs[0]['records']:,} records; us a record, median over rounds: "
              f"bytes {statistics.median(x['bytes'] for x in runs):.1f} "
              f"({min(x['bytes'] for x in runs):.1f}-{max(x['bytes'] for x in runs):.1f}), "
              f"buffer {statistics.median(x['buffer'] for x in runs):.1f} "
              f"({min(x['buffer'] for x in runs):.1f}-{max(x['buffer'] for x in runs):.1f})")


if __name__ == "__main__":
    main()
