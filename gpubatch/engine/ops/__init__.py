"""Ops: frozen parameter classes with their host and device kernels side by side.

Every op module registers its ops (:data:`OPS`) and kernels on import. The modules are imported when first
needed, not with this package: a name of ``__all__`` imports its module at first use, an op unpickled in a
worker imports its own, and :func:`load_all` imports them all where the whole registry is read (``--ops``,
``--list-ops``) and before anything outside them registers an op or a kernel, so that a built-in's name is
always taken first. A pass-through's processes import none of them (about 0.09 s of each process's start on
the 2-core CI machine, 2026-12-02, benchmarks/RESULTS.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..registry import built_ins_first
from .base import OPS, Op, Window  # noqa: F401 - (public: __all__ below)

#: where each public name beyond :mod:`.base` is defined (the one list: ``__all__`` and :data:`MODULES` follow)
_WHERE = {
    "AddNoise": "audio", "FixDuration": "audio", "Gain": "audio", "Mono": "audio", "Resample": "audio",
    "Speed": "audio", "TimeCrop": "audio", "TimeShift": "audio",
    "JpegQuality": "codec",
    "CenterCrop": "geometry", "Expand": "geometry", "Flip": "geometry", "Pad": "geometry", "RandomCrop": "geometry",
    "RandomIoUCrop": "geometry", "RandomResizedCrop": "geometry", "Resize": "geometry", "ResizeShorter": "geometry",
    "IMAGENET_MEAN": "normalize", "IMAGENET_STD": "normalize", "Normalize": "normalize",
    "AutoContrast": "pixel", "Brightness": "pixel", "ColorJitter": "pixel", "Contrast": "pixel", "Equalize": "pixel",
    "GaussianBlur": "pixel", "GaussianNoise": "pixel", "Grayscale": "pixel", "Hue": "pixel", "Invert": "pixel",
    "PhotometricDistort": "pixel", "Posterize": "pixel", "RandomErasing": "pixel", "Saturation": "pixel",
    "Sharpness": "pixel", "Solarize": "pixel", "Step": "pixel", "StepOp": "pixel",
    "AutoAugment": "policies", "RandAugment": "policies", "TrivialAugment": "policies",
    "FreqMask": "spectral", "LogMel": "spectral", "MFCC": "spectral", "Mel": "spectral", "Spectrogram": "spectral",
    "TimeMask": "spectral",
    "Clip": "temporal", "RandomClip": "temporal",
    "Affine": "warp", "Perspective": "warp", "Rotate": "warp", "Rotate90": "warp",
}
#: the modules that define ops, each imported once, when first needed
MODULES = tuple(sorted(set(_WHERE.values())))


def load_all() -> dict[str, type[Op]]:
    """Every op module imported: the whole :data:`OPS` registry (name -> op class)."""
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return OPS


built_ins_first(f"{__name__}.", load_all)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = sorted([*_WHERE, "OPS", "Op", "Window"])
