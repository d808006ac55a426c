"""Shard tasks, planned from the entry list before any data moves.

A run's entries (after ``--limit`` and ``--shuffle``) are cut into consecutive ranges of input records,
each one output shard (or, for formats without shards, one spooled part) with its name fixed up front:
``NAME-00003-of-00032.tfrecord`` is known before the first record is read. The cut depends on the entry
count, the shard size and the outputs per input record only, never on the workers or GPUs that run it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ...types import ShardTask

#: ``--shard-size auto``: output records per shard, at most (webdataset's and TFRecord's usual shard of
#: 10,000 records), and at least, by the media of the records read (below that a shard's fixed costs
#: show; a video or a long recording is work enough for a shard of its own)
AUTO_MAX = 10_000
AUTO_MIN = {"image": 256, "audio": 16, "video": 2}  # (2: a one-record TFRecord shard breaks the tfrecord package's index reader)
#: ``auto`` cuts a dataset into about this many shards where the bounds allow: enough that every core of a
#: 16-core host (or the GPU's feed) has shards to work on while others finish, whatever machine runs it
AUTO_SHARDS = 64
#: ``auto`` for an output whose tasks are units of work only (a format without shards that asks for it,
#: :attr:`~gpubatch.formats.base.Format.auto_units`): at least this many outputs a task, by media. Smaller
#: tasks leave a shorter tail where workers finish at different times: 16,384 images to a folder on 16
#: cores ran 6.24 s (median of 3) in tasks of 64 against 6.70 s in tasks of 256 (H200 host, 2026-12-02)
UNIT_MIN = {"image": 64, "audio": 16, "video": 2}


def inputs_per_shard(n_entries: int, shard_size: int | None, outputs_per_input: float = 1.0,
                     media: str = "image", units: int | None = None) -> int:
    """Input records a shard takes: ``shard_size`` output records' worth (``--shard-size`` counts what
    is written: an augment run of ``--copies 4`` writes 4 a record); ``None`` is ``auto`` (about
    :data:`AUTO_SHARDS` shards of the media's :data:`AUTO_MIN` to :data:`AUTO_MAX` outputs each; or, with
    ``units``, about that many tasks of :data:`UNIT_MIN` to :data:`AUTO_MAX`)."""
    per = max(outputs_per_input, 1e-9)
    if shard_size is None:
        total = n_entries * per
        least = (UNIT_MIN if units else AUTO_MIN).get(media, AUTO_MIN["image"])
        shard_size = int(min(AUTO_MAX, max(least, math.ceil(total / (units or AUTO_SHARDS)))))
    return max(1, int(shard_size / per))


def plan_shards(entries: Sequence[Any], per_shard: int, names: Callable[[int], list[str]]) -> list[ShardTask]:
    """The tasks of a run: consecutive ranges of ``per_shard`` entries, a last range of one entry merged
    into the one before (a one-record shard breaks the ``tfrecord`` package's index reader), named by
    ``names(count)``."""
    n = len(entries)
    bounds = list(range(0, n, per_shard)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1 and per_shard > 1:
        bounds.pop(-2)
    ranges = list(zip(bounds[:-1], bounds[1:])) or [(0, 0)]
    shard_names = names(len(ranges))
    return [ShardTask(i, a, b, shard_names[i], tuple(entries[a:b])) for i, (a, b) in enumerate(ranges)]
