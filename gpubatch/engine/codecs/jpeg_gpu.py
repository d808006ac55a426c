"""Batched baseline JPEG encode on the GPU: a whole ragged batch in a few kernel launches.

nvImageCodec's CUDA JPEG encoder (nvJPEG) works image by image: each image is several small kernel
launches and a synchronizing bitstream read-back on the host, so 224x224 images encode at about
5,000 per second inside a worker beside the decoders, and that capped ``augment`` and ``convert``'s
transcode (the worker study (docs/engine.md); benchmarks/RESULTS.md). Hopper has no hardware JPEG encoder.
Here every stage runs once over the whole batch (``kernels/jpeg.cu``):

1. colour conversion, 4:2:0 chroma averaging, the 8x8 DCT and quantization, eight threads per block;
2. the Huffman-coded length of every block, a scan over the batch, so every block knows its bit
   offset and every image its byte offset;
3. every block writes its codes at its offset; then byte stuffing (a scan over the 0xFF bytes) and
   one copy of the batch's entropy-coded data to the host, where each image gets its headers.

Every step is a kernel of ``kernels/jpeg.cu`` (nine launches a batch), none of them CuPy's own: a worker
compiles them all at once while its decoders start, where CuPy's elementwise kernels and indexing (sixteen
of them, some thirty launches a batch) were compiled one after the other at the first encode, 2.0 s on a
machine that had never run gpubatch (2026-12-03, H200; benchmarks/RESULTS.md).

The headers (quantization tables scaled for the quality, the standard Huffman tables, JFIF) are
those libjpeg writes: they are taken from a tiny JPEG Pillow encodes at the same quality, so a file
differs from Pillow's own only by the DCT's rounding. Output is baseline 4:2:0, as nvImageCodec's
encoder was configured before.
"""

from __future__ import annotations

import functools
import io
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...types import Record

BLOCK = 128  # (kernels/jpeg.cu's DCT_THREADS)
SCAN_TILE = 1024  # (kernels/jpeg.cu's: the threads of a scan's thread block)
EOI = b"\xff\xd9"


@dataclass(frozen=True)
class JpegTables:
    """What the kernels and the headers of one quality need.

    Attributes:
        prefix, suffix: the header bytes (SOI up to and including SOS) before and after SOF0's
            height and width, which differ per image.
        qtab: float32 (2, 64) luminance and chrominance quantization tables, zigzag order.
        huff: uint32 table block of ``HuffTables`` in kernels/jpeg.cu: DC codes (2, 16), DC lengths
            (2, 16), AC codes (2, 256), AC lengths (2, 256).
    """

    prefix: bytes
    suffix: bytes
    qtab: np.ndarray
    huff: np.ndarray


@dataclass(frozen=True)
class EncodedSpan:
    """A JPEG of ``height`` x ``width`` at ``quality`` whose entropy-coded data lies at [start, end) of a
    host buffer (a :class:`Sink`); the file is made when it is read (:meth:`assemble`)."""

    start: int
    end: int
    height: int
    width: int
    quality: int

    def assemble(self, buf: Any) -> bytes:
        tab = tables(self.quality)
        return b"".join((tab.prefix, struct.pack(">HH", self.height, self.width), tab.suffix,
                         buf[self.start : self.end], EOI))


class Sink:
    """A host buffer (a NumPy uint8 array, e.g. over shared memory) the encoder copies entropy-coded data
    into, back to back from ``pos``: files then travel as :class:`EncodedSpan` values, not bytes.
    ``view=None``: the encoder's first batch makes one of the size it needs."""

    def __init__(self, view: np.ndarray | None):
        self.view = view
        self.pos = 0


def assembled(records: list[Any], buf: Any, stats: Any = None) -> list[Any]:
    """``records`` with each :class:`EncodedSpan` of ``buf`` their data holds made into its JPEG file: a GPU
    worker hands a batch over as spans of one buffer, and the shards' writer (a process of its own) makes
    the files, so the worker's thread does not (a shard writer's payload: ``stats`` is not used)."""
    return [r.with_(data=r.data.assemble(buf)) if isinstance(r, Record) and isinstance(r.data, EncodedSpan) else r
            for r in records]


def huffman_codes(bits: bytes, values: bytes) -> dict[int, tuple[int, int]]:
    """symbol -> (code, length) of a JPEG Huffman table given as its BITS and HUFFVAL lists (Annex C)."""
    codes: dict[int, tuple[int, int]] = {}
    code, k = 0, 0
    for length in range(1, 17):
        for _ in range(bits[length - 1]):
            codes[values[k]] = (code, length)
            code += 1
            k += 1
        code <<= 1
    return codes


def _segments(data: bytes):
    """(marker, start of the segment, payload) of a JPEG's marker segments up to SOS."""
    pos = 2
    while pos + 4 <= len(data):
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        yield marker, pos, data[pos + 4 : pos + 2 + length]
        if marker == 0xDA:
            return
        pos += 2 + length


@functools.cache
def tables(quality: int) -> JpegTables:
    """The tables and headers of a baseline 4:2:0 JPEG at ``quality``, as libjpeg makes them."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, "JPEG", quality=int(quality), subsampling=2, optimize=False,
                                    progressive=False)
    data = buf.getvalue()
    qt: dict[int, np.ndarray] = {}
    huff: dict[tuple[int, int], dict[int, tuple[int, int]]] = {}
    sof = comps = scan = None
    head_end = 0
    for marker, pos, seg in _segments(data):
        if marker == 0xDB:
            k = 0
            while k < len(seg):
                if seg[k] >> 4:
                    raise ValueError("16-bit quantization tables are not baseline")
                qt[seg[k] & 15] = np.frombuffer(seg[k + 1 : k + 65], np.uint8).astype(np.float32)
                k += 65
        elif marker == 0xC0:
            sof = pos + 5  # the marker (2), the length (2) and the sample precision (1)
            comps = [tuple(seg[6 + 3 * c : 9 + 3 * c]) for c in range(seg[5])]
        elif marker == 0xC4:
            k = 0
            while k < len(seg):
                n = sum(seg[k + 1 : k + 17])
                huff[(seg[k] >> 4, seg[k] & 15)] = huffman_codes(seg[k + 1 : k + 17], seg[k + 17 : k + 17 + n])
                k += 17 + n
        elif marker == 0xDA:
            scan = [tuple(seg[1 + 2 * c : 3 + 2 * c]) for c in range(seg[0])]
            head_end = pos + 2 + len(seg) + 2
    # the layout the kernels write: Y 2x2 with tables 0, Cb and Cr 1x1 with tables 1
    if sof is None or comps != [(1, 0x22, 0), (2, 0x11, 1), (3, 0x11, 1)] or scan != [(1, 0x00), (2, 0x11), (3, 0x11)]:
        raise RuntimeError(f"unexpected JPEG layout from Pillow (components {comps}, scan {scan})")
    block = np.zeros(2 * 16 * 2 + 2 * 256 * 2, np.uint32)
    dc_code, dc_len = block[0:32].reshape(2, 16), block[32:64].reshape(2, 16)
    ac_code, ac_len = block[64:576].reshape(2, 256), block[576:1088].reshape(2, 256)
    for t in (0, 1):
        for sym, (code, length) in huff[(0, t)].items():
            dc_code[t, sym], dc_len[t, sym] = code, length
        for sym, (code, length) in huff[(1, t)].items():
            ac_code[t, sym], ac_len[t, sym] = code, length
    head = data[:head_end]
    return JpegTables(head[:sof], head[sof + 4 :], np.stack([qt[0], qt[1]]), block)


def dct_matrix() -> np.ndarray:
    """c[u][x] = C(u)/2 cos((2x+1) u pi / 16), C(0) = 1/sqrt(2): F = c f c^T is the JPEG FDCT."""
    c = np.array([[math.cos((2 * x + 1) * u * math.pi / 16) for x in range(8)] for u in range(8)])
    c[0] *= math.sqrt(0.5)
    return (c / 2).astype(np.float32)


class BatchedJpegEncoder:
    """Encodes ragged batches of uint8 RGB HWC device images to baseline JPEG (see the module docstring)."""

    def __init__(self, cp: Any, staging: Any):
        self.cp = cp
        self.staging = staging
        self._dev: dict[int, tuple[Any, Any]] = {}
        self._cos = None

    def _tables(self, quality: int) -> tuple[JpegTables, Any, Any]:
        tab = tables(quality)
        if quality not in self._dev:
            self._dev[quality] = (self.cp.asarray(tab.qtab), self.cp.asarray(tab.huff))
        if self._cos is None:
            self._cos = self.cp.asarray(dct_matrix())
        return (tab, *self._dev[quality])

    def _scan(self, values: Any, ff: int, n: int) -> tuple[Any, Any]:
        """The inclusive scan of ``n`` int64 ``values`` (or, with ``ff``, of ``values`` (bytes) == 0xFF) in two
        launches, on the current stream: (each tile's own scan, each tile's offset); value i's scan is
        their sum (``scanned()`` in kernels/jpeg.cu)."""
        from ..kernels import kernel

        cp = self.cp
        tiles = (n + SCAN_TILE - 1) // SCAN_TILE
        part = cp.empty(max(n, 1), cp.int64)
        tile_off = cp.empty(max(tiles, 1), cp.int64)
        kernel("jpeg", "scan_tile")((tiles,), (SCAN_TILE,), (values, np.int32(ff), np.int64(n), part, tile_off))
        kernel("jpeg", "scan_tiles")((1,), (SCAN_TILE,), (tile_off, np.int64(tiles)))
        return part, tile_off

    def encode(self, items: Any, quality: int, stream: Any, sink: Sink | None = None) -> list[Any]:
        """JPEG bytes of each item (a :class:`~gpubatch.engine.batch.Ragged`, or a list of CuPy uint8
        HWC arrays or DeviceImages), ordered on ``stream``; with a ``sink`` that has room for them, the
        data goes there and :class:`EncodedSpan` values come back instead."""
        from ..batch import Ragged, upload_table_addresses
        from ..kernels import kernel

        cp = self.cp
        n = len(items)
        if n == 0:
            return []
        src = items if isinstance(items, Ragged) else Ragged.from_items(cp, items)
        hw = src.hw.astype(np.int64)
        if (hw <= 0).any() or (hw > 65535).any():
            raise ValueError("JPEG images must be 1 to 65,535 pixels high and wide")
        mcu_first = np.zeros(n + 1, np.int32)
        np.cumsum(((hw[:, 0] + 15) // 16) * ((hw[:, 1] + 15) // 16), out=mcu_first[1:])
        blocks = int(mcu_first[-1]) * 6
        tab, qtab, huff = self._tables(int(quality))
        grid = ((blocks + BLOCK - 1) // BLOCK,)
        i32, i64 = np.int32, np.int64
        with stream:
            t_ptr, t_shape, t_first = upload_table_addresses([src.ptr, src.shape, mcu_first], stream, self.staging)
            coef = cp.empty(blocks * 64, cp.int16)
            kernel("jpeg", "jpeg_dct")(((8 * blocks + BLOCK - 1) // BLOCK,), (BLOCK,),  # (eight threads a block)
                                       (t_ptr, t_shape, t_first, i32(n), i32(blocks), qtab, self._cos, coef))
            nbits = cp.empty(blocks, cp.int64)
            kernel("jpeg", "jpeg_bits")(grid, (BLOCK,), (coef, t_first, i32(n), i32(blocks), huff, nbits))
            part, tile_off = self._scan(nbits, 0, blocks)  # every block's bit offset, and each image's first byte
            layout = cp.empty(2 * n + 1, cp.int64)
            base, bit_base = layout[: n + 1], layout[n + 1 :]
            kernel("jpeg", "jpeg_layout")((1,), (SCAN_TILE,), (t_first, i32(n), nbits, part, tile_off, base, bit_base))
            total = int(base[n].get(stream=stream))  # (the bytes of the batch's entropy-coded data)
            words = cp.zeros(total // 4 + 2, cp.uint32)
            kernel("jpeg", "jpeg_pack")(grid, (BLOCK,), (coef, t_first, i32(n), i32(blocks), huff, nbits, part, tile_off,
                                                          bit_base, words))
            raw = words.view(cp.uint8)
            # byte stuffing: a 0x00 after every 0xFF, so a byte moves by the number of 0xFF before it
            ff_part, ff_off = self._scan(raw, 1, total)
            stuffed = cp.empty(2 * total, cp.uint8)  # (at most every byte doubled)
            ends_dev = cp.empty(n + 1, cp.int64)
            kernel("jpeg", "jpeg_stuff")(((total + n + 1 + BLOCK - 1) // BLOCK,), (BLOCK,),
                                         (raw, i64(total), ff_part, ff_off, base, i32(n), stuffed, ends_dev))
            ends = ends_dev.get(stream=stream)
            stuffed = stuffed[: int(ends[n])]
            if sink is not None and sink.view is None:
                sink.view = np.empty(len(stuffed), np.uint8)
            if sink is not None and sink.pos + len(stuffed) <= len(sink.view):
                at = sink.pos
                stuffed.get(stream=stream, out=sink.view[at : at + len(stuffed)])
                stream.synchronize()
                sink.pos += len(stuffed)
                q = int(quality)
                return [EncodedSpan(at + int(ends[i]), at + int(ends[i + 1]), h, w, q)
                        for i, (h, w) in enumerate(hw.tolist())]
            data = stuffed.get(stream=stream)
            stream.synchronize()
        prefix, suffix = tab.prefix, tab.suffix
        view = memoryview(data)
        return [b"".join((prefix, struct.pack(">HH", h, w), suffix, view[ends[i] : ends[i + 1]], EOI))
                for i, (h, w) in enumerate(hw.tolist())]
