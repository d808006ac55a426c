"""The CPU reference of reading a JPEG's own planes as RGB (gpubatch.engine.codecs.planes), against
Pillow's decode of the same JPEG. The planes come from FFmpeg's JPEG decoder (PyAV), whose inverse DCT
differs from libjpeg's by a level here and there, so agreement is to a few levels; upsampling by
repeating chroma samples misses Pillow by 10 levels and more on these images."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from gpubatch.engine.codecs import planes
from gpubatch.synthetic import photo_like
from tests.helpers import jpeg_bytes

av = pytest.importorskip("av")  # (a dependency; the GPU machine's bare python3 may lack it)


def _av_planes(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data), format="image2") as c:
        frame = next(c.decode(video=0))
    return [np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, : p.width] for p in frame.planes]


@pytest.mark.parametrize("sub", ["4:2:0", "4:2:2"])
@pytest.mark.parametrize("hw", [(401, 517), (400, 500), (33, 47), (7, 5), (2, 3), (1, 1)])
def test_planes_to_rgb_is_libjpegs_reading(sub, hw):
    hs, vs = planes.SUBSAMPLING[sub]
    data = jpeg_bytes(photo_like(np.random.default_rng(hw[0]), *hw), 90, subsampling=sub)
    y, cb, cr = _av_planes(data)
    assert cb.shape[::-1] == planes.chroma_shape(hw[1], hw[0], hs, vs)
    pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    got = planes.planes_to_rgb(y, cb, cr, hs, vs).astype(int)
    assert got.shape == pil.shape
    d = np.abs(got - pil)
    assert d.max() <= 4 and d.mean() < 0.15, (d.max(), d.mean())
    if min(hw) > 8:  # repeating each chroma sample instead is far off
        rep = planes.ycc_to_rgb(y, *(np.repeat(np.repeat(c, vs, 0), hs, 1)[: hw[0], : hw[1]] for c in (cb, cr)))
        assert np.abs(rep.astype(int) - pil).max() >= 10 and np.abs(rep.astype(int) - pil).mean() > 5 * d.mean()


def test_plane_layout_round_trips():
    w, h, hs, vs = 7, 5, 2, 2
    cw, ch = planes.chroma_shape(w, h, hs, vs)
    assert (cw, ch) == (4, 3) and planes.plane_bytes(w, h, hs, vs) == 35 + 24
    buf = np.arange(planes.plane_bytes(w, h, hs, vs), dtype=np.uint8)
    y, cb, cr = planes.plane_views(buf, w, h, hs, vs)
    base = 1000
    py, pitch_y, pcb, pitch_c, pcr, _ = planes.plane_places(base, w, h, hs, vs)
    assert (pitch_y, pitch_c) == (w, cw)
    assert (y[0, 0], cb[0, 0], cr[0, 0]) == (py - base, pcb - base, pcr - base)
    assert cr[-1, -1] == buf[-1]


def test_constant_chroma_is_the_standard_conversion():
    y = np.full((6, 9), 100, np.uint8)
    c = np.full((3, 5), 200, np.uint8), np.full((3, 5), 60, np.uint8)
    got = planes.planes_to_rgb(y, *c, 2, 2)
    # R = Y + 1.402 (Cr - 128), G = Y - 0.34414 (Cb - 128) - 0.71414 (Cr - 128), B = Y + 1.772 (Cb - 128)
    assert (got == np.array([5, 124, 228], np.uint8)).all()
    with pytest.raises(ValueError):
        planes.planes_to_rgb(y, *c, 1, 2)
