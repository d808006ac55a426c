"""CUDA sources (``*.cu`` beside this file), compiled once per process into cached CuPy RawModules."""

from __future__ import annotations

import functools
from pathlib import Path

_DIR = Path(__file__).resolve().parent


def _generated(name: str) -> str:
    """C text generated from the Python side's constants, put before ``<name>.cu`` (one source for both)."""
    if name == "step":
        from ..ops.pixel import cuda_header

        return cuda_header()
    return ""


def source(name: str) -> str:
    """The full source ``<name>.cu`` is compiled from."""
    return _generated(name) + (_DIR / f"{name}.cu").read_text()


@functools.cache
def module(name: str):
    """The compiled RawModule of ``<name>.cu`` (NVRTC compiles it once; CuPy caches it on disk too)."""
    import cupy

    return cupy.RawModule(code=source(name), options=("-std=c++17", f"-I{_DIR}"))


@functools.cache
def kernel(module_name: str, function: str):
    return module(module_name).get_function(function)
