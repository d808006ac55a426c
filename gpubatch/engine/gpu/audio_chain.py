"""The audio chain on the GPU, a batch at a time: its device kernels run op by op over a batch
(:func:`run_chain_device`), the outputs back on the host in one copy (:func:`download`, into a page-locked slot of
:class:`PinnedDownloads` where one is free), and a warm-up on silence (:func:`warm_chain`). Below the audio unit
(:mod:`.audio`) and the worker's start (:mod:`.start`), which both use it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codecs.audio_io import AudioData
from ..media import DEVICE
from ..plan import Plan
from ..registry import get_kernel


def to_host(items: Sequence[AudioData], half_features: bool = False) -> list[AudioData]:
    """Device items back on the host through one device-to-host copy for the batch (views per item) into an
    array of its own (:func:`download` without slots)."""
    return download(items, half_features)[0]


def download(items: Sequence[AudioData], half_features: bool = False,
             downloads: PinnedDownloads | None = None) -> tuple[list[AudioData], Download | None]:
    """Device items back on the host, one device-to-host copy a dtype for the batch (views per item), and the slot
    of ``downloads`` they came into (None where they came into an array of their own: no ``downloads``, or none of
    its slots free). With ``half_features``, features come back as float16, made so on the GPU: what their ``.npy``
    files hold (:func:`~..codecs.audio_io.encode_audio`), half the bytes to copy and no conversion on the host
    (numpy's rounding of float32 to float16 is CUDA's, to the nearest even). Views of a slot are valid until it is
    released (:meth:`Download.release`)."""
    import cupy as cp

    if not items:
        return [], None
    groups = []  # (the items of one dtype, their samples flat in one device array, where each one's begin)
    for dtype in (cp.float32, cp.float16):
        mine = [i for i, it in enumerate(items) if (dtype is cp.float16) == (half_features and bool(it.features))]
        if mine:
            flat = [cp.ascontiguousarray(items[i].samples, dtype).ravel() for i in mine]
            groups.append((mine, cp.concatenate(flat) if len(flat) > 1 else flat[0],
                           np.cumsum([0] + [int(f.size) for f in flat])))
    slot = downloads.take(sum(_aligned(dev.nbytes) for _, dev, _ in groups)) if downloads is not None else None
    out: list[Any] = [None] * len(items)
    at = 0  # (bytes of the slot taken)
    try:
        for mine, dev, sizes in groups:
            if slot is not None:
                host = slot.array(at, dev.dtype, dev.size)
                dev.get(out=host)
                at += _aligned(dev.nbytes)
            else:
                host = cp.asnumpy(dev)
            for k, i in enumerate(mine):
                out[i] = items[i]._replace(samples=host[sizes[k]: sizes[k + 1]].reshape(items[i].samples.shape))
    except BaseException:
        if slot is not None:
            slot.give_back()
        raise
    return out, slot


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


class Download:
    """A slot of :class:`PinnedDownloads`: page-locked host memory a batch's outputs come back into
    (:func:`download`), given back by :meth:`release` once, when every output of its batch is encoded."""

    def __init__(self, owner: PinnedDownloads, index: int, mem: Any, nbytes: int):
        self.owner, self.index, self.mem, self.nbytes = owner, index, mem, nbytes
        self.holders = 0
        self._lock = threading.Lock()

    def array(self, offset: int, dtype: Any, size: int) -> np.ndarray:
        return np.frombuffer(self.mem, dtype, size, offset)

    def hold(self, n: int = 1) -> None:
        """``n`` more hand-overs hold views of the slot: it is free once each has called :meth:`release`."""
        with self._lock:
            self.holders += n

    def give_back(self) -> None:
        """Free the slot at once (a batch that never came into it, or failed on its way)."""
        with self._lock:
            self.holders = 0
        self.owner.free.put(self.index)

    def release(self) -> None:
        with self._lock:
            self.holders -= 1
            free = self.holders == 0
        if free:
            self.owner.free.put(self.index)


class PinnedDownloads:
    """Page-locked slots the GPU audio unit's batches come back into (:func:`download`), ``slots`` of them, each
    free again once its batch's outputs are encoded by the shards' writer (:meth:`Download.release`). A batch
    copied back into pageable memory of its own paid for the driver's staging copy and, each time, the page
    faults of a fresh array of 60-120 MB (a Whisper feature is 480 KB); the unit's ``chain`` step, mostly that
    copy, took 38 ms a batch of 128 clips on an H200 host (2026-12-05, 8,192 clips). Where no slot is free (the
    writer behind), or a batch outgrows one, the batch comes back as before: the loop never waits for a slot."""

    def __init__(self, device: int, slots: int = 3):
        import queue

        self.device = device
        self.slots: list[Download | None] = [None] * slots
        self.free: queue.Queue = queue.Queue()
        for i in range(slots):
            self.free.put(i)

    def take(self, nbytes: int) -> Download | None:
        """A free slot of ``nbytes`` at least (made, or made larger, in 16 MiB steps), None where none is free."""
        import queue

        import cupy as cp

        try:
            i = self.free.get_nowait()
        except queue.Empty:
            return None
        slot = self.slots[i]
        if slot is None or slot.nbytes < nbytes:
            self.slots[i] = None
            size = max(1, -(-nbytes // (16 << 20))) * (16 << 20)
            with cp.cuda.Device(self.device):
                slot = self.slots[i] = Download(self, i, cp.cuda.alloc_pinned_memory(size), size)
        return slot


def run_chain_device(ops: Sequence[Any], items: list[AudioData], params: list[list]) -> list[AudioData]:
    """``ops`` on a batch of device items, ``params[i][k]`` the drawn parameters of item i for op k."""
    for k, op in enumerate(ops):
        items = get_kernel(op.name, DEVICE)(op, items, [p[k] for p in params])
    return items


def warm_chain(plan: Plan, rate: int, samples: int, channels: int, n: int) -> None:
    """``plan``'s chain run once on the GPU on ``n`` records of silence (``samples`` x ``channels`` at ``rate``), its
    outputs back on the host and dropped (its draws keyed on no record): what a first batch of that shape would load
    and make first is then ready (the FFT and BLAS libraries, their plans and handles in this thread, the kernels).
    Never raises: a warm-up only, the real batch runs (or falls back to the CPU) as before."""
    try:
        import cupy as cp

        silence = [AudioData(cp.zeros((channels, samples), cp.float32), rate) for _ in range(n)]
        to_host(run_chain_device(plan.ops, silence, [plan.draw("", rate, rate)] * n), half_features=True)
    except Exception:  # noqa: BLE001 - (see above)
        return
