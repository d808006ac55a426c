"""Feature batches for training speech and audio models: :class:`AudioPipeline` turns audio files into
batches through one op chain (resample, fix the duration, log-mel, SpecAugment...), on the GPU (CuPy
arrays, handed to PyTorch or JAX through DLPack) or on the CPU (NumPy).

    >>> from gpubatch import AudioPipeline
    >>> from gpubatch.engine.spec import parse_chain
    >>> ops = parse_chain("resample(rate=16000) | fix_duration(seconds=30) | log_mel(n_mels=80)")
    >>> pipe = AudioPipeline(ops, device="gpu")
    >>> for batch in pipe.iterate_files(files, batch_size=64):
    ...     x = torch.from_dlpack(batch)          # (64, 80, 3000) float16 on the GPU

Files are decoded on the CPU (FLAC and MP3 have no GPU decoder): for the GPU path by worker processes
straight into shared memory (:mod:`.audio_feed`), a batch uploaded in a few copies, and the GPU runs
each op once for the whole batch. The CPU path runs decode and the
host kernels in worker processes. Each visit of a file draws its parameters from (seed, file, epoch,
visit), the same on both paths. Mono records come out as (N, bins, frames) features or (N, samples)
waveforms; records of several channels keep a channel axis.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.batch import KeyedBatch, stack
from ..engine.codecs.audio_io import AudioData, decode_audio, leading_seconds
from ..engine.ops.base import Op
from ..engine.plan import Plan
from ..engine.rng import file_visits
from ..errors import GpubatchError, RecordError, Stage, UsageError, reason_of

DTYPES = ("float16", "float32")


AudioBatch = KeyedBatch  # features (N, bins, frames) or waveforms, with the files they came from

def _load(path: str, key: str, plan: Plan) -> AudioData:
    """A file decoded (only as far as a leading fixed duration reads), its errors as RecordErrors."""
    try:  # from the path: libsndfile reads the file itself, without the GIL
        return decode_audio(path, seconds=leading_seconds(plan.ops))  # (the file opened once)
    except (OSError, ValueError) as e:
        raise RecordError(key, path, Stage.DECODE, str(getattr(e, "strerror", None) or e)) from None


def _squeeze(x: Any) -> Any:
    return x[0] if x.shape[0] == 1 else x


def _cpu_item(args: tuple) -> np.ndarray:
    """One file on the CPU (a worker process): decoded, drawn for, through the host kernels."""
    path, key, plan, dtype = args
    from ..engine.codecs.audio import AudioHostCodec

    item = _load(path, key, plan)
    params = plan.draw(key, *item.size)
    try:
        out = AudioHostCodec().run_chain(plan.ops, item, params)
    except Exception as e:  # noqa: BLE001 - the record boundary
        raise RecordError(key, path, Stage.TRANSFORM, reason_of(e)) from None
    return _squeeze(np.asarray(out.samples)).astype(dtype)


def _cpu_items(args: tuple) -> list[np.ndarray | RecordError]:
    """A run of files on the CPU (a worker process): each one's array, or its RecordError. Files go to a
    worker several at a time, so the plan and the results cross between processes once a run."""
    visits, plan, dtype = args
    out: list[np.ndarray | RecordError] = []
    for path, key in visits:
        try:
            out.append(_cpu_item((path, key, plan, dtype)))
        except RecordError as e:
            out.append(e)
    return out


class AudioPipeline:
    """Batches of features (or waveforms) from audio files; see the module's docstring.

    Args:
        ops: the chain (audio ops: :mod:`gpubatch.engine.ops.audio`); give records one length (a
            ``fix_duration`` or ``time_crop``) for batches of one shape.
        device: "gpu", "cpu" or "auto".
        dtype: "float16" (default) or "float32".
        workers: decoding worker processes (or threads, with ``feed="threads"``); default every core.
        feed: how the GPU path decodes: "processes" (worker processes into shared memory, the default)
            or "threads" (threads of this process: no shared memory, but they share its GIL).
        flac_gpu: with the "processes" feed on the GPU, FLAC files are read into shared memory as bytes and
            decoded on the GPU (``codecs/flac_gpu.py``, bit for bit libsndfile's samples); None (the default) takes
            ``GPUBATCH_FLAC_GPU`` (on unless set to 0), as ``convert`` does. 8,192 ten-second clips to Whisper
            features ran 4,717-5,239 clips a second this way against 3,162-3,220 decoding on the cores, in turn, on
            an H100 host of 16 cores (2026-12-06, benchmarks/RESULTS.md).
    """

    def __init__(self, ops: Sequence[Op], device: str = "auto", gpu: int = 0, seed: int = 0, dtype: str = "float16",
                 workers: int | None = None, feed: str = "processes", flac_gpu: bool | None = None):
        from ..engine.device import resolve
        from ..engine.processes import default_workers
        from ..engine.registry import DEVICE, HOST

        if dtype not in DTYPES:
            raise UsageError(f"unknown dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        self.plan = Plan(ops=tuple(ops), seed=seed, max_pixels=0, media="audio")
        self.device = resolve(device, gpu)
        if feed not in ("processes", "threads"):
            raise UsageError(f"unknown feed {feed!r}; supported: processes, threads")
        if flac_gpu is None:
            from ..engine.settings import Settings

            flac_gpu = Settings.from_env().flac_gpu
        self.dtype, self.feed, self.flac_gpu = dtype, feed, bool(flac_gpu)
        self.workers = workers or default_workers()
        self.timings: dict[str, float] = {"decode": 0.0, "upload": 0.0, "ops": 0.0, "wait": 0.0}  # decode: waiting for it
        self.stats = {"items": 0}
        self.skipped: dict[str, str] = {}  # file -> why it gave nothing (unreadable, no samples...)
        self._pool: Any = None  # the CPU path's worker processes
        self._decoders: Any = None  # the GPU path's (:class:`~.audio_feed.DecodeWorkers`)
        self._threads_pool: Any = None  # :meth:`records`' decoding threads
        self.plan.validate(DEVICE if self.device.is_gpu else HOST)

    def iterate_files(self, files: Sequence[str | Path], batch_size: int, repeat: bool = False,
                      epoch: int = 0) -> Iterator[AudioBatch]:
        """Batches of ``batch_size`` records, one a visit of each file (the last batch may be smaller)."""
        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        if not files:
            raise UsageError("no audio files to read")
        if self.device.is_gpu:
            from ..engine.executor import prefetched

            yield from prefetched(self._gpu(files, batch_size, repeat, epoch), 2)
        else:
            yield from self._cpu(files, batch_size, repeat, epoch)

    def records(self, records: Sequence[Any], epoch: int = 0) -> AudioBatch:
        """One batch of records held in memory (a dataset's clips or arrays as :func:`gpubatch.loader` reads
        them: :class:`~gpubatch.types.Record` objects): each decoded on the CPU (threads: libsndfile works
        without the GIL), its parameters drawn from ``<key>#e<epoch>``, the chain run on this pipeline's
        device. A record that cannot be decoded or transformed is left out and listed in the batch's
        ``failed`` as (key, why); the rows of ``data`` are those of ``keys``."""
        from concurrent.futures import ThreadPoolExecutor

        from ..engine.codecs.audio import AudioHostCodec

        codec = AudioHostCodec()
        if self._threads_pool is None:
            self._threads_pool = ThreadPoolExecutor(max(1, self.workers), thread_name_prefix="gpubatch-audio")

        def load(r: Any) -> AudioData | RecordError:
            try:
                item = codec.decode(r, self.plan)
                if not isinstance(item, AudioData):  # (a long record the chain would stream): decoded whole
                    item = decode_audio(r.data)
                return item
            except RecordError as e:
                return e
            except (OSError, ValueError) as e:
                return RecordError(r.key, r.origin, Stage.DECODE, str(e))

        items, keys, failed, draws = [], [], [], []
        for r, item in zip(records, self._threads_pool.map(load, records)):
            if isinstance(item, RecordError):
                failed.append((r.key, item.reason))
                continue
            try:
                draws.append(self.plan.draw(f"{r.key}#e{epoch}", *item.size))
            except Exception as e:  # noqa: BLE001 - the record boundary (an op this record cannot take)
                failed.append((r.key, reason_of(e)))
                continue
            items.append(item)
            keys.append(r.key)
        if not items:
            xp = np if not self.device.is_gpu else __import__("cupy")
            return AudioBatch(xp.zeros((0,), self.dtype), [], failed=failed)
        if self.device.is_gpu:
            import cupy as cp

            from ..engine.gpu.audio_chain import run_chain_device
            from ..engine.gpu.audio_feed import to_device

            with cp.cuda.Device(self.device.index):
                out = run_chain_device(self.plan.ops, to_device(items), draws)
                data = self._stack([_squeeze(o.samples) for o in out], cp).astype(self.dtype, copy=False)
                ready = cp.cuda.get_current_stream().record()
            return AudioBatch(data, keys, ready=ready, failed=failed)
        outs, kept = [], []
        for key, item, params in zip(keys, items, draws):
            try:
                got = codec.run_chain(self.plan.ops, item, params)
            except Exception as e:  # noqa: BLE001 - the record boundary
                failed.append((key, reason_of(e)))
                continue
            outs.append(_squeeze(np.asarray(got.samples)).astype(self.dtype))
            kept.append(key)
        return AudioBatch(self._stack(outs, np) if outs else np.zeros((0,), self.dtype), kept, failed=failed)

    def _skip(self, e: RecordError, misses: int, files: int) -> int:
        self.skipped.setdefault(e.key.split("#e", 1)[0], e.reason)
        if misses + 1 >= files:
            raise GpubatchError(f"none of the {files} files could be read (e.g. {e.key.split('#e', 1)[0]}: {e.reason})")
        return misses + 1

    def _stack(self, items: list[Any], xp: Any) -> Any:
        shapes = {tuple(x.shape) for x in items}
        if len(shapes) > 1:
            raise GpubatchError(f"a batch holds records of {len(shapes)} shapes ({', '.join(map(str, sorted(shapes)[:3]))}"
                                "): give them one length with fix_duration or time_crop")
        return stack(items, xp)  # (on the GPU a view where the chain left them back to back in one array)

    # --- CPU -----------------------------------------------------------------------------------------------

    def _cpu(self, files: Sequence[str | Path], batch_size: int, repeat: bool, epoch: int) -> Iterator[AudioBatch]:
        from ..engine.processes import single_threaded_pool

        if self._pool is None:
            self._pool = single_threaded_pool(self.workers)
        pending: deque = deque()
        visits = file_visits(files, repeat, epoch)
        per_task = max(1, min(8, batch_size // self.workers))
        batch: list[np.ndarray] = []
        keys: list[str] = []
        misses = 0
        try:
            while True:
                while len(pending) < 3 * self.workers:
                    run = [v for _, v in zip(range(per_task), visits)]
                    if not run:
                        break
                    pending.append(([k for _, k in run], self._pool.submit(_cpu_items, (run, self.plan, self.dtype))))
                if not pending:
                    break
                run_keys, fut = pending.popleft()
                t0 = time.perf_counter()
                outs = fut.result()
                self.timings["wait"] += time.perf_counter() - t0
                for key, out in zip(run_keys, outs):
                    if isinstance(out, RecordError):
                        misses = self._skip(out, misses, len(files))
                        continue
                    misses = 0
                    batch.append(out)
                    keys.append(key)
                    self.stats["items"] += 1
                    if len(batch) == batch_size:
                        yield AudioBatch(self._stack(batch, np), keys)
                        batch, keys = [], []
            if batch:
                yield AudioBatch(self._stack(batch, np), keys)
        finally:
            for _, f in pending:
                f.cancel()

    # --- GPU -----------------------------------------------------------------------------------------------

    def _gpu(self, files: Sequence[str | Path], batch_size: int, repeat: bool, epoch: int) -> Iterator[AudioBatch]:
        """Decoded by worker processes into shared memory (:mod:`.audio_feed`), a batch's samples uploaded
        in one copy per slab, the chain once per batch; decoding threads where shared memory is refused."""
        import sys

        import cupy as cp

        from ..engine.gpu.audio_feed import DecodeWorkers, SharedFeed
        from ..engine.settings import Settings

        # the pool's manager thread hands each worker its next task once it has the GIL, which this
        # thread holds while it launches a batch's work: a short switch interval keeps the workers fed
        interval = Settings.from_env().switch_interval
        if sys.getswitchinterval() > interval:
            sys.setswitchinterval(interval)
        with cp.cuda.Device(self.device.index):
            if self.feed == "processes":
                per_task = 8
                slabs = max(2 * self.workers, 2 * -(-batch_size // per_task) + 2)
                try:
                    self._decoders = self._decoders or DecodeWorkers(self.workers)
                    feed = SharedFeed(self._decoders, slabs, per_task, device=self.device.index,
                                      packed=self.flac_gpu)
                except OSError as e:  # no shared memory to be had (a small /dev/shm): threads
                    import warnings

                    warnings.warn(f"AudioPipeline: decoding in threads, shared memory refused ({e})", stacklevel=2)
                    self.feed = "threads"
                else:
                    try:
                        yield from self._batches(feed.items(file_visits(files, repeat, epoch),
                                                            leading_seconds(self.plan.ops)),
                                                 batch_size, len(files), feed.upload, cp)
                    finally:
                        feed.close()
                    return
            from ..engine.gpu.audio_feed import to_device

            def upload(group: list[tuple]) -> list[AudioData]:
                return to_device([it for _, it, _ in group])

            yield from self._batches(self._threads(files, repeat, epoch, batch_size), batch_size, len(files), upload, cp)

    def _threads(self, files: Sequence[str | Path], repeat: bool, epoch: int, batch_size: int) -> Iterator[tuple]:
        from ..engine.executor import ordered_map

        plan = self.plan

        def load(visit: tuple[str, str]) -> tuple[str, AudioData | RecordError, None]:
            path, key = visit
            try:
                return key, _load(path, key, plan), None
            except RecordError as e:
                return key, e, None

        yield from ordered_map(load, file_visits(files, repeat, epoch), self.workers,
                               window=max(2 * batch_size, 4 * self.workers))

    def _batches(self, items: Iterator[tuple], batch_size: int, files: int, upload: Any, cp: Any) -> Iterator[AudioBatch]:
        from ..engine.gpu.audio_chain import run_chain_device

        misses = 0
        group: list[tuple] = []
        t0 = time.perf_counter()
        for key, item, where in items:
            if isinstance(item, RecordError):
                misses = self._skip(item, misses, files)
                continue
            misses = 0
            group.append((key, item, where))
            if len(group) == batch_size:
                self.timings["decode"] += time.perf_counter() - t0
                if (b := self._gpu_batch(group, upload, run_chain_device, cp)) is not None:
                    yield b
                group = []
                t0 = time.perf_counter()
        if group and (b := self._gpu_batch(group, upload, run_chain_device, cp)) is not None:
            yield b

    def _gpu_batch(self, group: list[tuple], upload: Any, run_chain_device: Any, cp: Any) -> AudioBatch | None:
        t0 = time.perf_counter()
        if any(op.random for op in self.plan.ops):
            params = [self.plan.draw(k, *it.size) for k, it, _ in group]
        else:  # nothing drawn: every record's parameters are the same
            params = [self.plan.draw("", *group[0][1].size)] * len(group)
        dev = upload(group)
        bad = [i for i, d in enumerate(dev) if isinstance(d, RecordError)]
        if bad:  # (a FLAC file the GPU's decoder refused and the CPU could not decode either: skipped, named)
            for i in bad:
                self._skip(dev[i], 0, len(group) + 1)
            dropped = set(bad)
            keep = [i for i in range(len(dev)) if i not in dropped]
            group, dev, params = [group[i] for i in keep], [dev[i] for i in keep], [params[i] for i in keep]
            if not group:
                return None
        t1 = time.perf_counter()
        out = run_chain_device(self.plan.ops, dev, params)
        data = self._stack([_squeeze(o.samples) for o in out], cp).astype(self.dtype, copy=False)
        ready = cp.cuda.get_current_stream().record()  # the batch is not waited for here (see AudioBatch)
        self.timings["upload"] += t1 - t0
        self.timings["ops"] += time.perf_counter() - t1
        self.stats["items"] += len(group)
        return AudioBatch(data, [k for k, _, _ in group], ready=ready)

    def close(self) -> None:
        if self._threads_pool is not None:
            self._threads_pool.shutdown()
            self._threads_pool = None
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        if self._decoders is not None:
            self._decoders.close()
            self._decoders = None

    def __enter__(self) -> AudioPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
