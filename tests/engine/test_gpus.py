"""Every GPU of a node (``--gpus``): the dataset is the one-GPU dataset byte for byte, for images, video
and audio (marked gpu; skipped on a machine of fewer than 2 GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubatch.api import augment, convert
from tests.engine.test_shards import digest

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CUDA here
        return 0


needs_two = pytest.mark.skipif(_gpus() < 2, reason="needs 2 or more GPUs")


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    from tests.helpers import jpeg_bytes, photo

    root = tmp_path_factory.mktemp("gpus-photos")
    for i in range(96):
        folder = root / f"c{i % 3}"
        folder.mkdir(exist_ok=True)
        (folder / f"{i:04d}.jpg").write_bytes(jpeg_bytes(photo(360 + 8 * (i % 5), 480, seed=i), 80 + i % 15))
    return root


@needs_two
def test_images_on_every_gpu_are_the_one_gpu_bytes(photos, tmp_path):
    chain = dict(to="webdataset", resize_shorter=256, center_crop=224, quality=90, device="gpu", shard_size=8)
    one = convert(photos, tmp_path / "one", **chain)
    every = convert(photos, tmp_path / "all", gpus="all", **chain)
    assert every.records_out == one.records_out == 96 and not every.skipped
    assert len(every.per_gpu) == _gpus() and sum(g["records"] for g in every.per_gpu.values()) == 96
    assert every.bound and every.gpu_memory.get("per_gpu_mib")
    assert digest(tmp_path / "all") == digest(tmp_path / "one")
    two = convert(photos, tmp_path / "two", gpus="0,1", gpu_procs=2, **chain)
    assert two.workers == 4 and digest(tmp_path / "two") == digest(tmp_path / "one")


@needs_two
def test_augment_on_every_gpu_is_the_one_gpu_dataset(photos, tmp_path):
    opts = dict(preset="resnet50-train", copies=2, shard_size=16, to="tfrecord", device="gpu", seed=3)
    augment(photos, tmp_path / "one", **opts)
    augment(photos, tmp_path / "all", gpus="all", **opts)
    assert digest(tmp_path / "all") == digest(tmp_path / "one")


@needs_two
def test_video_and_audio_on_every_gpu_are_the_one_gpu_bytes(tmp_path):
    from tests.helpers import ROOT

    video = ROOT / "sample_data" / "video"
    chain = dict(to="webdataset", frames="every:4", resize_shorter=64, device="gpu", shard_size=2)
    convert(video, tmp_path / "v1", **chain)
    s = convert(video, tmp_path / "vall", gpus="all", **chain)
    assert s.records_out > 0 and digest(tmp_path / "vall") == digest(tmp_path / "v1")
    audio = ROOT / "sample_data" / "audio"
    chain = dict(to="webdataset", sample_rate=16000, mono=True, duration=1.0, features="log-mel(n_mels=80)",
                 device="gpu", shard_size=2)
    convert(audio, tmp_path / "a1", **chain)
    s = convert(audio, tmp_path / "aall", gpus="all", **chain)
    assert s.records_out > 0 and digest(tmp_path / "aall") == digest(tmp_path / "a1")
