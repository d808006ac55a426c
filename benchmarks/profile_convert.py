#!/usr/bin/env python3
"""Where one process's time goes in a pass-through ``convert``: cProfile over the run in this process
(``workers=1``: the host unit reads, checks and writes every record here), the functions that took the
most time of their own.

    python3 benchmarks/profile_convert.py [--images 8192] [--to tfrecord] [--top 14]

The data: gpubatch.synthetic's photo-like JPEGs (benchmarks/bench_convert.py's set), made once under
--data-root. One untimed run first (page cache), then the profiled one.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    from bench_convert import image_set

    from gpubatch.api import convert

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--to", default="tfrecord")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--data-root", type=Path, default=ROOT / ".bench-data")
    a = ap.parse_args()
    a.data_root.mkdir(parents=True, exist_ok=True)
    data = image_set(a.data_root, a.images)
    with tempfile.TemporaryDirectory(dir=a.data_root) as t:
        out = Path(t) / "out"
        convert(data, out, to=a.to, workers=1)  # (untimed: the page cache)
        shutil.rmtree(out)
        prof = cProfile.Profile()
        prof.runcall(convert, data, out, to=a.to, workers=1)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    print(f"{a.images} records to {a.to}, one process: {stats.total_tt:.2f} s")
    stats.sort_stats("tottime").print_stats(a.top)
    print(text.getvalue())


if __name__ == "__main__":
    main()
