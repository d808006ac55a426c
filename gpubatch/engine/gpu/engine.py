"""One GPU's engine: its CUDA context settings, decoder, encoder, kernel stream, launcher and memory cap.

:class:`GpuEngine` is what the in-memory pipeline (:mod:`.pipeline`) and the GPU worker processes of
``convert`` and ``augment`` (:mod:`.images`) each own; :func:`decode_ahead` overlaps a batch's
decode with the previous batch's kernels for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..batch import PinnedStaging
from ..device import Device
from ..settings import Settings
from . import affinity
from .context import set_sync_policy
from .launch import Launcher
from .memory import parse_memory


class GpuEngine:
    """One GPU's decoder, encoder, kernel stream and memory cap."""

    def __init__(self, device: Device, cpu_threads: int = 8,
                 gpu_memory: str | int | float | None = None, share: int = 1, deterministic: bool = True,
                 jpeg_encoder: str = "batched", hw_preallocate: tuple[int, int, int] | None = None,
                 decoder_options: str = "", sync: str | None = None, hw_direct: bool | None = None,
                 cores: Any = "auto", decode_route: str | None = None, route_cores: float | None = None,
                 follow: bool = False, settings: Settings | None = None):
        """``cores``: the CPU core reserved for the hardware decoder's thread (:mod:`.affinity`): "auto"
        takes one here unless ``share`` engines share the GPU; an :class:`~.affinity.Reservation` taken
        already (before the process started threads that must leave the core); None: none. Closing
        the engine releases it. ``decode_route``: how batches are split between the decoders
        (:data:`~.settings.ROUTES`; by default ``settings.decode_route``); "auto" chooses by
        ``route_cores``, by default the cores free now (measured over 0.2 s, before this engine starts
        any thread), split between the ``share`` engines. ``follow``: where the route is "auto", it
        follows the load on the host while the run goes (:mod:`.follow`), unless ``settings.follow``
        is off. ``settings``: every other knob (:class:`~.settings.Settings`; by default from the
        environment)."""
        import sys
        import time

        from ..codecs.decode_routing import choose_route

        t = time.perf_counter()
        self.init_times: dict[str, float] = {}  # seconds of each step of the engine's start (the run's gpu_init)
        self.warm_times: dict[str, float] = {}  # seconds of each step of its warm-up (decoders, kernels, encoder)

        def step(name: str) -> None:
            nonlocal t
            now = time.perf_counter()
            self.init_times[name] = round(now - t, 4)
            t = now

        self.settings = st = settings or Settings.from_env()
        self.decode_route, self.route_cores = choose_route(decode_route, route_cores, share, st)
        follow = follow and self.route_cores is not None and st.follow
        # before CuPy touches the device: how every thread waits for it (Settings.sync)
        self.sync = set_sync_policy(device.index, sync or st.sync, only_before_context=True)
        # a core of its own for the hardware decoder's thread, taken before the CUDA context's and the
        # decoders' threads start; not where several engines share the GPU
        if cores == "auto":
            cores = affinity.reserve(device.index, st) if share <= 1 else None
        self.cores = cores

        try:
            import cupy as cp
        except Exception as e:  # (the run's device check finds CuPy without importing it)
            from ...errors import DependencyError

            if self.cores is not None:
                self.cores.release()
            raise DependencyError(f"CuPy failed to load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                                  ) from None

        from ..media import DEVICE, get_codec

        codecs = get_codec("image", "*", DEVICE)  # the GPU image decoder and encoder (imported here)
        GpuImageDecoder = codecs.decoder()
        step("imports")

        # The decoders' threads take the GIL back once per image while a call runs; with another
        # thread busy in Python each hand-over waits up to one switch interval (one busy thread:
        # 641 images/s at 1 ms, 4,802 at 0.05 ms; the decode study (docs/engine.md), group "gil"). A short
        # interval only softens that: the real cure is no busy Python threads here (engine/feed.py).
        if sys.getswitchinterval() > st.switch_interval:
            sys.setswitchinterval(st.switch_interval)
        self.cp = cp
        self.device = device
        self.dev = cp.cuda.Device(device.index)
        self.dev.use()
        from .memory import lower_stack

        lower_stack(cp, st.stack_bytes)
        free, total = cp.cuda.runtime.memGetInfo()  # (the CUDA context is made here)
        step("context")
        from .memory import ProcessMemory, nvml_index

        # what this process takes on the device, as the driver counts it, step by step (MiB)
        self.process_memory = ProcessMemory(nvml_index(device.index))
        self.memory_parts = {"context": self.process_memory.now() >> 20}
        # ``share`` processes split the cap (each worker process of a multi-process run owns one engine)
        mine = parse_memory(gpu_memory, total) // max(share, 1)
        self.cap = mine if gpu_memory is not None else None
        self.memory_limit = max(mine, 256 << 20)
        cp.get_default_memory_pool().set_limit(size=self.memory_limit)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.staging = PinnedStaging(cp)  # launch tables reach the device without the host waiting
        self.launch = Launcher(cp, self.stream, self.staging)  # the resample and step kernels' launches
        self.cpu_threads = cpu_threads
        try:
            self.decoder = GpuImageDecoder(device.index, cpu_threads, deterministic=deterministic,
                                           hw_preallocate=hw_preallocate, options=decoder_options,
                                           hw_direct=hw_direct, hw_core=self.cores, route=self.decode_route,
                                           follow=follow, hw_later=self.cap is None, settings=st)
        except BaseException:  # no engine: the building thread gets its cores back
            if self.cores is not None:
                self.cores.release()
            raise
        self.decoder.grow_hw = self.decoder.grow_hw and self.cap is None  # (a plan counts the instances made)
        step("decoders")
        self.jpeg_encoder = jpeg_encoder
        self._encoder = None
        self._note_memory("decoders")
        self.plan = None

    def _note_memory(self, part: str) -> None:
        """What ``part`` added to this process's device memory (MiB, from NVML)."""
        if self.process_memory.ok:
            self.memory_parts[part] = max(0, (self.process_memory.now() >> 20) - sum(self.memory_parts.values()))

    def fixed_memory(self) -> tuple[int, dict[str, int]]:
        """(bytes this process holds on the device now, before its first batch; the parts, MiB), once the
        pools have let go of what they cache (what the engine's buffers hold in CuPy's pool stays
        counted: :meth:`apply` adds it to the pool's limit)."""
        self.stream.synchronize()
        self.cp.get_default_memory_pool().free_all_blocks()
        rt = self.cp.cuda.runtime
        try:
            rt.memPoolTrimTo(rt.deviceGetDefaultMemPool(self.device.index), 0)
        except Exception:  # noqa: BLE001 - no stream-ordered pool
            pass
        return self.process_memory.settled(), dict(self.memory_parts)

    def apply(self, plan: Any) -> None:
        """Spend the cap as ``plan`` (:class:`~.gpu_memory.MemoryPlan`) says: CuPy's pool limit, and the
        freed memory the driver's pool (where decoded images live) may keep."""
        self.plan = plan
        pool = self.cp.get_default_memory_pool()
        self.memory_limit = plan.pool_limit + pool.used_bytes()  # the engine's own buffers are in ``fixed``
        pool.set_limit(size=self.memory_limit)
        from ..codecs.decode_buffers import set_pool_keep

        set_pool_keep(self.cp, self.device.index, plan.decode, again=True)

    @property
    def encoder(self):
        if self._encoder is None:
            from ..media import DEVICE, get_codec

            GpuImageEncoder = get_codec("image", "*", DEVICE).encoder()
            self._encoder = GpuImageEncoder(self.device.index, self.cpu_threads, self.jpeg_encoder, self.staging)
        return self._encoder

    def warm_up(self, batch: int = 256, encoder: bool = False, regions: bool = False,
                kernels: Sequence[tuple[str, str]] = (), planes: bool = True, cuda_later: bool = False) -> float:
        """Pay the one-off costs before the first batch: the decoders' first calls (and the buffers a
        batch of ``batch`` needs; with ``regions``, the hardware engine's region calls too; without
        ``planes``, none into planes: for callers that never decode into them; ``cuda_later``: the CUDA
        decoder's call queued, not waited for, see ``GpuImageDecoder.warm_up``), the load of
        ``kernels`` (:func:`..kernels.load`; a chain's: :func:`.chain.kernels_needed`) and, with ``encoder``,
        the JPEG encoder's first use. Returns the seconds it took."""
        from concurrent.futures import ThreadPoolExecutor

        from ..kernels import load
        t0 = time.perf_counter()
        # the kernels (compiled, or read from CuPy's cache, a thread each) and the encoder's first use (its
        # kernels, its buffers) in threads, beside the decoders' first calls
        with ThreadPoolExecutor(2, thread_name_prefix="gpubatch-warm") as pool:
            loaded = pool.submit(load, kernels, self.device.index) if kernels else None
            first_encode = pool.submit(self._first_encode) if encoder else None
            self.decoder.warm_up(batch, regions, planes, cuda_later)
            t1 = time.perf_counter()
            if loaded is not None:
                loaded.result()
            t2 = time.perf_counter()
            encode_s = first_encode.result() if first_encode is not None else 0.0
        self.stream.synchronize()
        t3 = time.perf_counter()
        # (its steps, for the run's summary: "warm_up: decoders" ...; the encoder's own time, beside them, and
        # the wait for it after them)
        self.warm_times = {"decoders": round(t1 - t0, 4), "kernels": round(t2 - t1, 4),
                           "encoder (thread)": round(encode_s, 4), "encoder wait": round(t3 - t2, 4),
                           **{f"decoders: {k}": v for k, v in self.decoder.warm_steps.items() if v}}
        self._note_memory("kernels and encoder" if encoder else "kernels")
        return time.perf_counter() - t0

    def _first_encode(self) -> float:
        """The JPEG encoder's first use, on its stream and waited for: the seconds it took."""
        t0 = time.perf_counter()
        with self.cp.cuda.Device(self.device.index):
            with self.stream:
                tiny = self.cp.zeros((16, 16, 3), self.cp.uint8)
            self.encoder.encode([tiny], "jpeg", 90, self.stream)
            self.stream.synchronize()
        return time.perf_counter() - t0

    def pin_host(self, buf: Any) -> Callable[[], None] | None:
        """Page-lock the host memory of ``buf`` (the feed's shared-memory ring) for the GPU; returns
        the function that unlocks it (after waiting, through :meth:`drain`, until no copy from it is
        queued or running), or None where the driver refused (then nothing changes).

        The decoders copy each image's encoded bytes to the device with one ``cudaMemcpyAsync``; from
        pageable memory the driver stages that copy on the calling thread, which made the hardware
        decoder's thread spend 24.5 us per image in the call against DALI's 5.4 us from its pinned
        buffers (CUPTI trace, the timeline study (docs/engine.md)). From page-locked memory the copy is a DMA the
        call only queues, so the bytes must stay put until the GPU has read them: let slots go only
        in stream order (ImagePipeline does); the returned function drains the decoders first."""
        from ..device import page_lock

        locked = page_lock(buf, self.device.index)
        return None if locked is None else self.unpinning(locked)

    def unpinning(self, locked: tuple[int, Any]) -> Callable[[], None]:
        """The function that unlocks ``locked`` (:func:`~..device.page_lock`'s), once :meth:`drain` has waited until
        no copy from it is queued or running (:meth:`pin_host`'s)."""

        def unpin() -> None:
            self.drain()  # no copy from the buffer is queued or running any more
            locked[1]()

        return unpin

    def drain(self) -> None:
        """Wait until every decode handed over so far has finished, on the host and on the GPU."""
        self.decoder.drain()
        self.stream.synchronize()

    def close(self) -> None:
        self.stream.synchronize()
        self.decoder.close()
        if self._encoder is not None:
            self._encoder.close()
        if self.cores is not None:
            self.cores.release()
            self.cores = None





def decode_ahead(decode: Callable[[Any], Any], items: Iterable[Any], prefetch: int,
                 timings: dict[str, float], device: int | None = None) -> Iterator[tuple[Any, Any]]:
    """(item, decode(item)) pairs: items come from a thread, ``decode`` runs in another, at most
    ``prefetch`` decoded batches ahead of the one the consumer holds. ``timings`` gets "read_wait",
    "decode" and "decode_wait" seconds. ``device``: the CUDA device the decoding thread works on
    (a thread starts on device 0; see ``image_gpu._on_device``).

    A decode starts only once a slot is free, so at most ``prefetch + 1`` decoded batches are held at a
    time, plus the one before until its kernels finish (a plain queue of depth ``prefetch`` would hold
    one more: finished, waiting to be put). With ``prefetch=1`` batch N+1 decodes while batch N's
    kernels run, and no batch beyond that takes device memory. ``decode`` may return a result still
    being decoded (``GpuImageDecoder.decode(..., wait=False)``), which the consumer completes: the
    slots then bound how far the decoders' own threads may run ahead of it."""
    import threading

    from ..executor import prefetched, timed_next

    depth = max(1, prefetch)
    slots = threading.Semaphore(depth)
    stop = threading.Event()

    def decoded() -> Iterator[tuple[Any, Any]]:
        if device is not None:
            import cupy

            cupy.cuda.runtime.setDevice(device)
        t = time.perf_counter()
        for item in prefetched(items, depth):
            t1 = time.perf_counter()
            timings["read_wait"] += t1 - t
            while not slots.acquire(timeout=0.05):
                if stop.is_set():
                    return
            t1 = time.perf_counter()
            out = decode(item)
            t = time.perf_counter()
            timings["decode"] += t - t1
            yield item, out

    it = prefetched(decoded(), depth)
    try:
        while (got := timed_next(it, timings, "decode_wait")) is not None:
            slots.release()  # the consumer holds this batch now: the next may start decoding
            yield got
    finally:
        stop.set()
        it.close()  # stops the decode and read threads when the consumer leaves early
