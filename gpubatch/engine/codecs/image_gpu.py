"""GPU image codecs on nvImageCodec and nvJPEG: routed batched JPEG decode and batched JPEG encode.

Decode. Each JPEG's header (SOF type, chroma subsampling) is read first and the batch is split:
part goes to the hardware JPEG engine, part to the CUDA decoder (Huffman on the GPU), both at once,
each on its own stream, and nothing waits for the GPU. By default the CUDA decoder is driven through
nvImageCodec's C API (:mod:`.nvimgcodec_c`) and the hardware engine through nvJPEG's batched API
directly (:mod:`.nvjpeg_hw`; nvImageCodec's ``HW_GPU_ONLY`` decoder where nvJPEG cannot be loaded,
or with ``hw_direct=False``), each from a thread of its own that goes through the
batches at that decoder's pace, decoding into one device buffer per batch part.
How much goes to each is the decode route (:data:`ROUTES`): "split" gives the CUDA decoder about 30%
of each batch, "hardware" gives the hardware engine every kind it takes, and "auto" chooses by the
free CPU cores, since the CUDA decoder costs about 1 ms of CPU an image and the hardware engine a
twentieth of that. Each kind keeps its hardware-engine instances (one has to reconfigure for
another kind at half speed).
Which kinds the hardware engine takes is learned, not assumed: a kind it fails is routed to the
CUDA decoder from then on. Whatever the GPU decoders refuse (CMYK, PNG, corrupt data) is
decoded by Pillow into its slot and counted as a fallback; only a record that fails there too
becomes an error. EXIF orientation is applied.

Encode. JPEG on the GPU, a whole batch per few launches (:mod:`~gpubatch.engine.codecs.jpeg_gpu`), or
nvImageCodec's CUDA encoder image by image (Hopper has no hardware JPEG encoder).
"""

from __future__ import annotations

import functools
import io
import os
import queue
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...errors import DependencyError
from ..gpu.follow import RouteFollower
from ..gpu.start import HW_INSTANCES, instances_for
from ..settings import Settings
from . import image as host
from .decode_buffers import (
    DecodeBuffers,
    _make_current,
    _RingSlot,
    set_pool_keep,
)
from .decode_calls import DecodeCalls
from .decode_python import PythonBindingDecode
from .decode_result import DecodeResult, DeviceImage
from .decode_routing import DecodeRouting, choose_route
from .headers import jpeg_ended, jpeg_kind
from .hw_instances import HwInstances
from .nvimgcodec_c import nvimgcodec
from .nvjpeg_hw import nvjpeg_driver


def _on_device(cp: Any, device_index: int, then: Any = None) -> Any:
    """A thread initializer that makes ``device_index`` the new thread's current CUDA device, then calls
    ``then``. A thread starts on device 0, and a CUDA call made there makes device 0's context: about
    500 MiB of GPU 0 taken by a run on another GPU (two ``gpubatch bench`` runs on GPUs 0 and 1 of one
    host read 1.23-1.33 GiB on GPU 0 against 0.72-0.82). For the same reason
    :meth:`GpuImageDecoder.decode`, which the caller's threads call, and the finalizers below
    (:class:`_Slab`, :class:`_Release`, :class:`_Chunk`), which run in whichever thread drops the last
    reference, make their device current first (:func:`_make_current`)."""

    def init() -> None:
        cp.cuda.runtime.setDevice(device_index)
        if then is not None:
            then()

    return init


_STREAMS: dict[tuple[int, str], Any] = {}


def _process_stream(cp, device_index: int, name: str, high: bool = False):
    """A non-blocking stream that lives as long as the process (``high``: at the device's greatest
    priority, so that its kernels are scheduled before those of other streams).

    nvImageCodec frees each decoded image on the stream it was decoded on (cudaFreeAsync); an image
    outliving a destroyed stream crashed the process at exit. These streams are never destroyed.
    """
    key = (device_index, name, high)
    if key not in _STREAMS:
        rt = cp.cuda.runtime
        if high:
            ptr = rt.streamCreateWithPriority(1, -1024)  # the driver clamps it to the greatest priority
        else:
            ptr = rt.streamCreateWithFlags(1)  # cudaStreamNonBlocking
        with warnings.catch_warnings():  # (CuPy 14 deprecates ExternalStream for Stream.from_external, whose
            warnings.simplefilter("ignore", DeprecationWarning)  # Stream would destroy the handle when collected)
            _STREAMS[key] = cp.cuda.ExternalStream(ptr, device_index)
    return _STREAMS[key]


class GpuImageDecoder(HwInstances, DecodeRouting, DecodeBuffers, DecodeCalls, PythonBindingDecode):
    """Batched, routed, stream-ordered JPEG decode on one GPU (see the module docstring).

    Each batch is split by ``route`` (:func:`choose_route`; "auto" by the ``cores`` free, measured
    when not given). On the "split" route the CUDA decoder (Huffman on the GPU, one image per CPU
    thread, about 1 ms of CPU an image) takes the share ``cuda_share`` (``settings.cuda_share``), the kinds
    the hardware engine is slowest on first, and the hardware JPEG engine takes the rest; on the
    "hardware" route the engine takes every kind it decodes (``cuda_share`` 0, three instances) and
    the CUDA decoder only what the engine does not take or fails. The engine gets one call per
    chroma-subsampling kind, each kind keeping its instances (:meth:`_hw_instance`). Neither is waited for on the GPU:
    the consumer stream waits on events of the decoder streams, so batch N+1 decodes while batch N's
    kernels run.

    ``api="c"`` (the default) drives nvImageCodec through its C API (:mod:`.nvimgcodec_c`): the
    thread that hands a batch over makes each part's code streams and output descriptors (per-image
    calls that keep the GIL instead of handing it over once per image), all of a part's images in one
    stream-ordered device buffer; then each decoder's part is decoded by a thread of its own (the
    CUDA decoder's per-image work runs on its own threads), batch after batch at that decoder's pace,
    so neither waits for the other at the end of each batch (``decode(..., wait=False)``). In the
    bench's training and validation chains that measured +17-27% over waiting for both parts of
    every batch (the memory study (docs/engine.md), ``coupled=1``). The hardware decoder waits, at the start of
    each call, until that instance's previous call has finished on the GPU, so the calls spread
    over ``hw_instances`` instances (2 on the split route): with one instance the engine alone decoded 8,800-9,700
    images/s of the mixed set, with three 13,100-17,100, one thread calling them in turn (H200;
    the decode study (docs/engine.md), group "capi", and RESULTS.md); in the pipeline, where each decoder
    goes at its own pace, two ran within 1% of three, and the third took 53-57 MiB more
    (``gpubatch bench`` and the memory study (docs/engine.md), ``hw=2``; nvImageCodec's hardware decoder).
    With ``hw_direct`` (the default where nvJPEG loads; ``settings.hw_direct``) those instances are
    :class:`~gpubatch.engine.codecs.nvjpeg_hw.HwBatchDecoder` objects and the hardware part needs no
    code streams or descriptors: its places come from the sizes the headers gave. ``hw_core`` (an
    :class:`~gpubatch.engine.gpu.affinity.Reservation`, which :class:`~gpubatch.engine.gpu.engine.GpuEngine`
    takes) binds the hardware engine's thread to a CPU core the rest of the pipeline leaves to it: that
    thread is the pipeline's pace. With ``hw_later`` (GpuEngine's default where no memory cap holds it) and a
    worker's start begun (:mod:`~gpubatch.engine.gpu.start`), the decoder is built on the start's first
    direct-path instance, and the others, which the start makes once the warm-up is done, join as they come
    (the first batch came 0.12-0.39 s sooner on H200 hosts; benchmarks/RESULTS.md, 2026-12-02).
    ``api="python"`` uses the Python binding (one instance, the CUDA decoder called from a second thread);
    it is the fallback where the C library cannot be loaded, and the reference the C path is tested against.

    The two decoders' pixels differ slightly (their IDCTs and chroma upsampling differ), so the share
    is fixed by default (``deterministic=True``): a batch is then always split the same way, and the
    same input batched the same way on the same route gives the same output bytes whatever the timing
    or process (the "auto" route is chosen once, when the decoder is made).
    ``deterministic=False`` lets the share move each batch towards equal host time of the two calls
    (Python binding only).
    """

    HW_THREADS = 4
    HW_INSTANCES = HW_INSTANCES

    def __init__(self, device_index: int = 0, cpu_threads: int = 8, hw_decoder: bool = True,
                 cuda_share: float | None = None, deterministic: bool = True, cuda_threads: int | None = None,
                 hw_preallocate: tuple[int, int, int] | None = None, options: str = "",
                 api: str | None = None, hw_instances: int | None = None, hw_direct: bool | None = None,
                 hw_core: Any = None, route: str | None = None, cores: float | None = None,
                 follow: bool = False, hw_later: bool = False, settings: Settings | None = None):

        import cupy as cp

        self.cp = cp
        self.device_index = device_index
        self.settings = st = settings or Settings.from_env()
        from ..executor import default_decoder_threads

        threads = max(1, min(cpu_threads, default_decoder_threads(st)))
        self.cuda_threads = cuda_threads or threads  # the CUDA decoder's CPU threads
        # Hardware-decoder preallocation (``hw_preallocate``: batch, height, width) reserves
        # batch x h x w x 3 bytes up front (315 MB for 256 x 640 x 640); off by default: it measured no
        # faster in steady state.
        hw_options = options
        if hw_preallocate:
            b, h, w = hw_preallocate
            hw_options += (f" nvjpeg_hw_decoder:preallocate_batch_size={b} nvjpeg_hw_decoder:preallocate_height_hint={h}"
                           f" nvjpeg_hw_decoder:preallocate_width_hint={w}")
        self._hw_options = hw_options
        self.api = api or st.decode_api
        if self.api not in ("c", "python"):
            raise ValueError(f"unknown decode API {self.api!r}: 'c' or 'python'")
        self.hw = self.cuda = self.lib = self.cuda_c = None
        self.hw_cs: list[Any] = []
        self.hw_direct: list[Any] = []  # nvjpeg_hw.HwBatchDecoder instances (the C API's hardware path)
        # ``hw_later``: the worker's start makes the instances after the first while this decoder is built, warmed
        # up and decodes (gpu/start.py); the hardware engine's thread takes them as they come (_adopt_hw)
        self.hw_later = hw_later
        self._hw_coming = 0  # instances the start is still making for this decoder
        self._cold: set[int] = set()  # (ids of those whose first call has not come yet: its seconds are timed)
        self._warming = False  # (warm_up's calls take no instance from the start: _adopt_hw)
        self.warm_steps: dict[str, float] = {}  # (the last warm-up's seconds, step by step)
        self.route = choose_route(route, cores, 1, st)[0] if hw_decoder else "cuda"
        hw_instances = hw_instances or instances_for(self.route, st)
        # the instances a call picks from first; those past them are spares, taken only where none of
        # the first has the call's kind (the split route, after the hardware route added them: _follow)
        self._hw_first = hw_instances
        self.grow_hw = st.hw_per_kind  # (an instance a kind of a batch's hardware part: _enough_hw)
        with cp.cuda.Device(device_index):
            self.stream_ordered = set_pool_keep(cp, device_index, st.pool_keep)
            cuda_options = f"{st.cuda_decoder_options} {options}"
            if self.api == "c":
                from ..gpu.start import hardware_first
                from .nvimgcodec_c import BACKEND_HYBRID_CPU_GPU, CApiError, library

                if hw_decoder:  # the library after the worker's start made the first hardware instance (gpu/start.py)
                    hardware_first(device_index)
                try:
                    self.lib = library()
                except (DependencyError, CApiError, OSError) as e:  # a wheel laid out otherwise
                    warnings.warn(f"nvImageCodec's C API is not usable ({e}); decoding through its Python "
                                  "binding", RuntimeWarning, stacklevel=2)
                    self.api = "python"
            if self.api == "c":
                if hw_decoder:
                    self._more_hw(max(1, hw_instances), st.hw_direct if hw_direct is None else hw_direct)
                self.cuda_c = self.lib.decoder(device_index, self.cuda_threads, BACKEND_HYBRID_CPU_GPU,
                                               cuda_options)
            else:
                nic = self.nic = nvimgcodec()
                self.hw = (nic.Decoder(device_id=device_index, max_num_cpu_threads=self.HW_THREADS,
                                       backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)], options=hw_options)
                           if hw_decoder else None)
                self.cuda = nic.Decoder(device_id=device_index, max_num_cpu_threads=self.cuda_threads,
                                        backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)], options=cuda_options)
            self.hw_stream = _process_stream(cp, device_index, "hw", "hw" in st.high_priority)
            self.cuda_stream = _process_stream(cp, device_index, "cuda", "cuda" in st.high_priority)
        if self.api == "python":
            self.params = self.nic.DecodeParams(apply_exif_orientation=True, color_spec=self.nic.ColorSpec.SRGB,
                                                allow_any_depth=False)
        if cuda_share is None:
            cuda_share = 0.0 if self.route == "hardware" else st.cuda_share
        self.cuda_share = cuda_share if hw_decoder else 1.0
        if not (self.hw or self.hw_cs or self.hw_direct):
            self.route = "cuda"  # (no hardware engine here)
        self.cuda_takes = st.cuda_takes
        self.deterministic = deterministic
        # ``follow``: the route follows the load on the host while the run goes (C API, both decoders)
        self.follower = self._probe = None
        if follow and self.lib is not None and (self.hw_direct or self.hw_cs) and self.route in ("split", "hardware"):
            from ..gpu.affinity import HostLoad

            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
            self._probe = HostLoad(cpus)  # (other processes' load on this process's cores)
            self.follower = RouteFollower(self.route, float(len(cpus)), st.split_min_cores, confirm=st.follow_confirm,
                                          margin=st.follow_margin, hold=st.follow_hold_s)
        self._t0 = self._next_check = time.perf_counter()
        self.route_batches = {"split": 0, "hardware": 0}  # batches decoded on each route
        self._step = 0.1
        self._hw_turn = 0  # hardware calls so far
        self._hw_last: dict[int, tuple[str | None, int]] = {}  # per instance (id): its last call's kind and number
        self._slab_cap = {True: 0, False: 0}  # the largest buffer each decoder's parts have taken
        self._most_px: dict[str, int] = {}  # per kind: the most pixels of it one batch has had (SIZE_BY_MOST)
        # the batch being handed over: its items' kinds, and per kind (count, pixels)
        self._batch: tuple[list[str | None], dict[str, tuple[int, int]]] = ([], {})
        # each decoder's chunk buffers and the next one a call takes (decode(..., chunk=N))
        self._rings: dict[bool, list[_RingSlot]] = {True: [], False: []}
        self._ring_turn = {True: 0, False: 0}  # (with CUDA_RING)
        self._ring_part = {True: 0, False: 0}  # (the parts bound, for settings.ring_banks)
        # per decoder, events after a grown slot's old buffer was freed: the pool is trimmed once they are done
        self._trims: dict[bool, deque] = {True: deque(), False: deque()}
        self._closing = False
        self.ring_waits = 0  # calls that gave up waiting for their slot and took a buffer of their own
        self.frees_late = 0  # chunk buffers a switch or growth could not give back at once (read past RING_WAIT)
        self.hw_refuses: set[str] = set()
        self.hw_takes: set[str] = set()
        # the Python binding's CUDA-decoder calls run beside its hardware calls from the calling thread;
        # with the C API each decoder's part of every batch is decoded by a thread of its own
        # (each thread starts on this decoder's device: _on_device)
        one = functools.partial(ThreadPoolExecutor, max_workers=1, initializer=_on_device(cp, device_index))
        self._side = one(thread_name_prefix="gpubatch-cuda-decode") if self.api == "python" else None
        # (``hw_core``: an affinity.Reservation whose core the hardware engine's thread is bound to)
        self._hw_thread = (one(thread_name_prefix="gpubatch-hw-decode",
                               initializer=_on_device(cp, device_index, hw_core.pin if hw_core else None))
                           if self.api == "c" else None)
        self._cuda_thread = one(thread_name_prefix="gpubatch-cuda-decode") if self.api == "c" else None
        # the direct path's calls made by a native thread, finished (their images posted) by a thread of their own;
        # started from the engine's thread, whose core (``hw_core``) it keeps
        self._driver = (self._hw_thread.submit(nvjpeg_driver, device_index, st.cache_dir, st.c_compiler).result()
                        if self.hw_direct and st.hw_native else None)
        self._hw_finish = one(thread_name_prefix="gpubatch-hw-finish") if self._driver is not None else None
        self._cpu = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpubatch-cpu-decode",
                                       initializer=_on_device(cp, device_index))
        # one decode() at a time: a second thread's call beside a running one broke the hardware
        # decoder ("Something went wrong during decoding", then a crash; the pipeline study (docs/engine.md))
        self._calling = threading.Lock()
        self._freed: deque = deque()  # (consumer event, images) of dropped batches, freed once done
        # host seconds per part of decoding (the GPU work is not waited for): header parse and split
        # ("parse"), the per-image code streams and output descriptors of each decoder's part
        # ("hw_wrap", "cuda_wrap"; with the Python binding the wrapping of its results), all in the
        # thread that hands the batch over; each decoder's calls ("hw", "cuda"), in that decoder's
        # thread with the C API (with the Python binding "cuda" is the wait for its side thread), of
        # which, decoding in chunks, the waits for a ring slot ("hw_slot", "cuda_slot"), and on the
        # hardware engine's direct path the nvJPEG calls themselves ("hw_nvjpeg"), of which the first calls of the
        # instances taken after the warm-up ("hw_first_calls", hw_later); CPU decodes ("cpu"). With a native driver
        # (decode_calls.py) "hw" is the finishing thread's time, "hw_queue" the engine's thread's queueing, and
        # "hw_nvjpeg" the driver's time in the calls, of which "hw_gpu_wait" waiting for an instance's last call (from
        # Python too: the wait inside HwBatchDecoder.decode), and the calling thread's CPU seconds in them ("hw_nvjpeg_cpu").
        # From Python with settings.hw_stream_wait, the direct path's calls that found work pending on their stream
        # ("hw_calls_behind", a count) and the wait for it before the call ("hw_stream_wait")
        self.timings = {"parse": 0.0, "hw": 0.0, "hw_wrap": 0.0, "cuda": 0.0, "cuda_wrap": 0.0, "cpu": 0.0,
                        "hw_slot": 0.0, "cuda_slot": 0.0, "hw_nvjpeg": 0.0, "hw_first_calls": 0.0, "hw_queue": 0.0,
                        "hw_gpu_wait": 0.0, "hw_calls_behind": 0.0, "hw_stream_wait": 0.0, "hw_nvjpeg_cpu": 0.0}

    def warm_up(self, batch: int = 256, regions: bool = False, planes: bool = True,
                cuda_later: bool = False) -> float:
        """Run ``batch`` tiny JPEGs (every subsampling, and gray) through each decoder once; returns the
        seconds (each step's in :attr:`warm_steps`).

        A cold decoder's first call took 1.2-1.7 s, and a later batch whose kinds outgrew what the
        hardware decoder had met cost another 0.3-0.4 s once. After this warm-up the first real batch
        took 0.03 s and no later batch stalled (the startup study (docs/engine.md), H200). Made through
        ``ImagePipeline`` on an H100, the warm-up took 0.2-0.4 s, and the first batch 0.05-0.06 s
        against 0.18-0.22 without it (2026-11-23). It also
        settles which kinds the hardware engine takes, so the routing of real batches (and with it
        their output bytes) does not depend on how far the hardware thread has got. With ``regions``
        the hardware engine's direct path also makes a region call on each instance; with ``planes`` (and
        the ``hw_planes`` setting not "never") a call into planes on each: a caller that never decodes
        into planes or regions (``convert``'s GPU image unit) leaves them out. With ``cuda_later`` the CUDA
        decoder's call is queued on its thread and not waited for: a run whose images go to the hardware
        engine (``convert``'s: the CUDA decoder takes only turned images and what the engine fails) has its
        first batch without that wait (about 0.1 s on an H200), and a part for the CUDA decoder queued after
        it waits for it there."""
        t0 = time.perf_counter()
        blobs = tiny_jpegs(batch)
        steps: dict[str, float] = {}

        def step(name: str, began: float) -> float:
            now = time.perf_counter()
            steps[name] = round(steps.get(name, 0.0) + now - began, 4)
            return now

        self._warming = True
        try:
            with self._calling:
                t = time.perf_counter()
                queued = cuda_later and self.lib is not None  # (the C API's CUDA decoder: a call queued, below)
                if self.lib is not None:
                    for _ in self.hw_cs or self.hw_direct:  # one call each: the calls take turns over the instances
                        self.first_call(True, blobs)
                    t = step("hardware", t)
                    for _ in self.hw_direct if planes and self.settings.hw_planes != "never" else ():
                        self.first_call(True, blobs, planes=True)  # (the decode into planes)
                    t = step("hardware: planes", t)
                    for _ in self.hw_direct if regions else ():  # and region calls (nvjpegDecodeBatchedEx)
                        self.first_call(True, blobs, regions=[(8, 16, 40, 64)] * len(blobs))
                    t = step("hardware: regions", t)
                    self.first_call(False, blobs, queued=queued)
                    t = step("cuda (queued)" if queued else "cuda", t)
                for decoder, stream in ((self.hw, self.hw_stream), (self.cuda, self.cuda_stream)):
                    if decoder is not None:
                        self._call(decoder, stream, blobs)
                self.hw_stream.synchronize()
                if not queued:  # (the queued call's work is the CUDA decoder's thread's to order; the others' is waited for)
                    self.cuda_stream.synchronize()
                step("nvImageCodec", t)
        finally:
            self._warming = False
            self.warm_steps = steps
        self._hw_last.clear()  # real batches' kinds take the instances afresh (_hw_instance)
        if self._hw_coming:  # the worker's start makes the others now (made beside the warm-up, they slowed it)
            from ..gpu.start import hardware_rest

            hardware_rest(self.device_index)
        return time.perf_counter() - t0

    def first_call(self, hw: bool, blobs: list[bytes], planes: bool = False,
                   regions: list[tuple[int, int, int, int] | None] | None = None, queued: bool = False) -> None:
        """One whole-part call of the hardware engine (``hw``) or the CUDA decoder on ``blobs``, the
        results dropped, waited for (the C API; for the warm-up and memory studies; ``planes`` and
        ``regions`` as :meth:`decode` takes them). ``queued`` (the CUDA decoder's): the call is queued on
        that decoder's thread as a warm-up's part (its seconds not a run's decode time), not waited for."""
        kinds = [jpeg_kind(b)[0] for b in blobs]
        lists = [list(range(len(blobs)))]
        if hw and self.hw_direct:  # a call per kind: a kind the engine refuses fails its own call only
            groups: dict[str | None, list[int]] = {}
            for i, k in enumerate(kinds):
                groups.setdefault(k, []).append(i)
            lists = list(groups.values())
        job = self._prepare(hw, blobs, regions, lists, self.hw_stream, plane_kinds=kinds if planes else None)
        if queued and not hw:
            job.warm = True
            self._cuda_thread.submit(self._run, job, blobs, regions, kinds)
            return
        grow, self.grow_hw = self.grow_hw, False  # (these blobs hold every kind: real batches' kinds decide)
        try:
            self._run(job, blobs, regions, kinds)
        finally:
            self.grow_hw = grow
        if self._hw_finish is not None:  # (the calls a native driver made, finished)
            self._hw_finish.submit(int).result()
        self._cuda_thread.submit(int).result()  # a retry of what the hardware engine failed has run
        self.hw_stream.synchronize()
        self.cuda_stream.synchronize()

    def drain(self) -> None:
        """Wait until every part handed over so far is decoded: the decoders' threads idle (the hardware
        engine's first, since what it fails goes on to the CUDA decoder's) and their streams done."""
        for pool in (self._hw_thread, self._hw_finish, self._cuda_thread, self._side) if not self._closing else ():
            if pool is not None:  # (once closed, the threads have finished)
                pool.submit(int).result()
        self.hw_stream.synchronize()
        self.cuda_stream.synchronize()

    def close(self) -> None:
        self._closing = True  # a call waiting for its ring slot gives up
        for pool in (self._side, self._hw_thread, self._hw_finish, self._cuda_thread):
            if pool is not None:
                pool.shutdown(wait=True)
        self._cpu.shutdown(wait=True)
        while self._freed:
            ev, _ = self._freed.popleft()
            ev.synchronize()
        self.hw_stream.synchronize()
        self.cuda_stream.synchronize()
        if self._hw_coming:  # (instances the start made for this decoder after its last call)
            from ..gpu.start import hardware_instances

            self.hw_direct += hardware_instances(self.device_index, self._hw_coming)
            self._hw_coming = 0
        for dec in self.hw_cs + self.hw_direct + ([self.cuda_c] if self.cuda_c else []):
            dec.close()
        self.hw_cs, self.hw_direct, self.cuda_c = [], [], None
        if self._driver is not None:  # (its calls made: the instances waited for them as they closed)
            self._driver.close()
            self._driver = None
        rt = self.cp.cuda.runtime
        for ring in self._rings.values():  # the chunk buffers (their last readers: the consumer's streams)
            for slot in ring:
                if slot.release is not None:
                    slot.release.synchronize()
                for ptr in [slot.ptr, *slot.orphans]:
                    if ptr:
                        rt.freeAsync(ptr, self.hw_stream.ptr)
                slot.ptr = slot.size = 0
                slot.orphans = []
        self.hw_stream.synchronize()

    def _collect(self) -> None:
        """Free the images of dropped batches whose consumer work has finished (never waits)."""
        q = self._freed
        while q and q[0][0].done:
            q.popleft()

    def decode(self, blobs: list[bytes], stream, max_pixels: int = 0, order: bool = True,
               headers: list[tuple[str | None, int, int]] | None = None,
               regions: list[tuple[int, int, int, int] | None] | None = None, wait: bool = True,
               chunk: int = 0, planes: bool = False) -> DecodeResult:
        """Decode ``blobs`` into uint8 RGB HWC device images, ready for work enqueued later on ``stream``.

        The host does not wait for the GPU: ``stream`` waits on the decoders' streams. Keep the
        result's ``keep`` until the kernels reading the images are enqueued; dropping it then is safe.
        With ``order=False`` that wait is left to the caller (``result.order(stream)``, just before the
        kernels that read the images): a decode thread running ahead then never makes an earlier
        batch's kernels wait for a later batch's decode. ``headers`` are the blobs' :func:`jpeg_kind`
        results when already known (a :class:`~gpubatch.engine.gpu.feed.FileFeed` parses them in its workers).
        ``regions`` gives per blob a (y0, x0, y1, x1) part to decode or None (the hardware engine's
        direct path: nvJPEG's region calls; the CUDA decoder: nvImageCodec's sub-code streams); what
        the GPU refuses is decoded whole by Pillow, and its size tells the caller so.

        ``wait=False`` (with ``order=False``) returns once the batch is handed over: with the C API the
        hardware engine's part and the CUDA decoder's part are each decoded by a thread of their own,
        batch after batch, so the decoder that is done with its part of batch N goes on to batch N+1
        while the other is still at N. ``result.order(stream)`` (or ``result.wait()``) completes the
        result; nothing else of it may be read before. The caller bounds how many batches it hands
        over ahead (``gpu.engine.decode_ahead`` does).

        ``chunk=N`` (with ``wait=False``, ``order=False``; the C API) decodes each decoder's part in
        calls of at most N images (the hardware engine's: :data:`HW_CHUNK`; at least
        :data:`MIN_CALLS`), each into a buffer that the same call of that decoder's next part reuses:
        the result is read through ``result.chunks(stream)``, call by call, and the decoded images
        take about one batch of memory instead of two (ImagePipeline runs its kernels on each chunk
        as it comes). Elsewhere ``chunk`` is ignored.

        ``planes=True`` lets the hardware engine's direct path decode 4:2:0 and
        4:2:2 JPEGs into their own planes, 1.5 and 2 bytes a pixel instead of 3: those DeviceImages
        have ``sampling`` set, and only the fused resample (``GpuEngine.resample``) reads them as they
        are. Pass it where that resample is all that reads the batch.
        """
        if chunk and (wait or order):
            raise ValueError("decode(chunk=N) needs wait=False and order=False: read it through chunks()")
        if self.lib is None or not self.stream_ordered:
            chunk = 0
        with self._calling:
            _make_current(self.cp.cuda.runtime, self.device_index)  # (whichever thread calls: _on_device)
            res = self._decode(blobs, stream, max_pixels, headers, regions, chunk, planes)
        if wait or order:
            res.wait()
        if order:  # later work on ``stream`` runs after both decoders' work
            res.order(stream)
        return res

    def _decode(self, blobs: list[bytes], stream, max_pixels: int,
                headers: list[tuple[str | None, int, int]] | None,
                regions: list[tuple[int, int, int, int] | None] | None = None, chunk: int = 0,
                planes: bool = False) -> DecodeResult:
        t_start = time.perf_counter()
        self._collect()
        n = len(blobs)
        arrays: list[Any] = [None] * n
        kinds, dims, groups, to_cpu, errors = sort_by_kind(blobs, headers, max_pixels, bool(self.hw_direct))
        if chunk:
            self._note_batch(kinds, dims, groups)
        tm = self.timings
        if self.follower is not None and t_start >= self._next_check:
            self._follow(t_start)
        if self.route in self.route_batches:
            self.route_batches[self.route] += 1
        to_hw, to_cuda = self._split(groups)
        res = DecodeResult(arrays, errors)
        if self.lib is None:  # the Python binding: both decoders' calls made here, then the fallbacks
            tm["parse"] += time.perf_counter() - t_start
            to_cpu.extend(self._gpu_python(blobs, regions, kinds, to_hw, to_cuda, stream, res))
            if res.on_gpu:
                res.ready = [s.record() for s in (self.hw_stream, self.cuda_stream)]
            t0 = time.perf_counter()
            failed = sorted(set(to_cpu))
            for i, img in self._place(res, zip(failed, self._cpu.map(
                    lambda i: _host_decode(bytes(blobs[i]), max_pixels, _region(regions, i)), failed)), stream):
                res.arrays[i] = img
            tm["cpu"] += time.perf_counter() - t0
            return res
        # the C API: each decoder's part goes to its thread, which posts what it decodes on the result's
        # queue; what the GPU cannot take starts on the CPU
        cpu_now = [(i, self._cpu.submit(_host_decode, bytes(blobs[i]), max_pixels, _region(regions, i))) for i in to_cpu]
        res.feed, res.chunked = queue.SimpleQueue(), bool(chunk)
        sink = weakref.ref(res)  # the threads post nothing once the result is dropped (freeing its memory)
        parts = 0
        for hw, lists, thread in ((True, to_hw, self._hw_thread), (False, [to_cuda], self._cuda_thread)):
            if any(lists):
                job = self._prepare(hw, blobs, regions, lists, stream, chunk, dims, kinds if planes else None)
                job.sink = sink
                thread.submit(self._run, job, blobs, regions, kinds)
                parts += 1
        res.pending = functools.partial(self._gather, parts, cpu_now, blobs, stream, max_pixels, regions)
        tm["parse"] += time.perf_counter() - t_start
        return res

    def _gather(self, parts: int, cpu_now: list[tuple[int, Any]], blobs: list[Any], stream: Any, max_pixels: int,
                regions: list | None, res: DecodeResult) -> Iterator[tuple[list[tuple[int, DeviceImage]], Any, Any]]:
        """A batch's decoded images as its decoders' threads post them, (items, owner, decode-end event)
        per call or part, then its CPU decodes (the C API path; ``parts``: the decoder parts handed over)."""
        failed: list[int] = []
        feed = res.feed
        while parts:
            msg = feed.get()
            if msg[0] == "images":  # a decode call's views, their owner, its end event, which decoder
                _, views, owner, event, hw = msg
                msg = None
                res.on_gpu += len(views)
                yield [(i, DeviceImage(ptr, shape, row, owner, sampling)) for i, ptr, shape, row, sampling in views], \
                    owner, event, hw
                owner = views = None
            elif msg[0] == "end":
                part = msg[1]
                res.hw += part.hw
                failed.extend(part.failed)
                parts += part.retried - 1
            else:
                raise msg[1]
        t0 = time.perf_counter()
        decoded = [(i, f.result()) for i, f in cpu_now]
        decoded += zip(failed, self._cpu.map(lambda i: _host_decode(bytes(blobs[i]), max_pixels, _region(regions, i)),
                                             failed))
        placed = self._place(res, decoded, stream)
        self.timings["cpu"] += time.perf_counter() - t0
        if placed:
            yield placed, None, None, None

    def _place(self, res: DecodeResult, decoded: Any, stream: Any) -> list[tuple[int, DeviceImage]]:
        """Copy CPU decodes ((index, (array, error)) pairs) to the device, ordered on ``stream``; the
        errors go to ``res``."""
        cp = self.cp
        out = []
        with cp.cuda.Device(self.device_index), stream:
            for i, (arr, err) in decoded:
                if err is not None:
                    res.errors[i] = err
                else:
                    a = cp.asarray(arr)
                    out.append((i, DeviceImage(a.data.ptr, a.shape, a.strides[0], a)))
                    res.fallbacks += 1
        return out


@functools.cache
def tiny_jpegs(n: int) -> list[bytes]:
    """``n`` 64x64 JPEGs, 4:4:4, 4:2:2, 4:2:0 and gray in turn (decoder warm-up)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (64, 64, 3), np.uint8)
    kinds = []
    for sub in (0, 1, 2, None):
        buf = io.BytesIO()
        if sub is None:
            Image.fromarray(pixels[..., 0]).save(buf, "JPEG", quality=90)
        else:
            Image.fromarray(pixels).save(buf, "JPEG", quality=90, subsampling=sub)
        kinds.append(buf.getvalue())
    return [kinds[k % len(kinds)] for k in range(n)]


def _region(regions: list | None, i: int) -> tuple[int, int, int, int] | None:
    return regions[i] if regions is not None else None


def sort_by_kind(blobs: Any, headers: list[tuple[str | None, int, int]] | None, max_pixels: int, direct: bool
                 ) -> tuple[list[str | None], list[tuple[int, int]], dict[str, list[int]], list[int], list[str | None]]:
    """A batch's blobs by the decoder that takes them: per blob its JPEG kind (:func:`jpeg_kind`, or the feed's
    ``headers``) and (width, height) as stored; the GPU's groups by kind; those left to Pillow (``to_cpu``: no JPEG
    the GPU decodes, or one without its end marker, which nvJPEG would decode as far as it goes where Pillow skips
    it, as the CPU path does); and the errors (beyond ``max_pixels``). With the hardware engine's ``direct`` path,
    a JPEG with padding after its end marker is a kind of its own ("/unended"), for nvImageCodec's checks."""
    n = len(blobs)
    errors: list[str | None] = [None] * n
    kinds: list[str | None] = [None] * n
    dims: list[tuple[int, int]] = [(0, 0)] * n
    groups: dict[str, list[int]] = {}
    to_cpu: list[int] = []
    ended = blobs.jpeg_ended() if hasattr(blobs, "jpeg_ended") else None  # (a feed's slot: its ends read at once)
    for i in range(n):
        kind, w, h = headers[i] if headers is not None else (None, 0, 0)
        if kind is None:  # not given, or not seen in the part of the file the feed looked at
            kind, w, h = jpeg_kind(bytes(blobs[i]))
        if max_pixels and w * h > max_pixels:
            errors[i] = f"image of {w}x{h} = {w * h} pixels exceeds --max-pixels {max_pixels}"
            continue
        if kind is not None and not (ended[i] if ended is not None else bytes(blobs[i][-2:]) == b"\xff\xd9"):
            if not jpeg_ended(blobs[i]):  # cut short, or other bytes after its end
                kind = None
            elif direct:
                kind += "/unended"
        kinds[i], dims[i] = kind, (w, h)
        if kind is None:
            to_cpu.append(i)
        else:
            groups.setdefault(kind, []).append(i)
    return kinds, dims, groups, to_cpu, errors


def _host_decode(data: bytes, max_pixels: int, region: tuple[int, int, int, int] | None = None
                 ) -> tuple[np.ndarray | None, str | None]:
    """An image the GPU decoders did not take, decoded on the CPU: its ``region`` (y0, x0, y1, x1) alone where
    one was asked for (the feed moved the record's window into it), as the GPU decoders give it."""
    try:
        arr = host.decode(data, max_pixels)
    except ValueError as e:
        return None, str(e)
    if region is None:
        return arr, None
    y0, x0, y1, x1 = region
    if not (0 <= y0 < y1 <= arr.shape[0] and 0 <= x0 < x1 <= arr.shape[1]):
        return None, f"cannot decode image (its region {region} is outside its {arr.shape[1]}x{arr.shape[0]} pixels)"
    return np.ascontiguousarray(arr[y0:y1, x0:x1]), None


