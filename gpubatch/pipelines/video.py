"""Clip batches for training video models: :class:`VideoPipeline` turns video files into batches of
clips (N, C, T, H, W or N, T, C, H, W), each clip's frames through one op chain with one set of drawn
parameters, on the GPU (CuPy arrays, handed to PyTorch or JAX through DLPack) or on the CPU (NumPy).

    >>> from gpubatch import VideoPipeline
    >>> from gpubatch.engine.spec import parse_chain
    >>> ops = parse_chain("resize_shorter(size=256) | random_crop(size=224) | flip() | "
    ...                   "normalize(layout='CHW', dtype='float16')")
    >>> pipe = VideoPipeline(ops, clip_length=16, frame_step=4, device="gpu")
    >>> for batch in pipe.iterate_files(files, batch_size=8, repeat=True):
    ...     x = torch.from_dlpack(batch)          # (8, 3, 16, 224, 224) float16 on the GPU

Each visit of a file takes one clip at a position drawn from (seed, file, epoch, visit), as the CPU and
GPU paths both draw it (:class:`~gpubatch.engine.ops.temporal.ClipSampler`). On the GPU, decoding
threads (``settings.video_decoders``) each own an NVDEC session and work on whole clips at once; a file
NVDEC does not take is decoded on the CPU and its frames go through the same GPU chain. On the CPU,
worker processes decode with PyAV and run the host kernels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.batch import KeyedBatch
from ..engine.ops.base import Op
from ..engine.plan import Plan
from ..engine.rng import file_visits
from ..engine.settings import Settings
from ..errors import UsageError

LAYOUTS = ("NCTHW", "NTCHW")


@dataclass
class ClipBatch(KeyedBatch):
    """A batch of clips: ``data`` (N, C, T, H, W) or (N, T, C, H, W), a CuPy array on the GPU or a NumPy
    array; ``keys`` the files they came from; ``frames`` each clip's frame indices."""

    frames: list[list[int]] = field(default_factory=list)


def _clip_plan(ops: Sequence[Op], clip_length: int, frame_step: int, seed: int) -> Plan:
    from ..engine.ops.temporal import RandomClip

    return Plan(ops=(RandomClip(clip_length, frame_step), *ops), seed=seed, max_pixels=0, media="video")


def _arrange(clip: Any, layout: str, xp: Any) -> Any:
    """Per-frame results (T, C, H, W) or (T, H, W, C) as one clip in ``layout`` (without N)."""
    if clip.ndim == 4 and clip.shape[-1] in (1, 3) and clip.shape[1] not in (1, 3):  # HWC frames: to CHW
        clip = clip.transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(clip.transpose(1, 0, 2, 3) if layout == "NCTHW" else clip)


class _Probes:
    """Each file's probe, made once (a demux pass) and kept for every later visit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._infos: dict[str, Any] = {}

    def get(self, path: str, data: bytes) -> Any:
        from ..engine.codecs.video_probe import probe

        with self._lock:
            found = self._infos.get(path)
        if found is None:
            found = probe(data)
            with self._lock:
                self._infos[path] = found
        return found


_WORKER_PROBES = _Probes()  # a CPU worker process's probes, kept for its later visits of each file


def _cpu_clip(args: tuple) -> tuple[np.ndarray, list[int]]:
    """One clip on the CPU (a worker process): decoded by PyAV, each frame through the host chain. ``args``:
    (file, draw key, plan, layout[, the video's bytes: then "file" names the record, and is not read])."""
    path, key, plan, layout, *given = args
    from ..engine.codecs.video import FrameCursor
    from ..engine.host_chain import run_chain_host
    from ..errors import RecordError, Stage
    from ..types import Media, Record

    data = given[0] if given else Path(path).read_bytes()
    try:
        info = _WORKER_PROBES.get(path, data)
    except ValueError as e:
        raise RecordError(key, path, Stage.DECODE, str(e)) from None
    rec = Record(key=key, data=data, media=Media.VIDEO, codec=info.container, origin=path)
    (template,) = plan.sample.split(rec, info, plan.seed)
    frames = template.meta["frames"]
    cur = FrameCursor(data, info, [frames], key, path, threads=1)  # a process a core: no decoder threads
    try:
        pixels = cur.frames(frames)
    finally:
        cur.close()
    params = plan.draw(key, *pixels.shape[1:3])
    out = np.stack([run_chain_host(plan.ops, f, params) for f in pixels])
    return _arrange(out, layout, np), frames


def _outcome(future: Any) -> Any:
    """A worker's clip, or the RecordError it raised (a record that gives no clip)."""
    from ..errors import RecordError

    try:
        return future.result()
    except RecordError as e:
        return e


class VideoPipeline:
    """Batches of clips from video files; see the module's docstring.

    Args:
        ops: the chain applied to every frame of a clip (one set of parameters a clip); end it with
            ``normalize(layout='CHW', dtype='float16')`` for a model's input.
        clip_length, frame_step: T frames a clip, ``frame_step`` apart.
        device: "gpu", "cpu" or "auto".
        layout: "NCTHW" (3D CNNs, X3D, SlowFast) or "NTCHW" (video transformers).
        decoders: NVDEC sessions at once (GPU; default ``settings.video_decoders``); workers: CPU
            processes (default: every core).
    """

    def __init__(self, ops: Sequence[Op], clip_length: int = 16, frame_step: int = 1, device: str = "auto",
                 gpu: int = 0, seed: int = 0, layout: str = "NCTHW", decoders: int | None = None,
                 workers: int | None = None, settings: Settings | None = None):
        from ..engine.device import resolve

        if layout not in LAYOUTS:
            raise UsageError(f"unknown layout {layout!r}; supported: {', '.join(LAYOUTS)}")
        self.plan = _clip_plan(ops, clip_length, frame_step, seed)
        self.layout = layout
        self.device = resolve(device, gpu)
        self.settings = settings or Settings.from_env()
        self.decoders = decoders or self.settings.video_decoders
        from ..engine.processes import default_workers

        self.workers = workers or default_workers()
        self.timings: dict[str, float] = {"read": 0.0, "decode": 0.0, "ops": 0.0, "wait": 0.0}
        self.stats = {"clips": 0, "frames_decoded": 0, "cpu_fallbacks": 0}
        self.skipped: dict[str, str] = {}  # file -> why it gave no clip (too short, damaged, no video)
        self._probes = _Probes()
        self._lock = threading.Lock()
        self._pool: Any = None
        self._threads: Any = None  # (records on the GPU: decoding threads, an NVDEC session each)
        self._local = threading.local()
        self._sessions: list[Any] = []
        from ..engine.registry import DEVICE, HOST

        self.plan.validate(DEVICE if self.device.is_gpu else HOST)

    # --- the work list -----------------------------------------------------------------------------------

    def iterate_files(self, files: Sequence[str | Path], batch_size: int, repeat: bool = False,
                      epoch: int = 0) -> Iterator[ClipBatch]:
        """Batches of ``batch_size`` clips, one clip a visit of each file (the last batch may be smaller)."""
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        it = self._skipping(self._gpu(files, repeat, epoch) if self.device.is_gpu else self._cpu(files, repeat, epoch),
                            len(files))
        xp = __import__("cupy") if self.device.is_gpu else np
        while True:
            t0 = time.perf_counter()
            got = [c for _, c in zip(range(batch_size), it)]
            self.timings["wait"] += time.perf_counter() - t0
            if not got:
                return
            yield ClipBatch(xp.stack([c[0] for c in got]), [c[1] for c in got], [c[2] for c in got])
            if len(got) < batch_size:
                return

    def _skipping(self, clips: Iterator[Any], files: int) -> Iterator[tuple]:
        """The clips, less the files that give none (each named once in ``skipped`` with its reason); a
        whole pass over the files without a clip is an error."""
        from ..errors import GpubatchError, RecordError

        misses = 0
        for c in clips:
            if isinstance(c, RecordError):
                self.skipped.setdefault(c.key.split("#e", 1)[0], c.reason)
                misses += 1
                if misses >= files:
                    raise GpubatchError(f"none of the {files} files gave a clip of {self.plan.sample.length} frames "
                                        f"(e.g. {c.key.split('#e', 1)[0]}: {c.reason})")
                continue
            misses = 0
            yield c

    # --- CPU -----------------------------------------------------------------------------------------------

    def _cpu(self, files: Sequence[str | Path], repeat: bool, epoch: int) -> Iterator[tuple]:
        """Clips made by worker processes, in visit order, at most two a worker in flight."""
        from collections import deque

        from ..engine.processes import single_threaded_pool
        from ..errors import RecordError

        if self._pool is None:
            self._pool = single_threaded_pool(self.workers)
        pending: deque = deque()
        visits = file_visits(files, repeat, epoch)
        try:
            while True:
                while len(pending) < 2 * self.workers:
                    item = next(visits, None)
                    if item is None:
                        break
                    pending.append((item[1], self._pool.submit(_cpu_clip, (*item, self.plan, self.layout))))
                if not pending:
                    return
                key, fut = pending.popleft()
                try:
                    clip, frames = fut.result()
                except RecordError as e:
                    yield e
                    continue
                self.stats["clips"] += 1
                yield clip, key, frames
        finally:
            for _, f in pending:
                f.cancel()

    # --- GPU -----------------------------------------------------------------------------------------------

    def _gpu(self, files: Sequence[str | Path], repeat: bool, epoch: int) -> Iterator[tuple]:
        """Clips made by ``self.decoders`` threads, delivered in visit order (a bounded window ahead)."""
        from ..errors import RecordError

        visits = file_visits(files, repeat, epoch)
        out: dict[int, Any] = {}
        cond = threading.Condition()
        stop = threading.Event()
        next_visit = [0]
        window = 4 * self.decoders  # clips ahead of the consumer: a slow clip (a far keyframe) holds no thread idle
        delivered = [0]
        feed_lock = threading.Lock()

        def worker() -> None:
            from ..engine.gpu.video import NvdecSession

            session = NvdecSession(self.device.index, loop=self.settings.video_loop)
            try:
                while not stop.is_set():
                    with feed_lock:
                        with cond:
                            while next_visit[0] - delivered[0] >= window and not stop.is_set():
                                cond.wait(0.05)
                        item = next(visits, None)
                        n = next_visit[0]
                        next_visit[0] += 1
                    if item is None or stop.is_set():
                        with cond:
                            out[n] = None
                            cond.notify_all()
                        return
                    try:
                        result: Any = self._gpu_clip(session, *item)
                    except Exception as e:  # noqa: BLE001 - handed to the consumer (a RecordError: a file skipped)
                        result = e
                    with cond:
                        out[n] = result
                        cond.notify_all()
            finally:
                session.close()

        threads = [threading.Thread(target=worker, daemon=True, name=f"gpubatch-nvdec{k}") for k in range(self.decoders)]
        for t in threads:
            t.start()
        try:
            k = 0
            while True:
                with cond:
                    while k not in out:
                        cond.wait(0.05)
                    result = out.pop(k)
                    delivered[0] = k + 1
                    cond.notify_all()
                if result is None:
                    return
                if isinstance(result, Exception) and not isinstance(result, RecordError):
                    raise result
                k += 1
                yield result
        finally:
            stop.set()
            for t in threads:
                t.join()

    def _gpu_clip(self, session: Any, path: str, key: str, given: bytes | None = None) -> tuple[Any, str, list[int]]:
        """One clip on the GPU: read, probe (once a file), decode (NVDEC, or PyAV where NVDEC does not take
        the file), the chain on its frames, arranged; the clip's stream is synchronized before it goes.
        ``given``: the video's bytes (a record of a dataset; ``path`` then names it and is not read)."""
        from ..engine.gpu.nvdec_loop import cpu_reason
        from ..engine.gpu.video import _chain
        from ..errors import RecordError, Stage
        from ..types import Media, Record

        cp = session.cp
        t0 = time.perf_counter()
        data = Path(path).read_bytes() if given is None else given
        try:
            info = self._probes.get(path, data)
        except ValueError as e:
            raise RecordError(key, path, Stage.DECODE, str(e)) from None
        rec = Record(key=key, data=data, media=Media.VIDEO, codec=info.container)
        (template,) = self.plan.sample.split(rec, info, self.plan.seed)
        frames = template.meta["frames"]
        t1 = time.perf_counter()
        decoded = session.frames_decoded
        if not cpu_reason(info, session.gpu, session.loop) and session.open(data, info, None if given else str(path)):
            try:
                pixels = session.decode(frames)
            except Exception as e:  # noqa: BLE001 - a damaged stream: this file gives no clip this visit
                raise RecordError(key, path, Stage.DECODE, f"NVDEC: {str(e).splitlines()[0][:160]}") from None
        else:
            from ..engine.codecs.video import FrameCursor

            cur = FrameCursor(data, info, [frames], key, path)
            try:
                host = cur.frames(frames)
            finally:
                cur.close()
            with session.stream:
                pixels = list(cp.asarray(host))
            with self._lock:
                self.stats["cpu_fallbacks"] += 1
        t2 = time.perf_counter()
        params = self.plan.draw(key, int(pixels[0].shape[0]), int(pixels[0].shape[1]))
        done = _chain(session, self.plan, pixels, params)
        with session.stream:
            clip = _arrange(cp.stack(done), self.layout, cp)
        session.stream.synchronize()
        t3 = time.perf_counter()
        with self._lock:
            self.timings["read"] += t1 - t0
            self.timings["decode"] += t2 - t1
            self.timings["ops"] += t3 - t2
            self.stats["clips"] += 1
            self.stats["frames_decoded"] += session.frames_decoded - decoded
        return clip, key, frames

    # --- records (the training loader) -----------------------------------------------------------------------

    def records(self, records: Sequence[Any], epoch: int = 0) -> tuple[ClipBatch | None, list[tuple[str, str]]]:
        """One clip of each of ``records`` (videos or decoded ``.npy`` clips, as a dataset gpubatch wrote holds
        them; ``.key`` and ``.data`` each), its position and parameters drawn per (seed, key, epoch): the batch
        of the clips made, in the records' order (None where none was), and (key, reason) for each record
        that gave none (too short, damaged; never a clip of another record in its place)."""
        from ..errors import RecordError

        jobs = [(str(r.key), f"{r.key}#e{epoch}#v0", r.data) for r in records]
        if self.device.is_gpu:
            work = self._gpu_threads().map(lambda job: self._gpu_record(*job), jobs)
        else:
            if self._pool is None:
                import multiprocessing as mp

                if mp.current_process().daemon:  # (a DataLoader's worker may start no process: threads then)
                    from concurrent.futures import ThreadPoolExecutor

                    self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="gpubatch-clip")
                else:
                    from ..engine.processes import single_threaded_pool

                    self._pool = single_threaded_pool(self.workers)
            futures = [self._pool.submit(_cpu_clip, (name, key, self.plan, self.layout, data))
                       for name, key, data in jobs]
            work = (_outcome(f) for f in futures)
        clips, failed = [], []
        for r, got in zip(records, work):
            if isinstance(got, RecordError):
                failed.append((str(r.key), got.reason))
                continue
            clips.append((got[0], str(r.key), got[-1]))
        if not self.device.is_gpu:  # (on the GPU, each clip counts itself)
            with self._lock:
                self.stats["clips"] += len(clips)
        if not clips:
            return None, failed
        xp = __import__("cupy") if self.device.is_gpu else np
        shapes = {tuple(c.shape) for c, _, _ in clips}
        if len(shapes) > 1:
            from ..errors import GpubatchError

            raise GpubatchError(f"the clips of a batch differ in shape ({', '.join(map(str, sorted(shapes)))}): end the "
                                "ops with a fixed size (resize_shorter + center_crop, or resize)")
        return ClipBatch(xp.stack([c for c, _, _ in clips]), [k for _, k, _ in clips], [f for _, _, f in clips]), failed

    def _gpu_threads(self) -> Any:
        """The decoding threads of :meth:`records`, an NVDEC session each (kept until :meth:`close`)."""
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = ThreadPoolExecutor(max_workers=self.decoders, thread_name_prefix="gpubatch-nvdec")
        return self._threads

    def _gpu_record(self, name: str, key: str, data: bytes) -> Any:
        from ..errors import RecordError

        session = getattr(self._local, "session", None)
        if session is None:
            from ..engine.gpu.video import NvdecSession

            session = self._local.session = NvdecSession(self.device.index, loop=self.settings.video_loop)
            with self._lock:
                self._sessions.append(session)
        try:
            return self._gpu_clip(session, name, key, data)
        except RecordError as e:
            return e

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def __enter__(self) -> VideoPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
