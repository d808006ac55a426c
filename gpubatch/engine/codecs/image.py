"""Image codecs on the host: decode and encode with Pillow (headers: :mod:`.headers`; the GPU side:
:mod:`.image_gpu`).

Decoded images are uint8 RGB, HWC, with EXIF orientation applied. Grayscale, CMYK, palette and
alpha images become RGB (alpha composited over white), so every later op sees one layout.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from .headers import DEFAULT_MAX_PIXELS, _pillow, _why


def decode(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode an encoded image to uint8 RGB HWC with EXIF orientation applied.

    Raises:
        ValueError: unreadable, truncated, or above ``max_pixels`` (checked before decoding).
    """
    return np.asarray(decode_image(data, max_pixels), dtype=np.uint8)


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Any:
    """:func:`decode`, as an RGB Pillow image (what Pillow's resize reads without a copy)."""
    Image = _pillow()
    from PIL import ImageOps

    try:
        im = Image.open(io.BytesIO(data))
        w, h = im.size
        if max_pixels and w * h > max_pixels:
            raise ValueError(f"image of {w}x{h} = {w * h} pixels exceeds --max-pixels {max_pixels}")
        im.load()
        ImageOps.exif_transpose(im, in_place=True)  # in place: no copy of an upright image
        return _to_rgb(im)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"cannot decode image ({_why(e)})") from None


def _to_rgb(im):
    from PIL import Image

    if im.mode == "RGB":
        return im
    if im.mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    if im.mode in ("LA", "La", "PA"):
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "RGBa"):
        base = Image.new("RGB", im.size, (255, 255, 255))
        base.paste(im.convert("RGBA"), mask=im.getchannel("A"))
        return base
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(im, dtype=np.float64)
        top = 65535.0 if arr.max(initial=0) > 255 else 255.0
        im = Image.fromarray(np.clip(arr * (255.0 / top), 0, 255).round().astype(np.uint8), "L")
    return im.convert("RGB")


def encode(pixels: np.ndarray, codec: str, quality: int = 95) -> bytes:
    """Encode uint8 HWC (RGB or gray) pixels as "jpeg" or "png".

    JPEG uses 4:2:0 subsampling and the given quality (1-100); PNG is lossless.
    """
    Image = _pillow()
    arr = np.ascontiguousarray(pixels, dtype=np.uint8)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    im = Image.fromarray(arr)
    buf = io.BytesIO()
    if codec == "jpeg":
        im.save(buf, "JPEG", quality=int(quality), subsampling="4:2:0", optimize=False)
    elif codec == "png":
        im.save(buf, "PNG", compress_level=6)
    else:
        raise ValueError(f"cannot encode {codec!r}; supported: jpeg, png")
    return buf.getvalue()
