"""The batched GPU JPEG encoder: its tables and headers (CPU), its files against Pillow's (GPU)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpubatch.engine.codecs.jpeg_gpu import dct_matrix, huffman_codes, tables
from tests.helpers import photo

KERNEL = Path(__file__).resolve().parents[2] / "gpubatch" / "engine" / "kernels" / "jpeg.cu"


def _zigzag() -> list[int]:
    order = []
    for s in range(15):
        rows = [r for r in range(8) if 0 <= s - r < 8]
        order += [r * 8 + s - r for r in (rows[::-1] if s % 2 == 0 else rows)]
    return order


@pytest.mark.parametrize("quality", [10, 50, 75, 90, 95, 100])
def test_tables_are_libjpegs_for_the_quality(quality: int):
    tab = tables(quality)
    ref = io.BytesIO()
    Image.new("RGB", (8, 8)).save(ref, "JPEG", quality=quality, subsampling=2)
    q = Image.open(io.BytesIO(ref.getvalue())).quantization  # natural (row-major) order
    natural = np.zeros((2, 64), np.float32)
    natural[:, _zigzag()] = tab.qtab
    np.testing.assert_array_equal(natural[0], q[0])
    np.testing.assert_array_equal(natural[1], q[1])
    # the header is Pillow's with the frame size cut out: SOF0 precision 8, then height and width
    assert tab.prefix.startswith(b"\xff\xd8") and tab.prefix.endswith(b"\xff\xc0\x00\x11\x08")
    assert tab.suffix.startswith(b"\x03\x01\x22\x00")  # 3 components, Y sampled 2x2 with table 0


def test_standard_huffman_codes():
    tab = tables(90)
    dc_code, dc_len = tab.huff[0:32].reshape(2, 16), tab.huff[32:64].reshape(2, 16)
    ac_code, ac_len = tab.huff[64:576].reshape(2, 256), tab.huff[576:1088].reshape(2, 256)
    assert (dc_code[0, 0], dc_len[0, 0]) == (0b00, 2) and (dc_code[0, 1], dc_len[0, 1]) == (0b010, 3)
    assert (ac_code[0, 0x00], ac_len[0, 0x00]) == (0b1010, 4)  # luminance EOB
    assert (ac_code[0, 0xF0], ac_len[0, 0xF0]) == (0b11111111001, 11)  # luminance ZRL
    assert (ac_code[1, 0x00], ac_len[1, 0x00]) == (0b00, 2)  # chrominance EOB
    # canonical codes are prefix-free
    codes = huffman_codes(bytes([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]), bytes(range(12)))
    strings = [format(c, f"0{n}b") for c, n in codes.values()]
    assert not any(a != b and b.startswith(a) for a in strings for b in strings)


def test_kernel_zigzag_and_dct_basis():
    body = KERNEL.read_text()
    table = re.search(r"kZigzag\[64\] = \{([^}]*)\}", body).group(1)
    where = [int(x) for x in table.replace("\n", " ").split(",")]  # natural index -> zigzag position
    assert [where[nat] for nat in _zigzag()] == list(range(64))
    c = dct_matrix()
    np.testing.assert_allclose(c @ c.T, np.eye(8), atol=1e-6)  # orthonormal: the JPEG FDCT is c f c^T


SIZES = [(1, 1), (7, 9), (16, 16), (17, 33), (224, 224), (333, 500), (8, 200), (255, 3)]


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return 10 * np.log10(255**2 / max(float(np.mean((a.astype(np.float64) - b) ** 2)), 1e-9))


@pytest.mark.gpu
@pytest.mark.parametrize("quality", [50, 90, 95])
def test_batched_encoder_matches_pillow(quality: int):
    import cupy as cp

    from gpubatch.engine.batch import PinnedStaging
    from gpubatch.engine.codecs.jpeg_gpu import BatchedJpegEncoder
    from gpubatch.engine.device import resolve

    resolve("gpu")
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]
    enc = BatchedJpegEncoder(cp, PinnedStaging(cp))
    stream = cp.cuda.Stream(non_blocking=True)
    out = enc.encode([cp.asarray(im) for im in imgs], quality, stream)
    assert out == enc.encode([cp.asarray(im) for im in imgs], quality, stream)  # deterministic
    # each image is encoded on its own: the same bytes in any batch
    assert out[3:5] == enc.encode([cp.asarray(im) for im in imgs[3:5]], quality, stream)
    for im, data in zip(imgs, out):
        got = Image.open(io.BytesIO(data))
        assert got.format == "JPEG" and got.size == (im.shape[1], im.shape[0])
        dec = np.asarray(got.convert("RGB"))
        ref = io.BytesIO()
        Image.fromarray(im).save(ref, "JPEG", quality=quality, subsampling=2)
        pil = np.asarray(Image.open(ref).convert("RGB"))
        assert np.abs(dec.astype(int) - pil).mean() < 3.0
        if im.size > 10_000:  # edge blocks are padded differently: compare where they do not dominate
            assert _psnr(dec, im) > _psnr(pil, im) - 0.3, im.shape  # as good as libjpeg's at the quality
            assert 0.9 < len(data) / ref.tell() < 1.1  # same tables: about the same size


@pytest.mark.gpu
def test_spans_into_a_buffer_of_the_encoders_own_make_the_same_files():
    """With ``Sink(None)`` the batch's entropy-coded data lands in one host buffer the encoder makes, and
    the spans assembled (as the shards' writer does, after the payload travelled pickled) are the files
    the encoder gives as bytes."""
    import functools
    import pickle

    import cupy as cp

    from gpubatch.engine.batch import PinnedStaging
    from gpubatch.engine.codecs.jpeg_gpu import BatchedJpegEncoder, EncodedSpan, Sink, assembled
    from gpubatch.engine.device import resolve
    from gpubatch.types import Record

    resolve("gpu")
    imgs = [cp.asarray(photo(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]
    enc = BatchedJpegEncoder(cp, PinnedStaging(cp))
    stream = cp.cuda.Stream(non_blocking=True)
    files = enc.encode(imgs, 90, stream)
    sink = Sink(None)
    spans = enc.encode(imgs, 90, stream, sink)
    assert all(isinstance(s, EncodedSpan) for s in spans) and sink.pos == len(sink.view)
    records = [Record(key=f"k{i}", data=s) for i, s in enumerate(spans)]
    payload = pickle.loads(pickle.dumps(functools.partial(assembled, records, sink.view[: sink.pos])))
    assert [r.data for r in payload(None)] == files
