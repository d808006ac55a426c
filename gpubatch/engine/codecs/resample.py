"""Resampling on the CPU and the lengths it makes: the ``resample`` op's host kernel (:mod:`..ops.audio`, whose GPU
kernel makes the same lengths) and the decoders' (:mod:`.audio_io`: a chained Ogg file's streams of other rates,
brought to one) share it."""

from __future__ import annotations

import math

import numpy as np


def ratio(src: float, dst: float) -> tuple[int, int]:
    """(up, down) of a resampling from ``src`` to ``dst`` Hz, reduced (rates rounded to 1/100 Hz)."""
    a, b = round(dst * 100), round(src * 100)
    g = math.gcd(a, b)
    return a // g, b // g


def resampled_length(n: int, up: int, down: int) -> int:
    return -(-n * up // down)


def resample_cpu(x: np.ndarray, src: float, dst: float) -> np.ndarray:
    """soxr (its high-quality setting) from ``src`` to ``dst`` Hz, cut or zero-padded to the length
    the GPU kernel makes, so both backends give the same number of samples."""
    if src == dst:
        return x
    try:
        import soxr
    except ImportError:  # pragma: no cover - a declared dependency
        from ...errors import DependencyError

        raise DependencyError("resampling on the CPU needs soxr: pip install soxr") from None

    up, down = ratio(src, dst)
    n = resampled_length(x.shape[-1], up, down)
    y = soxr.resample(np.ascontiguousarray(x.T), src, dst, quality="HQ").T
    y = np.asarray(y, np.float32)
    if y.shape[-1] < n:
        y = np.pad(y, ((0, 0), (0, n - y.shape[-1])))
    return np.ascontiguousarray(y[:, :n])
