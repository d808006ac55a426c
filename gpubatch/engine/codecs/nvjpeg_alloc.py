"""Stream-ordered memory for nvJPEG's own buffers (``nvjpegCreateExV2``'s extended allocators), opt-in.

Made with ``nvjpegCreateEx`` and no allocators, an nvJPEG handle takes its device buffers with ``cudaMalloc`` and
gives them back with ``cudaFree``, its pinned buffers with ``cudaHostAlloc`` / ``cudaFreeHost``; a free waits
for the whole device, every stream's work, before it returns. Alone on the GPU that costs nothing; under
``convert``, the chain's kernels and the JPEG encoder on the GPU beside the hardware engine's calls, a free
inside a call would wait for them. Profiles of the hardware calls showed ``cuMemFree_v2`` in them (6% of the
loader's samples inside ``nvjpegDecodeBatched``, 2026-12-03), and the calls take twice their time alone under
``convert`` (65-93 us an image against 30).

Here (``GPUBATCH_HW_ALLOC=stream``) the handle's device buffers come from the device's stream-ordered pool
(``cuMemAllocAsync`` / ``cuMemFreeAsync`` on the stream nvJPEG names): a free waits for nothing. Its pinned
buffers are kept once freed, for later requests, after the work before the free on its stream has ended (an
event recorded at the free); none is given back before the process ends, so pinned memory stays at nvJPEG's
peak. The callbacks are Python (ctypes), taking the GIL: they are counted (``hw_allocs``), so that a run
shows whether nvJPEG allocates in its calls at all.
"""

from __future__ import annotations

import ctypes as C
import functools
import threading
from typing import Any

_DEV_MALLOC = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.c_size_t, C.c_void_p)
_DEV_FREE = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t, C.c_void_p)


class DevAllocatorV2(C.Structure):  # nvjpegDevAllocatorV2_t
    _fields_ = [("dev_malloc", _DEV_MALLOC), ("dev_free", _DEV_FREE), ("dev_ctx", C.c_void_p)]


class PinnedAllocatorV2(C.Structure):  # nvjpegPinnedAllocatorV2_t (the same callback types)
    _fields_ = [("pinned_malloc", _DEV_MALLOC), ("pinned_free", _DEV_FREE), ("pinned_ctx", C.c_void_p)]


@functools.cache
def _driver() -> Any:
    """libcuda's calls the callbacks make, through ``PyDLL`` (the GIL kept: a callback holds it already)."""
    cuda = C.PyDLL("libcuda.so.1")
    vp, st, u = C.c_void_p, C.c_size_t, C.c_uint
    for name, args in (("cuMemAllocAsync", [C.POINTER(C.c_uint64), st, vp]), ("cuMemFreeAsync", [C.c_uint64, vp]),
                       ("cuMemHostAlloc", [C.POINTER(vp), st, u]), ("cuEventCreate", [C.POINTER(vp), u]),
                       ("cuEventRecord", [vp, vp]), ("cuEventQuery", [vp]), ("cuEventDestroy_v2", [vp])):
        fn = getattr(cuda, name)
        fn.argtypes, fn.restype = args, C.c_int
    return cuda


def _guarded(fn: Any) -> Any:
    """``fn`` as a callback that fails (returns 1: nvJPEG's allocator failure) where it raises: ctypes would
    print the exception and return 0, success, with no memory behind it."""

    def call(*args: Any) -> int:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - told to nvJPEG as a failed allocation
            return 1

    return call


class StreamAllocators:
    """One process's extended allocators for nvJPEG handles (:func:`allocators`); ``counts``: the callbacks'
    calls by kind (``dev_malloc``, ``dev_free``, ``pinned_malloc``, ``pinned_free``, ``pinned_reused``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(("dev_malloc", "dev_free", "pinned_malloc", "pinned_free", "pinned_reused"), 0)
        self.sizes: dict[int, int] = {}  # pinned block -> its size
        self.waiting: list[tuple[int, Any]] = []  # pinned blocks freed: (block, the event of its free)
        self.free: list[int] = []  # pinned blocks whose last use has ended
        self._keep = (_DEV_MALLOC(_guarded(self._dev_malloc)), _DEV_FREE(_guarded(self._dev_free)),
                      _DEV_MALLOC(_guarded(self._pinned_malloc)), _DEV_FREE(_guarded(self._pinned_free)))
        self.dev = DevAllocatorV2(self._keep[0], self._keep[1], None)
        self.pinned = PinnedAllocatorV2(self._keep[2], self._keep[3], None)

    def total(self) -> int:
        """The callbacks' calls so far."""
        return sum(v for k, v in self.counts.items() if k != "pinned_reused")

    def _dev_malloc(self, _ctx: Any, out: Any, size: int, stream: Any) -> int:
        self.counts["dev_malloc"] += 1
        ptr = C.c_uint64()
        status = _driver().cuMemAllocAsync(C.byref(ptr), max(1, size), stream)
        out[0] = ptr.value if status == 0 else None
        return status

    def _dev_free(self, _ctx: Any, ptr: Any, _size: int, stream: Any) -> int:
        self.counts["dev_free"] += 1
        return _driver().cuMemFreeAsync(ptr or 0, stream) if ptr else 0

    def _pinned_malloc(self, _ctx: Any, out: Any, size: int, _stream: Any) -> int:
        cuda = _driver()
        with self.lock:
            self.counts["pinned_malloc"] += 1
            still = []
            for block, event in self.waiting:  # (blocks whose free's work has ended are free again)
                if cuda.cuEventQuery(event.value) == 0:
                    cuda.cuEventDestroy_v2(event.value)
                    self.free.append(block)
                else:
                    still.append((block, event))
            self.waiting = still
            fits = [b for b in self.free if self.sizes[b] >= size]
            if fits:
                block = min(fits, key=self.sizes.__getitem__)
                self.free.remove(block)
                self.counts["pinned_reused"] += 1
                out[0] = block
                return 0
        ptr = C.c_void_p()
        status = cuda.cuMemHostAlloc(C.byref(ptr), max(1, size), 0)
        if status == 0:
            with self.lock:
                self.sizes[ptr.value] = max(1, size)
        out[0] = ptr.value if status == 0 else None
        return status

    def _pinned_free(self, _ctx: Any, ptr: Any, _size: int, stream: Any) -> int:
        if not ptr:
            return 0
        cuda = _driver()
        event = C.c_void_p()
        status = cuda.cuEventCreate(C.byref(event), 2)  # CU_EVENT_DISABLE_TIMING
        if status == 0:
            status = cuda.cuEventRecord(event.value, stream)
        with self.lock:
            self.counts["pinned_free"] += 1
            if status == 0:
                self.waiting.append((ptr, event))
            # (else the block is kept, never reused: a lost block rather than one reused while still read)
        return 0


_LOCK = threading.Lock()
_MADE: list[StreamAllocators] = []


def allocators() -> StreamAllocators:
    """This process's :class:`StreamAllocators` (made once; it outlives every handle that uses it)."""
    with _LOCK:
        if not _MADE:
            _MADE.append(StreamAllocators())
        return _MADE[0]


def calls() -> int:
    """The callbacks' calls in this process so far (0 where none was made)."""
    return _MADE[0].total() if _MADE else 0
