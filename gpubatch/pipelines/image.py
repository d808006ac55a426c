"""The public in-memory pipeline: encoded images in, one packed batch of processed images out.

:class:`ImagePipeline` decodes on the GPU (nvImageCodec) and runs the op chain's fused kernels, batch
N+1 decoding while batch N's kernels run, the result DLPack-exchangeable with PyTorch and JAX; on the
CPU its worker processes decode and run the chain's host kernels (:mod:`.host_chain`), the same draws
per (seed, key, epoch).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.batch import DeviceBatch, HostBatch
from ..engine.device import Device
from ..engine.gpu.context import held_event, query_held, record_again, record_held, sync_held, wait_held
from ..engine.gpu.engine import GpuEngine, decode_ahead
from ..engine.ops.base import Op, Window
from ..engine.ops.normalize import Normalize
from ..engine.plan import Plan
from ..engine.registry import DEVICE
from ..engine.settings import Settings
from ..engine.windows import fed_windows
from ..errors import UsageError
from .image_cpu import chain_chunk, cpu_chunk, take_chunk, take_chunks


def chain_windows(ops: Sequence[Op], params: Sequence[Any], h: int, w: int) -> tuple[Window, Normalize | None]:
    """Fold a chain of window ops (and a trailing normalize) into one window on an (h, w) image."""
    from ..engine.windows import fold_windows

    norm = ops[-1] if ops and isinstance(ops[-1], Normalize) else None
    body = list(ops[:-1] if norm is not None else ops)
    if any(op.kind != "window" for op in body):
        raise UsageError("chain_windows: only window ops (crop, resize, flip, pad) fold into one resample")
    return fold_windows(body, range(len(body)), params, h, w), norm


class ImagePipeline:
    """Encoded images in, one packed batch of processed images out: the public in-memory API.

    >>> from gpubatch import ImagePipeline
    >>> from gpubatch.engine.ops import RandomResizedCrop, Flip, Normalize
    >>> pipe = ImagePipeline([RandomResizedCrop(224), Flip(), Normalize()], seed=0)
    >>> batch = pipe(list_of_jpeg_bytes)            # DeviceBatch; batch.stacked() -> (N, 3, 224, 224) fp16
    >>> tensor = torch.from_dlpack(batch)            # zero-copy

    On the GPU the decoders are warmed up when the pipeline is made (``warm_up``: a batch of that
    many tiny JPEGs through each; 0 skips it), so the first batch does not pay their first calls and
    the kinds the hardware engine takes are settled before any real batch is routed. On an H100 the
    warm-up added 0.2-0.4 s to making the pipeline (2.63-2.75 s against 2.36-2.43) and took the first
    batch of 256 from 0.18-0.22 s to 0.05-0.06 s (``the startup study (docs/engine.md) --warm
    pipe0,pipe256``; benchmarks/RESULTS.md as of a1d93e1, 2026-11-23).

    ``decoder_options`` are extra nvImageCodec decoder options (space-separated, as nvImageCodec
    takes them), for tuning studies.

    ``decode_route`` is how each batch is split between the GPU's two JPEG decoders (by default
    ``GPUBATCH_DECODE_ROUTE``, else "auto"): "split" gives the CUDA decoder about 30% of it (the
    fastest where the host has cores to spare: that decoder costs about 1 ms of CPU an image),
    "hardware" gives the hardware JPEG engine all it decodes (the process then used 3.1-3.7 cores in
    ``gpubatch bench`` on an H200, against 9.3-9.8 split: the faster route where other work takes the
    cores, or the process has few); "auto" takes "split"
    where at least ``settings.split_min_cores`` of the cores the process may use were free over
    0.2 s when the pipeline was made. :attr:`engine`'s ``decode_route`` and ``route_cores`` say what
    was chosen, and on how many free cores. With "auto" the same rule then follows the load as the
    run goes (``follow_load``, the default): every second the cores other processes kept busy are
    measured, and after two checks in a row that want the other route it is taken (work started after
    the pipeline, such as another run or a training job's loaders, slowed the split route by half;
    :mod:`~gpubatch.engine.gpu.follow`). ``decoder.follower.switches`` lists the changes and
    ``decoder.route_batches`` the batches decoded on each route. The two decoders' pixels differ
    slightly, so pass the route explicitly where the same input must give the same bytes however
    loaded the host is.

    On the GPU a chain of window ops (crops, resizes, flips) to a fixed output size, with or without a
    trailing ``normalize`` (the training and validation chains), is resampled part by part: each
    decoder's part of a batch as soon as it is decoded, on a stream per decoder, into its rows of the
    batch's output (other chains run once the whole batch is decoded). Each decoder call (one per
    chroma-subsampling kind on the hardware engine, one for the CUDA decoder's part: ``decode_chunk``
    images at most, ``settings.decode_chunk`` = 256 by default) decodes into a buffer that the same
    call of the next batch reuses once the kernels reading it have run, so the decoded images take
    about one batch of device memory instead of two (``decode_chunk=0``: a buffer from the driver's
    pool per part, alive until the part is read, while the next batch decodes into another). Smaller
    chunks (``decode_chunk=96``) split the calls and keep the hardware engine's 4:2:0 and 4:2:2 images
    in the JPEG's planes (1.5 and 2 bytes a pixel instead of 3; the resample makes RGB of them as
    libjpeg does, ``settings.hw_planes``), for less memory at less speed. Process batches in the
    order they were decoded.

    ``sync`` is how host threads wait for the GPU (``auto``, the driver's default, unless
    ``GPUBATCH_SYNC`` says otherwise; ``spin``, ``yield``, ``blocking``); it is set only when the
    pipeline makes the process's CUDA context, so a program that used the GPU first keeps its own.

    ``region_decode=True`` (by default ``GPUBATCH_REGION_DECODE``, else off) makes :meth:`iterate_files`
    decode only the part of each upright image the chain's leading crop reads, widened by the resampling
    filter's reach so the output matches a full decode: the hardware engine's part through nvJPEG's region
    calls, the CUDA decoder's through nvImageCodec's sub-code streams. It takes less device memory (on an H200 at batch 256 the bench's
    training chain 642-644 MiB against 738, the validation chain 674) and measured slower than full
    decode and a GPU crop (3-13% in the medians of four calls with whole parts, 2026-11-22;
    2-11% in 5 of 6 pairs with the reused buffers and 40% in one, 2026-11-22), so it is off
    by default (the memory study (docs/engine.md), ``region``; benchmarks/RESULTS.md). The training
    loader turns it on (``gpubatch.training.LOADER_REGIONS``).

    On the GPU the batches of :meth:`iterate` and :meth:`iterate_files` live in a ring of ``ring``
    output buffers: a batch stays valid until ``ring - 1`` more batches have been produced (with one
    buffer, until the next is asked for); a one-batch call (``pipe(blobs)``) gets a buffer of its own.
    GPU work that reads a batch on the stream it was taken on (CuPy's current stream at ``stacked()``
    / ``item()``, the consumer's stream of DLPack, as ``torch.from_dlpack(batch)`` gives it), enqueued
    before the batch that reuses its buffer is asked for, runs before that buffer is written again.
    Batches from :meth:`iterate` are not waited for: their kernels are ordered on :attr:`stream`
    (synchronize it, or make your stream wait on it, before reading). Failed images are reported in
    ``last_errors``.
    """

    def __init__(self, ops: Sequence[Op], device: Device | str = "auto", seed: int = 0,
                 gpu: int = 0, cpu_threads: int | None = None, gpu_memory: str | int | float | None = None,
                 max_pixels: int = 0, ring: int = 1, region_decode: bool | None = None, warm_up: int = 256,
                 decoder_options: str = "", decode_chunk: int | None = None, sync: str | None = None,
                 decode_route: str | None = None, follow_load: bool = True, settings: Settings | None = None):
        from ..engine.device import resolve
        from ..engine.processes import default_workers

        # the engine's knobs: ``settings`` (by default from the environment), those given here over them
        self.settings = st = (settings or Settings.from_env()).with_(decode_route=decode_route, sync=sync,
                                                                     decode_chunk=decode_chunk)
        self.plan = Plan(ops=tuple(ops), seed=seed, max_pixels=max_pixels)
        self.region_decode = bool(st.region_decode if region_decode is None else region_decode)
        self.device = device if isinstance(device, Device) else resolve(device, gpu)
        self.plan.validate(DEVICE if self.device.is_gpu else "host")
        self.cpu_threads = cpu_threads or default_workers()
        self.engine = (GpuEngine(self.device, self.cpu_threads, gpu_memory, decoder_options=decoder_options,
                                 follow=follow_load, settings=st) if self.device.is_gpu else None)
        if self.engine is not None and (warm_up or gpu_memory is not None):
            from ..engine.gpu.chain import kernels_needed

            # under a cap a small warm-up: its buffers come before the cap is planned
            self.engine.warm_up(16 if gpu_memory is not None else warm_up, regions=self.region_decode,
                                kernels=kernels_needed(self.plan.ops))
        from ..engine.windows import fixed_window_chain

        # a chain of one resample to a fixed size may run on each decoded chunk as it comes (see process)
        self._fixed = fixed_window_chain(self.plan) if self.engine is not None else None
        from ..engine.codecs.decode_buffers import want_planes

        self.chunk = max(0, st.decode_chunk) if self._fixed else 0
        self.memory_plan = None
        # the hardware engine's 4:2:0 and 4:2:2 images in their planes (only the resample reads them)
        self._planes = self._fixed is not None and want_planes(self.chunk, st)
        self._ring: list[Any] = [None] * ring
        self._slot = 0
        self._side: dict[bool, Any] | None = None  # see _side_streams
        self._ring_done: list[Any] = [None] * ring  # per output buffer, the end of its last chunked batch
        self._ring_readers: list[set[int] | None] = [None] * ring  # per output buffer, its last batch's readers
        self.last_errors: list[tuple[int, str]] = []
        self.stats = {"images": 0, "gpu": 0, "hw": 0, "fallbacks": 0}
        self._workers: Any = None
        # seconds spent per stage by iterate(): waiting for reads, decoding, waiting for decode, ops;
        # on the CPU, waiting for the worker processes (they read, decode and run the ops)
        self.timings = {"read_wait": 0.0, "decode": 0.0, "decode_wait": 0.0, "ops": 0.0, "workers": 0.0, "pin": 0.0}
        if self.engine is not None and self.engine.cap is not None:
            self.fit_memory(256, 1)

    def fit_memory(self, batch_size: int, prefetch: int) -> Any:
        """Under ``gpu_memory``: the plan (:class:`~.gpu_memory.MemoryPlan`) for batches of
        ``batch_size`` decoded ``prefetch`` ahead (its ``ahead`` may be less), for images of up to
        640x640 (or ``max_pixels``), applied to the engine's pools. The batch's outputs are the caller's
        size; the decodes take what the cap leaves.

        A chain that decodes in chunks (one resample to a fixed size) decodes in calls of the plan's
        ``batch`` images, each decoder's calls taking ``held(1)`` ring slots in turn and waiting for
        their slot rather than taking memory of their own: the decodes then hold at most those slots
        (with their slack) whatever the batch, and its outputs are the output ring. Another chain
        decodes whole batches, so it refuses a batch larger than fits, naming the largest."""
        from ..engine.gpu.memory import (
            DEFAULT_IMAGE,
            MARGIN,
            CapTooSmall,
            ImageNeed,
            held,
            image_need,
            plan_memory,
        )
        from ..errors import UsageError

        h, w = DEFAULT_IMAGE
        if self.plan.max_pixels and h * w > self.plan.max_pixels:
            h = w = max(1, int(self.plan.max_pixels ** 0.5))
        try:
            oh, ow = self.plan.out_hw(h, w, self.plan.draw("", h, w))
        except Exception:  # noqa: BLE001 - an op that refuses the size: the image's own size bounds it
            oh, ow = h, w
        need = image_need(h, w, oh, ow)
        cap = self.engine.cap
        fixed, parts = self.engine.fixed_memory()
        spec = f"{cap >> 20}MiB"
        try:
            if self._fixed:
                _, norm, (foh, fow) = self._fixed
                st = self.engine.decoder.settings
                slots = held(1)  # per decoder (hardware engine, CUDA decoder): the ring its calls take in turn
                size = np.dtype(norm.dtype if norm is not None else "uint8").itemsize
                outputs = len(self._ring) * batch_size * 3 * foh * fow * size + 2 * slots * st.slab_round
                ring = ImageNeed(int(need.decoded * 2 * (1 + 1 / st.ring_slack)), 0, need.size)
                plan = plan_memory(cap, fixed, parts, ring, batch_size, 1, spec=spec, least_batch=1, outputs=outputs)
                # a call decodes at most the plan's count of images and the bytes the plan holds for them
                # (images of DEFAULT_IMAGE's size): larger images make calls of fewer. (Calls of more
                # small images, by bytes alone, ran 8-15% faster but took 788 MiB under 768: the decoders'
                # own state grows with a call's images, which the plan does not count; RESULTS.md.)
                call = plan.batch * need.decoded
                self.chunk = plan.batch
                plan = dataclasses.replace(plan, call_bytes=call)
                self.engine.decoder.settings = st.with_(decode_chunk=self.chunk, hw_chunk=self.chunk, hw_ring=slots,
                                                        cuda_ring=slots, ring_wait=3600.0, size_by_most=False,
                                                        call_bytes=call)
                from ..engine.codecs.decode_buffers import want_planes

                self._planes = want_planes(self.chunk, self.engine.decoder.settings)
            else:
                plan = plan_memory(cap, fixed, parts, ImageNeed(need.decoded, 0, need.size), batch_size,
                                   max(1, prefetch), spec=spec, least_batch=batch_size,
                                   outputs=batch_size * need.work)
        except CapTooSmall as e:
            raise UsageError(f"ImagePipeline: {e}") from None
        if not self._fixed and plan.batch < batch_size:
            most = (cap - fixed - MARGIN) // (need.work + held(plan.ahead) * need.decoded)
            raise UsageError(f"ImagePipeline: batches of {batch_size} do not fit gpu_memory={cap >> 20}MiB for "
                             f"images of {w}x{h}: at most {most}")
        self.engine.apply(plan)
        self.memory_plan = plan
        return plan

    def _pool(self):
        """The CPU path's worker processes (threads would serialize on the GIL between Pillow calls)."""
        if self._workers is None:
            import multiprocessing as mp

            if mp.current_process().daemon:  # (a DataLoader's worker: daemonic processes may start none)
                from concurrent.futures import ThreadPoolExecutor

                self._workers = ThreadPoolExecutor(self.cpu_threads, thread_name_prefix="gpubatch-cpu-chain")
            else:
                from ..engine.processes import started_pool

                self._workers = started_pool(self.cpu_threads, "forkserver")
        return self._workers

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self._workers is not None:
            self._workers.shutdown(wait=True)

    def __enter__(self) -> ImagePipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stream(self) -> Any:
        """The CUDA stream results of :meth:`iterate` are ordered on (None on the CPU)."""
        return self.engine.stream if self.engine is not None else None

    def __call__(self, blobs: Sequence[bytes], keys: Sequence[str] | None = None, epoch: int = 0):
        """One batch, finished: on the GPU the stream is synchronized before the batch is returned. Its
        device buffer is its own (not the output ring's), so it stays valid as long as it is held. Random
        ops draw per (seed, key, ``epoch``), as :meth:`iterate_files` draws for its passes."""
        out = self.process(self.decode(blobs), keys or [str(i) for i in range(len(blobs))], own=True, epoch=epoch)
        if self.engine is not None:
            self.engine.stream.synchronize()
        return out

    def decode(self, blobs: Sequence[bytes], headers: Sequence[tuple[str | None, int, int]] | None = None,
               regions: Sequence[tuple[int, int, int, int] | None] | None = None) -> Any:
        """Stage 1 (may run in another thread): hand a batch to the decoders (``headers``: the blobs' JPEG
        kinds and sizes when already parsed, ``regions``: the parts to decode, as a FileFeed gives
        them). On the GPU the result may still be decoding: :meth:`process` completes it."""
        if self.engine is None:
            return list(blobs)  # the CPU path decodes inside its worker processes, with the ops
        blobs = blobs if hasattr(blobs, "addresses") else list(blobs)  # (a feed's slot goes as it is: SlotViews)
        return self.engine.decoder.decode(blobs, self.engine.stream, self.plan.max_pixels, order=False,
                                          headers=list(headers) if headers is not None else None,
                                          regions=list(regions) if regions is not None else None, wait=False,
                                          chunk=self.chunk, planes=self._planes)

    def process(self, decoded: Any, keys: Sequence[str], params: Sequence[Any] | None = None,
                sizes: Sequence[tuple[int, int] | None] | None = None,
                windows: tuple[np.ndarray, np.ndarray] | None = None, own: bool = False, epoch: int = 0):
        """Stage 2: the op chain on a decoded batch: a DeviceBatch on the GPU, a HostBatch on the CPU; either
        holds the keys of its rows (``keys``) and what failed (``failed``), a failed image leaving no row.

        Random ops draw per (seed, key, ``epoch``): pass a new epoch for each pass of a training loop
        to get new crops and flips, each epoch as reproducible as the first.

        ``params`` (with the ``sizes`` they were drawn for, and the leading ``windows`` folded from
        them, as a :class:`~gpubatch.engine.gpu.feed.FileFeed` gives them) are used where the decoded size
        matches; other records are drawn (and folded) here. On the GPU the batch is written into the
        next buffer of the output ring, or with ``own`` into a buffer of its own.
        """
        self.last_errors = []
        if self.engine is None:
            n, pool = len(decoded), self._pool()
            step = cpu_chunk(n, self.cpu_threads)
            return self._cpu_batch([pool.submit(chain_chunk, self.plan, [bytes(b) for b in decoded[a : a + step]],
                                                list(keys[a : a + step]), epoch) for a in range(0, n, step)], keys)
        from ..engine.batch import Ragged
        from ..engine.gpu.chain import run_chain

        res = decoded
        if self._fixed is not None:
            return self._process_chunks(res, keys, params, sizes, windows, own, epoch)
        res.order(self.engine.stream)  # this batch's kernels wait for its decode, and no later one's
        self.timings["decode_wait"] += res.waited
        arrays, rows = [], []
        for i, a in enumerate(res.arrays):
            if a is None:
                self.last_errors.append((i, res.errors[i] or "decode failed"))
                continue
            rows.append(i)
            arrays.append(a)
        drawn, redrawn = self._draws(rows, arrays, keys, params, sizes, epoch=epoch)
        first = fed_windows(self.plan.ops, windows, rows, redrawn, drawn, arrays)
        slot = self._next_slot(own)
        if slot is not None:
            self._after_readers(slot, [self.engine.stream])
        batch = run_chain(self.engine, self.plan.ops, Ragged.from_items(self.engine.cp, arrays), drawn,
                          out=self._ring[slot] if slot is not None else None, first=first)
        batch.keys = [keys[i] for i in rows]
        batch.failed = [(keys[i], err) for i, err in self.last_errors]
        if slot is not None:
            self._ring[slot], self._ring_readers[slot] = batch.buffer, batch.readers
        self.stats["images"] += len(arrays)
        self.stats["gpu"] += res.on_gpu
        self.stats["hw"] += res.hw
        self.stats["fallbacks"] += res.fallbacks
        return batch

    def _draws(self, rows: list[int], arrays: list[Any], keys: Sequence[str], params: Sequence[Any] | None,
               sizes: Sequence[tuple[int, int] | None] | None, windows_only: bool = False,
               epoch: int = 0) -> tuple[list[Any], list[int]]:
        """Parameters of the records ``rows`` (decoded as ``arrays``): those the feed drew where it drew for
        the decoded size, else drawn here; and the positions (in ``rows``) of the ones drawn here. With
        ``windows_only`` (the feed folded each record's windows, and nothing but those windows is read)
        a record decoded at the feed's size needs no parameters: None stands for them. For a chain with
        no random op the feed sends no parameters, and drawing every record's again here took 1.6 s
        of a 4 s profiled window of the validation chain, the GIL held (cProfile, H200)."""
        drawn, redrawn = [], []
        for k, (i, a) in enumerate(zip(rows, arrays)):
            h, w = a.shape[0], a.shape[1]
            fed = sizes is not None and sizes[i] == (h, w)
            if fed and params is not None and params[i] is not None:
                drawn.append(params[i])
            elif fed and windows_only:
                drawn.append(None)
            else:
                drawn.append(self.plan.draw(keys[i], h, w, epoch=epoch))
            if not fed:
                redrawn.append(k)
        return drawn, redrawn

    def _next_slot(self, own: bool) -> int | None:
        """The output ring's buffer the next batch goes into (None: a buffer of its own)."""
        if own:
            return None
        slot = self._slot
        self._slot = (slot + 1) % len(self._ring)
        return slot

    def _after_readers(self, slot: int, streams: list[Any]) -> None:
        """Make ``streams`` (about to write output buffer ``slot`` of the ring) wait for the GPU work
        enqueued so far on the streams the last batch in that buffer was read on
        (``DeviceBatch.readers``: taken with ``stacked()`` / ``item()`` or through DLPack). Readers
        enqueued before the consumer asks for the batch that reuses the buffer then finish before it
        is overwritten, however far the host runs ahead of the GPU. A batch nobody took costs nothing
        here (an event recorded on the consumer's current stream for every batch, taken or not, ran
        the bench's chains 4-8% slower in 5 of 6 alternating pairs on one H200 machine; batches taken
        on the legacy default stream, so fenced, ran within the spread of untaken ones on another:
        memory_study ``fence`` and ``read``, RESULTS.md as of a1d93e1, 2026-11-22)."""
        readers, self._ring_readers[slot] = self._ring_readers[slot], None
        if not readers or not self.settings.fence_readers:
            return
        cp, eng = self.engine.cp, self.engine
        for ptr in readers - {eng.stream.ptr}:  # (the engine's own stream is ordered already)
            event = cp.cuda.Event(disable_timing=True)
            cp.cuda.runtime.eventRecord(event.ptr, ptr)
            for on in streams:
                on.wait_event(event)

    def _side_streams(self) -> dict[bool, Any]:
        """Streams for the resample of each decoder's chunks ({True: hardware engine, False: CUDA
        decoder}): each decoder's reuse of its buffers then waits only for the kernels on its own chunks."""
        if self._side is None:
            cp = self.engine.cp
            with self.engine.dev:
                self._side = {hw: cp.cuda.Stream(non_blocking=True) for hw in (True, False)}
                # (per side stream, the event the engine's stream waits for after a batch's chunks, recorded again)
                self._side_done = {on.ptr: held_event(cp) for on in self._side.values()}
        return self._side

    def _process_chunks(self, res: Any, keys: Sequence[str], params: Sequence[Any] | None,
                        sizes: Sequence[tuple[int, int] | None] | None,
                        windows: tuple[np.ndarray, np.ndarray] | None, own: bool = False,
                        epoch: int = 0) -> DeviceBatch:
        """:meth:`process` for a chain of one resample to a fixed size: each decoded part (a decoder's
        part of the batch, or with ``decode_chunk`` one call) is resampled as it comes
        (``DecodeResult.chunks``) into the rows of the items it holds, then released to the decoders;
        rows of items that failed after all are closed up at the end."""
        from ..engine.batch import Ragged
        from ..engine.windows import leading_windows, segment_fill

        eng, cp, ops = self.engine, self.engine.cp, self.plan.ops
        idx, norm, (oh, ow) = self._fixed
        fill = segment_fill(ops, idx)
        dtype = norm.dtype if norm is not None else "uint8"
        shape = (oh, ow, 3) if norm is None or norm.layout == "HWC" else (3, oh, ow)
        per = 3 * oh * ow
        rows = [i for i, err in enumerate(res.errors) if err is None]  # what may still decode
        rank = {i: r for r, i in enumerate(rows)}
        slot = self._next_slot(own)
        buf = self._ring[slot] if slot is not None else None
        side = self._side_streams()
        if buf is None or buf.size < max(len(rows), 1) * per or buf.dtype != np.dtype(dtype):
            with eng.stream:
                buf = cp.empty(max(len(rows), 1) * per, dtype)
            fresh = eng.stream.record()  # (the pool's block may have been read on the engine's stream)
            for on in side.values():
                on.wait_event(fresh)
        done: list[int] = []
        if slot is not None and self._ring_done[slot] is not None:  # the side streams write ``buf`` after
            for on in side.values():                                 # its last batch's work
                wait_held(on, self._ring_done[slot])
        if slot is not None:
            self._after_readers(slot, [*side.values(), eng.stream])
        used = set()
        for items, on in res.chunks(eng.stream, side):
            part, arrays = [i for i, _ in items], [a for _, a in items]
            items = None
            drawn, redrawn = self._draws(part, arrays, keys, params, sizes, windows_only=windows is not None,
                                         epoch=epoch)
            geo, out_hw = (fed_windows(ops, windows, part, redrawn, drawn, arrays)
                           or leading_windows(ops, drawn, [tuple(a.shape[:2]) for a in arrays]))
            if (out_hw != (oh, ow)).any():
                raise RuntimeError(f"a chunk's output size differs from the chain's fixed {oh}x{ow}")
            eng.launch.resample(Ragged.from_items(cp, arrays), (geo, out_hw), norm, out=buf, fill=fill,
                         offsets=np.array([rank[i] * per for i in part], np.int64), stream=on)
            done.extend(part)
            arrays = None  # the chunk's memory goes back to the decoder
            used.add(on)
        for on in used - {eng.stream}:  # the batch is read on the engine's stream
            wait_held(eng.stream, record_held(self._side_done[on.ptr], on))
        self.timings["decode_wait"] += res.waited
        done.sort()
        got = set(done)
        self.last_errors = [(i, err or "decode failed") for i, err in enumerate(res.errors) if i not in got]
        if len(done) < len(rows):  # close up the rows of what failed after all (in stream order)
            with eng.stream:
                view = buf[: len(rows) * per].reshape(len(rows), per)
                view[: len(done)] = view[cp.asarray(np.array([rank[i] for i in done], np.int64))]
        self.stats["images"] += len(done)
        self.stats["gpu"] += res.on_gpu
        self.stats["hw"] += res.hw
        self.stats["fallbacks"] += res.fallbacks
        batch = DeviceBatch(buf, np.arange(len(done), dtype=np.int64) * per, [shape] * len(done), stream=eng.stream,
                            keys=[keys[i] for i in done], failed=[(keys[i], err) for i, err in self.last_errors])
        if slot is not None:
            self._ring[slot] = buf  # (and its event recorded again: its waits above are enqueued)
            self._ring_done[slot] = record_again(self._ring_done[slot], eng.stream, cp)
            self._ring_readers[slot] = batch.readers  # (the set itself: what the consumer takes later counts)
        return batch

    def iterate(self, batches: Iterable[tuple[Sequence[bytes], Sequence[str]]], prefetch: int = 1,
                epoch: int = 0) -> Iterator[Any]:
        """Process many batches: batch N+2 is read (by whatever ``batches`` does) and N+1 decoded in
        their own threads while batch N's kernels run. Random ops draw per (seed, key, ``epoch``).

        Reading in Python threads of this process slows the decoders (see :mod:`gpubatch.engine.gpu.feed`);
        for files, :meth:`iterate_files` reads in worker processes instead.
        """
        return self._iterate(((blobs, keys, None) for blobs, keys in batches), prefetch, epoch=epoch)

    def iterate_files(self, files: Sequence[Any], keys: Sequence[str] | None = None, batch_size: int = 256,
                      repeat: bool = False, workers: int | None = None, prefetch: int = 1) -> Iterator[Any]:
        """Process image files in batches: reading, JPEG header parsing and the parameter draws run in
        ``workers`` processes (:class:`~gpubatch.engine.gpu.feed.FileFeed`), decode and kernels here. On the
        CPU the pipeline's own worker processes read, decode and transform the files (``workers`` is not
        used). ``repeat`` cycles over the files forever, each pass an epoch of its own: random ops draw
        new parameters every epoch (per seed, key and epoch, so a rerun gives the same epochs again).
        Unreadable files are reported in ``last_errors``."""
        from ..engine.gpu.feed import FileFeed

        if self.engine is None:
            yield from self._iterate_files_cpu([str(f) for f in files], keys, batch_size, repeat, max(3, prefetch + 1))
            return
        if self.engine.cap is not None:  # decoding as far ahead as the cap's plan allows
            prefetch = self.fit_memory(batch_size, prefetch).ahead
        pin = self.settings.pin_feed
        # slots: those being read ahead, decoded and processed, plus (pinned) those waiting for the GPU
        from ..engine.processes import default_readers

        workers = workers or default_readers(route=self.engine.decoder.route)
        feed = FileFeed(files, keys, batch_size, self.plan, workers, repeat=repeat, views=True,
                        depth=self.settings.feed_slots + (self.settings.held_slots if pin else 0),
                        regions=self.region_decode, slot_bytes=self.settings.feed_slot_bytes)
        t0 = time.perf_counter()
        unpin = self.engine.pin_host(feed.shm.buf) if pin else None
        self.timings["pin"] += time.perf_counter() - t0
        try:
            yield from self._iterate(((f.blobs, f.keys, f) for f in feed), prefetch, on_stop=feed.stop,
                                     ordered_release=unpin is not None)
        finally:
            if unpin is not None:
                unpin()
            feed.close()

    def _iterate_files_cpu(self, files: list[str], keys: Sequence[str] | None, batch_size: int, repeat: bool,
                           depth: int) -> Iterator[HostBatch]:
        """The CPU path of :meth:`iterate_files`: the worker processes read, decode and transform the files
        themselves (the encoded bytes never pass through this process), ``depth`` batches in flight."""
        from collections import deque
        from itertools import count

        from ..engine.gpu.feed import _spans

        keys = list(keys) if keys is not None else [Path(f).stem for f in files]
        if len(keys) != len(files):
            raise ValueError("iterate_files: one key per file")
        pool, step = self._pool(), cpu_chunk(batch_size, self.cpu_threads)
        spans = _spans(len(files), batch_size)
        batches = ((a, b, epoch) for epoch in (count() if repeat and spans else range(1)) for a, b in spans)

        def submit(a: int, b: int, epoch: int) -> list[Any]:
            return [pool.submit(chain_chunk, self.plan, files[c : min(c + step, b)], keys[c : min(c + step, b)],
                                epoch) for c in range(a, b, step)]

        flight: deque = deque()
        try:
            for a, b, epoch in batches:
                flight.append((submit(a, b, epoch), keys[a:b]))
                if len(flight) < depth:
                    continue
                yield self._cpu_batch(*flight.popleft())
            while flight:
                yield self._cpu_batch(*flight.popleft())
        finally:
            for futures, _ in flight:  # the consumer left early: drop what is still queued, free what is done
                for f in futures:
                    if not f.cancel():
                        take_chunk(*f.result())

    def _cpu_batch(self, futures: list[Any], keys: Sequence[str]) -> HostBatch:
        t0 = time.perf_counter()
        chunks = [f.result() for f in futures]
        packed, results = take_chunks(chunks)
        self.timings["workers"] += time.perf_counter() - t0
        piped = sum(1 for name, layout in chunks if name is None and any(e is None for _, e in layout))
        if piped and not self.stats.get("piped"):
            import warnings

            from ..engine.processes import shm_free

            free = shm_free()
            warnings.warn(f"/dev/shm has no room for the CPU path's batches ({(free or 0) / 2**20:,.0f} MiB free): they "
                          "come back from its worker processes through pipes, more slowly; give the machine or "
                          "container more shared memory (docker run --shm-size=2g)", RuntimeWarning, stacklevel=3)
        self.stats["piped"] = self.stats.get("piped", 0) + piped
        self.last_errors = [(i, err) for i, (arr, err) in enumerate(results) if err is not None]
        outs = [arr for arr, err in results if err is None]
        self.stats["images"] += len(outs)
        return HostBatch(packed if packed is not None else outs, [k for k, (_, e) in zip(keys, results) if e is None],
                         [(k, e) for k, (_, e) in zip(keys, results) if e is not None])

    def _iterate(self, items: Iterable[tuple[Any, Any, Any]], prefetch: int,
                 on_stop: Callable[[], None] | None = None, ordered_release: bool = False,
                 epoch: int = 0) -> Iterator[Any]:
        """Batches (blobs, keys, FedBatch or None) through decode (a thread) and process (here);
        ``on_stop`` is called first when the iteration ends (it unblocks a source waiting for slots).
        With ``ordered_release`` (the feed's memory is page-locked, so the decoders' copies from it run
        on the GPU after their calls return) a batch's slot goes back only once the GPU is past the
        batch's decode: an event on :attr:`stream` after its kernels, which wait for that decode."""
        tm = self.timings
        held: deque = deque()  # (event, FedBatch) of batches whose encoded bytes the GPU may still read
        spare: list = []  # events of batches released, recorded again for later ones (with the GIL kept)

        def release(block: bool) -> None:
            while held and (block or query_held(held[0][0]) or len(held) > self.settings.held_slots):
                event, fed = held.popleft()
                sync_held(event)
                fed.done()
                spare.append(event)

        def decode(item: tuple[Any, Any, Any]) -> Any:
            blobs, _, fed = item
            if fed is None:
                return self.decode(blobs)
            return self.decode(blobs, fed.headers, fed.regions)

        batches = decode_ahead(decode, items, prefetch, tm, self.engine.device.index if self.engine else None)
        try:
            for (_, keys, fed), out in batches:
                t1, waited = time.perf_counter(), tm["decode_wait"]
                if fed is None:
                    out = self.process(out, keys, epoch=epoch)
                else:
                    out = self.process(out, keys, fed.params, fed.sizes, fed.windows, epoch=fed.epoch)
                    if ordered_release:
                        held.append((record_again(spare.pop() if spare else None, self.engine.stream, self.engine.cp), fed))
                        release(block=False)
                    else:
                        fed.done()  # the encoded bytes (views of the feed's shared memory) are no longer read
                tm["ops"] += time.perf_counter() - t1 - (tm["decode_wait"] - waited)  # process() waits for decode
                yield out
        finally:
            if on_stop is not None:
                on_stop()
            batches.close()
            release(block=True)
