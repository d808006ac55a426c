"""Kernel registry: one kernel per (op, backend), looked up once when a plan is validated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UsageError, register_once

HOST = "host"  # NumPy / Pillow on the CPU, one HostBatch (list of HWC uint8 arrays)
DEVICE = "device"  # CuPy on the GPU, one DeviceBatch

_KERNELS: dict[tuple[str, str], Callable[..., Any]] = {}


def register_kernel(op: str, backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``fn`` implements ``op`` on ``backend``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        return register_once(_KERNELS, (op, backend), fn, f"the {backend} kernel of op", op)

    return deco


def get_kernel(op: str, backend: str) -> Callable[..., Any]:
    """The kernel of ``op`` on ``backend``; a missing one is a one-line error naming what exists."""
    fn = _KERNELS.get((op, backend))
    if fn is None:
        supported = sorted(o for o, b in _KERNELS if b == backend)
        raise UsageError(f"op {op!r} has no {backend} kernel; supported on {backend}: {', '.join(supported) or 'none'}")
    return fn
