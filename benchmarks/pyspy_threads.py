#!/usr/bin/env python3
"""Where one thread's time goes, from py-spy's raw samples with native stacks: in a native call (the
library function ctypes called, and the CUDA driver call under it), waiting to take the GIL back (after
which call), idle on a lock or queue, or running Python (its line).

    py-spy record --native --threads --idle -r 100 -f raw -o RAW -- python3 benchmarks/hw_rate.py ...
    python3 benchmarks/pyspy_threads.py RAW[.gz] --thread hw-decode [--top 12] [--json OUT]

A sample waits for the GIL where its stack ends in ``pthread_cond_timedwait`` outside any lock or queue
wait and outside the native library's own frames (CPython 3.12's ``take_gil``, inlined where the
interpreter or an extension takes the GIL back); the frame it waits under says which call let it go.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path

LIBRARIES = ("libnvjpeg", "libnvimgcodec", "libnvcuvid")  # the native libraries a decoder's thread calls
DRIVER_CALLS = ("cuMemcpyAsync", "cuLaunchKernel", "cuEventRecord", "cuEventSynchronize", "cuStreamSynchronize",
                "cuEventQuery", "cuStreamWaitEvent", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemFree_v2",
                "cuMemAlloc_v2", "ioctl")  # (cuMemFree waits for the device; ioctl: nvcuvid's calls to the kernel driver)


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def classify(frames: list[str]) -> str:
    """One sample's place (``frames``: outermost first)."""
    stack = ";".join(frames)
    if "PyThread_acquire_lock" in stack or "lock_PyThread_acquire_lock" in stack:
        return "idle: a lock or queue wait"
    lib = next((i for i, f in enumerate(frames) if any(x in f for x in LIBRARIES)), None)
    python = [f for f in frames if ".py:" in f]
    waits = "pthread_cond_timedwait" in ";".join(frames[-3:])
    if lib is not None:
        call = next((_name(f) for f in frames[lib:] if any(x in f for x in LIBRARIES) and not f.startswith("0x")),
                    "?")
        inner = frames[lib:]
        if waits and not any(x in ";".join(inner[-6:]) for x in (*LIBRARIES, "libcuda")):
            return f"GIL wait after {call}"
        driver = next((c for c in DRIVER_CALLS if any(f.startswith(c + " ") for f in inner)), "other")
        return f"in {call} > {driver}"
    if waits:
        native = [f for f in frames if ".py:" not in f and not f.startswith("0x") and "libc.so" not in f]
        after = _name(native[-2]) if len(native) > 1 else "?"
        where = python[-1] if python else "?"
        if "_ctypes" in ";".join(frames[-4:]):
            after = "a ctypes call"
        return f"GIL wait after {after} at {where}"
    return "Python: " + (python[-1] if python else _name(frames[-1]))


def tally(raw: Path, thread: str) -> collections.Counter:
    opener = gzip.open if raw.suffix == ".gz" else open
    counts: collections.Counter = collections.Counter()
    with opener(raw, "rt") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            name = next((x for x in frames if x.startswith("thread")), "")
            if thread in name:
                counts[classify(frames[frames.index(name) + 1 :])] += int(n)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path)
    ap.add_argument("--thread", required=True, help="a part of the thread's name (py-spy's 'thread (TID): NAME')")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    counts = tally(a.raw, a.thread)
    total = sum(counts.values())
    if not total:
        raise SystemExit(f"no samples of a thread named like {a.thread!r} in {a.raw}")
    print(f"{a.thread}: {total} samples")
    for place, n in counts.most_common(a.top):
        print(f"  {n:6d} {n / total:6.1%}  {place}")
    if a.json:
        a.json.write_text(json.dumps({"raw": a.raw.name, "thread": a.thread, "samples": total,
                                      "places": dict(counts.most_common())}, indent=1) + "\n")


if __name__ == "__main__":
    main()
