"""What third-party decoders print while a command runs, held back from the terminal and counted.

Pillow warns through Python's ``warnings`` (``UserWarning: Tag data larger than file``), libtiff and
FFmpeg write lines straight to file descriptor 2 from C; converting Pillow's own test images printed
about 500 such lines before the summary. :class:`LibraryMessages` collects both for the length of a
command: Python warnings through a ``showwarning`` hook (with the record being read, where the thread
says which), and C-level lines through a pipe put on descriptor 2, read by a thread. The command's own
output (rich, click) goes to a copy of the terminal's descriptor meanwhile, so only the libraries' lines
are held back; worker processes, started while it is active, inherit the pipe. Those started before it, at
the command's first line (``execute.early.sniff``), get a pipe of their own (``engine/execute/early_stderr.py``), whose
lines go to the active one, or wait for it. The summary counts them; ``--verbose`` lists them.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import warnings
from collections import Counter
from typing import Any


class LibraryMessages:
    """Hold back and count what libraries print to stderr while active (a context manager).

    Attributes:
        messages: each distinct message (with the record it came from, where known) and how many times.
    """

    def __init__(self) -> None:
        self.messages: Counter = Counter()
        self._lock = threading.Lock()
        self._saved_fd: int | None = None
        self._reader: threading.Thread | None = None
        self._stderr: Any = None
        self._warnings: Any = None

    def add(self, text: str, record: str | None = None) -> None:
        text = " ".join(text.split())
        if text:
            with self._lock:
                self.messages[f"{record}: {text}" if record else text] += 1

    def __enter__(self) -> LibraryMessages:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("always")  # every one counted, not the first of each place
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.showwarning = self._show
        try:
            fd = sys.stderr.fileno()
        except (AttributeError, ValueError, io.UnsupportedOperation):
            return self  # (no descriptor to catch: a notebook's stderr; the warnings are still kept)
        sys.stderr.flush()
        self._saved_fd = os.dup(fd)
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self._stderr = sys.stderr
        sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(self._saved_fd), "wb", buffering=0), encoding="utf-8",
                                      errors="replace", line_buffering=True, write_through=True)
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(r,), name="gpubatch-stderr", daemon=True)
        self._reader.start()
        from ..engine.execute.early_stderr import attach

        attach(self)
        return self

    def _show(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
              line: Any = None) -> None:
        from ..errors import current_record

        self.add(f"{category.__name__}: {message}", current_record())

    def _read(self, fd: int) -> None:
        """Read the pipe until told to stop and nothing more is there (processes the command started, such
        as multiprocessing's resource tracker, may hold its other end open for as long as they live)."""
        import select

        pending = b""
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], 0.05)
                if not ready:
                    if self._stop.is_set():
                        break
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for ln in lines:
                    self.add(ln.decode("utf-8", "replace"))
        finally:
            os.close(fd)
        if pending:
            self.add(pending.decode("utf-8", "replace"))

    def __exit__(self, *exc: object) -> None:
        from ..engine.execute.early_stderr import detach

        detach(self)
        if self._saved_fd is not None:
            fd = self._stderr.fileno()
            sys.stderr.flush()
            os.dup2(self._saved_fd, fd)  # this process's write end of the pipe closes
            os.close(self._saved_fd)
            sys.stderr.close()
            sys.stderr = self._stderr
            if self._reader is not None:
                self._stop.set()  # what is in the pipe is read, then the reader ends
                self._reader.join(timeout=5)
            self._saved_fd = None
        self._warnings.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.messages.values())

    def summary_line(self) -> str | None:
        """One line for the run's summary, or None where nothing was printed."""
        if not self.messages:
            return None
        n, distinct = self.total, len(self.messages)
        return (f"{n:,} message{'s' if n > 1 else ''} from the decoders ({distinct:,} distinct) held back; "
                "--verbose lists them")

    def render(self) -> None:
        """List every message (most frequent first) on the command's console."""
        from .console import console, esc

        con = console()
        for text, n in self.messages.most_common():
            con.print(f"[dim]library:[/] {esc(text)}" + (f" [dim](x{n})[/]" if n > 1 else ""))

