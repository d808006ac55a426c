"""Ops: frozen parameter classes with their host and device kernels side by side.

Every op module registers its kernels on import; :data:`OPS` maps op names to classes.
"""

from __future__ import annotations

from .base import OPS, Op, Window
from .geometry import CenterCrop, Flip, RandomResizedCrop, Resize, ResizeShorter
from .normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "OPS", "CenterCrop", "Flip", "Normalize", "Op", "RandomResizedCrop",
    "Resize", "ResizeShorter", "Window",
]
