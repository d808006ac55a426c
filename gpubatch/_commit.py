"""Files written whole or not at all: under a temporary name, digested as written, fsynced and renamed
into place (a shard's files, its journal entry, a parameter log)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

PARTIAL = ".partial"


def fsync_dir(path: Path) -> None:
    """Make the names in ``path`` durable (after renames into it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - a system without directory descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - a file system that cannot sync a folder
        pass
    finally:
        os.close(fd)


class ShardFile:
    """One file written under ``name.partial`` and digested as it is written (BLAKE2b of its bytes);
    :meth:`commit` makes it ``name``."""

    def __init__(self, folder: Path, name: str):
        self.path = Path(folder) / name
        self.tmp = self.path.with_name(self.path.name + PARTIAL)
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit or abort
        self.digest = hashlib.blake2b(digest_size=16)
        self.size = 0

    def write(self, data: Any) -> None:
        self.f.write(data)
        self.digest.update(data)
        self.size += memoryview(data).nbytes

    def commit(self) -> tuple[str, list]:
        """Flush, fsync and rename into place: (the file's name, [bytes, digest])."""
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        return self.path.name, [self.size, self.digest.hexdigest()]

    def abort(self) -> None:
        if not self.f.closed:
            self.f.close()
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass


def file_digest(path: Path) -> list:
    """[bytes, BLAKE2b digest] of a file (one a library wrote by its path)."""
    h = hashlib.blake2b(digest_size=16)
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return [size, h.hexdigest()]


def write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` as JSON at ``path``: to a temporary name, fsynced, then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + PARTIAL)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
