"""A run's audio records read and decoded in processes of their own for the GPU audio unit (``convert`` and
``augment``): :class:`RecordDecoders`, each process with the run's reader and plan, every entry's
outputs (its records, errors and ``(job, decoded audio)`` pairs, the parameters drawn as the CPU path
draws them) in the tasks' order; the decoded samples come back through shared memory
(:func:`_share`), and :func:`batched` cuts them into batches of one shard each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ...errors import RecordError, RunStats, Stage
from ...types import Record
from ..codecs.audio_io import AudioData
from ..media import HOST, get_codec
from ..plan import Plan
from ..run import Job, RecordSource, outputs_of, read_counted

_DECODER: dict[str, Any] = {}  # in a decoding process: the run's reader and plan
_W: dict[str, Any] = {}  # in a decoding process its worker's boot started: the barrier its first task waits on

#: seconds a decoding process started at its worker's boot waits for the others to take their first task
ATTACH_TIMEOUT = 300.0


def preload() -> None:
    """What a decoding process runs, imported before its run comes (one its worker's boot started:
    :mod:`.feed_start`, kind "audio")."""
    from .. import executor  # noqa: F401
    from ..codecs import audio, audio_io, audio_stream  # noqa: F401
    from ..execute import worker  # noqa: F401

    for name in ("soundfile", "soxr"):  # (the decode's and the resampler's libraries, where installed)
        try:
            __import__(name)
        except ImportError:
            pass


def _packed(record: Record, plan: Plan) -> AudioData | None:
    """A FLAC record's bytes placed for the GPU's decoder (:func:`~..codecs.flac_gpu.pack`: its frames found,
    nothing decoded, no header probe), or None where that path does not take it (decoded here then, as the CPU
    path decodes it); its error as the CPU path gives it (more samples than one record may hold)."""
    from ..codecs.audio_io import DEFAULT_MAX_SAMPLES, leading_seconds
    from ..codecs.flac_gpu import pack

    ops = getattr(plan, "ops", ())
    try:
        return pack(record.data, leading_seconds(ops), getattr(plan, "max_samples", DEFAULT_MAX_SAMPLES), record.key,
                    record.origin, ops)
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None


def _prepare(record: Record, plan: Plan, stats: RunStats,
             packed: bool = False) -> list[Record | RecordError | tuple[Job, AudioData]]:
    """A record's outputs: pass-throughs and errors as they are, each job with its decoded audio (``packed``:
    FLAC's bytes placed for the GPU's decoder, :func:`_packed`) and its parameters drawn (the same draws as the
    CPU path). A long record whose chain streams (:mod:`.codecs.audio_stream`) is run on the CPU a block at a
    time here, whole outputs, counted: a batch on the GPU would hold all of it."""
    from ..codecs.audio_stream import AudioStream
    from ..executor import expand_host

    codec = get_codec(record.media, record.codec, HOST)
    pre: AudioData | RecordError | None = None
    if packed and record.codec == "flac":  # (FLAC for the GPU's decoder: its frames found, not decoded)
        try:
            pre = _packed(record, plan)
        except RecordError as e:
            pre = e
    if pre is None and record.codec != "npy":
        try:
            if isinstance(codec.decode_lazy(record, plan), AudioStream):
                outs = expand_host(record, plan, stats)
                stats.add(fallbacks=sum(1 for o in outs if not isinstance(o, RecordError)))
                return outs
        except RecordError:
            pass  # (its error comes below, where the record is decoded)
    out: list[Any] = []
    decoded = None
    for job in outputs_of(record, plan, stats):
        if not isinstance(job, Job):
            out.append(job)
            continue
        try:
            if decoded is None:
                if isinstance(pre, RecordError):
                    raise pre
                decoded = pre if pre is not None else codec.decode(record, plan)
            job.settle(plan, *codec.size(decoded))
        except RecordError as e:
            out.append(e)
            if e.stage is Stage.DECODE:
                break
            continue
        except Exception as e:  # noqa: BLE001 - the record boundary
            out.append(RecordError(record.key, record.origin, Stage.TRANSFORM, str(e)))
            continue
        out.append((job, decoded))
    return out


def prepare_entry(reader: RecordSource, entry: Any, plan: Plan, stats: RunStats, packed: bool = False) -> list[Any]:
    """What one entry becomes before the GPU: its read error, a non-audio record run on the CPU, or
    :func:`_prepare`'s outputs (``packed``: FLAC's bytes for the GPU's decoder)."""
    from ..executor import expand_host

    record = read_counted(reader, entry, stats)
    if isinstance(record, RecordError):
        return [record]
    if str(getattr(record.media, "value", record.media)) != "audio":
        return expand_host(record, plan, stats)
    return _prepare(record, plan, stats, packed)


def _decoder_start(ctx: Any) -> None:
    from ..processes import die_with_parent

    die_with_parent()
    _DECODER["reader"] = ctx.open_reader()
    _DECODER["plan"] = ctx.plan
    _DECODER["packed"] = bool(getattr(getattr(ctx, "settings", None), "flac_gpu", False))


def _prestarted_start(ctx: Any, attached: Any = None) -> None:
    """The first task of a decoding process its worker's boot started: the run's reader and plan
    (:func:`_decoder_start`), then the barrier the pool's processes share (none takes a second first task)."""
    _decoder_start(ctx)
    if attached is not None:
        attached.wait(ATTACH_TIMEOUT)


#: a decoding process's samples of one call go back through shared memory from this many bytes (fewer
#: are pickled with the rest of its result)
SHARE_FROM = 64 << 10
#: where the shared samples lie: a tmpfs file a call (Linux's ``/dev/shm``), named by the consumer's pid
SHM_DIR = "/dev/shm"
_SHM_PREFIX = "gpubatch-audio-"
_SHARED_CALLS = [0]  # (in a decoding process: the calls that shared their samples, for the names)


class Shared(NamedTuple):
    """Where a decoded record's samples lie in its call's shared file (in place of the array, between a
    decoding process and the unit)."""

    name: str
    offset: int
    shape: tuple
    dtype: str


def _share(out: list[tuple[list, dict]]) -> list[tuple[list, dict]]:
    """In a decoding process: the samples of ``out``'s decoded records written into one file of
    :data:`SHM_DIR` (one ``pwrite`` each, no pickling), each replaced by where it lies (:class:`Shared`);
    ``out`` as it is where they are few or the file cannot be made (no ``/dev/shm``, or no room in it:
    the pipe then carries them). A run's decoded 10-s clips through the pool's pipe were the GPU audio
    unit's bound: 640 KB each received 64 KB a call by one thread of the GPU's process, beside its loop."""
    import os

    decoded: dict[int, Any] = {}
    for outs, _ in out:
        for o in outs:
            if isinstance(o, tuple) and _payload(o[1]) is not None:
                decoded.setdefault(id(o[1]), o[1])
    if sum(_payload(d).nbytes for d in decoded.values()) < SHARE_FROM:
        return out
    _SHARED_CALLS[0] += 1
    name = f"{_SHM_PREFIX}{os.getppid()}-{os.getpid()}-{_SHARED_CALLS[0]}"
    path = os.path.join(SHM_DIR, name)
    placed: dict[int, Any] = {}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return out
    try:
        at = 0
        for key, d in decoded.items():
            a = np.ascontiguousarray(_payload(d))
            if os.pwrite(fd, memoryview(a).cast("B"), at) != a.nbytes:
                raise OSError("a short write")
            placed[key] = _placed(d, Shared(name, at, a.shape, a.dtype.str))
            at += -(-a.nbytes // 64) * 64
    except OSError:  # (no room left in /dev/shm: these go through the pipe)
        os.close(fd)
        os.unlink(path)
        return out
    os.close(fd)
    return [([(o[0], placed[id(o[1])]) if isinstance(o, tuple) and id(o[1]) in placed else o for o in outs], c)
            for outs, c in out]


def _carried(d: Any) -> Any:
    """What of a decoded record goes between processes: its samples, or a FLAC record's bytes placed for the GPU
    (:class:`~..codecs.flac_gpu.FlacPacked`): an array, or where it lies in a shared file (:class:`Shared`)."""
    from ..codecs.flac_gpu import FlacPacked

    s = getattr(d, "samples", None)
    return s.data if isinstance(s, FlacPacked) else s


def _payload(d: Any) -> np.ndarray | None:
    """:func:`_carried` where it is still an array (to go through shared memory), else None."""
    s = _carried(d)
    return s if isinstance(s, np.ndarray) else None


def _placed(d: AudioData, where: Any) -> AudioData:
    """``d`` with what it carries (:func:`_carried`) replaced by ``where``."""
    from ..codecs.flac_gpu import FlacPacked

    if isinstance(d.samples, FlacPacked):
        return d._replace(samples=d.samples._replace(data=where))
    return d._replace(samples=where)


def shared_of(d: Any) -> Shared | None:
    """Where a decoded record's samples (or FLAC bytes) lie in a shared file, None where they are in memory."""
    s = _carried(d)
    return s if isinstance(s, Shared) else None


def _is_shared(o: Any) -> bool:
    """Whether an output is a ``(job, audio)`` pair whose samples lie in a shared file (an output the GPU
    failed on and the CPU too is ``(job, RecordError)``)."""
    return isinstance(o, tuple) and shared_of(o[1]) is not None


def _names(got: list[tuple[list, dict]]) -> set[str]:
    return {shared_of(o[1]).name for outs, _ in got for o in outs  # type: ignore[union-attr]
            if _is_shared(o)}


def share_items(items: list[Any], names: set[str]) -> list[Any]:
    """A shard's outputs (``(job, audio)`` pairs, records, errors) with the samples of their audio in one file
    of :data:`SHM_DIR` (:func:`_share`), for a shard writer in a process of its own; the file's name added
    to ``names``."""
    got = _share([(items, None)])
    names |= _names(got)
    return got[0][0]


def unshare_items(items: list[Any]) -> list[Any]:
    """:func:`share_items`'s outputs with their samples as arrays of their own again, read from the file
    (:meth:`SharedFiles.read`; its name removed as it is read); ``items`` as they are where none was shared."""
    if not any(_is_shared(o) for o in items):
        return items
    files = SharedFiles()
    files.taken([(items, None)])
    try:
        return [(o[0], files.read(o[1])) if _is_shared(o) else o for o in items]
    finally:
        files.close()


def unlink_shared(names: set[str]) -> None:
    """The shared files ``names`` removed where they are still there (handed over, or decoded, and never
    taken: a run that stopped)."""
    import os

    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass
    names.clear()


def decode_entries(entries: list[Any]) -> list[tuple[list, dict]]:
    """In a decoding process: per entry, what it becomes before the GPU (:func:`prepare_entry`:
    its records, errors and ``(job, decoded audio)`` pairs) and what was counted of it; the decoded
    samples in shared memory (:func:`_share`)."""
    import time

    from ...errors import RunStats
    from ..execute.worker import stats_part

    reader, plan = _DECODER["reader"], _DECODER["plan"]
    out = []
    for entry in entries:
        stats = RunStats()
        t0 = time.perf_counter()
        outs = prepare_entry(reader, entry, plan, stats, _DECODER.get("packed", False))
        stats.timed("decode (processes)", time.perf_counter() - t0)
        out.append((outs, stats_part(stats)))
    return _share(out)


class SharedFiles:
    """The shared files of a run's decoding calls taken by the unit and not yet read (:class:`Shared`
    samples): :meth:`read_into` reads a record's samples from its file straight into the caller's buffer
    (one ``preadv``: no mapping of the file, whose pages were read in one by one, and no copy of it after),
    the file's name removed as it is first opened, the file closed once its last record is read;
    :meth:`close` removes what was taken and never read (a run that stopped)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.files: dict[str, list] = {}  # name -> [open descriptor or None, records still to read]

    def taken(self, got: list[tuple[list, dict]]) -> None:
        """A call's result is taken: its shared records are to be read (each output's once)."""
        with self.lock:
            for outs, _ in got:
                for o in outs:
                    if _is_shared(o):
                        self.files.setdefault(shared_of(o[1]).name, [None, 0])[1] += 1  # type: ignore[union-attr]

    def read_into(self, d: AudioData, out: np.ndarray) -> AudioData:
        """``d``'s shared samples (or FLAC bytes) read into ``out`` (a flat array of as many, cast where its type
        is not theirs), ``d`` with them in its shape."""
        import os

        s = shared_of(d)
        assert s is not None
        with self.lock:
            entry = self.files[s.name]
            if entry[0] is None:
                entry[0] = os.open(os.path.join(SHM_DIR, s.name), os.O_RDONLY)
                os.unlink(os.path.join(SHM_DIR, s.name))  # (its memory goes with the descriptor)
            fd = entry[0]
        try:
            dtype = np.dtype(s.dtype)
            into = out if dtype == out.dtype else np.empty(out.size, dtype)
            view, at = memoryview(into).cast("B"), s.offset
            while len(view):
                n = os.preadv(fd, [view], at)
                if n <= 0:
                    raise OSError(f"a shared file of decoded samples ended early ({s.name})")
                view, at = view[n:], at + n
            if into is not out:
                out[...] = into
        finally:
            with self.lock:
                entry[1] -= 1
                if entry[1] <= 0:
                    os.close(fd)
                    del self.files[s.name]
        return _placed(d, out.reshape(s.shape))

    def read(self, d: AudioData) -> AudioData:
        """``d``'s shared samples (or FLAC bytes) read into an array of their own (of their type)."""
        s = shared_of(d)
        assert s is not None
        return self.read_into(d, np.empty(int(np.prod(s.shape)), np.dtype(s.dtype)))

    def close(self) -> None:
        import os

        with self.lock:
            for fd, _ in self.files.values():
                if fd is not None:  # (opened: its name is gone already)
                    os.close(fd)
            unlink_shared({name for name, (fd, _) in self.files.items() if fd is None})
            self.files.clear()


class _Call:
    """A decoding call's future as :func:`~..execute.worker.ordered_across` takes it: its result, its shared
    samples left in their file (:class:`Shared`; ``files`` reads them)."""

    def __init__(self, future: Any, files: SharedFiles):
        self.future, self.files, self.taken = future, files, False

    def result(self) -> list[tuple[list, dict]]:
        got = self.future.result()
        self.taken = True
        self.files.taken(got)
        return got

    def cancel(self) -> bool:
        return self.future.cancel()

    def drop(self) -> None:
        """The shared files of a result nobody took (a run that stopped early) removed."""
        f = self.future
        if self.taken or not f.done() or f.cancelled() or f.exception() is not None:
            return
        unlink_shared(_names(f.result()))


#: a shared file is swept only past this age (a run takes its files within seconds): where ``/dev/shm`` is
#: shared with processes that another PID namespace numbers (containers given the host's IPC), a live run's
#: process can look gone from here
SWEEP_AFTER_S = 600.0


def sweep_shared() -> None:
    """The shared files left in :data:`SHM_DIR` by runs whose process is gone (killed with their decoding
    processes' results not yet taken) removed, once :data:`SWEEP_AFTER_S` old."""
    import os
    import time

    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(_SHM_PREFIX)]
    except OSError:
        return
    for n in names:
        path = os.path.join(SHM_DIR, n)
        try:
            if time.time() - os.stat(path).st_mtime < SWEEP_AFTER_S:
                continue
            os.kill(int(n[len(_SHM_PREFIX):].split("-")[0]), 0)
            continue  # (its run goes on)
        except ProcessLookupError:
            pass
        except (ValueError, OSError):  # (not a name of ours, gone already, or a process not ours to signal)
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


class RecordDecoders:
    """A run's records read and decoded in ``processes`` processes of their own, each with the run's reader
    (``ctx.opener``) and plan, ``chunk`` entries a call: :meth:`outputs` gives each entry's outputs in the
    tasks' order, with its task's shard (made by ``make``, in order) and what the process counted of it
    already added to that shard's stats. The decoded samples come back through shared memory
    (:func:`_share`)."""

    def __init__(self, ctx: Any, processes: int, chunk: int = 4):
        from ..processes import single_threaded_pool
        from . import feed_start

        sweep_shared()
        self.processes, self.chunk = max(1, processes), max(1, chunk)
        # the processes its worker's boot forked (their imports done beside the GPU's start; more than a short run
        # needs only wait), else spawned now
        taken = feed_start.taken(self.processes, (ctx,), "audio", more=True)
        self.prestarted = taken is not None
        self.pool = taken[0] if taken is not None else single_threaded_pool(self.processes, _decoder_start, (ctx,),
                                                                              wait=False)
        self.calls: list[_Call] = []
        self.files = SharedFiles()

    def _submit(self, entries: list[Any]) -> _Call:
        self.calls = [c for c in self.calls if not c.taken]
        self.calls.append(_Call(self.pool.submit(decode_entries, entries), self.files))
        return self.calls[-1]

    def outputs(self, tasks: list[Any], make: Any) -> Iterator[tuple[Any, list, bool]]:
        """``(shard, outputs of one entry, whether it is the task's last)`` in order
        (:func:`~..execute.worker.ordered_across`)."""
        from ..execute.worker import ordered_across

        # two calls a process ahead: two batches ahead (512 records) and 1,024 ran no faster (8,192 Whisper clips,
        # H100 host of 16 cores, 2026-12-06, benchmarks/RESULTS.md): the loop waited less for decoded batches and as
        # much longer in its chain, the host's cores being all busy
        return ordered_across(tasks, make, lambda entries, shard: self._submit(entries), 2 * self.processes,
                              self.chunk)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for call in self.calls:
            call.drop()
        self.calls = []
        self.files.close()


def batched(items: Iterator[tuple[Any, list, bool]], batch_size: int) -> Iterator[list[tuple[Any, list, bool]]]:
    """:meth:`RecordDecoders.outputs` in groups of one shard each, every group holding ``batch_size`` jobs
    (``(job, audio)`` pairs) or the shard's rest: a batch never spans two shards, so what the GPU makes of a
    shard does not depend on the worker that wrote it."""
    group: list = []
    jobs = 0
    for shard, outs, last in items:
        group.append((shard, outs, last))
        jobs += sum(isinstance(o, tuple) for o in outs)
        if last or jobs >= batch_size:
            yield group
            group, jobs = [], 0
    if group:
        yield group

