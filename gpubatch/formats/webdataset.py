"""WebDataset tar shards ``NAME-000000.tar``, with a DALI ``v1.2`` index ``NAME-000000.idx`` beside each.

A sample is consecutive members sharing a key: ``key.jpg`` (or ``.png``...), ``key.cls`` (the class
index as ASCII decimal, as webdataset's ``int(data)`` reads it) and ``key.json`` when the record has
boxes or other fields (``{"width", "height", "label", "class", "annotations": [COCO-style boxes
(bbox = [x, y, w, h] in pixels, category_id, iscrowd, ...)], "meta": {...}}``). A sample's other
members (captions, masks, arrays) and the fields of its ``.json`` that are not those are kept in the
record's metadata (``MEMBERS``, ``JSON_FIELDS``) and written back. Tars are written in
GNU format with integer mtimes and ASCII names, so they hold no pax headers; keys use
``[A-Za-z0-9_-/]`` with no dot, extensions are lower case, members of a sample are adjacent.
"""

from __future__ import annotations

import base64
import json
import os
import re
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

from .._commit import write_text
from .._paths import MAX_RECORD_BYTES, read_head, safe_relpath, source_files, source_root
from ..errors import FormatError, RecordError
from ..types import (
    AUDIO_EXTENSIONS,
    CODEC_EXTENSION,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    Boxes,
    DatasetInfo,
    Media,
    Record,
    class_table,
    keypoint_flips,
    sniff_image_codec,
)
from . import fields, register_format
from .base import (
    JSON_FIELDS,
    MEMBERS,
    Damaged,
    Format,
    OpenShards,
    Reader,
    WriteOptions,
    check_one_split,
    compression,
    image_size,
    shortfall,
)
from .files import TAR_SUFFIXES
from .manifest import expected_records, read_manifest
from .sinks import ShardFile, ShardSink
from .tar_folders import class_tar_samples, classes_of_folders, holds_tars
from .tar_scan import (
    _BLOCK,
    _not_found,
    _samples,
    gnu_header,
    header_holds,
    indexed_samples,
    scan_tar,
    split_file,
    split_member,
)

_COMPRESSED_SUFFIXES = TAR_SUFFIXES[1:]
_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-/]+")
_KEY_SAFE = re.compile(r"[A-Za-z0-9_\-]+(?:/[A-Za-z0-9_\-]+)*")
#: a member up to this size is read with its header block in one call (a larger one's bytes are not copied for it)
_READ_WITH_HEADER = 1 << 16
#: a tar block of zeros (members' padding is cut from it)
_ZEROS = bytes(tarfile.BLOCKSIZE)


def _is_tar(head: bytes) -> bool:
    """Whether ``head`` (a file's first 512 bytes) is a tar header (its checksum holds)."""
    if len(head) < _BLOCK:
        return False
    try:
        tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError):
        return False
    return True




def safe_key(key: str) -> str:
    """A WebDataset key: ``[A-Za-z0-9_-/]``, no dots, no empty path parts."""
    if _KEY_SAFE.fullmatch(key):  # (most keys: already one)
        return key
    parts = [_KEY_BAD.sub("_", p) for p in key.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return "/".join(p for p in parts if p) or "sample"


def compressed_shards(path: Path) -> list[Path]:
    """The compressed tar shards (``.tar.gz``, ``.tgz``, ``.tar.xz``...) at ``path``, a folder or a file."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []
    return [p for p in files if p.name.lower().endswith(_COMPRESSED_SUFFIXES)]


def _is_shard(p: Path) -> bool:
    return p.name.endswith(".tar") or p.name.lower().endswith(_COMPRESSED_SUFFIXES)


class WebDatasetReader(Reader):
    """Reads WebDataset shards: plain ``.tar`` files, and compressed ones (``.tar.gz``, ``.tgz``,
    ``.tar.bz2``, ``.tar.xz``; ``.tar.zst`` with ``zstandard``), which are decompressed one shard at a time
    into temporary files and read by offset there (:class:`~gpubatch.formats.base.OpenShards`)."""

    reads_into = True

    def __init__(self, path: Path, folder_classes: str | None = None):
        """``folder_classes``: a tar of a media folder's tree (``"image"``, ``"audio"``, ``"video"``: ``--from folder``,
        ``audio``, ``video``), read as that folder once extracted would be, its class folders the classes
        (:func:`.tar_folders.classes_of_folders`)."""
        path = Path(path)
        self.folder_classes = folder_classes
        matched = source_files(path)
        if matched is not None:  # a pattern: its shards
            self.tars = [p for p in matched if _is_shard(p)]
        else:
            self.tars = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file() and _is_shard(p))
            if path.is_dir():
                check_one_split(self.tars, path)
        super().__init__(source_root(path))
        self.files_given = not Path(path).is_dir()
        if not self.tars:
            raise FormatError(f"no .tar shards in {path}")
        self.files = OpenShards(self.tars)
        self.manifest = read_manifest(self.path) or {}
        self.keypoint_flip = keypoint_flips(self.manifest.get("categories"))
        self._found_classes: tuple[str, ...] = ()  # the classes of a tar of class tars or folders (tar_folders.py)
        self._walks: dict[int, dict[str, tuple[int, int]]] = {}  # a shard's members by name, where its index lied

    def _indexed(self, s: int) -> list | None:
        """A shard gpubatch wrote, listed from its index where the index stands for it (None: walked)."""
        if self.files.compression(s) is not None:
            return None
        try:  # (its header blocks read where they lie: a remote shard is not fetched for them)
            return indexed_samples(self.tars[s])
        except OSError:
            return None

    def _scan(self) -> list[tuple[int, str, tuple] | Damaged]:
        from concurrent.futures import ThreadPoolExecutor

        entries: list[tuple[int, str, tuple] | Damaged] = []
        indexed: list[list | None] = [None] * len(self.tars)
        if self.manifest:  # (a set gpubatch wrote: its indexes checked 8 at once, a store's reads wait on the network)
            with ThreadPoolExecutor(8) as pool:
                indexed = list(pool.map(self._indexed, range(len(self.tars))))
        for s, tar in enumerate(self.tars):
            found = indexed[s]
            if found is not None:  # a shard gpubatch wrote: its index, where it stands
                entries.extend(shortfall(tar, [(s, k, m) for _, k, m in found], expected_records(self.manifest, tar),
                                         [], ""))
                continue
            try:
                with self.files.reading(s) as fd, os.fdopen(os.dup(fd), "rb") as f:  # (compressed: its copy)
                    members, damage, ended = scan_tar(f, os.fstat(fd).st_size)
                    nested = class_tar_samples(s, tar, f, members) if holds_tars(members) else None
            except OSError as e:
                raise FormatError(f"cannot read tar shard {tar}: {e.strerror or e}") from None
            if nested is not None:  # ImageNet's training tar: a tar of class tars
                entries.extend(shortfall(tar, [*_samples(s, tar, [], damage), *nested], None, [], "" if ended else
                                         "the tar has no end-of-archive block"))
                continue
            found = _samples(s, tar, members, damage, split_file if self.folder_classes else split_member)
            named = _not_found(tar, found, members)
            cut = "" if ended else "the tar has no end-of-archive block"
            if not self.files.whole.get(s, True):
                cut = "its compressed data breaks off (cut short or damaged)"
                if ended and (members or damage):  # (the tar's last block came out whole: the damage is past it. A
                    # copy that came out empty is no empty tar: a bzip2 file cut inside its first 900 kB block)
                    cut = ""
            entries.extend(shortfall(tar, found, expected_records(self.manifest, tar), named, cut))
        if not self.manifest and not any(not isinstance(e, Damaged) and len(e) == 4 for e in entries):
            entries = classes_of_folders(self, entries)
        names = sorted({e[3] for e in entries if not isinstance(e, Damaged) and len(e) == 4})
        if names:  # the classes of class tars or folders: labels as the extracted class folders' sorted names give
            self._found_classes = tuple(names)
            index = {c: i for i, c in enumerate(names)}
            entries = [(*e[:3], index[e[3]]) if not isinstance(e, Damaged) and len(e) == 4 else e for e in entries]
        return entries

    def info(self) -> DatasetInfo:
        if self.manifest.get("classes") is not None:
            return DatasetInfo(classes=self.manifest["classes"], categories=tuple(self.manifest.get("categories") or ()))
        entries = self.entries()
        if self._found_classes:
            return DatasetInfo(classes=self._found_classes)
        labels = []
        for entry in entries:
            if isinstance(entry, Damaged):
                continue
            s, _key, members = entry[:3]
            for ext, off, size, _ in members:
                if ext == "cls" and size <= 64:
                    try:
                        labels.append(fields.label(int(self.files.pread(s, size, off))))
                    except ValueError:
                        pass
        return DatasetInfo(classes=class_table((), [x for x in labels if x is not None]))

    def shard_paths(self) -> list[Path]:
        return list(self.tars)

    def where(self, entry: tuple[int, str, tuple]) -> tuple[str, str]:
        return entry[1], f"{self.tars[entry[0]]}#{entry[1]}"

    @property
    def media(self) -> str:  # type: ignore[override]
        """"video" for a dataset of video samples (a video member and no image member), "audio" for one of
        audio samples (an audio member, no image or video member) or of audio features, else "image"; a tar read
        as a media folder (``folder_classes``: ``--from audio``) with no such member left whole (cut inside its
        first), the media it names."""
        exts = self.member_extensions()
        if any(e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS for e in exts):
            return "image"
        if any(e in VIDEO_EXTENSIONS for e in exts):
            return "video"
        if any(e in AUDIO_EXTENSIONS for e in exts):
            return "audio"
        if "npy" in exts:  # arrays gpubatch wrote: audio features or video clips, as the first sample says
            return self.first_media(lambda e: self._read(e).media.value)
        return self.folder_classes or "image"

    def member_extensions(self) -> dict[str, int]:
        """Per member extension (``jpg``, ``cls``, ``json``, ``txt``...), how many samples hold one: what a
        webdataset pipeline's ``to_tuple("jpg", "cls")`` can ask for."""
        counts: Counter = Counter()
        for entry in self.entries():
            if not isinstance(entry, Damaged):
                counts.update({m[0] for m in entry[2]})
        return dict(sorted(counts.items()))

    def peek(self, entry: Any, n: int) -> tuple[bytes, int, int | None] | None:
        """The first ``n`` bytes of a sample's image, its size and its label (``info`` reads headers so, not every
        image whole), for a sample of one image and at most a ``.cls``; None for any other (read whole, with its
        members, boxes and checks)."""
        if isinstance(entry, Damaged):
            return None
        s, _, members = entry[:3]
        images = [m for m in members if m[0] in IMAGE_EXTENSIONS]
        if len(images) != 1 or len(members) > 1 + any(m[0] == "cls" for m in members):
            return None
        _, off, size, _ = images[0]
        label = entry[3] if len(entry) > 3 else None
        cls = next((m for m in members if m[0] == "cls"), None)
        try:
            if any(self._placed(s, m[3], m[1], m[2]) != (m[1], m[2]) for m in (images[0], cls) if m is not None):
                return None  # (an index that lied: read whole, from where the walk found it)
        except RecordError:
            return None  # (read whole: its error)
        if cls is not None:  # (as _read takes it; anything else it says what is wrong with)
            if cls[2] > 64:
                return None
            text = self.files.pread(s, cls[2], cls[1]).strip() or b"-1"
            try:
                if not re.fullmatch(rb"-?[0-9]+", text):
                    return None
                label = fields.label(int(text), "the .cls member")
            except ValueError:
                return None
        head = self.files.pread(s, min(n, size), off)
        return (head, size, label) if len(head) == min(n, size) else None

    def _member(self, s: int, name: str, off: int, size: int, into: Any = None) -> Any:
        """One member's bytes, checked whole (a shard cut short inside it is this record's error); read
        into the buffer ``into(size)`` gives where it is given (:meth:`Reader.read`). The tar header before
        them is read with them and must be the member's own (:func:`.tar_scan.header_holds`): where an index
        misplaced it, the member is read from where a walk over the shard finds it."""
        self._bounded(s, name, size)
        data, got = self._with_header(s, name, off, size, into)
        if data is None:
            off, size = self._walked(s, name, off)
            self._bounded(s, name, size)
            data, got = self._plain(s, off, size, into)
        if got != size:
            raise self.record_error(name, f"{self.tars[s]}#{name}", "truncated member")
        return data

    def _bounded(self, s: int, name: str, size: int) -> None:
        if size > MAX_RECORD_BYTES:
            raise self.record_error(name, f"{self.tars[s]}#{name}", f"member of {size:,} bytes, above the "
                                    f"{MAX_RECORD_BYTES:,}-byte bound on one record")

    def _plain(self, s: int, off: int, size: int, into: Any) -> tuple[Any, int]:
        if into is not None:
            data = into(size)
            return data, self.files.preadv(s, [data], off)
        data = self.files.pread(s, size, off)
        return data, len(data)

    def _with_header(self, s: int, name: str, off: int, size: int, into: Any) -> tuple[Any, int]:
        """(bytes, how many were read) of a member, its header block read in the same call where it is small or
        goes ``into`` a buffer; (None, 0) where that block is not the member's header."""
        if off < _BLOCK:
            return None, 0
        if into is not None:
            head, data = bytearray(_BLOCK), into(size)
            got = self.files.preadv(s, [head, data], off - _BLOCK) - _BLOCK
        elif size <= _READ_WITH_HEADER:
            buf = self.files.pread(s, _BLOCK + size, off - _BLOCK)
            head, data, got = buf[:_BLOCK], buf[_BLOCK:], len(buf) - _BLOCK
        else:
            head = self.files.pread(s, _BLOCK, off - _BLOCK)
            return self._plain(s, off, size, None) if header_holds(head, name, size) else (None, 0)
        if got < 0 or header_holds(head, name, size):  # (a shard that ends before it: truncated, as said)
            return data, got
        return None, 0

    def _placed(self, s: int, name: str, off: int, size: int) -> tuple[int, int]:
        """Where member ``name`` lies, (offset, size): as listed where the header there is its own, else
        :meth:`_walked`."""
        if off >= _BLOCK and header_holds(self.files.pread(s, _BLOCK, off - _BLOCK), name, size):
            return off, size
        return self._walked(s, name, off)

    def _walked(self, s: int, name: str, off: int) -> tuple[int, int]:
        """Where a walk over shard ``s``'s headers finds member ``name`` (an index beside the shard damaged or
        stale placed it at ``off``); the record's error where the shard holds no such member."""
        walk = self._walks.get(s)
        if walk is None:
            try:
                with self.files.reading(s) as fd, os.fdopen(os.dup(fd), "rb") as f:
                    members = scan_tar(f, os.fstat(fd).st_size)[0]
            except OSError as e:
                raise self.record_error(name, f"{self.tars[s]}#{name}", e.strerror or e) from None
            walk = self._walks.setdefault(s, {m[0]: (m[1], m[2]) for m in members})
        if name not in walk:
            raise self.record_error(name, f"{self.tars[s]}#{name}", f"the shard holds no member {name} (its index "
                                    f"{self.tars[s].with_suffix('.idx').name} places one at byte {off:,})")
        return walk[name]

    def _read(self, entry: tuple, into: Any = None) -> Record:
        s, key, members = entry[:3]  # (a class tar's sample: its label fourth)
        origin = f"{self.tars[s]}#{key}"
        try:
            safe_relpath(key)
            for _, _, _, name in members:
                safe_relpath(name)
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        parts = {}
        for ext, off, size, name in members:
            if ext in parts:
                raise self.record_error(key, origin, f"duplicate member {name}")
            parts[ext] = (off, size, name)
        images = [e for e in parts if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS]
        # the sample's image: a plain "jpg"/"png"... before "depth.png" or "seg.png", which stay members
        image_ext = next((e for e in images if "." not in e), images[0] if images else None)
        media = Media.IMAGE
        if image_ext is None:  # a video sample (what video2dataset writes): its .mp4/.mkv/.webm... member
            image_ext = next((e for e in sorted(parts) if e in VIDEO_EXTENSIONS), None)
            media = Media.VIDEO
        if image_ext is None:  # an audio sample: its .flac/.wav/.mp3... member
            image_ext = next((e for e in sorted(parts) if e in AUDIO_EXTENSIONS), None)
            media = Media.AUDIO
        if image_ext is None and "npy" in parts and "json" in parts:  # an array gpubatch wrote: features or a clip
            kind = _array_kind(self._member(s, parts["json"][2], *parts["json"][:2]))
            if kind is not None:
                image_ext, media = "npy", kind
        if image_ext is None:
            raise self.record_error(key, origin, f"no image, video or audio member (has: {', '.join(sorted(parts))})")
        into = into if media is Media.IMAGE else None  # (an image's bytes straight where the caller says)
        raw = {ext: self._member(s, name, off, size, into if ext == image_ext else None)
               for ext, (off, size, name) in parts.items()}
        data = raw[image_ext]
        label, boxes, meta = None, None, {"filename": parts[image_ext][2].rsplit("/", 1)[-1]}
        try:
            if "cls" in raw:
                text = raw["cls"].strip()
                if not re.fullmatch(rb"-?[0-9]+", text or b"-1"):
                    raise ValueError(f"the .cls member holds {text[:40].decode('utf-8', 'replace')!r}, not a class "
                                     "index (webdataset's .cls is an integer)")
                label = fields.label(int(text or b"-1"), "the .cls member")
            if "json" in raw:
                doc = fields.json_value(raw["json"], "the .json member")
                if isinstance(doc, dict):
                    more = doc.get("meta") or {}
                    if not isinstance(more, dict):
                        raise ValueError("the .json member's meta is not an object")
                    meta.update(more)
                    if label is None and isinstance(doc.get("label"), int):
                        label = fields.label(doc["label"], "the .json member's label")
                    if "annotations" in doc:
                        boxes = _boxes_from_json(doc, data, self.keypoint_flip)
                    own = _JSON_KEYS if "annotations" in doc else _JSON_KEYS - {"width", "height"}
                    if any(k not in own for k in doc):  # another tool's fields (a URL, a caption...)
                        meta[JSON_FIELDS] = {k: v for k, v in doc.items() if k not in own}
                else:
                    meta[JSON_FIELDS] = doc
        except ValueError as e:
            raise self.record_error(key, origin, f"bad .cls/.json member: {e}") from None
        if label is None and len(entry) > 3:
            label = entry[3]
        kept = {}
        for ext in sorted(e for e in parts if e not in (image_ext, "cls", "json")):
            try:
                kept[ext] = raw[ext].decode("utf-8")
            except UnicodeDecodeError:
                kept[ext] = {"base64": base64.b64encode(raw[ext]).decode("ascii")}
        if kept:
            meta[MEMBERS] = kept
        if image_ext == "npy":  # a clip, features or a waveform gpubatch wrote (its .json says which)
            codec = "npy"
        elif media is Media.VIDEO:
            from ..engine.codecs.video_probe import sniff_container

            codec = sniff_container(data) or VIDEO_EXTENSIONS[image_ext]
        elif media is Media.AUDIO:
            from ..engine.codecs.audio_io import sniff_audio

            codec = sniff_audio(data) or AUDIO_EXTENSIONS[image_ext]
        else:
            codec = sniff_image_codec(data) or "unknown"
        return Record(key=key, data=data, media=media, codec=codec, label=label, boxes=boxes, meta=meta,
                      origin=origin)

    def close(self) -> None:
        self.files.close()


_JSON_KEYS = frozenset({"filename", "label", "class", "width", "height", "annotations", "meta"})


def member_bytes(value: Any) -> bytes:
    """A kept member's bytes (see ``MEMBERS``)."""
    if isinstance(value, dict):
        return base64.b64decode(value["base64"])
    return str(value).encode("utf-8")


def _boxes_from_json(doc: dict, data: bytes, keypoint_flip: dict) -> Boxes:
    """A sample's boxes from its ``.json`` (COCO-style annotations), every field checked (ValueError)."""
    h, w = fields.side(doc.get("height"), "height"), fields.side(doc.get("width"), "width")
    if not h or not w:
        from ..engine.codecs.headers import probe

        hdr = probe(data)
        h, w = hdr.height, hdr.width
    anns = doc["annotations"]
    if not isinstance(anns, list):
        raise ValueError("annotations is not a list")
    xyxy, labels, crowd, extra = [], [], [], []
    for i, a in enumerate(anns):
        if not isinstance(a, dict) or not isinstance(a.get("bbox"), list) or len(a["bbox"]) != 4:
            raise ValueError(f"annotation {i} has no bbox of four numbers")
        x, y, bw, bh = (fields.number(v, f"annotation {i}'s bbox") for v in a["bbox"])
        xyxy.append([x, y, x + bw, y + bh])
        labels.append(fields.ident(a.get("category_id", 0), f"annotation {i}'s category_id"))
        crowd.append(fields.whole(a.get("iscrowd", 0), f"annotation {i}'s iscrowd", 0, 1))
        extra.append({k: v for k, v in a.items() if k not in ("bbox", "category_id", "iscrowd")})
    return Boxes(xyxy, labels, (h, w), crowd, tuple(extra), keypoint_flip)


class WebDatasetSink(ShardSink):
    """One tar shard and its DALI ``v1.2`` index, written member by member (webdataset's layout: a
    sample's members adjacent, sorted by extension; keys unique within the shard)."""

    def __init__(self, root: Path, task: Any, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, task, info, options)
        self._tar = ShardFile(root, task.name)
        self.files.append(self._tar)
        self._offset = 0
        self._index: list[str] = []
        self._keys: set[str] = set()
        self._extensions: dict[str, int] = {}  # the samples' main members, by extension
        # the members' time: SOURCE_DATE_EPOCH where set (reproducible builds' convention), else 0, so that two
        # runs of one command write the same bytes (the time of writing would differ)
        self._mtime = int(os.environ.get("SOURCE_DATE_EPOCH", 0))

    def _add(self, name: str, payload: Any, parts: list | None = None) -> tuple[int, int]:
        """Append one member: its GNU header, the payload, zero padding to 512 bytes (into ``parts``, to be
        written together, where given)."""
        n = len(payload)
        header = gnu_header(name, n, self._mtime)
        pad = -n % tarfile.BLOCKSIZE
        if parts is not None:
            parts += (header, payload, _ZEROS[:pad])
        elif n < 65536:
            self._tar.write(header + bytes(payload) + _ZEROS[:pad])
        else:  # (a large payload is not copied into one buffer with its header)
            self._tar.write(header)
            self._tar.write(payload)
            self._tar.write(_ZEROS[:pad])
        start = self._offset + len(header)
        self._offset = start + n + pad
        return start, n

    def _unique(self, key: str) -> str:
        key = base = safe_key(key)
        n = 1
        while key in self._keys:
            key = f"{base}_{n}"
            n += 1
        self._keys.add(key)
        return key

    def _members(self, record: Record) -> tuple[str, list[tuple[str, Any]]]:
        """A record's sample: its key (unique in the shard) and its members (extension, bytes) in order."""
        # the codec's own extension (jpg, png, webp...), whatever the source file was called: readers pick
        # members by it (webdataset's .decode("pil").to_tuple("jpg", "cls"))
        ext = CODEC_EXTENSION.get(record.codec) or record.filename.rsplit(".", 1)[-1].lower()
        kept = record.meta.get(MEMBERS)
        members: dict[str, Any] = {e: member_bytes(v) for e, v in kept.items()
                                   if e not in (ext, "cls", "json")} if kept else {}
        members[ext] = record.data
        if record.label is not None:
            members["cls"] = str(int(record.label)).encode("ascii")
        doc = self._json(record)
        if doc is not None:
            members["json"] = fields.json_text(doc, sort_keys=True, default=str).encode("utf-8")
        key = self._unique(record.key)
        self._extensions[ext] = self._extensions.get(ext, 0) + 1
        return key, sorted(members.items())

    def _sample(self, record: Record, parts: list | None = None) -> None:
        key, members = self._members(record)
        line = []
        for e, payload in members:
            off, size = self._add(f"{key}.{e}", payload, parts)
            line.append(f"{e} {off} {size} {key}.{e}")
        self._index.append(" ".join(line) + "\n")
        self.count += 1
        self.bytes += len(record.data)

    def write(self, record: Record) -> None:
        self._sample(record)

    def write_many(self, records: list[Record]) -> list[BaseException | None]:
        # the members' headers, bytes and padding of every record gathered, then written together: a few
        # writes and CRC calls a batch instead of three a member (the same bytes as write, record by record)
        parts: list[Any] = []
        errors: list[BaseException | None] = []
        for record in records:
            try:
                self._sample(record, parts)
                errors.append(None)
            except (ValueError, RecursionError) as e:
                errors.append(e)
        self._tar.write_parts(parts)
        return errors

    def _json(self, record: Record) -> Any:
        """The sample's ``.json``: gpubatch's fields (boxes, class, metadata) over the source's own
        (``JSON_FIELDS``), whose ``width``/``height`` are brought to the image as written; None
        when there is nothing to write."""
        meta = {k: v for k, v in record.meta.items() if k not in ("filename", MEMBERS, JSON_FIELDS)}
        own = self._own_json(record, meta)
        fields = record.meta.get(JSON_FIELDS)
        if fields is None:
            return own or None
        if not isinstance(fields, dict):  # a .json that held no object: written back as it was
            return own or fields
        doc = dict(fields)
        if "width" in doc or "height" in doc:  # the image's size as it is now (an op may have changed it)
            doc["height"], doc["width"] = image_size(record)
        doc.update(own)
        return doc

    def _own_json(self, record: Record, meta: dict) -> dict:
        if record.boxes is None and not meta:
            return {}
        doc: dict = {"filename": record.filename}
        if record.label is not None:
            doc["label"] = int(record.label)
            if record.label < len(self.info.classes):
                doc["class"] = self.info.classes[record.label]
        if record.boxes is not None:
            b = record.boxes
            doc["height"], doc["width"] = b.canvas
            doc["annotations"] = [
                {"bbox": [float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                 "category_id": int(b.labels[i]), "iscrowd": int(b.iscrowd[i]), **dict(b.extra[i])}
                for i, (x0, y0, x1, y1) in enumerate(b.xyxy)
            ]
        if meta:
            doc["meta"] = meta
        return doc

    def _close(self) -> dict[str, Any]:
        # end of archive: two zero blocks, then zeros up to a whole record (tarfile's RECORDSIZE)
        end = self._offset + 2 * tarfile.BLOCKSIZE
        end += -end % tarfile.RECORDSIZE
        self._tar.write(b"\0" * (end - self._offset))
        idx = ShardFile(self.root, self.task.name.removesuffix(".tar") + ".idx")
        idx.write(f"v1.2 {len(self._index)}\n{''.join(self._index)}".encode())
        self.files.append(idx)
        return {"extensions": self._extensions, "samples": len(self._index)}


def read_hint(extensions: dict[str, int]) -> str | None:
    """Where a set's samples hold images of several extensions (``jpg`` and ``png``), how to read them
    all with webdataset (``to_tuple("jpg", "cls")`` stops at the first sample without a ``.jpg``) and how
    to write one extension; None where they share one."""
    images = sorted((e for e in extensions if e in IMAGE_EXTENSIONS), key=lambda e: -extensions[e])
    if len(images) < 2:
        return None
    held = " and ".join(f".{e} ({extensions[e]:,})" for e in images)
    return (f"the samples' images are {held}: read them all with webdataset's to_tuple('{';'.join(images)}', 'cls') "
            "(to_tuple('jpg', 'cls') stops at the first sample without a .jpg), or write one codec with "
            "--image-format jpeg")


def _array_kind(raw: bytes) -> Media | None:
    """What a sample's ``.npy`` holds, from the ``.json`` gpubatch wrote beside it: audio features
    (``meta.features``), a video clip (``meta.frames``) or a waveform (``meta.sample_rate``); None for
    arrays of another tool."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply: the sample's read says so
        return None
    meta = doc.get("meta") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        return None
    if meta.get("features"):
        return Media.AUDIO
    if meta.get("frames") is not None or meta.get("clip") is not None:
        return Media.VIDEO
    if isinstance(meta.get("sample_rate"), int):  # a waveform (--audio-format npy)
        return Media.AUDIO
    return None


@register_format
class WebDatasetFormat(Format):
    name = "webdataset"
    media = (Media.IMAGE, Media.VIDEO, Media.AUDIO)
    description = ("WebDataset tar shards (key.jpg, key.cls, key.json) with DALI v1.2 .idx files; ImageNet's "
                   "training tar of class tars")
    carries_boxes = True
    carries_label_arrays = True  # in the record's metadata
    detect_priority = 25
    carries_members = True
    carries_text = True
    sharded = True

    @classmethod
    def detect(cls, path: Path) -> bool:
        path = Path(path)
        tars = [path] if path.is_file() and path.suffix == ".tar" else sorted(path.glob("*.tar")) if path.is_dir() else []
        if not tars:
            return bool(compressed_shards(path))  # recognized, so that the reader can say what to do
        heads = [read_head(t, _BLOCK) for t in tars[:4]]  # (a first shard cut short too)
        return any(_is_tar(h) or compression(h[:6]) for h in heads)

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return WebDatasetReader(path)

    @classmethod
    def shard_names(cls, count: int, options: WriteOptions) -> list[str]:
        return [f"{options.name}-{i:06d}.tar" for i in range(count)]

    @classmethod
    def sink(cls, root: Path, task: Any, info: DatasetInfo, options: WriteOptions) -> ShardSink:
        return WebDatasetSink(root, task, info, options)

    @classmethod
    def finalize(cls, root: Path, shards: list[Any], info: DatasetInfo, options: WriteOptions) -> list[str]:
        seen: dict[str, int] = {}
        for shard in shards:
            for ext, n in shard.extra.get("extensions", {}).items():
                seen[ext] = seen.get(ext, 0) + n
        hint = read_hint(seen)
        write_wids_index(root, shards, options.name)
        return [hint] if hint else []


#: the shard list beside a webdataset gpubatch wrote, in the layout of webdataset's ``wids`` (its
#: ``ShardListDataset`` reads it: every shard's sample count and size, for indexed random access)
WIDS_INDEX = "wids.json"


def write_wids_index(root: Path, shards: list[Any], name: str) -> None:
    """:data:`WIDS_INDEX` from the shards' results: url (relative to the index), samples and bytes a shard."""
    rows = []
    for shard in sorted(shards, key=lambda r: r.index):
        size = (shard.files.get(shard.name) or [None])[0]
        if size is None:
            size = (Path(root) / shard.name).stat().st_size
        rows.append({"url": shard.name, "nsamples": int(shard.extra.get("samples", shard.counts.get("records_out", 0))),
                     "filesize": int(size)})
    doc = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": name, "shardlist": rows}
    write_text(Path(root) / WIDS_INDEX, json.dumps(doc, indent=1) + "\n")
