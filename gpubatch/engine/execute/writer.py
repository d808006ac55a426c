"""The GPU units' shard writer in a process of its own: the worker's GIL left to the loop that feeds the GPU.

A GPU worker's loop hands each batch's outputs to a shard writer, which writes them into their shards and
commits each shard in order (:class:`~.worker.ShardWriter`, a thread of the worker). On an H200 host
(2026-12-02, 65,536 JPEGs of the GPU transcode) one worker process wrote 6,500 images/s with neither its
CPU share nor the GPU saturated, and two processes on the one GPU 1.3x that: the writer thread's
per-record Python (tar headers, the sink's checks, the writes) shares the worker's GIL with the loop.
:class:`ShardWriterProcess` keeps the same contract with the writing in a spawned process: the loop's
records travel over a pipe (pickled in a sender thread; the writes of the pipe release the GIL), and the
process writes and commits the shards with the same :class:`~.worker.ShardWriting` and
:class:`~.worker.Committer` as the thread, so the files, the journal and the results are the same.

In the worker, a shard is the :class:`~.worker.ShardWriting` that the executor's ``writing(task)`` made,
as with the thread; here it is only a handle (its task, its stats, its progress), its sink never
opened: the loop's counts go with the shard's commit (:func:`~.worker.stats_part`), an augment run's
drawn parameters with the records they belong to. ``done`` hears of each shard committed, in order,
from a thread that reads the process's replies (progress, done, an error, the end).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import GpubatchError
from ..processes import died, leave_dying
from .worker import Committer, RunContext, ShardWriter, ShardWriting, merge_part, stats_part

#: batches handed over and not yet sent to the writer process (the loop waits beyond them), and batches
#: received there and not yet written
DEPTH = 4


def shard_writer(ctx: RunContext, done: Callable[[Any], None], auto: str = "process",
                 lanes: int = 1) -> ShardWriter | ShardWriterProcess:
    """The writer a GPU unit's shards go through: a process of its own (``settings.shard_writer``
    "process"), or a thread of the worker ("thread"); ``auto`` is the unit's choice where the setting
    is "auto", ``lanes`` its choice of shards a thread writes at once where ``settings.write_lanes`` is 0."""
    if (auto if ctx.settings.shard_writer == "auto" else ctx.settings.shard_writer) == "process":
        return ShardWriterProcess(ctx, done)
    return ShardWriter(done, lanes=ctx.settings.write_lanes or lanes)


class ShardWriterProcess:
    """:class:`~.worker.ShardWriter`'s contract (``put``, ``commit``, ``close``) with the shards written
    and committed in a spawned process (see the module's text). What :meth:`put` hands over is a list
    of records, or a picklable function of the shard's stats that makes them there (their encoding)."""

    def __init__(self, ctx: RunContext, done: Callable[[Any], None]):
        import multiprocessing as mp
        import signal

        from ..processes import detached_main

        self.done = done
        spawn = mp.get_context("spawn")
        self.conn, child = spawn.Pipe()
        # Ctrl-C is the worker's to handle (it closes this writer): the process is started ignoring it, so
        # that it does not stop while it starts (Python keeps an ignored SIGINT ignored)
        try:
            before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # (not the main thread: the process ignores it once it runs)
            before = None
        try:
            with detached_main():  # (the process does not import the caller's main script)
                self.proc = spawn.Process(target=_serve, args=(child, ctx), daemon=True, name="gpubatch-shard-writer")
                self.proc.start()
        finally:
            if before is not None:
                signal.signal(signal.SIGINT, before)
        child.close()
        self.error: BaseException | None = None
        self.handles: dict[int, ShardWriting] = {}  # task index -> the loop's shard, until it is committed
        self._closed = threading.Event()  # the process said it ended
        self.q: queue.Queue = queue.Queue(maxsize=DEPTH)
        self.sender = threading.Thread(target=self._send, name="gpubatch-shard-sender", daemon=True)
        self.receiver = threading.Thread(target=self._receive, name="gpubatch-shard-replies", daemon=True)
        self.sender.start()
        self.receiver.start()

    # -- the loop's side ----------------------------------------------------------------------------------

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _task(self, shard: ShardWriting) -> Any:
        """The shard's task the first time the process hears of it (None after: a shard is handed over
        until its commit, and leaves ``handles`` only once committed)."""
        idx = shard.task.index
        if idx in self.handles:
            return None
        self.handles[idx] = shard
        return shard.task

    def put(self, shard: ShardWriting, records: list | Callable[[Any], list]) -> None:
        self._check()
        drawn = dict(shard.stats.drawn)  # (an augment run's parameters go with their records)
        shard.stats.drawn.clear()
        self.q.put(("put", shard.task.index, self._task(shard), records, drawn))

    def commit(self, shard: ShardWriting, timings: dict, extra: dict | None) -> None:
        self._check()
        part = stats_part(shard.stats)
        self.q.put(("commit", shard.task.index, self._task(shard), timings, extra, part))

    def close(self, abort: Any = None, failed: bool = False) -> None:
        """Wait for every hand-over to be written and committed (and ``abort``, a shard left unfinished,
        removed; on a ``failed`` run every shard handed over and not committed is, and no error of the
        writer's raised)."""
        if abort is not None:
            self.q.put(("abort", abort.task.index))
        self.q.put(("close", failed or abort is not None))
        self.q.put(None)
        self.sender.join()
        self.receiver.join()
        if self._closed.is_set() and abort is None and not failed:  # (it said so: nothing of the run is left
            leave_dying([self.proc])  # in it, and its exit is not waited for)
        else:
            self.proc.join()
        if abort is None and not failed:
            self._check()

    def _send(self) -> None:
        broken = False
        while True:
            msg = self.q.get()
            if msg is None:
                break
            if broken:
                continue  # (drained: the loop raises the error at its next hand-over)
            try:
                self.conn.send(msg)
            except (OSError, ValueError) as e:  # the process is gone (its reader says why, where it can)
                broken = True
                self.error = self.error or GpubatchError(f"the shard writer process stopped: {e}")
            except Exception as e:  # noqa: BLE001 - a payload that does not pickle: the loop raises it
                broken = True
                self.error = self.error or e
                try:  # (the process removes what it did not commit, and ends)
                    self.conn.send(("close", True))
                except (OSError, ValueError):
                    pass

    def _receive(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                if not self._closed.is_set():
                    self.error = self.error or GpubatchError(
                        f"the shard writer process ended unexpectedly ({died(self.proc.exitcode)})")
                return
            kind = msg[0]
            if kind == "progress":
                shard = self.handles.get(msg[1])
                if shard is not None and shard.progress is not None:
                    shard.progress(msg[2])
            elif kind == "done":
                self.handles.pop(msg[1], None)
                try:
                    self.done(msg[2])
                except BaseException as e:  # noqa: BLE001 - raised in the loop
                    self.error = self.error or e
            elif kind == "error":
                self.error = self.error or msg[1]
            elif kind == "closed":
                self._closed.set()
                return


# -- the writer process's side --------------------------------------------------------------------------


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling, else a GpubatchError that says what it was."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - its text then
        return GpubatchError(f"{type(e).__name__}: {e}")


def _serve(conn: Any, ctx: RunContext) -> None:
    """The writer process: the shards' records written in order as they come, each shard committed (its
    fsyncs and renames in a committer's thread, beside the next shard's writes) and reported done."""
    import signal

    from ..processes import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (as it was started: Ctrl-C is the worker's to handle)
    inbox: queue.Queue = queue.Queue(maxsize=DEPTH)
    sending = threading.Lock()

    def send(msg: tuple) -> None:
        with sending:
            try:
                conn.send(msg)
            except (OSError, ValueError):  # (the worker is gone: nothing to tell)
                pass

    def receive() -> None:  # the pipe read beside the writes: the worker's sender does not wait on them
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("close", True)  # (the worker is gone: what is not committed goes)
            inbox.put(msg)
            if msg[0] == "close":
                return

    threading.Thread(target=receive, name="gpubatch-shard-inbox", daemon=True).start()
    shards: dict[int, ShardWriting] = {}
    committed: set[int] = set()
    commits = Committer()
    error: BaseException | None = None
    failed = False

    def shard_of(idx: int, task: Any) -> ShardWriting:
        w = shards.get(idx)
        if w is None:
            w = shards[idx] = ShardWriting(task, ctx, lambda n: send(("progress", idx, n)))
        return w

    def committed_one(idx: int, result: Any) -> None:
        committed.add(idx)
        send(("done", idx, result))

    idle = 0.0  # waiting for the worker's hand-overs since the last commit (the shard's "writer_idle")
    while True:
        t = time.perf_counter()
        msg = inbox.get()
        idle += time.perf_counter() - t
        kind = msg[0]
        if kind == "close":
            failed = failed or bool(msg[1])
            break
        if error is not None:
            continue  # (drained: the worker raises the error)
        try:
            if kind == "put":
                _, idx, task, payload, drawn = msg
                w = shard_of(idx, task)
                w.stats.drawn.update(drawn)
                w.put_many(list(payload(w.stats) if callable(payload) else payload))
            elif kind == "commit":
                _, idx, task, timings, extra, part = msg
                w = shard_of(idx, task)
                merge_part(w.stats, part)
                timings, idle = {**(timings or {}), "writer_idle": idle}, 0.0
                commits.submit(w, lambda r, i=idx: committed_one(i, r), timings, extra)
            elif kind == "abort":
                failed = True
        except BaseException as e:  # noqa: BLE001 - the worker raises it
            error = e
            send(("error", _portable(e)))
    try:
        commits.close(failed=failed or error is not None)
    except BaseException as e:  # noqa: BLE001 - the worker raises it
        if error is None:
            send(("error", _portable(e)))
        error = error or e
    for idx, w in shards.items():  # (a run that failed or stopped: the partial files of the rest go)
        if idx not in committed:
            try:
                w.abort()
            except OSError:
                pass
    send(("closed",))
    conn.close()
