"""The audio chain on the GPU, a batch at a time: its device kernels run op by op over a batch
(:func:`run_chain_device`), the outputs back on the host in one copy (:func:`to_host`), and a warm-up on silence
(:func:`warm_chain`). Below the audio unit (:mod:`.audio`) and the worker's start (:mod:`.start`), which both use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codecs.audio_io import AudioData
from ..media import DEVICE
from ..plan import Plan
from ..registry import get_kernel


def to_host(items: Sequence[AudioData], half_features: bool = False) -> list[AudioData]:
    """Device items back on the host through one device-to-host copy for the batch (views per item).
    With ``half_features``, features come back as float16, made so on the GPU: what their ``.npy`` files
    hold (:func:`~..codecs.audio_io.encode_audio`), half the bytes to copy and no conversion on the host
    (numpy's rounding of float32 to float16 is CUDA's, to the nearest even)."""
    import cupy as cp

    if not items:
        return []
    out: list[Any] = [None] * len(items)
    for dtype in (cp.float32, cp.float16):
        mine = [i for i, it in enumerate(items) if (dtype is cp.float16) == (half_features and bool(it.features))]
        if not mine:
            continue
        flat = [cp.ascontiguousarray(items[i].samples, dtype).ravel() for i in mine]
        sizes = np.cumsum([0] + [int(f.size) for f in flat])
        host = cp.asnumpy(cp.concatenate(flat) if len(flat) > 1 else flat[0])
        for k, i in enumerate(mine):
            out[i] = items[i]._replace(samples=host[sizes[k]: sizes[k + 1]].reshape(items[i].samples.shape))
    return out


def run_chain_device(ops: Sequence[Any], items: list[AudioData], params: list[list]) -> list[AudioData]:
    """``ops`` on a batch of device items, ``params[i][k]`` the drawn parameters of item i for op k."""
    for k, op in enumerate(ops):
        items = get_kernel(op.name, DEVICE)(op, items, [p[k] for p in params])
    return items


def warm_chain(plan: Plan, rate: int, samples: int, channels: int, n: int) -> None:
    """``plan``'s chain run once on the GPU on ``n`` records of silence (``samples`` x ``channels`` at ``rate``), its
    outputs back on the host and dropped (its draws keyed on no record): what a first batch of that shape would load
    and make first is then ready (the FFT and BLAS libraries, their plans and handles in this thread, the kernels).
    Never raises: a warm-up only, the real batch runs (or falls back to the CPU) as before."""
    try:
        import cupy as cp

        silence = [AudioData(cp.zeros((channels, samples), cp.float32), rate) for _ in range(n)]
        to_host(run_chain_device(plan.ops, silence, [plan.draw("", rate, rate)] * n), half_features=True)
    except Exception:  # noqa: BLE001 - (see above)
        return
