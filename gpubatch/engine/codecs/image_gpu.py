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

import ctypes
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import DependencyError, UsageError
from .. import follow as route_follow
from . import image as host
from . import planes as jplanes
from .headers import jpeg_kind
from .nvjpeg_hw import OUTPUT_RGBI, OUTPUT_YUV, NvjpegError, call_args


def nvimgcodec():
    try:
        from nvidia import nvimgcodec as nic
    except ImportError:
        raise DependencyError("GPU image codecs need nvImageCodec: pip install 'gpubatch[cu13]'") from None
    return nic


@dataclass
class DecodeResult:
    """Decoded images of one batch, in input order.

    Attributes:
        arrays: per item a :class:`DeviceImage` (uint8 H x W x 3 in device memory), or None when it failed.
        errors: per item None or the reason it could not be decoded by any path.
        on_gpu: how many the GPU decoders produced; ``hw`` of those by the hardware engine.
        fallbacks: how many Pillow decoded after the GPU refused them.
        keep: objects that own the device memory (the batch's stream-ordered buffers, or nvImageCodec
            Images); hold them until the kernels reading ``arrays`` are enqueued on the consumer's
            stream: dropping them then frees the memory in stream order.
        ready: events of the decoder streams that work reading ``arrays`` must wait for, not yet
            waited on (see :meth:`order`).
        waited: host seconds :meth:`wait` spent waiting for the decoders.

    A result from ``GpuImageDecoder.decode(..., wait=False)`` may still be decoding: :meth:`wait` (or
    :meth:`order`, which calls it) completes it, or :meth:`chunks` takes its images part by part as
    they are decoded; read nothing else before. A result decoded in chunks (``decode(..., chunk=N)``)
    must be read through :meth:`chunks`.
    """

    arrays: list[Any]
    errors: list[str | None]
    on_gpu: int = 0
    hw: int = 0
    fallbacks: int = 0
    keep: list[Any] = field(default_factory=list)
    ready: list[Any] = field(default_factory=list)
    waited: float = 0.0
    pending: Any = None  # a callable (this result) -> iterator of the parts still decoding
    feed: Any = None  # the queue the decoders' threads post the parts on (see GpuImageDecoder._gather)
    chunked: bool = False

    def _parts(self) -> Iterator[tuple[list[tuple[int, DeviceImage]], Any, Any, bool | None]]:
        source, self.pending = self.pending, None
        return source(self) if source is not None else iter(())

    def wait(self) -> DecodeResult:
        """Block until every image of the batch is decoded or failed (on the host side: the GPU work
        is ordered through :meth:`order`)."""
        if self.pending is not None:
            if self.chunked:
                raise RuntimeError("a batch decoded in chunks is read through DecodeResult.chunks()")
            t0 = time.perf_counter()
            for items, owner, event, _ in self._parts():
                for i, img in items:
                    self.arrays[i] = img
                if owner is not None:
                    self.keep.append(owner)
                if event is not None:
                    self.ready.append(event)
            self.waited += time.perf_counter() - t0
        return self

    def order(self, stream: Any) -> None:
        """Complete the result, then make work enqueued on ``stream`` from now on wait for the decoders
        (once)."""
        self.wait()
        for ev in self.ready:
            stream.wait_event(ev)
        self.ready = []
        for owner in self.keep:  # the consumer now waits for the decode: freeing needs no extra wait
            if isinstance(owner, (_Slab, _Chunk)):
                owner.event = None

    def chunks(self, stream: Any, side: dict[bool, Any] | None = None) -> Iterator[tuple[list[tuple[int, DeviceImage]], Any]]:
        """The decoded images as ((index, image) list, stream) pairs, each as soon as one decode call
        (or the CPU fallbacks, last) has made it; work enqueued on the pair's stream after it is yielded
        runs after that decode. That stream is ``stream``, or with ``side`` ({True: a stream for the
        hardware engine's calls, False: one for the CUDA decoder's}) the decoder's own, so that neither
        decoder's reuse of its buffers waits on the other's work: make ``stream`` wait for them before
        the batch is read. Items never yielded failed (``errors``). The images are not kept in
        ``arrays``: drop each list once the work reading it is enqueued, which frees its memory (with
        ``chunk``, hands it back to the decoder for a later call). Read the batches of one decoder in
        the order they were handed over."""
        if self.pending is None:  # finished already (or the Python binding): one list
            self.order(stream)
            done = [(i, a) for i, a in enumerate(self.arrays) if a is not None]
            if done:
                yield done, stream
            return
        parts = self._parts()
        while True:
            t0 = time.perf_counter()
            msg = next(parts, None)
            self.waited += time.perf_counter() - t0
            if msg is None:
                return
            items, owner, event, hw = msg
            msg = None
            on = side[hw] if side is not None and hw is not None else stream
            if event is not None:
                on.wait_event(event)
                if isinstance(owner, (_Slab, _Chunk)):
                    owner.event = None
                    owner.consumer = _stream_ref(on)  # its memory is freed (or handed back) after the work on ``on``
            owner = None
            if items:
                yield items, on
            items = None


class DeviceImage:
    """A decoded image in device memory, by pointer (no per-image CuPy object on the hot path).

    Attributes:
        ptr: device address of pixel (0, 0); ``shape`` (H, W, 3); ``row_stride`` bytes between rows.
        owner: the nvImageCodec Image (or CuPy array) that owns the memory.
        sampling: None for interleaved RGB; (2, 2) or (2, 1) for an image kept in the JPEG's own
            planes, 4:2:0 or 4:2:2 (``decode(..., planes=True)``; :mod:`.planes` has the layout, whose
            luma rows are ``row_stride`` bytes). The fused resample reads those; :meth:`get` and
            :meth:`cupy` convert them (slowly, on the host).
    """

    __slots__ = ("ptr", "shape", "row_stride", "owner", "sampling")

    def __init__(self, ptr: int, shape: tuple[int, int, int], row_stride: int, owner: Any,
                 sampling: tuple[int, int] | None = None):
        self.ptr, self.shape, self.row_stride, self.owner, self.sampling = ptr, shape, row_stride, owner, sampling

    def cupy(self):
        """A CuPy view of the pixels (a converted copy for an image in planes; for tests and slow paths)."""
        import cupy as cp

        if self.sampling is not None:
            return cp.asarray(self.get())
        if isinstance(self.owner, cp.ndarray) and self.owner.shape == self.shape:  # a CPU fallback's array
            return self.owner
        h, w, c = self.shape
        mem = cp.cuda.UnownedMemory(self.ptr, self.row_stride * h, self.owner)
        return cp.ndarray((h, w, c), cp.uint8, cp.cuda.MemoryPointer(mem, 0), strides=(self.row_stride, c, 1))

    def get(self) -> np.ndarray:
        if self.sampling is None:
            return self.cupy().get()
        import cupy as cp

        h, w, _ = self.shape
        hs, vs = self.sampling
        size = jplanes.plane_bytes(w, h, hs, vs)
        mem = cp.cuda.UnownedMemory(self.ptr, size, self.owner)
        flat = cp.ndarray((size,), cp.uint8, cp.cuda.MemoryPointer(mem, 0)).get()
        return jplanes.planes_to_rgb(*jplanes.plane_views(flat, w, h, hs, vs), hs, vs)


def _device_image(img: Any, owner: Any = None) -> DeviceImage | None:
    """Wrap an nvImageCodec Image (kept alive by ``owner``, else by itself); None when it is not
    uint8 HWC RGB (then the CPU decodes it)."""
    cai = img.__cuda_array_interface__
    shape = tuple(cai["shape"])
    if len(shape) != 3 or shape[2] != 3 or cai["typestr"] != "|u1":
        return None
    strides = cai.get("strides")
    row = strides[0] if strides else shape[1] * 3
    if strides and (strides[1] != 3 or strides[2] != 1):
        return None
    return DeviceImage(int(cai["data"][0]), shape, int(row), img if owner is None else owner)


# Hardware-engine preference: the kinds it decodes fastest go to it first, the rest may go to CUDA.
_HW_ORDER = ("baseline/4:2:0", "baseline/4:2:2", "baseline/4:4:0", "baseline/gray", "baseline/4:4:4")
# The CUDA decoder's host cost per image, cheapest kind first: its Huffman host phase works on the
# coded data, which 4:4:4 has about twice as much of as 4:2:0 at the same size and quality
# (benchmarks/nvjpeg_host_cost.py: 4:2:0 420-600 us an image, 4:4:4 750-990 us; RESULTS.md,
# twenty-first session).
_CUDA_CHEAP = ("baseline/gray", "baseline/4:2:0", "baseline/4:2:2", "baseline/4:4:0", "baseline/4:4:4")
# Which kinds the split route's CUDA decoder takes its share from first: "slowest" (the kinds the
# hardware engine is slowest on) or "cheapest" (the kinds that cost the CUDA decoder's host threads
# least). "cheapest" left the hardware engine three kinds on two instances and ran the training chain
# at 10,500-11,000 images/s against 23,500-26,700 (H200, benchmarks/memory_study.py ``takes=cheapest``;
# RESULTS.md, twenty-second session).
CUDA_TAKES = "slowest"


def choose_route(route: str | None = None, cores: float | None = None, share: int = 1) -> tuple[str, float | None]:
    """(the route, the free cores it was chosen by or None): ``route`` (by default
    GPUBATCH_DECODE_ROUTE, else :data:`ROUTE`) as given, or for "auto" by ``cores`` free (by default
    measured now, :func:`~gpubatch.engine.affinity.free_cores`, split between ``share`` engines)."""
    route = route or os.environ.get("GPUBATCH_DECODE_ROUTE") or ROUTE
    if route not in ROUTES:
        raise UsageError(f"unknown decode route {route!r}: one of {', '.join(ROUTES)}")
    if route != "auto":
        return route, None
    if cores is None:
        from ..affinity import free_cores

        cores = free_cores() / max(share, 1)
    return ("split" if cores >= SPLIT_MIN_CORES else "hardware"), round(cores, 1)


def _cuda_cost(kind: str) -> int:
    return _CUDA_CHEAP.index(kind) if kind in _CUDA_CHEAP else len(_CUDA_CHEAP)


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


def _make_current(runtime: Any, device_index: int) -> None:
    """Make ``device_index`` the calling thread's current device and leave it so. Not a ``with
    cupy.cuda.Device(...)`` block: leaving one in a thread that was on device 0 sets device 0 again,
    and since CUDA 12 setting a device makes its context (the two-GPU test failed so)."""
    if runtime.getDevice() != device_index:
        runtime.setDevice(device_index)


_STREAMS: dict[tuple[int, str], Any] = {}
_POOLS_SET: set[int] = set()


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


# The CUDA decoder's share of each batch (the rest goes to the hardware engine). With the hardware
# engine driven through nvJPEG directly (HW_DIRECT), 0.3 beat 0.35 in 7 of 8 alternating pairs, +1.9%
# on the training chain's means and +2.0% on the validation chain's, for 2 MiB (H200,
# benchmarks/memory_study.py ``share``; RESULTS.md, fifteenth session). Before, 0.35 had beaten 0.5 in
# 9 of 10 pairs once the feed's ring was page-locked, and 0.25 had starved the CUDA decoder's side
# (thirteenth session).
CUDA_SHARE = 0.3
# How a batch is split between the decoders (GpuImageDecoder's ``route``; GPUBATCH_DECODE_ROUTE):
# "split": the CUDA decoder takes CUDA_SHARE of each batch and the hardware engine the rest (two
# instances); "hardware": the hardware engine takes every kind it decodes (HW_ONLY_INSTANCES
# instances, one per common kind) and the CUDA decoder only what it refuses; "auto": "split" where at
# least SPLIT_MIN_CORES cores are free, else "hardware". The CUDA decoder costs its host threads about
# 1 ms of CPU an image (benchmarks/nvjpeg_host_cost.py), the hardware engine's thread 0.03-0.05 ms: on
# 16 free cores the split route ran the training chain at 26,700-28,400 images/s against 21,500-22,800
# for the engine alone, and beside 8 busy processes 14,000-14,200 against 23,100-23,200, on 8 cores
# (taskset) 14,600-16,000 against 19,000-19,400 (H200, benchmarks/memory_study.py ``share=0,hw=3``,
# ``busy=8``, ``cpus=8``; RESULTS.md, twenty-second session).
ROUTES = ("auto", "split", "hardware")
ROUTE = "auto"
SPLIT_MIN_CORES = 15.0
HW_ONLY_INSTANCES = 3
# bytes of freed memory the driver's default pool keeps (see _keep_freed_memory)
POOL_KEEP = 512 << 20
# the CUDA decoder's options: Huffman decoding on the GPU for every image (GPU-NOTES: 11,900 against
# 7,400 images/s with the default threshold)
CUDA_DECODER_OPTIONS = "nvjpeg_cuda_decoder:hybrid_huffman_threshold=0"
# A batch part's device buffer is rounded up to a quarter of its size's leading power of two (16 MiB
# steps from 64 MiB, 8 MiB from 32), at least SLAB_ROUND bytes, and with SLAB_FIT taken at the size of
# the largest part before it where that is at most a third more (GpuImageDecoder._slab_size).
SLAB_ROUND = 2 << 20
SLAB_FIT = True
# Decoding in chunks (``decode(..., chunk=N)``, which ImagePipeline uses for chains that end in one
# resample of a fixed output size): each decoder's part of a batch is decoded in calls of at most N
# images (the CUDA decoder) or HW_CHUNK (the hardware engine), and in at least MIN_CALLS calls
# (_call_lists). Each call decodes into a buffer (ring slot) that the same call of the next batch part
# reuses once the consumer's kernels have read it, so the decoded images take about one batch of
# memory instead of two; with CUDA_RING > 0 the CUDA decoder's calls take that many slots in turn
# instead. A call waits at most RING_WAIT seconds for its slot, then takes a buffer of its own (a
# consumer reading batches out of order is slowed, never stuck).
# ImagePipeline's default, DECODE_CHUNK = 256, keeps every call whole: one per kind on the hardware
# engine (HW_CHUNK = 256: a batch's kind is never split, so each of its instances keeps meeting one
# kind; calls split at 96 lost 3 of 4 alternating pairs, fifteenth session) and the CUDA decoder's part
# in one (MIN_CALLS = 1: split in two, it lost 6 of 6 pairs, by 1-15%). On the bench's chains that
# took the peak from 866 MiB (whole parts from the driver's pool, decode_chunk=0) to 738, at 2.2% less
# speed on the training chain (the median of 15 alternating pairs, 3 won; medians 21,252 against
# 21,949 images/s) and 0.8% on the validation chain (13 pairs, 5 won; 22,613 against 22,586), three
# H200 machines (memory_study ``chunk=0``; RESULTS.md, eighteenth session). Two slots taken in turn for
# the CUDA decoder's calls (CUDA_RING = 2), so that its next part never waits for the last one's
# readers, took 802 MiB and were no faster. Smaller chunks (decode_chunk=96) cost more speed than they
# save memory (sixteenth and seventeenth sessions).
DECODE_CHUNK = 256
HW_CHUNK = 256
CUDA_RING = 0
HW_RING = 0  # as CUDA_RING, for the hardware engine's calls
RING_WAIT = 1.0
MIN_CALLS = 1  # calls a chunked part is split into at least
# The hardware engine's part of a batch in one call whatever the chroma subsamplings (True), or one
# call per kind (False): one mixed call lost 8-20% in the pipeline (memory_study ``hw_mixed=1``, H200)
HW_MIXED = False
# The hardware engine driven through nvJPEG's batched API directly (:mod:`.nvjpeg_hw`) instead of
# nvImageCodec's hardware decoder, where nvJPEG loads (GPUBATCH_HW_DIRECT=0 turns it off). The engine
# alone, one thread, the mixed set's kinds a call each: 21,900-23,900 images/s against 16,000-17,300
# (H200; benchmarks/decode_study.py, groups "nvjpeg" and "hwpar").
HW_DIRECT = True
# the decoders' streams ("hw", "cuda") made at the device's greatest priority (their kernels, the
# hardware path's colour conversion among them, go before the consumer's)
HIGH_PRIORITY: tuple[str, ...] = ()
# A slot grows to the call's size plus 1/RING_SLACK, so that it seldom grows again: each growth holds
# the old buffer and the new at once until the old one's readers are done. With whole calls, 1/4 took
# the decoded images' high-water mark from 240 (1/16) and 212 (1/8) to 184 MiB (H200, memory_study
# ``slack``, eighteenth session).
RING_SLACK = 4
# A slot that grows gives its old buffer back before the new one is taken: the thread handing the batch
# over waits (once, at most a batch) for the readers of the slot's last call. Taking the new buffer
# first held both at once and left the driver's pool fragmented: after a switch of the decode route,
# 256 MiB reserved for 192 in use, a peak of 865-877 MiB against 809-815 where nothing grew (H100 and
# H200, memory_study ``growth=1``; RESULTS.md, twenty-fifth session).
FREE_BEFORE_GROW = True
GROW_WAIT = 0.25  # seconds that wait may take; past it the old buffer is freed once read, as before
# A chunk buffer for a call that holds every image of its kind in the batch is made (or grown) large
# enough for the most pixels of that kind any batch has had so far, not only for this call and a
# quarter more: after a switch of the decode route empties every buffer, the first batch sizes them,
# and a later batch with more of one kind used to grow its buffer again (10 switches in 18, RESULTS.md,
# twenty-fifth session). Sized so, no buffer grew after a switch in seven runs: peaks of 803-815 MiB
# against 807-835 (the training chain, H100 and H200, memory_study ``most``; twenty-sixth session).
SIZE_BY_MOST = True
# With ``decode(..., planes=True)`` the direct path decodes 4:2:0 and 4:2:2 JPEGs into their own planes
# (1.5 and 2 bytes a pixel instead of 3; .planes) and the resample kernel makes RGB of them as libjpeg
# does. ImagePipeline asks for it where one resample reads the images, and (HW_PLANES "chunked") only
# with calls split below HW_CHUNK (decode_chunk=96): there it took the training chain from 872 to 780
# MiB at 0-9% less speed, while nvJPEG writes planes more slowly than RGB (the engine alone
# 18,400-23,900 against 27,300-28,400 images/s, benchmarks/nvjpeg_study.py), so whole batch parts lost
# 2-29% for 28-92 MiB (H200; memory_study ``planes``; RESULTS.md, sixteenth session). "always" /
# "never" (GPUBATCH_HW_PLANES) for studies.
HW_PLANES = os.environ.get("GPUBATCH_HW_PLANES", "chunked")
# Which decoders decode only the regions ``decode(..., regions=)`` asks for ("hw", "cuda"); a decoder
# not named decodes whole images and gives views of the regions (for studies: memory_study ``regions_for``;
# the hardware engine's alone took 844 MiB at 20,811-21,931 images/s on the training chain, both 780 MiB at
# 22,058-22,556; H200, RESULTS.md seventeenth session)
REGIONS_FOR: tuple[str, ...] = ("hw", "cuda")


def want_planes(chunk: int) -> bool:
    """Whether a reader of one resample asks the decoder for planes (:data:`HW_PLANES`), decoding in
    chunks of ``chunk`` (0: whole parts; :data:`HW_CHUNK` and more: whole calls)."""
    return HW_PLANES == "always" or (HW_PLANES == "chunked" and 0 < chunk < HW_CHUNK)


def _keep_freed_memory(cp, device_index: int) -> bool:
    """Let the driver's default pool (where decoded images live) keep up to :data:`POOL_KEEP` bytes
    of freed memory instead of returning it at every synchronization. False where the device has no
    stream-ordered pool."""
    if device_index not in _POOLS_SET:
        try:
            pool = cp.cuda.runtime.deviceGetDefaultMemPool(device_index)
            cp.cuda.runtime.memPoolSetAttribute(pool, 4, POOL_KEEP)  # cudaMemPoolAttrReleaseThreshold
            _POOLS_SET.add(device_index)
        except Exception:  # a driver without stream-ordered pools: nvImageCodec uses cudaMalloc there
            return False
    return True


def _stream_ref(stream: Any) -> Any:
    """A weak reference to a consumer's ``stream`` for the finalizers below (called: the stream, or None
    once it is gone). CuPy destroys a stream's handle in its finalizer, and the garbage collector runs
    the finalizers of a reference cycle (a test's kept traceback holding a stream and the batches
    decoded for it) in any order, so a finalizer holding the stream itself may use a destroyed handle
    (a segmentation fault). The collector clears weak references before it runs finalizers, so a
    finalizer sees None instead, and waits for the device."""
    try:
        return weakref.ref(stream)
    except TypeError:  # (a stream type without weak references: held)
        return lambda: stream


@functools.cache
def _event_class(cp: Any) -> Any:
    class OwnedEvent(cp.cuda.Event):
        """A CuPy event (no timing) whose handle reads 0 once destroyed, so that a finalizer that would
        wait on it (collected with it, in any order: see :func:`_stream_ref`) can tell."""

        def __init__(self) -> None:
            super().__init__(disable_timing=True)

        def __del__(self) -> None:
            super().__del__()
            self.ptr = 0

    return OwnedEvent


def _readers_after(consumer: Any, event: Any) -> Any:
    """For a finalizer: the consumer's stream (``consumer``, a :func:`_stream_ref`), made to wait for the
    decode-end ``event`` if one is given; or None, once the whole device has been waited for, where the
    stream or the event is gone (collected first)."""
    stream = consumer()
    if stream is not None and (event is None or event.ptr):
        if event is not None:
            stream.wait_event(event)
        return stream
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    return None


class _Slab:
    """One decoder's part of a batch, decoded: a stream-ordered allocation from the driver's pool, made on the
    decoder's stream and freed (``cudaFreeAsync``) on the consumer's stream when the last reference
    goes, that is once the kernels reading it are enqueued. The host never waits for the free; the
    driver hands the memory to a later batch once the consumer's work before the free has run (making
    that batch's decode stream wait on it where it must). ``event`` is the decode's end on the
    decoder's stream while the consumer has not waited for it (:meth:`DecodeResult.order` clears it):
    a result dropped unread makes the consumer wait for it before the free, so no later batch gets the
    memory while the decoder still writes it. ``consumer`` is a :func:`_stream_ref`: where the stream
    or the event is gone first, the free waits for the whole device."""

    __slots__ = ("ptr", "consumer", "runtime", "event", "device")

    def __init__(self, cp, size: int, stream: Any, consumer: Any):
        self.runtime = cp.cuda.runtime
        self.ptr = self.runtime.mallocAsync(size, stream.ptr)
        self.consumer = _stream_ref(consumer)
        self.event = None
        self.device = self.runtime.getDevice()  # (see _on_device)

    def __del__(self) -> None:
        try:
            _make_current(self.runtime, self.device)
            stream = _readers_after(self.consumer, self.event)
            self.runtime.freeAsync(self.ptr, stream.ptr if stream is not None else 0)
        except Exception:  # interpreter shutdown: the context is going away with the memory
            pass


class _Release:
    """Owns a batch's decoded images; when dropped, hands them to a deferred-free queue.

    nvImageCodec frees an image with ``cudaFreeAsync`` on the stream it was decoded on, which knows
    nothing of the kernels that read it on the consumer's stream. Dropping this object records an
    event on the consumer stream and queues (event, images); the decoder drops the images (frees
    them) once the event has completed, checked without waiting at its next calls. The decoder
    streams never wait on the consumer, so a later batch's decode never queues behind this batch's
    kernels.
    """

    __slots__ = ("images", "consumer", "sink", "device")

    def __init__(self, images: list[Any], consumer: Any, sink: deque):
        import cupy

        self.images, self.consumer, self.sink = images, _stream_ref(consumer), sink
        self.device = cupy.cuda.runtime.getDevice()  # (see _on_device)

    def __del__(self) -> None:
        try:
            import cupy

            _make_current(cupy.cuda.runtime, self.device)
            stream = _readers_after(self.consumer, None)
            if stream is not None:  # (else the device is idle: the images go now)
                self.sink.append((stream.record(), self.images))
        except Exception:  # interpreter shutdown: the context is going away with the memory
            pass
        self.images = None


class _RingSlot:
    """One of a decoder's chunk buffers (``decode(..., chunk=N)``): call k of each part of a batch
    decodes into slot k (see ``GpuImageDecoder._ring_bind``). ``free`` is held from the start of a call decoding into the slot until the images of
    that call are dropped (:class:`_Chunk`); ``release`` is then the consumer's event after the work
    that read them, which the slot's next call waits for on the GPU. ``ptr``/``size``: the buffer the
    next call handed over gets (it only grows; see ``GpuImageDecoder._ring_bind``)."""

    __slots__ = ("ptr", "size", "free", "release", "orphans")

    def __init__(self) -> None:
        self.ptr, self.size = 0, 0
        self.free = threading.Semaphore(1)
        self.release: Any = None
        self.orphans: list[int] = []  # old buffers of a grown slot whose call did not get it: freed by the next


class _Chunk:
    """Owns the images one decode call made in a :class:`_RingSlot`: dropping the last of them records
    the consumer's progress and hands the slot back to the decoder. ``event``: the decode's end on the
    decoder's stream while the consumer has not waited for it (a chunk dropped unread makes the
    consumer wait for it first, so the slot is never reused under a running decode). ``consumer``: as
    :class:`_Slab`'s (where it or the event is gone, the slot goes back once the device is idle)."""

    __slots__ = ("slot", "consumer", "event", "device")

    def __init__(self, slot: _RingSlot, consumer: Any):
        import cupy

        self.slot, self.consumer, self.event = slot, _stream_ref(consumer), None
        self.device = cupy.cuda.runtime.getDevice()  # (see _on_device)

    def __del__(self) -> None:
        try:
            import cupy

            _make_current(cupy.cuda.runtime, self.device)
            stream = _readers_after(self.consumer, self.event)
            self.slot.release = stream.record() if stream is not None else None
        except Exception:  # interpreter shutdown: the context is going away with the memory
            pass
        self.slot.free.release()


@dataclass
class _Part:
    """What one decoder thread could not decode of its part of a batch (``GpuImageDecoder._run``)."""

    failed: list[int] = field(default_factory=list)  # for the CPU
    hw: int = 0  # images the hardware engine decoded
    retried: int = 0  # 1: what the hardware engine failed goes to the CUDA decoder as a part of its own


@dataclass
class _Job:
    """One decoder's part of a batch, ready for its decode calls (``GpuImageDecoder._prepare``)."""

    hw: bool
    lists: list[list[int]]  # item indices: one list per call
    stream: Any  # the decoder's stream
    consumer: Any  # the stream the batch's readers run on
    sink: Any = None  # a weak reference to the batch's DecodeResult (None: the results are dropped)
    part: _Part = field(default_factory=_Part)
    hosts: list[Any] = field(default_factory=list)  # keeps the encoded bytes' host views alive
    streams: dict[int, int] = field(default_factory=dict)  # item -> code stream
    images: dict[int, int] = field(default_factory=dict)  # item -> output image descriptor
    views: dict[int, tuple[int, tuple[int, int, int], int]] = field(default_factory=dict)  # (ptr, shape, row)
    slab: Any = None  # the part's device buffer (whole parts)
    slots: list[Any] = field(default_factory=list)  # per call its ring slot (chunks)
    retire: list[int | None] = field(default_factory=list)  # per call: the slot's old buffer to free, 0: none,
                                                             # None: the slot did not grow
    turns: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # item -> EXIF orientation
    direct: bool = False  # the hardware engine through nvJPEG directly: no code streams or descriptors
    sources: dict[int, tuple[int, int]] = field(default_factory=dict)  # (direct) item -> (host address, size)
    planes: dict[int, tuple[int, int]] = field(default_factory=dict)  # (direct) item -> chroma sampling, decoded
                                                                       # into planes (.planes)
    outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)  # (direct) item -> its nvJPEG output places
    regions: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # (direct) item -> the part decoded
    crops: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # item -> the part its view shows
                                                                               # (decoded whole; REGIONS_FOR)
    args: list[Any] = field(default_factory=list)  # (direct) per call its nvJPEG arrays (nvjpeg_hw.call_args)


def _direct_view(job: _Job, i: int, ptr: int, h: int, w: int) -> None:
    """Place item ``i`` of a direct-path job at ``ptr``: its view, and its output places for nvJPEG (made
    here, in the thread that hands the batch over, not in the hardware engine's thread)."""
    sampling = job.planes.get(i)
    job.views[i] = (ptr, (h, w, 3), w if sampling else w * 3)
    job.outputs[i] = jplanes.plane_places(ptr, w, h, *sampling) if sampling else (ptr, w * 3)


def _item_bytes(job: _Job, i: int, h: int, w: int) -> int:
    """Device bytes item ``i`` of ``job`` takes decoded at (h, w), 256-byte aligned."""
    sampling = job.planes.get(i)
    size = jplanes.plane_bytes(w, h, *sampling) if sampling else h * w * 3
    return (size + 255) & ~255


def _call_lists(lists: list[list[int]], hw: bool, chunk: int) -> list[list[int]]:
    """A decoder's part of a batch (one list of items per kind) as the calls of chunked decode: each list
    in pieces of at most ``chunk`` items (the hardware engine's: :data:`HW_CHUNK`), and at least
    :data:`MIN_CALLS` calls (with two, the next part's first call never waits on the readers of the call
    just made)."""
    out = [piece for idx in lists for piece in _pieces(idx, HW_CHUNK if hw else chunk)]
    if len(out) < MIN_CALLS and len(out[0]) > 1:
        out = _pieces(out[0], -(-len(out[0]) // MIN_CALLS))
    return out


class _Closed(Exception):
    """The decoder is closing: a call waiting for its ring slot stops."""


def _post(sink: Any, msg: tuple) -> None:
    """Put ``msg`` on the queue of the DecodeResult ``sink`` refers to; dropped (freeing what it owns)
    where the result is gone or there is none."""
    res = sink() if sink is not None else None
    if res is not None:
        res.feed.put(msg)


def _pieces(idx: list[int], chunk: int) -> list[list[int]]:
    """``idx`` in consecutive pieces of at most ``chunk`` items, as even as can be."""
    k = max(1, -(-len(idx) // chunk))
    step, extra = divmod(len(idx), k)
    out, a = [], 0
    for j in range(k):
        b = a + step + (j < extra)
        out.append(idx[a:b])
        a = b
    return out


class GpuImageDecoder:
    """Batched, routed, stream-ordered JPEG decode on one GPU (see the module docstring).

    Each batch is split by ``route`` (:func:`choose_route`; "auto" by the ``cores`` free, measured
    when not given). On the "split" route the CUDA decoder (Huffman on the GPU, one image per CPU
    thread, about 1 ms of CPU an image) takes the share ``cuda_share`` (:data:`CUDA_SHARE`), the kinds
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
    every batch (benchmarks/memory_study.py, ``coupled=1``). The hardware decoder waits, at the start of
    each call, until that instance's previous call has finished on the GPU, so the calls spread
    over ``hw_instances`` instances (2 on the split route): with one instance the engine alone decoded 8,800-9,700
    images/s of the mixed set, with three 13,100-17,100, one thread calling them in turn (H200;
    benchmarks/decode_study.py, group "capi", and RESULTS.md); in the pipeline, where each decoder
    goes at its own pace, two ran within 1% of three, and the third took 53-57 MiB more
    (``gpubatch bench`` and benchmarks/memory_study.py, ``hw=2``; nvImageCodec's hardware decoder).
    With ``hw_direct`` (the default where nvJPEG loads; :data:`HW_DIRECT`) those instances are
    :class:`~gpubatch.engine.codecs.nvjpeg_hw.HwBatchDecoder` objects and the hardware part needs no
    code streams or descriptors: its places come from the sizes the headers gave. ``hw_core`` (an
    :class:`~gpubatch.engine.affinity.Reservation`, which :class:`~gpubatch.engine.gpu_engine.GpuEngine`
    takes) binds the hardware engine's thread to a CPU core the rest of the pipeline leaves to it: that
    thread is the pipeline's pace. ``api="python"`` uses the Python
    binding (one instance, the CUDA decoder called from a second thread); it is the fallback where
    the C library cannot be loaded, and the reference the C path is tested against.

    The two decoders' pixels differ slightly (their IDCTs and chroma upsampling differ), so the share
    is fixed by default (``deterministic=True``): a batch is then always split the same way, and the
    same input batched the same way on the same route gives the same output bytes whatever the timing
    or process (the "auto" route is chosen once, when the decoder is made).
    ``deterministic=False`` lets the share move each batch towards equal host time of the two calls
    (Python binding only).
    """

    HW_THREADS = 4
    HW_INSTANCES = 2

    def __init__(self, device_index: int = 0, cpu_threads: int = 8, hw_decoder: bool = True,
                 cuda_share: float | None = None, deterministic: bool = True, cuda_threads: int | None = None,
                 hw_preallocate: tuple[int, int, int] | None = None, options: str = "",
                 api: str | None = None, hw_instances: int | None = None, hw_direct: bool | None = None,
                 hw_core: Any = None, route: str | None = None, cores: float | None = None,
                 follow: bool = False):

        import cupy as cp

        self.cp = cp
        self.device_index = device_index
        from ..executor import default_decoder_threads

        threads = max(1, min(cpu_threads, default_decoder_threads()))
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
        self.api = api or os.environ.get("GPUBATCH_DECODE_API", "c")
        if self.api not in ("c", "python"):
            raise ValueError(f"unknown decode API {self.api!r}: 'c' or 'python'")
        self.hw = self.cuda = self.lib = self.cuda_c = None
        self.hw_cs: list[Any] = []
        self.hw_direct: list[Any] = []  # nvjpeg_hw.HwBatchDecoder instances (the C API's hardware path)
        self.route = choose_route(route, cores)[0] if hw_decoder else "cuda"
        hw_only = self.route == "hardware"
        hw_instances = hw_instances or int(os.environ.get("GPUBATCH_HW_DECODERS", 0)) or (
            HW_ONLY_INSTANCES if hw_only else self.HW_INSTANCES)
        # the instances a call picks from first; those past them are spares, taken only where none of
        # the first has the call's kind (the split route, after the hardware route added them: _follow)
        self._hw_first = hw_instances
        with cp.cuda.Device(device_index):
            self.stream_ordered = _keep_freed_memory(cp, device_index)
            cuda_options = f"{CUDA_DECODER_OPTIONS} {options}"
            if self.api == "c":
                from .nvimgcodec_c import BACKEND_HYBRID_CPU_GPU, CApiError, library

                try:
                    self.lib = library()
                except (DependencyError, CApiError, OSError) as e:  # a wheel laid out otherwise
                    warnings.warn(f"nvImageCodec's C API is not usable ({e}); decoding through its Python "
                                  "binding", RuntimeWarning, stacklevel=2)
                    self.api = "python"
            if self.api == "c":
                if hw_decoder:
                    self._more_hw(max(1, hw_instances), _want_direct(hw_direct))
                self.cuda_c = self.lib.decoder(device_index, self.cuda_threads, BACKEND_HYBRID_CPU_GPU,
                                               cuda_options)
            else:
                nic = self.nic = nvimgcodec()
                self.hw = (nic.Decoder(device_id=device_index, max_num_cpu_threads=self.HW_THREADS,
                                       backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)], options=hw_options)
                           if hw_decoder else None)
                self.cuda = nic.Decoder(device_id=device_index, max_num_cpu_threads=self.cuda_threads,
                                        backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)], options=cuda_options)
            self.hw_stream = _process_stream(cp, device_index, "hw", "hw" in HIGH_PRIORITY)
            self.cuda_stream = _process_stream(cp, device_index, "cuda", "cuda" in HIGH_PRIORITY)
        if self.api == "python":
            self.params = self.nic.DecodeParams(apply_exif_orientation=True, color_spec=self.nic.ColorSpec.SRGB,
                                                allow_any_depth=False)
        if cuda_share is None:
            cuda_share = 0.0 if hw_only else CUDA_SHARE
        self.cuda_share = cuda_share if hw_decoder else 1.0
        if not (self.hw or self.hw_cs or self.hw_direct):
            self.route = "cuda"  # (no hardware engine here)
        self.cuda_takes = CUDA_TAKES  # (a study knob: benchmarks/memory_study.py ``takes``)
        self.deterministic = deterministic
        # ``follow``: the route follows the load on the host while the run goes (C API, both decoders)
        self.follower = self._probe = None
        if follow and self.lib is not None and (self.hw_direct or self.hw_cs) and self.route in ("split", "hardware"):
            from ..affinity import HostLoad

            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
            self._probe = HostLoad(cpus)  # (other processes' load on this process's cores)
            fl = route_follow
            self.follower = fl.RouteFollower(self.route, float(len(cpus)), SPLIT_MIN_CORES, confirm=fl.CONFIRM,
                                             margin=fl.MARGIN, hold=fl.HOLD_S)
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
        self._cpu = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpubatch-cpu-decode",
                                       initializer=_on_device(cp, device_index))
        # one decode() at a time: a second thread's call beside a running one broke the hardware
        # decoder ("Something went wrong during decoding", then a crash; benchmarks/pipeline_study.py)
        self._calling = threading.Lock()
        self._freed: deque = deque()  # (consumer event, images) of dropped batches, freed once done
        # host seconds per part of decoding (the GPU work is not waited for): header parse and split
        # ("parse"), the per-image code streams and output descriptors of each decoder's part
        # ("hw_wrap", "cuda_wrap"; with the Python binding the wrapping of its results), all in the
        # thread that hands the batch over; each decoder's calls ("hw", "cuda"), in that decoder's
        # thread with the C API (with the Python binding "cuda" is the wait for its side thread), of
        # which, decoding in chunks, the waits for a ring slot ("hw_slot", "cuda_slot"), and on the
        # hardware engine's direct path the nvJPEG calls themselves ("hw_nvjpeg"); CPU decodes ("cpu")
        self.timings = {"parse": 0.0, "hw": 0.0, "hw_wrap": 0.0, "cuda": 0.0, "cuda_wrap": 0.0, "cpu": 0.0,
                        "hw_slot": 0.0, "cuda_slot": 0.0, "hw_nvjpeg": 0.0}

    def _more_hw(self, n: int, direct: bool) -> None:
        """``n`` more hardware-engine instances (the C API): nvJPEG's direct path where ``direct`` and
        it can make them, else nvImageCodec's hardware decoder."""
        if direct:
            self.hw_direct.extend(self._direct_instances(n))
        if not self.hw_direct:
            from .nvimgcodec_c import BACKEND_HW_GPU_ONLY

            self.hw_cs.extend(self.lib.decoder(self.device_index, self.HW_THREADS, BACKEND_HW_GPU_ONLY, self._hw_options)
                              for _ in range(n))

    def _direct_instances(self, n: int) -> list[Any]:
        """``n`` instances of the hardware engine's direct path, or none (with a warning) where nvJPEG
        cannot make them (then nvImageCodec's hardware decoder is used)."""
        from .nvjpeg_hw import HwBatchDecoder

        made: list[Any] = []
        try:
            for _ in range(n):
                made.append(HwBatchDecoder(self.cp))
        except (DependencyError, NvjpegError, OSError) as e:
            for dec in made:
                dec.close()
            warnings.warn(f"the hardware JPEG engine is not usable through nvJPEG directly ({e}); using "
                          "nvImageCodec's hardware decoder", RuntimeWarning, stacklevel=3)
            return []
        return made

    def warm_up(self, batch: int = 256, regions: bool = False) -> float:
        """Run ``batch`` tiny JPEGs (every subsampling, and gray) through each decoder once; returns the
        seconds.

        A cold decoder's first call took 1.2-1.7 s, and a later batch whose kinds outgrew what the
        hardware decoder had met cost another 0.3-0.4 s once. After this warm-up the first real batch
        took 0.03 s and no later batch stalled (benchmarks/startup_study.py, H200). Made through
        ``ImagePipeline`` on an H100, the warm-up took 0.2-0.4 s, and the first batch 0.05-0.06 s
        against 0.18-0.22 without it (twenty-ninth session). It also
        settles which kinds the hardware engine takes, so the routing of real batches (and with it
        their output bytes) does not depend on how far the hardware thread has got. With ``regions``
        the hardware engine's direct path also makes a region call on each instance."""
        t0 = time.perf_counter()
        blobs = _tiny_jpegs(batch)
        with self._calling:
            if self.lib is not None:
                for _ in self.hw_cs or self.hw_direct:  # one call each: the calls take turns over the instances
                    self.first_call(True, blobs)
                for _ in self.hw_direct if HW_PLANES != "never" else ():  # and the decode into planes
                    self.first_call(True, blobs, planes=True)
                for _ in self.hw_direct if regions else ():  # and region calls (nvjpegDecodeBatchedEx)
                    self.first_call(True, blobs, regions=[(8, 16, 40, 64)] * len(blobs))
                self.first_call(False, blobs)
            for decoder, stream in ((self.hw, self.hw_stream), (self.cuda, self.cuda_stream)):
                if decoder is not None:
                    self._call(decoder, stream, blobs)
            self.hw_stream.synchronize()
            self.cuda_stream.synchronize()
        self._hw_last.clear()  # real batches' kinds take the instances afresh (_hw_instance)
        return time.perf_counter() - t0

    def first_call(self, hw: bool, blobs: list[bytes], planes: bool = False,
                   regions: list[tuple[int, int, int, int] | None] | None = None) -> None:
        """One whole-part call of the hardware engine (``hw``) or the CUDA decoder on ``blobs``, the
        results dropped, waited for (the C API; for the warm-up and memory studies; ``planes`` and
        ``regions`` as :meth:`decode` takes them)."""
        kinds = [jpeg_kind(b)[0] for b in blobs]
        lists = [list(range(len(blobs)))]
        if hw and self.hw_direct:  # a call per kind: a kind the engine refuses fails its own call only
            groups: dict[str | None, list[int]] = {}
            for i, k in enumerate(kinds):
                groups.setdefault(k, []).append(i)
            lists = list(groups.values())
        job = self._prepare(hw, blobs, regions, lists, self.hw_stream, plane_kinds=kinds if planes else None)
        self._run(job, blobs, regions, kinds)
        self._cuda_thread.submit(int).result()  # a retry of what the hardware engine failed has run
        self.hw_stream.synchronize()
        self.cuda_stream.synchronize()

    def drain(self) -> None:
        """Wait until every part handed over so far is decoded: the decoders' threads idle (the hardware
        engine's first, since what it fails goes on to the CUDA decoder's) and their streams done."""
        for pool in (self._hw_thread, self._cuda_thread, self._side) if not self._closing else ():
            if pool is not None:  # (once closed, the threads have finished)
                pool.submit(int).result()
        self.hw_stream.synchronize()
        self.cuda_stream.synchronize()

    def close(self) -> None:
        self._closing = True  # a call waiting for its ring slot gives up
        for pool in (self._side, self._hw_thread, self._cuda_thread):
            if pool is not None:
                pool.shutdown(wait=True)
        self._cpu.shutdown(wait=True)
        while self._freed:
            ev, _ = self._freed.popleft()
            ev.synchronize()
        self.hw_stream.synchronize()
        self.cuda_stream.synchronize()
        for dec in self.hw_cs + self.hw_direct + ([self.cuda_c] if self.cuda_c else []):
            dec.close()
        self.hw_cs, self.hw_direct, self.cuda_c = [], [], None
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

    def _call(self, decoder, stream, blobs: list[bytes]) -> tuple[list[Any], float]:
        """One decode call, not waited for on the GPU; (results, host seconds)."""
        if not blobs:
            return [], 0.0
        t0 = time.perf_counter()
        out = decoder.decode(blobs, params=self.params, cuda_stream=stream.ptr)
        return out, time.perf_counter() - t0

    def _split(self, groups: dict[str, list[int]]) -> tuple[list[list[int]], list[int]]:
        """(per-kind index lists for the hardware engine, indices for the CUDA decoder): the CUDA
        decoder gets ``cuda_share`` of the batch, the kinds the hardware engine is slowest on first.
        The split depends only on the batch's contents, so a fixed share routes a given batch the
        same way every time."""
        if self.hw is None and not self.hw_cs and not self.hw_direct:
            return [], sorted(i for idx in groups.values() for i in idx)
        hw_kinds = [k for k in _HW_ORDER if k in groups and k not in self.hw_refuses]
        cuda = [i for k, idx in groups.items() if k not in hw_kinds for i in idx]
        total = sum(len(v) for v in groups.values())
        want = int(round(self.cuda_share * total)) - len(cuda)
        hw_lists = {k: list(groups[k]) for k in hw_kinds}
        # the hardware engine's slowest kinds first, or the CUDA decoder's cheapest
        order = reversed(hw_kinds) if self.cuda_takes == "slowest" else sorted(hw_kinds, key=_cuda_cost)
        for k in order:
            if want <= 0:
                break
            lst = hw_lists[k]
            take = min(want, len(lst))
            cuda.extend(lst[len(lst) - take :])
            del lst[len(lst) - take :]
            want -= take
        hw_lists = [lst for lst in hw_lists.values() if lst]
        if HW_MIXED and hw_lists:
            hw_lists = [sorted(i for lst in hw_lists for i in lst)]
        return hw_lists, sorted(cuda)

    def _adapt(self, t_hw: float, t_cuda: float) -> None:
        if self.deterministic or t_hw <= 0 or t_cuda <= 0:
            return
        self.cuda_share += self._step if t_hw > t_cuda else -self._step
        self.cuda_share = min(0.95, max(0.05, self.cuda_share))
        self._step = max(0.01, self._step * 0.8)

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
        results when already known (a :class:`~gpubatch.engine.feed.FileFeed` parses them in its workers).
        ``regions`` gives per blob a (y0, x0, y1, x1) part to decode or None (the hardware engine's
        direct path: nvJPEG's region calls; the CUDA decoder: nvImageCodec's sub-code streams); what
        the GPU refuses is decoded whole by Pillow, and its size tells the caller so.

        ``wait=False`` (with ``order=False``) returns once the batch is handed over: with the C API the
        hardware engine's part and the CUDA decoder's part are each decoded by a thread of their own,
        batch after batch, so the decoder that is done with its part of batch N goes on to batch N+1
        while the other is still at N. ``result.order(stream)`` (or ``result.wait()``) completes the
        result; nothing else of it may be read before. The caller bounds how many batches it hands
        over ahead (``gpu_engine.decode_ahead`` does).

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

    def _follow(self, now: float) -> None:
        """A check of the load (every :data:`~gpubatch.engine.follow.CHECK_S` seconds, in the thread
        handing batches over): the route the follower gives from now on. The hardware route gets an
        instance per common kind (:data:`HW_ONLY_INSTANCES`), made the first time it is taken; back on
        the split route the extra ones are spares (:meth:`_hw_instance`)."""
        self._next_check = now + route_follow.CHECK_S
        others = self._probe.take().get("others")
        if others is None:  # /proc/stat unreadable: the route stays
            self.follower = None
            return
        route = self.follower.observe(others, now - self._t0)
        if route == self.route:
            return
        pool = self.hw_direct or self.hw_cs
        if route == "hardware" and len(pool) < HW_ONLY_INSTANCES:
            try:
                self._more_hw(HW_ONLY_INSTANCES - len(pool), bool(self.hw_direct))
            except Exception as e:  # (the instances there are enough to decode with)
                warnings.warn(f"no more hardware-engine instances ({e})", RuntimeWarning, stacklevel=2)
        self._hw_first = len(pool) if route == "hardware" else self.HW_INSTANCES
        self.route, self.cuda_share = route, (0.0 if route == "hardware" else CUDA_SHARE)
        # Every chunk buffer of both decoders is given back before the next batch is prepared, and the
        # new route's calls make theirs at their own sizes. Freeing only the buffers the new route has no
        # calls for (the CUDA decoder's on the hardware route) left the hardware engine's to grow while
        # the last split batches held the old ones: the training chain's driver pool then had 230-236
        # MiB in use at once against 182 on the hardware route from the start, and a peak of 865-905
        # MiB against 763 (H100, benchmarks/memory_study.py ``busy_after``; RESULTS.md, twenty-fourth
        # session). Giving back every buffer empties the pool here: 809-815 MiB; where a buffer grows
        # again after the switch (a later batch with more of one kind), 807-835 (with FREE_BEFORE_GROW;
        # 865-877 without; twenty-fifth session).
        self._give_back_slots()

    def _note_batch(self, kinds: list[str | None], dims: list[tuple[int, int]], groups: dict[str, list[int]]) -> None:
        """Keep what :meth:`_ring_bind` sizes a buffer by: the batch's kinds and per kind its count and
        pixels, and per kind the most pixels one batch has had (counted before the split, so the kinds the CUDA decoder took on
        the split route are known to the hardware route after a switch)."""
        per = {}
        most = self._most_px
        for kind, idx in groups.items():
            px = sum(dims[i][0] * dims[i][1] for i in idx)
            per[kind] = (len(idx), px)
            if px > most.get(kind, 0):
                most[kind] = px
        self._batch = (kinds, per)

    def _most_bytes(self, idx: list[int], total: int) -> int:
        """The bytes a call of the items ``idx`` (``total`` bytes now) may need: where it holds every
        image of its kind in the batch, ``total`` scaled to the most pixels of that kind a batch has
        had; else 0 (a part of a kind, or of several: its share changes with the batch)."""
        kinds, per = self._batch
        if not SIZE_BY_MOST or not idx:
            return 0
        kind = kinds[idx[0]]
        count, px = per.get(kind, (0, 0))
        if count != len(idx) or px <= 0 or any(kinds[i] != kind for i in idx):
            return 0
        return -(-total * self._most_px[kind] // px)

    def _give_back(self, hw: bool, olds: list[tuple[_RingSlot, int]], wait: float | None = None) -> Any:
        """Have decoder ``hw``'s thread free the buffers ``olds`` once the calls handed over before have
        been read (:meth:`_free_slots`); returns its future."""
        return (self._hw_thread if hw else self._cuda_thread).submit(self._free_slots, hw, olds, wait)

    def _give_back_slots(self) -> None:
        """Free every ring slot's buffer of both decoders (called in the thread handing batches over):
        a later call into a slot makes it a new buffer. The old ones are freed by each decoder's thread
        once the calls handed over before (its jobs run in order) have been read, and the pool then
        gives the memory back; this waits for that."""
        jobs = []
        for hw in (True, False):
            olds = []
            for slot in self._rings[hw]:
                if slot.ptr:
                    olds.append((slot, slot.ptr))
                    slot.ptr = slot.size = 0
            if olds:
                jobs.append(self._give_back(hw, olds))
        for job in jobs:
            job.result()

    def _free_slots(self, hw: bool, olds: list[tuple[_RingSlot, int]], wait: float | None = None) -> None:
        stream = self.hw_stream if hw else self.cuda_stream
        rt = self.cp.cuda.runtime
        for slot, ptr in olds:
            if not slot.free.acquire(timeout=RING_WAIT if wait is None else wait):
                # its last call's images are still held: the slot's next call frees it (or close())
                slot.orphans.append(ptr)
                self.frees_late += 1
                continue
            try:
                if slot.release is not None:
                    stream.wait_event(slot.release)
                rt.freeAsync(ptr, stream.ptr)
            finally:
                slot.free.release()
        stream.synchronize()
        rt.memPoolTrimTo(rt.deviceGetDefaultMemPool(self.device_index), 0)

    def _sub_streams(self, blobs: list[Any], regions: list[tuple[int, int, int, int] | None]) -> list[Any]:
        """What the GPU decoders get: the encoded bytes, or a region of them as an nvImageCodec sub-stream."""
        nic = self.nic
        out = list(blobs)
        for i, r in enumerate(regions):
            if r is not None:
                try:
                    cs = nic.CodeStream(blobs[i])
                except TypeError:  # a buffer type the constructor does not take
                    cs = nic.CodeStream(bytes(blobs[i]))
                out[i] = cs.get_sub_code_stream(region=nic.Region(*r))
        return out

    def _decode(self, blobs: list[bytes], stream, max_pixels: int,
                headers: list[tuple[str | None, int, int]] | None,
                regions: list[tuple[int, int, int, int] | None] | None = None, chunk: int = 0,
                planes: bool = False) -> DecodeResult:
        t_start = time.perf_counter()
        self._collect()
        n = len(blobs)
        arrays: list[Any] = [None] * n
        errors: list[str | None] = [None] * n
        kinds: list[str | None] = [None] * n
        dims: list[tuple[int, int]] = [(0, 0)] * n  # (width, height) as stored
        groups: dict[str, list[int]] = {}
        to_cpu = []
        for i, b in enumerate(blobs):
            kind, w, h = headers[i] if headers is not None else (None, 0, 0)
            if kind is None:  # not given, or not seen in the part of the file the feed looked at
                kind, w, h = jpeg_kind(bytes(b))
            if max_pixels and w * h > max_pixels:
                errors[i] = f"image of {w}x{h} = {w * h} pixels exceeds --max-pixels {max_pixels}"
                continue
            if kind is not None and self.hw_direct and bytes(b[-2:]) != b"\xff\xd9":
                kind += "/unended"  # cut short (or followed by other bytes): nvImageCodec's checks, not the direct path
            kinds[i], dims[i] = kind, (w, h)
            if kind is None:
                to_cpu.append(i)
            else:
                groups.setdefault(kind, []).append(i)
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
            for i, img in self._place(res, zip(failed, self._cpu.map(lambda i: _host_decode(bytes(blobs[i]), max_pixels),
                                                                     failed)), stream):
                res.arrays[i] = img
            tm["cpu"] += time.perf_counter() - t0
            return res
        # the C API: each decoder's part goes to its thread, which posts what it decodes on the result's
        # queue; what the GPU cannot take starts on the CPU
        cpu_now = [(i, self._cpu.submit(_host_decode, bytes(blobs[i]), max_pixels)) for i in to_cpu]
        res.feed, res.chunked = queue.SimpleQueue(), bool(chunk)
        sink = weakref.ref(res)  # the threads post nothing once the result is dropped (freeing its memory)
        parts = 0
        for hw, lists, thread in ((True, to_hw, self._hw_thread), (False, [to_cuda], self._cuda_thread)):
            if any(lists):
                job = self._prepare(hw, blobs, regions, lists, stream, chunk, dims, kinds if planes else None)
                job.sink = sink
                thread.submit(self._run, job, blobs, regions, kinds)
                parts += 1
        res.pending = functools.partial(self._gather, parts, cpu_now, blobs, stream, max_pixels)
        tm["parse"] += time.perf_counter() - t_start
        return res

    def _gather(self, parts: int, cpu_now: list[tuple[int, Any]], blobs: list[Any], stream: Any, max_pixels: int,
                res: DecodeResult) -> Iterator[tuple[list[tuple[int, DeviceImage]], Any, Any]]:
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
        decoded += zip(failed, self._cpu.map(lambda i: _host_decode(bytes(blobs[i]), max_pixels), failed))
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

    def _learn(self, kinds: list[str | None], hw_idx: list[int], ok: list[bool]) -> list[int]:
        """Note which kinds the hardware engine takes; returns the indices it failed (to retry)."""
        retry = []
        taken: dict[str, bool] = {}
        for i, good in zip(hw_idx, ok):
            if good:
                taken[kinds[i]] = True
            else:
                retry.append(i)
                taken.setdefault(kinds[i], False)
        for kind, good in taken.items():  # (under ``_calling``) a kind decoded even once is not refused
            if good:                          # for a corrupt file
                self.hw_takes.add(kind)
            elif kind not in self.hw_takes:
                self.hw_refuses.add(kind)
        return retry

    def _prepare(self, hw: bool, blobs: list[Any], regions: list | None, lists: list[list[int]],
                 consumer: Any, chunk: int = 0, dims: list[tuple[int, int]] | None = None,
                 plane_kinds: list[str | None] | None = None) -> _Job:
        """Make the code streams and output descriptors of the items ``lists`` of a batch (one decode
        call per list): all in one device buffer taken on the decoder's stream, or with ``chunk`` in
        calls of at most ``chunk`` items, each in the decoder's next ring slot. Runs in the thread that
        hands the batch over, so the decoder's own thread only makes the decode calls. The hardware
        engine's direct path (``hw_direct``) needs neither: its items' places come from their stored
        sizes (``dims``: (width, height) per item, read from the headers where not given), or from
        ``regions`` (nvJPEG's region calls); with ``plane_kinds`` (the items' kinds) its 4:2:0 and
        4:2:2 images go into their planes where the part decodes whole images (a call is one kind,
        unless :data:`HW_MIXED`, which keeps RGB)."""
        lib = self.lib
        t0 = time.perf_counter()
        if chunk:
            lists = _call_lists(lists, hw, chunk)
        job = _Job(hw, lists, self.hw_stream if hw else self.cuda_stream, consumer, direct=hw and bool(self.hw_direct))
        if regions is not None and ("hw" if hw else "cuda") not in REGIONS_FOR:  # whole images, region views
            job.crops = {i: regions[i] for idx in lists for i in idx if regions[i] is not None}
            regions, plane_kinds = None, None
        shapes: dict[int, tuple[int, int]] = {}
        turns: dict[int, tuple[int, int, int]] = {}  # EXIF orientation per image
        items = [i for idx in lists for i in idx]
        sources = []
        for i in items:
            addr, size, keep = _host_address(blobs[i])
            job.hosts.append(keep)
            sources.append((addr, size, regions[i] if regions is not None else None))
        if job.direct:
            # planes only for whole images (a call is one output format, and a region's chroma edges
            # would need the samples outside it)
            whole = regions is None or not any(regions[i] is not None for i in items)
            for i, (addr, size, r) in zip(items, sources):
                w, h = dims[i] if dims is not None else jpeg_kind(bytes(blobs[i]))[1:]
                if w <= 0 or h <= 0:
                    job.part.failed.append(i)
                    continue
                job.sources[i], shapes[i], turns[i] = (addr, size), (h, w), (0, 0, 0)
                if r is not None:
                    job.regions[i], shapes[i] = r, (r[2] - r[0], r[3] - r[1])
                if plane_kinds is not None and not HW_MIXED and whole:
                    sampling = jplanes.SUBSAMPLING.get(plane_kinds[i].partition("/")[2])
                    if sampling is not None:
                        job.planes[i] = sampling
            sources = []
        for i, (_, _, r), got in zip(items, sources, lib.open_streams(sources) if sources else []):
            if got is None:
                job.part.failed.append(i)
                continue
            cs, h, w, turn = got
            if r is not None:
                h, w = r[2] - r[0], r[3] - r[1]
            if turn[0] % 180:
                h, w = w, h
            job.streams[i], shapes[i], turns[i] = cs, (h, w), turn
        job.turns = turns
        if chunk:
            for idx in lists:
                self._ring_bind(job, [i for i in idx if i in shapes], shapes, turns)
        else:
            self._bind(job, shapes, turns)
        job.lists = [[i for i in idx if i in job.views] for idx in lists]  # each call's items that have places
        if job.direct:  # each call's arrays made here, not in the hardware engine's thread (the pipeline's pace)
            job.args = [call_args([job.sources[i] for i in idx], [job.outputs[i] for i in idx]) for idx in job.lists]
        self.timings["hw_wrap" if hw else "cuda_wrap"] += time.perf_counter() - t0
        return job

    def _slab_size(self, hw: bool, need: int) -> int:
        """Bytes to take for a part that needs ``need``: rounded up to one of four sizes per power of two
        (and to :data:`SLAB_ROUND`), and up to the largest part this decoder has taken where that is at
        most a third larger, so that parts fit each other's freed blocks. On the bench's training
        chain (parts of about 74 MiB) exact sizes left the driver's pool reserving 384 MiB while at
        most 296 were in use at once; 16 MiB steps reserved 320, all in use (2, 4 or 8 MiB steps:
        352-384). With region decode (parts of about 40 MiB) 8 MiB steps reserved 160 and 16 MiB steps
        224 (benchmarks/memory_study.py, H200)."""
        size = max(need, 1)
        step = max(SLAB_ROUND, (1 << (size.bit_length() - 1)) >> 2)
        size = -(-size // step) * step
        if not SLAB_FIT:
            return size
        cap = self._slab_cap[hw]
        if size <= cap and size * 4 > cap * 3:
            return cap
        self._slab_cap[hw] = max(cap, size)
        return size

    def _bind(self, job: _Job, shapes: dict[int, tuple[int, int]], turns: dict[int, tuple[int, int, int]]) -> None:
        """Take the part's device buffer (on the decoder's stream) and make its output descriptors
        (``shapes``: item -> decoded (h, w); ``turns``: item -> EXIF orientation)."""
        cp = self.cp
        offsets, total = {}, 0
        for i, (h, w) in shapes.items():
            offsets[i] = total
            total += _item_bytes(job, i, h, w)
        size = self._slab_size(job.hw, total)
        with cp.cuda.Device(self.device_index):
            if self.stream_ordered:
                job.slab = _Slab(cp, size, job.stream, job.consumer)
                base = job.slab.ptr
            else:
                job.slab = cp.empty(size, cp.uint8)
                base = job.slab.data.ptr
        self._describe(job, shapes, turns, base, offsets)

    def _describe(self, job: _Job, shapes: dict[int, tuple[int, int]], turns: dict[int, tuple[int, int, int]],
                  base: int, offsets: dict[int, int]) -> None:
        """The output descriptors of the items ``offsets`` names (bytes from ``base``), in one call (the
        direct path: only their places)."""
        if job.direct:
            for i, off in offsets.items():
                _direct_view(job, i, base + off, *shapes[i])
            return
        specs = [(base + off, *shapes[i], shapes[i][1] * 3, turns[i]) for i, off in offsets.items()]
        for (i, off), img in zip(offsets.items(), self.lib.images(specs, job.stream.ptr)):
            h, w = shapes[i]
            job.images[i] = img
            job.views[i] = (base + off, (h, w, 3), w * 3)

    def _ring_bind(self, job: _Job, idx: list[int], shapes: dict[int, tuple[int, int]],
                   turns: dict[int, tuple[int, int, int]]) -> None:
        """Give the next call of ``job`` (items ``idx``) its ring slot (call k of a part: slot k; with
        :data:`CUDA_RING` the CUDA decoder's calls take its slots in turn), grown first where its buffer
        is too small (a new buffer, with :data:`SIZE_BY_MOST` large enough for the most of the call's kind
        a batch has had; with :data:`FREE_BEFORE_GROW` the old one is given back first, once
        its last call's readers are done, else freed then by :meth:`_take_slot`), and make the output
        descriptors in it."""
        cp = self.cp
        ring = self._rings[job.hw]
        taken_in_turn = HW_RING if job.hw else CUDA_RING
        if taken_in_turn:
            k = self._ring_turn[job.hw] % taken_in_turn
            self._ring_turn[job.hw] += 1
        else:
            k = len(job.slots)
        while len(ring) <= k:
            ring.append(_RingSlot())
        slot = ring[k]
        offsets, total = {}, 0
        for i in idx:
            h, w = shapes[i]
            offsets[i] = total
            total += _item_bytes(job, i, h, w)
        retire = None
        if total > slot.size:
            # room for a somewhat larger call later, and for the most of its kind a batch has had
            size = max(total + total // RING_SLACK, self._most_bytes(idx, total))
            step = max(SLAB_ROUND, (1 << (size.bit_length() - 1)) >> 4)
            size = -(-size // step) * step
            if slot.ptr and FREE_BEFORE_GROW and slot not in job.slots:
                # the old buffer goes back first, once the call before in this slot has been read (the
                # decoder's thread frees it after the calls handed over before): old and new are never
                # held at once, and the new one is cut from the memory the old one left
                old, slot.ptr, slot.size = slot.ptr, 0, 0
                self._give_back(job.hw, [(slot, old)], GROW_WAIT).result()
            with cp.cuda.Device(self.device_index):
                ptr = cp.cuda.runtime.mallocAsync(size, job.stream.ptr)
            retire, slot.ptr, slot.size = slot.ptr, ptr, size
        job.slots.append(slot)
        job.retire.append(retire)
        self._describe(job, shapes, turns, slot.ptr, offsets)

    def _take_slot(self, job: _Job, k: int) -> Any:
        """Before call ``k`` of a chunked ``job``: wait until the previous call in its ring slot was read
        (at most :data:`RING_WAIT` seconds), make the decoder's stream wait for those readers, and free
        the slot's old buffer where it grew. Returns the owner of this call's images (a :class:`_Chunk`),
        or, after the wait ran out, a buffer of the call's own (a :class:`_Slab`) the call's output
        descriptors are moved to."""
        slot = job.slots[k]
        t0 = time.perf_counter()
        t_end = t0 + RING_WAIT
        while not slot.free.acquire(timeout=0.05):
            if self._closing:
                raise _Closed
            if time.perf_counter() > t_end:  # the consumer holds the slot (batches read out of order?)
                self.ring_waits += 1
                if job.retire[k]:  # the slot grew for this call: its next holder frees the old buffer
                    slot.orphans.append(job.retire[k])
                return None
        self.timings["hw_slot" if job.hw else "cuda_slot"] += time.perf_counter() - t0
        owner = _Chunk(slot, job.consumer)
        rt = self.cp.cuda.runtime
        if slot.release is not None:
            job.stream.wait_event(slot.release)
        old = job.retire[k]
        if old is not None or slot.orphans:  # the slot grew: free its old buffers after their last readers
            for ptr in [old, *slot.orphans]:
                if ptr:
                    rt.freeAsync(ptr, job.stream.ptr)
            slot.orphans = []
            self._trims[job.hw].append(job.stream.record())  # then let the pool give the memory back
        trims = self._trims[job.hw]
        if trims and trims[0].done:
            while trims and trims[0].done:
                trims.popleft()
            rt.memPoolTrimTo(rt.deviceGetDefaultMemPool(self.device_index), 0)
        return owner

    def _own_buffer(self, job: _Job, idx: list[int]) -> _Slab:
        """A buffer of its own for a chunked call that could not have its slot: the call's descriptors
        are made again in it (and the slot's turn is skipped: its buffer stays with its holder)."""
        lib = self.lib
        total = sum(_item_bytes(job, i, *job.views[i][1][:2]) for i in idx)
        with self.cp.cuda.Device(self.device_index):
            slab = _Slab(self.cp, max(total, 1), job.stream, job.consumer)
        pos = slab.ptr
        for i in idx:
            _, (h, w, _c), row = job.views[i]
            if job.direct:
                _direct_view(job, i, pos, h, w)
            else:
                lib.destroy([], [job.images[i]])
                job.images[i] = lib.image(pos, h, w, row, job.stream.ptr, job.turns[i])
                job.views[i] = (pos, (h, w, 3), row)
            pos += _item_bytes(job, i, h, w)
        return slab

    def _run(self, job: _Job, blobs: list[Any], regions: list | None, kinds: list[str | None]) -> None:
        """Decode a prepared part of a batch with the hardware engine (``job.hw``: one call per list, that
        is per kind or chunk, taking turns over the instances) or the CUDA decoder; runs in that
        decoder's thread. Posts on the batch's result (``job.sink``) the images of each call (chunks) or
        of the whole part, then the part's end; what the hardware engine failed then goes to the CUDA
        decoder's thread as a part of its own."""
        try:
            retry = self._calls(job, kinds)
        except _Closed:
            return
        except BaseException as e:  # the consumer raises it
            _post(job.sink, ("error", e))
            raise
        finally:
            self.lib.destroy(list(job.streams.values()), list(job.images.values()))
        job.part.retried = int(bool(retry))
        _post(job.sink, ("end", job.part))  # before the retry can post its own end
        if retry:  # what the hardware engine refused or failed, once more on the CUDA decoder
            again = self._prepare(False, blobs, regions, [retry], job.consumer)
            again.sink = job.sink
            self._cuda_thread.submit(self._run, again, blobs, regions, kinds)

    def _hw_instance(self, pool: list[Any], kind: str | None) -> Any:
        """The hardware-engine instance for a call of ``kind``: the least recently used of those whose
        last call was of the same kind or that have not been used, else the least recently used of
        all. An instance whose call's kind differs from its last call's decodes at about half speed
        (8,300-9,100 images/s against 13,800-16,000, the engine alone; RESULTS.md, fourteenth session),
        so each kind keeps its instances (with as many kinds as instances, one each); a kind alone
        (a set all 4:2:0) still has its calls alternate over every instance, as taking turns gave."""
        self._hw_turn += 1
        last = self._hw_last
        first = pool[: self._hw_first]
        fits = [d for d in first if id(d) not in last or last[id(d)][0] == kind]
        if not fits:  # a spare: one unused or of this kind
            fits = [d for d in pool[len(first):] if id(d) not in last or last[id(d)][0] == kind]
        pick = min(fits or pool, key=lambda d: last.get(id(d), (None, -1))[1])
        last[id(pick)] = (kind, self._hw_turn)
        return pick

    def _calls(self, job: _Job, kinds: list[str | None]) -> list[int]:
        """The decode calls of :meth:`_run`; returns what the hardware engine failed."""
        cp, part, streams, images = self.cp, job.part, job.streams, job.images
        t0 = time.perf_counter()
        done: list[tuple[int, bool]] = []
        retry: list[int] = []
        with cp.cuda.Device(self.device_index):
            for k, idx in enumerate(job.lists):  # (each call's items with places: _prepare)
                if not idx:
                    continue
                owner = None
                args = job.args[k] if job.args else None
                if job.slots:  # a chunk: into its ring slot, or a buffer of its own
                    owner = self._take_slot(job, k)
                    if owner is None:
                        owner, args = self._own_buffer(job, idx), None  # (new places: new arrays)
                if job.direct:
                    dec = self._hw_instance(self.hw_direct, kinds[idx[0]])
                    fmt = OUTPUT_YUV if idx[0] in job.planes else OUTPUT_RGBI  # (a call is one kind)
                    parts = [job.regions.get(i) for i in idx] if job.regions else None
                    t_call = time.perf_counter()
                    try:
                        dec.decode([job.sources[i] for i in idx], [job.outputs[i] for i in idx], job.stream, fmt,
                                   regions=parts, args=args)
                        ok = [True] * len(idx)
                    except NvjpegError:  # the call failed as a whole (a corrupt image fails its call)
                        ok = [False] * len(idx)
                    self.timings["hw_nvjpeg"] += time.perf_counter() - t_call
                    part.hw += sum(ok)
                    retry.extend(self._learn(kinds, idx, ok))
                elif job.hw:
                    dec = self._hw_instance(self.hw_cs, kinds[idx[0]])
                    ok = dec.finish(dec.start([streams[i] for i in idx], [images[i] for i in idx]))
                    part.hw += sum(ok)
                    retry.extend(self._learn(kinds, idx, ok))
                else:
                    ok = self.cuda_c.finish(self.cuda_c.start([streams[i] for i in idx], [images[i] for i in idx]))
                done.extend(zip(idx, ok))
                if owner is not None:
                    self._publish(job, done, owner)
                    done, owner = [], None
            if not job.slots:  # the whole part in one buffer
                slab = job.slab
                self._publish(job, done, slab if self.stream_ordered else _Release([slab], job.consumer, self._freed))
        self.timings["hw" if job.hw else "cuda"] += time.perf_counter() - t0
        return retry

    def _publish(self, job: _Job, done: list[tuple[int, bool]], owner: Any) -> None:
        """Post the images of ``done`` (item, decoded) in ``owner``'s memory with the decode's end event;
        what the CUDA decoder failed goes to the CPU."""
        event = job.stream.record(_event_class(self.cp)())  # (an event a finalizer can tell is gone)
        if not isinstance(owner, _Release):
            owner.event = event  # until the consumer waits for it
        views = []  # (item, address, shape, row pitch, sampling): the consumer makes the DeviceImages (_gather)
        for i, good in done:
            if good:
                ptr, shape, row = job.views[i]
                if i in job.crops:  # (interleaved RGB)
                    y0, x0, y1, x1 = job.crops[i]
                    ptr, shape = ptr + y0 * row + x0 * 3, (y1 - y0, x1 - x0, 3)
                views.append((i, ptr, shape, row, job.planes.get(i)))
            elif not job.hw:
                job.part.failed.append(i)
        _post(job.sink, ("images", views, owner, event, job.hw))

    def _gpu_python(self, blobs, regions, kinds, to_hw, to_cuda, stream, res: DecodeResult) -> list[int]:
        """Decode through nvImageCodec's Python binding (one output allocation per image)."""
        tm = self.timings
        arrays = res.arrays
        to_cpu: list[int] = []
        t0 = time.perf_counter()
        gpu_in = self._sub_streams(blobs, regions) if regions is not None and any(regions) else blobs
        side = self._side.submit(self._call, self.cuda, self.cuda_stream, [gpu_in[i] for i in to_cuda])
        hw_out: list[Any] = []
        for lst in to_hw:  # one call per kind: the engine's host side is slower on mixed calls
            hw_out.extend(self._call(self.hw, self.hw_stream, [gpu_in[i] for i in lst])[0])
        to_hw = [i for lst in to_hw for i in lst]
        t1 = time.perf_counter()
        t_hw = t1 - t0
        tm["hw"] += t1 - t0
        for i, img in zip(to_hw, hw_out):
            if img is not None:
                arrays[i] = img
        res.hw += sum(img is not None for img in hw_out)
        retry = self._learn(kinds, to_hw, [img is not None for img in hw_out])
        cuda_out, t_cuda = side.result()
        t2 = time.perf_counter()
        tm["cuda"] += t2 - t1
        self._adapt(t_hw, t_cuda)
        for i, img in zip(to_cuda, cuda_out):
            if img is None:
                to_cpu.append(i)
            else:
                arrays[i] = img
        if retry:
            out, _ = self._call(self.cuda, self.cuda_stream, [gpu_in[i] for i in retry])
            for i, img in zip(retry, out):
                if img is None:
                    to_cpu.append(i)
                else:
                    arrays[i] = img
        # every DeviceImage holds ``owner``, so the images are freed (stream-ordered) with the last of them
        owner = _Release([], stream, self._freed)
        for i in range(len(arrays)):
            img = arrays[i]
            if img is None or isinstance(img, DeviceImage):
                continue
            ref = _device_image(img, owner)
            if ref is None:  # an odd result (alpha, 16 bit): let the CPU path do it
                arrays[i] = None
                to_cpu.append(i)
                continue
            owner.images.append(img)
            arrays[i] = ref
            res.on_gpu += 1
        if owner.images:
            res.keep.append(owner)
        tm["hw_wrap"] += time.perf_counter() - t2
        return to_cpu


def _want_direct(hw_direct: bool | None) -> bool:
    """Whether to drive the hardware engine through nvJPEG directly (``hw_direct``, else
    :data:`HW_DIRECT` unless GPUBATCH_HW_DIRECT=0)."""
    if hw_direct is not None:
        return hw_direct
    return HW_DIRECT and os.environ.get("GPUBATCH_HW_DIRECT", "1") != "0"


def _host_address(blob: Any) -> tuple[int, int, Any]:
    """(address, size, object keeping it valid) of encoded bytes: ``bytes``, or any buffer (the feed's
    NumPy views of shared memory are writable, which is the fastest case)."""
    if isinstance(blob, bytes):
        return ctypes.cast(blob, ctypes.c_void_p).value or 0, len(blob), blob
    try:
        c = ctypes.c_char.from_buffer(blob)
        return ctypes.addressof(c), len(blob) if isinstance(blob, np.ndarray) else memoryview(blob).nbytes, c
    except (TypeError, ValueError):  # read-only or not contiguous
        arr = np.ascontiguousarray(np.frombuffer(blob, np.uint8))
        return arr.ctypes.data, arr.nbytes, arr


@functools.cache
def _tiny_jpegs(n: int) -> list[bytes]:
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


def _host_decode(data: bytes, max_pixels: int) -> tuple[np.ndarray | None, str | None]:
    try:
        return host.decode(data, max_pixels), None
    except ValueError as e:
        return None, str(e)


class GpuImageEncoder:
    """Batched JPEG encode on the GPU; PNG (lossless) on the CPU threads.

    ``jpeg="batched"`` (the default) encodes a whole batch in a few launches
    (:mod:`~gpubatch.engine.codecs.jpeg_gpu`); ``jpeg="nvimagecodec"`` uses nvImageCodec's CUDA encoder,
    image by image (slower on small images; kept to compare against).
    """

    THREADS = 4
    KINDS = ("batched", "nvimagecodec")

    def __init__(self, device_index: int = 0, cpu_threads: int = 8, jpeg: str = "batched", staging: Any = None):
        if jpeg not in self.KINDS:
            raise ValueError(f"unknown JPEG encoder {jpeg!r}; supported: {', '.join(self.KINDS)}")
        self.jpeg = jpeg
        if jpeg == "batched":
            import cupy as cp

            from ..batch import PinnedStaging
            from .jpeg_gpu import BatchedJpegEncoder

            self.batched = BatchedJpegEncoder(cp, staging or PinnedStaging(cp))
        else:
            nic = nvimgcodec()
            self.nic = nic
            # 4 threads: 7,430 images/s on 224x224 batches against 6,055 with the default (one per core)
            # and 6,770 with 8 (benchmarks/decode_study.py, group "encode")
            self.encoder = nic.Encoder(device_id=device_index, max_num_cpu_threads=self.THREADS)
        self._cpu = ThreadPoolExecutor(max_workers=max(1, cpu_threads), thread_name_prefix="gpubatch-encode")

    def close(self) -> None:
        self._cpu.shutdown(wait=True)

    def encode_batch(self, batch: Any, idx: list[int], codec: str, quality: int, stream,
                     sink: Any = None) -> list[Any]:
        """Encode items ``idx`` of a uint8 HWC :class:`~gpubatch.engine.batch.DeviceBatch` (the batched
        JPEG encoder reads them in place, without a view object per item, and writes into ``sink``
        when given: :class:`~gpubatch.engine.codecs.jpeg_gpu.EncodedSpan` values then come back)."""
        if codec == "jpeg" and self.jpeg == "batched":
            from ..batch import Ragged

            return list(self.batched.encode(Ragged.from_batch(batch).take(idx), quality, stream, sink))
        return self.encode([batch.item(k) for k in idx], codec, quality, stream)

    def encode(self, arrays: list[Any], codec: str, quality: int, stream) -> list[bytes | None]:
        """Encode CuPy uint8 HWC arrays (ordered on ``stream``); None where the encoder failed."""
        if not arrays:
            return []
        if codec == "jpeg" and self.jpeg == "batched":
            return list(self.batched.encode(arrays, quality, stream))
        if codec == "jpeg":
            nic = self.nic
            images = [nic.as_image(a, cuda_stream=stream.ptr) for a in arrays]
            params = nic.EncodeParams(quality_type=nic.QualityType.QUALITY, quality_value=float(quality),
                                      chroma_subsampling=nic.ChromaSubsampling.CSS_420)
            out = self.encoder.encode(images, "jpeg", params=params, cuda_stream=stream.ptr)
            return [bytes(cs) if cs is not None else None for cs in out]
        hosts = [a.get(stream=stream) for a in arrays]
        stream.synchronize()
        return list(self._cpu.map(lambda a: host.encode(a, codec, quality), hosts))
