"""Warps: rotate (any angle, or exact 90-degree steps), affine (angle, translate, scale, shear) and
perspective, with a fill colour where the output leaves the image.

Each is one WARP :class:`~gpubatch.engine.ops.pixel.Step`: a 3x3 map from output pixel centres to input
coordinates, sampled bilinearly (or nearest); its forward map moves boxes and polygons. Angles are in
degrees, counter-clockwise as displayed (PIL's and torchvision's convention). Parameter draws follow
torchvision's RandomRotation, RandomAffine and RandomPerspective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import UsageError
from .base import colour, probability, spread
from .pixel import WARP, Step, StepOp, register_step_op

INTERPOLATIONS = ("bilinear", "nearest")


def translation(tx: float, ty: float) -> np.ndarray:
    return np.array([[1.0, 0.0, tx], [0.0, 1.0, ty], [0.0, 0.0, 1.0]])


def rotation(degrees: float, cx: float = 0.0, cy: float = 0.0) -> np.ndarray:
    """Forward map rotating counter-clockwise (as displayed, y down) by ``degrees`` about (cx, cy)."""
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    r = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])
    return translation(cx, cy) @ r @ translation(-cx, -cy)


def shear(sx: float, sy: float = 0.0) -> np.ndarray:
    """Forward map x' = x + sx * y, y' = y + sy * x (sx, sy are tangents of the shear angles)."""
    return np.array([[1.0, sx, 0.0], [sy, 1.0, 0.0], [0.0, 0.0, 1.0]])


def warp_step(fwd: np.ndarray, out_hw: tuple[int, int], fill: tuple[float, float, float],
              nearest: bool = False) -> Step:
    """The WARP step of a forward map (input -> output pixel coordinates)."""
    inv = np.linalg.inv(fwd)
    return Step((float(WARP), *(float(v) for v in inv.reshape(-1)), *fill, 1.0 if nearest else 0.0), out_hw, fwd)


def homography(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 3x3 projective map taking four ``src`` points to four ``dst`` points."""
    a, b = [], []
    for (x, y), (u, v) in zip(src, dst):
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        b.extend([u, v])
    coef = np.linalg.solve(np.array(a, np.float64), np.array(b, np.float64))
    return np.append(coef, 1.0).reshape(3, 3)


def _interp(name: str, value: str) -> str:
    if value not in INTERPOLATIONS:
        raise UsageError(f"{name} interpolation {value!r}; supported: {', '.join(INTERPOLATIONS)}")
    return value


@register_step_op
@dataclass(frozen=True)
class Rotate(StepOp):
    """Rotate by an angle drawn from ``degrees`` (a number d means [-d, d]; a fixed angle is (a, a)),
    counter-clockwise, about the centre; ``expand`` grows the output to hold the whole rotated image."""

    degrees: Any = 30.0
    fill: Any = 0
    interpolation: str = "bilinear"
    expand: bool = False
    p: float = 1.0
    name = "rotate"
    moves_boxes = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", spread("rotate degrees", self.degrees, 0.0, -360.0, 360.0))
        object.__setattr__(self, "fill", colour("rotate fill", self.fill))
        object.__setattr__(self, "interpolation", _interp("rotate", self.interpolation))
        object.__setattr__(self, "p", probability("rotate p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> float:
        lo, hi = self.degrees
        return lo if lo == hi else rng.uniform(lo, hi)

    def make_steps(self, h: int, w: int, params: float) -> list[Step]:
        fwd = rotation(params, w / 2.0, h / 2.0)
        oh, ow = h, w
        if self.expand:
            corners = np.array([[0, 0, 1], [w, 0, 1], [0, h, 1], [w, h, 1]], np.float64) @ fwd.T
            ow = max(1, int(math.ceil(corners[:, 0].max() - corners[:, 0].min() - 1e-6)))
            oh = max(1, int(math.ceil(corners[:, 1].max() - corners[:, 1].min() - 1e-6)))
            fwd = translation((ow - w) / 2.0, (oh - h) / 2.0) @ fwd
        return [warp_step(fwd, (oh, ow), self.fill, self.interpolation == "nearest")]


@register_step_op
@dataclass(frozen=True)
class Rotate90(StepOp):
    """Rotate by ``k`` quarter turns counter-clockwise, exactly (no resampling); ``k`` may be a
    (min, max) range drawn per image, e.g. (0, 3)."""

    k: Any = 1
    p: float = 1.0
    name = "rotate90"
    moves_boxes = True

    def __post_init__(self) -> None:
        ks = (self.k, self.k) if isinstance(self.k, (int, np.integer)) else tuple(self.k)
        if len(ks) != 2 or any(not isinstance(v, (int, np.integer)) for v in ks) or ks[0] > ks[1]:
            raise UsageError(f"rotate90 k must be an integer or an integer range (min, max), got {self.k!r}")
        object.__setattr__(self, "k", (int(ks[0]), int(ks[1])))
        object.__setattr__(self, "p", probability("rotate90 p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> int:
        lo, hi = self.k
        return lo if lo == hi else int(rng.integers(lo, hi + 1))

    def make_steps(self, h: int, w: int, params: int) -> list[Step]:
        k = params % 4
        fwd = {0: np.eye(3), 1: np.array([[0.0, 1, 0], [-1, 0, w], [0, 0, 1]]),
               2: np.array([[-1.0, 0, w], [0, -1, h], [0, 0, 1]]), 3: np.array([[0.0, -1, h], [1, 0, 0], [0, 0, 1]])}[k]
        return [warp_step(fwd, (w, h) if k % 2 else (h, w), (0.0, 0.0, 0.0), nearest=True)]


@register_step_op
@dataclass(frozen=True)
class Affine(StepOp):
    """Random affine about the centre (torchvision's RandomAffine): rotation from ``degrees``, translation
    up to ``translate`` (fractions of width, height), scale from ``scale``, shear from ``shear`` (degrees:
    d means x-shear in [-d, d]; (a, b) an x range; (a, b, c, d) x and y ranges)."""

    degrees: Any = 0.0
    translate: Any = (0.0, 0.0)
    scale: Any = (1.0, 1.0)
    shear: Any = 0.0
    fill: Any = 0
    interpolation: str = "bilinear"
    p: float = 1.0
    name = "affine"
    moves_boxes = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "degrees", spread("affine degrees", self.degrees, 0.0, -360.0, 360.0))
        try:
            tx, ty = (float(v) for v in self.translate)
        except (TypeError, ValueError):
            raise UsageError(f"affine translate must be two fractions (x, y), got {self.translate!r}") from None
        if not (0 <= tx <= 1 and 0 <= ty <= 1):
            raise UsageError(f"affine translate fractions must be within [0, 1], got {self.translate!r}")
        object.__setattr__(self, "translate", (tx, ty))
        object.__setattr__(self, "scale", spread("affine scale", self.scale, None, 1e-3, 1e3))
        sh = self.shear
        if isinstance(sh, (int, float)):
            shx, shy = spread("affine shear", sh, 0.0, -89.0, 89.0), (0.0, 0.0)
        elif len(sh) == 2:
            shx, shy = spread("affine shear", sh, 0.0, -89.0, 89.0), (0.0, 0.0)
        elif len(sh) == 4:
            shx, shy = spread("affine shear", sh[:2], 0.0, -89, 89), spread("affine shear", sh[2:], 0.0, -89, 89)
        else:
            raise UsageError(f"affine shear must be a number, 2 or 4 numbers, got {sh!r}")
        object.__setattr__(self, "shear", (*shx, *shy))
        object.__setattr__(self, "fill", colour("affine fill", self.fill))
        object.__setattr__(self, "interpolation", _interp("affine", self.interpolation))
        object.__setattr__(self, "p", probability("affine p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> tuple[float, int, int, float, float, float]:
        angle = rng.uniform(*self.degrees)
        mx, my = self.translate[0] * w, self.translate[1] * h
        tx, ty = int(round(rng.uniform(-mx, mx))), int(round(rng.uniform(-my, my)))
        scale = rng.uniform(*self.scale)
        shx, shy = rng.uniform(*self.shear[:2]), rng.uniform(*self.shear[2:])
        return angle, tx, ty, scale, shx, shy

    def make_steps(self, h: int, w: int, params: tuple) -> list[Step]:
        angle, tx, ty, scale, shx, shy = params
        cx, cy = w / 2.0, h / 2.0
        lin = rotation(angle) @ shear(math.tan(math.radians(shx)), math.tan(math.radians(shy))) @ np.diag([scale, scale, 1.0])
        fwd = translation(cx + tx, cy + ty) @ lin @ translation(-cx, -cy)
        return [warp_step(fwd, (h, w), self.fill, self.interpolation == "nearest")]


@register_step_op
@dataclass(frozen=True)
class Perspective(StepOp):
    """Random perspective (torchvision's RandomPerspective): each corner moves inwards by up to
    ``distortion_scale`` of half the width/height."""

    distortion_scale: float = 0.5
    p: float = 0.5
    fill: Any = 0
    interpolation: str = "bilinear"
    name = "perspective"
    moves_boxes = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "distortion_scale", probability("perspective distortion_scale", self.distortion_scale))
        object.__setattr__(self, "fill", colour("perspective fill", self.fill))
        object.__setattr__(self, "interpolation", _interp("perspective", self.interpolation))
        object.__setattr__(self, "p", probability("perspective p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> list[list[int]]:
        d = self.distortion_scale
        dw, dh = int(d * (w // 2)), int(d * (h // 2))

        def ri(lo: int, hi: int) -> int:
            return int(rng.integers(lo, max(hi, lo + 1)))

        return [[ri(0, dw + 1), ri(0, dh + 1)], [ri(w - dw - 1, w), ri(0, dh + 1)],
                [ri(w - dw - 1, w), ri(h - dh - 1, h)], [ri(0, dw + 1), ri(h - dh - 1, h)]]

    def make_steps(self, h: int, w: int, params: list[list[int]]) -> list[Step]:
        start = np.array([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], np.float64) + 0.5
        fwd = homography(start, np.asarray(params, np.float64) + 0.5)
        return [warp_step(fwd, (h, w), self.fill, self.interpolation == "nearest")]
