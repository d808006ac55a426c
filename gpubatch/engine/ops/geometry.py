"""Geometry ops: resize, resize-shorter, center crop, random resized crop, flip, pad, expand, IoU crop.

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
from ..registry import HOST, register_kernel
from .base import Op, Window, colour, pair, positive, probability


def _geometry_host(op: Op, images: list[np.ndarray], params: list[Any]) -> list[np.ndarray]:
    fill = getattr(op, "fill", (0.0, 0.0, 0.0))
    return [resample_cpu(im, op.window(im.shape[0], im.shape[1], p), fill) for im, p in zip(images, params)]


def register_window_op(cls: type[Op]) -> type[Op]:
    """Class decorator: the host kernel of a window op (the device folds every window op the same way)."""
    register_kernel(cls.name, HOST)(_geometry_host)
    return cls


@register_window_op
@dataclass(frozen=True)
class Resize(Op):
    """Resize to exactly (height, width)."""

    height: int
    width: int
    name = "resize"
    moves_boxes = True

    def __post_init__(self) -> None:
        positive("resize height", self.height)
        positive("resize width", self.width)

    def window(self, h: int, w: int, params: Any = None) -> Window:
        return Window(0.0, h / self.height, 0.0, w / self.width, self.height, self.width)


@register_window_op
@dataclass(frozen=True)
class ResizeShorter(Op):
    """Resize keeping the aspect ratio so that the shorter side is ``size``."""

    size: int
    name = "resize_shorter"
    moves_boxes = True

    def __post_init__(self) -> None:
        positive("resize-shorter size", self.size)

    def window(self, h: int, w: int, params: Any = None) -> Window:
        if h <= w:
            oh, ow = self.size, max(1, int(self.size * w / max(h, 1)))
        else:
            oh, ow = max(1, int(self.size * h / max(w, 1))), self.size
        return Window(0.0, h / oh, 0.0, w / ow, oh, ow)


@register_window_op
@dataclass(frozen=True)
class CenterCrop(Op):
    """Crop the central ``size`` x ``size`` window (zero padding where the image is smaller)."""

    size: int
    name = "center_crop"
    moves_boxes = True
    pads = True

    def __post_init__(self) -> None:
        positive("center-crop size", self.size)

    def origin(self, h: int, w: int) -> tuple[int, int]:
        """Top-left (y, x) of the crop in input coordinates (negative when padding)."""
        return int(round((h - self.size) / 2.0)), int(round((w - self.size) / 2.0))

    def window(self, h: int, w: int, params: Any = None) -> Window:
        y0, x0 = self.origin(h, w)
        return Window(float(y0), 1.0, float(x0), 1.0, self.size, self.size)


@register_window_op
@dataclass(frozen=True)
class RandomCrop(Op):
    """Crop a ``size`` x ``size`` window at a random position (torchvision's ``RandomCrop``; zero padding,
    centred, on a side the image is smaller than ``size``)."""

    size: int
    name = "random_crop"
    moves_boxes = True
    pads = True
    random = True

    def __post_init__(self) -> None:
        positive("random-crop size", self.size)

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[int, int]:
        s = self.size
        y0 = rng.integers(0, h - s + 1) if h >= s else int(round((h - s) / 2.0))
        x0 = rng.integers(0, w - s + 1) if w >= s else int(round((w - s) / 2.0))
        return int(y0), int(x0)

    def window(self, h: int, w: int, params: Any = None) -> Window:
        y0, x0 = params if params is not None else CenterCrop(self.size).origin(h, w)
        return Window(float(y0), 1.0, float(x0), 1.0, self.size, self.size)


@register_window_op
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
        object.__setattr__(self, "size", (positive("size", size[0]), positive("size", size[1])))
        object.__setattr__(self, "scale", pair("scale", self.scale, 1e-6, 1.0))
        object.__setattr__(self, "ratio", pair("ratio", self.ratio, 1e-3, 1e3))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[int, int, int, int]:
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


@register_window_op
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
        object.__setattr__(self, "p", probability("flip p", self.p))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[bool, bool]:
        hf = bool(rng.random() < self.p) if self.horizontal else False
        vf = bool(rng.random() < self.p) if self.vertical else False
        return hf, vf

    def window(self, h: int, w: int, params: tuple[bool, bool] | None = None) -> Window:
        hf, vf = params if params is not None else (self.horizontal, self.vertical)
        return Window(float(h) if vf else 0.0, -1.0 if vf else 1.0, float(w) if hf else 0.0,
                      -1.0 if hf else 1.0, h, w)


@register_window_op
@dataclass(frozen=True)
class Pad(Op):
    """Pad by ``padding`` pixels: one number for all sides, (left/right, top/bottom) or (left, top, right,
    bottom), with ``fill`` (a level or three), as torchvision's Pad."""

    padding: Any = 4
    fill: Any = 0
    name = "pad"
    moves_boxes = True
    pads = True

    def __post_init__(self) -> None:
        pd = (self.padding,) * 4 if isinstance(self.padding, (int, np.integer)) else tuple(self.padding)
        if len(pd) == 2:
            pd = (pd[0], pd[1], pd[0], pd[1])
        if len(pd) != 4 or any(not isinstance(v, (int, np.integer)) or v < 0 for v in pd):
            raise UsageError(f"pad padding must be 1, 2 or 4 integers >= 0, got {self.padding!r}")
        object.__setattr__(self, "padding", tuple(int(v) for v in pd))
        object.__setattr__(self, "fill", colour("pad fill", self.fill))

    def window(self, h: int, w: int, params: Any = None) -> Window:
        left, top, right, bottom = self.padding
        return Window(float(-top), 1.0, float(-left), 1.0, h + top + bottom, w + left + right)


@register_window_op
@dataclass(frozen=True)
class Expand(Op):
    """Zoom out (SSD's expand, torchvision's RandomZoomOut): with probability ``p``, place the image at a
    random spot of a canvas ``side_range`` times larger, filled with ``fill``."""

    side_range: Any = (1.0, 4.0)
    fill: Any = (124, 116, 104)
    p: float = 0.5
    name = "expand"
    moves_boxes = True
    random = True
    pads = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "side_range", pair("expand side_range", self.side_range, 1.0, 16.0))
        object.__setattr__(self, "fill", colour("expand fill", self.fill))
        object.__setattr__(self, "p", probability("expand p", self.p))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[int, int, int, int] | None:
        """(top, left, canvas height, canvas width), or None when not applied."""
        if rng.random() >= self.p:
            return None
        r = rng.uniform(*self.side_range)
        ch, cw = int(h * r), int(w * r)
        return int((ch - h) * rng.random()), int((cw - w) * rng.random()), ch, cw

    def window(self, h: int, w: int, params: Any = None) -> Window:
        if params is None:
            return Window.identity(h, w)
        top, left, ch, cw = params
        return Window(float(-top), 1.0, float(-left), 1.0, ch, cw)


IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


@register_window_op
@dataclass(frozen=True)
class RandomIoUCrop(Op):
    """SSD's random crop (torchvision's RandomIoUCrop): pick a minimum IoU from ``options`` (1.0 = no crop),
    then try up to ``trials`` windows of side ``scale`` x the image and aspect ``ratio`` until one keeps
    a box centre and overlaps some box by that IoU. Boxes whose centre leaves the crop are dropped."""

    scale: Any = (0.3, 1.0)
    ratio: Any = (0.5, 2.0)
    options: Any = IOU_OPTIONS
    trials: int = 40
    name = "random_iou_crop"
    moves_boxes = True
    random = True
    needs_boxes = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", pair("random_iou_crop scale", self.scale, 1e-3, 1.0))
        object.__setattr__(self, "ratio", pair("random_iou_crop ratio", self.ratio, 1e-3, 1e3))
        try:
            opts = tuple(float(v) for v in self.options)
        except (TypeError, ValueError):
            raise UsageError(f"random_iou_crop options must be numbers, got {self.options!r}") from None
        if not opts:
            raise UsageError("random_iou_crop options must not be empty")
        object.__setattr__(self, "options", opts)
        positive("random_iou_crop trials", self.trials)

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[int, int, int, int] | None:
        """(top, left, height, width) of the crop, or None for the whole image."""
        xyxy = boxes.xyxy.astype(np.float64) if boxes is not None and len(boxes) else None
        for _ in range(50):
            min_iou = self.options[int(rng.integers(0, len(self.options)))]
            if min_iou >= 1.0:
                return None
            for _ in range(self.trials):
                cw = int(w * rng.uniform(*self.scale))
                ch = int(h * rng.uniform(*self.scale))
                if ch == 0 or not self.ratio[0] <= cw / ch <= self.ratio[1]:
                    continue
                left, top = int((w - cw) * rng.random()), int((h - ch) * rng.random())
                if cw == 0:
                    continue
                if xyxy is None:
                    return top, left, ch, cw
                cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2
                inside = (left < cx) & (cx < left + cw) & (top < cy) & (cy < top + ch)
                if not inside.any():
                    continue
                b = xyxy[inside]
                iw = np.clip(np.minimum(b[:, 2], left + cw) - np.maximum(b[:, 0], left), 0, None)
                ih = np.clip(np.minimum(b[:, 3], top + ch) - np.maximum(b[:, 1], top), 0, None)
                inter = iw * ih
                union = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) + cw * ch - inter
                if (inter / np.maximum(union, 1e-12)).max() >= min_iou:
                    return top, left, ch, cw
        return None

    def window(self, h: int, w: int, params: Any = None) -> Window:
        if params is None:
            return Window.identity(h, w)
        top, left, ch, cw = params
        return Window(float(top), 1.0, float(left), 1.0, ch, cw)

    def move_boxes(self, boxes: Any, h: int, w: int, params: Any = None, min_visible: float = 0.0) -> tuple[Any, int]:
        if boxes is None or params is None or not len(boxes):
            return boxes, 0
        top, left, ch, cw = params
        cx, cy = (boxes.xyxy[:, 0] + boxes.xyxy[:, 2]) / 2, (boxes.xyxy[:, 1] + boxes.xyxy[:, 3]) / 2
        inside = (left < cx) & (cx < left + cw) & (top < cy) & (cy < top + ch)
        kept = type(boxes)(boxes.xyxy[inside], boxes.labels[inside], boxes.canvas, boxes.iscrowd[inside],
                           tuple(e for e, k in zip(boxes.extra, inside) if k))
        out, dropped = super().move_boxes(kept, h, w, params, min_visible)
        return out, dropped + int((~inside).sum())


# --- host kernel (Pillow / NumPy): the reference of the fused GPU resample ----------------------------


def _axis_span(a: float, b: float, n_out: int, n_in: int) -> tuple[int, int]:
    """Output indices [o0, o1) whose pixel centres fall inside [0, n_in) (the rest is padding)."""
    lo, hi = 0, n_out
    while lo < hi and not 0 <= a + b * (lo + 0.5) < n_in:
        lo += 1
    while hi > lo and not 0 <= a + b * (hi - 0.5) < n_in:
        hi -= 1
    return lo, hi


def resample_cpu(img: Any, win: Window, fill: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """Apply a window to one uint8 HWC image (or RGB Pillow image) with Pillow's antialiased bilinear
    filter.

    The crop is folded into the resize as a box (Pillow reads real pixels beyond the box edge, as the
    GPU kernel does); output pixels whose centre falls outside the image are ``fill``.
    """
    from PIL import Image

    pil = img if isinstance(img, Image.Image) else None
    h, w = (pil.height, pil.width) if pil is not None else img.shape[:2]
    if win == Window.identity(h, w):
        return np.asarray(pil) if pil is not None else img
    if win.by == 1.0 and win.bx == 1.0 and float(win.ay).is_integer() and float(win.ax).is_integer():
        arr = np.asarray(pil) if pil is not None else img  # a pure crop: no filter
        return crop_pad_cpu(arr, int(win.ay), int(win.ax), win.oh, win.ow, fill)
    by, ay = (win.by, win.ay) if win.by > 0 else (-win.by, win.ay + win.by * win.oh)
    bx, ax = (win.bx, win.ax) if win.bx > 0 else (-win.bx, win.ax + win.bx * win.ow)
    y0, y1 = _axis_span(ay, by, win.oh, h)
    x0, x1 = _axis_span(ax, bx, win.ow, w)
    part = None
    if y1 > y0 and x1 > x0:
        box = (max(ax + bx * x0, 0.0), max(ay + by * y0, 0.0), min(ax + bx * x1, float(w)),
               min(ay + by * y1, float(h)))
        src = pil if pil is not None else Image.fromarray(img)
        resized = src.resize((x1 - x0, y1 - y0), Image.BILINEAR, box=box)
        if (y0, x0, y1, x1) == (0, 0, win.oh, win.ow):  # no fill around Pillow's output: mirror it there
            if win.by < 0:
                resized = resized.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
            if win.bx < 0:
                resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return np.asarray(resized)
        part = np.asarray(resized)
    out = np.empty((win.oh, win.ow, 3 if pil is not None else img.shape[2]), np.uint8)
    out[:] = np.asarray(fill, np.float32).round().astype(np.uint8)
    if part is not None:
        out[y0:y1, x0:x1] = part
    if win.by < 0:
        out = out[::-1]
    if win.bx < 0:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)


def resize_cpu(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Antialiased bilinear resize of one uint8 HWC image (Pillow's triangle filter)."""
    h, w = img.shape[:2]
    return resample_cpu(img, Window(0.0, h / height, 0.0, w / width, height, width))


def crop_pad_cpu(img: np.ndarray, y0: int, x0: int, height: int, width: int,
                 fill: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """The window [y0, y0 + height) x [x0, x0 + width), ``fill`` where it leaves the image."""
    h, w = img.shape[:2]
    if 0 <= y0 and 0 <= x0 and y0 + height <= h and x0 + width <= w:
        return img[y0 : y0 + height, x0 : x0 + width]
    out = np.empty((height, width, *img.shape[2:]), img.dtype)
    out[:] = np.asarray(fill, np.float32).round().astype(img.dtype)
    sy0, sx0 = max(y0, 0), max(x0, 0)
    sy1, sx1 = min(y0 + height, h), min(x0 + width, w)
    if sy1 > sy0 and sx1 > sx0:
        out[sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = img[sy0:sy1, sx0:sx1]
    return out
