#!/usr/bin/env python3
"""64 writes of an LMDB shard's size (23.6 MB: 92-KB values, each with a 16-byte page header and its padding, by
`pwritev` 64 buffers a call, as `formats/lmdb_sink.py` writes a shard's pages) into one new file, synced every 16
writes: the median time a shard's write takes with nothing beside it, with and without the file's blocks allocated
first (`posix_fallocate`), five rounds in turn.

    python3 benchmarks/pwrite_shards.py DIR
"""

from __future__ import annotations

import os
import statistics
import sys

SH = 64
SZ = 23_600_000 // 4096 * 4096
REC = os.urandom(92_000)
PAD = bytes((-(92_000 + 16)) % 4096)
HDR = bytes(16)


def buffers() -> tuple[list[bytes], int]:
    out, n = [], 0
    while n < SZ:
        out += [HDR, REC, PAD]
        n += 16 + len(REC) + len(PAD)
    return out, n


def run(mode: str, path: str, bufs: list[bytes], n: int) -> tuple[float, float, float]:
    import time

    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    t0 = time.perf_counter()
    if mode == "fallocate":
        os.posix_fallocate(fd, 0, SH * n)
    allocated = time.perf_counter() - t0
    times = []
    for k in range(SH):
        t = time.perf_counter()
        off = k * n
        for i in range(0, len(bufs), 64):
            off += os.pwritev(fd, bufs[i : i + 64], off)
        times.append(time.perf_counter() - t)
        if k % 16 == 15:
            os.fdatasync(fd)
    os.fdatasync(fd)
    os.close(fd)
    os.unlink(path)
    return statistics.median(times) * 1e3, sum(times), allocated


def main() -> None:
    path = os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "pwrite-shards.dat")
    bufs, n = buffers()
    res: dict[str, list] = {"plain": [], "fallocate": []}
    for r in range(5):
        for mode in (["plain", "fallocate"] if r % 2 else ["fallocate", "plain"]):
            res[mode].append(run(mode, path, bufs, n))
    for mode, v in res.items():
        print(mode, "median ms a shard", [round(x[0], 2) for x in v], "writes s", [round(x[1], 2) for x in v],
              "fallocate s", [round(x[2], 3) for x in v])


if __name__ == "__main__":
    main()
