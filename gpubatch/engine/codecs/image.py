"""Image codecs on the host: decode and encode with Pillow (headers: :mod:`.headers`; the GPU side:
:mod:`.image_gpu`), and the image media's entries in the codec registry (:mod:`..media`).

Decoded images are uint8 RGB, HWC, with EXIF orientation applied. Grayscale, CMYK, palette and
alpha images become RGB (alpha composited over white), so every later op sees one layout.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import RecordError, Stage
from ...types import Record
from ..media import HOST, MediaSpec, register_codec
from . import headers
from .headers import DEFAULT_MAX_PIXELS, _pillow, _why

if TYPE_CHECKING:
    from ..plan import Plan


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


def check_encoded(record: Record, max_pixels: int, full: bool = False) -> headers.ImageHeader:
    """Validity check of image bytes that pass through untouched; returns their header (codec, size).

    Reads the header (size, mode) without decoding. A JPEG without its end marker is fully decoded to
    tell trailing bytes from truncation; a PNG has every chunk's CRC checked; other codecs (WebP, TIFF,
    GIF, JPEG 2000, ...) are decoded. ``full`` (``--verify full``) decodes every image.

    Raises:
        RecordError: not an image, truncated, corrupt, or above ``max_pixels``.
    """
    try:
        hdr = headers.probe(record.data)
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
    if max_pixels and hdr.width * hdr.height > max_pixels:
        raise RecordError(
            record.key, record.origin, Stage.DECODE,
            f"image of {hdr.width}x{hdr.height} = {hdr.width * hdr.height} pixels exceeds --max-pixels {max_pixels}",
        )
    if hdr.codec == "png":
        damage = headers.png_damage(record.data)
        if damage:
            raise RecordError(record.key, record.origin, Stage.DECODE, damage)
    complete = (hdr.codec == "jpeg" and headers.jpeg_ended(record.data)) or hdr.codec == "png"
    if full or not complete:
        try:
            decode(record.data, max_pixels)
        except ValueError as e:
            raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
    return hdr


class ImageHostCodec:
    """Images on the CPU, as the run flow uses them (:class:`~gpubatch.engine.media.Codec`): Pillow
    decodes to an RGB image the host chain reads without a copy, and encodes JPEG or PNG."""

    spec = MediaSpec("image")

    def check(self, record: Record, plan: Plan) -> Record:
        hdr = check_encoded(record, plan.max_pixels, plan.verify == "full")
        return record.with_(codec=hdr.codec, size=(hdr.height, hdr.width))  # (the bytes decide the codec, not a name)

    def decode(self, record: Record, plan: Plan) -> Any:
        try:
            return decode_image(record.data, plan.max_pixels)
        except ValueError as e:
            raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None

    def size(self, decoded: Any) -> tuple[int, int]:
        return (decoded.height, decoded.width) if hasattr(decoded, "height") else tuple(decoded.shape[:2])

    def encode(self, data: Any, record: Record, plan: Plan) -> Record:
        codec = plan.out_codec(record.codec)
        try:
            plan.check_encodable(codec, *data.shape[:2])
        except ValueError as e:
            raise RecordError(record.key, record.origin, Stage.ENCODE, str(e)) from None
        try:
            return record.with_(data=encode(data, codec, plan.jpeg_quality), codec=codec, size=tuple(data.shape[:2]))
        except Exception as e:  # noqa: BLE001 - the record boundary
            raise RecordError(record.key, record.origin, Stage.ENCODE, f"{type(e).__name__}: {e}") from None


register_codec("image", "*", HOST, ImageHostCodec())
