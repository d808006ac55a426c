#!/usr/bin/env python3
"""Where a run's processes wait off the CPU: the time between each of their context switches out and the next in,
summed by the task's state and its kernel stack, from the scheduler's switch events.

    perf record -e sched:sched_switch -g -a -o sched.data -- gpubatch convert SRC DST --to lmdb
    perf script -i sched.data > sched.txt
    python3 benchmarks/offcpu.py sched.txt [--top 16] [--json out.json]

States: ``D`` waits on I/O or a kernel lock (what a lock's contention or the disk costs), ``S`` sleeps (a futex:
the GIL, a queue, a condition; a pipe; a poll), ``R`` was preempted (CPU taken by another task). The kernel's own
threads (kworker, jbd2, kswapd...) and perf are left out, so that the sums are the run's processes' own.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from collections.abc import Iterable

_EVENT = re.compile(r"^(\S.*?)\s+(\d+)\s+\[\d+\]\s+([\d.]+): sched:sched_switch: prev_comm=(.*?) prev_pid=(\d+) "
                    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
#: the tasks left out (the kernel's threads, the idle task, perf itself)
SKIP = ("swapper", "perf", "kworker", "migration", "ksoftirqd", "rcu_", "jbd2", "kswapd", "khugepaged", "kcompactd",
        "kdamond", "memfd", "cpuhp", "idle_inject")
_SCHEDULE = {"__schedule", "schedule", "schedule_idle"}


def off_cpu(lines: Iterable[str], depth: int = 7) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], int]]:
    """(seconds, times) off the CPU by (state, kernel stack of ``depth`` frames below the scheduler's own)."""
    away: dict[int, tuple[float, str, str]] = {}
    seconds: collections.Counter = collections.Counter()
    times: collections.Counter = collections.Counter()
    event: tuple | None = None
    stack: list[str] = []

    def settle() -> None:
        if event is None:
            return
        t, prev_pid, prev_comm, state, next_pid = event
        names = [re.sub(r"\+0x[0-9a-f]+.*", "", f.split()[1]) for f in stack if "[kernel.kallsyms]" in f]
        names = [n for n in names if n not in _SCHEDULE]
        if not prev_comm.startswith(SKIP):
            away[prev_pid] = (t, state, " < ".join(names[:depth]))
        if next_pid in away:
            t0, st, sig = away.pop(next_pid)
            seconds[(st, sig)] += t - t0
            times[(st, sig)] += 1

    for line in lines:
        m = _EVENT.match(line)
        if m:
            settle()
            stack = []
            event = (float(m.group(3)), int(m.group(5)), m.group(4), m.group(6), int(m.group(8)))
        elif line.strip():
            stack.append(line.strip())
    settle()
    return dict(seconds), dict(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("script", help="perf script's output of a sched:sched_switch -g recording")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    with open(a.script, errors="replace") as f:
        seconds, times = off_cpu(f)
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])
    print(f"off the CPU, the run's processes: {sum(seconds.values()):.2f} s summed")
    for (state, sig), s in rows[: a.top]:
        print(f"{s:8.3f} s {times[(state, sig)]:7d}x  {state:2s} {sig}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"state": st, "stack": sig, "seconds": round(s, 4), "times": times[(st, sig)]}
                       for (st, sig), s in rows], f, indent=1)


if __name__ == "__main__":
    main()
