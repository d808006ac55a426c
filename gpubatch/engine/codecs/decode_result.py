"""What the GPU image decoder hands back: a batch's decoded images (:class:`DecodeResult`), each a
:class:`DeviceImage` (a view of device memory, with the owner that keeps it alive).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gpu.context import wait_held
from . import planes as jplanes
from .decode_buffers import _Chunk, _Slab, _stream_ref


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
                wait_held(on, event)
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
