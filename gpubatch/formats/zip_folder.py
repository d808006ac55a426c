"""A media folder in a ZIP file, read as the folder its extraction makes: an image folder (detected, or
``--from folder``: Kaggle's ``train.zip``, COCO's ``val2017.zip``, a class-folder tree zipped on a desktop), an audio
or a video folder (``--from audio``, ``--from video``).

The ZIP's central directory lists its members (Python's ``zipfile``); a record's entry holds what reading it needs
(the member's local header's offset, its sizes, compression and CRC-32), so a worker reads a member where it lies,
with one ``pread`` for the header and one for the data, and checks its CRC-32 and size: a damaged member is that
record's error, never a wrong image. Stored members are read as they lie, deflated ones inflated here, bzip2 and LZMA
ones through ``zipfile``. Encrypted members, and compression methods Python does not read (Deflate64), are records
that fail with their reason. The classes are as for a tar of class folders (:func:`.files.class_folders_under`): the
folders under the files' common folder, where there are two or more (labels by their sorted names), keys relative
to it; else the records are unlabeled. Hidden members (macOS's ``__MACOSX/`` and ``._photo.jpg`` among them) and
files of another kind are named as left out; a member named outside the ZIP is its record's error; a ZIP that holds
what its extracted folder is read by (:func:`.files.listing_among`) is refused, naming it.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

from .._paths import MAX_RECORD_BYTES, safe_relpath
from ..errors import FormatError
from ..types import (
    AUDIO_EXTENSIONS,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    DatasetInfo,
    Media,
    Record,
    sniff_image_codec,
)
from .base import Damaged, Reader
from .files import (
    MEDIA_EXTENSIONS,
    class_folders_under,
    listing_among,
    named_with,
    refuse_listed,
    said_left_out,
)

#: a member's local header: signature, version, flags, method, time, date, CRC, sizes, name and extra lengths
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIG = 0x04034B50
_ZIP_HEADS = (b"PK\x03\x04", b"PK\x05\x06")


def is_zip(path: Path) -> bool:
    """Whether ``path`` is a ZIP file (its first bytes: a member's header, or an empty archive's end)."""
    from .._paths import read_head

    return Path(path).is_file() and read_head(path, 4) in _ZIP_HEADS


def listed(path: Path) -> list[Any]:
    """The files the ZIP at ``path`` lists (its central directory's ``ZipInfo``s, folders left out).

    Raises:
        FormatError: the ZIP is damaged (cut short, its central directory lost) or cannot be read, in one line.
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            every = z.infolist()
            counted = _end_record_count(z.fp)
    except zipfile.BadZipFile as e:
        raise FormatError(f"{path} is a damaged ZIP ({e}: cut short, or its central directory lost); "
                          f"'zip -FF {path} --out fixed.zip' rebuilds what it can") from None
    except NotImplementedError as e:  # (an entry of its central directory names a version no reader knows: damaged)
        raise FormatError(f"{path} is a damaged ZIP, or one Python's zipfile cannot list ({e}); 'zip -FF {path} "
                          "--out fixed.zip' rebuilds what it can") from None
    except OSError as e:
        raise FormatError(f"cannot read {path}: {e.strerror or e}") from None
    if counted is not None and counted != len(every):  # (a damaged entry's lengths swallowed the entries after it)
        raise FormatError(f"{path} is a damaged ZIP: its end record counts {counted:,} entries, its central directory "
                          f"lists {len(every):,}; 'zip -FF {path} --out fixed.zip' rebuilds what it can")
    return [i for i in every if not i.is_dir()]


def _end_record_count(f: Any) -> int | None:
    """How many entries a ZIP's end-of-central-directory record counts (``f`` its open file), or None where it
    is not found in the file's last 64 KiB or defers to a ZIP64 record."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - (1 << 16) - 22))
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return None
    count = int.from_bytes(tail[at + 10 : at + 12], "little")
    return None if count == 0xFFFF else count


def holds(path: Path, media: str = "image") -> bool:
    """Whether the ZIP at ``path`` lists a file of ``media`` (its central directory only is read; a damaged or
    unreadable ZIP lists none)."""
    try:
        return any(named_with(i.filename, MEDIA_EXTENSIONS[media]) for i in listed(path))
    except (FormatError, ValueError):
        return False


class ZipFolderReader(Reader):
    """Reads the image folder a ZIP holds (``media``: or the audio or video folder; see the module's docstring)."""

    def __init__(self, path: Path, media: str = "image"):
        super().__init__(path)
        self.media = media
        self._exts = MEDIA_EXTENSIONS[media]
        self._classes: tuple[str, ...] = ()
        self.left_out: dict[str, Any] = {}

    def roots(self) -> list[Path]:
        return [self.path]  # (the ZIP is the source: an output beside it is no overlap)

    def _scan(self) -> list[Any]:
        members = listed(self.path)
        listing = listing_among([i.filename for i in members], self.media)
        if listing:
            refuse_listed(self.path, listing)
        left: dict[str, list[str]] = {"other": [], "outside": []}
        images = []
        hidden: set[str] = set()
        unsafe: list[Damaged] = []  # (a name that is absolute or climbs out: its record's error, in no class)
        for i in members:
            try:
                safe_relpath(i.filename)
            except ValueError as e:
                if named_with(i.filename, self._exts):
                    unsafe.append(Damaged(i.filename, f"{self.path}#{i.filename}", str(e)))
                continue
            parts = i.filename.split("/")
            at = next((k for k, part in enumerate(parts) if part.startswith(".") or part == "__MACOSX"), None)
            if at is not None:  # (named as a folder's walk names them: a hidden folder, or a hidden image)
                if at < len(parts) - 1:
                    hidden.add("/".join(parts[: at + 1]) + "/")
                elif named_with(i.filename, self._exts):
                    hidden.add(i.filename)
            elif named_with(i.filename, self._exts):
                images.append(i)
            else:
                left["other"].append(i.filename)
        dirs = [i.filename.split("/")[:-1] for i in images]
        n, classes = class_folders_under(dirs)
        media_is_audio = self.media == "audio"
        if media_is_audio:  # (Speech Commands' _background_noise_: no class)
            classes = [c for c in classes if not c.startswith("_")]
        labeled = len(classes) >= 2
        index = {c: k for k, c in enumerate(classes)} if labeled else {}
        entries: list[Any] = []
        for i, d in zip(images, dirs):
            rel = "/".join(i.filename.split("/")[n:])
            label = None
            if labeled:
                if len(d) == n or (media_is_audio and d[n] not in index):  # (beside the class folders: in none)
                    left["outside"].append(i.filename)
                    continue
                label = index[d[n]]
            entries.append((rel, label, i.filename, i.header_offset, i.compress_size, i.file_size, i.compress_type,
                            i.CRC, i.flag_bits))
        self._classes = tuple(classes) if labeled else ()
        entries += unsafe
        left["hidden"] = sorted(hidden)
        self.left_out = said_left_out(self, self.path, {k: sorted(v) for k, v in left.items()}, self.media)
        return entries

    def info(self) -> DatasetInfo:
        self.entries()
        return DatasetInfo(classes=self._classes)

    def where(self, entry: Any) -> tuple[str, str]:
        return entry[0].rsplit(".", 1)[0], f"{self.path}#{entry[2]}"

    def _data_at(self, fd: int, entry: Any) -> int | None:
        """Where the member's stored bytes begin (after its local header), or None where no header is there."""
        head = entry[3]
        local = os.pread(fd, _LOCAL.size, head)
        if len(local) < _LOCAL.size or _LOCAL.unpack(local)[0] != _LOCAL_SIG:
            return None
        *_, name_len, extra_len = _LOCAL.unpack(local)
        return head + _LOCAL.size + name_len + extra_len

    def peek(self, entry: Any, n: int) -> tuple[bytes, int, int | None] | None:
        """The first ``n`` bytes of an image member, its size and its label (``info`` reads headers so); None where
        :meth:`read` has more to say (a damaged, encrypted or bzip2/LZMA member)."""
        if isinstance(entry, Damaged) or entry[8] & 0x1 or entry[6] not in (0, 8):
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            at = self._data_at(fd, entry)
            if at is None:
                return None
            if entry[6] == 0:
                return os.pread(fd, min(n, entry[4]), at), entry[5], entry[1]
            head = zlib.decompressobj(-15).decompress(os.pread(fd, min(entry[4], n + 1024), at), n)
            return head, entry[5], entry[1]
        except (OSError, zlib.error):
            return None
        finally:
            os.close(fd)

    def _read(self, entry: Any) -> Record:
        rel, label, name, head, csize, size, method, crc, flags = entry
        key, origin = self.where(entry)
        try:
            safe_relpath(rel)
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        if flags & 0x1:
            raise self.record_error(key, origin, "an encrypted member: gpubatch reads no password-protected ZIP")
        if size > MAX_RECORD_BYTES or csize > MAX_RECORD_BYTES:
            raise self.record_error(key, origin, f"member of {size:,} bytes, above the {MAX_RECORD_BYTES:,}-byte "
                                    "bound on one record")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            at = self._data_at(fd, entry)
            if at is None:
                raise self.record_error(key, origin, f"no member header at byte {head:,} (the ZIP is damaged there)")
            raw = os.pread(fd, csize, at)
        finally:
            os.close(fd)
        if len(raw) != csize:
            raise self.record_error(key, origin, "truncated member (the ZIP is cut short)")
        try:
            data = _inflate(raw, method, self.path, name)
        except NotImplementedError as e:
            raise self.record_error(key, origin, f"cannot read this member: {e}") from None
        except Exception as e:  # noqa: BLE001 - (zlib's, bz2's, lzma's errors: a damaged member)
            raise self.record_error(key, origin, f"damaged member: cannot inflate it ({e})") from None
        if len(data) != size or zlib.crc32(data) != crc:
            raise self.record_error(key, origin, "damaged member: its bytes do not match the CRC-32 the ZIP lists")
        ext = rel.rsplit(".", 1)[-1].lower()
        if self.media == "audio":
            from ..engine.codecs.audio_io import sniff_audio

            media, codec = Media.AUDIO, sniff_audio(data) or AUDIO_EXTENSIONS.get(ext, ext)
        elif self.media == "video":
            from ..engine.codecs.video_probe import sniff_container

            media, codec = Media.VIDEO, sniff_container(data) or VIDEO_EXTENSIONS.get(ext, ext)
        else:
            media, codec = Media.IMAGE, sniff_image_codec(data) or IMAGE_EXTENSIONS.get(ext, ext)
        return Record(key=key, data=data, media=media, codec=codec, label=label,
                      meta={"filename": rel.rsplit("/", 1)[-1]}, origin=origin)


def _inflate(raw: bytes, method: int, path: Path, name: str) -> bytes:
    """A member's bytes from its stored ones: stored (0) as they are, deflated (8) inflated here; bzip2 and LZMA
    (rare) through ``zipfile`` itself, which raises NotImplementedError for a method it does not read."""
    if method == 0:
        return raw
    if method == 8:
        d = zlib.decompressobj(-15)
        return d.decompress(raw) + d.flush()
    import zipfile

    with zipfile.ZipFile(path) as z:
        return z.read(name)
