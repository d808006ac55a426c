"""The CPU path of :class:`~.image.ImagePipeline`: a chunk of a batch decoded and run through the chain in a worker
process (:func:`chain_chunk`), its arrays handed back through a shared memory block, or pickled where /dev/shm has no
room for one (:func:`shared_block`), and packed into the batch (:func:`take_chunks`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..engine.plan import Plan


def chain_one(plan: Plan, blob: bytes | str, key: str, epoch: int = 0) -> tuple[Any, str | None]:
    """Decode one image (encoded bytes, or a file path to read) and run the plan's ops on it on the CPU
    (in a worker process)."""
    from ..engine.codecs import image as host
    from ..engine.host_chain import run_chain_host

    try:
        if isinstance(blob, str):  # a file path: the worker reads it
            try:
                with open(blob, "rb") as f:
                    blob = f.read()
            except OSError as e:
                return None, f"cannot read {blob}: {e.strerror or e}"  # as FileFeed words it
        im = host.decode_image(blob, plan.max_pixels)
    except ValueError as e:
        return None, str(e)
    return run_chain_host(plan.ops, im, plan.draw(key, im.height, im.width, epoch=epoch)), None


def cpu_chunk(batch: int, workers: int) -> int:
    """Images per task of the CPU path: a batch split evenly over the worker processes, one task per
    worker per batch. A process pool queues only workers + 1 tasks and refills that queue from a thread
    of the parent; with four tasks per worker per batch the bench's CPU path used 12.1 of 16 cores
    (2,546 / 2,492 images/s, train / val), with one task 13.9 cores (2,853 / 2,899), on two machines of
    the same kind (benchmarks/RESULTS.md as of a1d93e1, 2026-11-22)."""
    return max(1, -(-batch // max(workers, 1)))


def chain_chunk(plan: Plan, blobs: list[Any], keys: list[str],
                     epoch: int = 0) -> tuple[str | None, list[tuple[Any, str | None]]]:
    """:func:`chain_one` over a chunk (in a worker process); the arrays go back through a shared
    memory block the worker makes: (its name or None, per item ((shape, dtype, offset), None) or
    (None, error)). Pickled back instead, each 224x224 fp16 result took the pool's parent 0.5 ms against
    0.08 ms for none (the cpu study (docs/engine.md)): a serial cap near 2,000 images/s whatever the cores.
    Where /dev/shm has no room for the block (a container's 64 MiB; a ResNet-50 batch of 256 fp16 images is 77
    MB), the arrays themselves go back, pickled (None, per item (array, None) or (None, error)): writing past a
    full /dev/shm would kill the worker (SIGBUS), so the block's pages are reserved before anything is written."""
    from multiprocessing.shared_memory import SharedMemory

    outs = [chain_one(plan, b, k, epoch) for b, k in zip(blobs, keys)]
    total = sum(a.nbytes for a, err in outs if err is None)
    if total == 0:
        return None, [(None, err) for _, err in outs]
    shm = shared_block(SharedMemory, total)
    if shm is None:
        return None, outs
    layout: list[tuple[Any, str | None]] = []
    pos = 0
    for a, err in outs:
        if err is not None:
            layout.append((None, err))
            continue
        np.ndarray(a.shape, a.dtype, buffer=shm.buf, offset=pos)[...] = a
        layout.append(((a.shape, a.dtype.str, pos), None))
        pos += a.nbytes
    shm.close()
    return shm.name, layout


def shared_block(make: Any, size: int) -> Any:
    """A new shared memory block of ``size`` bytes (``make``: SharedMemory) whose pages /dev/shm has room for, or
    None where it has not: its pages are reserved first (``posix_fallocate``), so that a full /dev/shm is an error
    here rather than a SIGBUS at the first write past its end."""
    import errno
    import os

    from ..engine.processes import shm_free

    free = shm_free()
    if free is not None and free < size + (1 << 20):
        return None
    try:
        shm = make(create=True, size=size)
    except OSError:
        return None
    reserve, fd = getattr(os, "posix_fallocate", None), getattr(shm, "_fd", -1)
    if reserve is not None and isinstance(fd, int) and fd >= 0:
        try:
            reserve(fd, 0, size)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                shm.close()
                shm.unlink()
                return None
    return shm


def take_chunk(name: str | None, layout: list[tuple[Any, str | None]]) -> list[tuple[Any, str | None]]:
    """The arrays of a :func:`chain_chunk` result, copied out of its shared memory (then freed)."""
    return take_chunks([(name, layout)])[1]


def take_chunks(chunks: list[tuple[str | None, list[tuple[Any, str | None]]]]) -> tuple[np.ndarray | None, list]:
    """The arrays of several :func:`chain_chunk` results, copied out of their shared memory (then
    freed): (one (N, ...) array of them where every one has the same shape and dtype, copied straight into
    it, else None; per item (array or None, error or None))."""
    from multiprocessing.shared_memory import SharedMemory

    def kind(spec: Any) -> tuple[tuple, str]:  # (an array sent back itself where /dev/shm had no room)
        return (spec.shape, spec.dtype.str) if isinstance(spec, np.ndarray) else (tuple(spec[0]), spec[1])

    specs = [kind(spec) for _, layout in chunks for spec, err in layout if err is None]
    same = len(set(specs)) == 1
    packed = np.empty((len(specs), *specs[0][0]), np.dtype(specs[0][1])) if same else None
    out: list[tuple[Any, str | None]] = []
    row = 0
    for name, layout in chunks:
        shm = SharedMemory(name=name) if name is not None else None
        try:
            for spec, err in layout:
                if err is not None:
                    out.append((None, err))
                    continue
                inline = isinstance(spec, np.ndarray)
                src = spec if inline else np.ndarray(spec[0], np.dtype(spec[1]), buffer=shm.buf, offset=spec[2])
                if packed is not None:
                    packed[row] = src
                    out.append((packed[row], None))
                    row += 1
                else:
                    out.append((src if inline else src.copy(), None))
                del src
        finally:
            if shm is not None:
                shm.close()
                shm.unlink()
    return packed, out
