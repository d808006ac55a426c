"""Decoded audio for the GPU from worker processes: files through shared memory (the pipelines; a run's
records, ``convert`` and ``augment``, come through :mod:`.audio_records`), and batches put on the GPU
(:func:`to_device`, :class:`PinnedGather`).

Decoding threads in one process share its GIL: each file's Python work (opening it, the bookkeeping
around libsndfile's read) holds it, and 16 threads fed a GPU no faster than about 1,300 ten-second
clips a second on 16 cores while DALI's C++ decoders reached 3,400. Here each worker process
(:class:`DecodeWorkers`) decodes a run of files straight into a slab of shared memory
(libsndfile writes the float32 samples there: ``SoundFile.read(out=...)``), and returns only where
each file lies in it; the consumer uploads a batch's part of each slab in one host-to-device copy and
gives the slab back. The workers take their tasks from a queue the consumer fills ahead, so an idle
worker starts its next task at once: a process pool hands each over from a thread of the consumer,
which waits for the GIL while the consumer launches a batch's GPU work. A file that does not fit its slab, or that libsndfile cannot read (PyAV decodes
m4a/AAC), comes back as an array of its own.

For the GPU the slabs are page-locked (``device``): a batch's samples go up in one queued DMA per
slab into one device buffer, with no staging copy on the host and without waiting for the GPU; a slab
goes back to the workers once the GPU has read it (an event after its copy).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import RecordError, Stage
from ..codecs.audio_io import AudioData
from ..processes import died

SLAB_BYTES = 16 << 20


_ATTACHED: dict[str, Any] = {}  # in a worker: the slabs of the feed it last worked for, by name
_ATTACHED_FEED: list[str] = [""]


def _attach(name: str, feed: str) -> Any:
    """The consumer's slab, in a worker, mapped once per feed: a mapping kept between tasks spares the
    page faults of touching a fresh one (1.64 -> 1.30 ms a 10 s clip's task on the CI machine,
    benchmarks/audio_cpu.py); those of an earlier feed are closed, so an unlinked slab's memory is
    not kept alive. (A spawned worker shares the consumer's
    resource tracker, so the name it registers is the consumer's own entry, removed once when the
    consumer unlinks it.)"""
    from multiprocessing import shared_memory

    if _ATTACHED_FEED[0] != feed:
        for shm in _ATTACHED.values():
            shm.close()
        _ATTACHED.clear()
        _ATTACHED_FEED[0] = feed
    if name not in _ATTACHED:
        _ATTACHED[name] = shared_memory.SharedMemory(name=name)
    return _ATTACHED[name]


def _place_flac(path: str, key: str, buf: np.ndarray, off: int, seconds: float | None,
                max_samples: int) -> tuple | None:
    """Worker: a FLAC file's bytes read into the slab ``buf`` at float ``off`` (or into bytes of their own where they
    do not fit) and its frames found for the GPU's decoder (:func:`~..codecs.flac_gpu.pack`): ``(key, "flac",
    offset, words, size, AudioData)`` (``words``: the float32 words the bytes take, ``size`` their length; the record's
    ``data`` left out, the consumer views the slab: pickled, it carried every byte of the file through the results'
    pipe, half of a GPU-FLAC pipeline's time on 30-s clips, H100 2026-12-06), ``(key, "own", AudioData)``, or None
    where it is no FLAC stream the GPU path takes (decoded here then, as before). ValueError as the CPU path
    says it (more samples than one record may hold)."""
    import os

    from ..codecs.flac_gpu import pack

    with open(path, "rb", buffering=0) as f:
        n = os.fstat(f.fileno()).st_size
        if n < 42:
            return None
        words = -(-n // 4)
        if off + words <= buf.size:
            raw = buf[off: off + words].view(np.uint8)[:n]
            got = f.readinto(memoryview(raw))
            while got < n:
                more = f.readinto(memoryview(raw)[got:])
                if not more:
                    return None
                got += more
            d = pack(raw, seconds, max_samples, key, path)
            return None if d is None else (key, "flac", off, words, n, d._replace(samples=d.samples._replace(data=None)))
        if f.read(4) != b"fLaC":
            return None
        f.seek(0)
        data = np.frombuffer(f.read(), np.uint8)
    d = pack(data, seconds, max_samples, key, path)
    return None if d is None else (key, "own", d)


def decode_into(args: tuple) -> list[tuple]:
    """Worker: decode ``files`` ((path, key) pairs) into the slab ``name``; per file ``(key, "shm",
    offset, frames, channels, rate, bits)``, ``(key, "own", AudioData)`` or ``(key, "error", reason, path)``
    (a file above ``max_samples`` decoded samples among the errors). With ``packed`` a FLAC file's bytes go into
    the slab instead, its frames found for the GPU's decoder (:func:`_place_flac`: ``(key, "flac", offset, words,
    size, AudioData)``)."""
    import soundfile as sf

    from ..codecs.audio_io import _BITS, AudioInfo, _check, decode_audio, probe_audio

    name, feed, size, files, seconds, max_samples = args[:6]
    packed = len(args) > 6 and args[6]
    buf = np.ndarray((size // 4,), np.float32, buffer=_attach(name, feed).buf)
    off = 0
    out: list[tuple] = []
    try:
        for path, key in files:
            try:
                if packed and str(path).lower().endswith(".flac"):
                    placed = _place_flac(str(path), key, buf, off, seconds, max_samples)
                    if placed is not None:
                        out.append(placed)
                        if placed[1] == "flac":
                            off += -(-placed[3] // 16) * 16  # (64-byte steps: the next file's bytes aligned)
                        continue
                try:
                    f = sf.SoundFile(path)
                except Exception:  # noqa: BLE001 - not for libsndfile: PyAV, or the reason it is no audio
                    info = probe_audio(path)
                    out.append((key, "own", decode_audio(path, info, seconds=seconds)))
                    continue
                with f:
                    info = _check(AudioInfo("", f.subtype, int(f.samplerate), int(f.channels), int(f.frames),
                                            _BITS.get(f.subtype, 0)))
                    frames = info.frames
                    if seconds:
                        frames = min(frames, int(np.ceil(seconds * info.rate)))
                    if frames <= 0:
                        raise ValueError("no audio samples")
                    n = frames * info.channels
                    if max_samples and n > max_samples:
                        raise ValueError(f"{frames / info.rate / 3600:.1f} h of {info.channels}-channel audio ({n:,} "
                                         f"samples) is above the {max_samples:,}-sample bound on one record")
                    bits = 24 if info.bits >= 24 else 16
                    if off + n <= buf.size:
                        got = f.read(frames, dtype="float32", always_2d=True,
                                     out=buf[off: off + n].reshape(frames, info.channels))
                        x = got
                    else:
                        x = f.read(frames, dtype="float32", always_2d=True)
                    if not len(x):
                        raise ValueError("no audio samples decoded")
                    if not np.isfinite(x).all():
                        raise ValueError(f"{int(np.count_nonzero(~np.isfinite(x))):,} NaN or infinite samples")
                    if off + n <= buf.size:
                        out.append((key, "shm", off, len(x), info.channels, info.rate, bits))
                        off += len(x) * info.channels
                    else:
                        out.append((key, "own", AudioData(np.ascontiguousarray(x.T), info.rate, bits=bits)))
            except Exception as e:  # noqa: BLE001 - the record boundary: its reason, the rest goes on
                reason = str(e) if isinstance(e, ValueError) else f"cannot decode: {str(e).splitlines()[0][:160]}"
                out.append((key, "error", reason, path))
    finally:
        del buf
    return out


def _serve(tasks: Any, results: Any, attached: Any = None) -> None:
    """A decoding worker's loop: tasks ``(id, args of decode_into)`` until None; results ``(id, ok, out)``.
    A task ``(id, ("attach", names, feed))`` maps a new feed's slabs, then waits at ``attached`` until every
    worker has (so each worker takes one such task: :meth:`DecodeWorkers.attach`)."""
    import signal

    from .feed import ATTACH_TIMEOUT

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle
    while True:
        job = tasks.get()
        if job is None:
            return
        task, args = job
        try:
            if args and args[0] == "attach":
                for name in args[1]:
                    _attach(name, args[2])
                attached.wait(ATTACH_TIMEOUT)
                results.put((task, True, []))
            else:
                results.put((task, True, decode_into(args)))
        except Exception as e:  # noqa: BLE001 - the consumer raises it
            results.put((task, False, f"{type(e).__name__}: {e}"))


class DecodeWorkers:
    """``count`` worker processes (:func:`~.processes.worker_processes`) that run :func:`decode_into` on
    tasks from one queue: :meth:`submit` queues a task, :meth:`result` waits for its result (others that
    arrive first are kept); a worker that dies is an error, not a wait without end."""

    def __init__(self, count: int):
        import multiprocessing as mp

        from ..processes import worker_processes

        ctx = mp.get_context("spawn")
        self.tasks, self.results = ctx.SimpleQueue(), ctx.SimpleQueue()
        self.attached = ctx.Barrier(count)  # (a feed's slabs mapped by every worker: attach())
        self.procs = worker_processes(_serve, (self.tasks, self.results, self.attached), count)
        self.count = count
        self._last = 0
        self._done: dict[int, tuple[bool, Any]] = {}
        self._dropped: set[int] = set()
        self._unlinked = False  # (the queues' and the barrier's semaphores: unlinked once every worker attached)

    def submit(self, args: tuple) -> int:
        self._last += 1
        self.tasks.put((self._last, args))
        return self._last

    def result(self, task: int) -> list[tuple]:
        from multiprocessing.connection import wait

        reader = self.results._reader  # (SimpleQueue's end of the pipe, waited on beside the workers)
        while task not in self._done:
            ready = wait([reader, *(p.sentinel for p in self.procs)], timeout=5.0)
            if reader in ready:
                got, ok, out = self.results.get()
                if got in self._dropped:
                    self._dropped.discard(got)
                else:
                    self._done[got] = (ok, out)
            elif any(not p.is_alive() for p in self.procs):
                dead = next(p for p in self.procs if not p.is_alive())
                raise RuntimeError(f"an audio decoding worker ended ({died(dead.exitcode)})")
        ok, out = self._done.pop(task)
        if not ok:
            raise RuntimeError(f"an audio decoding worker failed: {out}")
        return out

    def attach(self, names: list[str], feed: str) -> None:
        """Every worker maps the shared-memory slabs ``names`` of ``feed`` (and lets an earlier feed's go):
        one task a worker, each held at a barrier until all have mapped them."""
        for task in [self.submit(("attach", list(names), feed)) for _ in self.procs]:
            self.result(task)
        if not self._unlinked:  # (every worker has started and opened them: their names can go, as feed.py's)
            from ..processes import unlink_semaphores

            unlink_semaphores(self.tasks, self.results, self.attached)
            self._unlinked = True

    def forget(self, tasks: list[int]) -> None:
        """Tasks whose results nobody will ask for (a feed that stopped early): dropped when they come."""
        for t in tasks:
            if self._done.pop(t, None) is None:
                self._dropped.add(t)

    def close(self) -> None:
        """End the workers: each told to stop after its tasks, the results nobody took read and dropped meanwhile
        (a worker blocks on a full pipe until they are: a feed stopped early with FLAC records in flight, whose
        results carry their frames, held ``AudioPipeline.close`` 5 s a worker), any left after 5 s terminated."""
        import time
        from multiprocessing.connection import wait

        for _ in self.procs:
            self.tasks.put(None)
        reader = self.results._reader
        alive = list(self.procs)
        deadline = time.monotonic() + 5
        while alive and (left := deadline - time.monotonic()) > 0:
            ready = wait([reader, *(p.sentinel for p in alive)], timeout=left)
            if reader in ready:
                try:
                    self.results.get()
                except (EOFError, OSError):
                    break
            alive = [p for p in alive if p.is_alive()]
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join()
        self.procs = []
        self.tasks.close()
        self.results.close()


class SharedFeed:
    """Decoded files from ``workers`` (:class:`DecodeWorkers`), in the order asked, ``per_task`` files a task,
    ``slabs`` tasks in flight, each with its own slab of shared memory.

    :meth:`items` yields ``(key, AudioData | RecordError, where)``: host samples that are views of a slab
    (``where`` = (slab, offset, samples); valid until :meth:`upload` has taken every item of that slab)
    or arrays of their own (``where`` None)."""

    def __init__(self, workers: DecodeWorkers, slabs: int, per_task: int, slab_bytes: int = SLAB_BYTES,
                 max_samples: int | None = None, device: int | None = None, packed: bool = False):
        from multiprocessing import shared_memory

        from ..codecs.audio_io import DEFAULT_MAX_SAMPLES

        self.workers, self.per_task = workers, per_task
        self.packed = packed  # (FLAC's bytes through the slabs, decoded on the GPU in upload())
        self.max_samples = DEFAULT_MAX_SAMPLES if max_samples is None else max_samples
        self.shms = []
        self.locked: list[tuple[int, Any] | None] = []  # per slab: (address, unlock) where page-locked
        self.device = device
        try:
            for _ in range(slabs):
                self.shms.append(shared_memory.SharedMemory(create=True, size=slab_bytes))
        except OSError:
            self.close()
            raise
        self.token = self.shms[0].name  # names this feed to the workers (they keep its slabs mapped)
        try:
            # every worker maps the slabs now, and their names leave /dev/shm at once: their memory goes with
            # the last process that maps them, however the run ends (killed with its process group, which
            # takes the resource tracker along, each slab stayed in /dev/shm until the machine restarted)
            workers.attach([shm.name for shm in self.shms], self.token)
        finally:
            for shm in self.shms:
                try:
                    shm.unlink()
                except OSError:
                    pass
        if device is not None:
            from ..device import page_lock

            self.locked = [page_lock(shm.buf, device) for shm in self.shms]
        self.size = slab_bytes
        self.free = deque(range(slabs))
        self.cooling: deque = deque()  # (event, slab): free once the GPU has read the slab
        self.pending_items = [0] * slabs

    def _reclaim(self, wait: bool) -> None:
        """Slabs whose copies the GPU has finished go back to the free list (``wait``: the oldest at least)."""
        while self.cooling and (wait or self.cooling[0][0].done):
            event, s = self.cooling.popleft()
            event.synchronize()
            self.free.append(s)
            wait = False

    def items(self, visits: Iterator[tuple[str, str]], seconds: float | None) -> Iterator[tuple[str, Any, int | None]]:
        inflight: deque = deque()
        visits = iter(visits)
        done = False
        try:
            while True:
                self._reclaim(wait=not self.free and not inflight and bool(self.cooling))
                while not done and self.free:
                    chunk = [v for _, v in zip(range(self.per_task), visits)]
                    if not chunk:
                        done = True
                        break
                    s = self.free.popleft()
                    task = self.workers.submit((self.shms[s].name, self.token, self.size, chunk, seconds,
                                                self.max_samples, self.packed))
                    inflight.append((s, task))
                if not inflight:
                    if done:
                        return
                    raise RuntimeError("every slab is held by items not yet uploaded: a batch larger than the "
                                       "feed's slabs hold")
                s, task = inflight.popleft()
                results = self.workers.result(task)
                view = np.ndarray((self.size // 4,), np.float32, buffer=self.shms[s].buf)
                shared = [r for r in results if r[1] in ("shm", "flac")]
                self.pending_items[s] = len(shared)
                if not shared:
                    self.free.append(s)
                for r in results:
                    key, kind = r[0], r[1]
                    if kind == "shm":
                        _, _, off, frames, ch, rate, bits = r
                        x = view[off: off + frames * ch].reshape(frames, ch)
                        yield key, AudioData(x.T if ch > 1 else x.reshape(1, frames), rate, bits=bits), (s, off, frames * ch)
                    elif kind == "flac":  # (its bytes in the slab: the packed record views them there)
                        _, _, off, words, size, d = r
                        raw = view[off: off + words].view(np.uint8)[:size]
                        yield key, d._replace(samples=d.samples._replace(data=raw)), (s, off, words)
                    elif kind == "own":
                        yield key, r[2], None
                    else:
                        yield key, RecordError(key, r[3], Stage.DECODE, r[2]), None
                del view
        finally:
            self.workers.forget([task for _, task in inflight])

    def view(self, slab: int) -> np.ndarray:
        return np.ndarray((self.size // 4,), np.float32, buffer=self.shms[slab].buf)

    def upload(self, group: list[tuple[str, AudioData, Any]]) -> list[AudioData]:
        """The items of a batch on the GPU, in one device buffer: each slab's part copied in one go (a
        queued DMA from a page-locked slab, which goes back to the workers once the GPU has read it;
        else a copy the call waits for), the items views of it; the others through
        :func:`to_device`."""
        import ctypes

        import cupy as cp

        out: list[Any] = [None] * len(group)
        spans: dict[int, list[int]] = {}  # slab -> [lo, hi) of its samples in this batch
        own = []
        for i, (_, _, loc) in enumerate(group):
            if loc is None:
                own.append(i)
                continue
            s, off, n = loc
            span = spans.setdefault(s, [off, off + n])
            span[0], span[1] = min(span[0], off), max(span[1], off + n)
        where, total = {}, 0
        for s, (lo, hi) in spans.items():
            where[s] = total - lo
            total += hi - lo
        dev = cp.empty(total + 4, cp.float32)  # (16 bytes past the last: the FLAC decoder reads words)
        for s, (lo, hi) in spans.items():
            part = dev[where[s] + lo: where[s] + hi]
            pinned = self.locked[s] if self.locked else None
            if pinned is not None:
                part.data.copy_from_host_async(ctypes.c_void_p(pinned[0] + 4 * lo), 4 * (hi - lo))
            else:
                part.set(self.view(s)[lo:hi])  # pageable: returns once the copy is taken
        event = cp.cuda.get_current_stream().record() if self.locked and any(self.locked[s] for s in spans) else None
        from ..codecs.flac_gpu import decode_into, is_packed

        flac = [(i, 4 * (where[loc[0]] + loc[1]), item) for i, (_, item, loc) in enumerate(group)
                if loc is not None and is_packed(item)]
        if flac:  # (decoded on the GPU from the bytes just copied up, before their slabs go back to the workers)
            decode_into(out, dev.view(cp.uint8), flac)
        for i, (_, item, loc) in enumerate(group):
            if loc is None:
                continue
            s, off, n = loc
            if out[i] is None:
                ch = item.samples.shape[0]
                x = dev[where[s] + off: where[s] + off + n]
                out[i] = item._replace(samples=x.reshape(1, n) if ch == 1 else cp.ascontiguousarray(x.reshape(n // ch, ch).T))
            self.release(s, event)
        if own:
            for i, d in zip(own, to_device([group[i][1] for i in own])):
                out[i] = d
        return out

    def release(self, slab: int | None, event: Any = None) -> None:
        """One item of ``slab`` is on the GPU (once ``event`` has passed); the slab is free again once all
        of them are."""
        if slab is None:
            return
        self.pending_items[slab] -= 1
        if self.pending_items[slab] == 0:
            if event is None:
                self.free.append(slab)
            else:
                self.cooling.append((event, slab))

    def close(self) -> None:
        if self.cooling:  # no copy from a slab is queued or running once it is unlocked
            self.cooling[-1][0].synchronize()
            self.cooling.clear()
        for pinned in self.locked:
            if pinned is not None:
                pinned[1]()
        self.locked = []
        for shm in self.shms:
            try:
                shm.close()
                shm.unlink()
            except (OSError, BufferError):
                pass
        self.shms = []


def to_device(items: Sequence[AudioData]) -> list[Any]:
    """Host items on the GPU through one host-to-device copy for the batch (views per item); FLAC records
    placed for the GPU's decoder (:func:`~..codecs.flac_gpu.pack`) decoded there, each an item on the GPU or,
    where neither the GPU nor the CPU can decode it, a :class:`~gpubatch.errors.RecordError`."""
    import cupy as cp

    from ..codecs.flac_gpu import PAD, decode_into, is_packed

    packed = [i for i, it in enumerate(items) if is_packed(it)]
    if packed:
        placed = set(packed)
        plain = [i for i in range(len(items)) if i not in placed]
        out: list[Any] = [None] * len(items)
        for i, d in zip(plain, to_device([items[i] for i in plain])):
            out[i] = d
        blobs = [np.ascontiguousarray(items[i].samples.data).view(np.uint8).ravel() for i in packed]
        offs = np.cumsum([0] + [b.size for b in blobs])
        host = np.concatenate([*blobs, np.zeros(PAD, np.uint8)])
        decode_into(out, cp.asarray(host), [(i, int(o), items[i]) for o, i in zip(offs, packed)], host)
        return out
    flat = [np.ascontiguousarray(it.samples, np.float32).ravel() for it in items]
    if not flat:
        return []
    sizes = np.cumsum([0] + [f.size for f in flat])
    host = np.concatenate(flat) if len(flat) > 1 else flat[0]
    dev = cp.asarray(host)
    return [it._replace(samples=dev[sizes[i]: sizes[i + 1]].reshape(it.samples.shape)) for i, it in enumerate(items)]


#: a batch's samples staged in page-locked memory at most (a slot of :class:`PinnedGather`, which has three)
STAGE_MAX = 256 << 20


class PinnedGather:
    """Batches' samples gathered into page-locked buffers of its own, ``slots`` of them in turn, by the thread
    that makes the batches (:meth:`stage`), so that the GPU's loop only queues one copy a batch
    (:class:`Staged`): the gather, a copy of every sample, ran in the loop before (about a tenth of a 4,096
    Whisper clip run on an H200 host, profiled 2026-12-03). Samples still in the shared file their decoding
    process wrote are read from it straight into the slot (:meth:`~.audio_records.SharedFiles.read_into`).
    A slot is filled again once its batch is done with (:meth:`Staged.release`) and its copy to the GPU has
    ended (its event). Not :class:`~..batch.PinnedStaging`, whose slots keep each device copy alive until
    they are refilled (the launch tables' raw pointers need it): a batch's samples on the GPU go with its
    items, as ``--gpu-memory``'s plan counts them."""

    def __init__(self, device: int, slots: int = 3):
        import queue

        self.device = device
        self.host: list[Any] = [None] * slots
        self.free: queue.Queue = queue.Queue()
        for i in range(slots):
            self.free.put((i, None))
        self.closed = False

    def _buffer(self, nbytes: int) -> Any:
        """Page-locked host memory of ``nbytes`` at least (16 MiB steps)."""
        import cupy as cp

        with cp.cuda.Device(self.device):
            return cp.cuda.alloc_pinned_memory(max(1, -(-nbytes // (16 << 20))) * (16 << 20))

    def stage(self, items: Sequence[AudioData], files: Any = None) -> Staged:
        """``items``' samples (arrays, or :class:`~.audio_records.Shared` read through ``files``) in a free slot
        (waiting for one, and for its last copy to end); a batch larger than :data:`STAGE_MAX` is not
        staged (its samples read into arrays of their own, copied up by :func:`to_device`). FLAC records placed
        for the GPU's decoder (:class:`~..codecs.flac_gpu.FlacPacked`) have their bytes staged after the
        samples, at a multiple of 256 bytes."""
        import queue

        from ..codecs.flac_gpu import is_packed
        from .audio_records import Shared, shared_of

        packed = [is_packed(it) for it in items]
        shapes = [(0,) if p else tuple(it.samples.shape) for it, p in zip(items, packed)]
        sizes = np.cumsum([0] + [int(np.prod(sh)) for sh in shapes])
        spans = [(int(a), int(b), sh) for a, b, sh in zip(sizes[:-1], sizes[1:], shapes)]
        at = -(-4 * int(sizes[-1]) // 256) * 256  # (the bytes' place in the slot)
        places = []
        for it, p in zip(items, packed):
            places.append(at if p else -1)
            at += it.samples.nbytes if p else 0
        if at > STAGE_MAX:
            return Staged(self, None, None, [files.read(it) if shared_of(it) is not None else it for it in items],
                          spans)
        while True:
            try:
                i, event = self.free.get(timeout=0.5)
                break
            except queue.Empty:
                if self.closed:
                    raise RuntimeError("the batches' staging was closed") from None
        if event is not None:
            event.synchronize()
        if self.host[i] is None or self.host[i][1].nbytes < at:
            self.host[i] = None
            mem = self._buffer(at)
            self.host[i] = (mem, np.frombuffer(mem, np.float32))
        host = self.host[i][1]
        raw = host.view(np.uint8)
        hosts = []
        for it, (a, b, sh), p, place in zip(items, spans, packed, places):
            if p:
                n = it.samples.nbytes
                if shared_of(it) is not None:
                    hosts.append(files.read_into(it, raw[place: place + n]))
                else:
                    raw[place: place + n] = np.asarray(it.samples.data).view(np.uint8).ravel()
                    hosts.append(it._replace(samples=it.samples._replace(data=raw[place: place + n])))
            elif isinstance(it.samples, Shared):
                hosts.append(files.read_into(it, host[a:b]))
            else:
                host[a:b].reshape(sh)[...] = it.samples
                hosts.append(it)
        return Staged(self, i, host, hosts, spans, places, at)

    def close(self) -> None:
        """A thread waiting in :meth:`stage` for a slot stops (the run ends)."""
        self.closed = True


class Staged:
    """A batch staged by :class:`PinnedGather`: ``hosts``, its items with their samples on the host (views of
    the slot, valid until :meth:`release`: the chain's CPU path takes them where the GPU fails); called with
    the batch's items (as the chain's ``upload``), queues their copy to the GPU on the current stream and
    gives the items on the GPU (views of one device buffer)."""

    def __init__(self, owner: PinnedGather, slot: int | None, host: np.ndarray | None, hosts: list[AudioData],
                 spans: list[tuple[int, int, tuple]], places: list[int] | None = None, end: int = 0):
        self.owner, self.slot, self.host, self.hosts, self.spans = owner, slot, host, hosts, spans
        self.places, self.end = places or [-1] * len(spans), end  # (FLAC bytes: their byte offsets in the slot)
        self.refused: list[int] = []  # (items whose FLAC the GPU's decoder refused: decoded on the CPU)
        self.event: Any = None
        self.released = False

    def __call__(self, items: Sequence[AudioData]) -> list[AudioData]:
        import cupy as cp

        if len(items) != len(self.spans):
            raise ValueError(f"a staged batch of {len(self.spans)} items was given {len(items)}")
        if self.slot is None:
            return to_device(self.hosts)
        n = self.spans[-1][1] if self.spans else 0
        dev = cp.empty(n, cp.float32)
        dev.data.copy_from_host_async(self.host.ctypes.data, 4 * n)
        packed = [(i, p, d) for i, (p, d) in enumerate(zip(self.places, self.hosts)) if p >= 0]
        raw = None
        if packed:  # (the FLAC bytes up in one more copy, decoded on the GPU: decode_on_gpu waits for it)
            from ..codecs.flac_gpu import PAD

            lo = packed[0][1]
            raw = cp.empty(self.end - lo + PAD, cp.uint8)
            raw.data.copy_from_host_async(self.host.ctypes.data + lo, self.end - lo)
        self.event = cp.cuda.get_current_stream().record()
        out: list[Any] = [it._replace(samples=dev[a:b].reshape(shape)) if p < 0 else None
                          for it, (a, b, shape), p in zip(items, self.spans, self.places)]
        if packed:
            from ..codecs.flac_gpu import decode_into

            self.refused = decode_into(out, raw, [(i, p - lo, d) for i, p, d in packed], self.host.view(np.uint8)[lo: self.end])
        return out

    def release(self) -> None:
        """The batch is done with (its chain has run, or failed): its slot back to the gather, to be filled
        again once its copy has ended; once."""
        if not self.released:
            self.released = True
            if self.slot is not None:
                self.owner.free.put((self.slot, self.event))
