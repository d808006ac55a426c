"""The run as shards on the GPU: the same bytes under any --gpu-procs and --gpu-memory, and a run killed
with kill -9 resumed to the same bytes, only the missing shards written (marked gpu)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpubatch.api import convert
from tests.engine.test_shards import digest, kills
from tests.helpers import child_env

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """192 photo-like JPEGs of mixed sizes and subsamplings in 4 classes."""
    from tests.helpers import jpeg_bytes, photo

    root = tmp_path_factory.mktemp("gpu-photos")
    sizes = [(480, 640), (375, 500), (600, 400), (333, 517)]
    subs = [None, "4:4:4", "4:2:2"]
    for i in range(192):
        folder = root / f"c{i % 4}"
        folder.mkdir(exist_ok=True)
        h, w = sizes[i % 4]
        kw = {"subsampling": subs[i % 3]} if subs[i % 3] else {}
        (folder / f"{i:04d}.jpg").write_bytes(jpeg_bytes(photo(h, w, seed=i), 75 + i % 20, **kw))
    return root


def test_gpu_output_is_the_same_bytes_under_any_gpu_procs_and_memory_cap(photos, tmp_path):
    chain = dict(to="webdataset", resize_shorter=256, center_crop=224, quality=90, device="gpu", shard_size=16)
    runs = {}
    for name, more in {"plain": {}, "procs2": {"gpu_procs": 2}, "cap1g": {"gpu_memory": "1GiB"},
                       "cap640m": {"gpu_memory": "640MiB"}}.items():
        s = convert(photos, tmp_path / name, **chain, **more)
        assert s.records_out == 192 and not s.skipped, (name, s.skipped)
        assert "gpu_init: begun by the boot (s before the unit)" in s.timings, (name, s.timings)  # (boot.py)
        # the decoders' warm-up, step by step; no call into planes, which this run never decodes into
        assert "warm_up: decoders: hardware" in s.timings and "warm_up: decoders: hardware: planes" not in s.timings
        # (uncapped, the CUDA decoder's warm-up call is queued on its thread, not waited for before the first batch)
        assert ("warm_up: decoders: cuda (queued)" in s.timings) == ("gpu_memory" not in more), (name, s.timings)
        # when the worker's steps came, from the run's start, in the order they happen
        w = {k[len("wall (worker): "):]: v for k, v in s.timings.items() if k.startswith("wall (worker): ")}
        order = ["unit start", "engine made", "kernels ready", "warm-up done", "first batch read", "first batch decoded",
                 "first batch through the chain", "batch 25%", "batch 50%", "batch 75%"]
        if "gpu_memory" in more:  # (a capped run plans its memory first: no kernels' or warm-up's mark of its own)
            order = [n for n in order if n not in ("kernels ready", "warm-up done")]
        assert all(n in w for n in order), (name, w)
        assert [w[n] for n in order] == sorted(w[n] for n in order), (name, w)
        assert w["first batch read"] <= s.timings["wall: first batch (from the run's start)"] <= w["first batch decoded"]
        runs[name] = digest(tmp_path / name)
    assert len([n for n in runs["plain"] if n.endswith(".tar")]) == 12  # 192 / 16
    for name, d in runs.items():
        assert d == runs["plain"], f"{name} wrote other bytes"


def _command(src: Path, dst: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gpubatch", "convert", str(src), str(dst), "--to", "webdataset", "--shard-size", "8",
            "--resize-shorter", "200", "--device", "gpu", "-q", *more]


def test_a_gpu_run_killed_at_random_moments_resumes_to_the_same_bytes(photos, tmp_path):
    env = child_env()
    for _, _, done, _, kept in kills(_command, photos, tmp_path, env, 6, 52, span=(0.3, 1.0)):
        if done is not None:
            assert kept == done


def test_workers_started_before_the_probe_are_taken_and_write_the_same_bytes(photos, tmp_path, monkeypatch):
    """A GPU image run's workers start the moment its options are checked (``execute.early.prestart``), before this
    process probes the device and opens the source: the run takes them (spawned before its start) and writes
    the bytes of a run that started them after (``GPUBATCH_EARLY_START=0``); so does ``augment``."""
    from gpubatch.api import augment

    spawned = "wall: workers spawned (from the run's start)"
    chain = dict(to="webdataset", resize_shorter=256, center_crop=224, quality=90, device="gpu", shard_size=16)
    ahead = convert(photos, tmp_path / "ahead", **chain)
    aug = dict(preset="ssd", copies=2, seed=3, device="gpu", shard_size=16)
    aug_ahead = augment(photos, tmp_path / "aug-ahead", to="webdataset", **aug)
    monkeypatch.setenv("GPUBATCH_EARLY_START", "0")
    after = convert(photos, tmp_path / "after", **chain)
    aug_after = augment(photos, tmp_path / "aug-after", to="webdataset", **aug)
    assert ahead.timings[spawned] < 0 <= after.timings[spawned], (ahead.timings[spawned], after.timings[spawned])
    assert aug_ahead.timings[spawned] < 0 <= aug_after.timings[spawned]
    assert ahead.records_out == after.records_out == 192 and not ahead.skipped
    assert digest(tmp_path / "ahead") == digest(tmp_path / "after")
    assert digest(tmp_path / "aug-ahead") == digest(tmp_path / "aug-after")


def test_workers_started_at_the_commands_start_are_taken_on_the_gpu_and_write_the_same_bytes(photos, tmp_path):
    """The ``gpubatch`` command starts a GPU image run's worker from its arguments alone, before its imports
    (``execute.early.sniff``): on the GPU the run takes it, told its kernels, and writes the bytes of a run
    through the API, whose workers start once its options are checked."""
    from tests.engine.test_sniff import _cli

    args = ["--to", "webdataset", "--resize-shorter", "256", "--center-crop", "224", "--quality", "90", "--device",
            "gpu", "--shard-size", "16", "--quiet"]
    seen = _cli(["convert", str(photos), str(tmp_path / "sniffed"), *args], node=True)
    assert len(seen["sniffed"]) == 1 and seen["taken"] == seen["sniffed"] and seen["kernels"][0]
    convert(photos, tmp_path / "api", to="webdataset", resize_shorter=256, center_crop=224, quality=90, device="gpu",
            shard_size=16)
    assert digest(tmp_path / "sniffed") == digest(tmp_path / "api")


def test_workers_started_ahead_of_a_source_with_no_records_end_with_its_error(tmp_path, monkeypatch):
    """The workers start before the source is opened: a source that holds no image fails with its one-line error,
    and the workers started for it end (their boot finds no run) with the command."""
    from gpubatch.errors import GpubatchError
    from tests.helpers import started_seen

    made = started_seen(monkeypatch)
    empty = tmp_path / "empty"
    (empty / "c0").mkdir(parents=True)
    (empty / "c0" / "notes.txt").write_text("no image here")
    with pytest.raises(GpubatchError) as e:
        convert(empty, tmp_path / "out", to="webdataset", resize_shorter=64, device="gpu")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    assert [s.strategy.name for s in made] == ["gpu-image"] and made[0].used == 0
    assert not any(p.is_alive() for p in made[0].procs)
