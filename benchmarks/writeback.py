#!/usr/bin/env python3
"""What starting a file's writeback as it is written does to writing and fsyncing shards on this disk.

    python3 benchmarks/writeback.py [--files 24] [--mib 64] [--every 8] [--write-mib 1] [--dir DIR] [--json out.json]

Writes ``--files`` files of ``--mib`` MiB (``--write-mib`` MiB writes, random bytes), each fsynced before the next, as a
shard's sink does, three ways in turn, twice: ``plain`` (written as they come), ``writeback``
(:func:`gpubatch._commit.start_writeback` every ``--every`` MiB, as :class:`~gpubatch._commit.ShardFile`
does) and ``fadvise`` (``posix_fadvise(DONTNEED)``, which also starts writeback but drops the pages from the
cache). Prints seconds in all, seconds in fsync and the durable rate (GB/s) per way and round: the ``plain``
way of one large file (``--files 1 --mib 2048 --write-mib 8``) is how fast the disk makes a run's output durable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpubatch._commit import start_writeback  # noqa: E402


def one(folder: Path, way: str, files: int, mib: int, every: int, write_mib: int = 1) -> dict:
    data = os.urandom(write_mib << 20)
    t0, synced = time.perf_counter(), 0.0
    for k in range(files):
        fd = os.open(folder / f"f{k}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for i in range(0, mib, write_mib):
                os.write(fd, data)
                if (i + write_mib) % every == 0:
                    if way == "writeback":
                        start_writeback(fd, (i + write_mib - every) << 20, every << 20)
                    elif way == "fadvise":
                        os.posix_fadvise(fd, (i + write_mib - every) << 20, every << 20, os.POSIX_FADV_DONTNEED)
            t = time.perf_counter()
            os.fsync(fd)
            synced += time.perf_counter() - t
        finally:
            os.close(fd)
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "fsync_seconds": round(synced, 3),
            "durable_gb_per_s": round(files * (mib << 20) / seconds / 1e9, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--write-mib", type=int, default=1, help="MiB a write (a divisor of --mib and --every)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder here)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.mib % a.write_mib or a.every % a.write_mib:
        ap.error("--write-mib must divide --mib and --every")
    out: dict = {"files": a.files, "mib": a.mib, "every_mib": a.every, "write_mib": a.write_mib, "rounds": []}
    with tempfile.TemporaryDirectory(dir=a.dir or Path.cwd()) as t:
        for _ in range(2):
            row = {way: one(Path(t), way, a.files, a.mib, a.every, a.write_mib) for way in ("plain", "writeback", "fadvise")}
            out["rounds"].append(row)
            print(json.dumps(row))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
