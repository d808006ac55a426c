"""CUDA sources (``*.cu`` beside this file), compiled once per process into cached CuPy RawModules."""

from __future__ import annotations

import functools
from pathlib import Path

_DIR = Path(__file__).resolve().parent


@functools.cache
def module(name: str):
    """The compiled RawModule of ``<name>.cu`` (NVRTC compiles it once; CuPy caches it on disk too)."""
    import cupy

    return cupy.RawModule(code=(_DIR / f"{name}.cu").read_text(), options=("-std=c++17", f"-I{_DIR}"))


@functools.cache
def kernel(module_name: str, function: str):
    return module(module_name).get_function(function)
