"""The pipeline: read -> (check | decode -> ops -> encode) -> write.

Reading and per-record work run on a thread pool (file reads, Pillow's decode, resize and encode all
release the GIL) with a bounded window of records in flight, so memory stays flat however large the
dataset; results are written in dataset order by the calling thread. A failing record becomes a
:class:`RecordError` routed to the run's :class:`ErrorRouter`; it never stops the other records unless
the policy says so.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import ErrorRouter, RecordError, RunStats, Stage
from ..formats.base import Reader, Writer
from ..types import Media, Record
from .codecs import headers
from .codecs import image as host_codec
from .host_chain import run_chain_host
from .plan import Plan
from .registry import HOST
from .settings import Settings

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    return max(1, min(32, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def default_readers(cores: int | None = None, route: str | None = None, settings: Settings | None = None) -> int:
    """Reader processes a GPU pipeline's feed starts by default: a quarter of the cores, 1 to 4; half
    of them (up to 4) on the "hardware" decode route, whose decoders leave the cores to the readers
    (``settings.readers_hw``)."""
    cores = cores or default_workers()
    halves = route == "hardware" and (settings or Settings()).readers_hw
    return max(1, min(4, cores // (2 if halves else 4)))


def default_decoder_threads(settings: Settings | None = None) -> int:
    """CPU threads of the CUDA JPEG decoder by default: the cores less the feed's reader processes and
    one for the pipeline's own threads (11 on 16 cores), at most ``settings.decoder_threads_max``
    (more crowded out the rest of the pipeline; docs/engine.md)."""
    st = settings or Settings()
    cores = default_workers()
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


def check_encoded(record: Record, max_pixels: int, full: bool = False) -> str:
    """Validity check of bytes that pass through untouched; returns the codec the bytes hold.

    Reads the header (size, mode) without decoding. A JPEG without its end marker is fully decoded to
    tell trailing bytes from truncation; a PNG has every chunk's CRC checked; other codecs (WebP, TIFF,
    GIF, JPEG 2000, ...) are decoded. ``full`` (``--verify full``) decodes every image.

    Raises:
        RecordError: not an image, truncated, corrupt, or above ``max_pixels``.
    """
    if record.media is not Media.IMAGE:
        return record.codec
    try:
        hdr = headers.probe(record.data)
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
    if max_pixels and hdr.width * hdr.height > max_pixels:
        raise RecordError(
            record.key, record.origin, Stage.DECODE,
            f"image of {hdr.width}x{hdr.height} = {hdr.width * hdr.height} pixels exceeds --max-pixels {max_pixels}",
        )
    if hdr.codec == "png":
        damage = headers.png_damage(record.data)
        if damage:
            raise RecordError(record.key, record.origin, Stage.DECODE, damage)
    tail = record.data[-16:].rstrip(b"\x00\r\n ")
    complete = (hdr.codec == "jpeg" and tail.endswith(b"\xff\xd9")) or hdr.codec == "png"
    if full or not complete:
        try:
            host_codec.decode(record.data, max_pixels)
        except ValueError as e:
            raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
    return hdr.codec


def read_counted(reader: Reader, entry: Any, stats: RunStats) -> Record | RecordError:
    """Read one entry, counting it in ``stats``; a bad entry comes back as its RecordError."""
    try:
        record = reader.read(entry)
    except RecordError as e:
        return e
    stats.add(records_in=1, bytes_in=len(record.data))
    return record


def pass_through(record: Record, plan: Plan, stats: RunStats) -> Record | RecordError:
    """A record whose bytes go out untouched, after :func:`check_encoded`."""
    try:
        codec = check_encoded(record, plan.max_pixels, plan.verify == "full")
    except RecordError as e:
        return e
    stats.add(passthrough=1)
    return record if codec == record.codec else record.with_(codec=codec)  # the bytes decide, not a name


def transform_host(record: Record, plan: Plan, stats: RunStats, pixels: Any = None) -> Record:
    """Decode (unless ``pixels`` are given), run the plan's ops and re-encode one record on the CPU."""
    if pixels is None:
        pixels = decode_host(record, plan)
    h, w = pixels.shape[:2]
    try:
        params, boxes, dropped = plan.draw_and_move(record.key, h, w, record.boxes)
        pixels = run_chain_host(plan.ops, pixels, params)
    except Exception as e:  # record boundary: any op failure is this record's error
        raise RecordError(record.key, record.origin, Stage.TRANSFORM, f"{type(e).__name__}: {e}") from None
    codec = plan.out_codec(record.codec)
    try:
        plan.check_encodable(codec, *pixels.shape[:2])
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.ENCODE, str(e)) from None
    try:
        data = host_codec.encode(pixels, codec, plan.jpeg_quality)
    except Exception as e:  # record boundary
        raise RecordError(record.key, record.origin, Stage.ENCODE, f"{type(e).__name__}: {e}") from None
    if dropped:
        stats.add(boxes_dropped=dropped)
    if plan.augmenting:
        stats.drawn[record.key] = params
    return record.with_(data=data, codec=codec, boxes=boxes)


def decode_host(record: Record, plan: Plan) -> Any:
    try:
        return host_codec.decode(record.data, plan.max_pixels)
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None


def expand_host(record: Record, plan: Plan, stats: RunStats) -> list[Record | RecordError]:
    """Everything one source record becomes on the CPU (one output, or an augment run's variants)."""
    outs: list[Record | RecordError] = []
    pixels = None
    for out, transform in plan.outputs(record):
        if not transform:
            outs.append(pass_through(out, plan, stats))
            continue
        try:
            if pixels is None:
                pixels = decode_host(record, plan)  # once per source record, however many variants
            outs.append(transform_host(out, plan, stats, pixels))
            stats.add(transcoded=1)
        except RecordError as e:
            outs.append(e)
            if e.stage is Stage.DECODE:
                break  # one error for the source record, not one per variant
    return outs


def run_host(
    reader: Reader,
    entries: list[Any],
    writer: Writer,
    plan: Plan,
    router: ErrorRouter,
    workers: int,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Run the whole pipeline on the CPU."""
    stats = router.stats
    plan.validate(HOST)

    def work(entry: Any) -> list[Record | RecordError]:
        record = read_counted(reader, entry, stats)
        if isinstance(record, RecordError):
            return [record]
        return expand_host(record, plan, stats)

    write_results((r for rs in ordered_map(work, entries, workers) for r in rs), writer, router, progress)


def write_results(
    results: Iterable[Record | RecordError],
    writer: Writer,
    router: ErrorRouter,
    progress: Callable[[int], None] | None,
) -> None:
    """Write records in order, route errors to the policy, report progress one record at a time."""
    import time

    stats = router.stats
    it = iter(results)
    wait = write = 0.0
    try:
        while True:
            t0 = time.perf_counter()
            result = next(it, None)
            t1 = time.perf_counter()
            wait += t1 - t0
            if result is None:
                return
            _write_one(result, writer, router, stats)
            if progress:
                progress(1)
            write += time.perf_counter() - t1
    finally:
        stats.timed("write_wait", wait)
        stats.timed("write", write)


def _write_one(result: Record | RecordError, writer: Writer, router: ErrorRouter, stats: RunStats) -> None:
    if isinstance(result, RecordError):
        if result.stage is Stage.READ:
            stats.add(records_in=1)
        router(result)
        return
    try:
        writer.write(result)
    except (ValueError, RecursionError) as e:  # this record does not fit the format; I/O errors end the run
        router(RecordError(result.key, result.origin, Stage.WRITE, str(e) or type(e).__name__))
    else:
        stats.add(records_out=1, bytes_out=len(result.data))
