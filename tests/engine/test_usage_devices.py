"""The resource a run names as its bound, ``--gpus`` parsing and a worker's GPU (CPU tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubatch.engine import device
from gpubatch.engine.device import Device, DeviceKind, parse_gpus, resolve_gpus
from gpubatch.engine.usage import Usage, bound, cpu_since, thread_cpu
from gpubatch.errors import UsageError


def test_the_bound_is_what_was_saturated_else_the_disk_the_start_or_nothing():
    assert bound({"cpu_busy": 0.93}) == "CPU cores (93% busy)"
    assert bound({"cpu_busy": 0.2, "gpu_busy": {"0": 0.4, "1": 0.91}}) == "GPU 1 SMs (91% busy)"
    assert bound({"cpu_busy": 0.2, "nvdec_busy": {"0": 0.88}}) == "GPU 0 video decoders (88% busy)"
    assert bound({"cpu_busy": 0.3}, write_share=0.71) == "disk (writing: 71% of the workers' time)"
    said = bound({"cpu_busy": 0.04, "gpu_busy": {"0": 0.11}}, start=3.7, wall=11.8)
    assert said == "start-up (the first shard committed at 3.7 s of 11.8 s; none saturated: CPU 4%, GPU 0 11%)"
    assert bound({"cpu_busy": 0.41}, start=1.0, wall=10.0) == "none saturated (CPU 41%)"


def test_usage_measures_the_hosts_cpu_without_a_gpu():
    u = Usage(()).start()
    sum(i * i for i in range(2_000_000))  # (some work on this core)
    got = u.stop()
    assert 0.0 < got["cpu_busy"] <= 1.0 and "gpu_busy" not in got


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads' CPU time is read from Linux's /proc")
def test_each_thread_s_cpu_time_is_counted_by_its_name():
    """A GPU worker's shards carry each thread's CPU seconds ("cpu: NAME"; a pool's threads together): the
    threads running Python are those the hardware decoder's thread waits for."""
    import concurrent.futures
    import threading
    import time

    def spin(seconds: float) -> None:
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass

    before = thread_cpu()
    alone = threading.Thread(target=spin, args=(0.3,), name="gpubatch-test-spin")
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="gpubatch-test-pool") as pool:
        alone.start()
        futures = [pool.submit(spin, 0.2) for _ in range(2)]
        time.sleep(0.05)
        while any(not f.done() for f in futures):
            time.sleep(0.01)
        during = thread_cpu()  # (the pool's threads alive, the lone thread maybe ended)
        alone.join()
    got = cpu_since(before, during)
    assert got["cpu: gpubatch-test-pool"] >= 0.35  # (two threads of 0.2 s each, 10-ms ticks)
    assert "cpu: gpubatch-test-pool_0" not in got and all(v > 0 for v in got.values())
    after = thread_cpu()  # (the lone thread ended: its time counts among the others)
    assert "gpubatch-test-spin" not in after and after["(others)"] >= during.get("(others)", 0.0)


def test_gpus_are_parsed_and_refused_in_one_line():
    assert parse_gpus("all") is None and parse_gpus("0,1,3") == (0, 1, 3) and parse_gpus(" 2 ") == (2,)
    for bad, said in (("0,x", "give all, or GPU ordinals"), ("1,1", "names a GPU twice"), ("-1", "give all")):
        with pytest.raises(UsageError, match=said):
            parse_gpus(bad)
    with pytest.raises(UsageError, match="--device cpu for none"):
        resolve_gpus("cpu", 0, "all")


def test_gpus_fall_back_to_the_cpu_under_auto_and_are_refused_under_gpu(monkeypatch):
    from gpubatch.engine import device

    monkeypatch.setattr(device, "gpu_problem", lambda i=0: ("no CUDA device found", ""))
    d = resolve_gpus("auto", 0, "all")
    assert not d.is_gpu and d.reason == "auto: --gpus all: no CUDA device found" and d.indexes == ()
    with pytest.raises(UsageError, match="--gpus 0,1: no CUDA device found"):
        resolve_gpus("gpu", 0, "0,1")


def test_several_gpus_name_the_device_and_each_worker_sees_its_own(monkeypatch):
    from gpubatch.engine import device
    from gpubatch.engine.execute.worker import RunContext
    from gpubatch.engine.plan import Plan

    monkeypatch.setattr(device, "gpu_problem", lambda i=0: (None, "NVIDIA H200") if i < 4 else
                        (f"--gpu {i} does not exist: this machine has 4 GPU(s) (0..3)", ""))
    d = resolve_gpus("auto", 0, "1,3")
    assert str(d) == "gpus:1,3 (2 x NVIDIA H200)" and d.indexes == (1, 3) and d.index == 1
    with pytest.raises(UsageError, match="--gpus 0,5: GPU 5 does not exist"):
        resolve_gpus("auto", 0, "0,5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    ctx = RunContext(opener=None, sink=None, plan=Plan(), device=d, gpu_procs=2, on_gpu=True)
    assert ctx.host_procs == 4
    seen = [ctx.for_slot(k) for k in range(4)]
    assert [(c.device.index, c.gpu_label, c.gpu_ordinal, env) for c, env in seen] == [
        (0, "1", 1, {"CUDA_VISIBLE_DEVICES": "5"}), (0, "3", 3, {"CUDA_VISIBLE_DEVICES": "7"}),
        (0, "1", 1, {"CUDA_VISIBLE_DEVICES": "5"}), (0, "3", 3, {"CUDA_VISIBLE_DEVICES": "7"})]
    one = Device(DeviceKind.GPU, 0, "NVIDIA H200")
    assert RunContext(opener=None, sink=None, plan=Plan(), device=one, on_gpu=True).for_slot(3)[1] == {}
    cpu = RunContext(opener=None, sink=None, plan=Plan(), device=d, on_gpu=False)  # (pass-through: the host's)
    assert cpu.for_slot(1) == (cpu, {})


def test_the_progress_bar_shows_a_row_a_gpu_where_workers_say_their_gpu(monkeypatch):
    import io

    from rich.console import Console

    import gpubatch.report.progress as pr
    from gpubatch.runner import _ticker

    out = io.StringIO()
    monkeypatch.setattr(pr, "console", lambda: Console(file=out, force_terminal=True, width=100, color_system=None))
    with pr.progress_bar("convert -> webdataset") as start:
        tick = _ticker(start(100))
        tick(30, "0")
        tick(30, "1")
        tick(40, "0")
    last = out.getvalue().split("convert -> webdataset")[-1]
    assert "100/100" in last and "gpu 0" in last and "70/?" in last and "gpu 1" in last and "30/?" in last
    seen = []
    plain = _ticker(seen.append)  # (a caller's own callback gets the count alone)
    plain(5, "0")
    plain(3)
    assert seen == [5, 3]


def test_the_device_probe_begun_ahead_is_waited_for_and_asked_once(monkeypatch):
    """``probe_ahead`` (the command's start, beside its imports) asks the probe in a thread; ``gpu_problem`` waits
    for it and gives its answer, which a second ask does not repeat."""
    import threading

    asked, gate = [], threading.Event()

    def slow(index=0):
        gate.wait(5)
        asked.append(index)
        return ("no CUDA device found", "")

    monkeypatch.setattr(device, "_gpu_problem", slow)
    monkeypatch.setattr(device, "_AHEAD", {})
    device.probe_ahead(3)
    device.probe_ahead(3)  # (once)
    assert len(device._AHEAD) == 1 and device._AHEAD[3].is_alive() and asked == []
    threading.Timer(0.2, gate.set).start()
    assert device.gpu_problem(3) == ("no CUDA device found", "") and asked[0] == 3
    assert not device._AHEAD[3].is_alive()
