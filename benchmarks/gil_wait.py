#!/usr/bin/env python3
"""What taking the interpreter's lock back costs a thread whose work is native calls, on any machine (no
GPU): a thread makes ``--calls`` calls of ``--call-ms`` milliseconds each through ctypes (libc's
``usleep``, which lets the GIL go, as nvJPEG's hardware decode call does), each followed by ``releases - 1``
short calls that let it go too (as a hardware call's wait for its instance's previous call and its
batch's initialize did), while ``--hogs`` threads run pure Python beside it. The time over
``calls * call_ms`` is the wait for the lock.

    python3 benchmarks/gil_wait.py [--calls 64] [--call-ms 11] [--switch-interval 0.001] [--json OUT]

The model of ``benchmarks/hw_rate.py --gil-threads`` (H200, 2026-12-03 "15:23 to 15:38": the engine's
calls 21,300-24,100 images a second alone, 5,400-8,300 beside two Python threads): how much of that wait
fewer releases a call, or a shorter switch interval, take away.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--call-ms", type=float, default=11.0)
    ap.add_argument("--switch-interval", type=float, default=0.001, help="seconds (the GPU engine sets 0.001)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    libc = ctypes.CDLL("libc.so.6")  # (a CDLL lets the GIL go for each call)
    sys.setswitchinterval(a.switch_interval)

    def hog(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            for i in range(1000):
                n += i

    def run(hogs: int, releases: int) -> float:
        stop = threading.Event()
        threads = [threading.Thread(target=hog, args=(stop,), daemon=True) for _ in range(hogs)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        for _ in range(a.calls):
            libc.usleep(int(a.call_ms * 1000))
            for _ in range(releases - 1):
                libc.usleep(0)
        took = time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join()
        return took

    ideal = a.calls * a.call_ms / 1000
    out: dict = {"cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                 "python": sys.version.split()[0], "switch_interval_s": a.switch_interval, "calls": a.calls,
                 "call_ms": a.call_ms, "ideal_s": round(ideal, 3), "runs": {}}
    for hogs in (0, 1, 2):
        for releases in (3, 1):
            took = statistics.median(run(hogs, releases) for _ in range(a.repeats))
            out["runs"][f"hogs {hogs}, releases a call {releases}"] = {"seconds": round(took, 3),
                                                                      "waiting_s": round(took - ideal, 3)}
            print(f"{hogs} Python threads beside it, {releases} releases a call: {took:.3f} s "
                  f"({took - ideal:+.3f} s over {ideal:.3f})", flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
