"""The training loader on the GPU (marked gpu): the same rows, keys and labels as on the CPU, images and
audio features close to the CPU's, batches handed over through DLPack."""

from __future__ import annotations

import numpy as np
import pytest

from gpubatch.api import convert
from gpubatch.training import loader
from tests.test_training import walk_epochs

pytestmark = pytest.mark.gpu


def _epoch(path, chain, keys, device, **kw):
    with loader(path, chain, batch_size=8, keys=keys, device=device, seed=5, **kw) as dl:
        dl.set_epoch(1)
        out = []
        for key, data, label in dl:
            a = data.stacked() if hasattr(data, "stacked") else data.data  # (an image batch; audio's KeyedBatch)
            out.append((list(key), np.asarray(a.get() if hasattr(a, "get") else a, np.float32), label.tolist()))
        return out, list(dl.skipped)


def test_images_on_the_gpu_are_the_cpu_rows(imagenet, tmp_path):
    wds = tmp_path / "wds"
    convert(imagenet, wds, to="webdataset", shard_size=16, device="cpu")
    chain = "resize_shorter(size=40) | center_crop(size=32)"
    gpu, gpu_skipped = _epoch(wds, chain, ("key", "image", "label"), "gpu")
    cpu, _ = _epoch(wds, chain, ("key", "image", "label"), "cpu")
    assert [(k, lab) for k, _, lab in gpu] == [(k, lab) for k, _, lab in cpu] and not gpu_skipped
    for (_, g, _), (_, c, _) in zip(gpu, cpu):
        assert g.shape == c.shape and np.abs(g - c).mean() < 3.0  # (two JPEG decoders, two resamplers)


def test_audio_features_on_the_gpu_are_the_cpu_rows(tmp_path):
    from tests.audio.sounds import speech_commands

    root = speech_commands(tmp_path / "sc", per_word=3)
    clips = tmp_path / "clips"
    convert(root, clips, to="webdataset", device="cpu")
    chain = "fix_duration(seconds=1) | log_mel(n_mels=40)"
    gpu, _ = _epoch(clips, chain, ("key", "audio", "label"), "gpu", dtype="float32")
    cpu, _ = _epoch(clips, chain, ("key", "audio", "label"), "cpu", dtype="float32")
    assert [(k, lab) for k, _, lab in gpu] == [(k, lab) for k, _, lab in cpu]
    for (_, g, _), (_, c, _) in zip(gpu, cpu):
        assert g.shape == c.shape and np.abs(g - c).max() < 1e-2


def test_video_clips_on_the_gpu_are_the_cpu_rows(tmp_path):
    """The same records, clips (positions drawn per seed, key and epoch) and labels as on the CPU, the
    frames within the decoders' rounding; the MKV and the HEVC too small for NVDEC decoded on the CPU."""
    pytest.importorskip("av", reason="PyAV: the CPU reference")
    from tests.video.clips import class_folders, make_clip

    src = class_folders(tmp_path / "src")
    for k in range(3):
        make_clip(src / "run" / f"r{k}.mp4", 40 + 4 * k, 160, 120)
    shards = tmp_path / "shards"
    convert(src, shards, to="webdataset", device="cpu")
    chain = "resize_shorter(size=48) | center_crop(size=48)"
    kw = dict(clip_length=8, frame_step=2)
    gpu, gpu_skipped = _epoch(shards, chain, ("key", "video", "label"), "gpu", **kw)
    cpu, cpu_skipped = _epoch(shards, chain, ("key", "video", "label"), "cpu", **kw)
    assert [(k, lab) for k, _, lab in gpu] == [(k, lab) for k, _, lab in cpu] and not gpu_skipped and not cpu_skipped
    for (_, g, _), (_, c, _) in zip(gpu, cpu):
        assert g.shape == c.shape and g.shape[1:] == (3, 8, 48, 48) and np.abs(g - c).mean() <= 2.0


def test_the_gpu_loader_reads_on_from_one_epoch_into_the_next(imagenet, tmp_path):
    """On the GPU the reads and decodes run on from an epoch's last batch into the next epoch's first (the
    reader processes and the decoders are never stopped between epochs): each epoch of a loop over epochs
    is the epoch a loader started at it gives, images included; a loop stopped mid-epoch goes on where it
    stopped, and a set_epoch that leaves the stream's way starts a stream of its own."""
    wds = tmp_path / "wds"
    convert(imagenet, wds, to="webdataset", shard_size=16, device="cpu")
    chain = "random_resized_crop(size=32) | flip(p=0.5)"
    kw = dict(batch_size=8, keys=("key", "image", "label"), device="gpu", seed=5)

    def rows(batch):
        key, data, label = batch
        return list(key), np.asarray(data.stacked().get()), label.tolist()

    def alone(epoch):
        with loader(wds, chain, **kw) as dl:
            dl.set_epoch(epoch)
            return [rows(b) for b in dl]

    def same(got, want):
        assert [(k, lab) for k, _, lab in got] == [(k, lab) for k, _, lab in want]
        assert all(np.array_equal(g, w) for (_, g, _), (_, w, _) in zip(got, want))

    with loader(wds, chain, **kw) as dl:
        epochs, streams = walk_epochs(dl, rows)
    assert streams[0] is streams[1] is streams[2] and streams[3] is not streams[2]
    for epoch, got in epochs.items():
        same(got, alone(epoch))


def test_the_gpu_loader_decodes_regions_with_the_pixels_of_whole_images(imagenet, tmp_path, monkeypatch):
    """``GPUBATCH_REGION_DECODE=1``: the loader's decoders decode only the part of each image the random
    crop reads (its reader processes cut the regions; the hardware engine's calls are given them) and the
    batches are those of whole images, up to the rounding of the moved window's origin."""
    from gpubatch.engine.codecs.nvjpeg_hw import HwBatchDecoder

    wds = tmp_path / "wds"
    convert(imagenet, wds, to="webdataset", shard_size=16, device="cpu")
    chain = "random_resized_crop(size=48) | flip(p=0.5) | normalize(layout='HWC', dtype='uint8')"
    calls: list = []  # the regions of each hardware-engine call (from Python, or queued on the native driver)
    real, real_submit = HwBatchDecoder.decode, HwBatchDecoder.submit
    monkeypatch.setattr(HwBatchDecoder, "decode", lambda self, *a, **k: (calls.append(k.get("regions")),
                                                                         real(self, *a, **k))[1])
    monkeypatch.setattr(HwBatchDecoder, "submit", lambda self, *a, **k: (calls.append(k.get("regions")),
                                                                         real_submit(self, *a, **k))[1])
    got = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("GPUBATCH_REGION_DECODE", flag)
        with loader(wds, chain, batch_size=8, keys=("key", "image", "label"), device="gpu", seed=5) as dl:
            calls.clear()  # (not the warm-up's)
            got[flag] = [(list(k), np.asarray(x.stacked().get(), np.int32), lab.tolist()) for k, x, lab in dl]
            direct = dl._pipe.engine.decoder.hw_direct
        cut = sum(r is not None for c in calls if c for r in c)
        assert (cut > 0) == (flag == "1" and bool(direct)), (flag, cut)
    assert [(k, lab) for k, _, lab in got["1"]] == [(k, lab) for k, _, lab in got["0"]]
    diff = np.concatenate([np.abs(a - b).ravel() for (_, a, _), (_, b, _) in zip(got["1"], got["0"])])
    assert diff.max() <= 2 and diff.mean() < 0.1, (diff.max(), diff.mean())
