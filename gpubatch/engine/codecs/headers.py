"""Image headers read without decoding a pixel: size, mode, EXIF orientation, JPEG frame and kind, PNG
chunk integrity. Formats, ``info`` and the GPU feed's readers import this module alone: it pulls in
no decoder (Pillow only opens the header).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from ...types import sniff_image_codec

#: Pillow's own decompression-bomb threshold; images above it are refused unless --max-pixels says otherwise.
DEFAULT_MAX_PIXELS = 89_478_485


_EXIF_TRANSPOSED = {5, 6, 7, 8}  # orientations that swap width and height


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says, read without decoding pixels.

    Attributes:
        codec: "jpeg", "png", ...
        width, height: displayed size in pixels (EXIF orientation applied).
        mode: Pillow mode of the stored pixels ("RGB", "L", "CMYK", "P", "RGBA", ...).
        orientation: EXIF orientation tag (1 = upright).
        subsampling: JPEG chroma subsampling ("4:2:0", "4:2:2", "4:4:4", "gray", ...) or "".
    """

    codec: str
    width: int
    height: int
    mode: str
    orientation: int = 1
    subsampling: str = ""


def _pillow():
    from PIL import Image

    # gpubatch enforces its own pixel limit (--max-pixels) before any pixel is decoded.
    Image.MAX_IMAGE_PIXELS = None
    return Image


def jpeg_subsampling(data: bytes) -> str:
    """Chroma subsampling of a JPEG from its SOF marker ("4:2:0", "4:2:2", "4:4:4", "4:4:0", "gray")."""
    hdr = jpeg_header(data)
    return hdr[1] if hdr else ""


def jpeg_header(data: bytes) -> tuple[int, str, int, int] | None:
    """(SOF marker, subsampling, width, height) from a JPEG's frame header, without decoding.

    The SOF marker tells baseline (0xC0) and extended (0xC1) from progressive (0xC2) and others; the
    size is as stored (before EXIF orientation). None when no frame header is found.
    """
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:  # (no marker where one must be: a corrupt header)
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        seg_len = struct.unpack(">H", data[i + 2 : i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 10 > n:
                return None
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            ncomp = data[i + 9]
            if ncomp == 1:
                return marker, "gray", width, height
            if i + 10 + 3 * ncomp > n:
                return None
            h = [data[i + 11 + 3 * c] >> 4 for c in range(ncomp)]
            v = [data[i + 11 + 3 * c] & 0x0F for c in range(ncomp)]
            if ncomp == 4:
                return marker, "cmyk", width, height
            if h[1:] != [1] * (ncomp - 1) or v[1:] != [1] * (ncomp - 1):
                return marker, "other", width, height
            sub = {(1, 1): "4:4:4", (2, 1): "4:2:2", (2, 2): "4:2:0", (1, 2): "4:4:0", (4, 1): "4:1:1"}
            return marker, sub.get((h[0], v[0]), "other"), width, height
        if marker in (0xD9, 0xDA):
            return None
        i += 2 + seg_len
    return None


def jpeg_orientation(data: bytes) -> int:
    """EXIF orientation (1-8) from a JPEG's APP1 segment, without Pillow; 1 when there is none.

    Walks the markers up to the frame header, then reads IFD0 of the TIFF block for tag 0x0112.
    """
    n = len(data)
    if data[:2] != b"\xff\xd8":
        return 1
    i = 2
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD9, 0xDA) or 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return 1  # EXIF comes before the frame header
        seg_len = (data[i + 2] << 8) | data[i + 3]
        if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\x00\x00":
            return _tiff_orientation(data[i + 10 : i + 2 + seg_len])
        i += 2 + seg_len
    return 1


def _ifd(tiff: bytes, at: int, end: str) -> tuple[dict[int, tuple[int, bytes]], int]:
    """A TIFF IFD's entries at offset ``at`` (tag -> (type, its 4 value bytes)) and the next IFD's offset (0: none);
    ``end`` the byte order's struct prefix. struct.error where the block is cut short."""
    (count,) = struct.unpack_from(end + "H", tiff, at)
    entries = {}
    for k in range(min(count, 512)):
        tag, typ, _, value = struct.unpack_from(end + "HHI4s", tiff, at + 2 + 12 * k)
        entries.setdefault(tag, (typ, value))
    (nxt,) = struct.unpack_from(end + "I", tiff, at + 2 + 12 * count)
    return entries, nxt


def _tiff_orientation(tiff: bytes) -> int:
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return 1
    end = "<" if tiff[:2] == b"II" else ">"
    try:
        (ifd,) = struct.unpack_from(end + "I", tiff, 4)
        typ, value = _ifd(tiff, ifd, end)[0].get(0x0112, (0, b""))
        if typ == 3:  # SHORT: the value sits in the first two bytes
            (v,) = struct.unpack_from(end + "H", value, 0)
            return v if 1 <= v <= 8 else 1
    except struct.error:  # a truncated block is no orientation
        return 1
    return 1


def jpeg_display_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) a JPEG decodes to with EXIF orientation applied, from its headers; None if unknown."""
    hdr = jpeg_header(data)
    if not hdr:
        return None
    _, _, w, h = hdr
    if w <= 0 or h <= 0:
        return None
    return (w, h) if jpeg_orientation(data) in _EXIF_TRANSPOSED else (h, w)


# Pillow's format names that gpubatch's codec names differ from
_PILLOW_CODECS = {"mpo": "jpeg", "ppm": "pnm", "dib": "bmp"}


def jpeg_ended(data: bytes | memoryview) -> bool:
    """Whether a JPEG's bytes end with its end marker (FF D9), padding after it aside (zeros, line ends, spaces, as
    some writers leave). One without it is cut short or followed by other bytes: a decoder tells which (Pillow
    refuses a cut JPEG; nvJPEG decodes what it has), so both paths leave such a file to Pillow."""
    return bytes(data[-16:]).rstrip(b"\x00\r\n ").endswith(b"\xff\xd9")


def png_damage(data: bytes) -> str | None:
    """What is wrong with a PNG's chunk structure (a chunk that fails its CRC, or runs past the end),
    or None: a check of every byte at the cost of a CRC-32, cheap enough for every passed-through PNG."""
    import zlib

    pos, n = 8, len(data)
    while pos + 12 <= n:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > n:
            return f"PNG chunk {kind.decode('latin-1')!r} at byte {pos:,} runs past the end (truncated)"
        if zlib.crc32(data[pos + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
            return f"PNG chunk {kind.decode('latin-1')!r} at byte {pos:,} fails its CRC (corrupt)"
        if kind == b"IEND":
            return None
        pos = end
    return "PNG without its IEND chunk (truncated)"


def probe(data: bytes) -> ImageHeader:
    """Read an image's header (size, mode, orientation) without decoding its pixels.

    A plain 8-bit JPEG is read by :func:`jpeg_header` and :func:`jpeg_orientation` (about 8x faster
    than Pillow's parser, the bulk of a pass-through's per-record time); anything else by Pillow.

    Raises:
        ValueError: the bytes are not an image Pillow can read.
    """
    if data[:3] == b"\xff\xd8\xff":
        fast = _plain_jpeg(data)
        if fast is not None:
            return fast
    Image = _pillow()
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            mode = im.mode
            codec = (im.format or "").lower() or sniff_image_codec(data) or "unknown"
            orientation = 1
            if codec in ("jpeg", "mpo", "tiff", "webp", "png"):
                try:
                    orientation = int(im.getexif().get(0x0112, 1) or 1)
                except Exception:  # a broken EXIF block is not a broken image
                    orientation = 1
    except Exception as e:  # Pillow raises many types for bad data
        raise ValueError(f"not a readable image ({_why(e)})") from None
    codec = _PILLOW_CODECS.get(codec, codec)
    if orientation in _EXIF_TRANSPOSED:
        w, h = h, w
    sub = jpeg_subsampling(data) if codec == "jpeg" else ""
    return ImageHeader(codec, w, h, mode, orientation, sub)


def _plain_jpeg(data: bytes) -> ImageHeader | None:
    """The header of a baseline, extended or progressive 8-bit JPEG of 1 or 3 components with a known
    subsampling, as :func:`probe` gives it; None for any other (Pillow reads those)."""
    hdr = jpeg_header(data)
    if not hdr or hdr[0] not in (0xC0, 0xC1, 0xC2) or hdr[1] not in _PLAIN_SUB or not hdr[2] or not hdr[3]:
        return None
    sof, sub, w, h = hdr
    if _jpeg_precision(data) != 8:
        return None
    orientation = jpeg_orientation(data)
    if orientation in _EXIF_TRANSPOSED:
        w, h = h, w
    return ImageHeader("jpeg", w, h, "L" if sub == "gray" else "RGB", orientation, sub)


_PLAIN_SUB = frozenset({"4:2:0", "4:2:2", "4:4:4", "4:4:0", "4:1:1", "gray"})


def _jpeg_precision(data: bytes) -> int:
    """The sample precision of a JPEG's frame header (8 or 12), 0 where none is found."""
    i, n = 2, len(data)
    while i + 5 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD9, 0xDA):
            return 0
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return data[i + 4]
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return 0


def _why(e: Exception) -> str:
    """Pillow's error as a short reason, without object reprs."""
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        return "unknown or corrupt image format"
    msg = str(e).split(" <_io.")[0].strip() or type(e).__name__
    return msg if msg.lower() != type(e).__name__.lower() else type(e).__name__


# SOF markers nvJPEG's GPU decoders handle (baseline, extended, progressive Huffman).
_GPU_SOF = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}


_GPU_SUB = {"4:2:0", "4:2:2", "4:4:4", "4:4:0", "gray"}


def jpeg_kind(data: bytes) -> tuple[str | None, int, int]:
    """("baseline/4:2:0"-style kind, width, height) of a JPEG the GPU decoders may take, else (None, w, h).
    A JPEG with an EXIF orientation other than upright gets "/turned" after its kind: the hardware
    engine's direct path does not turn images, so those go to the CUDA decoder, which does."""
    return jpeg_facts(data)[1]


def jpeg_facts(data: bytes) -> tuple[tuple[int, int] | None, tuple[str | None, int, int], int]:
    """(:func:`jpeg_display_size`, :func:`jpeg_kind`, :func:`jpeg_orientation`) of a JPEG from one walk of
    its headers (a feed's reader asks all three of every image)."""
    hdr = jpeg_header(data)
    if hdr is None:
        return None, (None, 0, 0), 1
    sof, sub, w, h = hdr
    turn = jpeg_orientation(data)
    size = None if w <= 0 or h <= 0 else (w, h) if turn in _EXIF_TRANSPOSED else (h, w)
    if sof not in _GPU_SOF or sub not in _GPU_SUB:
        return size, (None, w, h), turn
    kind = f"{_GPU_SOF[sof]}/{sub}"
    return size, ((kind if turn == 1 else kind + "/turned"), w, h), turn


def frames_held(data: bytes, codec: str) -> int:
    """How many pictures an image file holds, from its structure alone, counted up to 2: an animated GIF, WebP or PNG
    (APNG) or a TIFF of several pages holds more than one, and a decoder gives its first (what a re-encoding run
    writes of it). 1 for every other file, and where its bytes do not say."""
    try:
        if codec == "gif":
            return _gif_frames(data)
        if codec == "png":  # (APNG: an acTL chunk, with its frame count, before the first IDAT)
            at = 8
            while at + 12 <= len(data):
                n, kind = int.from_bytes(data[at : at + 4], "big"), data[at + 4 : at + 8]
                if kind == b"acTL":
                    return min(2, max(1, int.from_bytes(data[at + 8 : at + 12], "big")))
                if kind in (b"IDAT", b"IEND"):
                    break
                at += 12 + n
            return 1
        if codec == "webp":  # (VP8X's animation flag)
            return 2 if data[12:16] == b"VP8X" and data[20] & 0x02 else 1
        if codec == "tiff":
            return _tiff_pages(data)
    except (IndexError, ValueError):
        pass
    return 1


def _gif_frames(data: bytes) -> int:
    """A GIF's image descriptors, counted up to 2 (its blocks walked: extensions and image data skipped)."""
    flags = data[10]
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # (header, screen descriptor, global colour table)
    frames = 0
    while at < len(data):
        kind = data[at]
        if kind == 0x3B:  # trailer
            break
        if kind == 0x2C:  # image descriptor, its local colour table, LZW code size, then its data's sub-blocks
            frames += 1
            if frames >= 2:
                return 2
            local = data[at + 9]
            at += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0) + 1
        elif kind == 0x21:  # extension: its label, then its sub-blocks
            at += 2
        else:
            break
        while at < len(data) and data[at]:
            at += data[at] + 1
        at += 1
    return max(frames, 1)


def _tiff_pages(data: bytes) -> int:
    """A TIFF's pages (its IFD chain), up to 2; an IFD of a reduced-resolution image (a thumbnail: NewSubfileType's
    bit 0) is no page."""
    if data[:2] not in (b"II", b"MM"):
        return 1
    end = "<" if data[:2] == b"II" else ">"
    pages, seen = 0, set()
    try:
        (version, at) = struct.unpack_from(end + "HI", data, 2)
        while version == 42 and 8 <= at and at not in seen and len(seen) < 64:  # (BigTIFF, 43: not walked)
            seen.add(at)
            entries, at = _ifd(data, at, end)
            typ, value = entries.get(254, (0, b"\0\0\0\0"))  # NewSubfileType, a LONG
            pages += not (typ == 4 and struct.unpack_from(end + "I", value)[0] & 1)
            if pages >= 2:
                return 2
    except struct.error:  # (cut short: the pages before the cut)
        pass
    return max(pages, 1)
