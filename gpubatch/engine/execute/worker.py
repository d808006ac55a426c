"""What a worker does with one shard task: its outputs, in order, into the shard's sink; the shard
committed; its journal entry written. :func:`run_shard` is the whole of it for one task, and what any
executor (the local one's worker processes, a Ray task) calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._commit import ShardFile
from ...errors import ErrorPolicy, ErrorRouter, RecordError, RunStats, Stage
from ...types import Record, ShardResult, ShardTask
from ..device import Device
from ..plan import Plan
from ..settings import Settings
from .journal import RUN_DIR, Journal

COUNTS = ("records_in", "records_out", "passthrough", "transcoded", "fallbacks", "boxes_dropped", "first_frames",
          "bytes_in", "bytes_out")


@dataclass
class RunContext:
    """Everything a worker needs to run shard tasks, picklable (it travels to worker processes).

    Attributes:
        opener: makes the dataset's reader (each worker opens the source itself).
        sink: makes the sink of a task (the output format's, bound to the staging folder).
        plan: the run's plan (ops, sampler, codecs, seed).
        device: the device the run was given (a GPU worker is handed its own ordinal).
        policy: "skip" or "fail".
        stage: the staging folder (journal entries and parameter logs go under its ``.gpubatch``).
        settings: the engine's knobs.
        batch_size, gpu_memory, gpu_procs: the GPU units' settings (``gpu_procs``: worker processes a GPU).
        reads_without_scan: whether a worker's reader reads entries without listing the dataset first.
        on_gpu: whether the run's unit works on the GPU(s) (set by the runner from the strategy table).
        host_share: the GPU worker processes that share this host's cores (0: from gpu_procs and the GPUs).
        gpu_label: how a shard's result names its GPU where the ordinal does not tell (Ray: its GPU id).
        started: the wall clock (``time.time()``) when the run began, for the first batch's time.
    """

    opener: Callable[[], Any]
    sink: Callable[[ShardTask], Any]
    plan: Plan
    device: Device
    policy: str = "skip"
    stage: Path = Path(".")
    settings: Settings = field(default_factory=Settings)
    batch_size: int = 256
    gpu_memory: Any = None
    gpu_procs: int = 1
    reads_without_scan: bool = True
    started: float = 0.0  # time.time() when the command's run began (a unit's first batch is timed from it)
    on_gpu: bool = False  # the run's unit is a GPU unit (a pass-through run on a GPU device works on the host)
    host_share: int = 0  # the GPU worker processes sharing this host's cores, where the executor knows (Ray)
    gpu_label: str = ""  # the GPU as the executor names it (Ray's GPU id), in each shard's result
    store: Any = None  # where each committed shard goes besides the staging folder (gpubatch._publish), or None

    @property
    def host_procs(self) -> int:
        """The GPU worker processes this host runs (each GPU's ``gpu_procs``): the ones its cores are shared by."""
        if self.host_share:
            return self.host_share
        return max(1, self.gpu_procs) * max(1, len(self.device.indexes) if self.on_gpu else 1)

    def for_slot(self, slot: int) -> tuple[RunContext, dict[str, str]]:
        """The context of worker ``slot`` and what its process's environment needs: on a run over several
        GPUs, slot k works on the k-th GPU (round robin; on a run on another GPU than 0, on that one), the
        only one its process sees
        (``CUDA_VISIBLE_DEVICES``: no CUDA context of it on the others, and its start-up initialises one
        device), as ordinal 0 there, named by its ordinal here in its results."""
        gpus = self.device.indexes
        if not self.on_gpu or not gpus or gpus == (0,):
            return self, {}
        mine = gpus[slot % len(gpus)]
        ctx = dataclasses.replace(self, device=self.device.one(0), gpu_label=str(mine))
        from ..processes import visible_name

        return ctx, {"CUDA_VISIBLE_DEVICES": visible_name(mine)}

    @property
    def gpu_ordinal(self) -> int:
        """This worker's GPU among the host's (where its process sees only its own: the ordinal it has here
        is 0): what its decoder's core is chosen by."""
        return int(self.gpu_label) if self.gpu_label.isdigit() else self.device.index

    def open_reader(self) -> Any:
        reader = self.opener()
        if not self.reads_without_scan:
            reader.entries()  # (a reader whose reads need its scan: LMDB's page walk)
        return reader


class ShardWriting:
    """The outputs of one task as they come, written in order into its sink: a record error routed by the
    run's policy (``fail`` raises), a record that does not fit the format its own error (WRITE), an
    augment run's drawn parameters into the shard's parameter log. :meth:`commit` makes the shard final
    and returns its :class:`ShardResult` (the journal entry is the caller's: :meth:`journal`)."""

    def __init__(self, task: ShardTask, ctx: RunContext, progress: Callable[[int], None] | None = None):
        self.task, self.ctx, self.progress = task, ctx, progress
        self.stats = RunStats()
        self.router = ErrorRouter(ErrorPolicy(ctx.policy), self.stats)
        self._sink: Any = None
        self._params: ShardFile | None = None
        self.t0 = time.perf_counter()
        self.write_s = 0.0
        self._pending = 0

    # the shard's files are opened where its first record is written (a GPU worker's shard written by a
    # writer process of its own is only a handle there: writer.ShardWriterProcess)
    @property
    def sink(self) -> Any:
        if self._sink is None:
            self._sink = self.ctx.sink(self.task)
        return self._sink

    @property
    def params(self) -> ShardFile | None:
        """An augment run's log of the parameters drawn for each record of the shard (None otherwise)."""
        if self._params is None and self.ctx.plan.augmenting:
            self._params = ShardFile(Path(self.ctx.stage) / RUN_DIR / "params", f"{self.task.index:06d}.jsonl")
        return self._params

    def put(self, result: Record | RecordError) -> None:
        self.put_many([result])

    def put_many(self, results: list[Record | RecordError]) -> None:
        """Each of ``results`` in order: a record error routed by the run's policy, the records between two
        errors handed to the sink together (:meth:`~gpubatch.formats.sinks.ShardSink.write_many`), a record
        that does not fit the format its own error (WRITE), an augment run's drawn parameters of each record
        written into the shard's parameter log."""
        t = time.perf_counter()
        run: list[Record] = []
        for r in [*results, None]:
            if r is not None and not isinstance(r, RecordError):
                run.append(r)
                continue
            if run:
                self._write(run)
                run = []
            if r is None:
                break
            if r.stage is Stage.READ:  # a record that could not be read (read_counted counted the others)
                self.stats.add(records_in=1)
            self.router(r)
        self.write_s += time.perf_counter() - t
        self._pending += len(results)
        if self.progress is not None and self._pending >= 16:
            self.progress(self._pending)
            self._pending = 0

    def _write(self, records: list[Record]) -> None:
        out = nbytes = 0
        params = self.params
        for rec, err in zip(records, self.sink.write_many(records)):
            if err is not None:  # this record does not fit the format
                self.router(RecordError(rec.key, rec.origin, Stage.WRITE, str(err) or type(err).__name__))
                continue
            out += 1
            nbytes += len(rec.data)
            if params is not None:
                drawn = self.stats.drawn.pop(rec.key, None)
                line = {"key": rec.key, "params": jsonable(drawn)} if drawn is not None else \
                    {"key": rec.key, "original": True}
                params.write((json.dumps(line) + "\n").encode())
        self.stats.add(records_out=out, bytes_out=nbytes)

    def commit(self, timings: dict[str, float] | None = None, extra: dict[str, Any] | None = None) -> ShardResult:
        """Commit the shard's files (and parameter log): its result."""
        t = time.perf_counter()
        files, own = self.sink.commit()
        if self.params is not None:
            name, meta = self.params.commit()
            files[f"{RUN_DIR}/params/{name}"] = meta
        committing = time.perf_counter() - t
        if self.progress is not None and self._pending:
            self.progress(self._pending)
        s = self.stats
        times = {k: round(v, 4) for k, v in s.timings.items()}
        times.update({k: round(v, 4) for k, v in (timings or {}).items()})
        times.update({k: round(v, 4) for k, v in self.sink.timings.items()})
        times["write"] = round(times.get("write", 0.0) + self.write_s, 4)
        times["commit"] = round(times.get("commit", 0.0) + committing, 4)  # (its fsyncs and renames)
        times["shard"] = round(time.perf_counter() - self.t0, 4)
        return ShardResult(self.task.index, self.task.name, self.task.start, self.task.stop,
                           counts={k: int(getattr(s, k)) for k in COUNTS}, skipped=_in_order(s.errors),
                           warnings=sorted(set(s.warnings)) + [w for w in getattr(self.sink, "warnings", [])
                                                               if w not in s.warnings],
                           files=files, timings=times,
                           extra={**own, **(extra or {}), **({"gpu_memory": dict(s.gpu_memory)} if s.gpu_memory else {}),
                                  **({"gpu": self.ctx.gpu_label or self.ctx.device.index} if self.ctx.on_gpu else {})})

    def abort(self) -> None:
        if self._sink is not None:
            self._sink.abort()
        if self._params is not None:
            self._params.abort()


def _in_order(errors: list[Any]) -> list[dict]:
    """A shard's skipped records as dicts, by key (units that work records in threads find them in any
    order; the journal and the manifest do not depend on it)."""
    return [e.as_dict() for e in sorted(errors, key=lambda e: (str(e.key), str(e.stage.value), str(e.reason)))]


def jsonable(value: Any) -> Any:
    """Drawn parameters as JSON values (tuples -> lists, NumPy scalars -> numbers)."""
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def finish(writing: ShardWriting, timings: dict[str, float] | None = None,
           extra: dict[str, Any] | None = None) -> ShardResult:
    """Commit a task's shard and write its journal entry: its result, as the entry reads back."""
    return Journal(writing.ctx.stage, writing.ctx.store).record(writing.commit(timings, extra))


@contextlib.contextmanager
def shard_of(writing: Callable[[ShardTask], ShardWriting], task: ShardTask,
             done: Callable[[ShardResult], None]) -> Iterator[ShardWriting]:
    """A task's shard for a unit to put its outputs into: committed, journaled and handed to ``done`` when
    the block ends, its partial files removed if the block raises."""
    w = writing(task)
    try:
        yield w
    except BaseException:
        w.abort()
        raise
    done(finish(w))


def ordered_across(tasks: Iterable[ShardTask], make: Callable[[ShardTask], Any], submit: Callable[[list, Any], Any],
                   window: int, chunk: int = 1) -> Iterator[tuple[Any, list, bool]]:
    """A worker's tasks worked entry by entry across their boundaries (the GPU audio unit's): ``(shard,
    outputs of one entry, whether it is its task's last)`` in the tasks' order, a task of no entries giving one ``(shard, [],
    True)``. Each task's shard is made by ``make`` as its first entries are submitted (in order);
    ``submit(entries, shard)`` starts the work of ``chunk`` entries of one task (a pool's future of a list,
    per entry, of ``(outputs, counted)``: ``counted``, where not None, what a process counted of it
    (:func:`stats_part`), added to the shard's stats here); ``window`` submissions at most are in flight,
    and those left are cancelled where the consumer stops early."""
    from collections import deque

    def chunks() -> Iterator[tuple[ShardTask, list, bool]]:
        for task in tasks:
            n = len(task.entries)
            if not n:
                yield task, [], True
            for a in range(0, n, chunk):
                yield task, list(task.entries[a: a + chunk]), a + chunk >= n

    todo = chunks()
    inflight: deque = deque()
    current: list[Any] = [None, None]  # the task whose entries are being submitted, and its shard

    def more() -> None:
        for task, entries, last in todo:
            if task is not current[0]:
                current[:] = [task, make(task)]
            inflight.append((current[1], submit(entries, current[1]) if entries else None, last))
            return

    for _ in range(max(1, window)):
        more()
    try:
        while inflight:
            shard, fut, last = inflight.popleft()
            more()
            if fut is None:
                yield shard, [], True
                continue
            got = fut.result()
            for i, (outs, counted) in enumerate(got):
                if counted is not None:
                    merge_part(shard.stats, counted)
                yield shard, outs, last and i == len(got) - 1
    finally:
        for _, fut, _ in inflight:
            if fut is not None:
                fut.cancel()


def write_across(tasks: Iterable[ShardTask], writing: Callable[[ShardTask], ShardWriting],
                 done: Callable[[ShardResult], None], submit: Callable[[list, ShardWriting], Any], window: int,
                 chunk: int = 1, extra: Callable[[], dict | None] | None = None) -> None:
    """A worker's tasks worked across their boundaries (:func:`ordered_across`; the GPU video unit's) and
    written in this thread: each entry's outputs put into its task's shard in order, each shard committed,
    journaled and handed to ``done`` once its last entry is in, while the entries of the next tasks are
    worked. Where anything raises, every shard made and not committed is removed (its partial files), the
    work not started is cancelled, and the error goes on. ``tasks`` may be a queue's (taken as the window
    reaches them). ``extra``, where given, gives what each commit adds to its shard's result (its ``extra``)."""
    from collections import deque

    opened: deque = deque()  # shards made and not yet committed, in order

    def make(task: ShardTask) -> ShardWriting:
        w = writing(task)
        opened.append(w)
        return w

    entries = ordered_across(tasks, make, submit, window, chunk)
    try:
        for w, outs, last in entries:
            for o in outs:
                w.put(o)
            if last:
                done(finish(w, None, extra() if extra is not None else None))
                opened.popleft()  # (shards are committed in the order they were made)
    except BaseException:
        entries.close()  # (the queued work cancelled)
        for w in opened:
            try:
                w.abort()
            except OSError:
                pass
        raise


def stats_part(stats: RunStats) -> dict:
    """What a process counted of its records (counts, warnings, drawn parameters, times, GPU memory), to
    be added to their shard's stats in another (:func:`merge_part`)."""
    return {"counts": {k: getattr(stats, k) for k in COUNTS if getattr(stats, k)}, "warnings": list(stats.warnings),
            "drawn": dict(stats.drawn), "timings": dict(stats.timings), "gpu_memory": dict(stats.gpu_memory)}


def merge_part(stats: RunStats, part: dict) -> None:
    """Add :func:`stats_part`'s counts, warnings, drawn parameters, times and GPU memory to ``stats``."""
    if part["counts"]:
        stats.add(**part["counts"])
    for w in part["warnings"]:
        stats.warn(w)
    stats.drawn.update(part["drawn"])
    for k, v in part["timings"].items():
        stats.timed(k, v)
    stats.gpu_memory.update(part.get("gpu_memory") or {})


class ShardWriter:
    """Writes a GPU worker's output records into their shards, in a thread of its own, and commits each
    shard (its fsyncs and renames in the thread of a :class:`Committer`, beside the next shard's writes),
    in the order handed over: the loop that feeds the GPU goes on to the next batch meanwhile (the files'
    writes release the GIL). What :meth:`put` hands over is the records, or a function of the shard's
    stats that makes them there (their encoding, off the loop's thread). An error there is raised in the
    loop at its next hand-over. :class:`~.writer.ShardWriterProcess` does the same in a process.

    With ``lanes`` above 1, consecutive shards are written in that many threads at once (a shard's records
    in order, in one lane), and each commit waits for its shard's writes: the files are the same, the
    commits and ``done`` still in order. Large records (audio features: 480 KB a Whisper clip) are copied
    into the page cache at about 1 GB/s a thread, which bounded the GPU audio unit with one writer (H100
    host, 2026-12-06: its writer threads busy 80-90% of the run, the loop waiting on them a fifth of it)."""

    def __init__(self, done: Callable[[Any], None], lanes: int = 1):
        import concurrent.futures
        import queue
        import threading

        self.done = done
        self.lanes = [concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpubatch-shard-lane")
                      for _ in range(lanes if lanes > 1 else 0)]
        self.commits = Committer(depth=max(1, lanes))
        self.q: Any = queue.Queue(maxsize=8)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="gpubatch-shard-writer", daemon=True)
        self.thread.start()

    def _write(self, shard: Any, payload: Any) -> None:
        if self.error is not None:  # (a write failed: the loop raises it; this shard is not to be committed either)
            raise RuntimeError("not written: an earlier write of this worker failed")
        try:
            shard.put_many(list(payload(shard.stats) if callable(payload) else payload))
        except BaseException as e:  # noqa: BLE001 - raised in the loop
            self.error = self.error or e
            raise

    def _run(self) -> None:
        unfinished: dict[int, Any] = {}  # shards written to
        committed: set[int] = set()  # of those, the ones committed (by the committer's thread)
        lane_of: dict[int, Any] = {}  # shard -> its lane (where lanes are), until its commit
        written: dict[int, list] = {}  # shard -> its writes' futures in its lane
        aborted = False
        idle = 0.0  # waiting for the loop's hand-overs since the last commit (the shard's "writer_idle")
        while True:
            t = time.perf_counter()
            item = self.q.get()
            idle += time.perf_counter() - t
            if item is None:
                break
            kind, shard, payload = item
            unfinished[id(shard)] = shard
            aborted = aborted or kind == "abort"
            if self.error is not None or kind == "abort":
                continue  # (drained: the loop raises the error; what is unfinished is removed below)
            try:
                if kind == "put":
                    if self.lanes:
                        lane = lane_of.get(id(shard))
                        if lane is None:  # (the next lane in turn, for a shard's first records)
                            lane = lane_of[id(shard)] = self.lanes[len(unfinished) % len(self.lanes)]
                        written.setdefault(id(shard), []).append(lane.submit(self._write, shard, payload))
                    else:
                        self._write(shard, payload)
                else:  # "commit": its fsyncs and renames in the committer's thread, beside the next shard's writes
                    timings, extra = payload
                    timings, idle = {**(timings or {}), "writer_idle": idle}, 0.0
                    lane_of.pop(id(shard), None)
                    self.commits.submit(shard, lambda r, s=shard: (committed.add(id(s)), self.done(r)), timings, extra,
                                        after=written.pop(id(shard), ()), check=self._check if self.lanes else None)
            except BaseException as e:  # noqa: BLE001 - raised in the loop
                self.error = self.error or e
        for lane in self.lanes:  # (every write ended before the last commits, or before the partial files go)
            lane.shutdown(wait=True)
        try:
            self.commits.close(failed=self.error is not None or aborted)
        except BaseException as e:  # noqa: BLE001 - raised in the loop
            self.error = self.error or e
        for shard in unfinished.values():  # (a run that failed or stopped: the partial files of the rest go)
            if id(shard) in committed:
                continue
            try:
                shard.abort()
            except OSError:
                pass

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, shard: Any, records: list | Callable[[], list]) -> None:
        self._check()
        self.q.put(("put", shard, records))

    def commit(self, shard: Any, timings: dict, extra: dict | None) -> None:
        self._check()
        self.q.put(("commit", shard, (timings, extra)))

    def close(self, abort: Any = None, failed: bool = False) -> None:
        """Wait for every hand-over to be written (and ``abort``, a shard left unfinished, removed; on a
        ``failed`` run every shard handed over and not committed is, and no error of the writer's raised)."""
        if abort is not None:
            self.q.put(("abort", abort, None))
        self.q.put(None)
        self.thread.join()
        if abort is None and not failed:
            self._check()


_RELEASED: list[Callable[[], None]] = []  # what tells this worker's executor (local.py's worker sets it)


def on_released(tell: Callable[[], None]) -> None:
    """Have :func:`released` call ``tell`` (once): the executor's worker sets it before its unit runs."""
    _RELEASED[:] = [tell]


def released() -> None:
    """Tell the executor that this worker holds nothing of the run any more: every shard it was given is
    committed, its reader processes told to end and their shared memory unlinked. What the unit does after it (a GPU
    worker's decoders closing: 0.3-0.4 s on an H200, profiled) may be cut short, since the process is
    ended once every task is done. Once; nothing where no executor listens (Ray's actors)."""
    while _RELEASED:
        _RELEASED.pop()()


class Committer:
    """Commits a worker's shards in a thread of their own, one at a time and in order: a shard's fsyncs,
    renames and journal entry overlap the writing of the next (the fsyncs wait on the disk, not the
    CPU), and ``done`` hears of each once committed. At most ``depth`` commits wait: :meth:`submit` holds
    until the oldest is done, and raises its error; :meth:`close` waits for the last. The time
    :meth:`submit` held goes into the submitted shard's timings as ``commit_wait``. A commit given ``after``
    (the futures of its shard's writes, in a :class:`ShardWriter`'s lane) waits for them first, and fails where
    any of them did, or where ``check`` (called then) raises.

    More commits waiting did not help where this one waits: pass-through to TFRecord and LMDB on the 2-core
    CI machine, three waiting, ran 2.83-3.55 s against 2.90-3.20 and 3.85-7.10 s against 2.92-3.16 (in turn,
    2026-12-03; the disk is their bound), and the GPU audio unit's writer never waited on a commit (H200).
    """

    def __init__(self, depth: int = 1) -> None:
        import collections
        import concurrent.futures

        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpubatch-commit")
        self._waiting: collections.deque = collections.deque()
        self.depth = max(1, depth)

    def _wait(self, keep: int = 0) -> None:
        while len(self._waiting) > keep:
            self._waiting.popleft().result()

    def submit(self, writing: ShardWriting, done: Callable[[ShardResult], None], timings: dict | None = None,
               extra: dict | None = None, after: Iterable[Any] = (), check: Callable[[], None] | None = None) -> None:
        t = time.perf_counter()
        self._wait(self.depth - 1)
        timings = {**(timings or {}), "commit_wait": time.perf_counter() - t}

        def commit() -> None:
            for write in after:
                write.result()  # (its shard's writes; their error is the commit's)
            if check is not None:
                check()
            done(finish(writing, timings, extra))

        self._waiting.append(self._pool.submit(commit))

    def close(self, failed: bool = False) -> None:
        """Wait for the last commit (its error raised, unless the worker is failing already)."""
        try:
            if failed:
                with contextlib.suppress(BaseException):
                    self._wait()
            else:
                self._wait()
        finally:
            self._pool.shutdown(wait=True)


def run_shard(task: ShardTask, ctx: RunContext, unit: Any = None, reader: Any = None,
              progress: Callable[[int], None] | None = None) -> ShardResult:
    """Run one shard task to its committed shard and journal entry, with ``unit`` (by default the one the
    strategy table picks for the run, made here) reading through ``reader`` (by default opened here)."""
    from .strategies import unit_for

    own, opened = unit is None, reader is None
    if own:
        unit = unit_for(ctx).make(ctx, 0)
    reader = reader if reader is not None else ctx.open_reader()
    try:
        results: list[ShardResult] = []
        unit.run(reader, iter([task]), lambda t: ShardWriting(t, ctx, progress), results.append)
        return results[0]
    finally:
        if own:
            unit.close()
        if opened:
            reader.close()

