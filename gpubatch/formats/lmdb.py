"""LMDB of Caffe ``Datum`` records, as Caffe's ``convert_imageset --encoded`` writes them.

Every value is a Datum with ``data`` (field 4, the encoded image bytes), ``label`` (field 5) and
``encoded=true`` (field 7), label and encoded always present on the wire (DALI emits a label only
when the field is there). Keys are ``%08d_<key>``, at most 511 bytes, in the unnamed main DB, and no
other keys: Caffe and DALI's ``readers.caffe`` treat every entry as a sample.

Reading also accepts raw Datums (``encoded=false``: planar CHW, BGR pixels), turned into lossless PNG
records, and LMDBs whose values are the encoded image bytes themselves (no Datum; unlabeled records),
as many PyTorch datasets store them. Their ``__name__`` keys (``__len__``, ``__keys__``) are metadata,
not samples, and are left out. Pickled values are refused, never unpickled: unpickling can run code.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

from .._paths import MAX_RECORD_BYTES, fetched
from ..errors import FormatError
from ..types import DatasetInfo, Media, Record, class_table, sniff_image_codec
from . import fields, register_format
from .base import OPENCV_AND_DALI_CODECS, Damaged, Format, Reader, WriteOptions
from .lmdb_datum import _data_file, _lmdb, datum_layout, decode_datum, encode_datum, needed_bytes  # noqa: F401 - (encode_datum: the format's API)
from .lmdb_sink import LmdbSink, finalize
from .manifest import audio_facts as manifest_audio
from .manifest import read_manifest

_KEY_PREFIX = re.compile(rb"^\d{8}_")
_META_KEY = re.compile(rb"^__\w+__$")  # __len__, __keys__: what PyTorch-style LMDBs keep beside samples


class LmdbReader(Reader):
    reads_without_scan = False  # (its reads go through the page walk its scan makes)

    def __init__(self, path: Path):
        path = Path(path)
        super().__init__(path.parent if path.is_file() else path)
        self.data_file = _data_file(path)
        fetched(self.data_file)  # (a remote database: fetched whole first)
        self.needed = needed_bytes(self.data_file)
        self.env = self.pages = None
        try:
            self._size_fd = os.open(self.data_file, os.O_RDONLY)
        except OSError as e:
            raise FormatError(f"cannot open LMDB {self.path}: {e}") from None
        try:
            self._env_key, self.env = _open_env(self.path, self._size_fd)
        except Exception as e:
            os.close(self._size_fd)
            raise FormatError(f"cannot open LMDB {self.path}: {e}") from None
        self._local = threading.local()
        from .lmdb_pages import PageFile, Unsupported

        try:  # keys listed and values read within the file's pages (a damaged file cannot crash the process)
            self.pages = PageFile(self.data_file)
        except Unsupported:  # duplicate keys, sub-databases: the library's own reads
            self.pages = None
        except (OSError, ValueError) as e:
            self.close()  # (its share of the environment, and the file)
            raise FormatError(f"cannot open LMDB {self.path}: {e}") from None

    def _check_size(self) -> None:
        """A file cut short since it was opened would crash the process on the next read of the map."""
        size = os.fstat(self._size_fd).st_size
        if size < self.needed:
            from ..errors import GpubatchError

            raise GpubatchError(f"{self.data_file} shrank to {size:,} bytes while it was read (it needs "
                                f"{self.needed:,}): stopped before reading past its end")

    def _scan(self) -> list:
        """The keys in order (each with its value's place in the file); a subtree of the B-tree that is
        damaged is one Damaged entry in its place, the keys around it listed."""
        from .lmdb_pages import Unsupported

        if self.pages is not None:
            try:
                found, holes = self.pages.walk()
            except Unsupported:
                self.pages = None
            else:
                out: list = [e for e in found if not _META_KEY.match(e.key)]
                for h in holes:
                    after = h.after.decode("utf-8", "replace")[:80] if h.after is not None else "the first"
                    out.append(Damaged(f"after {after}", f"{self.data_file}", f"damaged database: the records under "
                                       f"page {h.page} (after key {after}) cannot be listed ({h.reason})"))
                return sorted(out, key=lambda e: e.key.encode("utf-8", "surrogateescape") if isinstance(e, Damaged)
                              else e.key) if holes else out
        keys: list[bytes | Damaged] = []
        try:
            with self.env.begin() as txn:
                for k in txn.cursor().iternext(keys=True, values=False):
                    if not _META_KEY.match(k):
                        keys.append(k)
        except _lmdb().Error as e:
            after = keys[-1].decode("utf-8", "replace") if keys else "the first"
            keys.append(Damaged(f"after {after[:80]}", f"{self.data_file}", f"damaged database: the records after key "
                                f"{after[:80]} cannot be listed ({str(e).split(': ', 1)[-1]})"))
        return keys

    def info(self) -> DatasetInfo:
        manifest = read_manifest(self.path) or {}
        known = manifest.get("classes")
        if known:
            return DatasetInfo(classes=known, categories=tuple(manifest.get("categories") or ()))
        labels = []
        if self.pages is not None:
            for entry in self.entries():
                if isinstance(entry, Damaged):
                    continue
                try:  # (a Datum's label after its data: the value's last bytes, where it is laid out so)
                    layout = self._layout(entry)
                    found = layout[2] if layout is not None else decode_datum(self.pages.value(entry))
                    labels.append(fields.label(found.get("label", 0)))
                except ValueError:
                    continue
            return DatasetInfo(classes=class_table((), [x for x in labels if x is not None]))
        self._check_size()
        try:
            with self.env.begin() as txn:
                for _, v in txn.cursor():
                    try:
                        labels.append(fields.label(decode_datum(v).get("label", 0)))
                    except ValueError:
                        continue
        except _lmdb().Error:  # a damaged B-tree: the labels before the damage (the scan says what is lost)
            pass
        return DatasetInfo(classes=class_table((), [x for x in labels if x is not None]))

    def _layout(self, entry: Any) -> tuple[int, int, dict] | None:
        """An entry's Datum laid out (:func:`~.lmdb_datum.datum_layout`), from its value's first and last bytes."""
        if isinstance(entry, Damaged) or self.pages is None or getattr(entry, "size", None) is None \
                or entry.size > MAX_RECORD_BYTES:
            return None
        return datum_layout(lambda at, n: os.pread(self.pages.fd, n, entry.offset + at), entry.size)

    def peek(self, entry: Any, n: int) -> tuple[bytes, int, int | None] | None:
        """The first ``n`` bytes of an encoded image Datum's image, its size and its label (``info`` reads headers
        so); None for any other value (read whole: raw pixels, audio, an image stored bare, a damaged value)."""
        layout = self._layout(entry)
        if layout is None or layout[2].get("encoded") is False:
            return None
        start, size, found = layout
        head = os.pread(self.pages.fd, min(n, size), entry.offset + start)
        if len(head) != min(n, size) or not sniff_image_codec(head):
            return None
        try:
            return head, size, fields.label(found.get("label"), "the Datum's label")
        except ValueError:
            return None

    def where(self, entry: Any) -> tuple[str, str]:
        raw = getattr(entry, "key", entry)
        return (_KEY_PREFIX.sub(b"", raw).decode("utf-8", "surrogateescape"),
                f"{self.path}#{raw.decode('utf-8', 'surrogateescape')}")

    def _value(self, entry: Any, key: str, origin: str) -> bytes | None:
        """An entry's value: read within the file's pages, or by the library for the layouts it keeps."""
        size = getattr(entry, "size", None)
        if size is not None:
            if size > MAX_RECORD_BYTES:
                raise self.record_error(key, origin, f"a value of {size:,} bytes, above the "
                                        f"{MAX_RECORD_BYTES:,}-byte bound on one record")
            try:
                return self.pages.value(entry)
            except ValueError as e:
                from ..errors import GpubatchError

                raise GpubatchError(f"{self.data_file}: {e}: stopped before reading past its end") from None
        self._check_size()
        with self.env.begin(buffers=True) as txn:
            view = txn.get(entry)
            if view is not None and len(view) > MAX_RECORD_BYTES:
                raise self.record_error(key, origin, f"a value of {len(view):,} bytes, above the "
                                        f"{MAX_RECORD_BYTES:,}-byte bound on one record")
            return None if view is None else bytes(view)

    def _read(self, entry: Any) -> Record:
        import numpy as np

        key, origin = self.where(entry)
        value = self._value(entry, key, origin)
        if value is None:
            raise self.record_error(key, origin, "key vanished from the database")
        try:
            d = decode_datum(value)
        except ValueError as e:
            d, why = None, e
        if d is None or "data" not in d:
            codec = sniff_image_codec(value)
            if codec:  # the value is the encoded image itself
                return Record(key=key, data=bytes(value), codec=codec, label=None, meta={}, origin=origin)
            if value[:1] == b"\x80" and value[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
                raise self.record_error(key, origin, "a pickled value: gpubatch does not unpickle (it can run code)")
            if d is None:
                raise self.record_error(key, origin, f"neither a Caffe Datum ({why}) nor image bytes")
        data = d.get("data", b"")
        try:
            label = fields.label(d.get("label"), "the Datum's label")  # gpubatch writes -1 when unlabeled
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        sound = _audio_codec(data)
        if sound:  # an audio dataset's record: an audio file, or its features or waveform as .npy
            meta = {}
            if sound == "npy":  # (its rate and features: the dataset's, in gpubatch.json)
                audio = self.audio_facts()
                meta = {k: v for k, v in audio.items() if v and k in ("sample_rate", "features")}
            return Record(key=key, data=data, media=Media.AUDIO, codec=sound, label=label, meta=meta, origin=origin)
        meta = {}
        enc = d.get("encoded")  # absent: Caffe reads raw, DALI encoded; the bytes decide
        if enc is not False and not sniff_image_codec(data) and self.media == "audio":  # (media: the first few's)
            raise self.record_error(key, origin, f"not an audio file gpubatch reads (its first bytes "
                                    f"{data[:4].hex(' ')}; the dataset's other records hold sound: damaged?)")
        if enc is True or (enc is None and sniff_image_codec(data)):
            codec = sniff_image_codec(data) or "unknown"
        else:
            c, h, w = d.get("channels", 0), d.get("height", 0), d.get("width", 0)
            if c not in (1, 3) or c * h * w != len(data) or not h or not w:
                raise self.record_error(key, origin, f"raw Datum {c}x{h}x{w} does not match {len(data)} bytes")
            from ..engine.codecs.image import encode

            pixels = np.frombuffer(data, np.uint8).reshape(c, h, w).transpose(1, 2, 0)
            data = encode(pixels[:, :, ::-1] if c == 3 else pixels, "png")
            codec, meta = "png", {"raw_datum": True}
        return Record(key=key, data=data, codec=codec, label=label, meta=meta, origin=origin)

    def audio_facts(self) -> dict[str, Any]:
        """The sample rate and features every audio array of the dataset shares (its manifest's ``audio``)."""
        if not hasattr(self, "_audio"):
            self._audio = manifest_audio(self.path)
        return self._audio

    @property
    def media(self) -> str:  # type: ignore[override]
        """"audio" where most of the first records hold audio (a file, or features as .npy), else "image"."""
        if getattr(self, "_media", None) is None:
            self._media = ""  # (while the first records are read: each taken as it is)
            self._media = self.first_media(lambda e: "audio" if self._read(e).media is Media.AUDIO else "image")
        return self._media

    def close(self) -> None:
        if self.pages is not None:
            self.pages.close()
            self.pages = None
        if self.env is not None:
            _close_env(self._env_key)
            self.env = None
            os.close(self._size_fd)


# An LMDB environment may be open once in a process (the library refuses a second open of the same file:
# "already open in this process"), so the readers of one database in one process (a training loader and a
# validation loader, a loader and open_dataset) share it: (pid, device, inode) -> [environment, readers].
_ENVS: dict[tuple[int, int, int], list[Any]] = {}
_ENVS_LOCK = threading.Lock()


def _open_env(path: Path, fd: int) -> tuple[tuple[int, int, int], Any]:
    """This process's read-only environment of the database at ``path`` (its data file open as ``fd``),
    opened by the first reader and shared by the others: (its key for :func:`_close_env`, it)."""
    st = os.fstat(fd)
    key = (os.getpid(), st.st_dev, st.st_ino)
    with _ENVS_LOCK:
        held = _ENVS.get(key)
        if held is None:
            env = _lmdb().open(str(path), readonly=True, lock=False, subdir=True, readahead=False, max_readers=512)
            held = _ENVS[key] = [env, 0]
        held[1] += 1
        return key, held[0]


def _close_env(key: tuple[int, int, int]) -> None:
    """One reader less of the environment of ``key``: closed with the last."""
    with _ENVS_LOCK:
        held = _ENVS.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _ENVS[key]
            held[0].close()


def _audio_codec(data: bytes) -> str | None:
    """The codec of a Datum's bytes where they are audio (wav, flac...) or a ``.npy`` of features."""
    if data[:6] == b"\x93NUMPY":
        return "npy"
    if sniff_image_codec(data):
        return None
    from ..engine.codecs.audio_io import sniff_audio

    found = sniff_audio(data)
    # every container sniff_audio names is audio here (an LMDB holds images and audio, and images were ruled out
    # above), but an MP3 frame's sync bits are too loose to tell raw pixels from sound: an MP3 needs its ID3 tag
    return found if found and (found != "mp3" or data[:3] == b"ID3") else None


@register_format
class LmdbFormat(Format):
    image_codecs = OPENCV_AND_DALI_CODECS
    name = "lmdb"
    description = "LMDB of Caffe Datum records (encoded images + label, or audio / .npy features), keys %08d_<key>"
    detect_priority = 10
    media = (Media.IMAGE, Media.AUDIO)
    carries_record_meta = False

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        return (path.is_dir() and (path / "data.mdb").is_file()) or (path.is_file() and path.name == "data.mdb")

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return LmdbReader(path)

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> Any:
        return LmdbSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        return finalize(root, shards)
