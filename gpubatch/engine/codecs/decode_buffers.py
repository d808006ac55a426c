"""The GPU image decoder's device buffers: a batch part's buffer (a slab from the driver's
stream-ordered pool), or with chunked decoding a ring of slots each call of the next batch reuses once
the consumer's kernels have read it; the output places of each decoded image. The buffer part of
:class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder`.
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gpu.context import current_device_held, record_again, wait_held
from ..settings import Settings
from . import planes as jplanes
from .headers import jpeg_kind
from .nvjpeg_hw import call_args


def want_planes(chunk: int, settings: Settings) -> bool:
    """Whether a reader of one resample asks the decoder for planes (``settings.hw_planes``), decoding
    in chunks of ``chunk`` (0: whole parts; ``settings.hw_chunk`` and more: whole calls)."""
    planes = settings.hw_planes
    return planes == "always" or (planes == "chunked" and 0 < chunk < settings.hw_chunk)


def set_pool_keep(cp, device_index: int, keep: int, again: bool = False) -> bool:
    """Let the driver's default pool (where decoded images live) keep up to ``keep`` bytes of freed
    memory instead of returning it at every synchronization: once per device, unless ``again`` (a
    memory cap's plan changes it). False where the device has no stream-ordered pool."""
    if again or device_index not in _POOLS_SET:
        try:
            pool = cp.cuda.runtime.deviceGetDefaultMemPool(device_index)
            cp.cuda.runtime.memPoolSetAttribute(pool, 4, keep)  # cudaMemPoolAttrReleaseThreshold
            _POOLS_SET.add(device_index)
        except Exception:  # a driver without stream-ordered pools: nvImageCodec uses cudaMalloc there
            return False
    return True


_POOLS_SET: set[int] = set()


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


def _readers_after(consumer: Any, event: Any) -> Any:
    """For a finalizer: the consumer's stream (``consumer``, a :func:`_stream_ref`), made to wait for the
    decode-end ``event`` if one is given; or None, once the whole device has been waited for, where the
    stream or the event is gone (collected first)."""
    stream = consumer()
    if stream is not None and (event is None or event.ptr):
        if event is not None:
            wait_held(stream, event)
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

    __slots__ = ("ptr", "size", "free", "release", "orphans", "decoded", "released")

    def __init__(self) -> None:
        self.ptr, self.size = 0, 0
        self.free = threading.Semaphore(1)
        self.release: Any = None
        # events made once and recorded again (with the GIL kept): the end of the slot's last call on the
        # decoder's stream, and the consumer's progress once that call's images are dropped (``release``)
        self.decoded: Any = None
        self.released: Any = None
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
            slot = self.slot
            if stream is None:
                slot.release = None
            else:  # (the slot's next call waits for it before the slot's images are dropped again)
                slot.release = slot.released = record_again(slot.released, stream, cupy)
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
    warm: bool = False  # a warm-up's part: its seconds are not a run's decode time
    sources: dict[int, tuple[int, int]] = field(default_factory=dict)  # (direct) item -> (host address, size)
    planes: dict[int, tuple[int, int]] = field(default_factory=dict)  # (direct) item -> chroma sampling, decoded
                                                                       # into planes (.planes)
    outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)  # (direct) item -> its nvJPEG output places
    regions: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # (direct) item -> the part decoded
    crops: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # item -> the part its view shows
                                                                               # (decoded whole; settings.regions_for)
    args: list[Any] = field(default_factory=list)  # (direct) per call its nvJPEG arrays (nvjpeg_hw.call_args)
    bank: int = 0  # the bank of ring slots its calls take (settings.ring_banks)


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


def _call_lists(lists: list[list[int]], hw: bool, chunk: int, settings: Settings,
                sizes: dict[int, int] | None = None) -> list[list[int]]:
    """A decoder's part of a batch (one list of items per kind) as the calls of chunked decode: each list
    in pieces of at most ``chunk`` items (the hardware engine's: ``settings.hw_chunk``), with
    ``settings.call_bytes`` and the items' decoded ``sizes`` also of at most that many bytes
    (:func:`_byte_pieces`), and at least ``settings.min_calls`` calls (with two, the next part's first
    call never waits on the readers of the call just made)."""
    most = settings.hw_chunk if hw else chunk
    if settings.call_bytes and sizes is not None:
        out = [piece for idx in lists for piece in _byte_pieces(idx, most, settings.call_bytes, sizes)]
    else:
        out = [piece for idx in lists for piece in _pieces(idx, most)]
    if len(out) < settings.min_calls and len(out[0]) > 1:
        out = _pieces(out[0], -(-len(out[0]) // settings.min_calls))
    return out


def _byte_pieces(idx: list[int], most: int, budget: int, sizes: dict[int, int]) -> list[list[int]]:
    """``idx`` in consecutive pieces of at most ``most`` items whose ``sizes`` (bytes; an item missing
    counts 0) add up to at most ``budget``; an item larger than the budget is a piece alone. Where
    :func:`_pieces`'s even pieces by count fit the budget, those."""
    even = _pieces(idx, most)
    if all(sum(sizes.get(i, 0) for i in p) <= budget for p in even):
        return even
    out: list[list[int]] = [[]]
    used = 0
    for i in idx:
        b = sizes.get(i, 0)
        if out[-1] and (len(out[-1]) >= most or used + b > budget):
            out.append([])
            used = 0
        out[-1].append(i)
        used += b
    return out


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


def _host_address(blob: Any) -> tuple[int, int, Any]:
    """(address, size, object keeping it valid) of encoded bytes: ``bytes``, or any buffer (writable ones are
    the fastest case). A feed's batch gives every item's address at once instead (``SlotViews.addresses``)."""
    if isinstance(blob, bytes):
        return ctypes.cast(blob, ctypes.c_void_p).value or 0, len(blob), blob
    try:
        c = ctypes.c_char.from_buffer(blob)
        return ctypes.addressof(c), len(blob) if isinstance(blob, np.ndarray) else memoryview(blob).nbytes, c
    except (TypeError, ValueError):  # read-only or not contiguous
        arr = np.ascontiguousarray(np.frombuffer(blob, np.uint8))
        return arr.ctypes.data, arr.nbytes, arr


class DecodeBuffers:
    """The buffer part of :class:`~gpubatch.engine.codecs.image_gpu.GpuImageDecoder` (a mixin: the
    decoder's state, its ``settings`` among it, is the instance's)."""

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
        if not self.settings.size_by_most or not idx:
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
            if not slot.free.acquire(timeout=self.settings.ring_wait if wait is None else wait):
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
        unless ``settings.hw_mixed``, which keeps RGB)."""
        lib = self.lib
        t0 = time.perf_counter()
        by_bytes = bool(chunk and self.settings.call_bytes)  # cut once the decoded sizes are known
        if chunk and not by_bytes:
            lists = _call_lists(lists, hw, chunk, self.settings)
        job = _Job(hw, lists, self.hw_stream if hw else self.cuda_stream, consumer, direct=hw and bool(self.hw_direct))
        if regions is not None and ("hw" if hw else "cuda") not in self.settings.regions_for:  # whole images, region views
            job.crops = {i: regions[i] for idx in lists for i in idx if regions[i] is not None}
            regions, plane_kinds = None, None
        shapes: dict[int, tuple[int, int]] = {}
        turns: dict[int, tuple[int, int, int]] = {}  # EXIF orientation per image
        items = [i for idx in lists for i in idx]
        if hasattr(blobs, "addresses"):  # (a feed's slot, SlotViews: every item's address at once)
            addrs, lens = blobs.addresses()
            job.hosts.append(blobs)
        else:
            addrs, lens = [0] * len(blobs), [0] * len(blobs)
            for i in items:
                addrs[i], lens[i], keep = _host_address(blobs[i])
                job.hosts.append(keep)
        sources = [(addrs[i], lens[i], regions[i] if regions is not None else None) for i in items]
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
                if plane_kinds is not None and not self.settings.hw_mixed and whole:
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
        sizes = {i: _item_bytes(job, i, *shapes[i]) for i in shapes} if chunk else None
        if by_bytes:
            lists = _call_lists(lists, hw, chunk, self.settings, sizes)
        if chunk:
            for idx in lists:
                self._ring_bind(job, [i for i in idx if i in shapes], shapes, turns, sizes)
        else:
            self._bind(job, shapes, turns)
        job.lists = [[i for i in idx if i in job.views] for idx in lists]  # each call's items that have places
        if job.direct:  # each call's arrays made here, not in the hardware engine's thread (the pipeline's pace)
            job.args = [call_args([job.sources[i] for i in idx], [job.outputs[i] for i in idx]) for idx in job.lists]
        self.timings["hw_wrap" if hw else "cuda_wrap"] += time.perf_counter() - t0
        return job

    def _slab_size(self, hw: bool, need: int) -> int:
        """Bytes to take for a part that needs ``need``: rounded up to one of four sizes per power of two
        (and to ``settings.slab_round``), and up to the largest part this decoder has taken where that is at
        most a third larger, so that parts fit each other's freed blocks. On the bench's training
        chain (parts of about 74 MiB) exact sizes left the driver's pool reserving 384 MiB while at
        most 296 were in use at once; 16 MiB steps reserved 320, all in use (2, 4 or 8 MiB steps:
        352-384). With region decode (parts of about 40 MiB) 8 MiB steps reserved 160 and 16 MiB steps
        224 (the memory study (docs/engine.md), H200)."""
        size = max(need, 1)
        step = max(self.settings.slab_round, (1 << (size.bit_length() - 1)) >> 2)
        size = -(-size // step) * step
        if not self.settings.slab_fit:
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
                   turns: dict[int, tuple[int, int, int]], sizes: dict[int, int]) -> None:
        """Give the next call of ``job`` (items ``idx``, of ``sizes`` bytes decoded) its ring slot (call k of a part: slot k of
        the part's bank, ``settings.ring_banks`` of them taken by the parts in turn; with ``settings.cuda_ring`` the
        CUDA decoder's calls take its slots in turn), grown first where its buffer
        is too small (a new buffer, with ``settings.size_by_most`` large enough for the most of the call's kind
        a batch has had; with ``settings.free_before_grow`` the old one is given back first, once
        its last call's readers are done, else freed then by :meth:`_take_slot`), and make the output
        descriptors in it."""
        cp = self.cp
        ring = self._rings[job.hw]
        taken_in_turn = self.settings.hw_ring if job.hw else self.settings.cuda_ring
        if taken_in_turn:
            k = self._ring_turn[job.hw] % taken_in_turn
            self._ring_turn[job.hw] += 1
        else:  # call k of the part: the k-th slot of the part's bank (its banks interleaved in the ring)
            banks = max(1, self.settings.ring_banks)
            if not job.slots:
                job.bank = self._ring_part[job.hw] % banks
                self._ring_part[job.hw] += 1
            k = len(job.slots) * banks + job.bank
        while len(ring) <= k:
            ring.append(_RingSlot())
        slot = ring[k]
        offsets, total = {}, 0
        for i in idx:
            offsets[i] = total
            total += sizes[i]
        retire = None
        if total > slot.size:
            # room for a somewhat larger call later, and for the most of its kind a batch has had
            size = max(total + total // self.settings.ring_slack, self._most_bytes(idx, total))
            step = max(self.settings.slab_round, (1 << (size.bit_length() - 1)) >> 4)
            size = -(-size // step) * step
            if slot.ptr and self.settings.free_before_grow and slot not in job.slots:
                # the old buffer goes back first, once the call before in this slot has been read (the
                # decoder's thread frees it after the calls handed over before): old and new are never
                # held at once, and the new one is cut from the memory the old one left
                old, slot.ptr, slot.size = slot.ptr, 0, 0
                self._give_back(job.hw, [(slot, old)], self.settings.grow_wait).result()
            with cp.cuda.Device(self.device_index):
                ptr = cp.cuda.runtime.mallocAsync(size, job.stream.ptr)
            retire, slot.ptr, slot.size = slot.ptr, ptr, size
        job.slots.append(slot)
        job.retire.append(retire)
        self._describe(job, shapes, turns, slot.ptr, offsets)

    def _take_slot(self, job: _Job, k: int) -> Any:
        """Before call ``k`` of a chunked ``job``: wait until the previous call in its ring slot was read
        (at most ``settings.ring_wait`` seconds), make the decoder's stream wait for those readers, and free
        the slot's old buffer where it grew. Returns the owner of this call's images (a :class:`_Chunk`),
        or, after the wait ran out, a buffer of the call's own (a :class:`_Slab`) the call's output
        descriptors are moved to."""
        slot = job.slots[k]
        t0 = time.perf_counter()
        t_end = t0 + self.settings.ring_wait
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
            wait_held(job.stream, slot.release)
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


def _make_current(runtime: Any, device_index: int) -> None:
    """Make ``device_index`` the calling thread's current device and leave it so. Not a ``with
    cupy.cuda.Device(...)`` block: leaving one in a thread that was on device 0 sets device 0 again,
    and since CUDA 12 setting a device makes its context (the two-GPU test failed so)."""
    if current_device_held() != device_index:  # (asked with the GIL kept: finalizers run in the consumer's thread)
        runtime.setDevice(device_index)


class _Closed(Exception):
    """The decoder is closing: a call waiting for its ring slot stops."""
