"""A folder's media files: the walk that lists them, what it leaves out and says so, and the text listings and
files a dataset names (the image folder's, and the video and audio folders' too).

Nothing is left out without a word: a folder that cannot be listed, a name that is no regular file, become damaged
entries; files of another kind, hidden folders and hidden files of the records' kind are named in a warning (and
``info``'s ``left_out``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._paths import file_kind, read_listing, read_regular, safe_join
from ..types import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, OTHER_MEDIA_EXTENSIONS, VIDEO_EXTENSIONS
from .base import Damaged, Reader
from .sinks import RUN_DIR

_IMAGE_EXT = frozenset(IMAGE_EXTENSIONS)


def _is_image_name(name: str) -> bool:
    return "." in name and name.rsplit(".", 1)[1].lower() in IMAGE_EXTENSIONS


def _list_folder(path: str) -> list[os.DirEntry]:
    """The entries of one folder (a seam the tests use to make a folder unreadable when run as root)."""
    with os.scandir(path) as it:
        return list(it)


def _walk_images(root: Path, damaged: list[Damaged] | None = None, prefix: str = "",
                 others: list[str] | None = None, accept: Callable[[str], bool] = _is_image_name,
                 hidden: list[str] | None = None) -> list[str]:
    """Relative POSIX paths of the regular image files (``accept``: files of another kind, by name) under
    ``root``, sorted, hidden files and folders skipped: those that could hold records (a hidden folder, a hidden
    file of ``accept``'s kind, as macOS's ``._name.jpg``) go to ``hidden``, to be named as left out.

    Linked folders are followed, but not a link to a folder the walk is inside (``ln -s .. up``): the
    walk stops there instead of going round the loop. What cannot be read as a record is added to
    ``damaged`` (its keys and origins prefixed by ``prefix``), never left out without a word: a folder
    that cannot be listed, an image name that is a FIFO, a device, a socket or a broken link. Files
    that are no images (a clip, a recording, notes) go to ``others``, to be named as left out.
    """
    out: list[str] = []
    damaged = [] if damaged is None else damaged
    top = Path(root).resolve()
    stack = [(str(root), "", frozenset(str(p) for p in (top, *top.parents)))]  # real folders it is inside
    images = accept is _is_image_name  # (its test inlined below: a call a file took a quarter of the walk)
    while stack:
        folder, rel, above = stack.pop()
        try:
            items = _list_folder(folder)
        except OSError as e:
            where = f"{prefix}{rel}" if rel else prefix.rstrip("/") or "."
            damaged.append(Damaged(where, folder, f"cannot list the folder: {e.strerror or e}"))
            continue
        for entry in items:
            name = entry.name
            if name[0] == ".":
                if hidden is not None and name != RUN_DIR:
                    _note_hidden(entry, prefix + (f"{rel}/{name}" if rel else name), accept, hidden)
                continue
            path = f"{rel}/{name}" if rel else name
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                real = os.path.realpath(entry.path)
                if real not in above:
                    stack.append((entry.path, path, above | {real}))
                continue
            if images:
                _, dot, ext = name.rpartition(".")
                taken = bool(dot) and ext.lower() in _IMAGE_EXT
            else:
                taken = accept(name)
            if not taken:
                if others is not None and rel + name not in _OWN_FILES:
                    others.append(prefix + path)
                continue
            try:
                regular = entry.is_file()
            except OSError:
                regular = False
            if regular:
                out.append(path)
                continue
            try:
                kind = file_kind(os.stat(entry.path).st_mode)
            except OSError:
                kind = "a broken link" if entry.is_symlink() else "unreadable"
            damaged.append(Damaged(_strip_ext(prefix + path), entry.path, f"{kind}, not a regular file"))
    return sorted(out)


def _note_hidden(entry: os.DirEntry, path: str, accept: Callable[[str], bool], hidden: list[str]) -> None:
    """A hidden entry noted in ``hidden`` where it could hold records: a folder (``path/``), or a file of
    ``accept``'s kind by its name (a ``.DS_Store`` is not noted)."""
    try:
        is_dir = entry.is_dir()
    except OSError:
        is_dir = False
    if is_dir:
        hidden.append(path + "/")
    elif accept(entry.name):
        hidden.append(path)


def left_out_warning(root: Path, left: dict[str, list[str]], media: str = "image") -> str | None:
    """The warning for files of a folder of ``media`` records that are no records, by kind (``video``,
    ``audio``, ``other``, ``outside``: images beside the class folders, ``hidden``: hidden folders and hidden
    files of the records' kind), or None."""
    words = {"video": ("video file", "video files"), "audio": ("audio file", "audio files"),
             "other": (f"file that is no {media}", f"files that are no {media}{'s' if media != 'audio' else ''}"),
             "outside": {"image": ("image outside the class folders", "images outside the class folders"),
                         "audio": ("audio file outside the class folders or in a folder named _...",
                                   "audio files outside the class folders or in folders named _..."),
                         "video": ("video file outside the class folders", "video files outside the class folders"),
                         }.get(media, (f"{media} outside the class folders", f"{media}s outside the class folders")),
             "hidden": ("hidden file or folder", "hidden files and folders")}
    parts = [f"{len(v):,} {words[k][len(v) > 1]} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
             for k, v in left.items() if v]
    if not parts:
        return None
    return f"left out of {root}, as no records: " + "; ".join(parts)


def unlisted_files(reader: Reader, root: Path, entries: list[Any], listing: str, noun: tuple[str, str], hint: str,
                   accept: Callable[[str], bool] = _is_image_name, stems: Any = ()) -> dict[str, Any]:
    """The files of ``accept``'s kind under ``root`` that no entry of the list ``listing`` names (an entry:
    a tuple whose first item is a path, relative to ``root`` or absolute; ``stems``: paths named without
    their extension), said in one of ``reader``'s warnings (``noun``: singular and plural, ``hint``: what
    to do) and returned as its ``left_out``: a list found in a folder is read as the dataset, and what it
    leaves out is never left out without a word."""
    listed = set()
    for e in entries:
        if isinstance(e, tuple):
            path = os.path.relpath(e[0], root) if os.path.isabs(e[0]) else e[0]
            listed.add(os.path.normpath(path).replace(os.sep, "/"))
    left = [f for f in _walk_images(root, [], accept=accept) if f not in listed and _strip_ext(f) not in stems]
    if not left:
        return {}
    n = len(left)
    reader.warnings.append(f"{n:,} {noun[n > 1]} under {root} {'are' if n > 1 else 'is'} not in {listing} and left "
                           f"out ({', '.join(left[:3])}{', ...' if n > 3 else ''}): {hint}")
    return {"unlisted": {"count": n, "names": left[:3]}}


def said_left_out(reader: Reader, root: Path, left: dict[str, list[str]], media: str = "image") -> dict[str, Any]:
    """The files of ``root`` that are no ``media`` records, by kind (``left``: :func:`_kinds` of a walk's
    others), said in one of ``reader``'s warnings and returned as its ``left_out``: never left out without
    a word."""
    warning = left_out_warning(root, left, media)
    if warning:
        reader.warnings.append(warning)
    return {k: {"count": len(v), "names": v[:3]} for k, v in left.items() if v}


def _kinds(names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in sorted(names):
        kind = OTHER_MEDIA_EXTENSIONS.get(n.rsplit(".", 1)[-1].lower(), "other") if "." in n else "other"
        out.setdefault(kind, []).append(n)
    return out


# what gpubatch writes beside a folder dataset's images: never named as left out
_OWN_FILES = frozenset({"file_list.txt", "gpubatch.json", "augment-params.jsonl"})


def named_with(name: str, exts: Any) -> bool:
    """Whether the file ``name`` (a path; its base name has a dot) ends in one of ``exts`` (lower-case, no dot)."""
    base = name.rsplit("/", 1)[-1]
    return "." in base and base.rsplit(".", 1)[1].lower() in exts


def _strip_ext(rel: str) -> str:
    """A file's key: its path without the extension."""
    return rel.rsplit(".", 1)[0] if "." in rel.rsplit("/", 1)[-1] else rel


def csv_rows(text: str, path: Path) -> Any:
    """A ``csv.DictReader`` over a table's ``text``: a ``.tsv`` file (Common Voice's ``train.tsv``) split at tabs
    with no quoting, as Common Voice's own loader reads it (a sentence that opens with a quote mark, read with quoting,
    had swallowed the rows after it), any other as a CSV."""
    import csv
    import io

    if Path(path).suffix.lower() == ".tsv":
        return csv.DictReader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    return csv.DictReader(io.StringIO(text))


def read_csv_table(path: Path) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The rows of a CSV (or TSV: :func:`csv_rows`) of metadata (ESC-50's, UrbanSound8K's, Common Voice's, a video
    manifest), and its columns by lower-cased name; FormatError where it cannot be read."""
    import csv

    from ..errors import FormatError

    text = read_listing(path, "a CSV").decode("utf-8-sig", "replace")
    table = csv_rows(text, path)
    try:
        rows = list(table)
    except csv.Error as e:
        raise FormatError(f"{path} is not a readable CSV (line {table.line_num}: {e})") from None
    return rows, {c.strip().lower(): c for c in (rows[0].keys() if rows else []) if c}


def read_listed_file(reader: Reader, root: Path, path: str) -> tuple[str, Path, bytes]:
    """(key, full path, bytes) of a file a dataset lists, relative to ``root`` or absolute (keyed by its
    name then); the reader's record error where it cannot be read (a video or audio folder's files)."""
    absolute = os.path.isabs(path)
    full = Path(path) if absolute else safe_join(root, path)
    key = _strip_ext(Path(path).name if absolute else path)
    try:
        return key, full, read_regular(full)
    except (OSError, ValueError) as e:
        raise reader.record_error(key, str(full), getattr(e, "strerror", None) or e) from None


def class_folders_under(dirs: list[list[str]]) -> tuple[int, list[str]]:
    """The classes of an image folder packed in one file (a ZIP, a tar), from its images' folders (each a list of
    path parts): (how many leading parts every image shares, its common folder's depth; the sorted folders under
    it, the classes where there are two or more, as ImageFolder would take them once extracted there)."""
    root = dirs[0] if dirs else []
    for d in dirs[1:]:
        k = next((k for k, (a, b) in enumerate(zip(root, d)) if a != b), min(len(root), len(d)))
        root = root[:k]
    n = len(root)
    return n, sorted({d[n] for d in dirs if len(d) > n})


def listing_among(names: list[str], media: str) -> str | None:
    """Of an archive's member ``names``, the first a media folder's reader would take its records or labels from once
    extracted (an image folder's ``file_list.txt``, a COCO, Pascal VOC or YOLO set's boxes; an audio folder's CSV,
    NeMo manifest or LibriSpeech transcripts; a video folder's list or CSV), or None: such an archive is not read as
    its class folders, which would label it otherwise or lose its boxes."""
    for name in names:
        base = name.rsplit("/", 1)[-1].lower()
        if base == "file_list.txt" and media in ("image", "video"):
            return name
        parts = name.split("/")[:-1]
        if media == "image" and (("annotations" in parts and base.endswith(".json"))  # a COCO, VOC or YOLO set's boxes
                                 or ("Annotations" in parts and base.endswith(".xml"))
                                 or ("labels" in parts and base.endswith(".txt")) or base == "data.yaml"):
            return name
        if media == "audio" and (base.endswith((".trans.txt", ".csv", ".tsv", ".jsonl")) or base == "manifest.json"):
            return name
        if media == "video" and base.endswith(".csv"):
            return name
    return None


def refuse_listed(archive: Any, listing: str) -> None:
    """The one-line error for an archive holding ``listing`` (:func:`listing_among`): its extracted folder is read
    by it (and its format detected there)."""
    from ..errors import FormatError

    raise FormatError(f"{archive} holds {listing}, which gives its records or labels once extracted: unpack it and "
                      "pass the folder")


#: the extensions of each media's files, and the ``--from`` that reads a folder of them
MEDIA_EXTENSIONS = {"image": IMAGE_EXTENSIONS, "audio": AUDIO_EXTENSIONS, "video": VIDEO_EXTENSIONS}
FOLDER_FORMAT = {"image": "folder", "audio": "audio", "video": "video"}
#: the names of tar files, plain or compressed (webdataset's shards; a tar that ``--from folder`` reads as a folder)
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")


def is_tar_name(name: str) -> bool:
    return name.lower().endswith(TAR_SUFFIXES)
