"""What the GPU path needs installed, and how to install it here: the driver's CUDA version (asked of
``libcuda`` without CuPy) and the pip line of the matching extra. Light on purpose: the codecs that load
a GPU library and the device probe both name it when one is missing."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def driver_cuda() -> int | None:
    """The CUDA version the NVIDIA driver supports (13000 for 13.0), asked of ``libcuda`` without CuPy;
    None where there is no driver."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
        return int(version.value) or None
    except (OSError, AttributeError):
        return None


def _checkout() -> str | None:
    """The source checkout gpubatch runs from (an editable install, or the tree on the path), as a path to
    give pip: "." where it is the current folder; None for an install from a wheel."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        return None
    try:
        rel = root.relative_to(Path.cwd().resolve())
        return "." if str(rel) == "." else f"./{rel}"
    except ValueError:
        return str(root)


def install_hint(version: int | None = None) -> str:
    """What installs the GPU packages here: the extra that matches the driver's CUDA (cu12 for a CUDA 12
    driver, cu13 from 13), from the checkout gpubatch runs from (gpubatch is on no package index)."""
    version = version or driver_cuda()
    extra = "cu12" if version is not None and version < 13000 else "cu13"
    where = _checkout()
    if where is None:
        return f"pip install '<the gpubatch wheel or checkout>[{extra}]'"
    return f"pip install -e '{where}[{extra}]'" + ("" if version else " (or [cu12] for a CUDA 12 driver)")


def _no_cupy() -> str:
    """Why the GPU path cannot run where CuPy is missing: no NVIDIA driver, or the packages to install."""
    version = driver_cuda()
    if version is None:
        return "no NVIDIA GPU driver here (the GPU path needs an NVIDIA GPU, its driver and gpubatch's GPU packages)"
    return f"CuPy is not installed: {install_hint(version)}"
