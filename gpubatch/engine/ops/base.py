"""The Op base class: validated parameters, per-record random draws, output size, how boxes move.

Geometric ops also describe themselves as a :class:`Window` (an affine map per axis from output pixel
centres to input coordinates), so that a chain of them (crop, resize, flip) runs as one fused resample
on the GPU, exactly as the CPU reference runs them one by one.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import UsageError, register_once
from ...types import Boxes
from ..media import MediaSpec
from ..registry import load_built_ins

if TYPE_CHECKING:  # (NumPy imported where an op's arrays are made: a pass-through's command never loads it)
    import numpy as np

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
        import numpy as np

        return np.array([self.ay, self.by, self.ax, self.bx], np.float32)


@dataclass(frozen=True)
class Op:
    """One step of a chain. Subclasses hold validated parameters only; kernels live beside them.

    Class attributes: ``name`` (registry and CLI name), ``media`` (what it takes: images and video frames unless an op
    says otherwise), ``moves_boxes`` (geometric), ``random`` (draws per-record parameters with
    :meth:`make_params`).
    """

    name: ClassVar[str] = ""
    media: ClassVar[tuple[str, ...]] = ("image", "video")  # a video's ops apply to every frame of a clip
    moves_boxes: ClassVar[bool] = False
    random: ClassVar[bool] = False
    # how the GPU runs it: "window" (folded into the fused resample), "step" (per-sample programs of
    # kernels/step.cu), "normalize" (the resample's store) or "custom" (its own device kernel)
    kind: ClassVar[str] = "window"
    needs_boxes: ClassVar[bool] = False  # make_params looks at the record's boxes
    pads: ClassVar[bool] = False  # a window op that may show pixels outside the image (its ``fill``)

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("name"):  # (a subclass that keeps its parent's name is no op of its own)
            load_built_ins(cls.__module__)  # (an op from outside the built-ins: theirs first)
            register_once(OPS, cls.name, cls, "op")

    def out_spec(self, spec: MediaSpec) -> MediaSpec:
        """What the op makes of data of ``spec`` (the same by default); a UsageError where it does not
        take that media. Ops that change the layout or type say so (normalize)."""
        if spec.media not in self.media:
            raise UsageError(f"{self.name} takes {' or '.join(self.media)} data, not {spec.media}")
        return spec

    def make_params(self, h: int, w: int, rng: Any, boxes: Boxes | None = None) -> Any:
        """Per-record parameters for an (h, w) input (None for deterministic ops); ``boxes`` are the
        record's boxes at this point of the chain (passed to ops with ``needs_boxes``)."""
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


# --- parameter checks shared by the op modules (one-line UsageErrors) ----------------------------------


def positive(name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:  # (NumPy's integers too)
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def pair(name: str, value: Any, low: float, high: float) -> tuple[float, float]:
    """A (min, max) pair within [low, high]."""
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be two numbers (min, max), got {value!r}") from None
    if not (low <= a <= b <= high):
        raise UsageError(f"{name} must satisfy {low} <= min <= max <= {high}, got ({a}, {b})")
    return a, b


def spread(name: str, value: Any, center: float | None, low: float, high: float) -> tuple[float, float]:
    """A range given as (min, max), or as one number ``x`` meaning ``center -/+ x`` (``x, x`` without a
    centre), as torchvision's ColorJitter and RandomRotation read theirs."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # (NumPy's numbers too)
        x = float(value)
        if center is None:
            return pair(name, (x, x), low, high)
        if x < 0:
            raise UsageError(f"{name} must be >= 0, got {x}")
        return pair(name, (max(center - x, low), center + x), low, high)
    return pair(name, value, low, high)


def probability(name: str, value: Any) -> float:
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number within [0, 1], got {value!r}") from None
    if not 0.0 <= p <= 1.0:
        raise UsageError(f"{name} must be within [0, 1], got {p}")
    return p


def colour(name: str, value: Any) -> tuple[float, float, float]:
    """A fill colour: one level for all channels or three (0-255)."""
    vals = [value] * 3 if isinstance(value, numbers.Real) else list(value)
    try:
        out = tuple(float(v) for v in vals)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a level or three levels 0-255, got {value!r}") from None
    if len(out) != 3 or not all(0.0 <= v <= 255.0 for v in out):
        raise UsageError(f"{name} must be a level or three levels 0-255, got {value!r}")
    return out  # type: ignore[return-value]
