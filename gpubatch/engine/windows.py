"""An op chain cut into segments, and its window ops folded per image: shared by the CPU chain
(:mod:`.host_chain`) and the GPU chain (:mod:`.gpu_chain`), which run the same segments.

Consecutive window ops (crop, resize, flip, pad, expand) fold into ONE :class:`~.ops.base.Window` per
image, so each path resamples once per segment; step, custom and normalize ops are segments of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import UsageError
from .ops.base import Op, Window

ZERO_FILL = (0.0, 0.0, 0.0)


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
    parameters are drawn, in :class:`~gpubatch.engine.gpu.feed.FileFeed` workers, so that the process
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


def fed_windows(ops: Sequence[Op], windows: tuple[np.ndarray, np.ndarray] | None, rows: list[int],
                redrawn: list[int], params: list, arrays: list) -> tuple[np.ndarray, np.ndarray] | None:
    """The leading windows a feed folded (``windows``), for the records kept (``rows``), refolded for
    the ``redrawn`` ones (indices into ``params``/``arrays``, drawn again for their decoded size)."""

    if windows is None or not rows:
        return None
    first = (windows[0][rows], windows[1][rows])
    if redrawn:
        fix = leading_windows(ops, [params[r] for r in redrawn], [tuple(arrays[r].shape[:2]) for r in redrawn])
        if fix is not None:
            first[0][redrawn], first[1][redrawn] = fix
    return first
