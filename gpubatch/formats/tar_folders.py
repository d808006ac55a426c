"""Tars that hold a media folder rather than shards, read as their extraction would be: ImageNet's training tar
(one tar a class) and a tar of class folders (Food-101's, Speech Commands'), with ``--from folder``, ``audio`` or
``video``. Their samples are the shards' samples (:mod:`.tar_scan`), relabeled: each entry gains its class, and
:class:`~.webdataset.WebDatasetReader` numbers the classes by their sorted names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._paths import safe_relpath
from .base import Damaged
from .files import (
    FOLDER_FORMAT,
    MEDIA_EXTENSIONS,
    class_folders_under,
    listing_among,
    named_with,
    refuse_listed,
    said_left_out,
)
from .tar_scan import HIDDEN_NAME, _samples, scan_tar, split_file


class _Window:
    """``size`` bytes of the open file ``f`` from ``base``, read as a file of their own (a tar inside a tar):
    :func:`scan_tar` reads no byte past ``size``."""

    def __init__(self, f: Any, base: int):
        self.f, self.base = f, base

    def seek(self, pos: int) -> None:
        self.f.seek(self.base + pos)

    def read(self, n: int) -> bytes:
        return self.f.read(n)


def holds_tars(members: list[tuple[str, int, int, int]]) -> bool:
    """Whether a tar's members are all tars: ImageNet's training tar (``ILSVRC2012_img_train.tar``), a tar of
    one tar a class."""
    return bool(members) and all(m[0].lower().endswith(".tar") for m in members)


def class_tar_samples(s: int, tar: Path, f: Any, members: list[tuple[str, int, int, int]]) -> list[Any]:
    """The samples of a tar of class tars (:func:`holds_tars`; ``f``: the open outer tar), as the folders its
    extraction makes read: each inner tar a class named by its stem (``n01440764.tar``), its members grouped
    into samples as in any shard, keyed ``<class>/<key>`` (``n01440764/n01440764_10026``, as in
    ``n01440764/n01440764_10026.JPEG`` once extracted). Entries ``(s, key, members, class name)``, the members'
    offsets into the outer file (read where they lie, never extracted), and each damaged stretch or inner tar cut
    short a :class:`Damaged` entry."""
    out: list[Any] = []
    for name, off, size, _ in members:
        cls = name.rsplit("/", 1)[-1][:-4]
        inner, damage, ended = scan_tar(_Window(f, off), size)
        inner = [(n, off + o, sz, off + h) for n, o, sz, h in inner]
        damage = [(off + a, off + b, what) for a, b, what in damage]
        for e in _samples(s, tar, inner, damage, split_file):  # (a file a record, as once extracted)
            if not isinstance(e, Damaged):
                out.append((e[0], f"{cls}/{e[1]}", e[2], cls))
            elif e.key.startswith(tar.name):  # (a stretch: its bytes, the outer file's, named in its reason)
                out.append(Damaged(e.key, e.origin, e.reason.replace("damaged shard:", f"damaged inner tar {name}:")))
            else:
                out.append(Damaged(f"{cls}/{e.key}", f"{tar}#{name}#{e.key}", e.reason))
        if inner and not ended and not damage:  # (cut on a member's end: nothing else says so)
            out.append(Damaged(f"{tar.name}#{name}", f"{tar}#{name}", "the inner tar has no end-of-archive block: it "
                               "was cut short when it was made, and the members after its last whole one are lost"))
    return out


def classes_of_folders(reader: Any, entries: list) -> list:
    """The entries of ``reader`` (a :class:`~.webdataset.WebDatasetReader`) over a tar of a media folder's tree
    (``tar cf food-101.tar food-101/``: ``food-101/images/<class>/<id>.jpg`` members, no ``.cls``; Speech Commands'
    ``<word>/<clip>.wav``). Read as shards (``reader.folder_classes`` None), its samples stay unlabeled and a warning
    says how to read the class folders as classes. With ``reader.folder_classes`` they are read so: the folders under
    the files' common folder are the classes, keys relative to it (``apple_pie/1005649``, as once extracted), each
    entry gaining its class's name; what is no such file, a hidden member, or lies outside the class folders (for
    audio, also in a folder named ``_...``: Speech Commands' ``_background_noise_``) is named as left out, as a
    folder's would be; a member named outside the tar stays, its read's error."""
    samples = [e for e in entries if not isinstance(e, Damaged)]
    if any({"cls", "json"} & {m[0] for m in e[2]} for e in samples):
        return entries
    where = reader.tars[0] if len(reader.tars) == 1 else reader.path
    if reader.folder_classes:  # (a list or transcripts inside: the extracted folder is read by them, not so)
        listing = listing_among([m[3] for e in samples for m in e[2]], reader.folder_classes)
        if listing:
            refuse_listed(where, listing)
    unsafe = set()  # (keys absolute or climbing out: their read's error, in no class)
    for e in samples:
        try:
            safe_relpath(e[1])
        except ValueError:
            unsafe.add(e[1])
    for media in ([reader.folder_classes] if reader.folder_classes else MEDIA_EXTENSIONS):
        exts = MEDIA_EXTENSIONS[media]
        # samples of such files alone (read as shards, a folder's cat.0.jpg, cat.1.jpg are one sample by webdataset's
        # rule: the folders are told from the members' own names); a sample with a caption or a mask is no folder's file
        files = [e for e in samples if e[1] not in unsafe and all(named_with(m[3], exts) for m in e[2])]
        dirs = [m[3].split("/")[:-1] for e in files for m in e[2]]
        n, classes = class_folders_under(dirs)
        if media == "audio":
            classes = [c for c in classes if not c.startswith("_")]
        if len(classes) >= 2:
            break
    else:
        return entries
    root = dirs[0][:n]
    under = "/".join(root) + "/" if [p for p in root if p != "."] else "the tar's root"
    some = ", ".join(c + "/" for c in classes[:3]) + (", ..." if len(classes) > 3 else "")
    if not reader.folder_classes:
        what = {"image": "images", "audio": "recordings", "video": "videos"}[media]
        grouped = sum(len(e[2]) for e in files if len(e[2]) > 1)  # (cat.0.jpg, cat.1.jpg: one sample "cat/cat")
        many = (f"; as shards, {grouped:,} of its files make {sum(len(e[2]) > 1 for e in files):,} samples (a "
                "webdataset key ends at a name's first dot)") if grouped else ""
        reader.warnings.append(f"the samples of {where} carry no label and their {what} lie in {len(classes):,} "
                               f"folders under {under} ({some}): to read those folders as classes, as once extracted, "
                               f"pass --from {FOLDER_FORMAT[media]}{many}")
        return entries
    taken = set(classes)
    out, left = [], {"outside": [], "other": [], "hidden": []}
    for e in entries:
        if isinstance(e, Damaged):
            if HIDDEN_NAME in e.reason:  # (a hidden file, as a folder's walk leaves it out: named, not a record)
                left["hidden"].append(e.key.split("#", 1)[-1])
            else:
                out.append(e)
            continue
        parts = e[1].split("/")
        if e[1] in unsafe:
            out.append(e)  # (its read says why)
        elif not (len(e[2]) == 1 and e[2][0][0] in exts):
            left["other"] += [m[3] for m in e[2]]
        elif len(parts) - 1 <= n or parts[:n] != root or parts[n] not in taken:
            left["outside"].append(e[2][0][3])
        else:
            out.append((e[0], "/".join(parts[n:]), e[2], parts[n]))
    reader.left_out = said_left_out(reader, where, left, media)
    return out
