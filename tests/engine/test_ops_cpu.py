"""The step ops' CPU references: against PIL where the definition is PIL's, exact identities, box movement
checked against the pixels that moved, and parameter validation."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from gpubatch.engine.ops import (
    OPS,
    Affine,
    AutoAugment,
    AutoContrast,
    Brightness,
    ColorJitter,
    Contrast,
    Equalize,
    Expand,
    Flip,
    GaussianBlur,
    GaussianNoise,
    Grayscale,
    Hue,
    Invert,
    JpegQuality,
    Pad,
    Perspective,
    PhotometricDistort,
    Posterize,
    RandAugment,
    RandomErasing,
    RandomIoUCrop,
    Rotate,
    Rotate90,
    Saturation,
    Sharpness,
    Solarize,
    TrivialAugment,
)
from gpubatch.engine.ops.pixel import run_steps_host
from gpubatch.engine.plan import Plan
from gpubatch.engine.registry import HOST, get_kernel
from gpubatch.errors import UsageError
from gpubatch.types import Boxes
from tests.helpers import photo


def apply(op, img, params=True):
    return run_steps_host(op, img, params)


@pytest.fixture(scope="module")
def img():
    return photo(96, 128, seed=5)


def test_rotate90_is_exact(img):
    for k in range(4):
        assert np.array_equal(apply(Rotate90(k=k), img, k), np.rot90(img, k))


@pytest.mark.parametrize("op,pil", [
    (Equalize(), ImageOps.equalize), (Invert(), ImageOps.invert),
    (Posterize(bits=3), lambda im: ImageOps.posterize(im, 3)), (Solarize(threshold=100), lambda im: ImageOps.solarize(im, 100)),
])
def test_matches_pil_exactly(img, op, pil):
    assert np.array_equal(apply(op, img), np.asarray(pil(Image.fromarray(img))))


def test_autocontrast_and_sharpness_match_pil(img):
    low = (img // 2 + 40).astype(np.uint8)
    ours = apply(AutoContrast(), low).astype(int)
    assert np.abs(ours - np.asarray(ImageOps.autocontrast(Image.fromarray(low)), int)).max() <= 1
    ours = apply(Sharpness(factor=1.8), img, 1.8).astype(int)
    ref = np.asarray(ImageEnhance.Sharpness(Image.fromarray(img)).enhance(1.8), int)
    assert np.abs(ours - ref).max() <= 2


def test_colour_identities(img):
    assert np.array_equal(apply(Brightness(), img, 1.0), img)
    assert np.array_equal(apply(Saturation(), img, 1.0), img)
    assert np.abs(apply(Hue(), img, 0.0).astype(int) - img).max() <= 1
    twice = apply(Hue(), apply(Hue(), img, 0.25), -0.25)
    assert np.abs(twice.astype(int) - img).mean() < 1.5
    grey = apply(Grayscale(), img)
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 1], grey[..., 2])
    assert np.abs(apply(Saturation(), img, 0.0).astype(int) - grey).max() <= 1
    flat = apply(Contrast(), img, 0.0)
    assert flat.min() == flat.max()
    dark = apply(Brightness(), img, 0.5).astype(int)
    assert np.abs(dark - np.rint(img * 0.5)).max() <= 1


def test_blur_noise_erase(img):
    const = np.full((40, 30, 3), 77, np.uint8)
    assert np.array_equal(apply(GaussianBlur(kernel_size=9), const, 3.0), const)
    blurred = apply(GaussianBlur(kernel_size=7), img, 2.0)
    assert blurred.astype(float).std() < img.astype(float).std()
    assert np.abs(apply(GaussianBlur(kernel_size=3), img, 0.01).astype(int) - img).max() == 0
    noisy = apply(GaussianNoise(), const, (10.0, 123)).astype(float)
    assert 9.0 < noisy.std() < 11.0 and abs(noisy.mean() - 77) < 0.5
    assert np.array_equal(apply(GaussianNoise(), const, (10.0, 123)), noisy.astype(np.uint8))
    erased = apply(RandomErasing(value=(1, 2, 3)), img, (5, 6, 10, 20, 0))
    assert (erased[5:15, 6:26] == [1, 2, 3]).all() and np.array_equal(erased[20:], img[20:])


def test_warp_identities(img):
    assert np.array_equal(apply(Affine(), img, (0.0, 0, 0, 1.0, 0.0, 0.0)), img)
    assert np.array_equal(apply(Rotate(), img, 0.0), img)
    shifted = apply(Affine(), img, (0.0, 7, -3, 1.0, 0.0, 0.0))
    assert np.array_equal(shifted[:93, 7:], img[3:, :121])  # out(x, y) = in(x - 7, y + 3)
    assert (shifted[:, :7] == 0).all()
    big = apply(Rotate(expand=True), img, 90.0)
    assert big.shape == (128, 96, 3)


def _white_box(h=120, w=160, box=(40, 30, 90, 70)):
    im = np.zeros((h, w, 3), np.uint8)
    x0, y0, x1, y1 = box
    im[y0:y1, x0:x1] = 255
    return im, Boxes([box], [1], (h, w))


def _pixel_box(im):
    ys, xs = np.nonzero(im[..., 0] > 127)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)


@pytest.mark.parametrize("op", [
    Rotate(degrees=25), Rotate(degrees=(90, 90), expand=True), Rotate90(k=1), Rotate90(k=3),
    Affine(degrees=10, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10), Perspective(p=1.0),
    Flip(p=1.0), Pad(padding=(3, 5, 7, 9)), Expand(p=1.0), RandomIoUCrop(options=(0.0,)),
    RandAugment(magnitude=20), TrivialAugment(),
], ids=lambda op: op.name)
def test_boxes_move_with_pixels(op):
    im, boxes = _white_box()
    for key in ("a", "b", "c", "d"):
        plan = Plan(ops=(op,), seed=11)
        params, moved, dropped = plan.draw_and_move(key, 120, 160, boxes)
        out = get_kernel(op.name, HOST)(op, [im], params)[0]
        assert out.shape[:2] == op.out_hw(120, 160, params[0])
        if dropped:
            continue
        if (out[..., 0] > 127).sum() < 20:
            continue  # the rectangle left the image (or was recoloured by a colour pick)
        got = _pixel_box(out)
        want = moved.xyxy[0]
        if isinstance(op, (Rotate, Affine, Perspective, RandAugment, TrivialAugment)):
            # a rotated rectangle's pixels stay inside the moved (enclosing) box, touching it
            assert (got >= [want[0] - 2, want[1] - 2, 0, 0]).all() and (got[2:] <= want[2:] + 2).all(), (params, got, want)
            continue
        assert np.abs(got - want).max() <= 1.5, (params, got, want)


def test_polygons_move_with_boxes():
    seg = [[40.0, 30.0, 90.0, 30.0, 90.0, 70.0, 40.0, 70.0]]
    boxes = Boxes([[40, 30, 90, 70]], [1], (120, 160), extra=({"segmentation": seg, "area": 2000.0},))
    moved, _ = boxes.warp(np.array([[0.0, 1, 0], [-1, 0, 160], [0, 0, 1]]), (160, 120))
    poly = np.array(moved.extra[0]["segmentation"][0]).reshape(-1, 2)
    assert np.allclose(poly.min(0), moved.xyxy[0][:2]) and np.allclose(poly.max(0), moved.xyxy[0][2:])
    assert moved.extra[0]["area"] == pytest.approx(2000.0)


@pytest.mark.parametrize("compressed", [False, True])
def test_rle_masks_move_with_boxes(compressed):
    from pycocotools import mask as mask_api

    mask = np.zeros((120, 160), np.uint8)
    mask[30:70, 40:90] = 1
    mask[50:60, 100:103] = 1  # a second, thin region
    coded = mask_api.encode(np.asfortranarray(mask))
    if compressed:
        rle = {"size": [120, 160], "counts": coded["counts"].decode("ascii")}
    else:  # uncompressed counts, as COCO's instance files hold crowd regions
        flat = mask.ravel(order="F")
        edges = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
        rle = {"size": [120, 160], "counts": np.diff(edges).tolist()}
    boxes = Boxes([[40, 30, 103, 70]], [1], (120, 160), iscrowd=[1],
                  extra=({"segmentation": rle, "area": float(mask.sum())},))

    def decoded(seg):
        assert isinstance(seg["counts"], str if compressed else list)
        h, w = seg["size"]
        counts = seg["counts"]
        return mask_api.decode(mask_api.frPyObjects(seg, h, w) if isinstance(counts, list)
                               else {"size": [h, w], "counts": counts.encode("ascii")})

    turned, _ = boxes.warp(np.array([[0.0, 1, 0], [-1, 0, 160], [0, 0, 1]]), (160, 120))  # 90 degrees
    assert np.array_equal(decoded(turned.extra[0]["segmentation"]), np.rot90(mask, 1))
    assert turned.extra[0]["area"] == mask.sum()
    flipped, _ = boxes.warp(np.array([[-1.0, 0, 160], [0, 1, 0], [0, 0, 1]]), (120, 160))
    assert np.array_equal(decoded(flipped.extra[0]["segmentation"]), mask[:, ::-1])
    half, _ = boxes.affine(0.5, 0.5, 0, 0, (60, 80))
    small = decoded(half.extra[0]["segmentation"])
    assert small.shape == (60, 80) and np.array_equal(small, mask[1::2, 1::2])
    cropped, _ = boxes.affine(1, 1, -40, -30, (40, 40))  # a crop keeping part of the first region only
    assert np.array_equal(decoded(cropped.extra[0]["segmentation"]), mask[30:70, 40:80])


def test_params_reproducible_and_varied():
    plan = Plan(ops=(ColorJitter(0.4, 0.4, 0.4, 0.1), RandAugment(), AutoAugment(), RandomErasing(p=1.0)), seed=3)
    assert plan.draw("k", 100, 100) == plan.draw("k", 100, 100)
    assert plan.draw("k", 100, 100) != plan.draw("j", 100, 100)
    orders = {tuple(n for n, _ in Plan(ops=(ColorJitter(0.4, 0.4, 0.4, 0.1),), seed=s).draw("k", 9, 9)[0]) for s in range(40)}
    assert len(orders) > 6  # the jitter order is random per image


def test_iou_crop_keeps_an_overlapping_box():
    boxes = Boxes([[10, 10, 50, 50], [100, 60, 150, 110]], [1, 2], (120, 160))
    op = RandomIoUCrop(options=(0.5,))
    for key in "abcdefgh":
        params = Plan(ops=(op,), seed=1).draw(key, 120, 160, boxes)[0]
        if params is None:
            continue
        top, left, ch, cw = params
        b = boxes.xyxy.astype(float)
        iw = np.clip(np.minimum(b[:, 2], left + cw) - np.maximum(b[:, 0], left), 0, None)
        ih = np.clip(np.minimum(b[:, 3], top + ch) - np.maximum(b[:, 1], top), 0, None)
        iou = iw * ih / ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) + cw * ch - iw * ih)
        assert iou.max() >= 0.5


@pytest.mark.parametrize("make", [
    lambda: ColorJitter(brightness=-1), lambda: Hue(shift=0.7), lambda: Posterize(bits=9),
    lambda: GaussianBlur(kernel_size=4), lambda: Rotate(fill=300), lambda: Affine(translate=(2, 0)),
    lambda: Rotate90(k=(3, 1)), lambda: RandAugment(magnitude=40), lambda: AutoAugment(policy="cifar"),
    lambda: Pad(padding=(1, 2, 3)), lambda: Expand(side_range=(0.5, 2)), lambda: RandomErasing(p=2),
    lambda: Rotate(interpolation="cubic"), lambda: Solarize(threshold=-1),
])
def test_bad_parameters_are_usage_errors(make):
    with pytest.raises(UsageError):
        make()


def test_every_op_has_a_host_kernel():
    for name, cls in OPS.items():
        if cls.kind != "temporal":  # a video's frame pickers run before decoding (tests/video)
            get_kernel(name, HOST)


def test_record_errors_cross_processes():
    import pickle

    from gpubatch.errors import RecordError, Stage

    e = pickle.loads(pickle.dumps(RecordError("k", "a.tar#k", Stage.DECODE, "truncated")))
    assert (e.key, e.origin, e.stage, e.reason) == ("k", "a.tar#k", Stage.DECODE, "truncated")


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32"])
def test_normalize_table_equals_the_formula(layout: str, dtype: str):
    """The CPU normalize looks uint8 pixels up in a per-channel table: the same values, pixel for pixel,
    as computing (v / 255 - mean) / std for each."""
    from gpubatch.engine.ops.normalize import Normalize, _values, normalize_cpu

    op = Normalize(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), layout=layout, dtype=dtype)
    img = np.random.default_rng(1).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    want = _values(img, op)
    want = np.ascontiguousarray(want.transpose(2, 0, 1)) if layout == "CHW" else want
    got = normalize_cpu(img, op)
    assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("chain", ["train", "val", "pad"])
def test_host_chain_folds_windows_like_the_ops_one_by_one(chain):
    """The CPU path folds a run of window ops into one Pillow resample (as the GPU folds them into one
    launch); the result is what running the ops one by one gives, within one level of rounding."""
    from gpubatch.engine.host_chain import run_chain_host
    from gpubatch.engine.ops import CenterCrop, Normalize, RandomResizedCrop, ResizeShorter

    ops = {"train": (RandomResizedCrop(64), Flip(p=1.0), Normalize(layout="CHW", dtype="float32")),
           "val": (ResizeShorter(80), CenterCrop(64), Normalize(dtype="uint8")),
           "pad": (Pad(6, fill=(10, 200, 30)), Flip(p=1.0), Grayscale())}[chain]
    plan = Plan(ops=ops, seed=1)
    for k in range(4):
        src = photo(90 + 17 * k, 130 - 9 * k, seed=k)
        params = plan.draw(f"r{k}", *src.shape[:2])
        ref = src
        for op, p in zip(ops, params):
            ref = get_kernel(op.name, HOST)(op, [ref], [p])[0]
        got = run_chain_host(ops, Image.fromarray(src), params)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        tol = 1.0 / (255 * 0.224) + 1e-6 if chain == "train" else 1
        assert np.abs(got.astype(np.float64) - ref.astype(np.float64)).max() <= tol
        np.testing.assert_array_equal(run_chain_host(ops, src, params), got)  # array in, same pixels


def test_keypoint_flips_pair_left_and_right_names():
    from gpubatch.types import keypoint_flips

    cats = [{"id": 1, "keypoints": ["nose", "left_eye", "right_eye", "left_ear", "right_ear"]},
            {"id": 2, "keypoints": ["Neck", "LShoulder", "RShoulder", "l_hip", "r_hip", "Lip"]},
            {"id": 3, "keypoints": ["a", "b"]}, {"id": 4, "name": "no keypoints"}]
    assert keypoint_flips(cats) == {1: (0, 2, 1, 4, 3), 2: (0, 2, 1, 4, 3, 5)}


def test_policy_spaces_are_the_published_ones():
    """RandAugment/AutoAugment and TrivialAugment's wide space, against the magnitudes torchvision publishes
    (transforms/autoaugment.py, _augmentation_space): top of each range, signs and the posterize bins."""
    from gpubatch.engine.ops.policies import _space

    h, w = 200, 331
    narrow = _space(31, h, w, wide=False, identity=True)
    tops = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150.0, "TranslateY": 150.0 / 331 * 200, "Rotate": 30.0,
            "Brightness": 0.9, "Color": 0.9, "Contrast": 0.9, "Sharpness": 0.9}
    for name, top in tops.items():
        mags, signed = narrow[name]
        assert signed and len(mags) == 31 and mags[0] == 0 and abs(mags[-1] - top) < 1e-9, name
    assert narrow["Posterize"][0].tolist() == [8 - round(i / 7.5) for i in range(31)]
    assert narrow["Solarize"][0][0] == 255 and narrow["Solarize"][0][-1] == 0 and not narrow["Solarize"][1]
    assert set(narrow) == set(tops) | {"Identity", "Posterize", "Solarize", "AutoContrast", "Equalize"}
    wide = _space(31, h, w, wide=True, identity=True)
    for name, top in {"ShearX": 0.99, "TranslateX": 32.0, "TranslateY": 32.0, "Rotate": 135.0, "Color": 0.99}.items():
        assert abs(wide[name][0][-1] - top) < 1e-9, name
    assert wide["Posterize"][0].tolist() == [8 - round(i / 5) for i in range(31)]


@pytest.mark.parametrize("op", [ColorJitter(0.4, 0.4, 0.4, 0.1), PhotometricDistort(p=1.0)], ids=lambda op: op.name)
def test_colour_policies_are_their_single_ops_in_the_drawn_order(img, op):
    """ColorJitter and PhotometricDistort apply brightness, contrast, saturation and hue as the single ops
    (each checked against PIL or identities above) would, in the order and with the factors drawn."""
    singles = {"brightness": Brightness(), "contrast": Contrast(), "saturation": Saturation(), "hue": Hue()}
    for k in range(6):
        (params,) = Plan(ops=(op,), seed=k).draw("a", *img.shape[:2])
        want = img
        for name, factor in params:
            want = apply(singles[name], want, factor)
        assert np.array_equal(apply(op, img, params), want), params


def test_jpeg_quality_is_pillows_round_trip(img):
    """JpegQuality on the CPU is a round trip through Pillow's JPEG codec at the drawn quality."""
    import io

    for q in (15, 50, 90):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=q)
        ref = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), int)
        got = get_kernel("jpeg_quality", HOST)(JpegQuality(quality=q), [img], [q])[0].astype(int)
        assert got.shape == img.shape and np.abs(got - ref).mean() < 0.5, q
    assert get_kernel("jpeg_quality", HOST)(JpegQuality(p=0.0), [img], [None])[0] is img
