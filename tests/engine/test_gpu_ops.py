"""Every op's GPU path (step kernels, fused windows, custom kernels) against its CPU reference, on a ragged
batch of real-looking images (marked gpu: skipped without a usable GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from gpubatch.engine.device import resolve
from gpubatch.engine.ops import (
    Affine,
    AutoAugment,
    AutoContrast,
    Brightness,
    CenterCrop,
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
    Normalize,
    Pad,
    Perspective,
    PhotometricDistort,
    Posterize,
    RandAugment,
    RandomCrop,
    RandomErasing,
    RandomIoUCrop,
    RandomResizedCrop,
    Resize,
    ResizeShorter,
    Rotate,
    Rotate90,
    Saturation,
    Sharpness,
    Solarize,
    TrivialAugment,
)
from gpubatch.engine.plan import Plan
from gpubatch.engine.registry import HOST, get_kernel
from gpubatch.types import Boxes
from tests.helpers import photo

pytestmark = pytest.mark.gpu

SIZES = [(120, 160), (97, 203), (64, 64), (31, 17), (200, 150), (5, 9)]
EXACT = "exact"
OPS = {
    "brightness": ((Brightness(factor=(0.5, 1.5)),), 1),
    "contrast": ((Contrast(factor=(0.3, 1.7)),), 1),
    "saturation": ((Saturation(factor=(0.0, 2.0)),), 1),
    "hue": ((Hue(shift=(-0.5, 0.5)),), 2),
    "color_jitter": ((ColorJitter(0.4, 0.4, 0.4, 0.1),), 2),
    "grayscale": ((Grayscale(),), 1),
    "solarize": ((Solarize(threshold=100),), EXACT),
    "posterize": ((Posterize(bits=3),), EXACT),
    "invert": ((Invert(),), EXACT),
    "equalize": ((Equalize(),), EXACT),
    "autocontrast": ((AutoContrast(),), 1),
    "sharpness": ((Sharpness(factor=(0.0, 3.0)),), 1),
    "gaussian_blur": ((GaussianBlur(kernel_size=(7, 5), sigma=(0.5, 3.0)),), 1),
    "gaussian_noise": ((GaussianNoise(sigma=(5, 20)),), 1),
    "random_erasing": ((RandomErasing(p=1.0, value="random"),), 1),
    "rotate": ((Rotate(degrees=45, fill=(10, 20, 30)),), 2),
    "rotate_expand_nearest": ((Rotate(degrees=180, expand=True, interpolation="nearest"),), 2),
    "rotate90": ((Rotate90(k=(0, 3)),), EXACT),
    "affine": ((Affine(degrees=20, translate=(0.1, 0.2), scale=(0.7, 1.3), shear=(-10, 10, -5, 5)),), 2),
    "perspective": ((Perspective(p=1.0, fill=99),), 2),
    "pad": ((Pad(padding=(3, 4, 5, 6), fill=(255, 0, 7)),), EXACT),
    "random_crop": ((RandomCrop(size=40),), EXACT),
    "randaugment": ((RandAugment(num_ops=3, magnitude=15),), 2),
    "trivialaugment": ((TrivialAugment(),), 2),
    "autoaugment": ((AutoAugment(),), 2),
    "photometric_distort": ((PhotometricDistort(p=1.0),), 2),
    "mixed_chain": ((Rotate(degrees=10), ColorJitter(0.3, 0.3), Equalize(), Resize(64, 80), Pad(padding=2)), 3),
    "step_then_normalize": ((GaussianBlur(kernel_size=3), Normalize(layout="CHW", dtype="float32")), 0.02),
}


@pytest.fixture(scope="module")
def engine():
    from gpubatch.engine.gpu.engine import GpuEngine

    eng = GpuEngine(resolve("gpu"), cpu_threads=4)
    yield eng
    eng.close()


def _cpu(plan: Plan, key: str, img: np.ndarray, params) -> np.ndarray:
    for op, p in zip(plan.ops, params):
        img = get_kernel(op.name, HOST)(op, [img], [p])[0]
    return img


def _gpu(engine, plan: Plan, imgs, params):
    import cupy as cp

    from gpubatch.engine.batch import Ragged
    from gpubatch.engine.gpu.chain import run_chain

    batch = run_chain(engine, plan.ops, Ragged.from_items(cp, [cp.asarray(im) for im in imgs]), params)
    engine.stream.synchronize()
    return [batch.item(i).get() for i in range(len(imgs))]


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_cpu_reference(engine, name):
    ops, tol = OPS[name]
    plan = Plan(ops=ops, seed=5)
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate(SIZES * 2)]
    params = [plan.draw(f"k{i}", *im.shape[:2]) for i, im in enumerate(imgs)]
    got = _gpu(engine, plan, imgs, params)
    for i, im in enumerate(imgs):
        ref = _cpu(plan, f"k{i}", im, params[i])
        assert got[i].shape == ref.shape, (name, i, params[i])
        diff = np.abs(got[i].astype(np.float64) - ref.astype(np.float64))
        if tol == EXACT:
            assert diff.max() == 0, (name, i, params[i], diff.max())
        else:
            # float rounding may flip a level; a nearest-neighbour tap may land on the next pixel
            assert diff.mean() < 0.25 * tol and (diff > tol).mean() < 0.003, (name, i, params[i], diff.max(), diff.mean())


# chains with parity tests of their own below (tests/engine/test_op_coverage.py counts them too)
JPEG_CHAIN = (JpegQuality(quality=(20, 60)),)
SSD_CHAIN = (PhotometricDistort(), Expand(p=1.0), RandomIoUCrop(), Flip(), Resize(300, 300))


def test_jpeg_quality_degrades_like_pillow(engine):
    plan = Plan(ops=JPEG_CHAIN, seed=2)
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate(SIZES[:5])]
    params = [plan.draw(f"k{i}", *im.shape[:2]) for i, im in enumerate(imgs)]
    got = _gpu(engine, plan, imgs, params)
    for i, im in enumerate(imgs):
        ref = _cpu(plan, f"k{i}", im, params[i])
        assert got[i].shape == ref.shape
        assert np.abs(got[i].astype(int) - ref).mean() < 3.0  # two JPEG codecs at the same quality
        assert np.abs(got[i].astype(int) - im).mean() > 0.5  # and it did degrade


def test_ssd_chain_with_boxes_matches_cpu(engine):
    plan = Plan(ops=SSD_CHAIN, seed=9)
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate([(240, 320), (300, 200), (180, 180)])]
    boxes = Boxes([[20, 30, 120, 140], [60, 10, 170, 90]], [1, 2], (180, 180))
    params, moved = [], []
    for i, im in enumerate(imgs):
        b, _ = boxes.affine(im.shape[1] / 180, im.shape[0] / 180, 0, 0, im.shape[:2])
        p, m, _ = plan.draw_and_move(f"k{i}", *im.shape[:2], b)
        params.append(p)
        moved.append(m)
    got = _gpu(engine, plan, imgs, params)
    for i, im in enumerate(imgs):
        ref = _cpu(plan, f"k{i}", im, params[i])
        assert got[i].shape == ref.shape == (300, 300, 3)
        diff = np.abs(got[i].astype(int) - ref)
        # fused windows read real pixels where the CPU's one-by-one resizes blend in the fill colour,
        # which differs only along the canvas edge
        assert np.median(diff) <= 1 and diff.mean() < 2.0, (i, params[i], diff.mean())
        assert moved[i] is not None and moved[i].canvas == (300, 300)


def test_batched_steps_equal_one_by_one_and_reproducible(engine):
    plan = Plan(ops=(RandAugment(), ColorJitter(0.4, 0.4, 0.4, 0.1), Equalize(p=0.5)), seed=4)
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]
    params = [plan.draw(f"k{i}", *im.shape[:2]) for i, im in enumerate(imgs)]
    together = _gpu(engine, plan, imgs, params)
    again = _gpu(engine, plan, imgs, params)
    for i in range(len(imgs)):
        assert np.array_equal(together[i], again[i])
        assert np.array_equal(together[i], _gpu(engine, plan, [imgs[i]], [params[i]])[0])


def test_window_chain_after_steps_keeps_fill_segments(engine):
    from gpubatch.engine.windows import segments

    ops = (Expand(fill=(1, 2, 3)), CenterCrop(500), Rotate(), RandomResizedCrop(64), ResizeShorter(32), Flip())
    assert segments(ops) == [("window", [0]), ("window", [1]), ("step", [2]), ("window", [3, 4, 5])]
