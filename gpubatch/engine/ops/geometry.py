"""Geometry ops: resize, resize-shorter, center crop.

Images are uint8 HWC. Resizing is bilinear, antialiased when downscaling (a triangle filter whose
support grows with the scale factor, as Pillow and torchvision's ``antialias=True`` do). Sizes follow
torchvision: ``resize_shorter(s)`` makes the shorter side ``s`` and the longer ``int(s * long / short)``;
``center_crop(s)`` takes the top-left corner at ``round((h - s) / 2)`` and pads with zeros when the
image is smaller than the crop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import UsageError
from ..registry import HOST, register_kernel
from .base import Op


def _positive(name: str, value: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


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

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        return self.height, self.width

    def box_affine(self, h: int, w: int) -> tuple[float, float, float, float]:
        return self.width / max(w, 1), self.height / max(h, 1), 0.0, 0.0


@dataclass(frozen=True)
class ResizeShorter(Op):
    """Resize keeping the aspect ratio so that the shorter side is ``size``."""

    size: int
    name = "resize_shorter"
    moves_boxes = True

    def __post_init__(self) -> None:
        _positive("resize-shorter size", self.size)

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        if h <= w:
            return self.size, max(1, int(self.size * w / max(h, 1)))
        return max(1, int(self.size * h / max(w, 1))), self.size

    def box_affine(self, h: int, w: int) -> tuple[float, float, float, float]:
        oh, ow = self.out_hw(h, w)
        return ow / max(w, 1), oh / max(h, 1), 0.0, 0.0


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

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        return self.size, self.size

    def box_affine(self, h: int, w: int) -> tuple[float, float, float, float]:
        y0, x0 = self.origin(h, w)
        return 1.0, 1.0, float(-x0), float(-y0)


# --- host kernels (Pillow / NumPy), the reference for the GPU kernels -------------------------------


def resize_cpu(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Antialiased bilinear resize of one uint8 HWC image (Pillow's triangle filter)."""
    from PIL import Image

    if img.shape[0] == height and img.shape[1] == width:
        return img
    return np.asarray(Image.fromarray(img).resize((width, height), Image.BILINEAR))


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


@register_kernel("resize", HOST)
def _resize_host(op: Resize, images: list[np.ndarray]) -> list[np.ndarray]:
    return [resize_cpu(im, op.height, op.width) for im in images]


@register_kernel("resize_shorter", HOST)
def _resize_shorter_host(op: ResizeShorter, images: list[np.ndarray]) -> list[np.ndarray]:
    return [resize_cpu(im, *op.out_hw(*im.shape[:2])) for im in images]


@register_kernel("center_crop", HOST)
def _center_crop_host(op: CenterCrop, images: list[np.ndarray]) -> list[np.ndarray]:
    return [crop_pad_cpu(im, *op.origin(*im.shape[:2]), op.size, op.size) for im in images]
