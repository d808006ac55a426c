"""Ops: frozen parameter classes with their host and device kernels side by side.

Every op module registers its kernels on import; :data:`OPS` maps op names to classes.
"""

from __future__ import annotations

from .base import OPS, Op
from .geometry import CenterCrop, Resize, ResizeShorter

__all__ = ["OPS", "CenterCrop", "Op", "Resize", "ResizeShorter"]
