"""An op chain on the GPU: ragged batches through fused resamples, per-sample steps and custom kernels.

The chain is cut into segments. Consecutive window ops (crop, resize, flip, pad, expand) fold into ONE
resample launch; each step op (colour, filters, warps, policies) is one launch per step over the whole
batch; a custom op (JPEG degradation) runs its own device code. A trailing ``normalize`` becomes the
store of the last resample (an identity resample when the chain ends on a step). Intermediate batches
come from the engine's CuPy pool on the engine's one stream, so a buffer freed by Python is reused only
after the kernels before it in stream order are done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UsageError
from .codecs.planes import PLANE_CODE
from .ops.base import Op, Window
from .registry import DEVICE, get_kernel

ZERO_FILL = (0.0, 0.0, 0.0)


@dataclass
class Ragged:
    """A ragged batch of uint8 HWC RGB images in device memory, by pointer.

    Attributes:
        ptr: uint64 (N,) address of each image's pixel (0, 0).
        shape: int32 (N, 3) height, width, row stride in bytes; (N, 4) where some images are in the
            JPEG's planes (DeviceImage.sampling), the fourth column their format (0: interleaved RGB,
            1: 4:2:0 planes, 2: 4:2:2 planes). Only the fused resample reads those (:attr:`planes`).
        keep: objects owning the memory, held until the kernels reading it are done.
    """

    ptr: np.ndarray
    shape: np.ndarray
    keep: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ptr)

    @property
    def hw(self) -> np.ndarray:
        return self.shape[:, :2]

    @property
    def planes(self) -> bool:
        """Whether some images are in planes (only ``GpuEngine.resample`` reads such a batch)."""
        return self.shape.shape[1] == 4

    @staticmethod
    def from_items(cp: Any, items: Sequence[Any]) -> Ragged:
        """From DeviceImages (the decoder's) or uint8 HWC CuPy arrays."""
        n = len(items)
        sampled = [getattr(a, "sampling", None) for a in items]
        planes = any(sampled)
        ptr, shape, keep = np.empty(n, np.uint64), np.zeros((n, 4 if planes else 3), np.int32), []
        for i, a in enumerate(items):
            if isinstance(a, cp.ndarray):
                if a.strides[2] != 1 or a.strides[1] != 3:
                    a = cp.ascontiguousarray(a)
                keep.append(a)
                ptr[i], shape[i, :3] = a.data.ptr, (a.shape[0], a.shape[1], a.strides[0])
            else:
                ptr[i], shape[i, :3] = a.ptr, (a.shape[0], a.shape[1], a.row_stride)
                if sampled[i]:
                    shape[i, 3] = PLANE_CODE[sampled[i]]
        return Ragged(ptr, shape, keep)

    @staticmethod
    def from_batch(batch: Any) -> Ragged:
        """From a uint8 HWC DeviceBatch (zero-copy)."""
        hw = np.array([s[:2] for s in batch.shapes], np.int32).reshape(-1, 2)
        shape = np.concatenate([hw, (hw[:, 1:2] * 3)], 1).astype(np.int32)
        ptr = (np.uint64(batch.buffer.data.ptr) + batch.offsets.astype(np.uint64)).astype(np.uint64)
        return Ragged(ptr, shape, [batch.buffer])

    def take(self, idx: Sequence[int]) -> Ragged:
        idx = np.asarray(idx, np.int64)
        return Ragged(self.ptr[idx], self.shape[idx], self.keep)


def segments(ops: Sequence[Op]) -> list[tuple[str, list[int]]]:
    """The chain cut into ("window", [op indices]), ("step", [i]), ("custom", [i]) and ("normalize", [i])."""
    out: list[tuple[str, list[int]]] = []
    fill: tuple | None = None
    for i, op in enumerate(ops):
        if op.kind == "normalize":
            if i != len(ops) - 1:
                raise UsageError("normalize must be the last op of a chain")
            out.append(("normalize", [i]))
        elif op.kind == "window":
            op_fill = tuple(getattr(op, "fill", ZERO_FILL)) if op.pads else None
            joinable = out and out[-1][0] == "window" and (op_fill is None or fill is None or op_fill == fill)
            if joinable:
                out[-1][1].append(i)
            else:
                out.append(("window", [i]))
                fill = None
            if op_fill is not None:
                fill = op_fill
        else:
            out.append((op.kind, [i]))
    return out


def fold_windows(ops: Sequence[Op], idx: Sequence[int], params: Sequence[Any], h: int, w: int) -> Window:
    """The window ops ``idx`` of a chain folded into one window on an (h, w) image."""
    win = Window.identity(h, w)
    for i in idx:
        win = win.then(ops[i].window(win.oh, win.ow, params[i]))
    return win


# image sizes a chain's output size is tried on (fixed_window_chain): ordinary, tall, wide, tiny
_PROBES = ((480, 640), (640, 427), (37, 1500), (2000, 90), (1, 1))


def fixed_window_chain(plan: Any) -> tuple[list[int], Any, tuple[int, int]] | None:
    """(the op indices, the trailing Normalize or None, the output (height, width)) when ``plan``'s chain
    is one window segment (crops, resizes, flips, pads), maybe then a normalize, whose output size is
    the same whatever the image's (tried on a few sizes and parameter draws); else None."""
    segs = segments(plan.ops)
    norm = plan.ops[-1] if segs and segs[-1][0] == "normalize" else None
    body = segs[:-1] if norm is not None else segs
    if len(body) != 1 or body[0][0] != "window":
        return None
    idx = body[0][1]
    outs = set()
    for k, (h, w) in enumerate(_PROBES):
        win = fold_windows(plan.ops, idx, plan.draw(f"size probe {k}", h, w), h, w)
        outs.add((win.oh, win.ow))
    return (idx, norm, outs.pop()) if len(outs) == 1 else None


def leading_windows(ops: Sequence[Op], params: Sequence[Sequence[Any] | None],
                    sizes: Sequence[tuple[int, int] | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """The chain's leading window segment folded per record, as arrays: geometry (N, 4) float32
    (``Window.as_array``) and output size (N, 2) int32; rows of records without a size or parameters
    are zeros. None when the chain does not start with a window segment. (Computed where the
    parameters are drawn, in :class:`~gpubatch.engine.feed.FileFeed` workers, so that the process
    driving the GPU does no per-image Python for it.)"""
    segs = [sg for sg in segments(ops) if sg[0] != "normalize"]
    if segs and segs[0][0] != "window":
        return None
    idx = segs[0][1] if segs else []
    n = len(sizes)
    geo, out = np.zeros((n, 4), np.float32), np.zeros((n, 2), np.int32)
    for r, (hw, prm) in enumerate(zip(sizes, params)):
        if hw is None or prm is None:
            continue
        win = fold_windows(ops, idx, prm, hw[0], hw[1])
        geo[r] = (win.ay, win.by, win.ax, win.bx)
        out[r] = (win.oh, win.ow)
    return geo, out


def leading_regions(windows: tuple[np.ndarray, np.ndarray], sizes: Sequence[tuple[int, int] | None],
                    min_saving: float = 0.1) -> list[tuple[int, int, int, int] | None]:
    """Per record the part of its (h, w) image its leading window reads, as (y0, x0, y1, x1): the
    sampled span widened by the resampling filter's reach (the scale when downscaling, one pixel
    otherwise) plus one pixel, so a region decode gives the pixels a full decode would. None where
    the size is unknown or the region would save less than ``min_saving`` of the image."""
    import math

    def span(a: float, b: float, n: int, limit: int) -> tuple[int, int]:
        lo, hi = (a, a + b * n) if b > 0 else (a + b * n, a)
        reach = math.ceil(max(abs(b), 1.0)) + 1
        return max(0, math.floor(lo) - reach), min(limit, math.ceil(hi) + reach)

    out: list[tuple[int, int, int, int] | None] = []
    for (ay, by, ax, bx), (oh, ow), hw in zip(windows[0].tolist(), windows[1].tolist(), sizes):
        if hw is None or oh <= 0 or ow <= 0:
            out.append(None)
            continue
        y0, y1 = span(ay, by, oh, hw[0])
        x0, x1 = span(ax, bx, ow, hw[1])
        keep = y1 > y0 and x1 > x0 and (y1 - y0) * (x1 - x0) <= (1.0 - min_saving) * hw[0] * hw[1]
        out.append((y0, x0, y1, x1) if keep else None)
    return out


def segment_fill(ops: Sequence[Op], idx: Sequence[int]) -> tuple[float, float, float]:
    for i in idx:
        if ops[i].pads:
            return tuple(getattr(ops[i], "fill", ZERO_FILL))  # type: ignore[return-value]
    return ZERO_FILL


def run_chain(engine: Any, ops: Sequence[Op], src: Ragged, params: Sequence[Sequence[Any]], out: Any = None,
              first: tuple[np.ndarray, np.ndarray] | None = None) -> Any:
    """Run ``ops`` over ``src`` with per-record ``params[r][op]``; returns a DeviceBatch (``out``: an
    optional preallocated buffer for the final result; ``first``: the leading window segment already
    folded, as :func:`leading_windows` gives it for these records)."""
    segs = segments(ops)
    norm = ops[-1] if segs and segs[-1][0] == "normalize" else None
    if norm is not None:
        segs = segs[:-1]
    n = len(src)
    cur: Any = src
    result = None
    if not segs:
        segs = [("window", [])]  # a bare normalize (or nothing): one identity resample
    elif segs[-1][0] != "window" and (norm is not None or out is not None):
        segs = [*segs, ("window", [])]
    for k, (kind, idx) in enumerate(segs):
        last = k == len(segs) - 1
        hw = cur.hw
        if kind == "window":
            if k == 0 and first is not None:
                windows: Any = first
            else:
                windows = [fold_windows(ops, idx, params[r], int(hw[r, 0]), int(hw[r, 1])) for r in range(n)]
            result = engine.resample(cur, windows, norm if last else None, out=out if last else None,
                                     fill=segment_fill(ops, idx))
        elif kind == "step":
            i = idx[0]
            op = ops[i]
            per = [op.steps(int(hw[r, 0]), int(hw[r, 1]), params[r][i]) for r in range(n)]
            result = None
            for s in range(op.n_steps):
                stage = cur if result is None else Ragged.from_batch(result)
                result = engine.step(stage, [per[r][s] for r in range(n)])
        else:
            i = idx[0]
            result = get_kernel(ops[i].name, DEVICE)(engine, ops[i], cur, [params[r][i] for r in range(n)])
        if not last:
            cur = Ragged.from_batch(result)
    return result


def device_runnable(ops: Sequence[Op]) -> None:
    """Raise a UsageError naming the first op with no way to run on the GPU."""
    for op in ops:
        if op.kind == "custom":
            get_kernel(op.name, DEVICE)
    segments(ops)
