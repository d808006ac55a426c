"""The run's journal: what a staging folder holds of a run, shard by shard, so that ``--resume`` runs only
the shards not yet committed.

``.gpubatch/run.json`` names the run (its fingerprint: the command, the options that shape the output,
the source's entries, the device kind, the planned shards); ``.gpubatch/journal/<shard>.json`` is written
by the worker that committed a shard, once its files are in place (a :class:`~gpubatch.types.ShardResult`:
input range, counts, skipped records with reasons, output files with their digests). Each is written to a
temporary name, fsynced and renamed: a journal entry is there whole or not at all, and a shard is done
exactly when its entry is there.

Under ``--sync end|off`` (nothing fsynced as the run goes) an entry also names the machine's boot
(``unsynced``): in that boot the page cache holds what the shard wrote, whatever killed the run; in another
the entry and its files may have reached the disk in any order, so the files' digests are read back and
a shard whose files are not what its entry says (or that has no digests to say it) runs again. Under
``--sync end`` a machine's share of a run that ends before the dataset is made (a part, a Ray actor)
syncs its file system, then names the entries it synced in ``.gpubatch/synced/`` (:meth:`Journal.settle`):
those are taken by their sizes in any boot.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..._commit import (
    boot_id,
    file_digest,
    moved_shards,
    partial_name,
    sync_as,
    sync_filesystem,
    sync_mode,
    trusted,
    unsynced_mark,
    write_json,
)
from ...errors import GpubatchError, UsageError
from ...types import ShardResult

RUN_DIR = ".gpubatch"  # (formats.sinks.RUN_DIR: the same folder)
SCHEMA = 1


def entries_digest(entries: Any) -> str:
    """A short digest of a run's entry list (what the source holds, in the order the run takes it)."""
    text = "\n".join(map(repr, entries))  # (each entry's repr and a newline: one update, the digest as before)
    return hashlib.blake2b(f"{text}\n".encode("utf-8", "surrogateescape") if entries else b"",
                           digest_size=12).hexdigest()


def difference(old: Any, new: Any, where: str = "") -> str | None:
    """The first place two fingerprints differ ("options.quality: 90 then, 85 now"), or None."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in sorted(set(old) | set(new), key=str):
            said = difference(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))
            if said:
                return said
        return None
    if old != new:
        return f"{where or 'the run'}: {old!r} then, {new!r} now"
    return None


class Journal:
    """The journal of the run being written into ``stage``."""

    def __init__(self, stage: Path, store: Any = None):
        self.stage = Path(stage)
        self.dir = self.stage / RUN_DIR
        self.entries = self.dir / "journal"
        #: where the run's files go besides the staging folder (a store: gpubatch._publish), or None: it
        #: holds the journal too (``begin``, ``record``) and the shards' data (``present``)
        self.store = store

    @property
    def run_file(self) -> Path:
        return self.dir / "run.json"

    def exists(self) -> bool:
        return self.run_file.is_file()

    def begin(self, fingerprint: Mapping[str, Any], run: Mapping[str, Any] | None = None) -> None:
        """Start a new run's journal: its fingerprint, and ``run``: what ``gpubatch finish`` needs to finish
        it (the command, its request, the device kind, the parts it was cut into)."""
        self.entries.mkdir(parents=True, exist_ok=True)
        write_json(self.run_file, {"schema": SCHEMA, "fingerprint": dict(fingerprint), "run": dict(run or {})})
        if self.store is not None:
            self.store.begin(self.stage)

    def _doc(self) -> dict[str, Any]:
        """``run.json``, read and checked; a GpubatchError where it is damaged or no gpubatch journal at all."""
        try:
            doc = json.loads(self.run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise GpubatchError(f"{self.run_file} is no readable gpubatch journal ({e}): pass --overwrite to start "
                                "over") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("fingerprint"), dict):
            raise GpubatchError(f"{self.run_file} is not a journal this gpubatch writes: pass --overwrite to start "
                                "over")
        return doc

    def run(self) -> dict[str, Any]:
        """What :meth:`begin` was told of the run."""
        run = self._doc().get("run")
        return run if isinstance(run, dict) else {}

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint of the run that wrote this journal."""
        return self._doc()["fingerprint"]

    def check(self, fingerprint: Mapping[str, Any]) -> None:
        """Refuse to resume a run that differs from this one, naming the difference."""
        said = difference(self.fingerprint(), dict(fingerprint))
        if said:
            raise UsageError(f"--resume: the interrupted run in {self.stage.name} was another command ({said}); "
                             "run that command to finish it, or pass --overwrite to start this one over")

    def record(self, result: ShardResult) -> ShardResult:
        """A committed shard's journal entry (the worker that committed it writes it; where the run's files
        go to a store, after they are up, and the entry too). Returns the result as its entry reads back
        (JSON's lists for tuples): what the run's end gets, whether the shard was written now or before a resume."""
        entry = json.loads(json.dumps(result.as_dict()))
        if self.store is not None:
            self.store.publish_shard(self.stage, result.files)
        write_json(self.entries / f"{result.index:06d}.json", {**entry, **unsynced_mark()})
        if self.store is not None:
            self.store.publish_entry(f"{result.index:06d}.json", entry)
        return ShardResult.from_dict(entry)

    def committed(self, tasks: list[Any]) -> dict[int, ShardResult]:
        """The shards of ``tasks`` this journal holds as committed, whose files are all in place at the
        sizes written; an entry that is damaged, names other files or misses some is not counted (its shard
        runs again)."""
        done: dict[int, ShardResult] = {}
        if self.store is not None:  # (what the store holds now: listed once)
            self.store.listing(fresh=True)
        settled = self._settled()
        moved = moved_shards(self.stage)  # (shards whose files a finalize begun during the run moved to their names)
        for task in tasks:  # (each task's own entry: a worker asking about its few reads no other)
            try:
                doc = json.loads((self.entries / f"{task.index:06d}.json").read_text(encoding="utf-8"))
                result = ShardResult.from_dict(doc)
                mark = doc.get("unsynced")  # (where not trusted, its files' bytes are read back: the module's doc)
                whole = trusted(mark) or (mark, task.index) in settled
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue
            if (task.index, task.name, task.start, task.stop) != (result.index, result.name, result.start,
                                                                  result.stop) or not (whole or result.files):
                continue  # (another shard's; or not synced, in another boot, with no files to check: LMDB's)
            if whole and result.index in moved:  # (its files at their names now: the finalize finds them there)
                done[result.index] = result
            elif all(_present(self.stage / name, meta, whole) or (self.store is not None and isinstance(meta, list)
                                                                  and self.store.present(name, meta[0]))
                     for name, meta in result.files.items()):
                done[result.index] = result
        return done

    def settle(self) -> None:
        """Under ``--sync end``, where this machine's share of the run ends before the dataset is made (a part,
        a Ray actor): the entries of this boot listed, the file system synced, then a note naming them
        (``synced/``, one a process: several may settle at once), so that a resume in another boot takes
        them by their sizes. Nothing elsewhere: under ``shard`` each is synced already, under ``off`` none is."""
        boot = boot_id()
        if sync_mode() != "end" or boot is None or not self.entries.is_dir():
            return
        mine = []
        for path in sorted(self.entries.glob("*.json")):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                if doc.get("unsynced") == boot:
                    mine.append(int(doc["index"]))
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue
        sync_filesystem(self.stage)
        if mine:
            with sync_as("shard"):  # (the note itself durable before it counts)
                write_json(partial_name(self.dir / "synced" / f"{boot}.json").with_suffix(".json"),
                           {"boot": boot, "shards": mine})

    def _settled(self) -> set[tuple[str, int]]:
        """(boot, shard index) of every entry a :meth:`settle` note names."""
        out: set[tuple[str, int]] = set()
        for path in (self.dir / "synced").glob("*.json") if (self.dir / "synced").is_dir() else ():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                out.update((str(doc["boot"]), int(i)) for i in doc["shards"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
                continue
        return out

    def results(self, tasks: list[Any], known: dict[int, ShardResult] | None = None) -> list[ShardResult]:
        """Every task's result, in shard order (all must be committed). ``known``: results this process
        holds already (the shards its own workers just committed, and those :meth:`committed` found at the
        run's start, each as its entry reads back: :meth:`record`), by shard index; only the others are
        read from the journal and checked."""
        known = known or {}
        rest = [t for t in tasks if t.index not in known]
        done = {**known, **(self.committed(rest) if rest else {})}
        missing = [t.name for t in tasks if t.index not in done]
        if missing:
            raise GpubatchError(f"{len(missing)} shard{'s are' if len(missing) > 1 else ' is'} not committed "
                                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
        return [done[t.index] for t in tasks]


def _present(path: Path, meta: Any, whole: bool = True) -> bool:
    """Whether a committed file is there as its entry says: its size; where the entry was not synced in
    another boot (not ``whole``), its bytes' digest too (a file without one is not taken)."""
    try:
        if not (isinstance(meta, list) and path.stat().st_size == meta[0]):
            return False
        return whole or (len(meta) > 1 and meta[1] is not None and file_digest(path) == meta[:2])
    except OSError:
        return False
