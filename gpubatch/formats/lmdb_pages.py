"""LMDB's B-tree read with bounded ``pread`` calls instead of the library's memory map.

The LMDB library reads its file through a memory map and trusts every offset it finds there: in a
damaged file a node offset or a key size that points past the end of the file makes the process die
of a bus error (SIGBUS), which no exception handler can catch. gpubatch lists a database's keys and
reads its values here instead: every page, node, key and value is checked to lie inside the pages
the meta page declares before a byte of it is used, a damaged page costs the records under it (each
such subtree a skipped entry with its reason) and nothing else. Layouts gpubatch does not write and
Caffe does not use (duplicate-sorted keys, named sub-databases) are left to the library.

Layout (lmdb.h / mdb.c, 64-bit builds): a page starts with a 16-byte header (pgno u64, pad u16, flags
u16, lower u16, upper u16), then ``(lower - 16) / 2`` u16 node offsets. A node is lo u16, hi u16,
flags u16, ksize u16, then its key; a branch node's child page is ``lo | hi << 16 | flags << 32``, a
leaf node's data size is ``lo | hi << 16``, its data inline after the key or, with F_BIGDATA, on
overflow pages whose number follows the key. Meta pages 0 and 1 hold the main database's root at byte
128 and the last page at 136; the one with the greater transaction id (144) is current.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2, P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
PAGE_HEADER = 16
NODE_HEADER = 8
P_INVALID = (1 << 64) - 1
_MAGIC = 0xBEEFC0DE
_MAX_DEPTH = 64


class Unsupported(Exception):
    """A layout this walker leaves to the LMDB library (duplicate keys, named sub-databases)."""


@dataclass(frozen=True)
class Entry:
    """A key and where its value lies in the file (byte offset and size)."""

    key: bytes
    offset: int
    size: int


@dataclass(frozen=True)
class Hole:
    """A subtree that could not be listed: the page, why, and the last key listed before it."""

    page: int
    reason: str
    after: bytes | None


class PageFile:
    """An LMDB data file read page by page (the current meta page's main database)."""

    def __init__(self, path: str | os.PathLike):
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self._meta()
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def _meta(self) -> None:
        head = os.pread(self.fd, 4096, 0)
        psize = struct.unpack_from("<I", head, 40)[0] if len(head) >= 44 else 0
        if psize < 512 or psize & (psize - 1):
            raise ValueError("no LMDB meta page")
        metas = []
        for at in (0, psize):
            page = head if at == 0 else os.pread(self.fd, 160, at)
            if len(page) >= 152 and struct.unpack_from("<I", page, 16)[0] == _MAGIC:
                flags = struct.unpack_from("<H", page, 88 + 4)[0]
                root, last, txn = struct.unpack_from("<QQQ", page, 128)
                metas.append((txn, root, last, flags))
        if not metas:
            raise ValueError("no LMDB meta page")
        _, self.root, self.last, flags = max(metas)
        if flags:  # duplicate-sorted or other special main database
            raise Unsupported(f"main database flags {flags:#x}")
        self.psize = psize
        self.end = (self.last + 1) * psize  # the bytes every read must stay inside
        self.size = os.fstat(self.fd).st_size

    def page(self, pgno: int) -> bytes:
        if not 2 <= pgno <= self.last:
            raise ValueError(f"page {pgno} is outside the database's pages 2..{self.last}")
        data = os.pread(self.fd, self.psize, pgno * self.psize)
        if len(data) != self.psize:
            raise ValueError(f"page {pgno} lies past the end of the file")
        return data

    def _nodes(self, pgno: int, page: bytes) -> tuple[int, list[tuple[int, int, int, int, int]]]:
        """(page flags, its nodes as (offset, lo, hi, flags, ksize)), every bound checked."""
        mp_pgno, _, flags, lower, upper = struct.unpack_from("<QHHHH", page, 0)
        if mp_pgno != pgno:
            raise ValueError(f"page {pgno} says it is page {mp_pgno}")
        if flags & (P_LEAF2 | P_SUBP):
            raise Unsupported(f"page {pgno} flags {flags:#x}")
        if (flags & (P_BRANCH | P_LEAF)) not in (P_BRANCH, P_LEAF):
            raise ValueError(f"page {pgno} is neither a branch nor a leaf (flags {flags:#x})")
        if not PAGE_HEADER <= lower <= upper <= self.psize or (lower - PAGE_HEADER) % 2:
            raise ValueError(f"page {pgno} has a bad free range ({lower}, {upper})")
        n = (lower - PAGE_HEADER) // 2
        nodes = []
        for off in struct.unpack_from(f"<{n}H", page, PAGE_HEADER):
            if not upper <= off <= self.psize - NODE_HEADER:
                raise ValueError(f"page {pgno} has a node at {off}, outside its node area")
            lo, hi, nflags, ksize = struct.unpack_from("<HHHH", page, off)
            if off + NODE_HEADER + ksize > self.psize:
                raise ValueError(f"page {pgno} has a key running past the page")
            nodes.append((off, lo, hi, nflags, ksize))
        return flags, nodes

    def walk(self) -> tuple[list[Entry], list[Hole]]:
        """Every key in order with its value's place, and the subtrees that could not be listed."""
        entries: list[Entry] = []
        holes: list[Hole] = []
        if self.root == P_INVALID:
            return entries, holes
        seen: set[int] = set()
        stack: list[tuple[int, int]] = [(self.root, 0)]
        while stack:
            pgno, depth = stack.pop()
            try:
                if pgno in seen or depth > _MAX_DEPTH:
                    raise ValueError(f"page {pgno} is reached twice (a loop in the tree)")
                seen.add(pgno)
                page = self.page(pgno)
                flags, nodes = self._nodes(pgno, page)
                if flags & P_BRANCH:
                    children = [lo | hi << 16 | nf << 32 for _, lo, hi, nf, _ in nodes]
                    stack.extend((c, depth + 1) for c in reversed(children))
                    continue
                found = [self._leaf(pgno, page, node) for node in nodes]
            except ValueError as e:
                holes.append(Hole(pgno, str(e), entries[-1].key if entries else None))
                continue
            entries.extend(found)
        return entries, holes

    def _leaf(self, pgno: int, page: bytes, node: tuple[int, int, int, int, int]) -> Entry:
        off, lo, hi, nflags, ksize = node
        if nflags & (F_SUBDATA | F_DUPDATA):
            raise Unsupported(f"page {pgno} holds a sub-database or duplicate keys")
        key = page[off + NODE_HEADER: off + NODE_HEADER + ksize]
        size = lo | hi << 16
        at = off + NODE_HEADER + ksize
        if nflags & F_BIGDATA:
            if at + 8 > self.psize:
                raise ValueError(f"page {pgno} has an overflow page number running past the page")
            ov = struct.unpack_from("<Q", page, at)[0]
            start = ov * self.psize + PAGE_HEADER
            if not 2 <= ov <= self.last or start + size > self.end:
                raise ValueError(f"page {pgno} points at a value outside the database (page {ov}, {size:,} bytes)")
            return Entry(key, start, size)
        if at + size > self.psize:
            raise ValueError(f"page {pgno} has a value running past the page")
        return Entry(key, pgno * self.psize + at, size)

    def value(self, entry: Entry) -> bytes:
        """The value's bytes; ValueError where the file no longer holds them (it shrank)."""
        data = os.pread(self.fd, entry.size, entry.offset)
        if len(data) != entry.size:
            raise ValueError("the file shrank: the value lies past its end now")
        return data
