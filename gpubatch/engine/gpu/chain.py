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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batch import Ragged
from ..ops.base import Op
from ..registry import DEVICE, get_kernel
from ..windows import fold_windows, segment_fill, segments

if TYPE_CHECKING:
    from ..batch import DeviceBatch
    from .engine import GpuEngine


def run_chain(engine: GpuEngine, ops: Sequence[Op], src: Ragged, params: Sequence[Sequence[Any]], out: Any = None,
              first: tuple[np.ndarray, np.ndarray] | None = None) -> DeviceBatch:
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
            result = engine.launch.resample(cur, windows, norm if last else None, out=out if last else None,
                                     fill=segment_fill(ops, idx))
        elif kind == "step":
            i = idx[0]
            op = ops[i]
            per = [op.steps(int(hw[r, 0]), int(hw[r, 1]), params[r][i]) for r in range(n)]
            result = None
            for s in range(op.n_steps):
                stage = cur if result is None else Ragged.from_batch(result)
                result = engine.launch.step(stage, [per[r][s] for r in range(n)])
        else:
            i = idx[0]
            result = get_kernel(ops[i].name, DEVICE)(engine, ops[i], cur, [params[r][i] for r in range(n)])
        if not last:
            cur = Ragged.from_batch(result)
    return result


def kernels_needed(ops: Sequence[Op], encode: bool = False) -> tuple[tuple[str, str], ...]:
    """The kernels :func:`run_chain` may launch for ``ops`` ((module, kernel) pairs of ``kernels/``), and with
    ``encode`` the JPEG encoder's: what a GPU worker compiles while its decoders start. The resample's
    variant is the chain's output's (a trailing normalize's dtype and layout, else uint8 HWC), with and
    without the decoder's planes; windows before the last segment write uint8 HWC. The step kernels and the
    JPEG encoder's (which a custom op may use too: jpeg_quality) are those their files hold."""
    from ..kernels import kernels_of
    from .launch import _DTYPE_TAG

    segs = segments(ops)
    norm = ops[-1] if segs and segs[-1][0] == "normalize" else None
    if norm is not None:
        segs = segs[:-1]
    tags = [f"{_DTYPE_TAG[norm.dtype]}_{norm.layout.lower()}" if norm is not None else "u8_hwc"]
    if any(kind == "window" for kind, _ in segs[:-1]) or any(kind == "custom" for kind, _ in segs):
        tags.append("u8_hwc")
    out = [("resample", f"resample_{tag}{planes}") for tag in dict.fromkeys(tags) for planes in ("", "_planes")]
    if any(kind == "step" for kind, _ in segs):
        out += [("step", k) for k in kernels_of("step")]
    if encode or any(kind == "custom" for kind, _ in segs):
        out += [("jpeg", k) for k in kernels_of("jpeg")]
    return tuple(out)


def device_runnable(ops: Sequence[Op]) -> None:
    """Raise a UsageError naming the first op with no way to run on the GPU."""
    for op in ops:
        if op.kind == "custom":
            get_kernel(op.name, DEVICE)
    segments(ops)
