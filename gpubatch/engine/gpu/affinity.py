"""CPU placement of the GPU engine's threads: a core of its own for the hardware decoder's thread.

The GPU pipeline runs at the pace of the one thread that drives the hardware JPEG engine: it is busy
nearly all the time, over 90% of it in nvJPEG's calls (``hw_nvjpeg`` against ``hw`` in the decoder's
timings, ``the memory study (docs/engine.md) --stages``). When the scheduler puts another of the pipeline's threads (the CUDA decoder's workers, the feed's
reader processes, the consuming thread) on its core, the whole pipeline waits. :func:`reserve` takes
one core for it: the thread that builds the engine, and so every thread and process started from it
afterwards (the decoders' worker threads, the CUDA driver's, the feed's readers), leaves that core
(and its hyper-threading siblings) to the hardware decoder's thread, which :meth:`Reservation.pin`
binds to it. :meth:`Reservation.release` gives the building thread its cores back.

Only where the process may use at least ``Settings.reserve_min_cpus`` cores, on Linux;
``Settings.reserve_core`` (``GPUBATCH_RESERVE_CORE=0``) turns it off. A GPU engine per device in one process takes a core per device (counted from the last).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from ..settings import Settings

# the fewest usable cores with which a core is reserved by default (Settings.reserve_min_cpus)
MIN_CPUS = 8


def _siblings(cpu: int) -> set[int]:
    """``cpu`` and the hyper-threads sharing its core (Linux sysfs; just ``cpu`` where unreadable)."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            text = f.read().strip()
    except OSError:
        return {cpu}
    out = {cpu}
    for part in text.split(","):
        a, _, b = part.partition("-")
        if a.strip().isdigit() and (not b or b.strip().isdigit()):
            out.update(range(int(a), int(b or a) + 1))
    return out


def plan(cpus: set[int], device_index: int = 0, siblings=None, min_cpus: int = MIN_CPUS) -> tuple[int, set[int]] | None:
    """(the core for the hardware decoder's thread, the cores everything else keeps) out of ``cpus``,
    or None where fewer than ``min_cpus`` are usable: the ``device_index``-th core from the last, its
    siblings (``siblings(cpu)``, by default :func:`_siblings`) left out."""
    if len(cpus) < min_cpus:
        return None
    ordered = sorted(cpus)
    core = ordered[-1 - device_index % len(ordered)]
    others = cpus - (siblings or _siblings)(core)
    if not others or len(others) < min_cpus - 2:  # siblings took too much
        return None
    return core, others


@dataclass
class Reservation:
    """A core taken for the hardware decoder's thread (see the module docstring)."""

    core: int
    others: set[int]  # what the reserving thread (and all it starts) keeps
    thread: int  # the reserving thread's native id
    before: set[int]  # its cores before

    def pin(self) -> None:
        """Bind the calling thread to the reserved core (the hardware decoder's thread, at its start)."""
        try:
            os.sched_setaffinity(0, {self.core})
        except OSError:  # taken away meanwhile (a cgroup change): stay where the scheduler puts it
            pass

    def release(self) -> None:
        """Give the reserving thread its cores back, unless someone set others meanwhile (threads and
        processes started from it keep the narrower set)."""
        try:
            if os.sched_getaffinity(self.thread) == self.others:
                os.sched_setaffinity(self.thread, self.before)
        except OSError:  # the thread has ended
            pass


def reserve(device_index: int = 0, settings: Settings | None = None) -> Reservation | None:
    """Take a core for the hardware decoder's thread of the engine on ``device_index``: the calling
    thread leaves it from now on. None where turned off (``settings.reserve_core``), not Linux, or too
    few cores are usable (``settings.reserve_min_cpus``)."""
    st = settings or Settings.from_env()
    if not st.reserve_core or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        before = os.sched_getaffinity(0)
        got = plan(set(before), device_index, min_cpus=st.reserve_min_cpus)
        if got is None:
            return None
        core, others = got
        os.sched_setaffinity(0, others)
    except OSError:
        return None
    return Reservation(core, others, threading.get_native_id(), set(before))


def cpu_ticks(cpus: set[int] | None = None) -> list[int] | None:
    """CPU time so far, in clock ticks, from /proc/stat: [busy (user, nice, system, irq, softirq),
    idle (idle, iowait), steal], of the whole machine (its first line) or summed over ``cpus`` (their
    own lines); None where unreadable (not Linux)."""
    out = [0, 0, 0]
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                name, _, rest = line.partition(" ")
                if cpus is None and name != "cpu":
                    break
                if cpus is not None and (not name.startswith("cpu") or not name[3:].isdigit()
                                         or int(name[3:]) not in cpus):
                    continue
                f = [int(x) for x in rest.split()[:8]]
                f += [0] * (8 - len(f))
                for k, v in enumerate((f[0] + f[1] + f[2] + f[5] + f[6], f[3] + f[4], f[7])):
                    out[k] += v
                if cpus is None:
                    break
    except (OSError, ValueError):
        return None
    return out


def stat_cpu(path: str, tick: int | None = None) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds so far) of the process or thread whose /proc ``stat``
    file is ``path`` (``tick``: the clock ticks a second, read here where not given)."""
    with open(path) as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / (tick or os.sysconf("SC_CLK_TCK"))


def _children(pid: int) -> list[int]:
    """The child processes of ``pid``, from each of its threads' ``children`` file (FileNotFoundError
    where the kernel keeps none)."""
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{tid}"):  # the thread is there, the file is not
                raise
    return out


def _tree_by_children(me: int, tick: int) -> dict[int, float]:
    out, todo = {}, [me]
    while todo:
        pid = todo.pop()
        try:
            cpu, kids = stat_cpu(f"/proc/{pid}/stat", tick)[1], _children(pid)
        except FileNotFoundError:
            if pid == me:
                raise
            continue  # a descendant that has just ended
        out[pid] = cpu
        todo.extend(kids)
    return out


def tree_cpu_seconds() -> dict[int, float]:
    """CPU seconds so far of this process and every live descendant, by pid, from /proc (Linux): the
    descendants found through the threads' ``children`` files where the kernel keeps them (a few
    reads), else by every process's parent (a read per process on the machine)."""
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    try:
        return _tree_by_children(me, tick)
    except (OSError, IndexError, ValueError):
        pass
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stats[int(d)] = stat_cpu(f"/proc/{d}/stat", tick)
            except (OSError, IndexError, ValueError):
                continue
    tree, todo = set(), [me]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(c for c, (pp, _) in stats.items() if pp == pid and c not in tree)
    return {p: stats[p][1] for p in tree if p in stats}


def _cgroup_cpu(root: str) -> tuple[float, float] | None:
    """(the cores the cgroup v2 at ``root`` may use, from its ``cpu.max`` quota; its CPU seconds so
    far, from ``cpu.stat``), or None where it sets no quota (a container started with ``--cpus``
    sees every core of the host, and gets only its quota of them)."""
    try:
        with open(f"{root}/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota == "max":
            return None
        with open(f"{root}/cpu.stat") as fh:
            usage = next(int(line.split()[1]) for line in fh if line.startswith("usage_usec"))
        return int(quota) / int(period), usage / 1e6
    except (OSError, ValueError, IndexError, StopIteration, ZeroDivisionError):
        return None


def free_cores(seconds: float = 0.2, cgroup: str = "/sys/fs/cgroup") -> float:
    """Cores of those this process may use that nothing ran on over the next ``seconds`` (others'
    processes, this one's and time the hypervisor took for other machines all count as taken), and
    at most what the ``cgroup``'s CPU quota leaves; the number of usable cores where /proc/stat is
    unreadable."""
    import time

    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    a, qa, t0 = cpu_ticks(cpus), _cgroup_cpu(cgroup), time.perf_counter()
    time.sleep(seconds)
    b, qb, wall = cpu_ticks(cpus), _cgroup_cpu(cgroup), time.perf_counter() - t0
    total = sum(b) - sum(a) if a is not None and b is not None else 0
    free = float(len(cpus)) if total <= 0 else len(cpus) * (b[1] - a[1]) / total
    if qa is not None and qb is not None:
        free = min(free, max(0.0, qb[0] - (qb[1] - qa[1]) / wall))
    return free


class HostLoad:
    """CPU cores busy on average between one :meth:`take` and the next (the first: since it was made),
    from /proc: ``ours``, in this process and its live descendants (worker pools, the feed's readers;
    where /proc is unreadable this process only); ``others``, the rest of the busy time on ``cpus`` (by
    default every core of the machine); ``steal``, time the hypervisor gave to other machines. Without
    /proc/stat only ``ours``."""

    def __init__(self, cpus: set[int] | None = None) -> None:
        self.cpus = cpus
        self.tick = os.sysconf("SC_CLK_TCK")
        self._last = self._read()

    @staticmethod
    def own_cpu() -> float:
        """CPU seconds so far of this process tree (of this process where /proc is unreadable)."""
        try:
            return sum(tree_cpu_seconds().values())
        except OSError:
            import resource

            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

    def _read(self) -> tuple[float, list[int] | None, float]:
        return time.perf_counter(), cpu_ticks(self.cpus), self.own_cpu()

    def take(self) -> dict[str, float]:
        now = self._read()
        (t0, h0, o0), self._last = self._last, now
        wall = max(now[0] - t0, 1e-9)
        out = {"ours": (now[2] - o0) / wall}
        if h0 is not None and now[1] is not None:
            busy, _, steal = ((b - a) / self.tick / wall for a, b in zip(h0, now[1]))
            out.update(others=max(0.0, busy - out["ours"]), steal=steal)
        return out
