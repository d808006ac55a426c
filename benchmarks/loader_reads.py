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
import sys


def main() -> None:
    from _feed_worker import arguments, feed_worker, per_record, report

    a = arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]), "a webdataset gpubatch wrote",
                  "random_resized_crop(size=224) | flip(p=0.5)")
    from gpubatch.engine.gpu import feed as F
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    plan = Plan(ops=tuple(parse_chain(a.chain)), seed=0)
    with feed_worker(a.data, plan) as entries:
        batches = [entries[s : s + a.batch_size] for s in range(0, len(entries), a.batch_size)]

        def one_pass() -> None:
            for i, b in enumerate(batches):
                F._read_loader(i % 4, b, 0)

        runs = per_record(one_pass, len(entries), a.repeats, a.profile)
    report(a, len(entries), runs)


if __name__ == "__main__":
    sys.exit(main())
