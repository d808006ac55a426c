#!/usr/bin/env python3
"""An experiment: a Caffe LMDB written page by page with plain sequential writes, as a tar is, instead of through the
LMDB library's memory map; beside the library (one process, ``MDB_APPEND`` into its map, as gpubatch's LMDB sink
writes a transaction) and the pass-through's one-process ``tarfile`` loop, in turn, on the same files.

    python3 benchmarks/lmdb_direct.py --src .bench-data/jpeg-16384 [--repeats 5] [--json out.json]

Why: under its default ``--sync`` the LMDB pass-through misses the 2-core CI machine's target (0.61-0.71x the
``tarfile`` loop against 1.12-1.34x for the tar formats, benchmarks/RESULTS.md), and what costs is the kernel's work on
the map (its pages zeroed and faulted in, their writeback), under the database's lock, one writer at a time. Every
other way of feeding the library was tried (docs/engine.md's LMDB paragraph). The file format itself
(lmdb.h / mdb.c, 64-bit builds; ``gpubatch/formats/lmdb_pages.py`` reads it) allows writing it as a stream:
a value past a node's limit (2,038 bytes on 4-KiB pages: every JPEG here) lies on overflow pages, its first page
a 16-byte header, the value's bytes straight after it; leaf pages hold the keys and the overflow pages' numbers;
branch pages and the two meta pages come last. So every page of a record can be written the moment it is made,
in order, at the file's end, with nothing mapped and nothing read back; a run of shards would take each shard's
page range under the lock (arithmetic on its records' sizes) and write it outside.

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
import struct
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PS = 4096  # page size (the OS page, as the library takes it)
HDR = 16  # page header: pgno u64, pad u16, flags u16, lower u16, upper u16 (or pages u32)
NODE = 8  # node header: lo u16, hi u16, flags u16, ksize u16
NODEMAX = (((PS - HDR) // 2) & -2) - 2  # me_nodemax: a leaf node past this keeps its value on overflow pages
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA = 0x01
P_INVALID = (1 << 64) - 1
MAGIC, VERSION = 0xBEEFC0DE, 1


def _even(n: int) -> int:
    return n + (n & 1)


class DirectLmdb:
    """An LMDB data file (``data.mdb``) written in order: ``add(key, parts, size)`` for keys in ascending order;
    ``close()`` writes the last leaf, the branch pages and the meta pages."""

    def __init__(self, path: Path):
        self.f = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.f.write(bytes(2 * PS))  # (the meta pages, written last)
        self.next = 2  # the next free page
        self.leaf: list[bytes] = []  # the open leaf page's nodes
        self.leaf_key = b""
        self.used = HDR  # the open leaf's bytes (header, pointers, nodes)
        self.leaves: list[tuple[bytes, int]] = []  # (first key, page) of each leaf written
        self.entries = self.overflow = 0

    def _page(self, flags: int, nodes: list[bytes], pgno: int) -> bytes:
        """A branch or leaf page of ``nodes`` (in key order): their pointers from the header up, the nodes from the
        page's end down (the first node last, as the library lays out appended keys)."""
        lower = HDR + 2 * len(nodes)
        upper = PS
        ptrs = []
        for n in nodes:
            upper -= len(n)
            ptrs.append(upper)
        body = struct.pack(f"<QHHHH{len(nodes)}H", pgno, 0, flags, lower, upper, *ptrs)
        return body + bytes(upper - lower) + b"".join(reversed(nodes))

    def _flush_leaf(self) -> None:
        if not self.leaf:
            return
        pgno, self.next = self.next, self.next + 1
        self.f.write(self._page(P_LEAF, self.leaf, pgno))
        self.leaves.append((self.leaf_key, pgno))
        self.leaf, self.used = [], HDR

    def add(self, key: bytes, parts: list, size: int) -> None:
        if NODE + len(key) + size > NODEMAX:  # its value on overflow pages of its own, written now
            pages = (HDR - 1 + size) // PS + 1
            pgno, self.next = self.next, self.next + pages
            self.f.write(struct.pack("<QHHI", pgno, 0, P_OVERFLOW, pages))
            for p in parts:
                self.f.write(p)
            self.f.write(bytes(pages * PS - HDR - size))
            node = struct.pack("<HHHH", size & 0xFFFF, size >> 16, F_BIGDATA, len(key)) + key + struct.pack("<Q", pgno)
            self.overflow += pages
        else:
            node = struct.pack("<HHHH", size & 0xFFFF, size >> 16, 0, len(key)) + key + b"".join(parts)
        node += bytes(len(node) & 1)
        if self.used + len(node) + 2 > PS:
            self._flush_leaf()
        if not self.leaf:
            self.leaf_key = key
        self.leaf.append(node)
        self.used += len(node) + 2
        self.entries += 1

    def close(self, sync: bool = True) -> dict:
        self._flush_leaf()
        level, depth, branches = self.leaves, 1, 0
        while len(level) > 1:  # branch levels, bottom up: a node a child, the first with an empty key
            up: list[tuple[bytes, int]] = []
            nodes: list[bytes] = []
            first = b""
            used = HDR
            for key, child in level:
                k = b"" if not nodes else key
                node = struct.pack("<HHHH", child & 0xFFFF, (child >> 16) & 0xFFFF, child >> 32, len(k)) + k
                node += bytes(len(node) & 1)
                if nodes and used + len(node) + 2 > PS:
                    pgno, self.next = self.next, self.next + 1
                    self.f.write(self._page(P_BRANCH, nodes, pgno))
                    up.append((first, pgno))
                    branches += 1
                    node = struct.pack("<HHHH", child & 0xFFFF, (child >> 16) & 0xFFFF, child >> 32, 0)
                    nodes, used = [], HDR
                if not nodes:
                    first = key
                nodes.append(node)
                used += len(node) + 2
            pgno, self.next = self.next, self.next + 1
            self.f.write(self._page(P_BRANCH, nodes, pgno))
            up.append((first, pgno))
            branches += 1
            level, depth = up, depth + 1
        root = level[0][1] if level else P_INVALID
        last = self.next - 1
        mapsize = max(1 << 20, self.next * PS)
        free_db = struct.pack("<IHHQQQQQ", PS, 0, 0, 0, 0, 0, 0, P_INVALID)  # (its pad holds the page size)
        main_db = struct.pack("<IHHQQQQQ", 0, 0, depth if level else 0, branches, len(self.leaves), self.overflow,
                              self.entries, root)
        for pgno, txnid in ((0, 0), (1, 1)):  # (the library takes the meta of the greater transaction id)
            meta = struct.pack("<IIQQ", MAGIC, VERSION, 0, mapsize) + free_db + main_db + struct.pack("<QQ", last, txnid)
            page = struct.pack("<QHHHH", pgno, 0, P_META, 0, 0) + meta
            self.f.seek(pgno * PS)
            self.f.write(page + bytes(PS - len(page)))
        self.f.flush()
        if sync:
            os.fdatasync(self.f.fileno())
        self.f.close()
        return {"entries": self.entries, "depth": depth, "branch_pages": branches, "leaf_pages": len(self.leaves),
                "overflow_pages": self.overflow, "pages": self.next}


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
    want = {"entries": info["entries"], "depth": info["depth"], "branch_pages": info["branch_pages"],
            "leaf_pages": info["leaf_pages"], "overflow_pages": info["overflow_pages"]}
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
