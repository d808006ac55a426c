"""Kernel launches over ragged batches: the fused resample (``kernels/resample.cu``) and the
per-sample step programs (``kernels/step.cu``), one launch per batch each.

A :class:`Launcher` holds what a launch needs (CuPy, the stream, the pinned staging of the launch
tables); the chain runner (:mod:`.gpu_chain`) and the pipeline call it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..batch import DeviceBatch, PinnedStaging, Ragged, upload_table_addresses, upload_tables
from ..ops.base import Window
from ..ops.normalize import Normalize

BLOCK = 256


_DTYPE_TAG = {"uint8": "u8", "float16": "f16", "float32": "f32"}


class Launcher:
    """Launches kernels over ragged batches on one stream, their tables uploaded through pinned staging.

    Attributes:
        cp: the CuPy module.
        stream: the stream launches are enqueued on (``resample`` may name another).
        staging: the pinned ring the launch tables reach the device through without the host waiting.
    """

    def __init__(self, cp: Any, stream: Any, staging: PinnedStaging):
        self.cp = cp
        self.stream = stream
        self.staging = staging
        self._null = cp.zeros(1, cp.uint64)  # stands for an unused pointer argument

    def _out_tables(self, out_hw: np.ndarray, per_pixel: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Offsets (elements), first block per sample, total blocks and total elements of a packed output."""
        n = len(out_hw)
        pixels = out_hw[:, 0].astype(np.int64) * out_hw[:, 1]
        sizes = pixels * per_pixel
        blocks = -(-pixels // BLOCK)
        offsets = np.zeros(n, np.int64)
        first = np.zeros(n, np.int32)
        if n:
            offsets[1:] = np.cumsum(sizes)[:-1]
            first[1:] = np.cumsum(blocks)[:-1]
        return offsets, first, int(blocks.sum()), int(sizes.sum())

    def resample(self, src: Any, windows: Sequence[Window] | tuple[np.ndarray, np.ndarray],
                 normalize: Normalize | None = None, out: Any = None,
                 fill: Sequence[float] = (0.0, 0.0, 0.0), offsets: np.ndarray | None = None,
                 stream: Any = None) -> DeviceBatch:
        """One fused launch: image ``i`` of ``src`` (a :class:`Ragged`, or a list of DeviceImages / uint8 HWC
        CuPy arrays) through ``windows[i]``, then ``normalize``; pixels outside the image read ``fill``.
        ``windows`` may also be given as arrays: geometry (N, 4) and output sizes (N, 2).

        Output items are uint8 HWC unless ``normalize`` says otherwise; ``out`` may be a preallocated
        1-D buffer large enough for the whole batch (a ring slot). ``offsets`` (elements, per image) place
        the outputs in ``out`` instead of packing them from its start (part of a batch at a time);
        ``stream``: the stream to run on instead of the engine's.
        """

        cp = self.cp
        if not isinstance(src, Ragged):
            src = Ragged.from_items(cp, src)
        n = len(src)
        layout = normalize.layout if normalize else "HWC"
        dtype = normalize.dtype if normalize else "uint8"
        norm = np.concatenate([normalize.mul_add() if normalize else np.array([1, 1, 1, 0, 0, 0], np.float32),
                               np.asarray(fill, np.float32)]).astype(np.float32)
        if isinstance(windows, tuple):
            geo = np.ascontiguousarray(windows[0], np.float32).reshape(n, 4)
            out_shape = np.ascontiguousarray(windows[1], np.int32).reshape(n, 2)
        else:
            geo = np.array([w.as_array() for w in windows], np.float32).reshape(n, 4)
            out_shape = np.array([(w.oh, w.ow) for w in windows], np.int32).reshape(n, 2)
        packed, first_block, total_blocks, total = self._out_tables(out_shape, 3)
        if offsets is None:
            offsets = packed
        else:
            offsets = np.ascontiguousarray(offsets, np.int64).reshape(n)
            total = int((offsets + out_shape[:, 0].astype(np.int64) * out_shape[:, 1] * 3).max()) if n else 0
        stream = stream or self.stream
        with stream:
            if out is None or out.size < total:
                out = cp.empty(max(total, 1), dtype=dtype)
            shapes = [(oh, ow, 3) if layout == "HWC" else (3, oh, ow) for oh, ow in out_shape.tolist()]
            if n == 0:
                return DeviceBatch(out, offsets, shapes, keep=list(src.keep), stream=stream)
            t_ptr, t_shape, t_geo, t_oshape, t_off, t_first, t_norm = upload_table_addresses(
                [src.ptr, src.shape, geo, out_shape, offsets, first_block, norm], stream, self.staging)
            from ..kernels import kernel

            fn = kernel("resample", f"resample_{_DTYPE_TAG[dtype]}_{layout.lower()}{'_planes' if src.planes else ''}")
            fn((total_blocks,), (BLOCK,), (t_ptr, t_shape, t_geo, t_oshape, t_off, t_first, np.int32(n),
                                          t_norm, out))
        return DeviceBatch(out, offsets, shapes, keep=list(src.keep), stream=stream)

    def step(self, src: Any, steps: Sequence[Any]) -> DeviceBatch:
        """One launch of ``kernels/step.cu``: image ``i`` of ``src`` (a :class:`Ragged`) through ``steps[i]``
        (a :class:`~gpubatch.engine.ops.pixel.Step`), with the per-image statistics its codes need."""
        from ..kernels import kernel
        from ..ops.pixel import NPRM, stats_needed

        cp = self.cp
        if src.planes:
            raise ValueError("the step kernels read interleaved RGB; decode without planes=True")
        n = len(src)
        prm = np.zeros((n, NPRM), np.float32)
        out_shape = src.hw.astype(np.int32).copy()
        flags = 0
        for i, st in enumerate(steps):
            prm[i, : len(st.prm)] = st.prm
            if st.out_hw is not None:
                out_shape[i] = st.out_hw
            flags |= stats_needed(int(st.prm[0]))
        offsets, first_block, total_blocks, total = self._out_tables(out_shape, 1)
        offsets *= 3
        in_first = self._out_tables(src.hw.astype(np.int32), 1)[1] if flags else first_block
        in_blocks = int((-(-(src.hw[:, 0].astype(np.int64) * src.hw[:, 1]) // BLOCK)).sum()) if n else 0
        shapes = [(int(h), int(w), 3) for h, w in out_shape]
        with self.stream:
            out = cp.empty(max(total * 3, 1), dtype=cp.uint8)
            if n == 0:
                return DeviceBatch(out, offsets, shapes, stream=self.stream)
            init = np.tile(np.array([255, 255, 255, 0, 0, 0], np.int32), (n if flags & 2 else 0, 1))
            t_ptr, t_shape, t_oshape, t_off, t_first, t_prm, t_in_first, t_minmax = upload_tables(
                [src.ptr, src.shape, out_shape, offsets, first_block, prm, in_first, init], self.stream, self.staging)
            gsum = minmax = lut = self._null
            if flags:
                gsum = cp.zeros(n, cp.uint64) if flags & 1 else self._null
                minmax = t_minmax if flags & 2 else self._null
                hist = cp.zeros((n, 768), cp.uint32) if flags & 4 else self._null
                kernel("step", "stats_u8")((in_blocks,), (BLOCK,), (t_ptr, t_shape, t_in_first, np.int32(n),
                                                                   np.int32(flags), gsum, minmax, hist))
                if flags & 4:
                    lut = cp.empty((n, 768), cp.uint8)
                    kernel("step", "equalize_lut")((-(-3 * n // 128),), (128,), (hist, np.int32(n), lut))
            kernel("step", "step_u8")((total_blocks,), (BLOCK,), (t_ptr, t_shape, t_oshape, t_off, t_first, np.int32(n),
                                                                t_prm, gsum, minmax, lut, out))
        return DeviceBatch(out, offsets, shapes, keep=list(src.keep), stream=self.stream)
