"""CUDA sources (``*.cu`` beside this file), each kernel compiled alone into a cached CuPy RawModule.

Every kernel of a ``.cu`` file sits inside an ``#ifdef KEEP_<kernel>`` guard, and :func:`kernel` compiles
the file with that one guard defined: a run pays NVRTC for the kernels it launches, not for the whole file
(the twelve resample variants together took 1.56 s, one of them 0.18-0.23 s; H200 host, 2026-12-03,
benchmarks/RESULTS.md).
:func:`load` compiles several at once, a thread each. On a machine with no compiled kernels yet (CuPy keeps
them on disk, keyed by source text and options) that is most of a GPU run's start.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_DIR = Path(__file__).resolve().parent

_LOADED: dict[tuple[str, str], Any] = {}
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_GUARD = threading.Lock()


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


@functools.cache
def source(name: str) -> str:
    """The full source ``<name>.cu`` is compiled from (its headers of this folder inlined); read once per
    process (each of its kernels compiles from it, several at once in :func:`load`'s threads)."""
    return _generated(name) + _inlined((_DIR / f"{name}.cu").read_text())


@functools.cache
def kernels_of(name: str) -> tuple[str, ...]:
    """The kernels ``<name>.cu`` guards (``#ifdef KEEP_<kernel>``), in the file's order (read once per process)."""
    return tuple(re.findall(r"^#ifdef KEEP_(\w+)\s*$", (_DIR / f"{name}.cu").read_text(), flags=re.M))


def _compile(module_name: str, function: str) -> Any:
    if function not in kernels_of(module_name):
        raise KeyError(f"kernels/{module_name}.cu has no kernel {function!r} (it has {', '.join(kernels_of(module_name))})")
    import cupy

    module = cupy.RawModule(code=source(module_name), options=("-std=c++17", f"-DKEEP_{function}"))
    return module.get_function(function)  # (CuPy compiles, or reads its cache, and loads the module here)


def kernel(module_name: str, function: str) -> Any:
    """Kernel ``function`` of ``<module_name>.cu``, compiled alone (or read from CuPy's cache) and loaded
    once per process; a second thread that asks for it meanwhile waits for that one compile."""
    key = (module_name, function)
    fn = _LOADED.get(key)
    if fn is not None:
        return fn
    with _GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        fn = _LOADED.get(key)
        if fn is None:
            fn = _LOADED[key] = _compile(module_name, function)
    return fn


def load(kernels: Iterable[tuple[str, str]], device: int | None = None) -> dict[str, float]:
    """Compile (or read from CuPy's cache) and load ``kernels`` ((module, kernel) pairs) at once, a thread
    each (NVRTC releases the GIL), on ``device`` (CuPy's current one if None): the seconds each took, keyed
    ``kernels: <kernel>``. A kernel that fails here is left to its first use, which raises why."""
    times: dict[str, float] = {}

    def one(pair: tuple[str, str]) -> None:
        t = time.perf_counter()
        try:
            if device is not None:
                import cupy

                cupy.cuda.runtime.setDevice(device)
            kernel(*pair)
        except Exception:  # noqa: BLE001 - compiled again, and raised, at first use
            pass
        times[f"kernels: {pair[1]}"] = round(time.perf_counter() - t, 4)

    threads = [threading.Thread(target=one, args=(pair,), name=f"gpubatch-compile-{pair[1]}", daemon=True)
               for pair in dict.fromkeys(kernels)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times
