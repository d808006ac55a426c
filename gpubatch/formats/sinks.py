"""Shard sinks: how a worker writes the records of one shard and commits them, and how a format's
dataset-wide files are made from every shard's result once they are all committed (``finalize``).

A sink writes each of its files under a temporary name (``.partial``), and :meth:`ShardSink.commit`
flushes, fsyncs and renames them to their final names, then fsyncs the folder: a shard is on disk whole
or not at all (the run's journal entry, written after, is what marks it done). Nothing dataset-wide
lives in a sink: key uniqueness across shards, file lists, COCO's JSON and DALI's global index come
from ``finalize`` over the shards' results.

Formats with shards (webdataset, tfrecord, recordio, parquet) write their shard files straight. The
folder format writes a shard's files under ``.gpubatch/parts/<shard>/`` (one ``syncfs`` commits them),
and its finalize moves them to their names in shard order (renames: no byte is copied). LMDB's workers
put their shards into the one database in shard order themselves (:mod:`.lmdb_sink`). The others (COCO,
VOC, YOLO, the video and audio layouts) spool a shard's records into one file under
``.gpubatch/spool/``, and their finalize writes the dataset from the spools in shard order through the
format's writer. Either way: the same files, names and bytes as one writer in one process would make.

Under ``--sync end`` or ``off`` (the options' ``extra["sync"]``, taken by each sink for its process: see
:mod:`gpubatch._commit`) nothing here is fsynced; the files and renames are the same.
"""

from __future__ import annotations

import abc
import os
import pickle
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .._commit import (  # noqa: F401 - the sinks' helpers
    PARTIAL,
    ShardFile,
    file_digest,
    fsync_dir,
    set_sync,
    sync_filesystem,
    syncing,
)
from ..types import DatasetInfo, Record, ShardResult, ShardTask

#: gpubatch's own folder inside a staging folder: the run's journal and the spools (gone once finished)
RUN_DIR = ".gpubatch"


class ShardSink(abc.ABC):
    """Writes the records of one shard (``task``) into the staging folder ``root``.

    Subclasses write through :class:`ShardFile` objects (or note the files they write in ``pending``)
    and return what finalize needs from :meth:`_close` (the committed files are added)."""

    def __init__(self, root: Path, task: ShardTask, info: DatasetInfo, options: Any):
        self.root, self.task, self.info, self.options = Path(root), task, info, options
        set_sync((getattr(options, "extra", None) or {}).get("sync"))  # (this process's run's --sync)
        self.count = 0
        self.bytes = 0
        self.warnings: list[str] = []
        self.files: list[ShardFile] = []
        #: seconds its commit spent in steps of its own (LMDB's lock and sync), added to the shard's timings
        self.timings: dict[str, float] = {}

    @abc.abstractmethod
    def write(self, record: Record) -> None:
        """Add one record (ValueError where it does not fit the format: that record's error)."""

    def write_many(self, records: list[Record]) -> list[BaseException | None]:
        """Add ``records`` in order, as :meth:`write` does one: per record, None, or the error that kept it
        out (ValueError or RecursionError: it does not fit the format). Sinks that write many records at
        once faster than one by one override it; the bytes are those of :meth:`write`."""
        errors: list[BaseException | None] = []
        for record in records:
            try:
                self.write(record)
                errors.append(None)
            except (ValueError, RecursionError) as e:
                errors.append(e)
        return errors

    def _close(self) -> dict[str, Any]:
        """Finish the shard's files (before they are committed); what finalize needs of the shard."""
        return {}

    def commit(self) -> tuple[dict[str, list], dict[str, Any]]:
        """Finish, fsync and rename the shard's files into place: (files -> [bytes, digest], extra)."""
        extra = self._close()
        files = dict(f.commit() for f in self.files)
        fsync_dir(self.root)
        return files, extra

    def abort(self) -> None:
        """Remove what the shard wrote (a shard that failed; its task runs again)."""
        for f in self.files:
            f.abort()


class SpoolSink(ShardSink):
    """A shard of a format without shards: its records, pickled one after the other into
    ``.gpubatch/spool/<name>.spool`` for the format's finalize to write in shard order."""

    def __init__(self, root: Path, task: ShardTask, info: DatasetInfo, options: Any):
        super().__init__(root, task, info, options)
        self.spool = ShardFile(Path(root) / RUN_DIR / "spool", f"{task.name}.spool")
        self.files.append(self.spool)

    def write(self, record: Record) -> None:
        self.spool.write(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))  # (one pickle a record)
        self.count += 1
        self.bytes += len(record.data)

    def commit(self) -> tuple[dict[str, list], dict[str, Any]]:
        files, extra = super().commit()
        fsync_dir(self.spool.path.parent)
        return {f"{RUN_DIR}/spool/{k}": v for k, v in files.items()}, extra


def spooled(root: Path, name: str) -> Any:
    """The records of a committed spool, in the order they were written."""
    with open(Path(root) / RUN_DIR / "spool" / f"{name}.spool", "rb") as f:
        while True:
            try:
                yield pickle.load(f)
            except EOFError:
                return


def replay_spools(fmt: Any, root: Path, shards: Sequence[ShardResult], info: DatasetInfo, options: Any) -> list[str]:
    """A spooling format's finalize: every shard's records, in shard order, through the format's writer
    (which makes the dataset-wide files as it always has), each spool removed once written; the writer's
    warnings."""
    clear_outside_run(root)  # what a finalize killed part way left: written again whole
    writer = fmt.writer(root, info, options)
    with writer:
        for shard in shards:
            for record in spooled(root, shard.name):
                writer.write(record)
    return list(writer.warnings)  # (the spools go with the run's folder, once the dataset is complete)


def clear_outside_run(root: Path) -> None:
    """Remove everything in a staging folder but the run's own folder (its journal, spools and parts): a
    finalize starts from the committed shards alone, whatever an interrupted one left."""
    for p in Path(root).iterdir():
        if p.name == RUN_DIR:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


class PartsSink(ShardSink):
    """A shard of a format of one file a record (folder): each record's bytes in a file of its own under
    ``.gpubatch/parts/<name>/`` (``<n>.<ext>``), with what finalize needs to name it (the record's file
    name, key and label) in the shard's result. The commit syncs the file system once (``syncfs``), not
    each file; finalize renames the files into place in shard order."""

    def __init__(self, root: Path, task: ShardTask, info: DatasetInfo, options: Any):
        super().__init__(root, task, info, options)
        self.folder = Path(root) / RUN_DIR / "parts" / task.name
        if self.folder.exists():  # what an interrupted worker left of this shard
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        self.parts: list[list] = []  # [part file, file name, key, label]
        self.written: dict[str, list] = {}

    def write(self, record: Record) -> None:
        ext = record.filename.rsplit(".", 1)[-1] if "." in record.filename else "bin"
        part = f"{len(self.parts):07d}.{ext}"
        with open(self.folder / part, "wb") as f:
            f.write(record.data)
        self.written[f"{RUN_DIR}/parts/{self.task.name}/{part}"] = [len(record.data), None]
        self.parts.append([part, record.filename, record.key, record.label])
        self.count += 1
        self.bytes += len(record.data)

    def commit(self) -> tuple[dict[str, list], dict[str, Any]]:
        if syncing():
            sync_filesystem(self.folder)
        fsync_dir(self.folder)
        return dict(self.written), {"parts": self.parts}

    def abort(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def parts_of(root: Path, shard: ShardResult) -> Iterator[tuple[str, str, str, int | None]]:
    """A committed :class:`PartsSink` shard's files in the order written: (path, file name, key, label)."""
    folder = os.path.join(root, RUN_DIR, "parts", shard.name)
    for part, filename, key, label in shard.extra.get("parts", []):
        yield os.path.join(folder, part), filename, key, label
