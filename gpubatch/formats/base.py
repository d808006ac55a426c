"""Format, Reader and Writer contracts, and the sharded writer they share.

A reader first lists its dataset's *entries* (a cheap scan of names, offsets or index files), then
reads one entry at a time into a :class:`~gpubatch.types.Record`. That split gives ``len()``,
``--limit``, ``--shuffle`` and parallel reads without loading a dataset into memory.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .._paths import (
    LFS_MAGIC,
    MAX_RECORD_BYTES,  # noqa: F401 - the formats' bound on a record's bytes
    lfs_pointer,
    open_fetched,
)
from ..errors import GpubatchError, RecordError, Stage
from ..types import DatasetInfo, Media, Record

# First bytes of the compressors shards meet (gzip, bzip2, xz, zstd): such shards cannot be read by offset.
_COMPRESSION_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))


def compression(head: bytes) -> str | None:
    """The compressor whose magic ``head`` (a file's first bytes, 6 or more) starts with, or None."""
    return next((name for magic, name in _COMPRESSION_MAGIC if head.startswith(magic)), None)


# Words that name a dataset's split in shard names (``train-000000.tar``, TFDS's ``NAME-validation.tfrecord-*``,
# im2rec's ``NAME_val.rec``): shard sets that differ by one are splits, not parts of one dataset.
_SPLIT_WORDS = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval",
                          "evaluation", "holdout", "minival"})
_SHARD_SUFFIXES = (".tar", ".tfrecord", ".tfrecords", ".tfrec", ".rec", ".gz", ".tgz", ".bz2", ".tbz2", ".xz", ".txz",
                   ".zst")
_SHARD_TAIL = re.compile(r"[-_.]?\d+(?:-of-\d+)?$")


def names_a_split(name: str) -> bool:
    """True where a shard set's or folder's name holds a split's word (``train``, ``val``, ``test``...)."""
    return bool(_SPLIT_WORDS & set(re.split(r"[^a-z]+", name.lower())))


def shard_set(name: str) -> tuple[str, str]:
    """(the set a shard file belongs to, its suffix): ``train-000001.tar`` -> (``train``, ``.tar``),
    ``imagenet2012-validation.tfrecord-00003-of-00064`` -> (``imagenet2012-validation``, ````)."""
    suffix = next((x for x in _SHARD_SUFFIXES if name.endswith(x)), "")
    base, before = name, None
    while base != before:
        before = base
        base = _SHARD_TAIL.sub("", base.removesuffix(next((x for x in _SHARD_SUFFIXES if base.endswith(x)), "")))
    return base, suffix


def check_one_split(files: Sequence[Path], where: Path) -> None:
    """Refuse a folder whose shards are the sets of several splits (``train-*`` beside ``val-*``):
    read together they would merge the splits without a word. A pattern picks one set."""
    sets: dict[str, list[Path]] = {}
    for f in files:
        sets.setdefault(shard_set(f.name)[0], []).append(f)
    if len(sets) < 2 or not any(names_a_split(s) for s in sets):
        return
    from ..errors import FormatError

    named = ", ".join(f"{s or '(unnamed)'} ({len(v)} shard{'s' if len(v) > 1 else ''})" for s, v in sorted(sets.items()))
    first, shards = next(iter(sorted(sets.items())))
    example = Path(where) / f"{first}*{shard_set(shards[0].name)[1]}"
    raise FormatError(f"{where} holds the shards of {len(sets)} splits ({named}), which gpubatch does not merge: "
                      f"pass one set as a quoted pattern, e.g. '{example}'")


# Record metadata keys for what a WebDataset sample holds besides its image, class and gpubatch's own
# JSON fields: its other members (``MEMBERS``: extension -> UTF-8 text, or {"base64": ...} for other
# bytes; captions, URLs, masks) and the fields of its ``.json`` that are not gpubatch's (``JSON_FIELDS``).
# WebDataset writes them back as they were; formats with ``carries_members`` keep them in their metadata;
# the others cannot hold them (the run warns).
MEMBERS = "members"
JSON_FIELDS = "json"


def image_size(record: Record) -> tuple[int, int]:
    """(height, width) of the image a writer is given: its boxes' canvas, else the size the run noted, else
    its header's; (0, 0) where the header cannot be read."""
    if record.boxes is not None:
        return record.boxes.canvas
    if record.size is not None:
        return record.size
    from ..engine.codecs.headers import probe

    try:
        hdr = probe(record.data)
    except ValueError:
        return 0, 0
    return hdr.height, hdr.width


@dataclass(frozen=True)
class Damaged:
    """An entry for what a reader found damaged or unreadable while listing its dataset: a broken
    stretch of a shard, a folder it cannot list, a file that is no regular file, a line of a file list
    that names no record. It counts as one of the dataset's records and is reported as skipped with its
    reason, so that nothing the source holds goes missing without a word.
    """

    key: str
    origin: str
    reason: str


def shortfall(shard: Path, entries: list[Any], expected: int | None, named: list[tuple[str, str]] = (),
              cut: str = "") -> list[Any]:
    """A shard's entries with what it lacks added as :class:`Damaged` entries, so that a shard cut short on a
    record boundary (which reads as whole) loses nothing without a word.

    Args:
        shard: the shard file.
        entries: what its scan found: records and Damaged entries, in shard order.
        expected: how many records the dataset's manifest says the shard holds, or None.
        named: (key, reason) of each record its index lists that the scan did not find: these are listed
            by key, and replace the damaged stretches at the shard's end (the index says what they held).
        cut: why the shard looks cut short where neither says more (a tar without its end-of-archive
            blocks), or "": one Damaged entry of unknown extent where nothing else accounts for the loss.
    """
    out = list(entries)
    if named:
        last = max((i for i, e in enumerate(out) if not isinstance(e, Damaged) or not e.key.startswith(shard.name + "@")),
                   default=-1)
        out = out[: last + 1] + [e for e in out[last + 1 :] if not isinstance(e, Damaged)]  # stretches at the end
        out += [Damaged(key, f"{shard}#{key}", reason) for key, reason in named]
    if expected is not None and len(out) < expected:
        n = expected - len(out)
        out += [Damaged(f"{shard.name}#missing-{k}", str(shard),
                        f"the dataset's gpubatch.json counts {expected:,} records in {shard.name}, {len(entries):,} "
                        f"were found: the shard is cut short and {n:,} record{'s are' if n > 1 else ' is'} missing")
                for k in range(n)]
    elif cut and not named and not (out and isinstance(out[-1], Damaged) and out[-1].key.startswith(shard.name + "@")):
        size = shard.stat().st_size
        out.append(Damaged(f"{shard.name}@{size}", f"{shard}@{size}",
                           f"{cut}: the shard is cut short at byte {size:,}; the records after it are lost"))
    return out


@dataclass(frozen=True)
class WriteOptions:
    """Options every writer understands.

    Attributes:
        shard_size: records per shard for sharded formats (tfrecord, webdataset, recordio).
        name: file name prefix of shards (``NAME-00000-of-00004.tfrecord``).
        source: a short description of where the data came from, for the manifest.
    """

    shard_size: int = 10_000
    name: str = "data"
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Reader(abc.ABC):
    """Reads one dataset. Subclasses implement :meth:`_scan` and :meth:`read`."""

    format_name: str = ""
    media: str = "image"  # what its records hold (the engine's codec registry key)
    #: whether :meth:`read` works on entries without this reader having listed the dataset first (a worker
    #: process reads the entries it is given; LMDB's reads need its page walk)
    reads_without_scan: ClassVar[bool] = True
    #: whether :meth:`read` can put a record's bytes straight where its caller says (``into``)
    reads_into: ClassVar[bool] = False

    def __init__(self, path: Path):
        self.path = Path(path)
        self._entries: list[Any] | None = None
        self.warnings: list[str] = []  # what was wrong in the source but not fatal, shown in the summary
        self.missing: list[tuple[str, str]] = []  # shards named that do not exist, and why: each a skipped entry
        #: a sharded reader given its files (a file, a pattern) rather than their folder: they alone are the source
        self.files_given = False

    @abc.abstractmethod
    def _scan(self) -> list[Any]:
        """List the dataset's entries (cheap: names, offsets, index lines), in dataset order."""

    @abc.abstractmethod
    def _read(self, entry: Any) -> Record:
        """Read one entry (never a :class:`Damaged` one). Raises RecordError when it is corrupt."""

    def first_media(self, of: Callable[[Any], str], default: str = "image", look: int = 16) -> str:
        """The media most of the first ``look`` whole entries hold, as ``of`` reads them (the first such entry's
        on a tie; ``default`` where none reads): one damaged record at the start must not make a dataset of sound
        or video read as images, refusing the run's options or misnaming its records' errors."""
        votes: dict[str, int] = {}
        for i, entry in enumerate(e for e in self.entries() if not isinstance(e, Damaged)):
            if i >= look:
                break
            try:
                media = of(entry)
            except Exception:  # noqa: BLE001 - a bad record: its error comes when it is read
                continue
            votes[media] = votes.get(media, 0) + 1
        return max(votes, key=votes.__getitem__) if votes else default  # (max keeps the first of equals)

    def where(self, entry: Any) -> tuple[str, str]:
        """(key, origin) of an entry, for the error of a read that failed before the reader said."""
        return str(entry)[:120], str(self.path)

    def list_given(self) -> Path | None:
        """The list given as the source (a CSV or TSV, a manifest, a ``file_list.txt``) where the dataset's
        records are the files it names (each entry's :meth:`where`); None where the source is no such list."""
        return None

    def read(self, entry: Any, into: Callable[[int], Any] | None = None) -> Record:
        """Read one entry. ``into``: where a reader that can (:attr:`reads_into`) reads an image record's
        bytes, ``into(size)`` giving a writable buffer of that size (a slot of a feed's shared memory: one
        copy from the page cache, none after it); the record's ``data`` is then that buffer.

        Raises:
            RecordError: the entry is damaged or corrupt. This is the record boundary: whatever a reader
                meets in hostile data (a value of the wrong type, an I/O error) becomes this record's
                error, never the run's end.
        """
        if isinstance(entry, Damaged):
            raise RecordError(entry.key, entry.origin, Stage.READ, entry.reason)
        try:
            record = self._read(entry, into) if into is not None and self.reads_into else self._read(entry)
            if record.data[:8] == LFS_MAGIC[:8] and lfs_pointer(bytes(record.data[:200])):
                raise RecordError(record.key, record.origin, Stage.READ, lfs_pointer(bytes(record.data[:200])))
            return record
        except (RecordError, GpubatchError):  # the record's error, or one that ends the run (a source cut short)
            raise
        except OSError as e:
            key, origin = self.where(entry)
            raise RecordError(key, origin, Stage.READ, f"cannot read: {e.strerror or e}") from None
        except Exception as e:  # noqa: BLE001 - the record boundary (see the docstring)
            key, origin = self.where(entry)
            raise RecordError(key, origin, Stage.READ, f"{type(e).__name__}: {e}") from None

    def info(self) -> DatasetInfo:
        """Dataset-level facts (classes, categories)."""
        return DatasetInfo()

    def roots(self) -> list[Path]:
        """Every folder the dataset is read from, or the shard files given alone (an output must lie outside all of
        them: beside a tar given alone is no overlap, inside a folder of shards is, as the next run of that folder
        would read the output's shards too)."""
        return list(self.shard_paths()) if self.files_given else [self.path]

    def shard_paths(self) -> Sequence[Path]:
        """The shard files a sharded reader reads (webdataset's tars, TFRecord's, RecordIO's, Parquet's
        files), in order; none for others."""
        return ()

    def entries(self) -> list[Any]:
        if self._entries is None:
            self._entries = self._scan() + [Damaged(Path(m).name, m, why) for m, why in self.missing]
        return self._entries

    def __len__(self) -> int:
        return len(self.entries())

    def __iter__(self) -> Iterator[Record]:
        for entry in self.entries():
            yield self.read(entry)

    def close(self) -> None:
        """Release open files."""

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def record_error(key: str, origin: str, reason: object, stage: Stage = Stage.READ) -> RecordError:
        return RecordError(key, origin, stage, str(reason))


def _decompressor(kind: str, path: Path) -> Any:
    """A fresh streaming decompressor of ``kind`` (``decompress``, ``eof``, ``unused_data``)."""
    from ..errors import FormatError

    if kind == "gzip":
        import zlib

        return zlib.decompressobj(wbits=47)  # (a gzip or zlib header, found by its magic)
    if kind == "bzip2":
        import bz2

        return bz2.BZ2Decompressor()
    if kind == "xz":
        import lzma

        return lzma.LZMADecompressor()
    try:
        import zstandard
    except ImportError:
        raise FormatError(f"{path} is zstd-compressed: pip install zstandard to read it, or decompress it (unzstd)"
                          ) from None
    return zstandard.ZstdDecompressor().decompressobj()


def decompress_into(path: Path, kind: str, out: Any) -> bool:
    """Write the decompressed bytes of ``path`` to the file ``out``, a block at a time (several streams one
    after the other, as ``cat a.gz b.gz`` makes, included); True where the data ended whole, False where it
    was cut short or damaged: what decompressed before that is written."""
    d = _decompressor(kind, path)
    with os.fdopen(open_fetched(path), "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return bool(getattr(d, "eof", True))
            while chunk:
                try:
                    out.write(d.decompress(chunk))
                except Exception:  # noqa: BLE001 - zlib.error, OSError, LZMAError, ZstdError: the data breaks here
                    return False
                if not getattr(d, "eof", False):
                    break
                chunk = d.unused_data  # the next stream
                if chunk.strip(b"\0"):
                    d = _decompressor(kind, path)
                else:
                    return True


_OF = re.compile(r"^(.*?)(\d+)-of-(\d+)(.*)$")  # train-00003-of-00016.tfrecord: shard 3 of 16


def numbered_gaps(paths: Sequence[Path]) -> list[tuple[str, str]]:
    """The shards missing from sets named ``NAME-NNNNN-of-MMMMM...`` (TFRecord's, Hugging Face's Parquet,
    gpubatch's own): for each set among ``paths`` (the same folder, name and count), the numbers below its
    count that no file has, as the paths they would have, each with its reason. A folder that holds 15 of
    a set's 16 shards has lost one; its records are said, not left out without a word."""
    sets: dict[tuple, dict[int, str]] = {}
    for p in paths:
        m = _OF.match(Path(p).name)
        if m and int(m.group(3)) <= 1_000_000:
            sets.setdefault((Path(p).parent, m.group(1), len(m.group(2)), m.group(3)), {})[int(m.group(2))] = m.group(4)
    out = []
    for (folder, head, width, total), have in sets.items():
        tails = set(have.values())  # (Hugging Face's older names end in each shard's own hash: -of-00002-6f8a.parquet)
        tail = tails.pop() if len(tails) == 1 else "*" + Path(next(iter(tails))).suffix
        why = (f"the set's names count {int(total):,} shards (-of-{total}), but this one is not in the folder: its "
               "records are not read")
        out += [(str(folder / f"{head}{i:0{width}d}-of-{total}{tail}"), why) for i in range(int(total)) if i not in have]
    return sorted(out)


def open_cap() -> int:
    """How many shard files a reader keeps open at most: a quarter of this process's limit on open files
    (``ulimit -n``, often 1,024), between 32 and 1,024. A dataset has more shards than that (LAION's are
    hundreds of thousands); one descriptor a shard, kept for the run, ran a 2,048-shard webdataset out of them
    (``Too many open files``: records listed unreadable, the run's own writes refused)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 256
    if soft == getattr(resource, "RLIM_INFINITY", -1) or soft <= 0:
        return 1024
    return max(32, min(1024, soft // 4))


class OpenShards:
    """Read-only descriptors of a reader's shard files, opened when first read and shared by the threads that
    read them (``os.pread`` needs no seek, so they need no lock but the opening's). A thread holds a shard's
    descriptor for its reads (:meth:`reading`); at most ``cap`` (:func:`open_cap`) are kept open, the least
    recently used closed first, never one a thread holds.

    A compressed shard (a ``.tar.gz`` that webdataset reads as a stream) is decompressed into an unnamed
    temporary file when first read, and read by offset there as any shard is; at most ``keep`` of them
    are kept at once (the least recently used goes), so the temporary space follows the shards being
    read, not the dataset."""

    def __init__(self, paths: Sequence[Path], keep: int = 4, cap: int | None = None):
        from collections import OrderedDict

        self.paths = paths
        self._fds: OrderedDict[int, int] = OrderedDict()  # plain shards' descriptors, least recently used first
        self._plain: OrderedDict[int, int] = OrderedDict()  # decompressed shards' descriptors, likewise
        self._held: dict[int, int] = {}  # shard -> how many reads hold its descriptor now
        self._shared: set[int] = set()  # the decompressed shards whose copy other processes share (unpacked.py)
        self.whole: dict[int, bool] = {}  # per compressed shard decompressed: whether its data ended whole
        self.keep = keep
        self.cap = cap if cap is not None else open_cap()
        self._lock = threading.Lock()

    def compression(self, shard: int) -> str | None:
        """The compressor of a shard's bytes (its first six), or None for a plain one."""
        from .._paths import read_head

        return compression(read_head(self.paths[shard], 6))

    def _take(self, shard: int) -> int:
        """A shard's descriptor (a compressed shard's decompressed copy), held until :meth:`_give`."""
        with self._lock:
            fd = self._fds.get(shard)
            if fd is not None:
                self._fds.move_to_end(shard)  # (most recently used now)
            elif shard in self._plain:
                self._plain.move_to_end(shard)
                fd = self._plain[shard]
            else:
                kind = self.compression(shard)
                if kind is None:
                    fd = self._fds[shard] = open_fetched(self.paths[shard])  # (a remote shard: fetched first)
                else:
                    fd = self._decompressed(shard, kind)
            self._held[shard] = self._held.get(shard, 0) + 1
            if len(self._fds) > self.cap or len(self._plain) > self.keep:
                self._trim()  # (this one held already: never the one closed)
            return fd

    def _give(self, shard: int) -> None:
        with self._lock:
            left = self._held[shard] - 1
            if left:
                self._held[shard] = left
            else:
                del self._held[shard]
                if len(self._fds) > self.cap or len(self._plain) > self.keep:
                    self._trim()

    @contextlib.contextmanager
    def reading(self, shard: int) -> Iterator[int]:
        """A shard's descriptor, open while the block runs (for several reads; one read: :meth:`pread`)."""
        fd = self._take(shard)
        try:
            yield fd
        finally:
            self._give(shard)

    def pread(self, shard: int, n: int, offset: int) -> bytes:
        """``n`` bytes of a shard from ``offset`` (fewer at its end)."""
        fd = self._take(shard)
        try:
            return os.pread(fd, n, offset)
        finally:
            self._give(shard)

    def preadv(self, shard: int, buffers: list[Any], offset: int) -> int:
        """A shard's bytes from ``offset`` read into ``buffers``: how many."""
        fd = self._take(shard)
        try:
            return os.preadv(fd, buffers, offset)
        finally:
            self._give(shard)

    def _trim(self) -> None:
        """(Under the lock.) The least recently used descriptors past the caps closed, none a read holds."""
        for table, cap in ((self._fds, self.cap), (self._plain, self.keep)):
            if len(table) > cap:
                for s in [s for s in table if s not in self._held][: len(table) - cap]:
                    fd = table.pop(s)
                    if table is self._plain:
                        self._let_go(s, fd)
                    else:
                        os.close(fd)

    def _let_go(self, shard: int, fd: int) -> None:
        """A decompressed shard's descriptor closed (a shared copy let go: :func:`.unpacked.let_go`)."""
        if shard in self._shared:
            from .unpacked import let_go

            self._shared.discard(shard)
            let_go(self.paths[shard], fd)
        else:
            os.close(fd)

    def open_now(self) -> int:
        """How many descriptors are open (plain and decompressed shards)."""
        return len(self._fds) + len(self._plain)

    def _decompressed(self, shard: int, kind: str) -> int:
        """A compressed shard's decompressed copy, made once and shared by the run's processes
        (:mod:`.unpacked`), or this process's own where a shared one cannot be made."""
        import tempfile

        from .unpacked import shared_copy

        try:
            fd, self.whole[shard] = shared_copy(self.paths[shard], kind, decompress_into)
            self._plain[shard] = fd
            self._shared.add(shard)
            return fd
        except OSError:  # (no shared temporary folder, no flock: a copy of its own)
            pass
        tmp = tempfile.TemporaryFile(prefix="gpubatch-shard-")  # noqa: SIM115 - its descriptor is kept
        try:
            self.whole[shard] = decompress_into(self.paths[shard], kind, tmp)  # (damaged: what came out is read)
            tmp.flush()
        except BaseException:
            tmp.close()
            raise
        fd = os.dup(tmp.fileno())
        tmp.close()
        self._plain[shard] = fd
        return fd

    def size(self, shard: int) -> int:
        """The bytes a shard holds as read (decompressed where it is compressed)."""
        with self.reading(shard) as fd:
            return os.fstat(fd).st_size

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            for shard, fd in self._plain.items():
                self._let_go(shard, fd)
            self._fds.clear()
            self._plain.clear()


class Writer(abc.ABC):
    """Writes one dataset into a folder (the staging folder of the run)."""

    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        self.root = Path(root)
        self.info = info
        self.options = options
        self.count = 0
        self.bytes = 0
        self.warnings: list[str] = []  # what the user should know about the output, shown in the summary

    @abc.abstractmethod
    def write(self, record: Record) -> None:
        """Add one record."""

    def close(self) -> None:
        """Flush and finish every file."""

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close()


class Format(abc.ABC):
    """A dataset format: its name, what it can carry, how to recognize, read and write it."""

    name: ClassVar[str]
    description: ClassVar[str]
    media: ClassVar[tuple[Media, ...]] = (Media.IMAGE,)
    carries_labels: ClassVar[bool] = True
    carries_boxes: ClassVar[bool] = False
    carries_label_arrays: ClassVar[bool] = False  # RecordIO's multi-label arrays (kept in meta by some)
    carries_members: ClassVar[bool] = False  # a WebDataset sample's other members and .json fields
    carries_record_meta: ClassVar[bool] = True  # a record's own metadata (an audio array's sample rate)
    carries_text: ClassVar[bool] = False  # a record's text (a transcript: LibriSpeech's, NeMo's, Common Voice's)
    #: the image codecs this format's own readers decode; None where any codec goes (a file keeps its
    #: codec's extension). A record of another codec stops the run before DST is written.
    image_codecs: ClassVar[frozenset[str] | None] = None
    detect_priority: ClassVar[int] = 50  # lower is tried first
    #: whether its reader, its entries listed, is plain data (no open file, no handle): another process may list
    #: the source and hand the reader over pickled (``gpubatch._prescan``, at the command's start)
    listed_ahead: ClassVar[bool] = False
    sharded: ClassVar[bool] = False  # read from shard files, so a source pattern may pick some of them
    #: where a written dataset has no shards and a run's tasks are units of work only (no file follows
    #: the cut): ``--shard-size auto`` cuts the run into about this many tasks (engine/execute/shards.py);
    #: None: shards of their own sizing
    auto_units: ClassVar[int | None] = None

    @classmethod
    @abc.abstractmethod
    def detect(cls, path: Path) -> bool:
        """True when ``path`` looks like a dataset of this format."""

    @classmethod
    def accepts(cls, path: Path) -> bool:
        """True when this format reads ``path`` if the user names it (``--from``): what :meth:`detect` finds, and
        for some formats more (an audio folder of WebM sound, which detection takes for video)."""
        return cls.detect(path)

    @classmethod
    @abc.abstractmethod
    def reader(cls, path: Path) -> Reader: ...

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        """A writer of a whole dataset into ``root`` (formats without shards: the one their finalize
        replays the spools through; sharded formats: their sinks, as one shard)."""
        return SinkWriter(cls, root, info, options)

    # --- shards: how a run's workers write it (see formats/sinks.py) ---

    @classmethod
    def shard_names(cls, count: int, options: WriteOptions) -> list[str]:
        """The names of ``count`` output shards, decided before any data moves (formats without shards:
        the names of their spooled parts)."""
        return [f"part-{i:05d}" for i in range(count)]

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> Any:
        """The :class:`~.sinks.ShardSink` that writes ``task``'s records into ``root`` (by default a
        spool, which :meth:`finalize` writes through :meth:`writer`)."""
        from .sinks import SpoolSink

        return SpoolSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        """The dataset-wide files, from every shard's :class:`~gpubatch.types.ShardResult` in shard
        order once all are committed; the warnings for the summary."""
        from .sinks import replay_spools

        return replay_spools(cls, root, shards, info, options)

    @classmethod
    def begin_finalize(cls, root: Path, info: DatasetInfo, options: WriteOptions, order: list[int]) -> Any:
        """Where a format's finalize can begin while the run works (a local run's, on its own staging folder):
        an object whose ``committed(result)`` the run calls for each shard as it commits (any order; ``order``: the
        plan's shard indexes) and whose ``finish(results)`` then does the rest and gives :meth:`finalize`'s
        warnings; None (the default) where it cannot."""
        return None


# What Caffe and MXNet (OpenCV's imdecode) and DALI (nvImageCodec) all decode: LMDB Datums and RecordIO
# records hold nothing that names a codec, so their readers decode only these.
OPENCV_AND_DALI_CODECS = frozenset({"jpeg", "png", "bmp", "tiff", "webp", "jpeg2000", "pnm"})


class SinkWriter(Writer):
    """A sharded format's :class:`Writer`: the records given, written through its sink as one shard, and
    its finalize at :meth:`close` (for programs that write records they hold; runs write through sinks)."""

    def __init__(self, fmt: Any, root: Path, info: DatasetInfo, options: WriteOptions):
        from ..types import ShardTask

        super().__init__(root, info, options)
        self.fmt = fmt
        self.task = ShardTask(0, 0, 0, fmt.shard_names(1, options)[0])
        self._sink = fmt.sink(root, self.task, info, options)

    def write(self, record: Record) -> None:
        self._sink.write(record)
        self.count += 1
        self.bytes += len(record.data)

    def close(self) -> None:
        from ..types import ShardResult

        files, extra = self._sink.commit()
        result = ShardResult(0, self.task.name, 0, self.count, counts={"records_out": self.count}, files=files,
                             extra=extra)
        self.warnings += self._sink.warnings + self.fmt.finalize(self.root, [result], self.info, self.options)
