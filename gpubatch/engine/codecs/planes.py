"""A JPEG decoded into its own planes (Y, Cb, Cr at their sampled sizes) and how they become RGB.

The hardware JPEG engine writes a 4:2:0 or 4:2:2 image's planes in 1.5 or 2 bytes a pixel where
interleaved RGB takes 3. gpubatch keeps decoded images that way where the reader is the fused resample
kernel (``kernels/resample.cu``), which turns each pixel it reads into RGB as libjpeg does, so the
result equals the RGB decode's. This module has the layout of such an image and libjpeg's arithmetic
in NumPy, the CPU reference of the kernel's: "fancy" chroma upsampling (a triangle filter, 3/4 of the
nearer chroma sample and 1/4 of the next, in integers with libjpeg's rounding; jdsample.c) and the
YCbCr -> RGB conversion in 16-bit fixed point (jdcolor.c). Pillow decodes JPEGs through libjpeg(-turbo)
with these defaults.
"""

from __future__ import annotations

import numpy as np

# sampling factors (horizontal, vertical) of the chroma planes against luma, per JPEG kind's subsampling
SUBSAMPLING = {"4:2:0": (2, 2), "4:2:2": (2, 1)}

_SCALEBITS = 16
_ONE_HALF = 1 << (_SCALEBITS - 1)
_FIX = {name: int(v * (1 << _SCALEBITS) + 0.5) for name, v in
        (("cr_r", 1.40200), ("cb_b", 1.77200), ("cr_g", 0.71414), ("cb_g", 0.34414))}


def chroma_shape(width: int, height: int, hs: int, vs: int) -> tuple[int, int]:
    """(width, height) of a chroma plane sampled ``hs`` x ``vs`` times more coarsely than luma."""
    return -(-width // hs), -(-height // vs)


def plane_bytes(width: int, height: int, hs: int, vs: int) -> int:
    """Bytes of an image's planes packed as :func:`plane_views` reads them: luma rows of ``width``
    bytes, then the Cb and then the Cr plane, rows of the chroma width."""
    cw, ch = chroma_shape(width, height, hs, vs)
    return width * height + 2 * cw * ch


def plane_places(ptr: int, width: int, height: int, hs: int, vs: int) -> tuple[int, int, int, int, int, int]:
    """(address, pitch) of the Y, Cb and Cr planes of an image packed at ``ptr`` (see :func:`plane_bytes`)."""
    cw, ch = chroma_shape(width, height, hs, vs)
    cb = ptr + width * height
    return ptr, width, cb, cw, cb + cw * ch, cw


def plane_views(buf: np.ndarray, width: int, height: int, hs: int, vs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Y, Cb and Cr planes of an image packed in the flat uint8 array ``buf``."""
    cw, ch = chroma_shape(width, height, hs, vs)
    y = buf[: width * height].reshape(height, width)
    cb = buf[width * height : width * height + cw * ch].reshape(ch, cw)
    cr = buf[width * height + cw * ch : width * height + 2 * cw * ch].reshape(ch, cw)
    return y, cb, cr


def upsample(c: np.ndarray, hs: int, vs: int, width: int, height: int) -> np.ndarray:
    """A chroma plane at full size (int32), as libjpeg's fancy upsampling makes it: an output pixel
    takes 3/4 of its own chroma sample and 1/4 of the next one over on its side, per subsampled axis
    (3/4 x 3/4 ... per axis for 4:2:0), edges repeating the last sample; libjpeg's rounding biases
    (1 and 2 for 4:2:2's even and odd columns, 8 and 7 for 4:2:0's). Planes at most 2 samples wide
    (images at most 4 pixels wide) libjpeg upsamples by repeating each sample, and so does this."""
    c = c.astype(np.int32)
    ch, cw = c.shape
    cols = np.arange(width)
    i = cols // hs
    if cw <= 2:  # libjpeg repeats the samples of chroma planes this narrow (jdsample.c: do_fancy)
        return c[np.arange(height) // vs][:, i]
    if vs == 2:
        rows = np.arange(height)
        near = rows // 2
        far = np.clip(np.where(rows % 2 == 0, near - 1, near + 1), 0, ch - 1)
        c = 3 * c[near] + c[far]  # colsum, 4x the value
    if hs != 2:
        raise ValueError(f"chroma sampled {hs}x{vs}: only 4:2:0 and 4:2:2 planes are read")
    j = np.clip(np.where(cols % 2 == 0, i - 1, i + 1), 0, cw - 1)
    if vs == 2:
        return (3 * c[:, i] + c[:, j] + np.where(cols % 2 == 0, 8, 7)) >> 4
    return (3 * c[:, i] + c[:, j] + np.where(cols % 2 == 0, 1, 2)) >> 2


def ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """libjpeg's YCbCr -> RGB (ITU-R BT.601 full range, 16-bit fixed point, each term rounded as its
    tables are), full-size int planes in, HxWx3 uint8 out."""
    y = y.astype(np.int64)
    cb = cb.astype(np.int64) - 128
    cr = cr.astype(np.int64) - 128
    r = y + ((_FIX["cr_r"] * cr + _ONE_HALF) >> _SCALEBITS)
    g = y + ((-_FIX["cb_g"] * cb + _ONE_HALF - _FIX["cr_g"] * cr) >> _SCALEBITS)
    b = y + ((_FIX["cb_b"] * cb + _ONE_HALF) >> _SCALEBITS)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def planes_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray, hs: int, vs: int) -> np.ndarray:
    """An image's planes as interleaved RGB, as libjpeg (and so Pillow) turns them into it."""
    h, w = y.shape
    return ycc_to_rgb(y, upsample(cb, hs, vs, w, h), upsample(cr, hs, vs, w, h))
