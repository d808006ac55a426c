#!/usr/bin/env python3
"""Where a ``convert`` process's wall time goes, seen from its own main thread: the records written over time
(the progress callback), and what the main thread waited in before the first record and after the last one
(its stack sampled every 4 ms), through the Python API in this process.

    python3 benchmarks/convert_timeline.py SRC [--runs 3] [--to webdataset] [--device gpu] \\
        [--resize-shorter 256] [--center-crop 224] [--quality 90] [--json out.json]

Each run writes into a temporary folder beside SRC. Prints, per run, the seconds from this process's start at
which 1%, 10%, ... 100% of the records were written, when ``convert`` returned, the run's own wall timings, and
the main thread's stacks (innermost frames, then gpubatch's run frames) held 12 ms or more after the last record.
On an H200 (2026-12-04, benchmarks/RESULTS.md) it showed a GPU run's end waiting 0.2 s for its last commits and
0.23 s for its worker process to die.
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

#: the frames that say where in a run the main thread is
RUN_FILES = ("runner.py", "local.py", "_publish.py", "_commit.py", "journal.py", "api.py", "early.py", "shards.py")
#: frames of waiting machinery, left out of a stack's innermost part
WAITING = ("threading.py", "queues.py", "connection.py", "<frozen")


class Sampler:
    """The main thread's stack every ``interval`` s, from a daemon thread."""

    def __init__(self, interval: float = 0.004):
        self.interval, self.samples = interval, []
        self.main = threading.main_thread().ident
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="timeline-sampler").start()

    def _run(self) -> None:
        while not self._stop.is_set():
            f = sys._current_frames().get(self.main)
            stack = []
            while f is not None and len(stack) < 40:
                stack.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}:{f.f_lineno}")
                f = f.f_back
            self.samples.append((time.time() - T0, tuple(stack)))
            time.sleep(self.interval)

    def stop(self) -> None:
        self._stop.set()

    def spans(self, lo: float, hi: float, depth: int = 4, least: float = 0.012) -> list[tuple[float, float, str]]:
        """(start, seconds, where) of each stretch in [lo, hi] the stack's place held, ``least`` s or more."""
        out, prev, since = [], None, lo
        for t, stack in self.samples:
            if not lo <= t <= hi:
                continue
            inner = [x for x in stack if not x.startswith(WAITING)][:depth]
            ours = [x for x in stack if x.startswith(RUN_FILES)][:3]
            key = " < ".join(inner) + " || " + " < ".join(ours)
            if key != prev:
                if prev is not None:
                    out.append((round(since, 3), round(t - since, 3), prev))
                prev, since = key, t
        if prev is not None:
            out.append((round(since, 3), round(hi - since, 3), prev))
        return [s for s in out if s[1] >= least]


def one_run(src: Path, options: dict) -> dict:
    from gpubatch import api

    ticks: list[tuple[float, int]] = []

    def progress(total: int):
        def tick(n: int, gpu: object = None) -> None:
            ticks.append((time.time() - T0, n))
        return tick

    with tempfile.TemporaryDirectory(prefix="timeline-", dir=src.parent) as tmp:
        sampler = Sampler()
        called = time.time() - T0
        summary = api.convert(str(src), str(Path(tmp) / "out"), progress=progress, **options)
        returned = time.time() - T0
        sampler.stop()
        shutil.rmtree(Path(tmp) / "out", ignore_errors=True)
    total, n, written = summary.records_out, 0, []
    for t, k in ticks:
        n += k
        written.append((t, n))
    at = {f"{int(m * 100)}%": next((round(t, 3) for t, c in written if c >= m * total), None)
          for m in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)}
    last = written[-1][0] if written else called
    return {"records": total, "called": round(called, 3), "returned": round(returned, 3), "written_at": at,
            "timings": {k: v for k, v in summary.timings.items() if k.startswith("wall: ")},
            "after_last_record": sampler.spans(last - 0.02, returned),
            "before_first_record": sampler.spans(called, written[0][0] if written else returned)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--to", default="webdataset")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--resize-shorter", type=int, default=256)
    ap.add_argument("--center-crop", type=int, default=224)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    options = {"to": a.to, "device": a.device, "resize_shorter": a.resize_shorter, "center_crop": a.center_crop,
               "quality": a.quality}
    runs = []
    for _ in range(a.runs):
        r = one_run(a.src.resolve(), options)
        runs.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "before_first_record"}, indent=None))
    if a.json:
        a.json.write_text(json.dumps({"src": str(a.src), "options": options, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
