"""The core reserved for the hardware decoder's thread (engine/affinity.py), on this machine's CPUs."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from gpubatch.engine.gpu import affinity
from gpubatch.engine.settings import Settings

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")


def test_plan_takes_the_last_core_per_device_and_leaves_its_siblings_out():
    alone = lambda c: {c}  # noqa: E731
    assert affinity.plan(set(range(affinity.MIN_CPUS - 1)), 0, alone) is None  # too few cores
    cpus = set(range(16))
    assert affinity.plan(cpus, 0, alone) == (15, set(range(15)))
    assert affinity.plan(cpus, 1, alone) == (14, cpus - {14})  # a second GPU's engine: the next core
    # hyper-threads: core 15 shares its core with 7, which nothing else gets either
    assert affinity.plan(cpus, 0, lambda c: {c, c - 8} if c >= 8 else {c, c + 8}) == (15, cpus - {7, 15})
    assert affinity.plan({2, 5, 9, 11, 12, 13, 20, 31}, 0, alone) == (31, {2, 5, 9, 11, 12, 13, 20})


def test_plan_gives_up_where_siblings_take_too_much():
    assert affinity.plan(set(range(8)), 0, lambda c: set(range(8)) - {0}) is None


def _in_thread(fn):
    """Run ``fn`` in a thread of its own (its CPU mask changes never touch the test runner's), returning
    its result or raising its error."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


TWO = Settings(reserve_min_cpus=2)  # reserving made possible with 2 cores


@pytest.fixture
def two_cores(monkeypatch):
    """Reserving made possible with this machine's cores (CI has 2)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if len(cpus) < 2:
        pytest.skip("needs 2 usable cores")
    monkeypatch.setattr(affinity, "_siblings", lambda c: {c})
    return cpus


@linux
def test_reserve_pin_and_release(two_cores):
    cpus = two_cores

    def run():
        res = affinity.reserve(0, TWO)
        assert res is not None and res.core == max(cpus)
        assert os.sched_getaffinity(0) == cpus - {res.core}  # this thread leaves the core
        # a thread started from here inherits that; the hardware decoder's thread binds itself to the core
        seen = {}

        def child():
            seen["inherited"] = os.sched_getaffinity(0)
            res.pin()
            seen["pinned"] = os.sched_getaffinity(0)

        t = threading.Thread(target=child)
        t.start()
        t.join()
        assert seen == {"inherited": cpus - {res.core}, "pinned": {res.core}}
        res.release()
        return os.sched_getaffinity(0)

    assert _in_thread(run) == cpus


@linux
def test_release_leaves_a_mask_someone_else_set(two_cores):
    def run():
        res = affinity.reserve(0, TWO)
        mine = {res.core}  # neither what the engine set nor what the thread had
        os.sched_setaffinity(0, mine)  # (the user moved the thread after the engine was built)
        res.release()
        return os.sched_getaffinity(0) == mine

    assert _in_thread(run)


@linux
def test_reserve_can_be_turned_off(two_cores, monkeypatch):
    monkeypatch.setenv("GPUBATCH_RESERVE_CORE", "0")
    assert _in_thread(lambda: (affinity.reserve(0, Settings.from_env(reserve_min_cpus=2)),
                               os.sched_getaffinity(0))) == (None, two_cores)
    monkeypatch.delenv("GPUBATCH_RESERVE_CORE")
    assert _in_thread(lambda: affinity.reserve(0, Settings(reserve_core=False))) is None


def test_reserve_needs_enough_cores(monkeypatch):
    assert _in_thread(lambda: affinity.reserve(0, Settings(reserve_min_cpus=10_000))) is None


@linux
def test_reserve_leaves_out_the_cores_hyperthreads(two_cores, monkeypatch):
    cpus = two_cores
    monkeypatch.setattr(affinity, "_siblings", lambda c: set(cpus))  # every core shares the reserved one's
    assert _in_thread(lambda: (affinity.reserve(0, TWO), os.sched_getaffinity(0))) == (None, cpus)
    assert affinity.plan(set(range(16)), 0, lambda c: set(range(16))) is None  # nothing left for the rest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_cpu_ticks_of_some_cores_add_up_to_at_most_the_machines():
    cpus = sorted(os.sched_getaffinity(0))
    every, one = affinity.cpu_ticks(), affinity.cpu_ticks({cpus[0]})
    assert len(every) == len(one) == 3 and sum(one) > 0
    assert all(o <= e for o, e in zip(one, every))
    assert affinity.cpu_ticks(set()) == [0, 0, 0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_free_cores_sees_a_busy_process():
    """Free cores are counted over the cores this process may use: a process spinning on one of them
    takes about that core."""
    import subprocess

    cpus = sorted(os.sched_getaffinity(0))
    idle = affinity.free_cores(0.3)
    assert 0 <= idle <= len(cpus) + 0.05
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spin.pid, {cpus[0]})
        time.sleep(0.2)
        busy = affinity.free_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy <= len(cpus) - 0.6  # the spinning core was taken most of the time (others may be too)


def test_auto_route_by_free_cores(monkeypatch):
    from gpubatch.engine.codecs.decode_routing import choose_route
    from gpubatch.errors import UsageError

    monkeypatch.delenv("GPUBATCH_DECODE_ROUTE", raising=False)
    st = Settings.from_env()
    cut = st.split_min_cores
    assert choose_route(None, cut, 1, st) == ("split", cut)
    assert choose_route("auto", cut - 0.5, 1, st) == ("hardware", cut - 0.5)
    assert choose_route("auto", 2 * cut, 2, st) == ("split", 2 * cut)  # given: as is
    assert choose_route("hardware", 64, 1, st) == ("hardware", None)
    monkeypatch.setenv("GPUBATCH_DECODE_ROUTE", "split")
    assert choose_route(None, 1, 1, Settings.from_env()) == ("split", None)
    with pytest.raises(UsageError, match="unknown decode route 'fast'"):
        choose_route("fast", None, 1, st)


def test_free_cores_keeps_within_a_cgroups_quota(tmp_path):
    """A container given 1.5 cores of a larger host (cgroup v2 ``cpu.max``) has at most 1.5 free, less
    what its own processes used meanwhile; without a quota the host's cores count."""
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 1000\nuser_usec 800\n")
    assert affinity.free_cores(0.05, str(tmp_path)) <= 1.5
    assert affinity._cgroup_cpu(str(tmp_path)) == (1.5, 0.001)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert affinity._cgroup_cpu(str(tmp_path)) is None
    assert affinity._cgroup_cpu(str(tmp_path / "none")) is None


def test_the_hardware_route_reads_with_more_processes(monkeypatch):
    """The feed's readers: a quarter of the cores (1 to 4), half of them on the hardware route, whose
    decoders leave the cores free (on 8 cores one reader had kept the training chain read-bound)."""
    from gpubatch.engine import processes

    assert [processes.default_readers(c) for c in (2, 7, 8, 16, 64)] == [1, 1, 2, 4, 4]
    assert [processes.default_readers(c, "hardware") for c in (2, 7, 8, 16, 64)] == [1, 3, 4, 4, 4]
    assert processes.default_readers(7, "split") == 1
    from gpubatch.engine.settings import Settings

    assert processes.default_readers(7, "hardware", Settings(readers_hw=False)) == 1
