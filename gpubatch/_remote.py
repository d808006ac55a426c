"""Datasets in object storage and at URLs (fsspec: ``s3://``, ``gs://``, ``az://``, ``https://``...) and
webdataset's ``pipe:CMD``, read as local datasets are.

A remote source is seen through a *mirror*: a folder under gpubatch's cache (``GPUBATCH_CACHE``, else
``~/.cache/gpubatch``) with a file for each remote file of the dataset, of the same name, size and time,
standing in for it until its bytes are needed (a *placeholder*: sparse, its first bytes a marker, its
modification time's nanoseconds :data:`PLACEHOLDER_NS`). The formats' readers list, stat
and pattern-match the mirror as any folder, and read through three calls of :mod:`gpubatch._paths` that
know placeholders:

- ``read_regular`` (a record's file, an annotation, an index): the object's bytes straight from the store;
  a small file that is no media file (an index, a manifest) is kept in the mirror for the next read;
- ``read_head`` / ``read_range`` (format detection, a shard's header blocks): a ranged read;
- ``open_fetched`` (a shard a reader reads by offset): the object fetched whole into its place first, the
  next shard of its set fetched beside it in a thread (read-ahead). Each process keeps the last
  :data:`KEEP` shards it fetched; older ones become placeholders again (a process that has one open
  reads on), so a run holds a few shards a worker on disk, not the dataset.

The mirror's listing (``state.json``) is made by the process that opens the source first (the command) and
taken as it is by the run's worker processes; each opening by a command lists the store again, and a
file whose size, time or ETag changed goes back to a placeholder. Credentials come from where each
store's package looks (environment, profile files); no message prints a URL's user or password.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
import subprocess
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import MESSAGE_HOOKS, DependencyError, FormatError, GpubatchError, UsageError

# --- placeholders: the local files standing for a remote source's files --------------------------------
#
# A placeholder is known by its modification time's nanoseconds (a stat the reads make anyway) and then its
# first bytes; the reads of gpubatch._paths give a placeholder's remote bytes instead of its own.

PLACEHOLDER_NS = 999_999_937
PLACEHOLDER_MARK = b"gpubatch: a placeholder of a remote file\n"
#: the mirrors this process opened (their local root -> the mirror)
MIRRORS: dict[str, Mirror] = {}


def is_placeholder(st: os.stat_result, fd: int | None = None) -> bool:
    """True where ``st`` (and, given its descriptor, the file's first bytes) is a remote file's placeholder."""
    if st.st_mtime_ns % 1_000_000_000 != PLACEHOLDER_NS or not stat.S_ISREG(st.st_mode):
        return False
    if fd is None or st.st_size == 0:
        return True
    return os.pread(fd, len(PLACEHOLDER_MARK), 0) == PLACEHOLDER_MARK[: st.st_size]


# ``s3://``, ``gs://``, ``https://``..., the same folded by a Path (``s3:/bucket``), webdataset's ``pipe:CMD``
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):(?://|/(?!/)|(?=[^/\\]))")


def url_scheme(location: str | os.PathLike) -> str | None:
    """The scheme where ``location`` is a URL (``s3://bucket/x``, ``https://host/x``, ``pipe:curl ...``, or a
    URL a ``Path`` folded to ``s3:/bucket/x``), else None. A Windows drive (``C:``) is no scheme."""
    text = os.fspath(location)
    m = _URL.match(text)
    if m is None or len(m.group("scheme")) < 2:
        return None
    if m.group("scheme").lower() != "pipe" and "/" not in text[m.end("scheme") :][:3]:
        return None  # ``name:thing`` without a slash is a file name with a colon
    return m.group("scheme").lower()


#: which extra brings a store's fsspec implementation (``pip install 'gpubatch[EXTRA]'``)
EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
          "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
          "adl": ("adlfs", "azure"), "http": ("aiohttp", "http"), "https": ("aiohttp", "http")}
#: shards a process keeps fetched (the ones it read last): the disk a remote source takes a worker
KEEP = 3
#: the first bytes of a remote file read once and kept (this process keeps the last 256 files')
HEAD = 64 << 10
_HEADS: dict[str, bytes] = {}
#: the small files fetched with the listing, 16 at once (a shard set's indexes, manifests, lists)
_SIDECAR = re.compile(r"\.(idx|json|txt|ya?ml|csv|xml|labels)$", re.IGNORECASE)
SIDECARS_AT_ONCE = 4096
#: the largest file that is no media file kept in the mirror once read (indexes, manifests, lists)
KEEP_SMALL = 16 << 20
_MEDIA = re.compile(r"\.(jpe?g|png|webp|bmp|tiff?|gif|jp2|j2k|mp4|mkv|webm|avi|mov|wav|flac|ogg|opus|mp3|npy)$",
                    re.IGNORECASE)
_PATTERN = re.compile(r"[*?\[]|\{[^{}]*(?:,|\.\.)[^{}]*\}")


def redact(url: str) -> str:
    """``url`` without a user or password it carries (``s3://KEY:SECRET@bucket`` -> ``s3://***@bucket``)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]+@", r"\1***@", str(url))


def is_remote(location: str | os.PathLike) -> bool:
    """True where ``location`` is a URL gpubatch reads or writes through fsspec, or a ``pipe:`` command
    (``file://`` URLs are local paths)."""
    scheme = url_scheme(location)
    return scheme is not None and scheme != "file"


def local_url(location: str | os.PathLike) -> str | os.PathLike:
    """A ``file://`` URL as its path; a URL a ``Path`` folded (``s3:/bucket/x``) as the URL; anything else as
    it is."""
    text = os.fspath(location)
    if text.startswith("file://"):
        return text[len("file://"):]
    if is_remote(text) and not text.startswith("pipe:") and "://" not in text:
        return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*):/", r"\1://", text)
    return location


def filesystem(url: str) -> tuple[Any, str]:
    """(the fsspec file system of ``url``, the path in it); a missing package is a one-line error naming
    the extra that brings it."""
    scheme = (url_scheme(url) or "").lower()
    try:
        import fsspec
    except ImportError:
        extra = EXTRAS.get(scheme, (None, "s3"))[1]
        raise DependencyError(f"{scheme}:// URLs need fsspec: pip install 'gpubatch[{extra}]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        package, extra = EXTRAS.get(scheme, (None, None))
        if extra is None:
            raise DependencyError(f"{scheme}:// URLs need fsspec's {scheme} file system: {e}") from None
        raise DependencyError(f"{scheme}:// URLs need {package}: pip install 'gpubatch[{extra}]'") from None
    except ValueError as e:  # an unknown protocol
        raise UsageError(f"{redact(url)}: {e}") from None


def cache_root() -> Path:
    return Path(os.environ.get("GPUBATCH_CACHE") or Path.home() / ".cache" / "gpubatch")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=10).hexdigest()


@contextlib.contextmanager
def store_errors(url: str, doing: str = "reading") -> Iterator[None]:
    """What a store's package raises inside the block (its own exceptions too: botocore's missing credentials,
    a refused connection) as one line naming the URL, never a traceback; gpubatch's own errors pass."""
    try:
        yield
    except (GpubatchError, UsageError):
        raise
    except FileNotFoundError:
        raise GpubatchError(f"{doing} {redact(url)} failed: not found") from None
    except PermissionError:
        raise GpubatchError(f"{doing} {redact(url)} failed: access denied (check the store's credentials)") from None
    except Exception as e:  # noqa: BLE001 - the store boundary: whatever the store's package raises
        said = re.sub(r"\s+", " ", f"{type(e).__name__}: {e}")[:300]
        hint = " (set the store's credentials: environment variables or its profile files)" \
            if "credential" in said.lower() else ""
        raise GpubatchError(f"{doing} {redact(url)} failed: {redact(said)}{hint}") from None


# --- the mirror: a remote source seen as a local folder ---------------------------------------------------


class Mirror:
    """The local folder standing for a remote dataset (see the module's docstring)."""

    def __init__(self, url: str, folder: Path, base: str, files: dict[str, list]):
        self.url = url  # what the user named (a folder, a file, a pattern)
        self.folder = folder  # <cache>/remote/<digest>
        self.root = folder / "files"  # the mirror of ``base``
        self.base = base  # the store URL of the folder the files lie in
        self.files = files  # relative name -> [size, mtime seconds, etag]
        self._fs: Any = None
        self._order: dict[str, dict[str, str]] = {}  # a set of files: each one's next

    # -- opening --
    @classmethod
    def open(cls, url: str) -> Mirror:
        """The mirror of ``url``, the store listed now, registered in this process (a run's worker processes
        find it by its folder: :func:`mirror_of`)."""
        mirror = cls._listed(url, cache_root() / "remote" / _digest(url))
        mirror._register()
        return mirror

    @classmethod
    def attached(cls, folder: Path) -> Mirror | None:
        """The mirror in ``folder`` as its listing (``state.json``) stands, or None."""
        try:
            doc = json.loads((folder / "state.json").read_text(encoding="utf-8"))
            return cls(doc["url"], folder, doc["base"], doc["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @classmethod
    def _listed(cls, url: str, folder: Path) -> Mirror:
        if url.startswith("pipe:"):
            return _piped(url, folder)
        fs, path = filesystem(url)
        proto = url.split("://", 1)[0]
        with store_errors(url, "listing"):
            fs.invalidate_cache()  # (what the store holds now, not what this process's file system saw before)
            base, found = _list(fs, path, url)
            _sized(fs, found)
        files = {rel: [int(i.get("size") or 0), _mtime(i), str(i.get("ETag") or i.get("etag") or "")]
                 for rel, i in found.items()}
        base_url = f"{proto}://{base}"
        if ".gpubatch/run.json" in files and "gpubatch.json" not in files:
            raise FormatError(f"{redact(base_url)} is a dataset gpubatch is still writing, or whose run was "
                              "interrupted: its manifest gpubatch.json is not there yet (finish the run with --resume)")
        mirror = cls(url, folder, base_url, files)
        mirror._fs = fs
        mirror._materialize()
        return mirror

    def _materialize(self) -> None:
        """Make the mirror's folder match the listing: placeholders for files new or changed, stale ones
        removed; ``state.json`` written."""
        self.root.mkdir(parents=True, exist_ok=True)
        old = {}
        with contextlib.suppress(OSError, ValueError, KeyError):
            old = json.loads((self.folder / "state.json").read_text(encoding="utf-8"))["files"]
        for rel, (size, mtime, etag) in self.files.items():
            local = self.root / rel
            if old.get(rel) == [size, mtime, etag] and local.is_file():
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            _placeholder(local, size, mtime)
        for rel in set(old) - set(self.files):
            with contextlib.suppress(FileNotFoundError):
                (self.root / rel).unlink()
        _write_state(self.folder, self.url, self.base, self.files)
        small = [self.root / rel for rel, (size, _, _) in self.files.items()
                 if size <= KEEP_SMALL and _SIDECAR.search(rel) and _placeholder_at(self.root / rel)]
        if 0 < len(small) <= SIDECARS_AT_ONCE:  # (read now, 16 at once, rather than one by one as readers ask)
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(self._fetch_small, small))

    def _register(self) -> None:
        MIRRORS[str(self.root)] = self
        if shown not in MESSAGE_HOOKS:  # (errors raised to callers name the store's URLs, not this mirror's paths)
            MESSAGE_HOOKS.append(shown)

    def local(self) -> Path:
        """The local path standing for the URL the mirror was opened with (a folder, file or pattern)."""
        rel = self.url[len(self.base):].lstrip("/") if self.url.startswith(self.base) and self.base != "pipe:" else ""
        return self.root / rel if rel else self.root

    def shown(self, text: str) -> str:
        """``text`` with this mirror's local paths given as the store's URLs."""
        return text.replace(str(self.root), redact(self.base).rstrip("/"))

    # -- the store --
    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = filesystem(self.base)[0]
        return self._fs

    def rel(self, local: str | Path) -> str:
        """A local path of the mirror as the listing names it (relative, with ``/``)."""
        return os.path.relpath(local, self.root).replace(os.sep, "/")

    def listed(self, local: str | Path) -> tuple[int, int]:
        """(size, modification time) the listing gave the remote file behind ``local`` ((0, 0): none)."""
        size, mtime, _ = self.files.get(self.rel(local), (0, 0, ""))
        return int(size), int(mtime)

    def remote(self, local: str | Path) -> str:
        """The store URL of a local path in the mirror."""
        return posixpath.join(self.base.rstrip("/"), self.rel(local))

    def read(self, local: str | Path, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes of the remote file behind ``local`` (``start``..``end`` where given)."""
        url = self.remote(local)
        if self.base.startswith("pipe:"):
            raise GpubatchError(f"{redact(url)}: a pipe: source is read whole")  # (never a placeholder)
        with store_errors(url):
            return self.fs.cat_file(_path_of(url), start=start, end=end)

    def fetch(self, local: str | Path, keep: bool = True, opened: bool = False) -> int | None:
        """The remote file behind ``local`` fetched whole into its place (one process at a time); ``keep``:
        counted among the shards this process keeps (a small file is not: it stays). With ``opened``, a
        read-only descriptor of the fetched file, opened under the file's lock: the file a caller reads is
        the fetched one, though the cache gives it back as a placeholder right after (:func:`_kept`)."""
        local = Path(local)
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        with _file_lock(self.folder, local):
            if not _placeholder_at(local):
                return os.open(local, flags) if opened else None
            size, mtime = self.listed(local)
            tmp = local.with_name(f".{local.name}.{os.getpid()}-{secrets.token_hex(4)}.fetch")
            try:
                with store_errors(self.remote(local)):
                    self.fs.get_file(_path_of(self.remote(local)), str(tmp))
                if tmp.stat().st_size != size:
                    raise GpubatchError(f"{redact(self.remote(local))} changed while it was read ({tmp.stat().st_size:,} "
                                        f"bytes, {size:,} when listed): run the command again")
                os.utime(tmp, ns=(mtime * 10**9, mtime * 10**9))
                os.replace(tmp, local)
                fd = os.open(local, flags) if opened else None
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        if keep:
            _kept(self, local)
        return fd

    def release(self) -> None:
        """Every shard fetched into the mirror (by any process) made a placeholder again: the cache keeps
        the listing and the small files, not the data."""
        for rel, (size, mtime, _) in self.files.items():
            if size <= KEEP_SMALL and _SIDECAR.search(rel):
                continue
            local = self.root / rel
            with contextlib.suppress(OSError):
                if not _placeholder_at(local):
                    with _file_lock(self.folder, local):
                        _placeholder(local, size, mtime)

    def _fetch_small(self, local: Path) -> None:
        with contextlib.suppress(GpubatchError):  # (a read that fails here fails again, said, where it is needed)
            self.fetch(local, keep=False)

    def next_of(self, local: Path) -> Path | None:
        """The file after ``local`` in its folder's set of files of its kind (the next shard), or None."""
        rel = self.rel(local)
        folder, name = posixpath.split(rel)
        suffix = name[name.find("."):] if "." in name else ""
        key = f"{folder}|{suffix}"
        if key not in self._order:
            names = sorted(r for r in self.files if posixpath.dirname(r) == folder and r.endswith(suffix))
            self._order[key] = {a: b for a, b in zip(names, names[1:])}
        after = self._order[key].get(rel)
        return self.root / after if after is not None else None


_FETCHED: deque[tuple[Mirror, Path]] = deque()  # this process's fetched shards, oldest first
_FETCHED_LOCK = threading.Lock()
_AHEAD: dict[str, threading.Thread] = {}


def _path_of(url: str) -> str:
    return url if url.startswith(("http://", "https://")) else url.split("://", 1)[-1]


def _mtime(info: dict) -> int:
    t = info.get("LastModified") or info.get("mtime") or info.get("last_modified") or info.get("created") or 0
    if hasattr(t, "timestamp"):
        return int(t.timestamp())
    try:
        return int(float(t))
    except (TypeError, ValueError):
        return 0


def _list(fs: Any, path: str, url: str) -> tuple[str, dict[str, dict]]:
    """(the folder the files lie in, without its scheme; relative name -> fsspec info) for a folder, a file
    or a pattern; a pattern's and a file's folder is listed beside them (indexes, manifests, label files)."""
    if _PATTERN.search(path):
        from braceexpand import braceexpand

        found: dict[str, dict] = {}
        for one in braceexpand(path):
            if re.search(r"[*?\[]", _bare(one)):
                found.update(fs.glob(one, detail=True))
            else:
                with contextlib.suppress(FileNotFoundError):
                    found[one] = fs.info(one)
        found = {k: v for k, v in found.items() if v.get("type", "file") == "file"}
        if not found:
            raise UsageError(f"no file matches the source pattern {redact(url)}")
        base = posixpath.commonpath([posixpath.dirname(_bare(k)) for k in found])
        return base, {**_beside(fs, path, base), **{_rel(base, k): v for k, v in found.items()}}
    info = {"type": "directory"} if path.endswith("/") else fs.info(path)
    if info.get("type") == "directory":
        base = _bare(path)
        listing = fs.find(path, detail=True, withdirs=False)
        if not listing:
            raise UsageError(f"source {redact(url)} holds no file")
        return base, {_rel(base, k): v for k, v in listing.items() if v.get("type", "file") == "file"}
    base = posixpath.dirname(_bare(path))
    return base, {**_beside(fs, path, base), _rel(base, path): info}


def _beside(fs: Any, path: str, base: str) -> dict[str, dict]:
    """The files of the folder ``base`` (non-recursive), where the store lists it."""
    folder = path.split("://", 1)[0] + "://" + base if "://" in path else base
    try:  # (refresh: a glob before may have left a listing of its prefix alone in s3fs's cache, 2026.6)
        listed = fs.ls(folder, detail=True, refresh=True)
    except TypeError:  # (a file system whose ls takes no refresh)
        listed = fs.ls(folder, detail=True)
    except (OSError, ValueError):  # (a store that cannot list: the files named alone)
        return {}
    return {_rel(base, i["name"]): i for i in listed if i.get("type", "file") == "file"}


def _sized(fs: Any, found: dict[str, dict]) -> None:
    """Sizes the listing left out (an HTTP server's index pages name files, not their sizes), asked of the
    store a file at a time (a HEAD request each, 16 at once)."""
    unsized = [i for i in found.values() if i.get("size") is None]
    if not unsized:
        return
    from concurrent.futures import ThreadPoolExecutor

    def ask(i: dict) -> None:
        with contextlib.suppress(OSError):
            i.update({k: v for k, v in fs.info(i["name"]).items() if k in ("size", "mtime", "ETag", "LastModified")})

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(ask, unsized))


def _bare(name: str) -> str:
    """A store path without its scheme (``http://host/x/`` -> ``host/x``), as the mirror names files."""
    return name.split("://", 1)[-1].rstrip("/")


def _rel(base: str, name: str) -> str:
    rel = posixpath.relpath(_bare(name), base) if base else _bare(name)
    if rel.startswith("..") or rel.startswith("/"):
        raise FormatError(f"{name} lies outside {base}")
    return rel


def _placeholder(local: Path, size: int, mtime: int) -> None:
    """A placeholder of ``size`` bytes at ``local`` (sparse; its first bytes the marker)."""
    tmp = local.with_name(f".{local.name}.{os.getpid()}-{secrets.token_hex(4)}.stub")
    with open(tmp, "wb") as f:
        f.write(PLACEHOLDER_MARK[: max(0, size)])
        if size > len(PLACEHOLDER_MARK):
            f.truncate(size)
    os.utime(tmp, ns=(mtime * 10**9 + PLACEHOLDER_NS, mtime * 10**9 + PLACEHOLDER_NS))
    os.replace(tmp, local)


def _placeholder_at(local: Path) -> bool:
    try:
        return is_placeholder(os.stat(local))
    except FileNotFoundError:
        return True


@contextlib.contextmanager
def _file_lock(folder: Path, local: Path) -> Iterator[None]:
    import fcntl

    locks = folder / "locks"
    locks.mkdir(exist_ok=True)
    fd = os.open(locks / _digest(str(local)), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _kept(mirror: Mirror, local: Path) -> None:
    """Note a shard this process fetched; the oldest beyond :data:`KEEP` becomes a placeholder again."""
    with _FETCHED_LOCK:
        _FETCHED.append((mirror, local))
        old = [_FETCHED.popleft() for _ in range(max(0, len(_FETCHED) - KEEP))]
    for m, path in old:
        size, mtime = m.listed(path)
        with _file_lock(m.folder, path):
            if not _placeholder_at(path) and not any(p == path for _, p in _FETCHED):
                _placeholder(path, size, mtime)


def mirror_of(path: str | Path) -> Mirror | None:
    """The mirror a local path lies in (one this process opened, or the one whose folder holds the path: a
    run's worker process takes its command's listing), or None."""
    text = os.fspath(path)
    for root, mirror in MIRRORS.items():
        if text == root or text.startswith(root + os.sep):
            return mirror
    remote = str(cache_root() / "remote") + os.sep
    if text.startswith(remote):
        folder = Path(remote) / text[len(remote):].split(os.sep, 1)[0]
        mirror = Mirror.attached(folder)
        if mirror is not None:
            mirror._register()
            return mirror
    return None


def _write_state(folder: Path, url: str, base: str, files: dict[str, list]) -> None:
    tmp = folder / f"state.json.{os.getpid()}-{secrets.token_hex(4)}"
    tmp.write_text(json.dumps({"url": redact(url), "base": base, "files": files}))
    os.replace(tmp, folder / "state.json")


def read_whole(path: str | Path, limit: int) -> bytes:
    """A placeholder's remote bytes (``_paths.read_regular``), kept in the mirror where the file is small and no
    media file (an index, a manifest: read again later)."""
    mirror = mirror_of(path)
    if mirror is None:
        raise GpubatchError(f"{path} stands for a remote file of a source this process did not open")
    size = mirror.listed(path)[0]
    if size > limit:
        raise ValueError(f"{size:,} bytes, above the {limit:,}-byte bound on one record")
    if size <= KEEP_SMALL and not _MEDIA.search(str(path)):
        mirror.fetch(path, keep=False)  # (the next read is local; at most KEEP_SMALL bytes)
        with open(path, "rb") as f:
            return f.read()
    return mirror.read(path)


def read_range(path: str | Path, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset`` of the remote file a placeholder stands for (``_paths.read_range``); reads
    within a file's first :data:`HEAD` bytes come from one read of them (detection, a shard's first
    header and its compression look there)."""
    mirror = mirror_of(path)
    if mirror is None:
        return b""
    size = mirror.listed(path)[0]
    end = min(size, offset + n)
    if end <= offset:
        return b""
    if end <= HEAD:
        key = str(path)
        head = _HEADS.get(key)
        if head is None:
            head = mirror.read(path, 0, min(size, HEAD))
            with _FETCHED_LOCK:
                _HEADS[key] = head
                while len(_HEADS) > 256:
                    _HEADS.pop(next(iter(_HEADS)))
        return head[offset:end]
    return mirror.read(path, offset, end)


def fetch(path: str | Path) -> int:
    """The remote file a placeholder stands for fetched into its place, the next one of its set fetched
    beside it in a thread; a read-only descriptor of the fetched file (``_paths.open_fetched``)."""
    mirror = mirror_of(path)
    if mirror is None:
        raise GpubatchError(f"{path} stands for a remote file of a source this process did not open")
    fd = mirror.fetch(path, opened=True)
    assert fd is not None
    nxt = mirror.next_of(Path(path))
    with _FETCHED_LOCK:
        for done in [k for k, t in _AHEAD.items() if not t.is_alive()]:
            del _AHEAD[done]
        if nxt is None or str(nxt) in _AHEAD or not _placeholder_at(nxt):
            return fd
        t = _AHEAD[str(nxt)] = threading.Thread(target=_ahead, args=(mirror, nxt), daemon=True,
                                                name="gpubatch-read-ahead")
    t.start()
    return fd


def _ahead(mirror: Mirror, local: Path) -> None:
    with contextlib.suppress(Exception):  # (a read-ahead that fails: the read itself says why)
        mirror.fetch(local)


def local_path(location: str | os.PathLike) -> Path:
    """The local path a source is read at: a URL's (or ``pipe:`` command's) mirror, listed now and registered
    in this process; a ``file://`` URL's path; else the path."""
    location = local_url(location)
    if is_remote(location):
        return Mirror.open(os.fspath(location)).local()
    return Path(location)


def release_all() -> None:
    """What this process's mirrors hold of their sources' data given back (the end of a command's run: a
    killed worker's shards too)."""
    with _FETCHED_LOCK:
        _FETCHED.clear()
        ahead = list(_AHEAD.values())
    for t in ahead:
        t.join(timeout=60)
    for mirror in list(MIRRORS.values()):
        mirror.release()


def shown(text: str) -> str:
    """``text`` with the local paths of every mirror this process opened given as their URLs."""
    for mirror in list(MIRRORS.values()):
        if str(mirror.root) in text:
            text = mirror.shown(text)
    return text


def shown_in(obj: Any) -> Any:
    """A report or a summary (a dataclass) with the local paths of the mirrors in its text given as URLs."""
    import dataclasses

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return shown(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    for f in dataclasses.fields(obj):
        setattr(obj, f.name, walk(getattr(obj, f.name)))
    return obj


# --- pipe: sources ----------------------------------------------------------------------------------------


def _piped(url: str, folder: Path) -> Mirror:
    """A ``pipe:CMD`` source (its braces expanded: a command a shard): each command run and what it prints
    kept as a shard in the mirror (a command's output cannot be read by offset or listed beforehand)."""
    from braceexpand import braceexpand

    commands = list(braceexpand(url[len("pipe:"):]))
    root = folder / "files"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    files: dict[str, list] = {}
    for i, cmd in enumerate(commands):
        name = _piped_name(cmd, i)
        out = root / name
        with open(out, "wb") as f:
            p = subprocess.run(cmd, shell=True, stdout=f, stderr=subprocess.PIPE)  # noqa: S602 - the user's command
        if p.returncode != 0:
            why = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GpubatchError(f"pipe: {redact(cmd)!r} exited {p.returncode}{': ' + why[-1] if why else ''}")
        files[name] = [out.stat().st_size, int(out.stat().st_mtime), ""]
    _write_state(folder, url, "pipe:", files)
    return Mirror(url, folder, "pipe:", files)


def _piped_name(cmd: str, i: int) -> str:
    """The shard name a ``pipe:`` command's output is kept under: the last word that names a shard file
    (``curl -s https://host/train-000001.tar`` -> ``train-000001.tar``), else ``pipe-NNNNNN.tar``."""
    for word in reversed(cmd.split()):
        name = word.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
        if re.fullmatch(r"[\w.-]+\.(tar|tgz|tar\.gz|tfrecords?|tfrec|rec|idx|parquet)", name):
            return name
    return f"pipe-{i:06d}.tar"
