"""VideoPipeline: clip batches in both layouts, one draw a clip reproducible by seed, the files that give
no clip named, and (``make gpu-test``) the GPU's clips against the CPU's."""

from __future__ import annotations

import numpy as np
import pytest

from gpubatch import VideoPipeline
from gpubatch.engine.spec import parse_chain

from .clips import make_clip

pytest.importorskip("av")
CHAIN = "resize_shorter(size=48) | random_crop(size=40) | flip() | normalize(layout='CHW', dtype='float16')"


@pytest.fixture
def clips(tmp_path):
    files = [make_clip(tmp_path / f"c{k}.mp4", 40 + 10 * k, 96, 64) for k in range(3)]
    make_clip(tmp_path / "short.mp4", 5)  # shorter than one clip
    return files, tmp_path / "short.mp4"


def _batches(device, files, layout="NCTHW", seed=0, n=3, batch=2):
    with VideoPipeline(parse_chain(CHAIN), clip_length=4, frame_step=3, device=device, seed=seed, layout=layout,
                       workers=2) as p:
        got = []
        for b in p.iterate_files(files, batch, repeat=True):
            got.append(b)
            if len(got) == n:
                break
        return got, p


def test_clip_batches_and_their_layouts(clips):
    files, _ = clips
    got, p = _batches("cpu", files)
    b = got[0]
    assert b.data.shape == (2, 3, 4, 40, 40) and b.data.dtype == np.float16
    assert [k.split("#")[0].rsplit("/", 1)[1] for k in b.keys] == ["c0", "c1"]
    assert all(len(f) == 4 and len(set(np.diff(f))) == 1 and np.diff(f)[0] == 3 for f in b.frames)
    assert np.from_dlpack(b).shape == b.data.shape  # DLPack, as torch.from_dlpack takes it
    t, _ = _batches("cpu", files, layout="NTCHW", n=1)
    assert t[0].data.shape == (2, 4, 3, 40, 40)
    np.testing.assert_array_equal(t[0].data, b.data.transpose(0, 2, 1, 3, 4))  # the same clips, rearranged


def test_draws_are_reproducible_by_seed_and_differ_by_visit(clips):
    files, _ = clips
    a, _ = _batches("cpu", files, seed=5)
    b, _ = _batches("cpu", files, seed=5)
    c, _ = _batches("cpu", files, seed=6)
    assert [x.frames for x in a] == [x.frames for x in b]
    assert all(np.array_equal(x.data, y.data) for x, y in zip(a, b))
    assert [x.frames for x in a] != [x.frames for x in c]
    visits = [f for x in a for f in x.frames]  # file c0 seen twice in 6 clips: two draws
    assert visits[0] != visits[3] or not np.array_equal(a[0].data[0], a[1].data[1])


def test_files_without_a_clip_are_named_and_left_out(clips):
    files, short = clips
    got, p = _batches("cpu", [short, *files], n=2)
    assert all("short" not in k for b in got for k in b.keys)
    assert list(p.skipped) and "too short" in next(iter(p.skipped.values()))
    from gpubatch.errors import GpubatchError

    with pytest.raises(GpubatchError, match="none of the 1 files gave a clip"):
        _batches("cpu", [short], n=1)


@pytest.mark.gpu
def test_gpu_clips_match_the_cpu_clips(clips):
    files, _ = clips
    cpu, _ = _batches("cpu", files)
    gpu, p = _batches("gpu", files)
    import cupy as cp

    for x, y in zip(cpu, gpu):
        assert x.frames == y.frames and x.keys == y.keys
        d = np.abs(x.data.astype(np.float32) - cp.asnumpy(y.data).astype(np.float32))
        assert d.mean() <= 0.05, d.mean()  # normalized units: ~1 level of 255 over the ImageNet std
    assert p.stats["cpu_fallbacks"] == 0 and p.stats["frames_decoded"] > 0
