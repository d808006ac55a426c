"""benchmarks/pyspy_threads.py: py-spy's native samples of one thread sorted into native calls, GIL waits
(after which call), lock waits and Python lines."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pyspy_threads  # noqa: E402

PY = "HwBatchDecoder.decode (gpubatch/engine/codecs/nvjpeg_hw.py:204)"
CALL = ["ffi_call (libffi.so.8)", "nvjpegDecodeBatched (libnvjpeg.so.13)", "0x7f88 (libnvjpeg.so.13)"]
SAMPLES = {
    # inside the call: the driver's copy, then the library's own code
    "in nvjpegDecodeBatched > cuMemcpyAsync": [PY, *CALL, "cuMemcpyAsync (libcuda.so.580)", "0x7f8b (libcuda.so.580)"],
    "in nvjpegDecodeBatched > other": [PY, *CALL, "0x7f89 (libnvjpeg.so.13)"],
    # back from the call, waiting to take the GIL (ctypes' frames, then the condition wait)
    f"GIL wait after a ctypes call at {PY}": [PY, "0x7fb4 (_ctypes.cpython-312-x86_64-linux-gnu.so)",
                                               "pthread_cond_timedwait (libc.so.6)", "0x7fb5 (libc.so.6)"],
    # a Cython call that let the GIL go
    f"GIL wait after runtime_eventRecord at {PY}": [PY, "record (stream.cpp:9499)", "runtime_eventRecord (runtime.cpp:1)",
                                                     "runtime_check_status (runtime.cpp:2)",
                                                     "pthread_cond_timedwait (libc.so.6)", "0x7fb5 (libc.so.6)"],
    "idle: a lock or queue wait": ["_worker (concurrent/futures/thread.py:89)", "PyThread_acquire_lock_timed (python3.12)",
                                   "pthread_cond_timedwait (libc.so.6)"],
    f"Python: {PY}": ["_worker (concurrent/futures/thread.py:94)", PY],
}


def test_each_place_is_told_apart():
    for want, frames in SAMPLES.items():
        assert pyspy_threads.classify(frames) == want


def test_a_threads_samples_are_counted_from_a_raw_file(tmp_path):
    raw = tmp_path / "raw.txt.gz"
    lines = [f"process 1:\"\";thread (7): gpubatch-hw-decode_0;{';'.join(f)} {n}"
             for n, f in enumerate(SAMPLES.values(), start=1)]
    lines.append("process 1:\"\";thread (8): MainThread;" + PY + " 50")
    raw.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    counts = pyspy_threads.tally(raw, "hw-decode")
    assert sum(counts.values()) == sum(range(1, len(SAMPLES) + 1))
    assert counts["idle: a lock or queue wait"] == 5
