"""A worker process's boot (engine/execute/boot.py): the GPU's start that its strategy names begins before the
run is unpickled, and a run that cannot be unpickled is reported, not lost. CPU tests (no CUDA here: the
start's thread finds none and ends; what is tested is the order and the specs)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from gpubatch.api import audio_ops
from gpubatch.engine.device import Device, DeviceKind
from gpubatch.engine.execute import early as early_start
from gpubatch.engine.execute.strategies import TABLE
from gpubatch.engine.execute.worker import RunContext
from gpubatch.engine.gpu import start
from gpubatch.engine.gpu.chain import kernels_needed
from gpubatch.engine.plan import Plan
from gpubatch.engine.processes import cores
from gpubatch.engine.settings import Settings
from gpubatch.engine.spec import parse_chain
from tests.helpers import ROOT, all_ended


def _ctx(plan: Plan | None = None, **more) -> RunContext:
    return RunContext(opener=None, sink=None, plan=plan or Plan(), device=Device(DeviceKind.GPU, 0, reason="test"),
                      policy="skip", stage=None, settings=Settings().with_(decode_route="hardware"), on_gpu=True,
                      **more)


def test_each_gpu_strategy_names_a_start_its_workers_begin_first():
    assert {s.name: s.start for (_, dev), s in TABLE.items() if dev == "gpu"} == {"gpu-image": "image", "gpu-video": "video",
                                                    "gpu-audio": "audio"}
    assert TABLE[("*", "cpu")].start == ""
    image = start.early("image", _ctx())
    assert image.hw > 0 and image.sync and image.library
    assert image.kernels == kernels_needed((), encode=True)  # (the plan's chain's and the JPEG encoder's)
    ops = parse_chain("resize_shorter(256) | center_crop(224) | color_jitter(brightness=0.4)")
    assert start.early("image", _ctx(plan=Plan(ops=ops))).kernels == kernels_needed(ops, encode=True)
    assert image.reserve == 0  # one process on the GPU: the hardware decoder's thread gets a core
    assert start.early("image", _ctx(gpu_procs=2)).reserve is None  # shared: no core taken
    video = start.early("video", _ctx(plan=Plan(ops=ops)))  # the context, the kernels of its frames and chain
    assert (video.hw, video.sync, video.library, video.decoders, video.warm) == (0, False, False, 0, "video")
    assert video.kernels == (("yuv", "nv12_rgb"), *kernels_needed(ops, encode=True))
    assert start.early("video", _ctx(gpu_memory="1GiB")) is None  # a capped run measures the context it makes
    audio = start.early("audio", _ctx(gpu_procs=2))  # the context, and its share of the cores' decoding processes
    assert (audio.hw, audio.sync, audio.library, audio.host) == (0, False, False, 0)
    assert audio.decoders == start.audio_decoders(2) == max(1, cores() // 2 - 1)
    assert audio.warm == "audio" and image.warm == ""  # (a log-mel chain once on silence)
    from gpubatch.engine.media import DEVICE

    assert Plan(ops=parse_chain(start.AUDIO_WARM), media="audio").validate(DEVICE) is not None
    assert start.early("audio", _ctx(gpu_memory="1GiB")) is None
    assert start.early("", _ctx()) is None


_PROBE = r"""
import pickle, queue, sys
from gpubatch.engine.execute import boot
from gpubatch.engine.gpu import start
from gpubatch.engine.settings import Settings
from tests.engine.test_boot import Probe

early = None if sys.argv[1] == "none" else start.Early(0, Settings(), 0, (), sync=False, library=False)
results, run = queue.Queue(), queue.Queue()
run.put(pickle.dumps(Probe()))
boot.boot(early, run, 0, queue.Queue(), results)
kind, how, what = results.get_nowait()
print(kind, how, what.strip().splitlines()[-1])
"""


def _seen() -> None:
    raise RuntimeError(f"unpickled with the start begun: {0 in start._STARTS}")


class Probe:
    """Unpickles by calling :func:`_seen`: whether the GPU's start had begun by then."""

    def __reduce__(self):
        return (_seen, ())


def _boot(early: str) -> str:
    p = subprocess.run([sys.executable, "-c", _PROBE, early], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_the_start_begins_before_the_run_is_unpickled_and_an_unpicklable_run_is_reported():
    assert _boot("video") == "failed crash RuntimeError: unpickled with the start begun: True"
    assert _boot("none") == "failed crash RuntimeError: unpickled with the start begun: False"


def test_a_booted_start_hands_its_reservation_over_once():
    spec = start.Early(7, Settings(), 0, (), sync=False, library=False, reserve=None)
    assert start.booted(7) == (None, None)  # no boot: the unit reserves (or not) itself
    start.boot(spec)
    try:
        since, reserved = start.booted(7)
        assert since is not None and since >= 0 and reserved is None
        assert start.booted(7) == (None, None)  # taken once
    finally:
        start.kernels_ready(7)
        start._STARTS.pop(7, None)


def test_an_audio_workers_boot_forks_its_decoding_processes_first():
    """An audio run's worker (``Early.decoders``) forks its decoding processes at its boot, before the GPU's start:
    kept for its unit (``feed_start``, kind "audio"), ended at once where no unit takes them."""
    from gpubatch.engine.gpu import feed_start

    if 9 in start._STARTS:  # pragma: no cover - (the index is this test's)
        pytest.skip("device 9's start is taken")
    start.boot(start.Early(9, Settings(), 0, (), sync=False, library=False, decoders=2), readers=True)
    try:
        assert [(kind, n) for kind, _, _, n in feed_start._PRESTARTED] == [("audio", 2)]
        procs = list(feed_start._PRESTARTED[0][1]._processes.values())
        assert len(procs) == 2
        assert feed_start.taken(3, (None,), "audio") is None and not feed_start._PRESTARTED  # (not as many: ended)
        for p in procs:
            p.join(30)
        assert all_ended(procs)
    finally:
        feed_start.close(now=True)
        start.kernels_ready(9)
        start._STARTS.pop(9, None)
        start._BOOTED.pop(9, None)


def test_a_start_that_cannot_make_its_instances_ends_and_leaves_nothing_to_wait_for():
    """Where the start fails (no CUDA here), it ends at once: the waits for the first instance, for all of
    them and for the kernels return, and nothing is coming (a decoder then makes its instances itself)."""
    import threading

    if 8 in start._STARTS:  # pragma: no cover - (the index is this test's)
        pytest.skip("device 8's start is taken")
    start.boot(start.Early(8, Settings(), 3, (), sync=False, library=False, reserve=None))
    try:
        got: list = []

        def waits() -> None:
            start.hardware_first(8)
            got.append(start.kernels_ready(8))
            got.append(start.hardware_instances(8, 3))

        waiter = threading.Thread(target=waits, daemon=True)
        waiter.start()
        waiter.join(timeout=30)
        assert not waiter.is_alive(), "a wait of the start did not return"
        if got[1]:  # pragma: no cover - (a machine with a GPU makes them: this test is for one without)
            pytest.skip("a GPU here made the instances")
        assert "hardware instances after the first" not in got[0] and not start.hardware_coming(8)
    finally:
        start._STARTS.pop(8, None)
        start._BOOTED.pop(8, None)


# --- workers started before the plan (execute.early.started_early: GPU runs; here the host unit stands in) ----


def _early_host(started_with: int, seen: list):
    """A stand-in for execute.early.started_early: the host unit's workers, ``started_with`` of them, started before
    the source is listed (only GPU runs start so; the executor's part is the same)."""
    from gpubatch.engine.execute.local import Started
    from gpubatch.engine.execute.strategies import TABLE

    def early(req, finish, plan, device, settings, ahead=None):
        ctx = RunContext(opener=None, sink=None, plan=plan, device=device, settings=settings)
        started = Started(ctx, TABLE[("*", "cpu")], started_with)
        seen.append(started)
        return started

    return early


def test_workers_started_before_the_plan_write_the_same_bytes_and_the_spare_ones_end(imagenet, tmp_path, monkeypatch):
    from gpubatch.api import convert
    from tests.engine.test_shards import digest

    chain = dict(to="webdataset", resize_shorter=40, shard_size=3, device="cpu")
    plain = convert(imagenet, tmp_path / "plain", workers=2, **chain)
    seen: list = []
    monkeypatch.setattr(early_start, "started_early", _early_host(3, seen))
    early = convert(imagenet, tmp_path / "early", workers=2, **chain)  # (two of the three take the run)
    assert early.records_out == plain.records_out and digest(tmp_path / "early") == digest(tmp_path / "plain")
    assert len(seen) == 1 and seen[0].used == 2 and all_ended(seen[0].procs)
    assert "wall: workers spawned (from the run's start)" in early.timings


def test_a_run_that_takes_more_workers_than_were_started_early_keeps_them_and_starts_the_rest(imagenet, tmp_path,
                                                                                            monkeypatch):
    """A long GPU run takes more processes a GPU than its early start knew of (``Strategy.long_run``): the one
    started early keeps its start and takes the run, the others are started beside it (``Started.grow``), and
    the bytes are those of any other number of workers."""
    from gpubatch.api import convert
    from tests.engine.test_shards import digest

    chain = dict(to="webdataset", resize_shorter=40, shard_size=3, device="cpu")
    plain = convert(imagenet, tmp_path / "plain", workers=1, **chain)
    seen: list = []
    monkeypatch.setattr(early_start, "started_early", _early_host(1, seen))
    grown = convert(imagenet, tmp_path / "grown", workers=3, **chain)
    assert grown.records_out == plain.records_out and digest(tmp_path / "grown") == digest(tmp_path / "plain")
    assert len(seen) == 1 and seen[0].used == 3 and len(seen[0].procs) == 3
    assert all_ended(seen[0].procs)


def test_a_long_image_run_takes_a_second_process_a_gpu_unless_told_otherwise():
    """``--gpu-procs`` unset: a GPU image run of ``long_run`` records or more takes two processes a GPU; one
    shorter, one under ``--gpu-memory``, one with ``--gpu-procs`` given, or one of another executor keeps its own."""
    from types import SimpleNamespace

    from gpubatch.engine.execute.early import gpu_procs as _gpu_procs
    from gpubatch.engine.execute.strategies import TABLE

    image, audio = TABLE[("image", "gpu")], TABLE[("audio", "gpu")]
    at, procs = image.long_run

    def req(**kw):
        return SimpleNamespace(**{"gpu_procs": None, "gpu_memory": None, "executor": "local", **kw})

    assert _gpu_procs(req(), image, at) == procs and _gpu_procs(req(), image, at - 1) == 1
    assert _gpu_procs(req(), image) == 1  # (before the run knows its length: the early start)
    assert _gpu_procs(req(gpu_procs=1), image, 10 * at) == 1 and _gpu_procs(req(gpu_procs=3), image, 1) == 3
    assert _gpu_procs(req(gpu_memory="1GiB"), image, 10 * at) == 1
    assert _gpu_procs(req(executor="ray"), image, 10 * at) == 1
    assert _gpu_procs(req(), audio, 10 * at) == (2 if cores() >= 8 else 1)


@pytest.mark.parametrize("have, gpus, want", [(16, 1, 2), (16, 2, 2), (16, 3, 1), (8, 1, 2), (7, 1, 1), (2, 1, 1)])
def test_an_audio_run_takes_two_processes_a_gpu_on_a_host_of_8_cores_a_gpu(monkeypatch, have, gpus, want):
    """``--gpu-procs`` unset: a GPU audio run takes two processes a GPU where the host has 8 cores a GPU (each its loop,
    shards' writer and share of the decoding processes), one elsewhere, under ``--gpu-memory``, with
    ``--gpu-procs`` given, or on Ray; an image run is not widened."""
    from types import SimpleNamespace

    from gpubatch.engine.execute import strategies
    from gpubatch.engine.execute.early import gpu_procs as _gpu_procs

    def req(**kw):
        return SimpleNamespace(**{"gpu_procs": None, "gpu_memory": None, "executor": "local", **kw})

    monkeypatch.setattr(strategies, "cores", lambda: have)
    audio, image = TABLE[("audio", "gpu")], TABLE[("image", "gpu")]
    assert _gpu_procs(req(), audio, 100, gpus) == want and _gpu_procs(req(), audio, None, gpus) == want
    assert audio.per_gpu_here(gpus) == want and image.per_gpu_here(gpus) == 1
    assert _gpu_procs(req(gpu_procs=1), audio, 100, gpus) == 1 and _gpu_procs(req(gpu_procs=3), audio, 1, gpus) == 3
    assert _gpu_procs(req(gpu_memory="1GiB"), audio, 100, gpus) == 1
    assert _gpu_procs(req(executor="ray"), audio, 100, gpus) == 1
    assert _gpu_procs(req(), image, 100, gpus) == 1


def test_workers_started_before_a_run_that_fails_to_plan_end_with_it(imagenet, tmp_path, monkeypatch):
    from gpubatch.api import convert
    from gpubatch.errors import GpubatchError

    seen: list = []
    monkeypatch.setattr(early_start, "started_early", _early_host(2, seen))
    try:
        convert(imagenet, tmp_path / "none", to="webdataset", limit=0, device="cpu", workers=2)
    except GpubatchError as e:
        assert "converts no record" in str(e)
    else:
        raise AssertionError("a run of no record was not refused")
    assert len(seen) == 1 and seen[0].used == 0 and not any(p.is_alive() for p in seen[0].procs)
    assert not (tmp_path / "none").exists()


def test_a_run_its_workers_cannot_be_given_fails_in_one_error_and_leaves_no_process(imagenet, tmp_path, monkeypatch):
    """Where the run cannot be sent to its workers (an object of the caller's script in it: detached_main's
    one-line error), the run fails with that error, and the processes started for it end."""
    import multiprocessing as mp

    import gpubatch.engine.execute.local as local
    from gpubatch.api import convert
    from gpubatch.errors import UsageError

    def unsendable(ctx, strategy, slot):
        raise UsageError("an object defined in your script goes to gpubatch's worker processes")

    monkeypatch.setattr(local, "_payload", unsendable)
    for early in (None, _early_host(2, seen := [])):  # (workers started with the tasks, and before the plan)
        if early is not None:
            monkeypatch.setattr(early_start, "started_early", early)
        out = tmp_path / f"out-{early is None}"
        try:
            convert(imagenet, out, to="webdataset", resize_shorter=40, shard_size=3, device="cpu", workers=2)
        except UsageError as e:
            assert "your script" in str(e)
        else:
            raise AssertionError("the run was not refused")
        assert not mp.active_children() and not out.exists()
    assert len(seen) == 1 and seen[0].used == 0


# --- workers started before the device is probed (execute.early.prestart) --------------------------------------


def test_a_gpu_image_run_starts_its_workers_before_the_probe_and_no_other_run_does(monkeypatch):
    from gpubatch.api import ConvertRequest
    from gpubatch.engine.ops.temporal import sampler_from_options
    from gpubatch.engine.plan import make_plan

    asked: list = []
    monkeypatch.setattr(early_start, "started_early", lambda req, finish, plan, device, settings: asked.append(
        (plan.media, device.index, settings.decode_route)) or "started")
    monkeypatch.setattr(early_start, "gpu_node", lambda: True)
    monkeypatch.delenv("GPUBATCH_EARLY_START", raising=False)
    monkeypatch.delenv("GPUBATCH_DECODE_ROUTE", raising=False)
    pixels = make_plan(256, 224, None, "keep", 90)

    def ahead(plan=pixels, **opts):
        return early_start.prestart(ConvertRequest(src="s", dst="d", to="webdataset", **opts), plan)

    assert ahead() == "started" and ahead(device="gpu", gpu=1) == "started"
    assert asked == [("image", 0, "hardware"), ("image", 1, "hardware")]  # (as the run would: _execute)
    passthrough = make_plan()
    video = dataclasses.replace(pixels, sample=sampler_from_options("every:4"))
    audio = dataclasses.replace(passthrough, ops=audio_ops(16000, True))
    for none in (ahead(device="cpu"), ahead(gpus="all"), ahead(executor="ray"), ahead(finish=True),
                 ahead(passthrough), ahead(video), ahead(audio)):
        assert none is None
    monkeypatch.setenv("GPUBATCH_EARLY_START", "0")
    assert ahead() is None
    monkeypatch.delenv("GPUBATCH_EARLY_START")
    monkeypatch.setattr(early_start, "gpu_node", lambda: False)  # (this machine: no GPU, nothing started)
    assert ahead() is None and len(asked) == 2


def test_workers_started_ahead_are_taken_where_they_fit_and_end_where_they_do_not(tmp_path):
    from gpubatch.engine.execute.local import Started

    host = TABLE[("*", "cpu")]
    ctx = RunContext(opener=None, sink=None, plan=Plan(), device=Device(DeviceKind.CPU), settings=Settings())
    started = Started(ctx, host, 2)
    try:
        assert started.fits(ctx, host, 2)
        assert not started.fits(ctx, host, 3) and not started.fits(ctx, TABLE[("image", "gpu")], 2)
        gpu = _ctx()
        image = Started.__new__(Started)  # (what a GPU image run's start holds, compared without processes)
        image.taken, image.strategy, image.procs = False, TABLE[("image", "gpu")], [None]
        from gpubatch.engine.execute.local import boots

        image.boots = boots(gpu, image.strategy, 0, 1)
        assert image.fits(gpu, image.strategy, 1)
        other = dataclasses.replace(gpu, plan=Plan(ops=parse_chain("color_jitter(brightness=0.4)")))
        assert not image.fits(other, image.strategy, 1)  # (other kernels to compile)
        assert not image.fits(dataclasses.replace(gpu, device=Device(DeviceKind.GPU, 1)), image.strategy, 1)
    finally:
        started.close()
    assert not any(p.is_alive() for p in started.procs) and not started.fits(ctx, host, 2)


def test_workers_started_ahead_of_a_run_that_proves_to_be_the_cpus_end_and_it_writes_what_it_would(
        imagenet, tmp_path, monkeypatch):
    """``--device auto`` where a GPU node is seen but no GPU is usable (this machine, told it has a node): the
    GPU image workers started ahead end (their boot finds no CUDA), the run goes to the CPU and writes the bytes
    of a run that started none; ``--device gpu`` there fails with its one-line reason, no worker left behind."""
    from gpubatch.api import convert
    from gpubatch.engine.device import gpu_problem
    from gpubatch.errors import UsageError
    from tests.engine.test_shards import digest
    from tests.helpers import started_seen

    problem = gpu_problem(0)[0]  # (where a GPU is usable, the CPU suite's fixture makes it none: conftest.py)
    chain = dict(to="webdataset", resize_shorter=40, shard_size=20)
    plain = convert(imagenet, tmp_path / "plain", device="cpu", **chain)
    made = started_seen(monkeypatch)
    monkeypatch.setattr(early_start, "gpu_node", lambda: True)
    auto = convert(imagenet, tmp_path / "auto", device="auto", **chain)
    assert auto.device == "cpu" and digest(tmp_path / "auto") == digest(tmp_path / "plain")
    assert auto.records_out == plain.records_out
    ahead = [s for s in made if s.strategy.name == "gpu-image"]  # (the CPU run's own workers: the host unit's)
    assert len(ahead) == 1 and made[0] is ahead[0] and ahead[0].used == 0 and ahead[0].taken
    with pytest.raises(UsageError, match=f"device gpu: {re.escape(problem)}"):
        convert(imagenet, tmp_path / "gpu", device="gpu", **chain)
    assert [s.strategy.name for s in made[-1:]] == ["gpu-image"] and not (tmp_path / "gpu").exists()
    assert all_ended([p for s in made for p in s.procs])


def test_nothing_is_started_ahead_where_the_machine_has_no_gpu_node_no_cupy_or_hides_its_devices(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(early_start, "NODE", str(node))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cupy" else real(name, *a))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert early_start.gpu_node()
    for hidden, node_seen in (("", False), ("-1", False), (" -1,0", False), ("1", True), ("GPU-5e2c", True)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)  # (every device hidden: nothing started)
        assert early_start.gpu_node() is node_seen, hidden
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cupy" else real(name, *a))
    assert not early_start.gpu_node()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cupy" else real(name, *a))
    node.unlink()
    assert not early_start.gpu_node()
