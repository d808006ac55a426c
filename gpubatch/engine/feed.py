"""Feeding the GPU process from worker processes: file reads, JPEG headers and parameter draws.

nvImageCodec's decode calls take the GIL back once per image while they run, so any Python thread
busy in the same process slows them several-fold (one CPU-bound thread cut a routed decode that
runs at about 16,000 images/s alone to 641 images/s at a 1 ms switch interval;
benchmarks/decode_study.py, group "gil", and benchmarks/RESULTS.md). So the
host work that is Python (reading files, parsing JPEG headers, drawing each record's random
parameters) runs here, in worker processes, and the process that drives the GPU only copies the
encoded bytes out of shared memory, decodes and launches.

Each worker reads a whole batch straight into its slot of a shared-memory ring (``readinto``: one
copy), parses each JPEG's frame header and EXIF orientation to know the decoded size, and draws the
record's parameters from (seed, key, size): exactly what the GPU process would draw, so outputs do
not change. A record whose decoded size differs from its header's is drawn again after decode.
"""

from __future__ import annotations

import os
import queue
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from .plan import Plan

SLOT_BYTES = 64 << 20  # one batch's encoded bytes; a batch that does not fit comes back pickled
_W: dict[str, Any] = {}


@dataclass
class FedBatch:
    """One batch from a :class:`FileFeed`.

    Attributes:
        blobs: the encoded bytes of each file (b"" where it could not be read).
        keys: record keys.
        sizes: per record the (height, width) its header says it decodes to, or None.
        params: per record the drawn op parameters (None without a plan, or where the size is unknown).
        errors: per record None or why it could not be read.
        headers: per record (GPU-decodable JPEG kind or None, width, height), as the GPU decoder routes by.
        windows: the chain's leading window segment folded per record (geometry (N, 4), output sizes
            (N, 2); :func:`~gpubatch.engine.gpu_chain.leading_windows`), or None.
        release: in views mode, returns the batch's slot to the feed (call :meth:`done`).
    """

    blobs: list[bytes]
    keys: list[str]
    sizes: list[tuple[int, int] | None]
    params: list[Any] | None
    errors: list[str | None]
    headers: list[tuple[str | None, int, int]] | None = None
    windows: tuple[Any, Any] | None = None
    release: Any = None

    def done(self) -> None:
        """Hand the batch's shared-memory slot back (views mode; a no-op otherwise). Dropping the
        batch does it too, so a consumer that stops early never leaves the feed waiting for a slot."""
        if self.release is not None:
            self.release()
            self.release = None

    def __del__(self) -> None:
        self.done()

    def __len__(self) -> int:
        return len(self.blobs)


def _init(shm_name: str, plan: Plan | None, slot_bytes: int) -> None:
    from multiprocessing.shared_memory import SharedMemory

    # Spawned workers share the parent's resource tracker, which keeps one entry per name: this
    # mapping adds nothing, and the parent's unlink removes it (unregistering it here as well made the
    # tracker fail on that second removal).
    shm = SharedMemory(name=shm_name)
    _W.update(shm=shm, plan=plan, slot=slot_bytes)


def _read(slot: int, paths: list[str], keys: list[str]) -> tuple:
    """Read ``paths`` into ``slot``; (offsets, lengths, sizes, params, errors, overflow blobs or None,
    headers, windows)."""
    from .codecs.image import jpeg_display_size
    from .codecs.image_gpu import jpeg_kind
    from .gpu_chain import leading_windows

    buf = _W["shm"].buf
    plan: Plan | None = _W["plan"]
    slot_bytes = _W["slot"]
    base, pos = slot * slot_bytes, 0
    offsets, lengths, sizes, errors, params, headers = [], [], [], [], [], []
    overflow: list[bytes] | None = None
    draw = plan is not None and any(op.random for op in plan.ops)
    for path, key in zip(paths, keys):
        data: bytes | memoryview = b""
        err = None
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if overflow is None and pos + size <= slot_bytes:
                    with buf[base + pos : base + pos + size] as view:
                        got = f.readinto(view)
                    data = buf[base + pos : base + pos + got]
                else:
                    if overflow is None:  # the slot is full: this batch goes back pickled
                        overflow = [bytes(buf[base + o : base + o + n]) for o, n in zip(offsets, lengths)]
                    data = f.read()
        except OSError as e:
            err = f"cannot read {path}: {e.strerror or e}"
        head = bytes(data[:65536])
        hw = jpeg_display_size(head) if head else None
        headers.append(jpeg_kind(head) if head else (None, 0, 0))
        offsets.append(pos)
        lengths.append(len(data))
        if overflow is not None:
            overflow.append(bytes(data))
        else:
            pos += len(data)
        if isinstance(data, memoryview):
            data.release()
        sizes.append(hw)
        errors.append(err)
        params.append(plan.draw(key, hw[0], hw[1]) if plan is not None and hw is not None else None)
    windows = leading_windows(plan.ops, params, sizes) if plan is not None else None
    return offsets, lengths, sizes, params if draw else None, errors, overflow, headers, windows


class FileFeed:
    """Batches of files read, header-parsed and drawn for in ``workers`` processes, in order.

    >>> with FileFeed(paths, keys, batch_size=256, plan=plan) as feed:
    ...     for fed in feed:  # FedBatch
    ...         ...

    ``repeat`` cycles over the files forever (benchmarks). ``depth`` batches are in flight, each in a
    shared-memory slot of ``slot_bytes``.

    ``views=True`` hands the bytes over without a copy, as NumPy uint8 views of the slot (nvImageCodec
    decodes from them directly): the consumer calls ``fed.done()`` (or drops the batch) once it no
    longer needs them, and the feed reuses a slot only after that. Copying a 256-image batch out took about 5 ms of the
    consuming thread (benchmarks/pipeline_study.py, "read_wait" of source feed-inline).
    """

    def __init__(self, files: Sequence[str | Path], keys: Sequence[str] | None = None, batch_size: int = 256,
                 plan: Plan | None = None, workers: int | None = None, depth: int = 4, repeat: bool = False,
                 slot_bytes: int = SLOT_BYTES, views: bool = False):
        import multiprocessing as mp
        from multiprocessing.shared_memory import SharedMemory

        self.files = [str(f) for f in files]
        self.keys = list(keys) if keys is not None else [Path(f).stem for f in self.files]
        if len(self.keys) != len(self.files):
            raise ValueError("FileFeed: one key per file")
        self.batch_size = max(1, int(batch_size))
        self.repeat = repeat
        self.views = views
        self._returned: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        self.depth = max(1, depth)
        from .executor import default_workers

        workers = workers or max(1, min(4, default_workers() // 4))
        self.slot_bytes = int(slot_bytes)
        self.shm = SharedMemory(create=True, size=self.depth * self.slot_bytes)
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                        initializer=_init, initargs=(self.shm.name, plan, self.slot_bytes))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.shm.close()
        except BufferError:  # views of a batch are still alive: the mapping goes with the last of them
            self.shm.close = lambda: None  # type: ignore[method-assign]  (its __del__ would retry)
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> FileFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spans(self) -> Iterator[tuple[int, int]]:
        n, b = len(self.files), self.batch_size
        while True:
            for start in range(0, n, b):
                yield start, min(start + b, n)
            if not self.repeat or n == 0:
                return

    def stop(self) -> None:
        """Make a running iteration end at its next step, even one waiting for a slot to come back."""
        self._stopped = True
        self._returned.put(None)

    def __iter__(self) -> Iterator[FedBatch]:
        import numpy as np

        spans = self._spans()
        pending: deque[tuple[int, int, int, Future]] = deque()
        free = list(range(self.depth))
        returned = self._returned = queue.SimpleQueue()  # slots handed back (views mode); None: stop
        self._stopped = False
        nxt = next(spans, None)

        def fill(block: bool) -> None:
            """Start reads into free slots; wait for one only when nothing else can be yielded."""
            nonlocal nxt
            while nxt is not None and not self._stopped:
                while True:
                    try:
                        got = returned.get_nowait()
                    except queue.Empty:
                        break
                    if got is not None:
                        free.append(got)
                if not free:
                    if pending or not block:
                        return
                    got = returned.get()  # every slot is with the consumer: wait for one
                    if got is None:
                        return
                    free.append(got)
                slot = free.pop()
                a, b = nxt
                pending.append((slot, a, b, self.pool.submit(_read, slot, self.files[a:b], self.keys[a:b])))
                nxt = next(spans, None)

        buf = self.shm.buf
        while True:
            fill(block=True)
            if self._stopped or not pending:
                return
            slot, a, b, fut = pending.popleft()
            offsets, lengths, sizes, params, errors, overflow, headers, windows = fut.result()
            release = None
            base = slot * self.slot_bytes
            if overflow is not None:
                blobs = overflow
                free.append(slot)
            elif self.views:
                blobs = [np.frombuffer(buf, np.uint8, n, base + o) if n else b"" for o, n in zip(offsets, lengths)]
                release = partial(returned.put, slot)
            else:
                blobs = [bytes(buf[base + o : base + o + n]) for o, n in zip(offsets, lengths)]
                free.append(slot)
            yield FedBatch(blobs, self.keys[a:b], sizes, params, errors, headers, windows, release)
