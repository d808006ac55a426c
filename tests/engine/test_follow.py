"""The decode route as the load on the host changes (gpubatch.engine.follow, affinity.HostLoad)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpubatch.engine.affinity import HostLoad
from gpubatch.engine.follow import RouteFollower


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


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_others_probe_counts_other_processes_not_this_ones_children():
    """A busy process of this one's own (the feed's readers are such) is not another's load; a busy
    process that is not a descendant is. Each spins for about a core."""
    load = HostLoad(os.sched_getaffinity(0))

    def probe():
        return load.take()["others"]

    child = subprocess.Popen([sys.executable, "-c", _SPIN.format(s=1.5)])
    time.sleep(0.2)
    probe()  # from here
    time.sleep(1.0)
    ours = probe()
    child.wait()
    # a process re-parented away from this one: started through a shell that exits at once
    subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 &', _SPIN.format(s=1.5)], check=True)
    time.sleep(0.2)
    probe()
    time.sleep(1.0)
    others = probe()
    assert ours is not None and others is not None
    assert others - ours > 0.6  # (whatever else the machine runs, it runs in both windows)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")
def test_process_tree_found_by_children_files_or_by_parents(monkeypatch):
    """This process's tree (a child and its grandchild) the same whether read through the threads'
    ``children`` files or, where the kernel keeps none, by every process's parent."""
    from gpubatch.engine import affinity

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
