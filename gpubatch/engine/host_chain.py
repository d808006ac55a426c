"""An op chain on the CPU, cut into the same segments as on the GPU (:mod:`gpubatch.engine.gpu.chain`).

Consecutive window ops (crop, resize, flip, pad) fold into ONE Pillow resample per image, as they fold
into one launch on the GPU: the CPU path then resamples once, like the GPU, instead of once per op, and
reads the decoded Pillow image without converting it to an array first. Step and custom ops run their
host kernels (each op's NumPy/Pillow reference), and a trailing ``normalize`` maps the last uint8
result through its per-channel table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .ops.base import Op
from .ops.geometry import resample_cpu
from .registry import HOST, get_kernel
from .windows import fold_windows, segment_fill, segments


def run_chain_host(ops: Sequence[Op], image: Any, params: Sequence[Any]) -> np.ndarray:
    """``ops`` on one image (uint8 HWC array or RGB Pillow image) with its drawn ``params[op]``."""
    cur = image
    for kind, idx in segments(ops):
        if kind == "window":
            h, w = (cur.height, cur.width) if not isinstance(cur, np.ndarray) else cur.shape[:2]
            cur = resample_cpu(cur, fold_windows(ops, idx, params, h, w), segment_fill(ops, idx))
            continue
        if not isinstance(cur, np.ndarray):
            cur = np.asarray(cur)
        i = idx[0]
        cur = get_kernel(ops[i].name, HOST)(ops[i], [cur], [params[i]])[0]
    return cur if isinstance(cur, np.ndarray) else np.asarray(cur)

