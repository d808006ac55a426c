"""The Op base class: validated parameters, output size and how boxes move."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...types import Boxes

OPS: dict[str, type[Op]] = {}


@dataclass(frozen=True)
class Op:
    """One step of a chain. Subclasses hold validated parameters only; kernels live beside them."""

    name: ClassVar[str] = ""
    moves_boxes: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if cls.name:
            OPS[cls.name] = cls

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        """Output (height, width) for an input of (h, w)."""
        return h, w

    def box_affine(self, h: int, w: int) -> tuple[float, float, float, float]:
        """(sx, sy, tx, ty): how a point of the input maps to the output (x' = sx * x + tx)."""
        return 1.0, 1.0, 0.0, 0.0

    def move_boxes(self, boxes: Boxes | None, h: int, w: int, min_visible: float = 0.0) -> tuple[Boxes | None, int]:
        """Boxes after this op on an (h, w) input, and how many were dropped."""
        if boxes is None or not self.moves_boxes:
            return boxes, 0
        sx, sy, tx, ty = self.box_affine(h, w)
        return boxes.affine(sx, sy, tx, ty, self.out_hw(h, w), min_visible)
