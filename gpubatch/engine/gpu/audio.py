"""Audio on the GPU: records decoded on the CPU in processes (:class:`.audio_records.RecordDecoders`),
gathered into batches, moved to the GPU in one copy a batch, and run through the chain's device kernels
(:mod:`.ops.audio`) a whole batch per op; outputs come back to the CPU to be encoded and written in
dataset order. A batch the GPU fails on is run again on the CPU, record by record, and counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...errors import RecordError, RunStats, Stage, reason_of
from ...types import Record
from ..codecs.audio_io import AudioData
from ..device import Device
from ..media import DEVICE, HOST, get_codec
from ..plan import Plan
from ..run import Job, RecordSource
from ..settings import Settings
from .audio_chain import Download, PinnedDownloads, download, run_chain_device, warm_chain
from .audio_feed import to_device
from .marks import Marks
from .start import audio_decoders


def run_on_gpu(jobs: list[tuple[Job, AudioData]], plan: Plan, stats: list[RunStats],
               upload: Callable[[list[AudioData]], list[AudioData]] = to_device,
               downloads: PinnedDownloads | None = None) -> tuple[list[AudioData | RecordError], Download | None]:
    """The chain on a batch of jobs on the GPU (their samples put there by ``upload``), each job's output
    back on the host (on the CPU, record by record, where the GPU fails; counted in the job's ``stats``),
    and the slot of ``downloads`` the outputs are views of (None where they are arrays of their own)."""
    from ..codecs.flac_gpu import decode_host, is_packed

    codec = get_codec("audio", "*", HOST)
    try:
        up = upload([d for _, d in jobs])  # (FLAC decoded on the GPU here: a record neither decodes is its error)
        ok = [i for i, u in enumerate(up) if not isinstance(u, RecordError)]
        back, slot = [], None
        if ok:
            dev = run_chain_device(plan.ops, [up[i] for i in ok], [jobs[i][0].params for i in ok])
            back, slot = download(dev, half_features=True, downloads=downloads)  # (a slot it fails into: given back)
        results: list[AudioData | RecordError] = list(up)
        for i, b in zip(ok, back):
            results[i] = b
        for i in ok:
            stats[i].add(transcoded=1)
        return results, slot
    except Exception as e:  # noqa: BLE001 - a batch the GPU fails on goes to the CPU, counted
        results = []
        for (job, d), st in zip(jobs, stats):
            st.add(fallbacks=1)
            st.warn(f"a batch of {len(jobs)} audio records ran on the CPU after the GPU failed: {type(e).__name__}: "
                    f"{str(e)[:160]}")
            t = job.template
            if is_packed(d):  # (FLAC bytes for the GPU's decoder: decoded here, as the CPU path does)
                try:
                    d = decode_host(d)
                except ValueError as e2:
                    results.append(RecordError(t.key, t.origin, Stage.DECODE, str(e2)))
                    continue
            try:
                out = codec.run_chain(plan.ops, d, job.params)
                if np.may_share_memory(out.samples, d.samples):  # (a chain that cuts or keeps its input: the input
                    out = out._replace(samples=out.samples.copy())  # is a staging slot's, filled again after this)
                results.append(out)
                st.add(transcoded=1)
            except Exception as e2:  # noqa: BLE001 - the record boundary
                results.append(RecordError(t.key, t.origin, Stage.TRANSFORM, reason_of(e2)))
        return results, None


def encoded(items: list[Any], plan: Plan, stats: RunStats) -> list[Record | RecordError]:
    """A shard's part of a batch as records: ``(job, output)`` pairs encoded by the output's codec (their
    drawn parameters kept for the shard's log), records and errors as they are."""
    codec = get_codec("audio", "*", HOST)
    out: list[Record | RecordError] = []
    for item in items:
        if not isinstance(item, tuple):
            out.append(item)
            continue
        job, res = item
        if isinstance(res, RecordError):
            out.append(res)
            continue
        try:
            out.append(codec.encode(res, job.template, plan))
        except RecordError as e:
            out.append(e)
        if plan.augmenting:
            stats.drawn[job.template.key] = job.params
    return out


def largest_record(reader: RecordSource, entries: list[Any], plan: Plan, n: int = 48) -> tuple[int, int, int]:
    """(rate, samples, channels) of the largest record the GPU would take among ``n`` entries spread
    over the dataset, as the chain decodes it (only as far as a leading fixed duration reads; records
    long enough to stream run on the CPU); 1 s at 48 kHz in stereo where none could be read."""
    from ..codecs.audio import info_of, should_stream
    from ..codecs.audio_io import leading_seconds
    from .memory import spread

    seconds = leading_seconds(plan.ops)
    best = (0, (48000, 48000, 2))
    for entry in spread(entries, n):
        try:
            record = reader.read(entry)
            if record.codec == "npy":
                continue
            info = info_of(record)
        except Exception:  # noqa: BLE001 - a bad record is the run's to report
            continue
        if seconds is None and should_stream(plan.ops, info):
            continue
        frames = info.frames if seconds is None else min(info.frames, int(np.ceil(seconds * info.rate)))
        if frames * info.channels > best[0]:
            best = (frames * info.channels, (info.rate, frames, info.channels))
    return best[1]


def fit_cap(spec: str, device: Device, reader: RecordSource, entries: list[Any], plan: Plan, batch_size: int,
            stats: RunStats, stack_bytes: int | None = Settings.stack_bytes) -> int:
    """Under ``--gpu-memory``: the batch size that keeps this run's device memory under the cap, as the
    driver counts it (:mod:`.gpu_memory`). What the process holds before its first batch is measured (the
    CUDA context; the chain's kernels, FFT and BLAS handles, loaded by one record of silence), a record's
    need comes from the largest of a sample (:func:`~.gpu_memory.audio_need`), and CuPy's pool is bounded
    by what the cap leaves (a batch that would pass it runs on the CPU, counted). Refuses, naming the
    parts, where one record does not fit. The context's stack per GPU thread is lowered to ``stack_bytes``
    first, as the image engine does (it holds a share of the context's memory)."""
    import cupy as cp

    from ...errors import GpubatchError
    from .memory import CapTooSmall, ImageNeed, audio_need, named, plan_memory, start_capped

    cap, mem, context = start_capped(spec, device.index, stack_bytes)
    rate, samples, channels = largest_record(reader, entries, plan)
    cp.fft.config.get_plan_cache().set_size(0)  # FFT plans (their work areas in CuPy's pool) made per call
    silence = AudioData(cp.zeros((channels, rate), cp.float32), rate)
    run_chain_device(plan.ops, [silence], [plan.draw("", rate, rate)])
    cp.cuda.Device(device.index).synchronize()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    fixed = mem.settled()
    parts = {"context": context >> 20, "kernels": max(0, fixed - context) >> 20}
    need = audio_need(plan, rate, samples, channels)
    try:
        fit = plan_memory(cap, fixed, parts, ImageNeed(0, need), batch_size, 1, spec=spec, least_batch=1,
                          unit="record")
    except CapTooSmall as e:
        raise GpubatchError(str(e)) from None
    pool.set_limit(size=fit.pool_limit)
    stats.gpu_memory.update(cap_mib=cap >> 20, processes=1, plan=(
        f"{fixed >> 20} MiB before the first batch ({named(parts)}), batches of "
        f"{fit.batch} records of up to {samples / rate:.1f} s x {channels} ch at {rate} Hz ({-(-need >> 20)} MiB each)"))
    return fit.batch


def warm_up(plan: Plan, reader: RecordSource, task: Any, batch_size: int) -> None:
    """:func:`warm_chain` on a batch shaped as the first shard's first batch (its first record's rate and channels,
    as many records as the batch takes), while the decoding processes decode that batch; a record that cannot be
    read leaves it undone (the run reports it)."""
    try:
        rate, samples, channels = largest_record(reader, list(task.entries[:1]), plan, 1)
    except Exception:  # noqa: BLE001 - (see above)
        return
    warm_chain(plan, rate, samples, channels, max(1, min(batch_size, len(task.entries))))


class AudioDeviceUnit:
    """Audio on the GPU, in a GPU's worker process, over the tasks it is dealt (in shard order):

    - records read and decoded in processes of their own (:class:`~.audio_records.RecordDecoders`: a core
      each of this process's share of the host's, forked by the worker's boot before its CUDA context), ahead
      across the shards' boundaries;
    - the chain run once on silence shaped as the first batch while that batch is decoded (:func:`warm_up`; the
      worker's start ran a log-mel chain once already: ``gpu.start.Early.warm``);
    - the chain run on the GPU ``batch_size`` outputs of one shard at a time (a batch never spans two:
      a shard's bytes do not depend on the worker; under ``--gpu-memory``, as many as the cap holds:
      :func:`fit_cap`, planned on the first task);
    - the decoded samples taken through shared memory and gathered into page-locked buffers by the thread that
      makes the batches, each batch copied up in one go (:class:`~.audio_feed.PinnedGather`);
    - each shard's outputs encoded, written and committed, in order, by a thread of their own (a process
      where ``GPUBATCH_SHARD_WRITER=process``: :func:`~..execute.writer.shard_writer`) while the next batch
      runs.

    A shard at a time, decoded by threads and written by the loop, this ran 207 Whisper feature clips a
    second on an H200 host of 16 cores; so, 460 (2026-12-02); with the samples through pipes and the
    writer a process, 560-595 on 4,096 clips, and so 696; with the batches gathered off the loop, read
    straight from the decoders' files, 948 (2026-12-03, benchmarks/RESULTS.md: the loop then waits on the
    shards' writer thread more than on anything else). 2,048 clips with two such processes a GPU, their start off
    the first shard's way: 861-914 clips/s against 672 with one (2026-12-05).
    """

    def __init__(self, ctx: Any, slot: int):
        import cupy as cp

        self.ctx, self.plan = ctx, ctx.plan
        self.plan.validate(DEVICE)
        self.device = ctx.device
        self.cp = cp
        cp.cuda.Device(self.device.index).use()
        self.batch_size = ctx.batch_size or 256
        # the loop, the shards' writer and the feed's threads hand the GIL over between their Python steps
        # (as the image engine and the audio pipeline set it)
        if sys.getswitchinterval() > ctx.settings.switch_interval:
            sys.setswitchinterval(ctx.settings.switch_interval)
        # decoding processes: this process's share of the cores (several processes may share the GPU,
        # several GPUs the host), one left to the GPU's loop and the shards' writer; its boot forked them
        # (start.early "audio") where it began the GPU's start
        self.processes = audio_decoders(ctx.host_procs)

    @classmethod
    def make(cls, ctx: Any, slot: int) -> AudioDeviceUnit:
        return cls(ctx, slot)

    def run(self, reader: Any, tasks: Any, writing: Callable[[Any], Any], done: Callable[[Any], None]) -> None:
        import functools
        import time

        from ..execute.boot import TIMES as BOOT_TIMES
        from ..execute.writer import ShardWriterProcess, shard_writer
        from ..executor import prefetched, timed_next
        from . import start
        from .audio_feed import PinnedGather
        from .audio_records import RecordDecoders, batched, share_items, unlink_shared

        plan, cp = self.plan, self.cp
        tasks = list(tasks)
        if not tasks:
            return
        marks = Marks(self.ctx.started)  # (when this worker's steps came: the summary's "wall (worker): NAME")
        for name, when in BOOT_TIMES.items():
            marks.at(name, when)
        marks.mark("unit start", start.booted(self.device.index)[0])
        decoders = RecordDecoders(self.ctx, min(self.processes, max(1, sum(len(t.entries) for t in tasks))))
        marks.mark("decoders ready" if decoders.prestarted else "decoders started")
        opened: list[Any] = []  # every shard made, in order
        first = next((t for t in tasks if t.entries), tasks[0])
        capped = None
        if self.ctx.gpu_memory is not None:
            try:
                capped = writing(first)  # (its stats hold the plan of the cap; written no earlier than its turn)
                self.batch_size = fit_cap(self.ctx.gpu_memory, self.device, reader, list(first.entries), plan,
                                          self.batch_size, capped.stats, self.ctx.settings.stack_bytes)
            except BaseException:  # (a cap too small: its shard's partial files and the decoders go)
                if capped is not None:
                    capped.abort()
                decoders.close()
                raise

        def make(task: Any) -> Any:
            w = capped if capped is not None and task is first else writing(task)
            opened.append(w)
            return w

        # the shards' writer: a thread (its records are few and large: the pipe to a writer process carried a
        # Whisper clip's 480 KB of features 64 KB a call; 561 -> 616 clips/s, H200, 2026-12-03; a process with
        # the features through shared memory, as below, was no faster: 630-783 against 743-792)
        # (four shards written at once: a shard's features are copied into the page cache at about 1 GB/s a
        # thread; 8,192 Whisper clips 1,995 against 1,831 clips/s with one, in turn, H100 host, 2026-12-06)
        out = shard_writer(self.ctx, done, auto="thread", lanes=4)
        # a writer process takes the outputs' samples through shared memory (share_items), not the pipe; the
        # names handed over go once the writer has ended, taken or not
        shared: set[str] = set() if isinstance(out, ShardWriterProcess) else None  # type: ignore[assignment]
        gather = PinnedGather(self.device.index)
        downloads = PinnedDownloads(self.device.index)

        def staged(groups: Iterator[list]) -> Iterator[tuple[list, list, Any]]:
            """Each batch with its jobs, their samples gathered for the GPU (in the thread that makes them)."""
            for group in groups:
                jobs = [(o, w.stats) for w, outs, _ in group for o in outs if isinstance(o, tuple)]
                if not jobs:
                    yield group, jobs, None
                    continue
                st = gather.stage([d for (_, d), _ in jobs], decoders.files)
                yield group, [((j, h), stats) for ((j, _), stats), h in zip(jobs, st.hosts)], st

        groups: Any = None
        handed: set[int] = set()
        # the loop's time: waiting for decoded batches, the chain (the upload among it) and the hand-over to the
        # shards' writer (its wait where the writer is behind)
        run_t = {"decode_wait": 0.0, "chain": 0.0, "upload": 0.0, "hand_over": 0.0}
        flushed = dict(run_t)

        def uploaded(up: Any) -> Callable[[list[AudioData]], list[AudioData]]:
            def call(items: list[AudioData]) -> list[AudioData]:
                t = time.perf_counter()
                try:
                    return up(items)
                finally:
                    run_t["upload"] += time.perf_counter() - t
            return call

        def hand(call: Callable[..., None], *args: Any) -> None:
            t = time.perf_counter()
            call(*args)
            run_t["hand_over"] += time.perf_counter() - t

        committed = False
        try:
            with cp.cuda.Device(self.device.index):
                groups = prefetched(staged(batched(decoders.outputs(tasks, make), self.batch_size)), 2)
                if capped is None:  # (a capped run ran its chain on a record of silence already: fit_cap)
                    warm_up(plan, reader, first, self.batch_size)
                    marks.mark("chain warmed")
                for name, when in start.step_walls(self.device.index).items():  # (the boot's start: its steps)
                    marks.at(f"gpu start: {name}", when)
                while (got := timed_next(groups, run_t, "decode_wait")) is not None:
                    group, jobs, up = got
                    marks.once("first batch decoded")
                    t0 = time.perf_counter()
                    back, slot = run_on_gpu([j for j, _ in jobs], plan, [st for _, st in jobs], uploaded(up),
                                            downloads) if jobs else ([], None)
                    results = iter(back)
                    if up is not None:
                        for i in up.refused:  # (FLAC the GPU's decoder refused, decoded on the CPU: counted)
                            jobs[i][1].add(fallbacks=1)
                        up.release()
                    run_t["chain"] += time.perf_counter() - t0
                    marks.once("first batch through the chain")
                    parts = by_shard(group)
                    if slot is not None:  # (each hand-over of the batch's outputs holds their slot until they are
                        slot.hold(1 + sum(1 for _, outs, _ in parts if outs))  # encoded; the loop too, until here)
                    for w, outs, last in parts:
                        items = [(o[0], next(results)) if isinstance(o, tuple) else o for o in outs]
                        if items:
                            release = slot.release if slot is not None else None
                            if shared is not None:  # (copied into a shared file: the slot is free of them)
                                items = share_items(items, shared)
                                if release is not None:
                                    release()
                                    release = None
                            # (called with w's stats)
                            hand(out.put, w, functools.partial(_encoded_timed, items, plan, release=release))
                            handed.add(id(w))
                        if last:
                            timings = {k: v - flushed[k] for k, v in run_t.items()}
                            flushed = dict(run_t)
                            hand(out.commit, w, timings, {"marks": m} if (m := marks.take()) else None)
                            handed.add(id(w))
                    if slot is not None:
                        slot.release()
            out.close()
            committed = True
        finally:
            if not committed:
                gather.close()  # (the thread that makes the batches stops waiting for a slot)
                if groups is not None:
                    groups.close()  # (the thread that makes the batches stops: no shard is made after this)
                out.close(failed=True)  # (the shards handed over and not committed are removed there)
                for w in opened:  # (made, never handed over: their partial files go too)
                    if id(w) not in handed:
                        try:
                            w.abort()
                        except OSError:
                            pass
            decoders.close()
            if shared:
                unlink_shared(shared)

    def close(self) -> None:
        pass


def by_shard(group: list[tuple[Any, list, bool]]) -> list[tuple[Any, list, bool]]:
    """A batch's ``(shard, outputs of one entry, last)`` items as one ``(shard, outputs, last)`` a shard: what the
    loop hands its shard writer in one go. Handed over entry by entry, a 128-clip shard's part was 128 items through
    the writer's queue of 8, so the loop ran at most 8 records ahead of the writer and the two took turns: in a run
    of 8,192 Whisper clips on an H200 host (2026-12-05) the loops waited 4.4 s in the hand-over (summed over two
    processes) while their writers sat idle 4.2 s. With the GPU's part of a batch stood in by a wait
    (``benchmarks/audio_handover.py``, 2,048 clips, the 2-core CI machine) the hand-over went from 0.77 s to 0.001 s
    and the run from 1,162 to 1,971 clips/s."""
    out: list[tuple[Any, list, bool]] = []
    for shard, outs, last in group:
        if out and out[-1][0] is shard and not out[-1][2]:
            out[-1] = (shard, out[-1][1] + list(outs), last)
        else:
            out.append((shard, list(outs), last))
    return out


def _encoded_timed(items: list[Any], plan: Plan, stats: RunStats,
                   release: Callable[[], None] | None = None) -> list[Record | RecordError]:
    """:func:`encoded`, its time counted as the shard's "encode" (where the shards are written: the writer's
    thread, or its process, which maps the samples handed over in shared memory first); then ``release`` called
    (the outputs' slot of page-locked memory, where they are views of one: :class:`~.audio_chain.Download`)."""
    import time

    from .audio_records import unshare_items

    t0 = time.perf_counter()
    try:
        return encoded(unshare_items(items), plan, stats)
    finally:
        stats.timed("encode", time.perf_counter() - t0)
        if release is not None:
            release()
