"""A GPU worker's helper processes, started at the worker's boot, before its run comes: its feed's readers (an image
run's) or its audio decoders (an audio run's).

A ``convert``/``augment`` GPU worker reads its records in reader processes of its own (:class:`.feed.RecordFeed`).
Started when the feed is made, their start (a Python each, gpubatch's reading code imported, a process pool's
machinery) lay on the way to the first batch: on an H200 host of 16 cores (2026-12-04, benchmarks/RESULTS.md) the
feed's eight readers took 0.72-0.75 s to start, and the first batch was read 0.18 s after, while the GPU's own start
was done 0.45 s before. The worker's boot (:func:`..execute.boot.boot`, through :func:`.start.boot`) now starts them
first thing, forked while it has one thread and no CUDA context, with what they will read unknown: each imports the
reading code (:func:`_preload`) and waits. The feed takes them
(:func:`taken`) where it wants as many, and gives each its ring, its plan and its source (``feed._init`` as each
reader's first task: the barrier they share lets none take a second); else it starts its own and these end
(:func:`close`). The GPU audio unit's decoding processes (:class:`.audio_records.RecordDecoders`) are started the
same way, ``kind`` "audio": each imports the decoding code, and takes its reader and plan as its first task
(``audio_records._prestarted_start``). Light on purpose: the boot imports it before anything else of gpubatch.
"""

from __future__ import annotations

from typing import Any

_PRESTARTED: list[tuple[str, Any, Any, int]] = []  # (their kind, the pool, the barrier its processes share, how many)

#: what a prestarted process of each kind runs: the module whose ``preload()`` imports it and whose ``_W`` keeps the
#: barrier for its first task, and that first task's function there (called with the caller's ``init`` and the barrier)
KINDS = {"feed": ("gpubatch.engine.gpu.feed", "_init"),
         "audio": ("gpubatch.engine.gpu.audio_records", "_prestarted_start")}


def _preload(attached: Any, parent: int, kind: str = "feed") -> None:
    """A prestarted process's start: what it will run imported, the barrier kept for its first task, and its death
    tied to its worker's (``parent``: a worker killed with ``kill -9`` leaves no reader behind it, also one killed
    before this reader got here)."""
    import importlib
    import os

    from ..processes import die_with_parent

    module = importlib.import_module(KINDS[kind][0])
    module.preload()
    module._W["attached"] = attached
    die_with_parent()
    if os.getppid() != parent:  # (its worker died before it asked to die with it)
        os._exit(0)


def prestart(readers: int, kind: str = "feed") -> None:
    """``readers`` processes of ``kind`` (:data:`KINDS`) started now, each importing the code it will run (the feed's
    reading code, the audio unit's decoding code); :func:`taken` hands them to the feed (the audio unit). Forked:
    call it while this process has one thread and no CUDA context (the worker's boot, before its
    GPU's start: :func:`.start.boot`); the pool's queues and barrier are then unlinked at once, as ``fork``'s are, so
    that a worker ended without waiting for it leaves nothing to the resource tracker. Never raises: the feed starts
    its own readers."""
    try:
        import multiprocessing as mp
        import os
        import time
        from concurrent.futures import ProcessPoolExecutor

        if "fork" not in mp.get_all_start_methods():
            return
        fork = mp.get_context("fork")
        attached = fork.Barrier(readers)
        pool = ProcessPoolExecutor(readers, mp_context=fork, initializer=_preload,
                                   initargs=(attached, os.getpid(), kind))
        pool.submit(time.sleep, 0.0)  # (a fork pool starts all its processes at the first task)
        _PRESTARTED.append((kind, pool, attached, readers))
    except Exception:  # noqa: BLE001 - nothing prestarted: the feed starts its readers itself
        return


def taken(readers: int, init: tuple, kind: str = "feed", more: bool = False) -> tuple[Any, Any] | None:
    """(the pool, the barrier its processes share) of the processes of ``kind`` :func:`prestart` started, the caller's
    now, each given its first task, ``feed._init(*init)`` (``audio_records._prestarted_start(*init)``; the barrier
    lets none take a second), and waited for; None where it started none of that kind, or not ``readers`` (or, with
    ``more``, fewer: a caller whose extra processes only wait), in which case those it started end, or where they
    failed (the caller starts its own)."""
    found = next((k for k, p in enumerate(_PRESTARTED) if p[0] == kind), None)
    if found is None:
        return None
    _, pool, attached, count = _PRESTARTED.pop(found)
    if count < readers or (count > readers and not more):
        _end(pool)
        return None
    try:
        for f in [pool.submit(_first_task, kind, *init) for _ in range(count)]:
            f.result()
    except Exception:  # noqa: BLE001 - (a reader that died at its start: a pool of the feed's own)
        _end(pool)
        return None
    return pool, attached


def _first_task(kind: str, *init: Any) -> None:
    """A prestarted process's first task, with the barrier its start kept: its kind's function (:data:`KINDS`),
    ``feed._init(*init, barrier)`` for a reader, ``audio_records._prestarted_start(*init, barrier)`` for a decoder."""
    import importlib

    name, first = KINDS[kind]
    module = importlib.import_module(name)
    getattr(module, first)(*init, module._W.pop("attached", None))


def _end(pool: Any) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


def close(now: bool = False) -> None:
    """The readers :func:`prestart` started and no feed took, ended; ``now``: terminated at once (they hold nothing),
    not left to end once started (a worker that ends then need not wait for their imports)."""
    while _PRESTARTED:
        pool = _PRESTARTED.pop()[1]
        if now:
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        _end(pool)
