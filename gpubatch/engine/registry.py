"""Kernel registry: one kernel per (op, backend), looked up once when a plan is validated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UsageError, register_once

HOST = "host"  # NumPy / Pillow on the CPU, one HostBatch (list of HWC uint8 arrays)
DEVICE = "device"  # CuPy on the GPU, one DeviceBatch

_KERNELS: dict[tuple[str, str], Callable[..., Any]] = {}
#: (module prefix, loader): the built-in modules a loader imports, for those whose modules load when first
#: needed (the ops package's): they load before a kernel from outside them is registered, or a failed lookup
#: lists what exists, so that a built-in's kernel is always there first
_BUILT_INS: list[tuple[str, Callable[[], Any]]] = []


def built_ins_first(prefix: str, load: Callable[[], Any]) -> None:
    """Have ``load`` import the built-in modules under ``prefix`` before anything outside them registers."""
    _BUILT_INS.append((prefix, load))


def load_built_ins(module: str = "") -> None:
    """Every built-in module loaded, but those of the prefix ``module`` is under (its own loading goes on)."""
    for prefix, load in _BUILT_INS:
        if not module.startswith(prefix):
            load()


def register_kernel(op: str, backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``fn`` implements ``op`` on ``backend``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        load_built_ins(getattr(fn, "__module__", None) or "")
        return register_once(_KERNELS, (op, backend), fn, f"the {backend} kernel of op", op)

    return deco


def get_kernel(op: str, backend: str) -> Callable[..., Any]:
    """The kernel of ``op`` on ``backend``; a missing one is a one-line error naming what exists."""
    fn = _KERNELS.get((op, backend))
    if fn is None:  # (one whose module has not loaded yet, or none: then the message lists every kernel)
        load_built_ins()
        fn = _KERNELS.get((op, backend))
    if fn is None:
        supported = sorted(o for o, b in _KERNELS if b == backend)
        raise UsageError(f"op {op!r} has no {backend} kernel; supported on {backend}: {', '.join(supported) or 'none'}")
    return fn
