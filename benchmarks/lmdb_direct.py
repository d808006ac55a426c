#!/usr/bin/env python3
"""A Caffe LMDB written page by page with plain sequential writes (:mod:`gpubatch.formats.lmdb_write`, as gpubatch's
LMDB sink writes it since 2026-12-05), beside the LMDB library (one process, ``MDB_APPEND`` into its map, as the sink
wrote a transaction before) and the pass-through's one-process ``tarfile`` loop, in turn, on the same files.

    python3 benchmarks/lmdb_direct.py --src .bench-data/jpeg-16384 [--repeats 5] [--json out.json]

Why: the LMDB library writes its transactions into the file's map, and the kernel's work on the map (its pages zeroed
and faulted in, their writeback), under the database's lock, one writer at a time, kept the LMDB pass-through at
0.61-0.71x the ``tarfile`` loop on the 2-core CI machine (the tar formats 1.12-1.34x; benchmarks/RESULTS.md). The
file format (lmdb.h / mdb.c; ``gpubatch/formats/lmdb_write.py`` says how) lets every page of a record be written the
moment it is made, in order, with nothing mapped and nothing read back.

What this measures: one process, every record read, wrapped in its Datum and written; each file synced at its end
(``fdatasync``), the loop's tar too (``--no-sync``: none). The written LMDB is then read back whole by the LMDB
library (py-lmdb: every key and value against the source, its own count of entries and pages) before its time counts.
Prints records/s of the median run of each, and each ratio to the loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PS = 4096


class DirectLmdb:
    """An LMDB data file written in order by :mod:`gpubatch.formats.lmdb_write`: ``add(key, parts, size)`` for keys in
    ascending order, the records' pages written a leaf's worth at a time; ``close()`` writes the branch and meta
    pages."""

    def __init__(self, path: Path):
        from gpubatch.formats.lmdb_write import FIRST_PAGE

        self.f = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.f.write(bytes(FIRST_PAGE * PS))  # (the meta pages, written last)
        self.next = FIRST_PAGE
        self.batch: list[tuple[bytes, bytes]] = []
        self.leaves: list[tuple[int, bytes]] = []
        self.counts = {"leaf_pages": 0, "overflow_pages": 0, "entries": 0}

    def _flush(self) -> None:
        from gpubatch.formats.lmdb_write import shard_pages

        buffers, leaves, counts = shard_pages(self.batch, self.next)
        for b in buffers:
            self.f.write(b)
        self.next += counts["pages"]
        self.leaves += leaves
        for k in self.counts:
            self.counts[k] += counts[k]
        self.batch = []

    def add(self, key: bytes, parts: list, size: int) -> None:
        self.batch.append((key, b"".join(parts)))
        if len(self.batch) == 64:  # (a leaf's worth of keys: each batch begins a leaf, as each shard does)
            self._flush()

    def close(self, sync: bool = True) -> dict:
        from gpubatch.formats.lmdb_write import tree_pages

        if self.batch:
            self._flush()
        branches, metas, pages = tree_pages(self.leaves, self.next, self.counts)
        self.f.write(branches)
        self.f.seek(0)
        self.f.write(metas)
        self.f.flush()
        if sync:
            os.fdatasync(self.f.fileno())
        self.f.close()
        return {**self.counts, "pages": pages, "branch_pages": pages - self.next}


def _records(src: Path) -> list[tuple[Path, int]]:
    files = sorted(p for p in src.rglob("*.jpg"))
    classes = {c: i for i, c in enumerate(sorted({p.parent.name for p in files}))}
    return [(p, classes[p.parent.name]) for p in files]


def direct(records: list, out: Path, sync: bool) -> tuple[float, dict]:
    from gpubatch.formats.lmdb_datum import datum_key, datum_parts

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.sync()
    t0 = time.perf_counter()
    db = DirectLmdb(out / "data.mdb")
    for i, (p, label) in enumerate(records):
        data = p.read_bytes()
        head, tail = datum_parts(len(data), label)
        db.add(datum_key(i, p.stem), [head, data, tail], len(head) + len(data) + len(tail))
    info = db.close(sync)
    return time.perf_counter() - t0, info


def library(records: list, out: Path, sync: bool) -> float:
    import lmdb

    from gpubatch.formats.lmdb_datum import datum_key, encode_datum

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.sync()
    t0 = time.perf_counter()
    env = lmdb.open(str(out), map_size=1 << 34, writemap=True, sync=False, metasync=False, map_async=True)
    with env.begin(write=True) as txn:
        for i, (p, label) in enumerate(records):
            txn.put(datum_key(i, p.stem), encode_datum(p.read_bytes(), label), append=True)
    if sync:
        env.sync(True)
    env.close()
    return time.perf_counter() - t0


def tar_loop(records: list, out: Path, sync: bool) -> float:
    import io

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.sync()
    t0 = time.perf_counter()
    with tarfile.open(out / "loop.tar", "w") as tar:
        for i, (p, label) in enumerate(records):
            data = p.read_bytes()
            ti = tarfile.TarInfo(f"{i:08d}.jpg")
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
            cls = str(label).encode()
            ti = tarfile.TarInfo(f"{i:08d}.cls")
            ti.size = len(cls)
            tar.addfile(ti, io.BytesIO(cls))
        if sync:
            tar.fileobj.flush()
            os.fdatasync(tar.fileobj.fileno())
    return time.perf_counter() - t0


def check(records: list, out: Path, info: dict) -> None:
    """The direct file read back by the LMDB library: its stat, then every key and value in order."""
    import lmdb

    from gpubatch.formats.lmdb_datum import datum_key, decode_datum

    env = lmdb.open(str(out), readonly=True, lock=False)
    st = env.stat()
    want = {k: info[k] for k in ("entries", "branch_pages", "leaf_pages", "overflow_pages")}
    assert {k: st[k] for k in want} == want, (st, want)
    with env.begin() as txn:
        cur = txn.cursor()
        n = 0
        for (key, value), (i, (p, label)) in zip(cur, enumerate(records)):
            assert key == datum_key(i, p.stem), (key, i)
            d = decode_datum(value)
            assert d["data"] == p.read_bytes() and d["label"] == label, key
            n += 1
        assert n == len(records)
        i = len(records) // 2  # a lookup through the branch pages
        assert decode_datum(txn.get(datum_key(i, records[i][0].stem)))["label"] == records[i][1]
    env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-sync", action="store_true")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    records = _records(a.src)
    for p, _ in records:  # (the page cache warm for every contender)
        p.read_bytes()
    tmp = Path(tempfile.mkdtemp(prefix="gpubatch-lmdb-direct-", dir=a.tmp))
    sync = not a.no_sync
    times: dict[str, list[float]] = {"tarfile loop": [], "LMDB library (append, map)": [], "LMDB direct": []}
    try:
        secs, info = direct(records, tmp / "direct", sync)
        check(records, tmp / "direct", info)
        for _ in range(a.repeats):  # (in turn: the machine's drift falls on each alike)
            times["tarfile loop"].append(tar_loop(records, tmp / "tar", sync))
            times["LMDB library (append, map)"].append(library(records, tmp / "lib", sync))
            secs, info = direct(records, tmp / "direct", sync)
            times["LMDB direct"].append(secs)
        check(records, tmp / "direct", info)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(records)
    loop = n / statistics.median(times["tarfile loop"])
    out = {"records": n, "synced": sync, "layout": info, "contenders": {}}
    for name, ts in times.items():
        rate = n / statistics.median(ts)
        out["contenders"][name] = {"records_per_s": round(rate, 1), "runs": [round(t, 3) for t in ts],
                                   "ratio_to_loop": round(rate / loop, 3)}
        print(f"{name:28s} {rate:9.1f} records/s  {rate / loop:5.2f}x the loop  runs {[round(t, 2) for t in ts]}")
    print(f"layout: {info}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
