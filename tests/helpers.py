"""Test helpers: dataset snapshots, CLI runner, image makers."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from gpubatch.api import open_dataset

ROOT = Path(__file__).resolve().parent.parent


def tree_digest(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (to prove a source was not modified)."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def content(path: Path, fmt: str | None = None) -> Counter:
    """Multiset of (class name, sha256 of bytes) over a dataset's records."""
    with open_dataset(path, fmt) as r:
        classes = r.info().classes
        out = Counter()
        for rec in r:
            name = None if rec.label is None else classes[rec.label]
            out[(name, hashlib.sha256(rec.data).hexdigest())] += 1
    return out


def child_env(*first: str | Path, **more: str) -> dict[str, str]:
    """``os.environ`` for a child Python process that imports this checkout: ``PYTHONPATH`` is ``first`` (hooks a
    test puts ahead), the checkout, then this process's own ``PYTHONPATH`` (packages found that way, as on the GPU
    machine, where they are not installed); ``more`` added."""
    path = [*map(str, first), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **more}


def cli_script(before: str, report: str) -> str:
    """The source of a fresh interpreter that runs ``gpubatch ARGS`` (``ARGS`` replaced by the caller) as a user
    runs it: ``before`` first (patches), then the command, which must succeed, then ``report`` printed as one JSON
    line on stdout, whatever happened."""
    return f"""
import json, sys
{before}
sys.argv = ["gpubatch", *ARGS]
import gpubatch.cli as cli
try:
    cli.main()
except SystemExit as e:
    assert not e.code, e.code
finally:
    print(json.dumps({report}))
"""


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m gpubatch ARGS`` in a subprocess, capturing output."""
    return subprocess.run([sys.executable, "-m", "gpubatch", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def jpeg_bytes(arr: np.ndarray, quality: int = 90, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth, real-looking RGB test image (gradients + blobs + grain)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = rng.uniform(50, 200, 3) + xx[..., None] * rng.uniform(-0.3, 0.3, 3) * 255 / max(w, 1)
    img = img + yy[..., None] * rng.uniform(-0.3, 0.3, 3) * 255 / max(h, 1)
    for _ in range(4):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.1, 0.4) * max(min(h, w), 1)
        img = img + np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))[..., None] * rng.uniform(-80, 80, 3)
    img = img + rng.normal(0, 4, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def semaphores_now() -> set[str]:
    """The named semaphores in /dev/shm now (for :func:`kill_group`)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("sem.mp-*")} if shm.is_dir() else set()


def group_semaphores(pgid: int) -> set[str]:
    """The named semaphores (``sem.mp-*`` in /dev/shm) that the processes of process group ``pgid`` hold open:
    each open one is mapped in its holder's memory (``/proc/PID/maps``), by the inode of the file glibc made it
    in under a name of its own, since renamed."""
    inodes: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[2]) != pgid:
                continue
            maps = (proc / "maps").read_text()
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or not ours to read
        inodes.update(int(line.split()[4]) for line in maps.splitlines() if "/dev/shm/sem." in line)
    held = set()
    for name in semaphores_now():
        try:
            if os.stat(Path("/dev/shm", name)).st_ino in inodes:
                held.add(name)
        except OSError:
            continue
    return held


def kill_group(proc: subprocess.Popen, before: set[str]) -> None:
    """Kill ``proc``'s process group with SIGKILL (as a lost machine loses a run and its workers), wait for it,
    and remove the named semaphores it left in /dev/shm: multiprocessing's resource tracker, which unlinks
    them when a run ends, dies with the group. ``before``: :func:`semaphores_now` before ``proc`` started.
    Only those the group holds open are removed (the group is stopped first, so that it makes none
    meanwhile): a test suite run in several processes at once (``pytest -n``) keeps its other pools'."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        held = group_semaphores(proc.pid)
    finally:  # (never a group left stopped)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for name in (semaphores_now() - before) & held:
        Path("/dev/shm", name).unlink(missing_ok=True)


def all_ended(procs: list, within: float = 10.0) -> bool:
    """Whether every one of ``procs`` has ended, those a finished run ended without waiting for their death
    (``processes.leave_dying``) given up to ``within`` seconds to die: a process left running never does."""
    import time

    deadline = time.monotonic() + within
    while any(p.is_alive() for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def started_seen(monkeypatch) -> list:
    """Every :class:`~gpubatch.engine.execute.local.Started` made from now on (the local executor's worker
    processes, those started ahead of a run included), in the order made."""
    import gpubatch.engine.execute.local as local

    made: list = []

    class Seen(local.Started):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(local, "Started", Seen)
    return made


def mp4_boxes(data: bytes) -> list[tuple[bytes, int]]:
    """(type, offset) of each top-level box of an MP4/MOV/M4A file, walked by their 32-bit sizes (a test's own walk,
    apart from the product's)."""
    boxes, at = [], 0
    while at + 8 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        boxes.append((data[at + 4 : at + 8], at))
        if size < 8:
            break
        at += size
    return boxes
