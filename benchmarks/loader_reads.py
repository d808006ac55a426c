#!/usr/bin/env python3
"""What one of the training loader's reader processes spends on a record: the GPU loader's reads of a
webdataset (``LoaderFeed``'s ``_read_loader``: the tar member into the shared-memory slot, the JPEG header,
the drawn parameters), timed in this process, µs a record, the median of ``--repeats`` passes.

    python3 benchmarks/loader_reads.py --data WEBDATASET [--repeats 5] [--profile]

The gpubatch measured is the one Python imports: run it from outside the checkouts with ``PYTHONPATH=TREE``
to compare two trees (``python -m`` and a script's folder put their own code first).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a webdataset gpubatch wrote")
    ap.add_argument("--chain", default="random_resized_crop(size=224) | flip(p=0.5)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one pass")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from multiprocessing.shared_memory import SharedMemory

    import gpubatch
    from gpubatch.engine.gpu import feed as F
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain
    from gpubatch.formats import open_reader

    plan = Plan(ops=tuple(parse_chain(a.chain)), seed=0)
    slot = 64 << 20
    shm = SharedMemory(create=True, size=4 * slot)
    try:
        F._init(shm.name, plan, slot, functools.partial(open_reader, a.data, None))
        entries = F._W["reader"].entries()
        batches = [entries[s : s + a.batch_size] for s in range(0, len(entries), a.batch_size)]

        def one_pass() -> None:
            for i, b in enumerate(batches):
                F._read_loader(i % 4, b, 0)

        one_pass()  # (the page cache and the imports warm)
        runs = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            one_pass()
            runs.append((time.perf_counter() - t) / len(entries) * 1e6)
        if a.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(one_pass)
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    finally:
        F._W.clear()
        shm.close()
        shm.unlink()
    out = {"gpubatch": str(Path(gpubatch.__file__).parent), "data": str(a.data), "records": len(entries),
           "chain": a.chain, "us_per_record_runs": [round(r, 1) for r in runs],
           "us_per_record": round(statistics.median(runs), 1)}
    print(f"{out['gpubatch']}: {out['us_per_record']} us a record (runs {out['us_per_record_runs']}), "
          f"{len(entries):,} records")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
