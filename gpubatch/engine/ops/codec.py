"""JPEG-quality degradation: re-encode at a low quality and decode again, as a training augmentation.

On the CPU, Pillow; on the GPU, nvImageCodec's encoder and decoder, one encode call per distinct quality
in the batch. The two JPEG codecs differ slightly, so CPU and GPU outputs agree only to JPEG's own noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import UsageError
from ..registry import DEVICE, HOST, register_kernel
from .base import Op, probability

if TYPE_CHECKING:
    from ..batch import DeviceBatch, Ragged
    from ..gpu.engine import GpuEngine


@dataclass(frozen=True)
class JpegQuality(Op):
    """With probability ``p``, round-trip the image through JPEG at a quality drawn from ``quality``
    (a number or a (min, max) range within 1-100)."""

    quality: Any = (30, 90)
    p: float = 1.0
    name = "jpeg_quality"
    random = True
    kind = "custom"

    def __post_init__(self) -> None:
        q = (self.quality, self.quality) if isinstance(self.quality, (int, np.integer)) else tuple(self.quality)
        if len(q) != 2 or any(not isinstance(v, (int, np.integer)) or not 1 <= v <= 100 for v in q) or q[0] > q[1]:
            raise UsageError(f"jpeg_quality quality must be an integer or range within [1, 100], got {self.quality!r}")
        object.__setattr__(self, "quality", (int(q[0]), int(q[1])))
        object.__setattr__(self, "p", probability("jpeg_quality p", self.p))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> int | None:
        if self.p < 1.0 and rng.random() >= self.p:
            return None
        lo, hi = self.quality
        return lo if lo == hi else int(rng.integers(lo, hi + 1))


@register_kernel("jpeg_quality", HOST)
def _jpeg_host(op: JpegQuality, images: list[np.ndarray], params: list[Any]) -> list[np.ndarray]:
    from ..codecs import image as host

    return [im if q is None else host.decode(host.encode(im, "jpeg", q)) for im, q in zip(images, params)]


@register_kernel("jpeg_quality", DEVICE)
def _jpeg_device(engine: GpuEngine, op: JpegQuality, src: Ragged, params: list[Any]) -> DeviceBatch:
    """Encode each quality group on the GPU, decode the whole batch back, pack it (untouched where None)."""
    from ..batch import Ragged

    n = len(src)
    ident = engine.launch.resample(src, [_identity(int(h), int(w)) for h, w in src.hw])
    items = ident.items()
    blobs: list[Any] = [None] * n
    groups: dict[int, list[int]] = {}
    for i, q in enumerate(params):
        if q is not None:
            groups.setdefault(q, []).append(i)
    for q, idx in groups.items():
        for i, data in zip(idx, engine.encoder.encode([items[i] for i in idx], "jpeg", q, engine.stream)):
            if data is None:
                raise RuntimeError("the GPU JPEG encoder failed")
            blobs[i] = data
    todo = [i for i in range(n) if blobs[i] is not None]
    if not todo:
        return ident
    res = engine.decoder.decode([blobs[i] for i in todo], engine.stream)
    arrays: list[Any] = list(items)
    for j, i in enumerate(todo):
        if res.arrays[j] is None:
            raise RuntimeError(f"decoding the degraded JPEG failed: {res.errors[j]}")
        arrays[i] = res.arrays[j]
    rag = Ragged.from_items(engine.cp, arrays)
    rag.keep.extend([ident.buffer, *res.keep])
    return engine.launch.resample(rag, [_identity(int(h), int(w)) for h, w in rag.hw])


def _identity(h: int, w: int):
    from .base import Window

    return Window.identity(h, w)
