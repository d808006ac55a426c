"""A dataset written to object storage (``s3://``, ``gs://``, ``az://``...) or through webdataset's
``pipe:CMD``, shard by shard.

The run works in a local staging folder under gpubatch's cache as for a local destination; each worker,
once it has committed a shard there, uploads the shard's files under their final names (exclusive
create where the store offers it; an object already there at the same size is a shard an interrupted
run uploaded), then the shard's journal entry (``DST/.gpubatch/journal/``), and deletes its local copy of
the shard's data. After finalize, the dataset-wide files (indexes, ``wids.json``) go up, the manifest
``gpubatch.json`` last, and the run's ``.gpubatch/`` folder is removed: a dataset in a store is complete
exactly when its manifest is there. ``--resume`` reads the journal back from the store (on this machine
or another); ``--overwrite`` removes what the destination held first.

A ``pipe:CMD`` destination runs ``CMD`` once for each file, with ``{name}`` replaced by the file's name
and the file on its standard input (``pipe:aws s3 cp - s3://bucket/out/{name}``); what a command wrote
cannot be listed back, so the journal stays in the local staging folder (``--resume`` on this machine).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ._paths import staged_output, staging_folder
from ._remote import _digest, cache_root, filesystem, redact, store_errors
from .errors import GpubatchError, UsageError

RUN_DIR = ".gpubatch"
MANIFEST = "gpubatch.json"
#: shard files above this size are removed from the staging folder once uploaded (indexes stay for finalize)
KEEP_LOCAL = 1 << 20
#: the formats a store takes: those written as shard files (a folder of one file a record, an LMDB or a
#: COCO JSON are made whole by finalize)
SHARDED = ("webdataset", "tfrecord", "recordio", "parquet")


class Destination:
    """Where a run's files go in a store (picklable: a worker process uploads its own shards)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._fs: Any = None
        self._listing: dict[str, int] | None = None
        self.uploaded: set[str] = set()  # the files the shards uploaded (the runner notes them before finish)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None, "_listing": None}

    @property
    def shown(self) -> str:
        return redact(self.url)

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = filesystem(self.url)[0]
        return self._fs

    def _key(self, name: str) -> str:
        return posixpath.join(self.url.split("://", 1)[-1], name)

    def shadow(self) -> Path:
        """The local path the run's staging folder lies beside (gpubatch's cache, one a destination)."""
        return cache_root() / "out" / _digest(self.url) / "dataset"

    # -- what the store holds --
    def listing(self, fresh: bool = False) -> dict[str, int]:
        """Every object under the destination: relative name -> size."""
        if self._listing is None or fresh:
            base = self.url.split("://", 1)[-1]
            with store_errors(self.url, "listing"):
                self.fs.invalidate_cache(base)  # (what the store holds now: the other processes' uploads too)
                try:
                    found = self.fs.find(base, detail=True, withdirs=False)
                except FileNotFoundError:
                    found = {}
            self._listing = {posixpath.relpath(k, base): int(v.get("size") or 0) for k, v in found.items()}
        return self._listing

    def present(self, name: str, size: int) -> bool:
        return self.listing().get(name) == size

    def manifest(self) -> dict | None:
        """The dataset's manifest where the store holds one (the dataset is complete), else None."""
        with store_errors(self.url):
            try:
                return json.loads(self.fs.cat_file(self._key(MANIFEST)))
            except (FileNotFoundError, ValueError):
                return None

    def clear(self) -> int:
        """Remove every object under the destination: how many."""
        names = list(self.listing(fresh=True))
        if names:
            with store_errors(self.url, "removing the objects of"):
                self.fs.rm([self._key(n) for n in names])
        self._listing = {}
        return len(names)

    # -- writing --
    def put(self, local: Path, name: str) -> None:
        """``local`` uploaded as ``name`` (multipart where large: the store's package decides), created only
        where no object is there; one already there at the same size is left (an interrupted run's)."""
        key = self._key(name)
        size = local.stat().st_size
        with store_errors(f"{self.url}/{name}", "uploading to"):
            try:
                try:
                    self.fs.put_file(str(local), key, mode="create")
                except TypeError:  # (a file system without exclusive create)
                    self.fs.put_file(str(local), key)
            except (FileExistsError, OSError) as e:
                if not _exists_error(e):
                    raise
                try:
                    there = int(self.fs.info(key).get("size") or -1)
                except OSError:
                    there = -1
                if there != size:  # (another run's object: this run's bytes replace it)
                    self.fs.put_file(str(local), key)

    def put_json(self, name: str, doc: Any) -> None:
        with store_errors(f"{self.url}/{name}", "uploading to"):
            self.fs.pipe_file(self._key(name), json.dumps(doc, sort_keys=True).encode())

    def publish_shard(self, stage: Path, files: dict[str, list]) -> None:
        """A committed shard's files uploaded (its data removed from ``stage`` once up)."""
        for name in sorted(files, key=lambda n: n.startswith(RUN_DIR)):  # (its data first, then its own logs)
            local = stage / name
            if local.is_file():
                self.put(local, name)
                if not name.startswith(RUN_DIR) and local.stat().st_size > KEEP_LOCAL:
                    local.unlink()

    def publish_entry(self, name: str, doc: dict) -> None:
        """A shard's journal entry, uploaded once its files are up."""
        self.put_json(f"{RUN_DIR}/journal/{name}", doc)

    def begin(self, stage: Path) -> None:
        """The run's ``run.json`` uploaded (a resume elsewhere knows the run)."""
        run = stage / RUN_DIR / "run.json"
        if run.is_file():
            self.put(run, f"{RUN_DIR}/run.json")

    def restore(self, stage: Path) -> bool:
        """The store's journal of an interrupted run (and the small files beside its shards) downloaded into
        ``stage``: True where there was one (as the last listing saw the store)."""
        names = self.listing()
        if f"{RUN_DIR}/run.json" not in names:
            return False
        for name, size in names.items():
            if name.startswith(RUN_DIR + "/") or size <= KEEP_LOCAL:
                local = stage / name
                local.parent.mkdir(parents=True, exist_ok=True)
                with store_errors(f"{self.url}/{name}"):
                    self.fs.get_file(self._key(name), str(local))
        return True

    def finish(self, root: Path) -> int:
        """The dataset at ``root`` (the run's folder, complete) uploaded where not up yet (the shards'
        files are), the manifest last; the store's copy of the run's journal removed: the files sent now."""
        order = _final_files(root, self.uploaded)
        for name in order:
            self.put(root / name, name)
        self.drop_journal()
        return len(order)

    def drop_journal(self) -> None:
        """The store's copy of the run's journal removed (the dataset is complete)."""
        with store_errors(self.url, "removing the run's journal from"), contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._key(RUN_DIR), recursive=True)

    def tidy_finished(self) -> int:
        """Where the dataset is complete (its manifest is up), what a run killed after its manifest went up and
        before its journal went left behind: the store's journal, and the local copy in gpubatch's cache.
        Returns how many of the journal's objects there were."""
        left = [n for n in self.listing(fresh=True) if n.startswith(RUN_DIR + "/")]
        if left:
            self.drop_journal()
            self._listing = None
        shutil.rmtree(self.shadow(), ignore_errors=True)
        return len(left)


class PipeDestination(Destination):
    """``pipe:CMD``: each file given to ``CMD`` (``{name}`` in it replaced by the file's name) on its standard
    input; nothing to list, so the journal stays local."""

    def __init__(self, url: str):
        super().__init__(url)
        self.command = url[len("pipe:"):]
        if "{name}" not in self.command:
            raise UsageError(f"the destination {url!r} names no {{name}}: gpubatch runs the command once a file "
                             "(e.g. 'pipe:aws s3 cp - s3://bucket/out/{name}')")

    def listing(self, fresh: bool = False) -> dict[str, int]:
        return {}

    def manifest(self) -> dict | None:
        return None

    def present(self, name: str, size: int) -> bool:
        return True  # (the local journal is all there is to go by)

    def clear(self) -> int:
        return 0

    def put(self, local: Path, name: str) -> None:
        cmd = self.command.replace("{name}", name)
        with open(local, "rb") as f:
            p = subprocess.run(cmd, shell=True, stdin=f, stderr=subprocess.PIPE)  # noqa: S602 - the user's command
        if p.returncode != 0:
            why = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GpubatchError(f"pipe: {redact(cmd)!r} exited {p.returncode} for {name}{': ' + why[-1] if why else ''}")

    def put_json(self, name: str, doc: Any) -> None:
        pass  # (the journal stays local)

    def publish_entry(self, name: str, doc: dict) -> None:
        pass

    def begin(self, stage: Path) -> None:
        pass

    def restore(self, stage: Path) -> bool:
        return False

    def drop_journal(self) -> None:
        pass  # (it stayed local)


def _final_files(root: Path, uploaded: set[str]) -> list[str]:
    """The files of the finished dataset at ``root`` its shards did not upload, the manifest last."""
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and RUN_DIR not in p.relative_to(root).parts)
    return [n for n in names if n != MANIFEST and n not in uploaded] + [n for n in names if n == MANIFEST]


def _exists_error(e: BaseException) -> bool:
    if isinstance(e, FileExistsError):
        return True
    text = f"{e}"
    return "PreconditionFailed" in text or "412" in text or "already exists" in text.lower()


def destination(url: str) -> Destination:
    return PipeDestination(url) if url.startswith("pipe:") else Destination(url)


def check(dest: Destination, fmt: Any, req: Any) -> None:
    """Refuse, before anything is read, what a store cannot take: a format without shards, parts or Ray."""
    if dest.url.split("://", 1)[0].lower() in ("http", "https"):
        raise UsageError(f"{dest.shown} is an HTTP URL, which gpubatch reads but cannot write: write to object storage "
                         "(s3://, gs://, az://), a pipe:CMD, or a local folder")
    if fmt.name not in SHARDED:
        raise UsageError(f"{fmt.name} cannot be written to {dest.shown}: object storage takes the formats written as "
                         f"shard files ({', '.join(SHARDED)}); write {fmt.name} to a local folder and copy it")
    if getattr(req, "num_parts", None) is not None or getattr(req, "executor", "local") == "ray":
        raise UsageError(f"--num-parts and --executor ray write into a staging folder every machine sees; to write to "
                         f"{dest.shown}, run the local executor (every GPU of a machine: --gpus all)")
    _refuse(dest, dest.listing(fresh=True), bool(req.overwrite))


def _refuse(dest: Destination, names: dict[str, int], overwrite: bool) -> None:
    """What the store holds that a run may not replace without ``--overwrite``: a complete dataset, or objects
    that are no gpubatch run's."""
    if not names or overwrite:
        return
    if MANIFEST in names:
        raise UsageError(f"output {dest.shown} already exists: pass --overwrite to replace it")
    if f"{RUN_DIR}/run.json" not in names:
        raise UsageError(f"output {dest.shown} holds {len(names):,} objects that are not a gpubatch run's: pass "
                         "--overwrite to remove them, or choose another destination")


@contextlib.contextmanager
def staged(dest: Destination, overwrite: bool, warn: Callable[[str], None],
           resume: Callable[[Path], bool] | None, keep: Callable[[Path, BaseException], str | None] | None,
           ) -> Iterator[Path]:
    """The local staging folder of a run to ``dest`` (as :func:`~gpubatch._paths.staged_output` gives one),
    with what the store holds put right first: a complete dataset refused without ``--overwrite``, an
    interrupted run's journal brought back (for ``--resume``, or to say which command left it), anything
    else removed with ``--overwrite``. When the block ends well, the dataset goes up, manifest last."""
    shadow = dest.shadow()
    # a run killed while its dataset went up left it here, its journal in the store: the store's journal
    # and the committed shards make it again, so this copy goes
    shutil.rmtree(shadow, ignore_errors=True)
    names = dest.listing(fresh=True)
    _refuse(dest, names, overwrite)
    if names and overwrite:
        n = dest.clear()
        warn(f"removed the {n:,} objects {dest.shown} held (--overwrite)")
    stage = staging_folder(shadow)
    if names and not overwrite and not (stage / RUN_DIR / "run.json").is_file():
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        dest.restore(stage)  # (an interrupted run, here or on another machine: its journal decides)

    def decide(stage: Path) -> bool:
        carry_on = resume(stage) if resume is not None else False
        if not carry_on and dest.listing():  # (another command's shards: the store starts over too)
            n = dest.clear()
            warn(f"removed the {n:,} objects of that run from {dest.shown}")
        return carry_on

    shadow.parent.mkdir(parents=True, exist_ok=True)
    with staged_output(shadow, True, warn, resume=decide, keep=keep) as stage:
        yield stage
    try:
        dest.finish(shadow)
    finally:
        shutil.rmtree(shadow, ignore_errors=True)
