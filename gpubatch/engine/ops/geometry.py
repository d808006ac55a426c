"""Geometry ops: resize, resize-shorter, center crop, random resized crop, flip.

Images are uint8 HWC RGB. Resampling is bilinear, antialiased when downscaling (a triangle filter
whose radius grows with the scale factor, as Pillow, DALI and torchvision's ``antialias=True`` do).
Sizes follow torchvision: ``resize_shorter(s)`` makes the shorter side ``s`` and the longer
``int(s * long / short)``; ``center_crop(s)`` puts the top-left corner at ``round((h - s) / 2)`` and
pads with zeros where the image is smaller; ``random_resized_crop`` draws its window as torchvision's
``RandomResizedCrop.get_params`` does.

Every op here is a :class:`~gpubatch.engine.ops.base.Window`, so the GPU runs a whole chain of them as
one fused resample (see ``kernels/resample.cu``); the host kernel (:func:`resample_cpu`, Pillow) is the
reference it is tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import UsageError
from ..registry import DEVICE, HOST, register_kernel
from .base import Op, Window


def _positive(name: str, value: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _pair(name: str, value: Any, low: float, high: float) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be two numbers (min, max), got {value!r}") from None
    if not (low <= a <= b <= high):
        raise UsageError(f"{name} must satisfy {low} <= min <= max <= {high}, got ({a}, {b})")
    return a, b


@dataclass(frozen=True)
class Resize(Op):
    """Resize to exactly (height, width)."""

    height: int
    width: int
    name = "resize"
    moves_boxes = True

    def __post_init__(self) -> None:
        _positive("resize height", self.height)
        _positive("resize width", self.width)

    def window(self, h: int, w: int, params: Any = None) -> Window:
        return Window(0.0, h / self.height, 0.0, w / self.width, self.height, self.width)


@dataclass(frozen=True)
class ResizeShorter(Op):
    """Resize keeping the aspect ratio so that the shorter side is ``size``."""

    size: int
    name = "resize_shorter"
    moves_boxes = True

    def __post_init__(self) -> None:
        _positive("resize-shorter size", self.size)

    def window(self, h: int, w: int, params: Any = None) -> Window:
        if h <= w:
            oh, ow = self.size, max(1, int(self.size * w / max(h, 1)))
        else:
            oh, ow = max(1, int(self.size * h / max(w, 1))), self.size
        return Window(0.0, h / oh, 0.0, w / ow, oh, ow)


@dataclass(frozen=True)
class CenterCrop(Op):
    """Crop the central ``size`` x ``size`` window (zero padding where the image is smaller)."""

    size: int
    name = "center_crop"
    moves_boxes = True

    def __post_init__(self) -> None:
        _positive("center-crop size", self.size)

    def origin(self, h: int, w: int) -> tuple[int, int]:
        """Top-left (y, x) of the crop in input coordinates (negative when padding)."""
        return int(round((h - self.size) / 2.0)), int(round((w - self.size) / 2.0))

    def window(self, h: int, w: int, params: Any = None) -> Window:
        y0, x0 = self.origin(h, w)
        return Window(float(y0), 1.0, float(x0), 1.0, self.size, self.size)


@dataclass(frozen=True)
class RandomResizedCrop(Op):
    """Crop a random window of area ``scale`` x image area and aspect ratio ``ratio``, resized to ``size``.

    Parameters are drawn as torchvision's ``RandomResizedCrop.get_params``: 10 tries of a uniform area
    and log-uniform ratio, then a center crop clamped to ``ratio``.
    """

    size: int | tuple[int, int] = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    name = "random_resized_crop"
    moves_boxes = True
    random = True

    def __post_init__(self) -> None:
        size = (self.size, self.size) if isinstance(self.size, (int, np.integer)) else tuple(self.size)
        object.__setattr__(self, "size", (_positive("size", size[0]), _positive("size", size[1])))
        object.__setattr__(self, "scale", _pair("scale", self.scale, 1e-6, 1.0))
        object.__setattr__(self, "ratio", _pair("ratio", self.ratio, 1e-3, 1e3))

    def make_params(self, h: int, w: int, rng: Any) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the window."""
        area = h * w
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(*log_ratio))
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(rng.integers(0, h - ch + 1))
                left = int(rng.integers(0, w - cw + 1))
                return top, left, ch, cw
        in_ratio = w / max(h, 1)
        if in_ratio < self.ratio[0]:
            cw, ch = w, int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            ch, cw = h, int(round(h * self.ratio[1]))
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, max(ch, 1), max(cw, 1)

    def window(self, h: int, w: int, params: tuple[int, int, int, int] | None = None) -> Window:
        top, left, ch, cw = params if params is not None else (0, 0, h, w)
        oh, ow = self.size
        return Window(float(top), ch / oh, float(left), cw / ow, oh, ow)


@dataclass(frozen=True)
class Flip(Op):
    """Mirror horizontally and/or vertically, each with probability ``p``."""

    horizontal: bool = True
    vertical: bool = False
    p: float = 0.5
    name = "flip"
    moves_boxes = True
    random = True

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.p) <= 1.0:
            raise UsageError(f"flip p must be within [0, 1], got {self.p}")

    def make_params(self, h: int, w: int, rng: Any) -> tuple[bool, bool]:
        hf = bool(rng.random() < self.p) if self.horizontal else False
        vf = bool(rng.random() < self.p) if self.vertical else False
        return hf, vf

    def window(self, h: int, w: int, params: tuple[bool, bool] | None = None) -> Window:
        hf, vf = params if params is not None else (self.horizontal, self.vertical)
        return Window(float(h) if vf else 0.0, -1.0 if vf else 1.0, float(w) if hf else 0.0,
                      -1.0 if hf else 1.0, h, w)


# --- host kernel (Pillow / NumPy): the reference of the fused GPU resample ----------------------------


def _axis_span(a: float, b: float, n_out: int, n_in: int) -> tuple[int, int]:
    """Output indices [o0, o1) whose pixel centres fall inside [0, n_in) (the rest is padding)."""
    lo, hi = 0, n_out
    while lo < hi and not 0 <= a + b * (lo + 0.5) < n_in:
        lo += 1
    while hi > lo and not 0 <= a + b * (hi - 0.5) < n_in:
        hi -= 1
    return lo, hi


def resample_cpu(img: np.ndarray, win: Window) -> np.ndarray:
    """Apply a window to one uint8 HWC image with Pillow's antialiased bilinear filter.

    The crop is folded into the resize as a box (Pillow reads real pixels beyond the box edge, as the
    GPU kernel does); output pixels whose centre falls outside the image are zero.
    """
    from PIL import Image

    h, w = img.shape[:2]
    if win == Window.identity(h, w):
        return img
    if win.by == 1.0 and win.bx == 1.0 and float(win.ay).is_integer() and float(win.ax).is_integer():
        return crop_pad_cpu(img, int(win.ay), int(win.ax), win.oh, win.ow)  # a pure crop: no filter
    by, ay = (win.by, win.ay) if win.by > 0 else (-win.by, win.ay + win.by * win.oh)
    bx, ax = (win.bx, win.ax) if win.bx > 0 else (-win.bx, win.ax + win.bx * win.ow)
    y0, y1 = _axis_span(ay, by, win.oh, h)
    x0, x1 = _axis_span(ax, bx, win.ow, w)
    out = np.zeros((win.oh, win.ow, img.shape[2]), np.uint8)
    if y1 > y0 and x1 > x0:
        box = (max(ax + bx * x0, 0.0), max(ay + by * y0, 0.0), min(ax + bx * x1, float(w)),
               min(ay + by * y1, float(h)))
        part = Image.fromarray(img).resize((x1 - x0, y1 - y0), Image.BILINEAR, box=box)
        out[y0:y1, x0:x1] = np.asarray(part)
    if win.by < 0:
        out = out[::-1]
    if win.bx < 0:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)


def resize_cpu(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Antialiased bilinear resize of one uint8 HWC image (Pillow's triangle filter)."""
    h, w = img.shape[:2]
    return resample_cpu(img, Window(0.0, h / height, 0.0, w / width, height, width))


def crop_pad_cpu(img: np.ndarray, y0: int, x0: int, height: int, width: int) -> np.ndarray:
    """The window [y0, y0 + height) x [x0, x0 + width), zero where it leaves the image."""
    h, w = img.shape[:2]
    if 0 <= y0 and 0 <= x0 and y0 + height <= h and x0 + width <= w:
        return img[y0 : y0 + height, x0 : x0 + width]
    out = np.zeros((height, width, *img.shape[2:]), img.dtype)
    sy0, sx0 = max(y0, 0), max(x0, 0)
    sy1, sx1 = min(y0 + height, h), min(x0 + width, w)
    if sy1 > sy0 and sx1 > sx0:
        out[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = img[sy0:sy1, sx0:sx1]
    return out


def _geometry_host(op: Op, images: list[np.ndarray], params: list[Any]) -> list[np.ndarray]:
    return [resample_cpu(im, op.window(im.shape[0], im.shape[1], p)) for im, p in zip(images, params)]


def _geometry_device(op: Op, h: int, w: int, params: Any) -> Window:
    """Device side: geometric ops are folded into the fused resample launch as windows."""
    return op.window(h, w, params)


for _name in ("resize", "resize_shorter", "center_crop", "random_resized_crop", "flip"):
    register_kernel(_name, HOST)(_geometry_host)
    register_kernel(_name, DEVICE)(_geometry_device)
