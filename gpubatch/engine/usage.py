"""What a run kept busy: the host's CPU cores (``/proc/stat``) and each GPU's SMs and video decoders
(NVML), sampled while the run works, and the resource that bound it.

A run is bound by what it saturates: the CPU cores where they were busy most of the run, a GPU's
engines (its SMs, or its NVDEC engines for video) where one of them was, otherwise the disk when
writing took most of the host workers' time, or its start when the first shard came late in the run.
Where nothing was near full the run was bound by its own waits (each worker's serial path), and the
summary says that instead of guessing.
"""

from __future__ import annotations

import threading
from typing import Any

#: busy above this fraction of the run counts as saturated
SATURATED = 0.85
#: a run whose first shard came after this share of its time was bound by its start (processes, CUDA,
#: decoders), whatever it saturated after
START_SHARE = 0.3


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot (:func:`~.gpu.affinity.cpu_ticks`; time the
    hypervisor gave to other machines counts as not busy), or None off Linux."""
    from .gpu.affinity import cpu_ticks

    t = cpu_ticks()
    return None if t is None else (t[0], sum(t))


def thread_cpu() -> dict[str, float]:
    """CPU seconds each thread of this process has used, by thread name (a pool's threads together:
    ``gpubatch-encode_0`` and ``_1`` as ``gpubatch-encode``), and the rest of the process's time as
    "(others)": threads Python did not start (the CUDA driver's, nvImageCodec's) and threads that ended.
    Read from ``/proc/self/task`` (10-ms ticks); empty off Linux. In a process whose threads run Python, a
    thread's CPU time is mostly time it held the interpreter's lock, which a thread of native calls (the
    hardware decoder's) must wait for."""
    import os

    try:
        tick = os.sysconf("SC_CLK_TCK")
        total = _task_ticks("/proc/self/stat")
    except (OSError, ValueError, AttributeError):
        return {}
    out: dict[str, float] = {}
    named = 0
    for t in threading.enumerate():
        if t.native_id is None:
            continue
        try:
            ticks = _task_ticks(f"/proc/self/task/{t.native_id}/stat")
        except (OSError, ValueError):
            continue  # (a thread that ended meanwhile)
        head, _, tail = t.name.rpartition("_")
        base = head if head and tail.isdigit() else t.name  # (a pool's thread: its pool's name)
        out[base] = out.get(base, 0.0) + ticks / tick
        named += ticks
    out["(others)"] = max(0, total - named) / tick
    return out


def _task_ticks(path: str) -> int:
    """utime + stime of a ``/proc`` stat file (fields 14 and 15; the name, field 2, may hold spaces)."""
    with open(path) as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def cpu_since(before: dict[str, float], now: dict[str, float], prefix: str = "cpu: ") -> dict[str, float]:
    """The CPU seconds of each thread between two :func:`thread_cpu` readings, as timings (``prefix`` +
    name): a run's summary sums them over its shards and workers."""
    return {f"{prefix}{k}": round(v - before.get(k, 0.0), 3) for k, v in now.items() if v - before.get(k, 0.0) > 0}


class Usage:
    """Samples, every ``interval`` s between :meth:`start` and :meth:`stop`, the host's CPU busy fraction
    and, for each of ``gpus`` (CUDA ordinals), the GPU's SM and decoder utilisation (NVML; none without
    it). :meth:`stop` returns the means: ``{"cpu_busy": 0.93, "gpu_busy": {"0": 0.41}, "nvdec_busy": {...}}``."""

    def __init__(self, gpus: tuple[int, ...] = (), interval: float = 0.25):
        self.interval = interval
        self.handles: dict[int, Any] = {}
        self.nvml = None
        if gpus:
            from .gpu.memory import _nvml, nvml_index

            self.nvml = _nvml()
            if self.nvml is not None:
                for i in gpus:
                    try:
                        self.handles[i] = self.nvml.nvmlDeviceGetHandleByIndex(nvml_index(i))
                    except Exception:  # noqa: BLE001 - a GPU NVML does not list: not sampled
                        pass
        self.sums: dict[str, dict[int, float]] = {"gpu": {}, "dec": {}}
        self.samples = 0
        self._cpu0 = _cpu_times()
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def _sample(self) -> None:
        for i, h in self.handles.items():
            try:
                self.sums["gpu"][i] = self.sums["gpu"].get(i, 0.0) + self.nvml.nvmlDeviceGetUtilizationRates(h).gpu
                self.sums["dec"][i] = self.sums["dec"].get(i, 0.0) + self.nvml.nvmlDeviceGetDecoderUtilization(h)[0]
            except Exception:  # noqa: BLE001 - a driver without the query
                pass
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> Usage:
        self._cpu0 = _cpu_times()
        if self.handles:
            self._t = threading.Thread(target=self._loop, name="gpubatch-usage", daemon=True)
            self._t.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._t is not None:
            self._t.join(timeout=2)
        out: dict[str, Any] = {}
        end = _cpu_times()
        if self._cpu0 is not None and end is not None and end[1] > self._cpu0[1]:
            out["cpu_busy"] = round((end[0] - self._cpu0[0]) / (end[1] - self._cpu0[1]), 3)
        if self.samples:
            for key, name in (("gpu", "gpu_busy"), ("dec", "nvdec_busy")):
                if self.sums[key]:
                    out[name] = {str(i): round(v / self.samples / 100.0, 3) for i, v in sorted(self.sums[key].items())}
        return out


def bound(usage: dict[str, Any], write_share: float | None = None, start: float | None = None,
          wall: float | None = None) -> str:
    """The resource that bound a run, from what :class:`Usage` measured, the share of the workers' time
    spent writing (host units, where writing is the sink's own time) and when the first shard was
    committed of the run's ``wall`` seconds: "CPU cores (93% busy)", "GPU 0 SMs (91% busy)", "GPU 1 video
    decoders (88% busy)", "disk (writing: 71% of the workers' time)", "start-up (the first shard committed
    at 3.7 s of 12.4 s; none saturated: CPU 4%, GPU 0 11%)", or "none saturated (CPU 41%, GPU 0 38%)"."""
    found: list[tuple[float, str]] = []
    cpu = usage.get("cpu_busy")
    if cpu is not None:
        found.append((cpu, f"CPU cores ({cpu:.0%} busy)"))
    for key, what in (("gpu_busy", "SMs"), ("nvdec_busy", "video decoders")):
        for i, v in (usage.get(key) or {}).items():
            found.append((v, f"GPU {i} {what} ({v:.0%} busy)"))
    top = max(found, default=None)
    if top is not None and top[0] >= SATURATED:
        return top[1]
    if write_share is not None and write_share >= 0.5:
        return f"disk (writing: {write_share:.0%} of the workers' time)"
    parts = [f"CPU {cpu:.0%}"] if cpu is not None else []
    parts += [f"GPU {i} {v:.0%}" for i, v in (usage.get("gpu_busy") or {}).items()]
    idle = ", ".join(parts)
    if start is not None and wall and start / wall >= START_SHARE:
        return f"start-up (the first shard committed at {start:.1f} s of {wall:.1f} s" + (
            f"; none saturated: {idle})" if idle else ")")
    return "none saturated" + (f" ({idle})" if idle else "")
