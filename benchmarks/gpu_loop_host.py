#!/usr/bin/env python3
"""The per-record Python of a GPU worker's loop thread in ``convert``/``augment``: what
``engine/gpu/images.transform_fed`` spends on a batch besides the GPU's work (the jobs settled against
their decoded sources, the outputs' size checks, the output records made), in µs a record, the median of
``--repeats`` passes. That thread feeds the GPU: every µs here is a µs a batch's kernels wait for.

    python3 benchmarks/gpu_loop_host.py --data FOLDER_OF_JPEGS [--repeats 5] [--profile]

The batches are what the feed's reader processes make of the folder (``feed._read_records``, pickled and
unpickled as they travel); each source's decoded image stands in as an empty array of its header's size,
and the chain and encoder (``_resample_encode``) as a function that gives each row 20 KB of bytes, so
it runs on a machine without a GPU. The gpubatch measured is the one Python imports: run it from outside
the checkouts with ``PYTHONPATH=TREE`` to compare two trees.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
import types

TRANSCODE = "resize_shorter(size=256) | center_crop(size=224)"


class _Decoded:
    """A batch's decode result as the loop sees it: arrays (empty, of the headers' sizes), errors."""

    def __init__(self, sizes: list):
        import numpy as np

        self.arrays = [np.empty((hw[0], hw[1], 3), np.uint8) if hw else None for hw in sizes]
        self.errors = [None if hw else "no header" for hw in sizes]
        self.fallbacks = 0

    def order(self, stream) -> None:
        pass


def main() -> None:
    from _feed_worker import arguments, feed_worker, per_record, report

    a = arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]),
                  "a folder of JPEGs (or any dataset gpubatch reads)", TRANSCODE)
    from gpubatch.engine.gpu import feed as F
    from gpubatch.engine.gpu import images
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain
    from gpubatch.errors import RunStats

    plan = Plan(ops=tuple(parse_chain(a.chain)), seed=0, quality=90)
    blob = bytes(20_000)
    images._resample_encode = lambda engine, plan, codecs, arrays, *rest: [blob] * len(arrays)
    engine = types.SimpleNamespace(stream=None)
    with feed_worker(a.data, plan) as entries:
        batches = []
        for i, s in enumerate(range(0, len(entries), a.batch_size)):
            _, reads = F._read_records(i % 4, entries[s : s + a.batch_size])
            batches.append(pickle.dumps(reads))  # (as a reader process hands it over)
        decoded = [_Decoded(pickle.loads(b).sizes) for b in batches]

        def one_pass() -> float:
            feds = [pickle.loads(b) for b in batches]  # (fresh jobs, as each run gets them; not timed)
            stats = RunStats()
            t = time.perf_counter()
            n = sum(len(images.transform_fed(engine, plan, fed, res, stats)) for fed, res in zip(feds, decoded))
            assert n == len(entries), (n, len(entries))
            return time.perf_counter() - t

        runs = per_record(one_pass, len(entries), a.repeats, a.profile)
    report(a, len(entries), runs, digits=2)


if __name__ == "__main__":
    sys.exit(main())
