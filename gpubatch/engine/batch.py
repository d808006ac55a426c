"""Batches: HostBatch (NumPy items, packed where they share a shape), DeviceBatch (one packed CuPy buffer) and Ragged
(device images by pointer), with the small host tables a launch uploads.

A DeviceBatch holds a whole ragged batch in ONE buffer with per-item offsets and shapes, so one kernel
launch covers it; items are zero-copy views, and the buffer exchanges with PyTorch/JAX via DLPack. A
Ragged batch points at images wherever they lie (the decoders' buffers, a DeviceBatch's items), so a
launch reads them without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .gpu.context import copy_held, record_again, sync_held


class HostBatch(Sequence):
    """A batch on the CPU (``ImagePipeline`` with ``device="cpu"``): its items (NumPy arrays) in one
    (N, ...) array where they share a shape and dtype, so that ``torch.from_dlpack(batch)`` and
    ``np.asarray(batch)`` take it whole, without a copy; a ragged batch is its items (:meth:`items`).

    Attributes:
        keys: the keys of the records the batch holds, in row order.
        failed: (key, reason) of the records that failed and are not in it: a failed image is dropped
            with its key, and never shifts the rows of the others.
    """

    def __init__(self, items: Sequence[np.ndarray] | np.ndarray, keys: Sequence[str] = (),
                 failed: Sequence[tuple[str, str]] = ()):
        self.keys, self.failed = list(keys), list(failed)
        if isinstance(items, np.ndarray):
            self._packed: np.ndarray | None = items
            self._items: list[np.ndarray] = list(items)
        elif items and len({(a.shape, a.dtype) for a in items}) == 1:
            self._packed = np.stack(items)
            self._items = list(self._packed)
        else:
            self._packed, self._items = None, list(items)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def items(self) -> list[np.ndarray]:
        """The items (views of the packed array where there is one)."""
        return list(self._items)

    def stacked(self) -> np.ndarray:
        """The batch as one (N, ...) array (no copy); ValueError where the items differ in shape."""
        if self._packed is None:
            if not self._items:
                raise ValueError("empty batch")
            raise ValueError("items differ in shape; use items()")
        return self._packed

    @property
    def shape(self) -> tuple[int, ...] | None:
        """(N, ...) where the items share a shape, as :meth:`stacked` gives them; None for a ragged batch."""
        return self._packed.shape if self._packed is not None else None

    @property
    def dtype(self) -> Any:
        """The items' dtype (None for an empty batch)."""
        return self._items[0].dtype if self._items else None

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.stacked()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __dlpack__(self, stream: Any = None, **kw: Any) -> Any:
        if stream not in (None, -1):
            raise BufferError("a CPU batch takes no stream")
        return self.stacked().__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self.stacked().__dlpack_device__()

    def __repr__(self) -> str:
        shape = self._packed.shape if self._packed is not None else f"{len(self)} ragged items"
        return f"HostBatch({shape}, failed={len(self.failed)})"


@dataclass
class KeyedBatch:
    """A training pipeline's batch (clips, features): ``data`` (N, ...), a CuPy array on the GPU or a
    NumPy array, handed to PyTorch or JAX through DLPack; ``keys`` the files its items came from.
    ``ready``: where the GPU's work on ``data`` may still be running, a CUDA event after it (DLPack
    orders a consumer's stream after it; :meth:`synchronize` waits for it on the host)."""

    data: Any
    keys: list[str]
    ready: Any = field(default=None, kw_only=True)
    failed: list[tuple[str, str]] = field(default_factory=list, kw_only=True)  # (key, why): left out of data

    def synchronize(self) -> None:
        """Wait until ``data`` is computed (on the CPU: at once)."""
        if self.ready is not None:
            self.ready.synchronize()

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def shape(self) -> tuple[int, ...]:
        """``data``'s shape, (N, ...)."""
        return tuple(self.data.shape)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # (on the GPU CuPy refuses the implicit copy to the host, as for its own arrays: ``data.get()``)
        a = np.asarray(self.data)
        return a if dtype is None else a.astype(dtype, copy=False)

    def __dlpack__(self, stream: Any = None, **kw: Any) -> Any:
        if self.ready is not None and stream != -1:  # the consumer's stream waits for the GPU's work on data
            import cupy as cp

            # DLPack's stream numbers: None or 1 the legacy default stream, 2 the per-thread one
            cp.cuda.ExternalStream({None: 0, 1: 0}.get(stream, stream)).wait_event(self.ready)
        return self.data.__dlpack__(stream=stream, **kw) if stream is not None else self.data.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self.data.__dlpack_device__()
#: a Ragged image's format code for the resample kernel, by chroma sampling (0: interleaved RGB)
PLANE_CODE = {(2, 2): 1, (2, 1): 2}


@dataclass
class DeviceBatch:
    """Items packed in one device buffer.

    Attributes:
        buffer: 1-D CuPy array holding every item back to back.
        offsets: int64 (N,) element offset of each item in ``buffer``.
        shapes: per item its shape (e.g. (H, W, 3) or (3, H, W)).
        keys: the keys of the records it holds, in row order (``ImagePipeline``: failed images are not
            among them, and leave no row).
        failed: (key, reason) of the records that failed and are not in it.
        keep: objects that own device memory the batch's kernels read (decoded images).
        stream: the CUDA stream its kernels were enqueued on (None: already finished, or host).
        readers: the streams (handles; 0 the legacy default stream) its items were taken on:
            CuPy's current stream at :meth:`stacked` / :meth:`item`, the consumer's stream of
            ``__dlpack__``. A producer that reuses the buffer makes its writes wait for the work
            enqueued on them by then (``ImagePipeline``'s output ring).
    """

    buffer: Any
    offsets: np.ndarray
    shapes: list[tuple[int, ...]]
    keys: list[str] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)  # owners of input memory the kernels may still read
    failed: list[tuple[str, str]] = field(default_factory=list)
    stream: Any = None
    readers: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """(N, ...) where the items share a shape, as :meth:`stacked` gives them; None for a ragged batch."""
        if not self.shapes or any(s != self.shapes[0] for s in self.shapes):
            return None
        return (len(self), *self.shapes[0])

    @property
    def dtype(self) -> Any:
        """The items' dtype."""
        return self.buffer.dtype

    def _read_on_current_stream(self) -> None:
        import cupy

        self.readers.add(cupy.cuda.get_current_stream().ptr)

    def item(self, i: int) -> Any:
        """Zero-copy view of item ``i`` (read on the current stream)."""
        self._read_on_current_stream()
        return self._item(i)

    def _item(self, i: int) -> Any:
        n = int(np.prod(self.shapes[i]))
        off = int(self.offsets[i])
        return self.buffer[off : off + n].reshape(self.shapes[i])

    def items(self) -> list[Any]:
        """Zero-copy views of every item (read on the current stream)."""
        self._read_on_current_stream()
        return [self._item(i) for i in range(len(self))]

    def stacked(self) -> Any:
        """The batch as one (N, ...) array when every item has the same shape (zero-copy; read on the
        current stream)."""
        self._read_on_current_stream()
        return self._stacked()

    def _stacked(self) -> Any:
        if not self.shapes:
            raise ValueError("empty batch")
        if any(s != self.shapes[0] for s in self.shapes):
            raise ValueError("items differ in shape; use items()")
        return self.buffer[: len(self) * int(np.prod(self.shapes[0]))].reshape(len(self), *self.shapes[0])

    def __dlpack__(self, stream: Any = None, **kw: Any):
        """DLPack export; the consumer's ``stream`` waits for this batch's kernels (and is noted as a
        reader: None and 1 name the legacy default stream, 2 the per-thread one, -1 none)."""
        if stream != -1:
            self.readers.add(0 if stream in (None, 1) else int(stream))
        arr = self._stacked()
        if self.stream is None:
            return arr.__dlpack__(stream=stream, **kw)
        with self.stream:  # CuPy orders the consumer stream after the current (producer) stream
            return arr.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self.buffer.__dlpack_device__()


def pack_tables(*arrays: np.ndarray) -> tuple[np.ndarray, list[tuple[int, np.dtype, tuple]]]:
    """Lay several small host arrays into one byte buffer (16-byte aligned) for a single H2D copy."""
    layout, total = [], 0
    for a in arrays:
        total = (total + 15) // 16 * 16
        layout.append((total, a.dtype, a.shape))
        total += a.nbytes
    buf = np.zeros(max(total, 16), np.uint8)
    for (off, _, _), a in zip(layout, arrays):
        buf[off : off + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    return buf, layout


class PinnedStaging:
    """A ring of pinned host buffers for the small per-launch tables, so uploading them never blocks.

    ``cupy.asarray(numpy_array)`` copies from pageable memory, and such a copy returns only once it is
    done, which is after all the work queued before it on the stream: on the engine's stream that is
    the decoders' work and the previous batch's kernels, so the launching thread used to wait for the
    GPU at every batch. From a pinned buffer the copy is truly asynchronous. A slot is refilled only
    once its last copy has finished (its event; with ``slots`` batches in between that is at once).
    """

    def __init__(self, cp: Any, slots: int = 8):
        self.cp = cp
        self._mem: list[Any] = [None] * slots
        self._host: list[np.ndarray | None] = [None] * slots
        self._done: list[Any] = [None] * slots
        self._dev: list[Any] = [None] * slots
        self._next = 0

    def upload(self, data: np.ndarray, stream: Any) -> Any:
        """A device copy of the bytes of ``data`` (uint8, 1-D), enqueued on ``stream``."""
        cp = self.cp
        i = self._next
        self._next = (i + 1) % len(self._mem)
        if self._done[i] is not None:
            sync_held(self._done[i])
        n = data.nbytes
        host = self._host[i]
        if host is None or host.size < n:
            size = max(64 << 10, 1 << (n - 1).bit_length())
            self._mem[i] = cp.cuda.alloc_pinned_memory(size)
            host = self._host[i] = np.frombuffer(self._mem[i], np.uint8, size)
        host[:n] = data
        with stream:
            dev = cp.empty(n, cp.uint8)
        # (the copy and the slot's event, made once, with the GIL kept: this runs in the thread that launches)
        copy_held(dev.data.ptr, host.ctypes.data, n, stream)
        self._done[i] = record_again(self._done[i], stream, cp)
        self._dev[i] = dev  # alive until the slot is refilled, so raw pointers into it stay valid
        return dev


def upload_tables(arrays: list[np.ndarray], stream: Any, staging: PinnedStaging) -> list[Any]:
    """Copy host tables to the device in one transfer on ``stream``, through ``staging`` (pinned,
    so the host does not wait); returns device views."""
    buf, layout = pack_tables(*arrays)
    dev = staging.upload(buf, stream)
    return [dev[off : off + int(np.prod(shape)) * np.dtype(dt).itemsize].view(dt).reshape(shape)
            for off, dt, shape in layout]


def upload_table_addresses(arrays: list[np.ndarray], stream: Any, staging: PinnedStaging) -> list[np.uint64]:
    """As :func:`upload_tables`, for tables only kernels read: each table's device address, as a
    kernel's pointer argument (valid while ``staging`` keeps the transfer: until it has made as many
    more as it has slots). No CuPy slice, view and reshape per table: less host work per launch, and
    that work holds the GIL the decoders' threads wait for."""
    buf, layout = pack_tables(*arrays)
    base = staging.upload(buf, stream).data.ptr
    return [np.uint64(base + off) for off, _, _ in layout]


@dataclass
class Ragged:
    """A ragged batch of uint8 HWC RGB images in device memory, by pointer.

    Attributes:
        ptr: uint64 (N,) address of each image's pixel (0, 0).
        shape: int32 (N, 3) height, width, row stride in bytes; (N, 4) where some images are in the
            JPEG's planes (DeviceImage.sampling), the fourth column their format (0: interleaved RGB,
            1: 4:2:0 planes, 2: 4:2:2 planes). Only the fused resample reads those (:attr:`planes`).
        keep: objects owning the memory, held until the kernels reading it are done.
    """

    ptr: np.ndarray
    shape: np.ndarray
    keep: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ptr)

    @property
    def hw(self) -> np.ndarray:
        return self.shape[:, :2]

    @property
    def planes(self) -> bool:
        """Whether some images are in planes (only ``GpuEngine.resample`` reads such a batch)."""
        return self.shape.shape[1] == 4

    @staticmethod
    def from_items(cp: Any, items: Sequence[Any]) -> Ragged:
        """From DeviceImages (the decoder's) or uint8 HWC CuPy arrays."""
        n = len(items)
        sampled = [getattr(a, "sampling", None) for a in items]
        planes = any(sampled)
        ptr, shape, keep = np.empty(n, np.uint64), np.zeros((n, 4 if planes else 3), np.int32), []
        for i, a in enumerate(items):
            if isinstance(a, cp.ndarray):
                if a.strides[2] != 1 or a.strides[1] != 3:
                    a = cp.ascontiguousarray(a)
                keep.append(a)
                ptr[i], shape[i, :3] = a.data.ptr, (a.shape[0], a.shape[1], a.strides[0])
            else:
                ptr[i], shape[i, :3] = a.ptr, (a.shape[0], a.shape[1], a.row_stride)
                if sampled[i]:
                    shape[i, 3] = PLANE_CODE[sampled[i]]
        return Ragged(ptr, shape, keep)

    @staticmethod
    def from_batch(batch: Any) -> Ragged:
        """From a uint8 HWC DeviceBatch (zero-copy)."""
        hw = np.array([s[:2] for s in batch.shapes], np.int32).reshape(-1, 2)
        shape = np.concatenate([hw, (hw[:, 1:2] * 3)], 1).astype(np.int32)
        ptr = (np.uint64(batch.buffer.data.ptr) + batch.offsets.astype(np.uint64)).astype(np.uint64)
        return Ragged(ptr, shape, [batch.buffer])

    def take(self, idx: Sequence[int]) -> Ragged:
        idx = np.asarray(idx, np.int64)
        return Ragged(self.ptr[idx], self.shape[idx], self.keep)


def stack(arrays: Sequence[Any], xp: Any) -> Any:
    """``xp.stack(arrays)``; on the GPU, arrays that already lie back to back in one allocation (rows
    of one buffer, items of one upload) come back as a view of it, without a copy."""
    if xp is not np and len(arrays) == 1:
        return arrays[0][None]
    if xp is not np and len(arrays) > 1:
        first = arrays[0]
        shape, dtype, step = first.shape, first.dtype, first.nbytes
        ptr, mem = first.data.ptr, first.data.mem
        if all(a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.data.mem is mem
               and a.data.ptr == ptr + k * step for k, a in enumerate(arrays)):
            return xp.ndarray((len(arrays), *shape), dtype, memptr=first.data)
    return xp.stack(arrays)
