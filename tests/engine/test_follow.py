"""The decode route as the load on the host changes (gpubatch.engine.gpu.follow, affinity.HostLoad)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpubatch.engine.gpu.affinity import HostLoad
from gpubatch.engine.gpu.follow import RouteFollower


def test_route_changes_after_checks_in_a_row_want_it():
    f = RouteFollower("split", cores=16, split_min=15, confirm=2, margin=0.5, hold=0)
    assert f.observe(0.5, 1) == "split"
    assert f.observe(8.0, 2) == "split"  # one check wants the hardware route: not yet
    assert f.observe(0.0, 3) == "split"  # and the next does not: the count starts again
    assert f.observe(8.0, 4) == "split"
    assert f.observe(8.0, 5) == "hardware"
    assert f.observe(1.0, 6) == "hardware"  # 15 free again: back after two checks
    assert f.observe(1.0, 7) == "split"
    assert f.switches == [(5, "hardware", 8.0), (7, "split", 15.0)] and f.checks == 7


def test_a_load_near_the_threshold_does_not_flap():
    """The split route is left below split_min less the margin, taken again at split_min; a route is
    held ``hold`` seconds after a change whatever the checks say."""
    f = RouteFollower("split", cores=16, split_min=15, confirm=1, margin=0.5, hold=10)
    assert [f.observe(o, t) for t, o in enumerate((1.2, 1.4, 1.3), start=1)] == ["split"] * 3  # 14.6-14.8 free
    assert f.observe(1.6, 4) == "hardware"  # 14.4 free
    assert f.observe(0.0, 5) == "hardware"  # the cores free again, but within the hold
    assert f.observe(0.0, 13) == "hardware"
    assert f.observe(0.0, 14) == "split"
    assert [r for _, r, _ in f.switches] == ["hardware", "split"]


def test_route_that_started_on_hardware_splits_once_the_cores_are_free():
    f = RouteFollower("hardware", cores=32, split_min=15, confirm=1)
    assert f.observe(20.0, 1) == "hardware"  # 12 free
    assert f.observe(9.5, 2) == "split"  # another run's 9.5 cores leave 22.5
    assert f.switches == [(2, "split", 22.5)]


_SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"


def test_others_is_the_busy_time_less_this_process_trees(monkeypatch):
    """``others`` is the cores' busy time less this process tree's, per second of wall time (the
    arithmetic, with the clock and the counters given: no dependence on the machine's load)."""
    from gpubatch.engine.gpu import affinity

    clock = iter([100.0, 102.0])
    ticks = iter([[1000, 0, 10], [1000 + 3 * 2 * 100, 0, 10 + 100]])  # busy 3 cores for 2 s; 0.5 core stolen
    own = iter([5.0, 7.0])  # this tree: 1 core for 2 s
    monkeypatch.setattr(affinity.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(affinity, "cpu_ticks", lambda cpus: next(ticks))
    monkeypatch.setattr(affinity.HostLoad, "own_cpu", staticmethod(lambda: next(own)))
    monkeypatch.setattr(affinity.os, "sysconf", lambda name: 100)
    load = HostLoad()
    out = load.take()
    assert out["ours"] == pytest.approx(1.0) and out["others"] == pytest.approx(2.0)
    assert out["steal"] == pytest.approx(0.5)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_this_process_tree_holds_its_children_not_a_process_reparented_away():
    """A busy process of this one's own (the feed's readers are such) counts as ours; one started
    through a shell that exited (re-parented away) does not. Checked by membership, not by how busy the
    machine lets them be."""
    from gpubatch.engine.gpu import affinity

    child = subprocess.Popen([sys.executable, "-c", _SPIN.format(s=3)])
    out = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', _SPIN.format(s=3)],
                         check=True, capture_output=True, text=True)
    away = int(out.stdout.strip())
    try:
        time.sleep(0.2)
        tree = affinity.tree_cpu_seconds()
        assert child.pid in tree and os.getpid() in tree
        assert away not in tree
    finally:
        child.kill()
        child.wait()
        try:
            os.kill(away, 9)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_process_tree_found_by_children_files_or_by_parents(monkeypatch):
    """This process's tree (a child and its grandchild) the same whether read through the threads'
    ``children`` files or, where the kernel keeps none, by every process's parent."""
    from gpubatch.engine.gpu import affinity

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)'])\n"
                              "time.sleep(3)\np.wait()\n"])
    try:
        time.sleep(0.5)
        fast = affinity.tree_cpu_seconds()
        grandchild = [p for p in fast if affinity.stat_cpu(f"/proc/{p}/stat")[0] == child.pid]

        def none(pid):
            raise FileNotFoundError(pid)

        monkeypatch.setattr(affinity, "_children", none)
        slow = affinity.tree_cpu_seconds()
    finally:
        child.kill()
        child.wait()
    assert len(grandchild) == 1  # (other tests may have left children of their own)
    assert {os.getpid(), child.pid, *grandchild} <= set(fast) & set(slow)
