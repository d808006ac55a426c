"""The Op base class: validated parameters, per-record random draws, output size, how boxes move.

Geometric ops also describe themselves as a :class:`Window` (an affine map per axis from output pixel
centres to input coordinates), so that a chain of them (crop, resize, flip) runs as one fused resample
on the GPU, exactly as the CPU reference runs them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...types import Boxes

OPS: dict[str, type[Op]] = {}


@dataclass(frozen=True)
class Window:
    """Output pixel (oy, ox) samples the input at ``y = ay + by * (oy + 0.5)``, ``x = ax + bx * (ox + 0.5)``.

    ``|by|``, ``|bx|`` are input pixels per output pixel (the resampling filter widens with them when
    downscaling); a negative ``bx`` mirrors. ``oh`` x ``ow`` is the output size.
    """

    ay: float
    by: float
    ax: float
    bx: float
    oh: int
    ow: int

    @staticmethod
    def identity(h: int, w: int) -> Window:
        return Window(0.0, 1.0, 0.0, 1.0, h, w)

    def then(self, nxt: Window) -> Window:
        """This window followed by ``nxt`` (whose input is this window's output)."""
        return Window(self.ay + self.by * nxt.ay, self.by * nxt.by, self.ax + self.bx * nxt.ax,
                      self.bx * nxt.bx, nxt.oh, nxt.ow)

    def as_array(self) -> np.ndarray:
        return np.array([self.ay, self.by, self.ax, self.bx], np.float32)


@dataclass(frozen=True)
class Op:
    """One step of a chain. Subclasses hold validated parameters only; kernels live beside them.

    Class attributes: ``name`` (registry and CLI name), ``moves_boxes`` (geometric), ``random``
    (draws per-record parameters with :meth:`make_params`).
    """

    name: ClassVar[str] = ""
    moves_boxes: ClassVar[bool] = False
    random: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if cls.name:
            OPS[cls.name] = cls

    def make_params(self, h: int, w: int, rng: Any) -> Any:
        """Per-record parameters for an (h, w) input (None for deterministic ops)."""
        return None

    def window(self, h: int, w: int, params: Any = None) -> Window | None:
        """The op as a resampling window on an (h, w) input, or None when it is not geometric."""
        return None

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        """Output (height, width) for an input of (h, w)."""
        win = self.window(h, w, params)
        return (win.oh, win.ow) if win is not None else (h, w)

    def move_boxes(self, boxes: Boxes | None, h: int, w: int, params: Any = None,
                   min_visible: float = 0.0) -> tuple[Boxes | None, int]:
        """Boxes after this op on an (h, w) input, and how many were dropped."""
        win = self.window(h, w, params)
        if boxes is None or win is None:
            return boxes, 0
        # invert in = a + b * out  ->  out = (in - a) / b
        sx, sy = 1.0 / win.bx, 1.0 / win.by
        return boxes.affine(sx, sy, -win.ax * sx, -win.ay * sy, (win.oh, win.ow), min_visible)
