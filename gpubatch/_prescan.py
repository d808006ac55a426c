"""A folder source listed beside the ``gpubatch`` command's own start.

``convert`` and ``augment`` list their source and plan their shards once the command has imported its code (0.1-
0.2 s: ``benchmarks/cli_start.py``); on a folder of 16,384 images telling its format and listing its files took
another 0.05-0.1 s of the command's own, while its workers, forked at its first line, waited. :func:`begin`, called
first thing by the command (``gpubatch/cli/__init__.py``, before :func:`~.engine.execute.early.sniff`), forks one process that imports the formats, tells the
source's format and lists it (:meth:`~.formats.base.Reader.entries`) while the command imports; it leaves the
scanned reader, pickled, in a memory file. :func:`taken` gives it to the run that opens that very source, waiting
for it up to :data:`WAIT_S` where it is not ready yet; otherwise (not ready by then, another source or format, a
reader that holds open files, the process failed) the run opens and lists the source itself, as it always did, and
the process is ended. Either way the run's entries are those of one listing of the folder made at the command's start: its output
does not depend on which process made it.

Only where the command may fork safely (one thread), on a host of at least :data:`MIN_CORES` cores (on two, the
process's work took the cores from the command's), for a local folder named as the command's first argument
after its name, with no ``--from`` and no column options; ``GPUBATCH_EARLY_START=0`` turns it off with the rest of
the early start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: the fewest cores on which the source is listed in a process of its own
MIN_CORES = 4

#: how long a run waits for the listing where it is not ready when the run gets there, in seconds: where the
#: listing takes longer (a folder of hundreds of thousands of files, where moving the reader over costs more than
#: the imports it overlapped: pickled and unpickled, 100,000 entries took 0.10 s on the 2-core CI machine, growing
#: with them, ``benchmarks/list_entries.py --folder``), the
#: run lists the source itself, having lost at most this
WAIT_S = 0.25

#: options after which the command's source is not listed ahead (its reader takes them, or another process reads it)
NOT_AHEAD = ("--from", "--path-column", "--label-column", "--help", "-h")

_PENDING: list[tuple[str, int, int, int]] = []  # (the source as named, ready pipe, memory file, process id)


def source_of(args: list[str]) -> str | None:
    """The local folder ``convert`` or ``augment`` reads, where its arguments name it right after the command's
    name (``convert SRC DST ...``); None otherwise."""
    at = next((k for k, a in enumerate(args) if not a.startswith("-")), None)
    if at is None or args[at] not in ("convert", "augment") or at + 1 >= len(args):
        return None
    src = args[at + 1]
    names = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    if src.startswith("-") or names & set(NOT_AHEAD) or "://" in src or src.startswith("pipe:"):
        return None
    return src if os.path.isdir(src) else None


def begin(args: list[str]) -> bool:
    """Where the command's arguments name a local folder source (:func:`source_of`), a process forked to list it;
    whether one was. Never raises."""
    try:
        import threading

        src = source_of(args)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if (src is None or cores < MIN_CORES or _PENDING or threading.active_count() != 1
                or not hasattr(os, "fork") or not hasattr(os, "memfd_create")):
            return False
        from .engine.settings import Settings

        if not Settings.from_env().early_start:  # (GPUBATCH_EARLY_START=0: nothing started ahead of the run)
            return False
        memory = os.memfd_create("gpubatch-prescan", os.MFD_CLOEXEC)
        ready, done = os.pipe()
        parent = os.getpid()
        pid = os.fork()
    except Exception:  # noqa: BLE001 - the run lists its source itself
        return False
    if pid == 0:  # pragma: no cover - the forked process (its work is checked through taken())
        _list(src, memory, ready, done, parent)
    os.close(done)
    _PENDING.append((src, ready, memory, pid))
    import atexit

    atexit.register(drop)
    return True


def _list(src: str, memory: int, ready: int, done: int, parent: int) -> None:  # pragma: no cover - (in the forked process)
    """The forked process: ``src`` opened and listed, the reader pickled into ``memory``, one byte to ``done``
    ("1": it is there; "0": none: another kind of reader, or an error that the run will meet and report itself)."""
    import signal

    said = b"0"
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a Ctrl-C is the command's to report, not this process's)
        _end_with_parent(parent)
        os.close(ready)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        import pickle

        from .formats import _detect, open_reader

        detected = _detect(Path(src))
        if detected[0].listed_ahead:  # (else "0" at once: the run need not wait for this process)
            reader = open_reader(Path(src), detected=detected)
            reader.entries()
            view = memoryview(pickle.dumps(reader, protocol=pickle.HIGHEST_PROTOCOL))
            while view:
                view = view[os.write(memory, view):]
            said = b"1"
    except BaseException:  # noqa: BLE001 - the run lists its source itself
        said = b"0"
    try:
        os.write(done, said)
    finally:
        os._exit(0)


def _end_with_parent(parent: int) -> None:  # pragma: no cover - (in the forked process)
    """Linux ends this process when the command's (``parent``) ends (``PR_SET_PDEATHSIG``): a command cut short before
    its run leaves no listing going on behind it."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):  # (not Linux: the listing ends on its own)
        return
    if os.getppid() != parent:  # (the command ended before the call)
        os._exit(0)


def taken(src_path: Path, fmt: str | None, options: dict | None) -> Any:
    """The reader :func:`begin`'s process made of ``src_path``, its entries listed, where it is ready now and was
    made as the run would make it (the same path, no ``--from``, no reader options); None otherwise (the run opens
    the source itself). The process is ended either way."""
    if not _PENDING:
        return None
    src, ready, memory, pid = _PENDING.pop()
    try:
        if fmt is not None or any(v is not None for v in (options or {}).values()) or Path(src) != Path(src_path):
            return None
        import select

        if not select.select([ready], [], [], WAIT_S)[0] or os.read(ready, 1) != b"1":
            return None
        import pickle

        size = os.fstat(memory).st_size
        data = bytearray()
        while len(data) < size:
            chunk = os.pread(memory, size - len(data), len(data))
            if not chunk:
                return None
            data += chunk
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - the run lists its source itself
        return None
    finally:
        _end(ready, memory, pid)


def drop() -> None:
    """What :func:`begin` started and no run took, ended (the command's exit)."""
    while _PENDING:
        _end(*_PENDING.pop()[1:])


def _end(ready: int, memory: int, pid: int) -> None:
    import signal

    for fd in (ready, memory):
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):  # (still listing: it is not needed)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError, OSError):
        pass
