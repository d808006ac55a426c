"""Work units for the Ray executor's tests, imported by Ray's worker processes (the tests' working folder
is on their path): the host unit, with its process killed once in the middle of a shard."""

from __future__ import annotations

import os
from pathlib import Path

from gpubatch.engine.execute.units import HostUnit

#: the shard whose first attempt dies, and after how many of its outputs
KILL_SHARD, KILL_AFTER = 2, 3


class KillOnceUnit(HostUnit):
    """The host unit; the first process to reach the middle of shard :data:`KILL_SHARD` ends itself there
    (``os._exit``, as a lost node or an OOM kill ends it: nothing is cleaned up), leaving a mark in the
    staging folder so that the retry runs through."""

    def run(self, reader, tasks, writing, done):
        mark = Path(self.ctx.stage) / ".gpubatch" / "killed-once"

        def fragile(task):
            w = writing(task)
            if task.index != KILL_SHARD or mark.exists():
                return w
            put_many = w.put_many

            def put_then_die(results, n=[0]):  # noqa: B006 - a counter of this shard's outputs
                for result in results:  # (put is a batch of one: every output comes through here)
                    put_many([result])
                    n[0] += 1
                    if n[0] == KILL_AFTER:
                        mark.write_text(str(os.getpid()))
                        os._exit(1)

            w.put_many = put_then_die
            return w

        super().run(reader, tasks, fragile, done)


class FullDiskUnit(HostUnit):
    """The host unit whose shard 1 meets a full disk as it is written (ENOSPC, as a write raises it)."""

    def run(self, reader, tasks, writing, done):
        import errno

        def full(task):
            w = writing(task)
            if task.index == 1:
                def put_many(results):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(self.ctx.stage) / task.name))

                w.put_many = put_many
            return w

        super().run(reader, tasks, full, done)
