"""Training from what gpubatch wrote: :func:`loader`, batches of decoded, transformed images with their
labels, split across distributed ranks and DataLoader workers, resumable mid-epoch.

The order of an epoch is one permutation of the dataset's samples that depends only on ``(seed, epoch)``
(``shuffle=False``: the dataset's order). Training steps walk it in global batches of ``batch_size x
world_size`` samples: at each step rank r takes the r-th ``batch_size`` of the global batch. The
position in the epoch is therefore one number, the samples consumed by all ranks together, which is
what :meth:`Loader.state_dict` keeps: restored under another world size, the rest of the epoch is the
same samples, cut into the new ranks' batches. A last global batch short of full is padded with the
epoch's first samples (``drop_last=False``: every rank gets as many batches, as DistributedDataParallel
needs) or dropped (``drop_last=True``). Inside a rank, a PyTorch DataLoader's workers (``batch_size=None``:
the loader batches itself) take every ``num_workers``-th batch, which the DataLoader hands out in turn:
the rank sees its batches in order, each once.

On the GPU an image batch lives in one of two output buffers: it stays valid until the next batch after
it has been taken (work queued on it before then, on any stream, finishes before the buffer is written
again); copy what must live longer. Images are read by the dataset's reader (every format gpubatch writes; this module ties the formats to the
pipelines, as :mod:`gpubatch.runner` ties them to the engine) and decoded and transformed by an
:class:`~gpubatch.pipelines.image.ImagePipeline` on the CPU or the GPU (``ops`` as ``--ops`` takes them,
or op objects); random ops draw per (seed, key, epoch). A record that cannot be read or decoded is left
out of its batch together with its label, and listed in :attr:`Loader.skipped`: rows and labels never
shift. Audio datasets (clips, waveforms or features gpubatch wrote) give ``"audio"`` batches through an
:class:`~gpubatch.pipelines.audio.AudioPipeline` the same way (its ops: resample, fix_duration, log_mel...;
one length a batch). Video datasets (videos, clips or decoded ``.npy`` clips gpubatch wrote) give ``"video"``
batches of one clip a record, (N, C, T, H, W) or (N, T, C, H, W), through a
:class:`~gpubatch.pipelines.video.VideoPipeline` (``clip_length`` frames ``frame_step`` apart, the clip's
position and its ops' parameters drawn per (seed, key, epoch)); a record too short for a clip is skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import UsageError

#: what a batch tuple may hold (``keys=``), besides a sample's other member names ("txt", "json"...)
FIELDS = ("key", "image", "audio", "video", "label", "meta", "boxes")
#: the media the loader decodes, and the key their decoded batch goes by
MEDIA_KEYS = {"image": "image", "audio": "audio", "video": "video"}
# the GPU image decoders' defaults for training, where GPUBATCH_RING_BANKS / GPUBATCH_REGION_DECODE say nothing:
# each batch decoded into one of two banks of buffers while the one before is read from the other, only the part
# of each upright JPEG the leading crop reads. Beside DALI's readers.webdataset on an H200 (2026-12-04, ae69e09)
# both together ran the training chain at 0.90-0.94x DALI's rate against 0.72-0.85x without, at the same
# 0.55-0.56x its GPU memory (benchmarks/RESULTS.md, "03:20 to 03:56")
LOADER_BANKS = 2
LOADER_REGIONS = True
_STATE = 1


@dataclasses.dataclass(frozen=True)
class Split:
    """Where this process stands: its rank of ``world_size``, and its DataLoader worker of ``workers``."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    workers: int = 1


@dataclasses.dataclass
class _Rows:
    """A batch's records as columns: what a training loop is handed besides the decoded data. The GPU
    path's reader processes send them so, with no object a record. A training process holds PyTorch's
    objects, which every full pass of Python's garbage collector walks (60-70 ms with the GIL held, the
    decoders' threads stopped), and objects a record that live across batches bring those passes on:
    3 in 600 batches against none (benchmarks/loader_gc.py, 2-core machine, 2026-12-02); on an H200 the
    slowest batches went from 109-131 ms to 20-26 ms (benchmarks/RESULTS.md)."""

    keys: list[str]
    origins: list[str]
    labels: list[int]  # (-1: none)
    metas: list[dict[str, Any]] | None = None  # (where asked for: "meta" or a member's name)
    boxes: list[Any] | None = None  # (where asked for)
    records: list[Any] | None = None  # the records themselves, where read in this process

    @classmethod
    def of(cls, records: list[Any]) -> _Rows:
        return cls([r.key for r in records], [r.origin for r in records],
                   [-1 if r.label is None else int(r.label) for r in records], [r.meta for r in records],
                   [r.boxes for r in records], records)

    def __len__(self) -> int:
        return len(self.keys)


def _base() -> type:
    """PyTorch's ``IterableDataset`` where PyTorch is installed (a DataLoader then takes the loader as one),
    else ``object``."""
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return object
    return IterableDataset


def _distributed() -> tuple[int, int] | None:
    """(rank, world size) from ``torch.distributed`` where it is initialised; None otherwise."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _torch_worker() -> tuple[int, int]:
    """(this DataLoader worker's id, the workers) inside a DataLoader's worker process; (0, 1) elsewhere."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The epoch's order of ``n`` samples: a permutation that depends only on ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(n).astype(np.int64)


def rank_batches(order: np.ndarray, start: int, batch_size: int, rank: int, world_size: int,
                 drop_last: bool) -> list[np.ndarray]:
    """The batches of ``rank`` from position ``start`` of the epoch's ``order``: at each global batch of
    ``batch_size x world_size``, its ``rank``-th part; a last global batch short of full is padded from the
    epoch's first samples to an equal part a rank (or dropped)."""
    step = batch_size * world_size
    rest = order[start:]
    full = len(rest) // step
    out = [rest[s * step + rank * batch_size: s * step + (rank + 1) * batch_size] for s in range(full)]
    tail = rest[full * step:]
    if len(tail) and not drop_last:
        per = -(-len(tail) // world_size)
        need = per * world_size - len(tail)
        padded = np.concatenate([tail, np.resize(order, need)]) if need else tail
        out.append(padded[rank * per:(rank + 1) * per])
    return out


class Loader(_base()):  # type: ignore[misc]
    """Batches of a dataset gpubatch wrote, for training (see the module's text): iterate it for one
    epoch's batches, a tuple each in the order ``keys`` names; iterated again after an epoch read to its
    end, it reads the next epoch (as ``set_epoch(epoch + 1)`` would). Usable as a PyTorch ``IterableDataset``
    (``DataLoader(loader, batch_size=None, num_workers=N)``). On the GPU the reads and decodes run on from
    the end of an epoch into the next one's first batches, so that a loop over epochs never waits for the
    reads to start again.

    Attributes:
        skipped: the records left out of their batch: ``{"key", "origin", "reason"}`` each.
        epoch: the epoch being read (:meth:`set_epoch`).
    """

    def __init__(self, path: str | Path, ops: Any = None, batch_size: int = 256, device: str = "auto",
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None, keys: Sequence[str] = ("image", "label"), fmt: str | None = None,
                 gpu: int = 0, num_workers: int | None = None, dtype: str | None = None, clip_length: int = 16,
                 frame_step: int = 1, layout: str = "NCTHW"):
        from .formats import open_reader

        if batch_size < 1:
            raise UsageError(f"batch_size must be >= 1, got {batch_size}")
        given = (rank, world_size)
        if (rank is None) != (world_size is None):
            raise UsageError("give rank and world_size together (or neither: torch.distributed's, else 0 of 1)")
        rank, world_size = given if rank is not None else (_distributed() or (0, 1))
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} of world_size {world_size}: give 0 <= rank < world_size")
        from ._remote import local_path

        self.path, self.fmt, self.keys = local_path(path), fmt, tuple(keys)  # (a URL: its mirror)
        self.batch_size, self.shuffle, self.seed, self.drop_last = int(batch_size), bool(shuffle), int(seed), drop_last
        self.rank, self.world_size = int(rank), int(world_size)
        self.device, self.gpu = device, gpu
        self.num_workers = num_workers  # the pipeline's decoding threads (None: its default, from the cores)
        self.dtype = dtype  # audio batches' dtype ("float16" by default, or "float32")
        self.clip_length, self.frame_step, self.layout = int(clip_length), int(frame_step), layout  # (video)
        self.ops = _ops(ops)
        self.epoch = 0
        self.skipped: list[dict[str, str]] = []
        self._consumed = 0  # samples of this epoch consumed by every rank together (whole global batches)
        self._started = 0  # where this epoch's reading started (0, or a restored state's)
        self._position: int | None = None  # in a DataLoader worker: the epoch's place after its last batch
        self._reader = open_reader(self.path, fmt)
        media = str(getattr(self._reader.media, "value", self._reader.media))
        if media not in MEDIA_KEYS:
            raise UsageError(f"the loader reads image, audio and video datasets; {self.path} holds {media} records")
        self.media = media
        other = set(MEDIA_KEYS.values()) - {MEDIA_KEYS[media]}
        if other & set(self.keys):
            raise UsageError(f"{self.path} holds {media} records: ask for {MEDIA_KEYS[media]!r}, not "
                             f"{' or '.join(repr(k) for k in sorted(other & set(self.keys)))}")
        self._entries = list(self._reader.entries())  # (the dataset indexed once: every sample's entry)
        self.classes = self._reader.info().classes
        self._pipe: Any = None
        self._readers: Any = None  # the GPU path's reader processes (a LoaderFeed), kept across epochs
        self._stream: Any = None  # the image batches being read and decoded ahead (_image_stream)
        self._stream_at: tuple | None = None  # (epoch, start, started, split) where that stream goes on
        self._finished = False  # this process read its batches of the epoch to their end
        self._worker: tuple[int, int] | None = None  # (id, count) given for tests; else torch's

    # -- order and state -------------------------------------------------------------------------------

    def __len__(self) -> int:
        """The batches the next iteration gives this rank: those left in the epoch (all of them at its
        start); once this process read the epoch to its end, the next epoch's, which iterating again reads."""
        if self._finished:
            return len(self._batches(self.epoch + 1, 0))
        return len(self._batches())

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its order and its random draws), from its start."""
        self.epoch, self._consumed, self._started, self._position = int(epoch), 0, 0, None
        self._finished = False

    def state_dict(self, batches_seen: int | None = None) -> dict[str, Any]:
        """Where the epoch stands: restored with :meth:`load_state_dict` (under any world size), the samples
        already consumed are not read again. Iterated in this process the loader counts its batches itself;
        through a DataLoader's workers, say how many batches this epoch's loop took (``batches_seen``, from
        where the epoch started or was restored)."""
        consumed, anchor = self._consumed, None
        if batches_seen is not None:
            consumed = min(len(self._entries), self._started + int(batches_seen) * self.batch_size * self.world_size)
        elif self._position is not None:  # a DataLoader worker's own copy (torchdata's StatefulDataLoader asks each):
            consumed, anchor = self._position, self._started  # where its batches stand, and whose turn they follow
        return {"version": _STATE, "epoch": self.epoch, "consumed": consumed, "seed": self.seed,
                "shuffle": self.shuffle, "samples": len(self._entries),
                "started": consumed if anchor is None else anchor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != _STATE:
            raise UsageError("not a state this loader wrote (state_dict())")
        for name, mine in (("samples", len(self._entries)), ("seed", self.seed), ("shuffle", self.shuffle)):
            if state.get(name) != mine:
                raise UsageError(f"the state is of another loader: {name} {state.get(name)!r} there, {mine!r} here")
        self.epoch, self._consumed = int(state["epoch"]), int(state["consumed"])
        self._started = int(state.get("started", self._consumed))
        self._position, self._finished = None, False

    def _batches(self, epoch: int | None = None, consumed: int | None = None) -> list[np.ndarray]:
        """This rank's batches of ``epoch`` (this one) from position ``consumed`` (where it stands)."""
        epoch, consumed = (self.epoch if epoch is None else epoch), (self._consumed if consumed is None else consumed)
        order = epoch_order(len(self._entries), self.seed, epoch, self.shuffle)
        return rank_batches(order, consumed, self.batch_size, self.rank, self.world_size, self.drop_last)

    def _mine(self, epoch: int, start: int, started: int, split: Split) -> list[tuple[int, np.ndarray]]:
        """This process's batches of ``epoch`` from position ``start``: (their index from ``start``, rows). The
        workers take turns from where every worker started (the epoch's start, or the state restored:
        ``started``); a worker restored at its own place (StatefulDataLoader) takes the batches of its turns
        after it."""
        order = epoch_order(len(self._entries), self.seed, epoch, self.shuffle)
        batches = rank_batches(order, start, self.batch_size, self.rank, self.world_size, self.drop_last)
        turn = (start - started) // (self.batch_size * self.world_size)
        return [(b, rows) for b, rows in enumerate(batches) if (turn + b) % split.workers == split.worker]

    def split(self) -> Split:
        w, n = self._worker or _torch_worker()
        return Split(self.rank, self.world_size, w, n)

    # -- batches ---------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        if self._finished:  # (this epoch was read to its end here: iterating again reads the next one)
            self.set_epoch(self.epoch + 1)
        split = self.split()
        step = self.batch_size * self.world_size
        start, started = self._consumed, self._started
        mine = self._mine(self.epoch, start, started, split)

        def handed(b: int, batch: tuple[Any, ...]) -> tuple[Any, ...]:
            position = min(len(self._entries), start + (b + 1) * step)
            if split.workers == 1:  # (read in this process: it knows what was consumed, this batch included)
                self._consumed = position
            else:  # (a DataLoader worker: where its own batches stand)
                self._position = position
            return batch

        if self.media != "image" or "image" not in self.keys:
            from .engine.executor import prefetched

            # the next batches' records are read (preads, parsing) in a thread while this one decodes
            read = prefetched(((b, self._read(rows)) for b, rows in mine), 2)
            try:
                for b, got in read:
                    yield handed(b, self._batch(got))
            finally:
                read.close()
            self._finished = True
            return
        at = (self.epoch, start, started, split)
        if self._stream is None or self._stream_at != at:  # (a new stream where the last one does not go on)
            self._drop_stream()
            self._stream = self._image_stream(self.epoch, start, started, split)
        runs_on = self._feed(self._pipeline()) is not None  # (the stream reads on into the next epoch)
        for n, (b, _) in enumerate(mine):
            try:
                epoch, b_read, records, failed, decoded = next(self._stream)
            except BaseException:  # (a stream that raised is spent: the next iteration starts its own)
                self._drop_stream()
                raise
            if (epoch, b_read) != (self.epoch, b):
                raise RuntimeError(f"the loader's stream read batch {b_read} of epoch {epoch} for batch {b} of "
                                   f"epoch {self.epoch}")
            # where the stream goes on: the next epoch's start after this epoch's last batch; a loop that
            # stops mid-epoch and iterates again starts a stream of its own
            last = n == len(mine) - 1
            self._stream_at = (self.epoch + 1, 0, 0, split) if last and runs_on else None
            self._finished = last
            yield handed(b, self._batch((records, failed), decoded))
        self._finished = True

    def _image_stream(self, epoch: int, start: int, started: int, split: Split) -> Iterator[tuple[Any, ...]]:
        """(epoch, batch index, records, failed, decoded) of this process's image batches from position
        ``start`` of ``epoch``, in order, read a few batches ahead and decoded one ahead. On the GPU the
        records are read in worker processes (a LoaderFeed, kept across epochs), and the stream runs on into
        the next epochs from their start (a loop that reads them takes up their batches with nothing to wait
        for: :meth:`__iter__` goes on with this stream where it stands); elsewhere they are read in a
        thread, this epoch's only."""
        from collections import deque

        pending: deque = deque()  # (epoch, b, records, failed) in batch order; a batch of no records is not decoded
        pipe = self._pipeline()
        feed = self._feed(pipe)

        def plan() -> Iterator[tuple[int, int, np.ndarray]]:
            e, s, st = epoch, start, started
            while True:
                mine = self._mine(e, s, st, split)
                yield from ((e, b, rows) for b, rows in mine)
                if feed is None or not mine:  # (the CPU's reads stop at the epoch's end; so does an empty epoch)
                    return
                e, s, st = e + 1, 0, 0

        def blobs() -> Iterator[tuple[Any, ...]]:
            if feed is not None:
                planned: deque = deque()

                def reads() -> Iterator[tuple[int, list[Any]]]:
                    for e, b, rows in plan():
                        planned.append((e, b))
                        yield e, [self._entries[i] for i in rows.tolist()]

                for fed in feed.reading(reads()):
                    e, b = planned.popleft()
                    got = _Rows(fed.keys, fed.origins, fed.labels, fed.metas, fed.boxes)
                    pending.append((e, b, got, fed.failed))
                    if got:
                        yield fed.blobs, fed.keys, fed
                    else:
                        fed.done()
                return
            for e, b, rows in plan():
                got, failed = self._read(rows)
                pending.append((e, b, got, failed))
                if got:
                    yield [r.data for r in got.records], got.keys, None

        def empties() -> Iterator[tuple[Any, ...]]:
            while pending and not pending[0][2]:
                yield (*pending.popleft(), None)

        unpin = pipe.engine.pin_host(feed.shm.buf) if feed is not None and pipe.settings.pin_feed else None
        decoded = pipe._iterate(blobs(), 1, on_stop=feed.stop if feed is not None else None,
                                ordered_release=unpin is not None, epoch=epoch)
        try:
            for out in decoded:
                yield from empties()
                yield (*pending.popleft(), out)
            yield from empties()
        finally:
            decoded.close()
            if unpin is not None:
                unpin()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream, self._stream_at = None, None

    def _feed(self, pipe: Any) -> Any:
        """The worker processes that read the GPU's batches (a LoaderFeed, made once: its processes read
        every epoch after), or None: on the CPU, or inside a daemonic process (a DataLoader's worker), which
        may start none."""
        import functools
        import multiprocessing as mp

        if pipe.engine is None or mp.current_process().daemon:
            return None
        from .engine.gpu.feed import LoaderFeed
        from .engine.processes import default_readers
        from .formats import open_reader

        if self._readers is None:
            st = pipe.settings
            self._readers = LoaderFeed(functools.partial(open_reader, self.path, self.fmt), pipe.plan, fields=self.keys,
                                       workers=st.loader_readers or default_readers(route=pipe.engine.decoder.route),
                                       depth=st.feed_slots + (st.held_slots if st.pin_feed else 0),
                                       slot_bytes=st.feed_slot_bytes, regions=pipe.region_decode)
        return self._readers

    def _pipeline(self) -> Any:
        if self._pipe is None and self.media == "video":
            from .pipelines.video import VideoPipeline

            self._pipe = VideoPipeline(self.ops, clip_length=self.clip_length, frame_step=self.frame_step,
                                       device=self.device, gpu=self.gpu, seed=self.seed, layout=self.layout,
                                       workers=self.num_workers)
        elif self._pipe is None and self.media == "audio":
            from .pipelines.audio import AudioPipeline

            self._pipe = AudioPipeline(self.ops, device=self.device, gpu=self.gpu, seed=self.seed,
                                       dtype=self.dtype or "float16", workers=self.num_workers)
        elif self._pipe is None:
            from .engine.settings import Settings
            from .pipelines.image import ImagePipeline

            st = Settings.from_env()
            self._pipe = ImagePipeline(self.ops, device=self.device, seed=self.seed, gpu=self.gpu,
                                       cpu_threads=self.num_workers, ring=2,
                                       region_decode=LOADER_REGIONS if st.region_decode is None else st.region_decode,
                                       settings=st.with_(ring_banks=st.ring_banks or LOADER_BANKS))
        return self._pipe

    def _read(self, rows: np.ndarray) -> tuple[_Rows, list[dict[str, str]]]:
        """The records of a batch's rows, and those that could not be read (left out, with their labels)."""
        from .engine.run import read_rows

        records, failed = read_rows(self._reader, [self._entries[i] for i in rows.tolist()])
        return _Rows.of(records), failed

    def _batch(self, got: tuple[_Rows, list[dict[str, str]]], decoded: Any = None) -> tuple[Any, ...]:
        """A batch's tuple from its records (``decoded``: their images' batch, where decoded already)."""
        rows, failed = got
        self.skipped.extend(failed)
        media_key = MEDIA_KEYS[self.media]
        left: dict[int, str] = {}  # the rows that give no sample, with why
        if media_key in self.keys and rows and self.media in ("audio", "video"):
            # (a clip or a recording a record; those that give none named with their reason)
            if self.media == "video":
                batch, failures = self._pipeline().records(rows.records, epoch=self.epoch)
            else:
                batch = self._pipeline().records(rows.records, epoch=self.epoch)
                failures = batch.failed
            bad = dict(failures)
            left = {i: f"decode: {bad[k]}" for i, k in enumerate(rows.keys) if k in bad}
        elif media_key in self.keys and rows:
            # (random ops draw per (seed, key, epoch))
            batch = decoded if decoded is not None else self._pipeline()([r.data for r in rows.records], rows.keys,
                                                                         epoch=self.epoch)
            why, done = dict(batch.failed), set(_kept(rows.keys, list(batch.keys)))
            left = {i: f"decode: {why.get(k, 'decode failed')}" for i, k in enumerate(rows.keys) if i not in done}
        else:
            batch = None
        for i, reason in left.items():
            self.skipped.append({"key": rows.keys[i], "origin": rows.origins[i], "reason": reason})
        kept = [i for i in range(len(rows)) if i not in left] if left else range(len(rows))
        out = []
        for name in self.keys:
            if name == MEDIA_KEYS[self.media]:
                out.append(batch)
            elif name == "label":
                out.append(np.asarray([rows.labels[i] for i in kept], np.int64))
            elif name == "key":
                out.append([rows.keys[i] for i in kept])
            elif name == "meta":
                out.append([dict(rows.metas[i]) for i in kept])  # type: ignore[index]
            elif name == "boxes":
                out.append([rows.boxes[i] for i in kept])  # type: ignore[index]
            else:
                from .formats.base import MEMBERS

                out.append([(rows.metas[i].get(MEMBERS) or {}).get(name) for i in kept])  # type: ignore[index]
        return tuple(out)

    def close(self) -> None:
        self._drop_stream()
        if self._readers is not None:
            self._readers.close()
            self._readers = None
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        self._reader.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # (to a DataLoader's worker processes: each opens its own)
        state = dict(self.__dict__)
        state["_reader"], state["_pipe"], state["_readers"] = None, None, None
        state["_stream"], state["_stream_at"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from .formats import open_reader

        self.__dict__.update(state)
        self._reader = open_reader(self.path, self.fmt)
        self._reader.entries()


def _kept(keys: list[str], got: list[str]) -> list[int]:
    """The positions in ``keys`` of a batch's rows ``got`` (``keys`` with the failed ones left out, in order;
    keys may repeat)."""
    out, j = [], 0
    for i, k in enumerate(keys):
        if j < len(got) and got[j] == k:
            out.append(i)
            j += 1
    return out


def _ops(ops: Any) -> tuple[Any, ...]:
    if ops is None:
        return ()
    if isinstance(ops, str):
        from .engine.spec import parse_chain

        return tuple(parse_chain(ops))
    return tuple(ops)


def loader(path: str | Path, ops: Any = None, **options: Any) -> Loader:
    """A :class:`Loader` over the dataset gpubatch wrote at ``path`` (see :mod:`gpubatch.training`)."""
    return Loader(path, ops, **options)
