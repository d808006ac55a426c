"""``augment`` on the GPU: every preset end to end, GPU vs CPU (same drawn parameters, pixels within the
ops' tolerance) and byte-identical reruns (marked gpu: skipped without a usable GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gpubatch
from gpubatch.api import open_dataset
from gpubatch.engine.codecs import image as host
from gpubatch.engine.spec import PRESETS

pytestmark = pytest.mark.gpu


def _records(path):
    with open_dataset(path) as r:
        return {rec.key: rec for rec in r}


def _log(path):
    return {e["key"]: e for e in map(json.loads, (path / "augment-params.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_on_gpu_matches_cpu(preset, imagenet, coco, tmp_path):
    src = coco if preset == "ssd" else imagenet
    kw = dict(preset=preset, copies=2, seed=3, quality=95)
    g = gpubatch.augment(src, tmp_path / "gpu", device="gpu", **kw)
    c = gpubatch.augment(src, tmp_path / "cpu", device="cpu", **kw)
    assert g.records_out == c.records_out == 2 * g.records_in and not g.skipped
    assert _log(tmp_path / "gpu") == _log(tmp_path / "cpu")  # the same parameters on both devices
    gr, cr = _records(tmp_path / "gpu"), _records(tmp_path / "cpu")
    diffs = []
    for k, r in gr.items():
        a, b = host.decode(r.data).astype(int), host.decode(cr[k].data).astype(int)
        assert a.shape == b.shape, k
        diffs.append(np.abs(a - b).mean())
        if r.boxes is not None:
            np.testing.assert_allclose(r.boxes.xyxy, cr[k].boxes.xyxy, atol=1e-3)
    # two JPEG codecs at q95 plus resampling/rounding differences; the sample set has CMYK, EXIF and
    # palette images the GPU and Pillow decode slightly differently
    assert np.median(diffs) < 2.5 and max(diffs) < 12, (preset, np.median(diffs), max(diffs))


def test_gpu_rerun_is_byte_identical(imagenet, tmp_path):
    chain = "random_resized_crop(size=128) | color_jitter(0.4, 0.4, 0.4, 0.1) | randaugment() | gaussian_blur(kernel_size=5)"
    for name in ("a", "b"):
        gpubatch.augment(imagenet, tmp_path / name, ops=chain, copies=2, seed=11, device="gpu")
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert a.keys() == b.keys() and all(a[k].data == b[k].data for k in a)


def test_worker_processes_give_the_same_output(imagenet, tmp_path):
    bad = next(imagenet.rglob("*.jpg"))
    bad.write_bytes(bad.read_bytes()[:300])
    kw = dict(preset="randaugment", copies=2, seed=5, batch_size=8, device="gpu")
    one = gpubatch.augment(imagenet, tmp_path / "one", gpu_procs=1, **kw)
    three = gpubatch.augment(imagenet, tmp_path / "three", gpu_procs=3, **kw)
    assert one.records_out == three.records_out and len(one.skipped) == len(three.skipped) == 1
    assert one.transcoded == three.transcoded and one.records_in == three.records_in
    a, b = _records(tmp_path / "one"), _records(tmp_path / "three")
    assert list(a) == list(b) and all(a[k].data == b[k].data for k in a)
    assert _log(tmp_path / "one") == _log(tmp_path / "three")
    c = gpubatch.convert(imagenet, tmp_path / "conv", to="webdataset", resize_shorter=64, gpu_procs=2, batch_size=8,
                         device="gpu")
    assert c.records_out == c.records_in - 1
