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
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
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
    """

    blobs: list[bytes]
    keys: list[str]
    sizes: list[tuple[int, int] | None]
    params: list[Any] | None
    errors: list[str | None]

    def __len__(self) -> int:
        return len(self.blobs)


def _init(shm_name: str, plan: Plan | None, slot_bytes: int) -> None:
    from multiprocessing import resource_tracker
    from multiprocessing.shared_memory import SharedMemory

    shm = SharedMemory(name=shm_name)
    try:  # the parent owns (and unlinks) the segment; this process only maps it
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:
        pass
    _W.update(shm=shm, plan=plan, slot=slot_bytes)


def _read(slot: int, paths: list[str], keys: list[str]) -> tuple:
    """Read ``paths`` into ``slot``; (offsets, lengths, sizes, params, errors, overflow blobs or None)."""
    from .codecs.image import jpeg_display_size

    buf = _W["shm"].buf
    plan: Plan | None = _W["plan"]
    slot_bytes = _W["slot"]
    base, pos = slot * slot_bytes, 0
    offsets, lengths, sizes, errors, params = [], [], [], [], []
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
        params.append(plan.draw(key, hw[0], hw[1]) if draw and hw is not None else None)
    return offsets, lengths, sizes, params if draw else None, errors, overflow


class FileFeed:
    """Batches of files read, header-parsed and drawn for in ``workers`` processes, in order.

    >>> with FileFeed(paths, keys, batch_size=256, plan=plan) as feed:
    ...     for fed in feed:  # FedBatch
    ...         ...

    ``repeat`` cycles over the files forever (benchmarks). ``depth`` batches are in flight, each in a
    shared-memory slot of ``slot_bytes``.
    """

    def __init__(self, files: Sequence[str | Path], keys: Sequence[str] | None = None, batch_size: int = 256,
                 plan: Plan | None = None, workers: int | None = None, depth: int = 4, repeat: bool = False,
                 slot_bytes: int = SLOT_BYTES):
        import multiprocessing as mp
        from multiprocessing.shared_memory import SharedMemory

        self.files = [str(f) for f in files]
        self.keys = list(keys) if keys is not None else [Path(f).stem for f in self.files]
        if len(self.keys) != len(self.files):
            raise ValueError("FileFeed: one key per file")
        self.batch_size = max(1, int(batch_size))
        self.repeat = repeat
        self.depth = max(1, depth)
        from .executor import default_workers

        workers = workers or max(1, min(4, default_workers() // 4))
        self.slot_bytes = int(slot_bytes)
        self.shm = SharedMemory(create=True, size=self.depth * self.slot_bytes)
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                        initializer=_init, initargs=(self.shm.name, plan, self.slot_bytes))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.shm.close()
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

    def __iter__(self) -> Iterator[FedBatch]:
        spans = self._spans()
        pending: deque[tuple[int, int, int, Future]] = deque()
        free = list(range(self.depth))

        def submit() -> None:
            span = next(spans, None)
            if span is None:
                return
            slot = free.pop()
            a, b = span
            pending.append((slot, a, b, self.pool.submit(_read, slot, self.files[a:b], self.keys[a:b])))

        for _ in range(self.depth):
            submit()
        buf = self.shm.buf
        while pending:
            slot, a, b, fut = pending.popleft()
            offsets, lengths, sizes, params, errors, overflow = fut.result()
            if overflow is not None:
                blobs = overflow
            else:
                base = slot * self.slot_bytes
                blobs = [bytes(buf[base + o : base + o + n]) for o, n in zip(offsets, lengths)]
            free.append(slot)
            submit()
            yield FedBatch(blobs, self.keys[a:b], sizes, params, errors)
