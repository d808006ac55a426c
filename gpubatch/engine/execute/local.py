"""The local executor: a run's shard tasks in worker processes of this machine.

Each worker (a process started with ``spawn``, without the caller's main script) opens the source,
makes its unit once (:mod:`.strategies`), and runs the tasks it is given, each to a committed shard and
its journal entry (:func:`~.worker.finish`); it reports records as it writes them (the progress bar)
and each task's :class:`~gpubatch.types.ShardResult` when done. Workers take tasks from one queue as
they free up (CPU workers; the GPU's video and audio workers), or, where the strategy says ``dealt`` (the
GPU image unit, whose reader processes read ahead across its tasks), each gets its tasks in shard order,
dealt round robin. GPU workers run ``--gpu-procs`` a GPU on every GPU of ``--gpus``, worker k on the
k-th GPU round robin, the only GPU its process sees. Whatever order tasks finish in, their shards are
the same: their names and bytes follow from the plan. A run of one CPU worker runs in this process. Workers end with this process (Linux's
parent-death signal): a run killed with ``kill -9`` leaves no worker writing behind it.

A worker process starts in :func:`.boot.boot`, which begins its GPU's start before it unpickles its run,
sent as bytes on a queue of its own (:class:`Started`); the ``gpubatch`` command starts a run's workers at its
first line (:func:`.early.sniff`), else a GPU run's are started before the run is planned, the others with its
tasks.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from ...errors import GpubatchError
from ...types import ShardResult, ShardTask
from ..processes import died, leave_dying
from .boot import new_slots
from .strategies import Strategy
from .worker import RunContext, ShardWriting


def run_tasks(ctx: RunContext, strategy: Strategy, tasks: list[ShardTask], workers: int,
              on_result: Callable[[ShardResult], None], on_progress: Callable[[int], None] | None = None,
              started: Started | None = None) -> dict:
    """Run ``tasks`` on ``workers`` workers with ``strategy``'s unit; ``on_result`` gets each committed
    shard's result as it comes (any order). Returns wall times: start (to the first shard committed), last
    (to the last one committed) and the whole (what lies after the last commit: the workers' end). Raises the
    first worker's failure (a record under ``--on-error fail``, an error, a crash)."""
    t0 = time.perf_counter()
    first: list[float] = []
    last = [0.0]

    def got(result: ShardResult) -> None:
        last[0] = time.perf_counter() - t0
        if not first:
            first.append(last[0])
        on_result(result)

    if not tasks:
        return {"start": 0.0, "run": 0.0}
    if workers <= 1 and not strategy.gpu:  # in this process: no start-up to pay
        unit = strategy.make(ctx, 0)
        reader = ctx.open_reader()
        try:
            unit.run(reader, iter(tasks), lambda t: ShardWriting(t, ctx, on_progress), got)
        finally:
            unit.close()
            reader.close()
        return {"start": first[0] if first else 0.0, "last": last[0], "run": time.perf_counter() - t0}
    spawned, released = _in_processes(ctx, strategy, tasks, workers, got, on_progress, started)
    return {"start": first[0] if first else 0.0, "last": last[0], "run": time.perf_counter() - t0, "spawned": spawned,
            "released": None if released is None else released - t0}


class Started:
    """A run's worker processes, each waiting for its run (the context and strategy, as bytes) on a queue of
    its own; :meth:`close` ends those never given one. A GPU run's are started before the run is planned, so
    that their GPUs' start (the boot's, :mod:`.boot`) runs while this process lists the source and plans the
    shards (``ctx``: what is known then: the device, the settings, ``gpu_procs``, ``gpu_memory``; ``workers``:
    as many as the run can take, ``gpu_procs`` a GPU); other runs' with their tasks (:func:`_in_processes`)."""

    def __init__(self, ctx: RunContext, strategy: Strategy, workers: int):
        import multiprocessing as mp

        self.strategy, self.taken, self.used = strategy, False, 0  # (used: how many a run took)
        self.results = mp.get_context("spawn").Queue()
        self.boots = boots(ctx, strategy, 0, workers)
        self.setups, self.tasks, self.procs = new_slots(self.boots, strategy.dealt, self.results)
        self.at = time.time()  # (when the last was started)

    @classmethod
    def taking(cls, strategy: Strategy, begun: list[tuple[Any, dict[str, str]]], sniffed: Any) -> Started:
        """The processes :func:`.early.sniff` started at the command's start (``sniffed``: its queues and
        processes, a slot each, their tasks dealt) as a run's whose slots begin ``begun`` (:func:`boots`)."""
        self = cls.__new__(cls)
        self.strategy, self.taken, self.used = strategy, False, 0
        self.results, self.setups, self.tasks = sniffed.results, sniffed.setups, sniffed.tasks
        self.boots, self.procs, self.at = list(begun), sniffed.procs, sniffed.at
        return self

    def fits(self, ctx: RunContext, strategy: Strategy, workers: int) -> bool:
        """Whether these processes, started before the run knew its device and media (``execute.early.prestart``),
        began what a run of ``ctx`` and ``strategy`` on ``workers`` processes would have them begin: the same
        strategy, and each slot the same GPU start in the same environment."""
        return (not self.taken and strategy == self.strategy and len(self.procs) == workers
                and boots(ctx, strategy, 0, workers) == self.boots)

    def grow(self, ctx: RunContext, workers: int) -> None:
        """Processes started for slots ``len(procs)`` to ``workers - 1`` beside those started early: a run
        that proved long enough for more processes a GPU than the start knew of (``Strategy.long_run``)."""
        first, more = len(self.procs), workers - len(self.procs)
        more_boots = boots(ctx, self.strategy, first, more)
        setups, tasks, procs = new_slots(more_boots, self.strategy.dealt, self.results, first, self.tasks[0])
        self.procs += procs
        self.boots += more_boots
        self.setups += setups
        self.tasks += tasks
        self.at = time.time()

    def close(self) -> None:
        """End the processes no run was given to; nothing once taken. They hold nothing of a run, and may be in
        the midst of their GPU's start (``nvjpegCreateEx`` alone takes 0.5 s), which an exit of their own would
        wait for: they are terminated at once."""
        if self.taken:
            return
        self.taken = True
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=5)
        for q in {*self.setups, *self.tasks, self.results}:
            q.cancel_join_thread()
            q.close()


def boots(ctx: RunContext, strategy: Strategy, first: int, count: int) -> list[tuple[Any, dict[str, str]]]:
    """What the processes of slots ``first`` to ``first + count - 1`` begin with: (the GPU start their boot
    begins, or None; their environment: their GPU, where the run has several, the only one each sees)."""
    from ..gpu import start as gpu_start

    out = []
    for k in range(first, first + count):
        mine, env = ctx.for_slot(k)
        out.append((gpu_start.early(strategy.start, mine) if strategy.start else None, env))
    return out


def _payload(ctx: RunContext, strategy: Strategy, slot: int) -> bytes:
    """Worker ``slot``'s run as bytes: a GPU worker begins its GPU's start before it imports what they need
    (boot.py)."""
    import pickle

    from ..processes import detached_main

    with detached_main():  # (an object of the caller's script: one clear error)
        return pickle.dumps((ctx.for_slot(slot)[0], strategy))


def _in_processes(ctx: RunContext, strategy: Strategy, tasks: list[ShardTask], workers: int,
                  on_result: Callable[[ShardResult], None], on_progress: Callable[[int], None] | None,
                  started: Started | None = None) -> tuple[float, float | None]:
    """The tasks in ``workers`` processes (those ``started`` already, where it has as many for this
    strategy); returns when their last process was started, in seconds from the run's start
    (``ctx.started``; from this call where it has none), and when the last of them said it was done
    (``time.perf_counter()``; None where the run failed first)."""
    t_called = time.time()
    if started is None or started.taken or started.strategy != strategy:
        if started is not None:
            started.close()
        started = Started(ctx, strategy, workers)  # (none started before the plan, or not these: started now)
    elif len(started.procs) < workers:  # (the early ones keep their start; the others begin theirs now)
        started.grow(ctx, workers)
    try:
        runs = [_payload(ctx, strategy, k) for k in range(workers)]
    except BaseException:  # (an object of the caller's script: the processes end, the error is the run's)
        started.close()
        raise
    started.taken, started.used = True, workers
    results, queues = started.results, started.tasks[:workers]
    spare = started.procs[workers:]
    for q in started.setups[workers:]:  # (fewer tasks than processes: the rest end)
        q.put(None)
    for q, run in zip(started.setups, runs):
        q.put(run)
    procs = started.procs[:workers]
    spawned = started.at - (ctx.started or t_called)
    queues_all = [*queues, *started.setups, *started.tasks[workers:]]
    if strategy.dealt:  # a worker's tasks in shard order, given up front (its feed reads ahead across them)
        for task in tasks:
            queues[task.index % workers].put(task)
        for q in queues:
            q.put(None)
    else:  # one queue: a worker (a CPU's, a GPU's for video or audio) takes the next task as it frees up
        for task in tasks:
            queues[0].put(task)
        for _ in range(workers):
            queues[0].put(None)
    left, running = len(tasks), workers
    released = None  # (when the last worker said it holds nothing of the run any more)
    try:
        while left or running:
            try:
                msg = results.get(timeout=1.0)
            except queue.Empty:
                dead = [(k, p) for k, p in enumerate(procs) if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    k, p = dead[0]
                    raise GpubatchError(f"worker process {k} ended unexpectedly ({died(p.exitcode)})") from None
                continue
            kind = msg[0]
            if kind == "progress":
                if on_progress is not None:
                    on_progress(msg[1], msg[2]) if msg[2] is not None else on_progress(msg[1])
            elif kind == "done":
                left -= 1
                on_result(msg[1])
            elif kind == "exit":
                running -= 1
                if not running:
                    released = time.perf_counter()
            else:
                _, how, what = msg
                if how == "record":
                    raise what
                if how == "error":
                    raise GpubatchError(what)
                if how == "oserror":  # (raised as in one process: the run says which write failed, in one line)
                    code, text, filename = what
                    raise (OSError(code, text, filename) if filename is not None else OSError(code, text)) from None
                raise GpubatchError(f"a worker process failed:\n{what}")
    finally:
        if not left and not running:  # every shard committed, every worker released: none is waited for
            leave_dying(procs + spare)
        else:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs + spare:
                p.join(timeout=10)
        for q in set(queues_all):  # (tasks no worker took: this process must not wait at its exit to send them)
            q.cancel_join_thread()
            q.close()
        results.close()
        results.join_thread()
    return spawned, released
