"""The baselines ``bench_convert.py`` measures gpubatch's ``convert`` against, each the same work done elsewhere on
the same machine: a Pillow process pool (CPU transcode), a one-process ``tarfile`` loop (pass-through), the disk alone
(an output's durable writes), ``AudioPipeline`` (audio features) and gpubatch's NVDEC decode (video frames)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pillow_one(job: tuple[str, str]) -> int:
    from PIL import Image

    src, dst = job
    with Image.open(src) as im:
        im = im.convert("RGB")
        w, h = im.size
        s = 256 / min(w, h)
        im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
        w, h = im.size
        left, top = (w - 224) // 2, (h - 224) // 2
        im = im.crop((left, top, left + 224, top + 224))
        im.save(dst, quality=90)
    return 1


def pillow_pool(data: Path, out: Path, processes: int) -> float:
    """The CPU baseline: a Pool of ``processes`` doing Pillow open / resize(256) / crop(224) / save(q90)."""
    files = sorted(data.rglob("*.jpg"))
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    jobs = []
    for f in files:
        o = out / f.relative_to(data)
        o.parent.mkdir(parents=True, exist_ok=True)
        jobs.append((str(f), str(o)))
    t0 = time.perf_counter()
    with Pool(processes) as pool:
        n = sum(pool.imap_unordered(_pillow_one, jobs, chunksize=64))
    return n / (time.perf_counter() - t0)


def tarfile_loop(data: Path, out: Path, durable: bool = False) -> float:
    """The pass-through baseline: one process writing every file (and its class as .cls) into one tar;
    ``durable``: the tar fsynced before the clock stops, as gpubatch commits each shard it writes."""
    files = sorted(data.rglob("*.jpg"))
    out.unlink(missing_ok=True)
    os.sync()
    t0 = time.perf_counter()
    with tarfile.open(out, "w") as tar:
        for i, f in enumerate(files):
            key = f"{i:08d}"
            data_ = f.read_bytes()
            ti = tarfile.TarInfo(f"{key}.jpg")
            ti.size = len(data_)
            tar.addfile(ti, _Bytes(data_))
            cls = f.parent.name.encode()
            ti = tarfile.TarInfo(f"{key}.cls")
            ti.size = len(cls)
            tar.addfile(ti, _Bytes(cls))
        if durable:
            tar.fileobj.flush()
            os.fsync(tar.fileobj.fileno())
    return len(files) / (time.perf_counter() - t0)


def durable_writes(out: Path, sizes: list[int], chunk: int = 4 << 20, writers: int = 1) -> float:
    """Seconds to write files of ``sizes`` bytes into ``out`` (what a run wrote, shard by shard) and make each
    durable as gpubatch commits a shard: written in order by one thread, each fsynced in a second thread beside the
    next one's writes; with ``writers`` > 1, that many threads each writing and fsyncing a file at a time, as that
    many workers do. From a buffer in memory (nothing decoded, encoded or read), after the disk is synced. What
    the disk alone needs to take such an output: a floor under any run that writes it with ``--sync shard``."""
    import concurrent.futures

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    buf = memoryview(os.urandom(chunk))

    def write(i: int, size: int) -> int:
        fd = os.open(out / f"part-{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = size
        while left > 0:
            left -= os.write(fd, buf[: min(left, chunk)])
        return fd

    os.sync()
    t0 = time.perf_counter()
    if writers > 1:
        def one(job: tuple[int, int]) -> None:
            fd = write(*job)
            os.fsync(fd)
            os.close(fd)

        with concurrent.futures.ThreadPoolExecutor(writers) as pool:
            list(pool.map(one, enumerate(sizes)))
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as syncer:
            last = None
            for i, size in enumerate(sizes):
                fd = write(i, size)
                if last is not None:
                    last.result()
                last = syncer.submit(lambda fd=fd: (os.fsync(fd), os.close(fd)))
            if last is not None:
                last.result()
    seconds = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return seconds


class _Bytes:
    def __init__(self, b: bytes):
        self.b, self.i = b, 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = len(self.b) - self.i
        out = self.b[self.i : self.i + n]
        self.i += len(out)
        return out


def _in_processes(code: str, whole: int, name: str) -> float:
    """The figure ``code`` prints, run in a process of its own: its own rate (a warm figure), or with ``whole`` runs,
    the count it prints over the median of ``whole`` processes' wall time (each from its start to its end)."""
    walls = []
    for _ in range(max(1, whole)):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if p.returncode:
            raise RuntimeError(f"{name}: " + p.stderr.strip()[-1500:])
    got = json.loads(p.stdout.strip().splitlines()[-1])
    return round(got / statistics.median(walls) if whole else got, 1)


def audio_pipeline(data: Path, whole: int = 0, device: str = "gpu", flac_gpu: bool | None = None) -> float:
    """AudioPipeline on ``bench --model whisper``'s chain (16 kHz, 30 s, log-mel 80) over the same files, a
    warm-up pass then the median of 3 passes, each batch synchronized; or, with ``whole`` runs, as ``convert`` is
    timed: the median of ``whole`` processes' wall time, each one pass from its start (its imports, the GPU's start,
    the decoders' start) to its end. ``flac_gpu``: the pipeline's switch of that name (its default where None)."""
    extra = "" if flac_gpu is None else f", flac_gpu={bool(flac_gpu)!r}"
    passes = 1 if whole else 4
    code = f"""
import json, statistics, sys, time
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from gpubatch.bench import chain_ops, get_model
from gpubatch.pipelines.audio import AudioPipeline
files = sorted(Path({str(data)!r}).rglob('*.flac'))
rates = []
pipe = AudioPipeline(chain_ops(get_model('whisper').chains['train']), device={device!r}, seed=0{extra})
for rep in range({passes}):
    t0 = time.perf_counter(); n = 0
    for b in pipe.iterate_files(files, 64):
        b.synchronize()
        n += len(b)
    if rep:
        rates.append(n / (time.perf_counter() - t0))
pipe.close()
print(json.dumps(statistics.median(rates) if rates else n))
"""
    return _in_processes(code, whole, "AudioPipeline baseline")


def nvdec_rate(files: list[Path], whole: int = 0) -> float:
    """gpubatch's NVDEC decode of the same files: every frame, 4 sessions, the native loop
    (benchmarks/video_decode.py's), the median of 3 passes each after its sessions' warm-up; or, with ``whole`` runs,
    as ``convert`` is timed: the median of ``whole`` processes' wall time, each one pass from its start (its imports,
    the GPU's start, its sessions' start) to its end."""
    code = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import statistics, video_decode
blobs = [Path(p).read_bytes() for p in {[str(f) for f in files]!r}]
rates = []
for _ in range({1 if whole else 3}):
    n, s = video_decode._nvdec(blobs, 4)
    rates.append(n / s)
print(json.dumps(n if {bool(whole)!r} else statistics.median(rates)))
"""
    return _in_processes(code, whole, "NVDEC baseline")
