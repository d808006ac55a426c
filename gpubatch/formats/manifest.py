"""``gpubatch.json``: the small manifest written beside every dataset gpubatch makes.

Other tools ignore it; gpubatch reads it back for the class names and detection categories that some
formats (LMDB Datum, RecordIO) cannot hold themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST_NAME = "gpubatch.json"
MAX_LISTED_ERRORS = 1000


def manifest_path(path: Path) -> Path | None:
    path = Path(path)
    if path.is_dir():
        return path / MANIFEST_NAME
    if path.is_file() and path.parent.joinpath(MANIFEST_NAME).is_file():
        return path.parent / MANIFEST_NAME
    return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the dataset at ``path``, or None when there is none (or it is unreadable)."""
    mp = manifest_path(path)
    if mp is None or not mp.is_file():
        return None
    try:
        data = json.loads(mp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("gpubatch") else None


def write_manifest(root: Path, content: dict[str, Any]) -> Path:
    """Write ``content`` as ``root/gpubatch.json`` (errors beyond MAX_LISTED_ERRORS are counted, not listed)."""
    from .. import __version__

    content = {"gpubatch": __version__, **content}
    errors = content.get("errors") or []
    if len(errors) > MAX_LISTED_ERRORS:
        content["errors"] = errors[:MAX_LISTED_ERRORS]
        content["errors_not_listed"] = len(errors) - MAX_LISTED_ERRORS
    out = Path(root) / MANIFEST_NAME
    out.write_text(json.dumps(content, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return out
