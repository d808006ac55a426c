"""``gpubatch info PATH --verify``: a dataset gpubatch wrote, checked against what its run recorded.

Every shard a worker commits is digested as it is written (CRC-32C of its bytes, :class:`~.._commit.ShardFile`),
and the run's manifest (``gpubatch.json``, ``run.files``) keeps each file's size and digest. Verifying reads every
listed file again, locally or from its object store, and names any that is missing, of another size or of other
bytes: what a copy to another machine, a sync to a bucket or a failing disk may have changed. The formats written
whole at the run's end (folder, COCO, VOC, YOLO, LMDB, the video and audio layouts) list no digests; for every
format the records that ``info`` read are also counted against the manifest's.
"""

from __future__ import annotations

import posixpath
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FormatError, UsageError

#: the states of a listed file: as written, not there, of another size, of other bytes, not readable
STATES = ("ok", "missing", "size", "digest", "unreadable")
_DIGEST = re.compile(r"crc32c:[0-9a-f]{8}")
_CHUNK = 8 << 20


@dataclass
class FileState:
    """One file the run listed: its ``state`` (:data:`STATES`), its size as written and as found."""

    name: str
    state: str
    size: int
    found: int | None = None
    detail: str = ""


@dataclass
class VerifyReport:
    """What ``--verify`` found at ``path``.

    Attributes:
        files: each file the manifest lists, with its state (empty where the format lists none).
        listed: whether the manifest lists files with digests at all.
        records, records_found: the records the manifest says were written, and those ``info`` read (None where
            not counted).
        bytes: the bytes read to digest them; seconds: how long that took.
    """

    path: str
    format: str
    files: list[FileState] = field(default_factory=list)
    listed: bool = False
    records: int | None = None
    records_found: int | None = None
    bytes: int = 0
    seconds: float = 0.0

    @property
    def bad(self) -> list[FileState]:
        return [f for f in self.files if f.state != "ok"]

    @property
    def ok(self) -> bool:
        return not self.bad and (self.records is None or self.records_found is None
                                 or self.records == self.records_found)

    def problem(self) -> str:
        """The one line that says what differs ("" where nothing does)."""
        parts = []
        if self.bad:
            named = ", ".join(f"{f.name}: {f.detail or f.state}" for f in self.bad[:5])
            more = f", and {len(self.bad) - 5} more" if len(self.bad) > 5 else ""
            parts.append(f"{len(self.bad)} of its {len(self.files)} files differ from what was written ({named}{more})")
        if self.records is not None and self.records_found is not None and self.records != self.records_found:
            parts.append(f"{self.records_found:,} records read where {self.records:,} were written")
        return f"{self.path}: " + "; ".join(parts) if parts else ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def listed_files(manifest: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """The files a manifest lists (``run.files``: name -> [size, digest]), each checked: a relative path inside the
    dataset, a size, a CRC-32C digest. FormatError where the manifest holds something else there."""
    files = (manifest.get("run") or {}).get("files") if isinstance(manifest.get("run"), dict) else None
    if files is None:
        return {}
    if not isinstance(files, dict):
        raise FormatError("gpubatch.json: run.files is not an object of files")
    out: dict[str, tuple[int, str]] = {}
    for name, meta in files.items():
        norm = posixpath.normpath(name) if isinstance(name, str) else ""
        if not norm or norm.startswith(("/", "../")) or norm in (".", "..") or "\\" in norm or "\x00" in norm:
            raise FormatError(f"gpubatch.json lists a file outside the dataset: {name!r}")
        if (not isinstance(meta, list) or len(meta) != 2 or not isinstance(meta[0], int) or isinstance(meta[0], bool)
                or meta[0] < 0 or not isinstance(meta[1], str) or not _DIGEST.fullmatch(meta[1])):
            raise FormatError(f"gpubatch.json: run.files[{name!r}] is not [size, 'crc32c:........']")
        out[norm] = (meta[0], meta[1])
    return out


class _Local:
    def __init__(self, root: Path):
        self.root = root

    def size(self, name: str) -> int | None:
        p = self.root / name
        return p.stat().st_size if p.is_file() else None

    def open(self, name: str) -> Any:
        return open(self.root / name, "rb")  # noqa: SIM115 - closed by the caller's with


class _Store:
    def __init__(self, url: str):
        from .._publish import Destination

        self.dest = Destination(url)
        self.sizes = self.dest.listing(fresh=True)

    def size(self, name: str) -> int | None:
        return self.sizes.get(name)

    def open(self, name: str) -> Any:
        return self.dest.fs.open(self.dest._key(name), "rb", block_size=_CHUNK)


def _digest(where: Any, name: str, size: int, digest: str, done: Callable[[int], None]) -> FileState:
    from .._commit import stream_digest

    found = where.size(name)
    if found is None:
        return FileState(name, "missing", size, None, "missing")
    if found != size:
        return FileState(name, "size", size, found, f"{found:,} bytes where {size:,} were written")
    try:
        with where.open(name) as f:
            read, got = stream_digest(f, _CHUNK, done)
    except OSError as e:
        return FileState(name, "unreadable", size, found, f"unreadable ({e.strerror or e})")
    if read != size:
        return FileState(name, "size", size, read, f"{read:,} bytes read where {size:,} were written")
    if got != digest:
        return FileState(name, "digest", size, found, f"other bytes: {got}, written {digest}")
    return FileState(name, "ok", size, found)


def verify(path: str | Path, records_found: int | None = None, workers: int | None = None,
           progress: Callable[[int], Callable[[int], None]] | None = None) -> VerifyReport:
    """Check the dataset at ``path`` (a folder, or a store URL) against its manifest: every file the run listed
    read again and digested (``workers`` at once; ``progress(total_bytes)`` gives a callback of bytes read), and
    ``records_found`` (the records ``info`` read), where given, against the records the manifest says were
    written. UsageError where there is no manifest: only a dataset gpubatch wrote can be verified."""
    from concurrent.futures import ThreadPoolExecutor

    from .._remote import is_remote, redact
    from ..engine.processes import cores
    from ..formats.manifest import MANIFEST_NAME, read_manifest

    where: Any
    if str(path).startswith("pipe:"):
        raise UsageError("--verify reads a dataset's files again: a pipe: command cannot be read back; verify the "
                         "dataset where the command put it")
    if is_remote(str(path)):
        where = _Store(str(path))
        manifest = where.dest.manifest()
        shown = redact(str(path))
    else:
        root = Path(path)
        if root.is_file():
            raise UsageError(f"--verify checks a dataset's folder (where its {MANIFEST_NAME} is), not the file {root}")
        where = _Local(root)
        manifest = read_manifest(root)
        shown = str(path)
    if not manifest:
        raise UsageError(f"{shown} has no {MANIFEST_NAME}: --verify checks a dataset gpubatch wrote against what "
                         "its run recorded")
    files = listed_files(manifest)
    records = manifest.get("records")
    report = VerifyReport(shown, str(manifest.get("format") or "?"), listed=bool(files),
                          records=records if isinstance(records, int) and not isinstance(records, bool) else None,
                          records_found=records_found)
    total = sum(size for size, _ in files.values())
    done = (progress or (lambda total: (lambda n: None)))(total)
    t = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(workers or cores(), 16, len(files) or 1)), "gpubatch-verify") as pool:
        report.files = list(pool.map(lambda kv: _digest(where, kv[0], kv[1][0], kv[1][1], done), sorted(files.items())))
    report.seconds = round(time.perf_counter() - t, 4)
    report.bytes = sum(f.size for f in report.files if f.state in ("ok", "digest"))
    return report


def render(report: VerifyReport) -> None:
    """The check's few lines under ``info``'s tables (stderr, as the rest of the report)."""
    from .console import console

    con = console()
    if report.listed:
        good = len(report.files) - len(report.bad)
        con.print(f"verify: {good:,} of {len(report.files):,} files as written ({report.bytes / 2**20:,.1f} MiB "
                  f"digested in {report.seconds:.2f} s)")
        for f in report.bad[:20]:
            con.print(f"  {f.name}: {f.detail or f.state}", highlight=False)
        if len(report.bad) > 20:
            con.print(f"  ... and {len(report.bad) - 20} more")
    else:
        con.print(f"verify: {report.format} lists no file digests (its files are written whole at the run's end); "
                  "the records were read")
    if report.records is not None and report.records_found is not None:
        same = "as written" if report.records == report.records_found else f"where {report.records:,} were written"
        con.print(f"verify: {report.records_found:,} records read, {same}")
