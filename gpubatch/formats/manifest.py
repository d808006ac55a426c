"""``gpubatch.json``: the small manifest written beside every dataset gpubatch makes.

Other tools ignore it; gpubatch reads it back for the class names and detection categories that some
formats (LMDB Datum, RecordIO) cannot hold themselves. It is read as untrusted input: a field of the
wrong kind is left out (the reader then works from the data alone), never a crash.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._commit import write_text
from .._paths import read_regular
from ..types import ClassNames, class_table

MANIFEST_NAME = "gpubatch.json"
MAX_LISTED_ERRORS = 1000
MAX_MANIFEST_BYTES = 256 << 20


def manifest_path(path: Path) -> Path | None:
    path = Path(path)
    if path.is_dir():
        return path / MANIFEST_NAME
    if path.is_file() and path.parent.joinpath(MANIFEST_NAME).is_file():
        return path.parent / MANIFEST_NAME
    return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the dataset at ``path``, or None when there is none (or it is unreadable).

    Its ``format`` is a string or absent, ``classes`` a tuple of names or a
    :class:`~gpubatch.types.ClassNames` or absent, ``categories`` a list of objects with whole-number
    ids or absent: whatever else a hostile or broken file holds there is dropped."""
    from .fields import json_object

    mp = manifest_path(path)
    if mp is None or not mp.is_file():
        return None
    try:
        if os.path.getsize(mp) > MAX_MANIFEST_BYTES:
            return None
        data = json_object(read_regular(mp, MAX_MANIFEST_BYTES), MANIFEST_NAME)
    except (OSError, ValueError):
        return None
    if not data.get("gpubatch"):
        return None
    if not isinstance(data.get("format"), str):
        data.pop("format", None)
    classes = manifest_classes_read(data.get("classes"))
    if classes is None:
        data.pop("classes", None)
    else:
        data["classes"] = classes
    shards = data.get("shards")
    if not (isinstance(shards, dict) and all(isinstance(k, str) and _whole(v) and v >= 0 for k, v in shards.items())):
        data.pop("shards", None)
    cats = data.get("categories")
    if cats is not None:
        cats = [c for c in cats if isinstance(c, dict) and _whole(c.get("id"))] if isinstance(cats, list) else []
        data["categories"] = cats
    return data


def audio_facts(path: Path) -> dict[str, Any]:
    """The sample rate and features every audio array of the dataset at ``path`` shares, as its manifest's
    ``audio`` says (for formats whose records hold no such fields); {} where it says nothing usable."""
    audio = (read_manifest(path) or {}).get("audio")
    ok = isinstance(audio, dict) and isinstance(audio.get("sample_rate"), (int, type(None))) \
        and isinstance(audio.get("features", ""), str)
    return audio if ok else {}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63


def manifest_classes(classes: Any) -> Any:
    """Class names as the manifest holds them: a list, or ``{"count": N, "names": {label: name}}``
    where labels run far beyond the names (a :class:`~gpubatch.types.ClassNames`)."""
    if isinstance(classes, ClassNames):
        return {"count": classes.count, "names": {str(k): v for k, v in sorted(classes.named.items())}}
    return list(classes)


def manifest_classes_read(value: Any) -> tuple[str, ...] | ClassNames | None:
    """The manifest's ``classes`` (either form of :func:`manifest_classes`), or None where it is neither."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, dict) and _whole(value.get("count")) and 0 <= value["count"] <= 2**31 \
            and isinstance(value.get("names"), dict):
        try:
            named = {int(k): v for k, v in value["names"].items() if isinstance(v, str)}
        except ValueError:
            return None
        if any(not 0 <= k < value["count"] for k in named):
            return None
        table = class_table(named, [value["count"] - 1] if value["count"] else [])
        return table
    return None


def expected_records(manifest: dict[str, Any], shard: Path) -> int | None:
    """How many records the manifest says ``shard`` holds (its ``shards`` table), or None where it does not say."""
    table = manifest.get("shards")
    return table.get(Path(shard).name) if isinstance(table, dict) else None


def _shard_name(name: str) -> str:
    """A shard's name as its manifest lists it, whether it was compressed since (``x.tar.gz``, ``x.tgz``: ``x.tar``)."""
    from .files import TAR_SUFFIXES

    low = name.lower()
    return next((name[: -len(s)] + ".tar" for s in TAR_SUFFIXES[1:] if low.endswith(s)), name)


def lost_shards(manifest: dict[str, Any], root: Path, present: Any, said: Any = ()) -> list[tuple[str, str]]:
    """The shards a dataset's manifest lists (its ``shards`` table, name -> records) that its folder ``root`` does not
    hold, as (path, why): a folder copied or downloaded in part loses them with a word. ``present``: the shard files
    found (compressed since, they count as themselves); ``said``: the paths already named as missing (a numbered set's
    gaps). Where none of the names the table lists is there, it describes other files (a set renamed, the manifest
    kept for its class names): none is said lost."""
    table = manifest.get("shards")
    if not isinstance(table, dict):
        return []
    have = {_shard_name(Path(p).name) for p in present}
    if not have & set(table):
        return []
    have |= {Path(p).name for p in said}
    return [(str(Path(root) / name), f"the dataset's {MANIFEST_NAME} lists this shard with {n:,} record"
             f"{'s' if n != 1 else ''}, but the folder does not hold it: its records are lost (a copy or download "
             "cut short?)") for name, n in sorted(table.items()) if n and name not in have and Path(name).name == name]


def write_manifest(root: Path, content: dict[str, Any]) -> Path:
    """Write ``content`` as ``root/gpubatch.json`` (errors beyond MAX_LISTED_ERRORS are counted, not listed)."""
    from .. import __version__

    content = {"gpubatch": __version__, **content}
    errors = content.get("errors") or []
    if len(errors) > MAX_LISTED_ERRORS:
        content["errors"] = errors[:MAX_LISTED_ERRORS]
        content["errors_not_listed"] = len(errors) - MAX_LISTED_ERRORS
    out = Path(root) / MANIFEST_NAME
    write_text(out, json.dumps(content, indent=2, sort_keys=False) + "\n")  # (--sync end: synced after it)
    return out
