"""The CPU executor of the run flow (:mod:`.run`): its jobs turned into encoded outputs by the
records' host codecs and the chain's host kernels, on a thread pool.

Reading and per-record work run on the pool (file reads, Pillow's decode, resize and encode all
release the GIL) with a bounded window of records in flight, so memory stays flat however large the
dataset; results are written in dataset order by the calling thread. A failing record becomes a
:class:`RecordError` routed to the run's :class:`ErrorRouter`; it never stops the other records unless
the policy says so. Also here: the thread pools' helpers and the default thread counts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import RecordError, RunStats, Stage, reason_of
from ..types import Record
from . import processes
from .host_chain import run_chain_host
from .media import HOST, get_codec
from .plan import Plan
from .processes import default_readers
from .run import Job, outputs_of
from .settings import Settings

T = TypeVar("T")
R = TypeVar("R")


def default_decoder_threads(settings: Settings | None = None) -> int:
    """CPU threads of the CUDA JPEG decoder by default: the cores less the feed's reader processes and
    one for the pipeline's own threads (11 on 16 cores), at most ``settings.decoder_threads_max``
    (more crowded out the rest of the pipeline; docs/engine.md)."""
    st = settings or Settings()
    cores = processes.default_workers()
    return max(1, min(st.decoder_threads_max, cores - default_readers(cores, settings=st) - 1))


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int, window: int | None = None) -> Iterator[R]:
    """``map(fn, items)`` on ``workers`` threads, results in input order, at most ``window`` in flight.

    If the consumer stops early (an exception, a break), queued work is cancelled.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    window = window or workers * 4
    it = iter(items)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpubatch")
    pending: deque[Future] = deque()
    try:
        for item in it:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().result()
            for item in it:
                pending.append(pool.submit(fn, item))
                break
            yield result
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def timed_next(items: Iterator[T], timings: dict[str, float], stage: str) -> T | None:
    """The next of ``items`` (None at their end), the wait for it added to ``timings[stage]``."""
    t0 = time.perf_counter()
    got = next(items, None)
    timings[stage] += time.perf_counter() - t0
    return got


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a background thread, up to ``depth`` ahead of the consumer."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for x in items:
                if stop.is_set():
                    return
                q.put((True, x))
            q.put((True, done))
        except BaseException as e:  # hand the failure to the consumer
            q.put((False, e))

    t = threading.Thread(target=produce, name="gpubatch-prefetch", daemon=True)
    t.start()
    try:
        while True:
            ok, x = q.get()
            if not ok:
                raise x
            if x is done:
                return
            yield x
    finally:
        stop.set()
        while t.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)


def expand_host(record: Record, plan: Plan, stats: RunStats) -> list[Record | RecordError]:
    """Everything one source record becomes on the CPU (one output, or an augment run's variants): its
    jobs (:func:`~.run.outputs_of`) decoded once, run through the chain and encoded by its codec."""
    outs: list[Record | RecordError] = []
    decoded = codec = None
    jobs = outputs_of(record, plan, stats)
    for n, job in enumerate(jobs):
        if not isinstance(job, Job):
            outs.append(job)
            continue
        try:
            if decoded is None:  # once per source record, however many variants it has
                codec = get_codec(record.media, record.codec, HOST)
                decoded = codec.decode(record, plan)
            outs.append(_transform(job, decoded, codec, plan, stats))
        except RecordError as e:
            if e.stage is Stage.DECODE:  # one error for the source record, not one per variant or frame
                left = sum(isinstance(j, Job) for j in jobs[n:])
                outs.append(e if left < 2 else RecordError(e.key, e.origin, e.stage,
                                                           f"{e.reason} ({left:,} of its outputs not written)"))
                break
            outs.append(e)
    if hasattr(decoded, "close"):
        decoded.close()
    return outs


def _transform(job: Job, decoded: Any, codec: Any, plan: Plan, stats: RunStats) -> Record:
    """One job's output: its parameters settled for the decoded size, the chain's host kernels, encoded."""
    t = job.template
    # a media whose outputs take parts of the decoded source (a video's frames) gives each its part
    item = codec.part(decoded, t) if hasattr(codec, "part") else decoded
    try:
        params, boxes, dropped = job.settle(plan, *codec.size(item))
        if hasattr(codec, "run_chain"):  # a media with its own chain runner (audio)
            data = codec.run_chain(plan.ops, item, params)
        elif hasattr(codec, "apply"):  # the chain on each frame of a clip, with the clip's one set of parameters
            data = codec.apply(lambda x: run_chain_host(plan.ops, x, params), item)
        else:
            data = run_chain_host(plan.ops, item, params)
    except RecordError:
        raise
    except Exception as e:  # noqa: BLE001 - the record boundary: any op failure is this record's error
        raise RecordError(t.key, t.origin, Stage.TRANSFORM, reason_of(e)) from None
    out = codec.encode(data, t, plan).with_(boxes=boxes)
    if dropped:
        stats.add(boxes_dropped=dropped)
    if plan.augmenting:
        stats.drawn[t.key] = params
    stats.add(transcoded=1)
    return out
