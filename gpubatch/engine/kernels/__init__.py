"""CUDA sources (``*.cu`` beside this file), compiled once per process into cached CuPy RawModules."""

from __future__ import annotations

import functools
import re
from pathlib import Path

_DIR = Path(__file__).resolve().parent


def _generated(name: str) -> str:
    """C text generated from the Python side's constants, put before ``<name>.cu`` (one source for both)."""
    if name == "step":
        from ..ops.pixel import cuda_header

        return cuda_header()
    return ""


def _inlined(text: str) -> str:
    """``text`` with each ``#include "<header>"`` of this folder replaced by the header itself: CuPy's
    on-disk cache of compiled modules is keyed by the source text, so a header changed without its
    ``.cu`` must change that text too, or a stale module is loaded."""
    def header(m: re.Match) -> str:
        return re.sub(r"^#pragma once[^\n]*$", "", (_DIR / m.group(1)).read_text(), flags=re.M)

    return re.sub(r'^#include "([\w.]+)"[^\n]*$', header, text, flags=re.M)


def source(name: str) -> str:
    """The full source ``<name>.cu`` is compiled from (its headers of this folder inlined)."""
    return _generated(name) + _inlined((_DIR / f"{name}.cu").read_text())


@functools.cache
def module(name: str):
    """The compiled RawModule of ``<name>.cu`` (NVRTC compiles it once; CuPy caches it on disk too)."""
    import cupy

    return cupy.RawModule(code=source(name), options=("-std=c++17",))


@functools.cache
def kernel(module_name: str, function: str):
    return module(module_name).get_function(function)
