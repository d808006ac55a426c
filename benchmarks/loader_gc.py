#!/usr/bin/env python3
"""Python's full garbage collections in the process that drives the training loader, per batches read.

    python3 benchmarks/loader_gc.py --data WEBDATASET [--batches 600] [--readers 2] [--json out.json]
    python3 benchmarks/loader_gc.py --images 2048          # makes ImageNet-like JPEGs and their webdataset

A training process holds PyTorch's objects (about 170,000 once ``torch`` is imported), and every full
collection walks all of them with the GIL held: 60-70 ms on a 2-core machine, during which the threads
that feed the GPU's decoders stand still (the loader's p99 batch of 100-140 ms on the H200, 2026-12-02).
A full collection comes once enough objects have outlived two younger collections; what the loader keeps
across batches decides how often. This script runs what that process does with each batch (no GPU
needed): the loader's reader processes (``LoaderFeed``) read batches of ``--batch-size`` records epoch
after epoch, and the batches are held three deep, as the pipeline holds them, with ``import torch`` done
first. It counts the full collections (``gc.callbacks``) and their time. ``--rows objects`` makes an
object a record in this process as the loader did before its columns (for the comparison).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a webdataset gpubatch wrote (else --images makes one)")
    ap.add_argument("--images", type=int, default=2048, help="JPEGs to make where --data is not given")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpubatch-loader-gc"), help="where --images go")
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--rows", choices=("columns", "objects"), default="columns")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401  (the objects a training process holds)
    except ImportError:
        sys.exit("loader_gc.py: needs torch (the heap a training process has is the point)")
    from gpubatch.engine.gpu.feed import LoaderFeed
    from gpubatch.formats import open_reader
    from gpubatch.training import Loader

    data = a.data
    if data is None:
        from gpubatch.api import convert
        from gpubatch.synthetic import make_jpeg_set

        src = make_jpeg_set(a.work / f"jpeg-{a.images}", a.images)
        data = a.work / f"wds-{a.images}"
        if not (data / "gpubatch.json").exists():
            convert(src, data, to="webdataset", shard_size=512, device="cpu", overwrite=True)
    full: list[float] = []
    started: list[float] = []

    def noted(phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started.append(time.perf_counter())
            else:
                full.append(time.perf_counter() - started.pop())

    dl = Loader(data, "random_resized_crop(size=224) | flip(p=0.5)", batch_size=a.batch_size, device="cpu")
    entries = dl._entries
    feed = LoaderFeed(functools.partial(open_reader, data, None), dl._pipeline().plan, workers=a.readers, depth=8,
                      fields=dl.keys)

    def batches():
        epoch = 0
        while True:
            for s in range(0, len(entries), a.batch_size):
                yield epoch, entries[s : s + a.batch_size]
            epoch += 1

    objects = len(gc.get_objects())
    gc.callbacks.append(noted)
    held: deque = deque()
    n, t0 = 0, time.perf_counter()
    for fed in feed.reading(batches()):
        rows = ([SimpleNamespace(key=k, origin=o, label=lab, meta={}, boxes=None)
                 for k, o, lab in zip(fed.keys, fed.origins, fed.labels)] if a.rows == "objects" else None)
        held.append((fed, rows))
        if len(held) > 3:
            held.popleft()[0].done()
        n += 1
        if n == a.batches:
            break
    seconds = time.perf_counter() - t0
    gc.callbacks.remove(noted)
    feed.close()
    dl.close()
    out = {"data": str(data), "records": len(entries), "batches": n, "batch_size": a.batch_size, "rows": a.rows,
           "objects_at_start": objects, "full_collections": len(full), "full_collection_ms": round(1e3 * sum(full), 1),
           "longest_ms": round(1e3 * max(full, default=0.0), 1), "seconds": round(seconds, 2),
           "python": sys.version.split()[0]}
    print(f"{n} batches of {a.batch_size} ({a.rows}), {objects:,} objects at the start: {len(full)} full "
          f"collections, {out['full_collection_ms']} ms in all, the longest {out['longest_ms']} ms")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
