"""NVDEC decode throughput of gpubatch's video path: frames/s over a set of 1080p clips with 1, 2, 4, 7,
8 and 14 decoder sessions at once, against PyAV on every core and, with ``--dali``, DALI's video readers.

Each session is one thread with its own decoder (gpubatch.engine.gpu.video.NvdecSession), decoding every
frame of its files by index in chunks of 32 (the path convert and the pipeline take: RGB frames of their
own on the GPU). Timed after a warm-up file per session, the GPU synchronized before the clock is read;
the median of --repeats runs. DALI (``readers.video`` and ``experimental.readers.video``, on the GPU)
reads every frame of the same files as sequences of 16 in batches of 8, in a process of its own: a
warm-up of 8 batches, then one pass over the files per repeat.

    python3 benchmarks/video_decode.py --files 8 --codec h264 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _nvdec(files: list[bytes], sessions: int, gpu: int = 0, loop: str = "native") -> tuple[int, float]:
    import cupy as cp

    from gpubatch.engine.codecs.video_probe import probe
    from gpubatch.engine.gpu.video import CHUNK, NvdecSession

    infos = [probe(d) for d in files]
    counts = [i.frames for i in infos]
    work = list(range(len(files)))
    lock = threading.Lock()
    done = [0]
    ready = threading.Barrier(sessions + 1)

    def run() -> None:
        s = NvdecSession(gpu, loop=loop)
        s.open(files[0], infos[0])
        s.decode(list(range(min(CHUNK, counts[0]))))  # warm: the session's decoder and kernels exist
        s.stream.synchronize()
        ready.wait()
        ready.wait()
        while True:
            with lock:
                if not work:
                    break
                k = work.pop()
            s.open(files[k], infos[k])
            for a in range(0, counts[k], CHUNK):
                s.decode(list(range(a, min(a + CHUNK, counts[k]))))
            with lock:
                done[0] += counts[k]
        s.stream.synchronize()
        s.close()

    threads = [threading.Thread(target=run) for _ in range(sessions)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    ready.wait()
    for t in threads:
        t.join()
    cp.cuda.Device(gpu).synchronize()
    return done[0], time.perf_counter() - t0


def _pyav_one(path: str) -> int:
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        n = 0
        for f in c.decode(s):
            f.to_ndarray(format="rgb24")
            n += 1
    return n


def _pyav(paths: list[str], procs: int) -> tuple[int, float]:
    with ProcessPoolExecutor(max_workers=procs) as pool:
        list(pool.map(_pyav_one, paths[:procs]))  # warm the workers
        t0 = time.perf_counter()
        n = sum(pool.map(_pyav_one, paths))
        return n, time.perf_counter() - t0


def _dali_child(paths: list[str], reader: str, repeats: int, q) -> None:
    try:
        from nvidia.dali import fn, pipeline_def

        @pipeline_def(batch_size=8, num_threads=os.cpu_count() or 4, device_id=0, seed=0)
        def pipe():
            kw = dict(device="gpu", filenames=paths, sequence_length=16, step=16, stride=1, name="r")
            if reader == "readers.video":
                return fn.readers.video(**kw)
            return fn.experimental.readers.video(**kw)

        p = pipe()
        p.build()
        seqs = p.epoch_size("r")
        for _ in range(8):
            p.run()
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            n = 0
            while n < seqs:
                p.run()
                n += 8
            rates.append(n * 16 / (time.perf_counter() - t0))
        q.put((statistics.median(rates), seqs))
    except Exception as e:  # noqa: BLE001 - reported, not raised: the other figures stand
        q.put((None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"))


def _dali(paths: list[str], reader: str, repeats: int) -> tuple[float | None, object]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_dali_child, args=(paths, reader, repeats, q))
    proc.start()
    try:
        return q.get(timeout=600)
    finally:
        proc.join(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8, help="clips per codec")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each clip")
    ap.add_argument("--codec", default="h264,hevc")
    ap.add_argument("--sessions", default="1,2,4,7,8,14")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "gpubatch" / "video-decode")
    ap.add_argument("--no-cpu", action="store_true", help="skip the PyAV baseline")
    ap.add_argument("--dali", action="store_true", help="also DALI's video readers (when nvidia.dali imports)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    from gpubatch.synthetic import _clip

    out: dict = {"sessions": {}, "cpu": {}, "dali": {}, "files": a.files, "seconds": a.seconds, "host_cores": os.cpu_count()}
    for codec in a.codec.split(","):
        enc = {"h264": "libx264", "hevc": "libx265"}[codec]
        a.cache.mkdir(parents=True, exist_ok=True)
        paths = [a.cache / f"{codec}_1080p_{k}_{a.seconds:g}s.mp4" for k in range(a.files)]
        todo = [(p, k, 1920, 1080, enc, a.seconds, 30) for k, p in enumerate(paths) if not p.exists()]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=min(len(todo) or 1, os.cpu_count() or 1)) as pool:
            list(pool.map(_clip, todo))
        print(f"{codec}: {len(paths)} clips of 1080p x {a.seconds:g} s ready ({time.perf_counter() - t0:.0f} s)")
        data = [p.read_bytes() for p in paths]
        for n in (int(x) for x in a.sessions.split(",")):
            runs = [_nvdec(data, n) for _ in range(a.repeats)]
            fps = statistics.median(f / s for f, s in runs)
            out["sessions"].setdefault(codec, {})[n] = round(fps, 1)
            print(f"{codec} NVDEC x{n:<2}: {fps:8.0f} frames/s  ({runs[0][0]} frames a run)")
        for reader in ("readers.video", "experimental.readers.video") if a.dali else ():
            fps, info = _dali([str(p) for p in paths], reader, a.repeats)
            out["dali"].setdefault(codec, {})[reader] = round(fps, 1) if fps else info
            print(f"{codec} DALI {reader}: " + (f"{fps:8.0f} frames/s ({info} sequences of 16)" if fps else str(info)))
        if not a.no_cpu:
            f, s = _pyav([str(p) for p in paths], os.cpu_count() or 1)
            out["cpu"][codec] = round(f / s, 1)
            print(f"{codec} PyAV on {os.cpu_count()} processes: {f / s:8.0f} frames/s")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
