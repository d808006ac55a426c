"""The Ray executor on a local Ray cluster the tests start (2 CPUs, and 2 GPUs declared so that the GPU
placement is checked without GPUs): the same bytes as the local executor, a killed actor's shard retried,
a killed driver resumed with --resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpubatch.api import convert
from gpubatch.engine.execute import strategies
from tests.engine.test_shards import digest, manifest
from tests.helpers import ROOT, child_env, kill_group, semaphores_now

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (make test installs it)")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs and 2 declared GPUs, started from the checkout (its workers import
    tests.engine.ray_units from there): its address."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        info = ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    finally:
        os.chdir(here)
    yield info.address_info["address"]
    ray.shutdown()


@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "folder", "lmdb", "coco"])
def test_a_ray_run_writes_the_local_runs_bytes(cluster, imagenet, coco, tmp_path, to):
    src = coco if to == "coco" else imagenet
    opts = dict(to=to, shard_size=3 if to == "coco" else 7, resize_shorter=48, quality=80, device="cpu")
    convert(src, tmp_path / "local", **opts)
    s = convert(src, tmp_path / "ray", executor="ray", **opts)
    assert 1 <= s.workers <= 2 and s.shards >= 4  # (an actor a CPU of the cluster; a late one may get none)
    assert digest(tmp_path / "ray") == digest(tmp_path / "local")
    assert manifest(tmp_path / "ray") == manifest(tmp_path / "local") | {"options": manifest(tmp_path / "ray")["options"]}


def test_an_actor_killed_mid_shard_is_retried_and_the_dataset_is_the_same(cluster, imagenet, tmp_path, monkeypatch):
    opts = dict(to="tfrecord", shard_size=6, resize_shorter=48, quality=80, device="cpu")
    convert(imagenet, tmp_path / "local", **opts)
    kill_once = strategies.Strategy("kill-once", "tests.engine.ray_units:KillOnceUnit", why="a test")
    monkeypatch.setattr(strategies, "unit_for", lambda ctx: kill_once)
    s = convert(imagenet, tmp_path / "ray", executor="ray", **opts)
    assert s.records_out == 60 and not s.skipped
    assert digest(tmp_path / "ray") == digest(tmp_path / "local")
    assert not list((tmp_path / "ray").rglob("*.partial"))  # (the killed attempt's file was swept)


def test_a_gpu_run_places_its_actors_on_the_gpus_and_writes_the_same_bytes(cluster, imagenet, tmp_path,
                                                                           monkeypatch):
    # the host unit in a strategy marked GPU: Ray places its actors on the declared GPUs
    probe = strategies.Strategy("gpu-probe", "gpubatch.engine.execute.units:HostUnit", gpu=True, why="a test")
    monkeypatch.setattr(strategies, "unit_for", lambda ctx: probe)
    opts = dict(to="webdataset", shard_size=5, resize_shorter=40, executor="ray", device="cpu")
    s = convert(imagenet, tmp_path / "ray", **opts)
    assert 1 <= s.workers <= 2 and set(s.per_gpu) <= {"0", "1"}  # (an actor a GPU; a late one may get none)
    assert sum(g["shards"] for g in s.per_gpu.values()) == 12
    monkeypatch.undo()
    convert(imagenet, tmp_path / "local", **{**opts, "executor": "local"})
    assert digest(tmp_path / "ray") == digest(tmp_path / "local")


class _Where:
    def gpus(self) -> list[str]:
        return [str(g) for g in ray.get_gpu_ids()]


@pytest.mark.parametrize("procs", [1, 2])
def test_gpu_actors_take_a_gpu_each_or_share_one_by_gpu_procs(cluster, procs):
    from collections import Counter
    from types import SimpleNamespace

    from gpubatch.engine.execute.ray import _actors

    probe = strategies.Strategy("gpu-probe", "gpubatch.engine.execute.units:HostUnit", gpu=True)
    n, options, host = _actors(ray, probe, SimpleNamespace(gpu_procs=procs), tasks=100, asked=None)
    assert n == 2 * procs and host == 2 * procs and options == {"num_gpus": 1 / procs, "num_cpus": 0}
    actors = [ray.remote(**options)(_Where).remote() for _ in range(n)]
    placed = Counter(g for ids in ray.get([a.gpus.remote() for a in actors], timeout=120) for g in ids)
    assert placed == {"0": procs, "1": procs}  # every GPU, procs actors on each
    for a in actors:
        ray.kill(a)


def test_a_driver_killed_mid_run_resumes_writing_only_the_missing_shards(cluster, tmp_path):
    from tests.helpers import jpeg_bytes, photo

    src = tmp_path / "photos"
    base = [jpeg_bytes(photo(480, 640, seed=k), 92) for k in range(4)]
    for i in range(160):
        (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 4}" / f"{i:04d}.jpg").write_bytes(base[i % 4])
    args = ["--to", "webdataset", "--shard-size", "8", "--resize-shorter", "200", "--device", "cpu"]
    subprocess.run([sys.executable, "-m", "gpubatch", "convert", str(src), str(tmp_path / "local"), *args, "-q"],
                   env=child_env(), check=True, timeout=300)
    dst = tmp_path / "ray"
    sems = semaphores_now()
    driver = subprocess.Popen([sys.executable, "-m", "gpubatch", "convert", str(src), str(dst), *args, "-q",
                               "--executor", "ray", "--ray-address", cluster],
                              env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    journal = tmp_path / ".ray.gpubatch-partial" / ".gpubatch" / "journal"
    t_end = time.time() + 120
    while time.time() < t_end and len(list(journal.glob("*.json"))) < 3 and driver.poll() is None:
        time.sleep(0.05)
    assert driver.poll() is None and not dst.exists(), "the run ended before it could be killed"
    kill_group(driver, sems)
    committed = len(list(journal.glob("*.json")))
    time.sleep(1.0)  # (Ray ends the dead driver's actors)
    s = convert(src, dst, to="webdataset", shard_size=8, resize_shorter=200, executor="ray", resume=True,
                device="cpu")
    said = [w for w in s.warnings if w.startswith("--resume:")]
    assert said and said[0].startswith("--resume: ") and " of 20 shards were committed" in said[0]
    assert int(said[0].split()[1]) >= committed >= 3
    assert digest(dst) == digest(tmp_path / "local")


def test_without_ray_the_executor_names_the_extra_in_one_line(imagenet, tmp_path, monkeypatch):
    import sys

    from gpubatch.errors import UsageError

    monkeypatch.setitem(sys.modules, "ray", None)  # (as where the extra is not installed)
    with pytest.raises(UsageError, match=r"^the Ray executor needs Ray: pip install 'gpubatch\[ray\]'$"):
        convert(imagenet, tmp_path / "out", to="webdataset", executor="ray", shard_size=20)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))  # (refused before staging)


def test_record_errors_keep_their_policy_on_ray(cluster, imagenet, tmp_path):
    from gpubatch.errors import RecordFailed

    bad = sorted(imagenet.rglob("*.jpg"))[7]
    bad.write_bytes(bad.read_bytes()[:300])  # (a JPEG cut short)
    opts = dict(to="tfrecord", shard_size=8, resize_shorter=40, device="cpu", executor="ray")
    s = convert(imagenet, tmp_path / "skip", **opts)
    assert s.records_out == 59 and [e["key"] for e in s.skipped] == [bad.relative_to(imagenet).with_suffix("").as_posix()]
    with pytest.raises(RecordFailed, match="stopped at a bad record"):
        convert(imagenet, tmp_path / "fail", on_error="fail", **opts)
    assert not (tmp_path / "fail").exists()


def test_a_full_disk_on_ray_is_the_run_s_one_line_write_error(cluster, imagenet, tmp_path, monkeypatch):
    from gpubatch.errors import GpubatchError

    full = strategies.Strategy("full-disk", "tests.engine.ray_units:FullDiskUnit", why="a test")
    monkeypatch.setattr(strategies, "unit_for", lambda ctx: full)
    with pytest.raises(GpubatchError) as e:
        convert(imagenet, tmp_path / "out", to="tfrecord", shard_size=8, device="cpu", executor="ray")
    assert str(e.value).startswith(f"writing {tmp_path / 'out'} failed: No space left on device (") and "\n" not in str(e.value)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["imagenet"]
