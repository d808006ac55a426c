"""Measurement pieces: timed windows with an injectable clock, NVML memory/utilisation sampling, CPU use.

Honesty rules (see README, "Benchmarks"): warm-up batches are excluded, the caller's ``sync`` (the GPU
stream) runs before every clock read, figures are medians of several windows with the spread kept.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..engine.gpu.affinity import HostLoad
from ..engine.gpu.memory import ProcessMemory, nvml_index


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[k]


def warmup_batches(a: dict) -> int:
    """Untimed batches before the clock starts: one pass over the data set (at least 3), so every
    contender's buffers and pools have met the largest images (the GPU decoders' internal buffers grow
    on demand: with 3 warm-up batches the decoder measured 8,225 images/s, with one pass 13,004, on one
    H200; the pipeline study (docs/engine.md) --sources decode-inline --sync lag [--warmup 3], RESULTS.md)."""
    return max(3, -(-int(a["images"]) // int(a["batch_size"])))


def timed_windows(step: Callable[[], int], seconds: float, warmup: int = 3, windows: int = 5,
                  sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter,
                  min_batches: int = 2) -> dict[str, Any]:
    """Call ``step`` (one batch; returns how many images it produced) for about ``seconds`` after
    ``warmup`` untimed calls, and split the timed run into ``windows`` windows.

    Returns images/s as the median of the window rates, their min and max, images/s over the whole
    timed run (what a producer that delivers in bursts, as a DataLoader does, is better judged by),
    p50/p99 batch latency (ms), the images and seconds timed.
    """
    for _ in range(warmup):
        step()
    sync()
    per_window = max(seconds / max(windows, 1), 1e-9)
    rates, lat = [], []
    images_total, t_start = 0, clock()
    for _ in range(max(windows, 1)):
        t0 = last = clock()
        n = batches = 0
        while batches < min_batches or last - t0 < per_window:
            n += step()
            sync()
            now = clock()
            lat.append(now - last)
            last = now
            batches += 1
        rates.append(n / max(last - t0, 1e-12))
        images_total += n
    lat.sort()
    total = clock() - t_start
    return {"images_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "whole_run_images_per_s": images_total / max(total, 1e-12),
            "window_rates": rates, "batch_ms_p50": 1e3 * percentile(lat, 0.5),
            "batch_ms_p99": 1e3 * percentile(lat, 0.99), "images": images_total,
            "seconds": total, "batches": len(lat)}


class CpuUse:
    """CPU cores busy on average, between construction and :meth:`stop`, in this process and every live
    descendant (worker pools, a forkserver's workers), from /proc; elsewhere this process only.
    :attr:`host` (after :meth:`stop`) says how loaded the whole machine was meanwhile: cores busy in
    other processes (``others``) and cores the hypervisor gave to other machines (``steal``): a run
    beside busy neighbours is slower, whatever the tool (RESULTS.md as of a1d93e1, 2026-11-23). The
    readings are :class:`~gpubatch.engine.gpu.affinity.HostLoad`'s, the decoder's load probe."""

    def __init__(self) -> None:
        self._load = HostLoad()
        self.host: dict[str, float] = {}

    def stop(self) -> float:
        """Cores busy in this process tree; fills :attr:`host`."""
        got = self._load.take()
        if "others" in got:
            self.host = {"others": round(got["others"], 2), "steal": round(got["steal"], 2)}
        return got["ours"]


class BusyLoad:
    """``n`` busy single-threaded processes while the ``with`` block runs: the machine as it is when
    other jobs share it (``gpubatch bench --busy N``). Each spins in Python and takes no memory to speak
    of; the block's end stops them. ``kind``: ``nice`` (nice 19, the default), ``normal`` (nice 0) or
    ``idle`` (SCHED_IDLE: runs only where nothing else wants the core)."""

    SETUP = {"nice": "os.nice(19)", "normal": "pass", "idle": "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))"}

    def __init__(self, n: int, kind: str = "nice"):
        if kind not in self.SETUP:
            raise ValueError(f"busy processes of kind {kind!r}: one of {', '.join(self.SETUP)}")
        self.n, self.kind = n, kind
        self.procs: list[Any] = []

    def __enter__(self) -> BusyLoad:
        import subprocess
        import sys

        code = f"import os\n{self.SETUP[self.kind]}\nwhile True:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def run_beside(cmd: list[str], load: BusyLoad, after: float = 0.0, until: float | None = None,
               timeout: float | None = None) -> Any:
    """Run ``cmd`` (its output captured, as text) with ``load`` on from ``after`` seconds into it to
    ``until`` seconds into it (None: its end): load that comes or goes while a run goes, which a route
    chosen at the start does not see (``gpubatch bench --busy-after``). Returns the
    ``subprocess.CompletedProcess``; past ``timeout`` seconds the command is killed and
    ``subprocess.TimeoutExpired`` raised."""
    import subprocess

    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def talk(at: float | None) -> tuple[str, str] | None:
        """The output once ``cmd`` ended, or None at ``at`` seconds into it (None: wait for its end)."""
        ends = [t for t in (at, timeout) if t is not None]
        try:
            return p.communicate(timeout=max(0.0, min(ends) - (time.monotonic() - start)) if ends else None)
        except subprocess.TimeoutExpired:
            if timeout is not None and time.monotonic() - start >= timeout:
                p.kill()
                p.communicate()
                raise
            return None  # (communicate again later loses nothing)

    try:
        got = talk(after) if after > 0 else None
        if got is None:
            with load:
                got = talk(until)
            if got is None:
                got = talk(None)
    except BaseException:
        if p.poll() is None:
            p.kill()
            p.wait()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, *got)


class GpuSampler(ProcessMemory):
    """The device memory of this process and every process it starts (:class:`ProcessMemory`, the
    measure ``--gpu-memory`` caps: NVML per process, the CUDA context included; where NVML does not
    name our processes, the device's memory in use above the start) and the GPU's utilisation (mean
    while :attr:`measuring`), sampled every 10 ms from construction. Without NVML both read None."""

    def __init__(self, index: int = 0):
        super().__init__(nvml_index(index), [os.getpid()], children=True, interval=0.01)
        self.util: list[int] = []
        self.measuring = False
        self.start()

    def sampled(self) -> None:
        if self.measuring:
            self.util.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def summary(self) -> dict[str, Any]:
        """Stop sampling: ``gpu_mem_gib`` (the peak), ``gpu_util_pct`` and ``gpu_mem_method``."""
        if not self.ok:
            return {"gpu_mem_gib": None, "gpu_util_pct": None}
        peak = max(self.stop(), self.now())
        return {"gpu_mem_gib": peak / 2**30, "gpu_util_pct": statistics.fmean(self.util) if self.util else None,
                "gpu_mem_method": self.method}


def bottleneck(stages: dict[str, float]) -> str | None:
    """The stage that took the most time."""
    stages = {k: v for k, v in stages.items() if isinstance(v, (int, float)) and v > 0}
    return max(stages, key=stages.get) if stages else None


class Cycle:
    """Indices 0..n-1, ``times`` times over (a DataLoader sampler)."""

    def __init__(self, n: int, times: int):
        self.n, self.times = n, times

    def __len__(self) -> int:
        return self.n * self.times

    def __iter__(self):
        for _ in range(self.times):
            yield from range(self.n)


def media_files(data: str | Path, n: int = 0, media: str = "video") -> list[Path]:
    """The video or audio files under ``data`` (gpubatch's extensions for that media), sorted; the first
    ``n`` where given: what a video or audio bench reads."""
    from ..types import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS

    exts = VIDEO_EXTENSIONS if media == "video" else AUDIO_EXTENSIONS
    files = sorted(p for p in Path(data).rglob("*") if p.suffix[1:].lower() in exts)
    return files[:n] if n else files


def timed_contender(step: Callable[[], int], a: dict, sampler: Any = None, warmup: int | None = None) -> dict[str, Any]:
    """:func:`timed_windows` over a contender's batches (``a``'s seconds; one pass over the data as the
    warm-up unless given), with the GPU ``sampler`` measuring meanwhile and the CPU cores used."""
    cpu = CpuUse()
    if sampler is not None:
        sampler.measuring = True
    res = timed_windows(step, a["seconds"], warmup=warmup_batches(a) if warmup is None else warmup)
    res["cpu_cores_used"] = cpu.stop()
    res["host_cpu"] = cpu.host
    return res


def shard_digest(root: Any) -> str:
    """SHA-256 over the names and bytes of every file member of the ``.tar`` shards under ``root``, in
    order: two runs wrote the same records exactly when their digests agree (tar headers aside)."""
    import hashlib
    import tarfile
    from pathlib import Path

    h = hashlib.sha256()
    for f in sorted(Path(root).rglob("*.tar")):
        with tarfile.open(f) as t:
            for m in t:
                if m.isfile():
                    h.update(m.name.encode())
                    h.update(t.extractfile(m).read())
    return h.hexdigest()
