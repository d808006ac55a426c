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

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError

MiB = 1 << 20
DEFAULT_GPU_MEMORY = 1 << 30  # without a cap: the bound on CuPy's pool (kernel outputs and tables)


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.I)


_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20,
          "g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12, "tib": 1 << 40}


def parse_memory(spec: str | int | float | None, total: int) -> int:
    """Bytes from "2GiB", "512MB", "0.5" (a fraction of ``total``) or a byte count."""
    if spec is None:
        return min(DEFAULT_GPU_MEMORY, total)
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        value, unit = float(spec), ""
    else:
        m = _SIZE.match(str(spec))
        if not m:
            raise UsageError(f"--gpu-memory {spec!r}: give a size like 2GiB, 512MiB or a fraction like 0.5")
        value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if value <= 0:
        raise UsageError(f"--gpu-memory {spec!r}: give a size above 64 MiB (2GiB, 512MiB) or a fraction above 0")
    if unit == "" and value <= 1.0:
        out = int(value * total)
    elif unit not in _UNITS:
        raise UsageError(f"--gpu-memory {spec!r}: unknown unit {unit!r}")
    else:
        out = int(value * _UNITS[unit])
    if out < 64 << 20:
        raise UsageError(f"--gpu-memory {spec!r} is below 64 MiB: too small for any batch")
    return out


def _nvml() -> Any:
    """pynvml, initialised, or None (no NVML bindings, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no bindings or no driver: memory is unknown
        return None


def nvml_index(cuda_index: int) -> int:
    """NVML's index of CUDA device ``cuda_index`` (NVML ignores ``CUDA_VISIBLE_DEVICES``; numeric
    entries are mapped, others left as they are)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    try:
        return int(visible[cuda_index])
    except (IndexError, ValueError):
        return cuda_index


def descendants(pid: int) -> set[int]:
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


#: how long a process's CUDA context may hold the driver's default stack before gpubatch lowers it
#: (``Settings.stack_bytes``): its first milliseconds, 518 MiB on an H100 before 258 (benchmarks/gpu_memory.py
#: caps, steps_mib), which a cap below a bare context's size cannot hold
CONTEXT_START_S = 0.25


def _starting(first: dict[int, float], t: float, pids: Any) -> bool:
    """Whether a sample at ``t`` s of the processes ``pids`` falls in one's first :data:`CONTEXT_START_S`
    on the GPU (``first``: when each was first seen, updated here)."""
    for p in pids:
        first.setdefault(p, t)
    return any(t - first[p] <= CONTEXT_START_S for p in pids)


class ProcessMemory:
    """Device memory of the processes ``pids`` (with ``children``: and every process they start) on
    GPU ``index``, in bytes: :meth:`now` once, or sampled every ``interval`` s between :meth:`start` and
    :meth:`stop` (which returns the peak; with ``trace``, every sample is kept in :attr:`trace`). ``ok`` is
    False without NVML (then everything reads 0)."""

    def __init__(self, index: int = 0, pids: list[int] | None = None, children: bool = False,
                 interval: float = 0.02, trace: bool = False):
        self.pids = list(pids or [os.getpid()])
        self.children, self.interval = children, interval
        self.nvml = _nvml()
        self.ok = self.nvml is not None
        self.method = "nvml per process" if self.ok else "none"
        self.peak = 0
        # the peak outside each process's first CONTEXT_START_S on the GPU (its CUDA context starting at
        # the driver's default stack, before gpubatch lowers it), and when each process was first seen
        self.peak_started = 0
        self.first_seen: dict[int, float] = {}
        # (seconds from start, bytes, the processes on the GPU then)
        self.trace: list[tuple[float, int, frozenset]] | None = [] if trace else None
        self.on_gpu: set[int] = set()  # the processes of ours the last sample found on the GPU
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
                pids |= descendants(p)
        return pids

    def now(self) -> int:
        """The run's device memory now."""
        if not self.ok:
            return 0
        ours = self._ours()
        total, seen = 0, False
        self.on_gpu = set()
        for fn in (self.nvml.nvmlDeviceGetComputeRunningProcesses, self.nvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                procs = fn(self.handle)
            except Exception:  # noqa: BLE001 - a driver without the call
                continue
            for p in procs:
                if p.pid in ours and p.usedGpuMemory:
                    total += int(p.usedGpuMemory)
                    seen = True
                    self.on_gpu.add(p.pid)
        if seen:
            self._matched = True
            self.method = "nvml per process"
            return total
        if self._matched:  # ours were seen before and have all ended
            return 0
        self.method = "device in use above the start"
        return max(0, self._device_used() - self.base)

    def settled(self, quiet: float = 0.06, most: float = 1.0) -> int:
        """:meth:`now` once it has held still for ``quiet`` seconds (at most ``most``): a reading taken at
        once, right after a stream was synchronized, may come before what was just allocated shows in NVML's
        per-process figure (not measured apart: waiting for a still figure costs a plan tens of ms)."""
        t_end = time.perf_counter() + most
        last, since = self.now(), time.perf_counter()
        while self.ok and time.perf_counter() < t_end:
            time.sleep(0.01)
            v = self.now()
            if v != last:
                last, since = v, time.perf_counter()
            elif time.perf_counter() - since >= quiet:
                break
        return last

    def start(self) -> ProcessMemory:
        if self.ok and self._t is None:
            self._t = threading.Thread(target=self._run, name="gpubatch-memory", daemon=True)
            self._t.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            used = self.now()
            self.record(time.perf_counter() - t0, used)
            self.sampled()
            time.sleep(self.interval)

    def record(self, t: float, used: int) -> None:
        """Take a sample of ``used`` bytes at ``t`` seconds, the processes :attr:`on_gpu` then."""
        self.peak = max(self.peak, used)
        if not _starting(self.first_seen, t, self.on_gpu):
            self.peak_started = max(self.peak_started, used)
        if self.trace is not None:
            self.trace.append((t, used, frozenset(self.on_gpu)))

    def sampled(self) -> None:
        """Called after every sample, on the sampling thread (what a subclass reads beside the memory)."""

    def stop(self) -> int:
        """Stop sampling; the peak in bytes (0 without NVML)."""
        self._stop.set()
        if self._t is not None:
            self._t.join()
            self._t = None
        return self.peak


def over_cap(trace: list[tuple[float, int, frozenset]], cap: int) -> list[tuple[float, int]]:
    """The samples of a :class:`ProcessMemory` trace above ``cap`` bytes, other than those within
    :data:`CONTEXT_START_S` of a process's first appearance on the GPU (its context starting)."""
    first: dict[int, float] = {}
    return [(t, used) for t, used, pids in trace if not _starting(first, t, pids) and used > cap]


@contextlib.contextmanager
def watch(device_index: int | tuple[int, ...], stats: Any) -> Iterator[None]:
    """Sample the device memory of this process and every process it starts while the block runs, on
    GPU ``device_index`` (or on each of several); the peak goes into ``stats.gpu_memory`` (``peak_mib``,
    ``method``; the largest GPU's where there are several, each GPU's in ``per_gpu_mib``), beside what the
    run put there: the peak outside each process's first :data:`CONTEXT_START_S` on the GPU, and where a
    context's start went higher, that too (``context_start_mib``)."""
    indexes = (device_index,) if isinstance(device_index, int) else tuple(device_index)
    mems = {i: ProcessMemory(nvml_index(i), [os.getpid()], children=True).start() for i in indexes}
    try:
        yield
    finally:
        peaks = {i: (m.stop(), m) for i, m in mems.items()}
        ok = {i: (p, m) for i, (p, m) in peaks.items() if m.ok}
        if ok:
            top = max(ok, key=lambda i: ok[i][1].peak_started)
            peak, mem = ok[top]
            stats.gpu_memory.update(peak_mib=mem.peak_started >> 20, method=mem.method)
            if len(indexes) > 1:
                stats.gpu_memory.update(per_gpu_mib={str(i): m.peak_started >> 20 for i, (_, m) in ok.items()})
            if peak >> 20 > mem.peak_started >> 20:  # a context's first moment went higher: said beside it
                stats.gpu_memory.update(context_start_mib=peak >> 20)


def lower_stack(cp: Any, stack_bytes: int | None) -> None:
    """Lower the CUDA context's stack per GPU thread to ``stack_bytes`` (None: the driver's default): the
    context reserves it for every thread the GPU can hold (260 MiB of a 518 MiB context on an H100)."""
    if stack_bytes is not None and cp.cuda.runtime.deviceGetLimit(0) > stack_bytes:
        cp.cuda.runtime.deviceSetLimit(0, stack_bytes)  # cudaLimitStackSize


def start_capped(spec: str, device_index: int, stack_bytes: int | None) -> tuple[int, ProcessMemory, int]:
    """For a run planned in this process: (the cap in bytes, a :class:`ProcessMemory` of this process, what
    the process holds once its CUDA context is made with its stack lowered)."""
    import cupy as cp

    dev = cp.cuda.Device(device_index)
    dev.use()
    lower_stack(cp, stack_bytes)
    cap = parse_memory(spec, dev.mem_info[1])
    mem = ProcessMemory(nvml_index(device_index))
    cp.zeros(1)
    dev.synchronize()
    return cap, mem, mem.settled()


def spread(entries: list[Any], n: int) -> list[Any]:
    """At most ``n`` of ``entries``, spread evenly over them (a plan's sample of a dataset)."""
    return entries[:: max(1, len(entries) // n)][:n]


@dataclass(frozen=True)
class ImageNeed:
    """What one image of a dataset takes on the device, from a sample of its headers: ``decoded``
    bytes (uint8 RGB, the largest in the sample) held from its decode until its batch's chain has read
    it (in the driver's pool), and ``work`` bytes in CuPy's pool (the output, its encoded bytes, the
    encoder's scratch)."""

    decoded: int
    work: int
    size: tuple[int, int] = (0, 0)

    @property
    def total(self) -> int:
        return self.decoded + self.work


#: the image a plan assumes where no header was read (an in-memory pipeline before its first batch)
DEFAULT_IMAGE = (640, 640)


def image_need(height: int, width: int, out_height: int | None = None, out_width: int | None = None) -> ImageNeed:
    """The device bytes of one ``height`` x ``width`` image whose chain makes an ``out_height`` x
    ``out_width`` output (by default the same size): the decode, and for the chain four times the
    output's uint8 bytes (the output, a float16 or resampled intermediate's share, the encoded bytes
    and the encoder's scratch)."""
    oh, ow = out_height or height, out_width or width
    return ImageNeed(height * width * 3, 4 * oh * ow * 3, (height, width))


def sample_need(read: Any, entries: list[Any], plan: Any, n: int = 48) -> ImageNeed:
    """The largest :func:`image_need` among ``n`` entries spread over the dataset, read with ``read``
    (a format reader's ``read``) and their headers parsed (JPEG; others through Pillow); records that do
    not read or parse are passed over (the run reports them). :data:`DEFAULT_IMAGE` where none did."""
    from ...types import Record
    from ..codecs.headers import jpeg_display_size, probe

    best: ImageNeed | None = None
    for entry in spread(entries, n):
        try:
            record = read(entry)
        except Exception:  # noqa: BLE001 - a bad record is the run's to report
            continue
        if not isinstance(record, Record) or not isinstance(record.data, (bytes, bytearray, memoryview)):
            continue
        data = bytes(record.data)
        hw = jpeg_display_size(data[:65536])
        if hw is None:
            try:
                head = probe(data)
            except ValueError:
                continue
            hw = (head.height, head.width)
        h, w = hw
        try:
            oh, ow = plan.out_hw(h, w, plan.draw(record.key, h, w))
        except Exception:  # noqa: BLE001 - an op that refuses this size: the run reports it
            oh, ow = h, w
        need = image_need(h, w, max(oh, 1), max(ow, 1))
        if best is None or need.total > best.total:
            best = need
    return best or image_need(*DEFAULT_IMAGE)


@dataclass(frozen=True)
class MemoryPlan:
    """How a GPU process spends its share ``cap`` of ``--gpu-memory``.

    Attributes:
        cap: the process's share of the cap, bytes.
        fixed: what the process took before its first batch (measured): context, decoders, encoder.
        parts: ``fixed`` by part, MiB, as a refusal names them.
        need: one image's bytes (:class:`ImageNeed`).
        batch: images per batch (at most the batch asked for).
        ahead: batches decoded ahead of the one in the chain.
        decode: the bytes decoded images may hold (``batch * held(ahead) * need.decoded``); the driver's
            pool keeps at most this much freed memory.
        pool_limit: CuPy's pool limit: all the cap leaves after ``fixed`` (a decoder may put its images in
            either pool; the batch size bounds what both hold together, this limit backs it up).
        call_bytes: where the decoders decode in calls of at most so many bytes (``ImagePipeline``'s
            chunked decode), those bytes; ``batch`` is then the most images a call holds.
    """

    cap: int
    fixed: int
    parts: dict[str, int]
    need: ImageNeed
    batch: int
    ahead: int
    decode: int
    pool_limit: int
    call_bytes: int = 0

    def describe(self) -> str:
        head = f"{self.fixed // MiB} MiB before the first batch ({named(self.parts)})"
        if self.call_bytes:
            return f"{head}, decode calls of at most {self.batch} images and {-(-self.call_bytes // MiB)} MiB"
        return f"{head}, batches of {self.batch} with {self.ahead} decoded ahead"


def named(parts: dict[str, int]) -> str:
    """"context 258, decoders 66": the parts of a plan (MiB), as its summary and a refusal name them."""
    return ", ".join(f"{k} {v}" for k, v in parts.items())


def below(spec: str, least: int, parts: dict[str, int]) -> str:
    """The refusal of a cap ``spec`` below the ``least`` bytes a run needs, made of ``parts`` (MiB)."""
    return f"--gpu-memory {spec} is below the {-(-least // MiB)} MiB this run needs at least: {named(parts)}"


class CapTooSmall(ValueError):
    """A cap below what the process takes before its first batch plus one image."""


#: what a plan leaves free beyond the measured fixed cost and the batches: the state the decoders and
#: the encoder take at their first batch of real images (sized by them, not by the tiny images of the
#: warm-up), 82-88 MiB above a plan with a 24 MiB margin on an H100 (benchmarks/gpu_memory.py caps at
#: ae06566, benchmarks/RESULTS.md 2026-11-25 night), and the allocators' rounding; on an H200 the same state
#: took 168 MiB: runs under 512 MiB with a 128 and a 144 MiB margin both peaked at 522 MiB, 354 of them
#: before the first batch, whatever the batch (tests/engine/test_gpu_memory_gpu.py, 2026-11-27); on an H100 on
#: 2026-12-06 a run under 576 MiB held 576.16 MiB from its first batch on with a 176 MiB margin, so 16 MiB more;
#: on 2026-12-07 two runs of three under 576 MiB, each the test alone, held 578 MiB from 1.4 s on with 192 (batches
#: of 10: the state, not the batches), and again with 216 (batches of 2): the state after the fixed cost took 224
#: MiB, so 240 (such a cap is refused now, naming the minimum)
MARGIN = 240 * MiB


def held(ahead: int) -> int:
    """Batches of decoded images a GPU process may hold with decoding ``ahead`` batches ahead
    (:func:`~.engine.decode_ahead`): those ahead, the one in the chain, and the one before it
    until its kernels have run."""
    return max(1, ahead) + 2


def plan_memory(cap: int, fixed: int, parts: dict[str, int], need: ImageNeed, batch: int, ahead: int = 2,
                spec: str | None = None, least_batch: int = 32, outputs: int = 0, unit: str = "image") -> MemoryPlan:
    """The plan for a process that took ``fixed`` bytes before its first batch (``parts``: by name, MiB)
    and whose images need ``need``, asked for batches of ``batch`` decoded ``ahead`` batches ahead;
    ``outputs``: bytes a batch holds whatever the plan (an in-memory pipeline's output batch, the
    caller's size), named in a refusal. ``batch * (held(ahead) * decoded + work)`` must fit what the cap
    leaves: decoding runs less far ahead (down to one batch) while a batch of ``least_batch`` would
    otherwise not fit, then batches shrink. Raises :class:`CapTooSmall`, naming the minimum and its
    parts, where one ``unit`` (an image, a record) does not fit."""
    room = cap - fixed - MARGIN - outputs

    def per_image(a: int) -> int:
        return held(a) * need.decoded + need.work

    if room < per_image(1):
        least = fixed + MARGIN + outputs + per_image(1)
        shown = {k: v for k, v in parts.items() if v} | ({"outputs": -(-outputs // MiB)} if outputs else {})
        raise CapTooSmall(below(spec or f"{cap // MiB}MiB", least, shown | {f"one {unit}": -(-per_image(1) // MiB)}))
    a = max(1, ahead)
    while a > 1 and room // per_image(a) < min(batch, least_batch):
        a -= 1
    b = max(1, min(batch, room // per_image(a)))
    decode = b * held(a) * need.decoded
    return MemoryPlan(cap, fixed, parts, need, b, a, decode, room + outputs)


def audio_need(plan: Any, rate: int, samples: int, channels: int) -> int:
    """The device bytes one record of ``channels`` x ``samples`` at ``rate`` Hz takes at most in ``plan``'s
    chain on the GPU (its op that takes the most): for a waveform op its input and output and a stacked
    copy of each; for a feature op its input, the windowed frames, the spectrum (complex) and cuFFT's work
    area of that size, the power and the features. Speed perturbation counts its slowest factor (the
    longest output); other draws are the record's own."""
    from ..ops.spectral import FeatureOp

    h, w = rate, samples
    params = plan.draw("", h, w)
    peak = 0
    for op, p in zip(plan.ops, params):
        if op.name == "speed":
            p = min(op.factors)
        oh, ow = op.out_hw(h, w, p)
        if isinstance(op, FeatureOp):
            bins = op.n_fft // 2 + 1
            need = 4 * w + ow * (4 * op.n_fft + 16 * bins + 4 * bins) + 8 * oh * ow
        else:
            need = 4 * (2 * w + 2 * ow)
        peak = max(peak, channels * need)
        h, w = oh, ow
    # (a FLAC record decoded on the GPU first: its bytes, at most 4 a sample, beside its float32 samples)
    return max(peak, channels * 8 * samples)
