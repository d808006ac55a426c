"""Work units: what turns a shard task's entries into its output records, one kind per (media, device).

A unit is made once per worker (:meth:`make`), keeps what is costly to start (a CUDA context, decoders,
NVDEC sessions, reader processes) across the tasks the worker runs, and runs tasks with
``run(reader, tasks, writing, done)``: for each task, its outputs in dataset order into ``writing(task)``
(a :class:`~.worker.ShardWriting`), then ``done(result)`` once the shard is committed and journaled
(:func:`~.worker.finish`). Units for the GPU live with the GPU code (:mod:`..gpu.images`,
:mod:`..gpu.video`, :mod:`..gpu.audio`); this module holds the host unit, which every media has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ...errors import CURRENT, RecordError
from ...types import ShardResult, ShardTask
from .worker import Committer, RunContext, ShardWriting

#: a CPU worker hands its outputs to the shard's sink this many at a time, or once they hold this many bytes
PUT_RECORDS = 32
PUT_BYTES = 8 << 20


class HostUnit:
    """Every media on the CPU, one record after the other in this worker (a worker a core): read, decode,
    run the chain's host kernels, encode (:func:`~..executor.expand_host`)."""

    def __init__(self, ctx: RunContext):
        from ..media import HOST

        self.ctx = ctx
        ctx.plan.validate(HOST)

    @classmethod
    def make(cls, ctx: RunContext, slot: int) -> HostUnit:
        return cls(ctx)

    def run(self, reader: Any, tasks: Iterator[ShardTask], writing: Callable[[ShardTask], ShardWriting],
            done: Callable[[ShardResult], None]) -> None:
        from ..executor import expand_host
        from ..run import read_counted

        plan = self.ctx.plan
        commits = Committer()  # (a shard's fsyncs and renames overlap the writing of the next)
        failed = True
        try:
            for task in tasks:
                w = writing(task)
                try:
                    held: list[Any] = []  # outputs handed to the sink together (put_many), a few MiB at most
                    size = 0
                    for entry in task.entries:
                        record = read_counted(reader, entry, w.stats)
                        if isinstance(record, RecordError):
                            held.append(record)
                            continue
                        CURRENT.key = record.key  # (the record a library's warning is about)
                        for out in expand_host(record, plan, w.stats):
                            held.append(out)
                            size += 0 if isinstance(out, RecordError) else len(out.data)
                        CURRENT.key = None
                        if len(held) >= PUT_RECORDS or size >= PUT_BYTES:
                            w.put_many(held)
                            held, size = [], 0
                    w.put_many(held)
                except BaseException:
                    w.abort()
                    raise
                commits.submit(w, done)
            failed = False
        finally:
            commits.close(failed)

    def close(self) -> None:
        pass
