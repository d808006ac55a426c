"""Host codecs and ops: colour modes, EXIF, sizes, boxes; the CPU reference of the GPU engine."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from gpubatch import convert
from gpubatch.api import open_dataset
from gpubatch.engine.codecs.headers import jpeg_subsampling, probe
from gpubatch.engine.codecs.image import check_encoded, decode, encode
from gpubatch.engine.ops.geometry import CenterCrop, ResizeShorter, crop_pad_cpu, resize_cpu
from gpubatch.errors import RecordError
from gpubatch.types import Boxes, Record
from tests.conftest import SAMPLE
from tests.helpers import jpeg_bytes, photo


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def test_modes_become_rgb():
    arr = photo(40, 60, 1)
    gray = decode(jpeg_bytes(np.asarray(Image.fromarray(arr).convert("L")), 95))
    assert gray.shape == (40, 60, 3) and np.array_equal(gray[..., 0], gray[..., 2])
    buf = io.BytesIO()
    Image.fromarray(arr).convert("CMYK").save(buf, "JPEG", quality=95)
    cmyk = decode(buf.getvalue())
    assert cmyk.shape == (40, 60, 3) and np.abs(cmyk.astype(int) - arr).mean() < 12
    alpha = np.full((40, 60), 255, np.uint8)
    alpha[:10, :10] = 0
    rgba = decode(_png(Image.fromarray(np.dstack([arr, alpha]), "RGBA")))
    assert (rgba[:10, :10] == 255).all() and np.array_equal(rgba[20:, 20:], arr[20:, 20:])
    pal = decode(_png(Image.fromarray(arr).quantize(32)))
    assert pal.shape == (40, 60, 3)


def test_exif_orientation_is_applied():
    arr = photo(48, 80, 2)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated 90 degrees; viewers rotate it back
    buf = io.BytesIO()
    Image.fromarray(arr).transpose(Image.Transpose.ROTATE_90).save(buf, "JPEG", quality=98, exif=exif)
    out = decode(buf.getvalue())
    assert out.shape == (48, 80, 3)
    assert np.abs(out.astype(int) - arr).mean() < 4
    hdr = probe(buf.getvalue())
    assert (hdr.width, hdr.height, hdr.orientation) == (80, 48, 6)


def test_sample_special_images_decode():
    for name in ("bird/bird_000.jpg", "car/car_000.jpg", "flower/flower_000.jpg", "mountain/mountain_000.png",
                 "mountain/mountain_001.png"):
        data = (SAMPLE / "imagenet" / name).read_bytes()
        out = decode(data)
        hdr = probe(data)
        assert out.dtype == np.uint8 and out.shape == (hdr.height, hdr.width, 3)


def test_subsampling_from_header():
    arr = photo(32, 32)
    for sub in ("4:2:0", "4:2:2", "4:4:4"):
        assert jpeg_subsampling(jpeg_bytes(arr, subsampling=sub)) == sub
    assert jpeg_subsampling(jpeg_bytes(arr[..., 0])) == "gray"


def test_max_pixels_is_checked_before_decode():
    with pytest.raises(ValueError, match="exceeds --max-pixels 100"):
        decode(jpeg_bytes(photo(20, 20)), max_pixels=100)


def test_encode_roundtrip():
    arr = photo(50, 70, 3)
    assert np.array_equal(decode(encode(arr, "png")), arr)
    j = encode(arr, "jpeg", 92)
    assert probe(j).subsampling == "4:2:0" and np.abs(decode(j).astype(int) - arr).mean() < 3


def test_check_encoded_tells_truncation_from_trailing_bytes():
    data = jpeg_bytes(photo(64, 64))
    check_encoded(Record("ok", data + b"trailing-junk"), 0)
    with pytest.raises(RecordError, match="decode"):
        check_encoded(Record("t", data[: len(data) // 2]), 0)


def test_a_jpeg_is_ended_by_its_end_marker_padding_after_it_aside():
    from gpubatch.engine.codecs.headers import jpeg_ended

    data = jpeg_bytes(photo(32, 32))
    assert jpeg_ended(data) and jpeg_ended(memoryview(data)) and jpeg_ended(data + b"\x00" * 9 + b"\r\n ")
    assert not jpeg_ended(data[:-1]) and not jpeg_ended(data[: len(data) // 2])
    assert not jpeg_ended(data + b"trailing-junk") and not jpeg_ended(b"") and not jpeg_ended(b"\xd9")


@pytest.mark.parametrize("slot", [False, True])
@pytest.mark.parametrize("direct", [False, True])
def test_the_gpu_decoder_leaves_a_jpeg_without_its_end_to_pillow(slot, direct):
    """``image_gpu.sort_by_kind``: a JPEG cut short or followed by other bytes goes to Pillow (``to_cpu``), as the CPU
    path decodes it (nvJPEG would decode what there is of a cut one); one with padding after its end marker stays on
    the GPU, a kind of its own on the hardware engine's direct path; a record beyond ``max_pixels`` is its error."""
    import io

    from PIL import Image

    from gpubatch.engine.codecs.headers import jpeg_kind
    from gpubatch.engine.codecs.image_gpu import sort_by_kind
    from gpubatch.engine.gpu.slot_views import SlotViews

    good = jpeg_bytes(photo(32, 48))
    png = io.BytesIO()
    Image.fromarray(photo(8, 8)).save(png, "PNG")
    items = [good, good + b"\x00" * 5, good[: len(good) // 2], good + b"trailing-junk", png.getvalue(),
             jpeg_bytes(photo(64, 64)), b""]
    blobs: object = items
    if slot:  # (a feed's slot, whose ends are read at once)
        buf = bytearray(b"".join(items))
        offsets = [sum(map(len, items[:i])) for i in range(len(items))]
        blobs = SlotViews(buf, 0, len(buf), offsets, [len(b) for b in items])
    kinds, dims, groups, to_cpu, errors = sort_by_kind(blobs, None, 48 * 48, direct)
    kind = jpeg_kind(good)[0]
    assert kinds[0] == kind and dims[0] == (48, 32)
    assert kinds[1] == (kind + "/unended" if direct else kind)
    assert to_cpu == [2, 3, 4, 6] and kinds[2] is kinds[3] is None
    assert errors[5] == "image of 64x64 = 4096 pixels exceeds --max-pixels 2304" and errors[:5] == [None] * 5
    assert groups == ({kind: [0], kind + "/unended": [1]} if direct else {kind: [0, 1]})


@pytest.mark.parametrize("hw", [(300, 400), (400, 300), (256, 256), (1, 1), (3, 700)])
def test_resize_shorter_and_center_crop_sizes(hw):
    h, w = hw
    img = photo(h, w)
    rs = ResizeShorter(256)
    oh, ow = rs.out_hw(h, w)
    assert min(oh, ow) == 256 or min(h, w) == 0
    out = resize_cpu(img, oh, ow)
    assert out.shape == (oh, ow, 3)
    cc = CenterCrop(224)
    crop = crop_pad_cpu(out, *cc.origin(oh, ow), 224, 224)
    assert crop.shape == (224, 224, 3)


def test_resize_antialiases_when_downscaling():
    stripes = np.zeros((64, 64, 3), np.uint8)
    stripes[:, ::2] = 255
    small = resize_cpu(stripes, 16, 16)
    assert np.abs(small[:, 1:-1].astype(int) - 127).max() <= 2  # averaged, not aliased to 0 or 255


def test_random_crop_takes_a_window_inside_the_image():
    from gpubatch.engine.ops.geometry import RandomCrop
    from gpubatch.engine.rng import record_rng

    img = np.arange(30 * 50 * 3, dtype=np.uint32).reshape(30, 50, 3).astype(np.uint8)
    seen = set()
    for k in range(50):
        op = RandomCrop(20)
        y0, x0 = op.make_params(30, 50, record_rng(0, f"k{k}"))
        assert 0 <= y0 <= 10 and 0 <= x0 <= 30
        out = crop_pad_cpu(img, *op.window(30, 50, (y0, x0)).as_array()[[0, 2]].astype(int), 20, 20)
        assert np.array_equal(out, img[y0: y0 + 20, x0: x0 + 20])  # a plain slice of the image
        seen.add((y0, x0))
    assert len(seen) > 30  # positions spread over the image
    y0, x0 = RandomCrop(40).make_params(30, 50, record_rng(0, "k"))
    assert y0 == -5 and 0 <= x0 <= 10  # a side shorter than the crop: centred (padded); the other drawn


def test_center_crop_pads_small_images():
    img = np.full((10, 20, 3), 200, np.uint8)
    out = crop_pad_cpu(img, *CenterCrop(16).origin(10, 20), 16, 16)
    assert out.shape == (16, 16, 3) and (out[:3] == 0).all() and (out[3:13] == 200).all()


def test_boxes_affine_clips_and_drops():
    b = Boxes([[10, 10, 50, 50], [90, 90, 120, 120], [0, 0, 5, 5]], [1, 2, 3], (100, 100),
              extra=({"segmentation": [[10, 10, 50, 10, 50, 50]]}, {}, {}))
    out, dropped = b.affine(2.0, 2.0, -20.0, -20.0, (100, 100), min_visible=0.0)
    assert dropped == 2  # the second leaves the canvas, the third is moved off it
    np.testing.assert_allclose(out.xyxy, [[0, 0, 80, 80]])
    assert out.extra[0]["segmentation"] == [[0.0, 0.0, 80.0, 0.0, 80.0, 80.0]]


def test_convert_with_pixel_ops_resizes_everything(imagenet, tmp_path):
    s = convert(imagenet, tmp_path / "o", to="tfrecord", resize_shorter=64, center_crop=56, quality=85,
                device="cpu")
    assert s.records_out == 60 and s.transcoded == 60 and s.device == "cpu"
    with open_dataset(tmp_path / "o") as r:
        for rec in r:
            assert rec.codec in ("jpeg", "png")
            assert decode(rec.data).shape == (56, 56, 3)


def test_image_format_png_converts_every_image(imagenet, tmp_path):
    s = convert(imagenet, tmp_path / "o", to="webdataset", image_format="png", device="cpu", limit=6)
    assert s.transcoded == 6
    with open_dataset(tmp_path / "o") as r:
        assert {rec.codec for rec in r} == {"png"}


def test_quality_alone_reencodes_jpegs_only(imagenet, tmp_path):
    s = convert(imagenet, tmp_path / "o", to="lmdb", quality=50, device="cpu")
    assert s.transcoded == 58 and s.passthrough == 2


def test_boxes_are_rescaled_with_the_pixels(coco, tmp_path):
    convert(coco, tmp_path / "o", to="tfrecord", resize_shorter=100, device="cpu")
    src = {r.key: r for r in open_dataset(coco)}
    for rec in open_dataset(tmp_path / "o"):
        orig = src[rec.key]
        oh, ow = orig.boxes.canvas
        h, w = decode(rec.data).shape[:2]
        assert rec.boxes.canvas == (h, w) and min(h, w) == 100
        scale = np.array([w / ow, h / oh, w / ow, h / oh], np.float32)
        np.testing.assert_allclose(rec.boxes.xyxy, orig.boxes.xyxy * scale, atol=0.05)


def test_center_crop_clips_boxes_and_counts_drops(coco, tmp_path):
    s = convert(coco, tmp_path / "o", to="coco", center_crop=60, device="cpu")
    total = sum(len(r.boxes) for r in open_dataset(tmp_path / "o"))
    assert total + s.boxes_dropped == 31 and s.boxes_dropped > 0
    for r in open_dataset(tmp_path / "o"):
        assert (r.boxes.xyxy >= 0).all() and (r.boxes.xyxy <= 60).all()
