"""What the CPU audio path's habits are worth, one record at a time on one core: the Whisper and
audio-clf chains per record (a worker's work: decode, chain, float16), with glibc's malloc as it comes
and with the worker processes' setting (``engine.processes._MALLOC``), the silent-tail skip on and off,
NumPy's FFT of a record's frames in float32 and float64, libsndfile's decode alone (float32 and int16
samples: the share of a record that decoding takes) and FFmpeg's through PyAV, the GPU feed's worker
task (decode into shared memory) with its slab mapped afresh for every task and kept mapped, and a CPU
``convert`` to log-mel with and without the command line's ``keep_freed_memory``.

Each figure is the median of --repeats runs over the same synthetic clips (made once, cached), in a
process of its own with one BLAS thread.

    python3 benchmarks/audio_cpu.py --clips 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PER_RECORD = """
import sys, time, statistics
sys.path.insert(0, {root!r})
from pathlib import Path
from gpubatch.bench import MODELS
from gpubatch.pipelines.audio import _cpu_item
from gpubatch.engine.plan import Plan
from gpubatch.engine.spec import parse_chain
from gpubatch.engine.ops import audio as ops
if {full!r}:
    ops.sounding_frames = lambda x, n_fft, hop: 1 + x.shape[-1] // hop
files = sorted(Path({data!r}).glob("*.flac"))
plan = Plan(ops=parse_chain(MODELS[{model!r}].chains["train"]), media="audio", max_pixels=0)
for f in files[:4]:
    _cpu_item((str(f), "warm", plan, "float16"))
runs = []
for r in range({repeats}):
    t = time.perf_counter()
    for i, f in enumerate(files):
        _cpu_item((str(f), f"k{{i}}", plan, "float16"))
    runs.append((time.perf_counter() - t) / len(files) * 1e3)
print(statistics.median(runs))
"""

_DECODE = """
import sys, time, statistics
from pathlib import Path
import soundfile as sf
files = sorted(Path({data!r}).glob("*.flac"))
runs = []
for r in range({repeats} + 1):
    t = time.perf_counter()
    for f in files:
        sf.read(str(f), dtype={dtype!r}, always_2d=True)
    runs.append((time.perf_counter() - t) / len(files) * 1e3)
print(statistics.median(runs[1:]))
"""

_PYAV = """
import time, statistics
from pathlib import Path
import av
import numpy as np
files = sorted(Path({data!r}).glob("*.flac"))
def one(f):
    with av.open(str(f)) as c:
        s = c.streams.audio[0]
        return np.concatenate([fr.to_ndarray() for fr in c.decode(s)], axis=-1)
runs = []
for r in range({repeats} + 1):
    t = time.perf_counter()
    for f in files:
        one(f)
    runs.append((time.perf_counter() - t) / len(files) * 1e3)
print(statistics.median(runs[1:]))
"""

_FEED = """
import sys, time, statistics
sys.path.insert(0, {root!r})
from pathlib import Path
from multiprocessing import shared_memory
from gpubatch.engine.gpu import audio_feed
files = sorted(Path({data!r}).glob("*.flac"))
visits = [(str(f), f.stem) for f in files]
shm = shared_memory.SharedMemory(create=True, size=audio_feed.SLAB_BYTES)
held = []
def fresh(name, feed):  # a fresh mapping of the slab for every task, closed after it (as the feed did)
    m = shared_memory.SharedMemory(name=name)
    held.append(m)
    return m
if {fresh!r}:
    audio_feed._attach = fresh
def tasks():
    for k in range(0, len(visits), 8):
        audio_feed.decode_into((shm.name, "study", audio_feed.SLAB_BYTES, visits[k: k + 8], None, 0))
        while held:
            held.pop().close()
runs = []
try:
    for r in range({repeats} + 1):
        t = time.perf_counter()
        tasks()
        runs.append((time.perf_counter() - t) / len(visits) * 1e3)
finally:
    for m in audio_feed._ATTACHED.values():
        m.close()
    audio_feed._ATTACHED.clear()
    shm.close()
    shm.unlink()
print(statistics.median(runs[1:]))
"""

_CONVERT = """
import sys, time, shutil, tempfile
sys.path.insert(0, {root!r})
import gpubatch
from gpubatch.engine.processes import keep_freed_memory
if {keep!r}:
    keep_freed_memory()
runs = []
for r in range({repeats}):
    out = tempfile.mkdtemp() + "/o"
    t = time.perf_counter()
    gpubatch.convert({data!r}, out, to="webdataset", duration=30.0, features="log-mel(n_mels=80)", device="cpu",
                     workers=1)
    runs.append(time.perf_counter() - t)
    shutil.rmtree(out, ignore_errors=True)
print(sorted(runs)[len(runs) // 2])
"""


def _run(code: str, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _fft(repeats: int) -> dict:
    import numpy as np

    frames = np.random.default_rng(0).standard_normal((501, 400))
    out = {}
    for dtype in ("float32", "float64"):
        a = frames.astype(dtype)
        np.fft.rfft(a, axis=-1)
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(20):
                np.fft.rfft(a, axis=-1)
            runs.append((time.perf_counter() - t) / 20 * 1e3)
        out[dtype] = round(statistics.median(runs), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "gpubatch" / "audio-cpu")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from gpubatch.engine.processes import _MALLOC, _ONE_THREAD
    from gpubatch.synthetic import make_audio_set

    sets = {"whisper": (10.0, 16000), "audio-clf": (5.0, 44100)}
    base = {**os.environ, **dict.fromkeys(_ONE_THREAD, "1")}
    for k in _MALLOC:
        base.pop(k, None)
    result: dict = {"clips": a.clips, "host_cores": os.cpu_count(), "per_record_ms": {}, "fft_501x400_ms": _fft(a.repeats)}
    for model, (seconds, rate) in sets.items():
        data = a.cache / f"{model}-{a.clips}"
        make_audio_set(data, a.clips, seconds=(seconds, seconds), rate=rate)
        row = {}
        for name, env, full in (("malloc as it comes", base, False), ("workers' malloc setting", {**base, **_MALLOC}, False),
                                ("workers' setting, every frame transformed", {**base, **_MALLOC}, True)):
            code = _PER_RECORD.format(root=str(ROOT), full=full, data=str(data), model=model, repeats=a.repeats)
            row[name] = round(_run(code, env), 2)
            print(f"{model:10s} {name:42s} {row[name]:7.2f} ms a record")
        for dtype in ("float32", "int16"):
            name = f"decode alone, {dtype}"
            row[name] = round(_run(_DECODE.format(data=str(data), repeats=a.repeats, dtype=dtype), {**base, **_MALLOC}), 2)
            print(f"{model:10s} {name:42s} {row[name]:7.2f} ms a record")
        try:
            name = "decode alone, FFmpeg's FLAC (PyAV)"
            row[name] = round(_run(_PYAV.format(data=str(data), repeats=a.repeats), {**base, **_MALLOC}), 2)
            print(f"{model:10s} {name:42s} {row[name]:7.2f} ms a record")
        except subprocess.CalledProcessError:
            print(f"{model:10s} PyAV not importable: its decode not timed")
        for fresh in (True, False):
            name = f"GPU feed's worker task, slab {'mapped afresh' if fresh else 'kept mapped'}"
            code = _FEED.format(root=str(ROOT), data=str(data), repeats=a.repeats, fresh=fresh)
            row[name] = round(_run(code, {**base, **_MALLOC}), 2)
            print(f"{model:10s} {name:42s} {row[name]:7.2f} ms a record")
        result["per_record_ms"][model] = row
    data = a.cache / f"whisper-{a.clips}"
    result["convert_s"] = {}
    for keep in (False, True):
        code = _CONVERT.format(root=str(ROOT), keep=keep, data=str(data), repeats=a.repeats)
        name = "keep_freed_memory" if keep else "malloc as it comes"
        result["convert_s"][name] = round(_run(code, base), 3)
        print(f"convert {a.clips} clips to log-mel (1 thread), {name}: {result['convert_s'][name]:.3f} s")
    print(f"NumPy rfft of (501, 400): {result['fft_501x400_ms']}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
