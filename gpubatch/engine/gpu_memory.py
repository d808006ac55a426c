"""The device memory a run takes, as the driver counts it, and the plan that keeps it under
``--gpu-memory``.

:class:`ProcessMemory` reads NVML (``nvidia-ml-py``): the device memory of each process of the run
(CUDA context, libraries' buffers and pools included), summed, sampled in a thread of its own. Where
NVML does not report this run's processes (a container whose process ids NVML gives from the host's
namespace), it counts the device's memory in use above the level at start, named in ``method``.

:class:`MemoryPlan` splits a cap between what a GPU process takes before its first batch (measured:
the context, the decoders, the encoder, the kernels) and the batches' buffers, and sizes those: the
batch, how far decoding runs ahead, the freed memory the driver's pool keeps, CuPy's pool. Below the
smallest workable size it refuses, naming the parts.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20


def _nvml() -> Any:
    """pynvml, initialised, or None (no NVML bindings, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no bindings or no driver: memory is unknown
        return None


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc; empty where there is none)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = {int(x) for x in f.read().split()}
        except OSError:
            continue
        todo.extend(kids - found)
        found |= kids
    return found


class ProcessMemory:
    """Device memory of the processes ``pids`` (with ``children``: and every process they start) on
    GPU ``index``, in bytes: :meth:`now` once, or sampled every ``interval`` s between :meth:`start` and
    :meth:`stop` (which returns the peak). ``ok`` is False without NVML (then everything reads 0)."""

    def __init__(self, index: int = 0, pids: list[int] | None = None, children: bool = False,
                 interval: float = 0.02):
        self.pids = list(pids or [os.getpid()])
        self.children, self.interval = children, interval
        self.nvml = _nvml()
        self.ok = self.nvml is not None
        self.method = "nvml per process" if self.ok else "none"
        self.peak = 0
        self._matched = False
        self._stop = threading.Event()
        self._t: threading.Thread | None = None
        if self.ok:
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self.base = self._device_used()

    def _device_used(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def _ours(self) -> set[int]:
        pids = set(self.pids)
        if self.children:
            for p in self.pids:
                pids |= _children(p)
        return pids

    def now(self) -> int:
        """The run's device memory now."""
        if not self.ok:
            return 0
        ours = self._ours()
        total, seen = 0, False
        for fn in (self.nvml.nvmlDeviceGetComputeRunningProcesses, self.nvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                procs = fn(self.handle)
            except Exception:  # noqa: BLE001 - a driver without the call
                continue
            for p in procs:
                if p.pid in ours and p.usedGpuMemory:
                    total += int(p.usedGpuMemory)
                    seen = True
        if seen:
            self._matched = True
            self.method = "nvml per process"
            return total
        if self._matched:  # ours were seen before and have all ended
            return 0
        self.method = "device in use above the start"
        return max(0, self._device_used() - self.base)

    def start(self) -> ProcessMemory:
        if self.ok and self._t is None:
            self._t = threading.Thread(target=self._run, name="gpubatch-memory", daemon=True)
            self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.interval)

    def stop(self) -> int:
        """Stop sampling; the peak in bytes (0 without NVML)."""
        self._stop.set()
        if self._t is not None:
            self._t.join()
            self._t = None
        return self.peak


@dataclass(frozen=True)
class MemoryPlan:
    """How a GPU process spends a cap of ``cap`` bytes.

    Attributes:
        cap: the process's share of ``--gpu-memory``.
        fixed: what the process takes before its first batch (measured): context, decoders, encoder.
        parts: ``fixed`` by part, MiB, as the refusal names them.
        image: the device bytes one image needs through the chain (decoded, worked on, encoded).
        batch: images per batch (at most the batch asked for).
        ahead: batches decoded ahead of the one in the chain.
        pool_keep: freed bytes the driver's pool may keep.
        pool_limit: CuPy's pool limit.
    """

    cap: int
    fixed: int
    parts: dict[str, int]
    image: int
    batch: int
    ahead: int
    pool_keep: int
    pool_limit: int

    @property
    def minimum(self) -> int:
        return self.fixed + self.image

    def summary(self) -> str:
        return (f"{self.cap // MiB} MiB cap: {self.fixed // MiB} MiB before the first batch, batches of "
                f"{self.batch} with {self.ahead} decoded ahead")


class CapTooSmall(ValueError):
    """A cap below what one image needs on top of the process's fixed cost."""


def image_bytes(height: int, width: int, out_bytes: int) -> int:
    """Device bytes one image takes through a GPU chain: its decode (uint8 RGB), the chain's working
    copies (a resampled intermediate at most the size of the decode, plus the output ``out_bytes``),
    and the encoder's output buffer (at most the output again)."""
    decoded = height * width * 3
    return 2 * decoded + 2 * out_bytes


def plan_memory(cap: int, fixed: int, parts: dict[str, int], image: int, batch: int, ahead: int = 2,
                keep: int = 512 * MiB, spec: str | None = None) -> MemoryPlan:
    """The plan for a process whose fixed cost is ``fixed`` (``parts`` by name, MiB) and whose largest
    image needs ``image`` bytes, asked for batches of ``batch`` with ``ahead`` decoded ahead: the
    batches shrink (and decoding runs less far ahead) until ``(batch * (ahead + 1)) * image`` fits what
    the cap leaves; the driver's pool keeps no more freed memory than a batch's decodes. Raises
    :class:`CapTooSmall` (its text names the minimum and its parts) where one image does not fit."""
    room = cap - fixed
    if room < image:
        need = fixed + image
        named = ", ".join(f"{k} {v}" for k, v in parts.items() if v)
        raise CapTooSmall(f"--gpu-memory {spec or f'{cap // MiB}MiB'} is below the {-(-need // MiB)} MiB this run "
                          f"needs at least: {named}, one image {-(-image // MiB)}")
    fit = room // image
    while ahead > 0 and fit < batch * (ahead + 1):
        ahead -= 1
    b = max(1, min(batch, fit // (ahead + 1)))
    work = b * (ahead + 1) * image
    keep = min(keep, b * image)
    return MemoryPlan(cap, fixed, parts, image, b, ahead, keep, max(room - keep, work))
