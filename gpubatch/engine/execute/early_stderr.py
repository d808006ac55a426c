"""Descriptor 2 of the processes a command starts before its ``LibraryMessages`` (:mod:`gpubatch.report.noise`):
the sniff's workers, at its first line (``execute.early.sniff``). A pipe whose lines a thread hands to the
``LibraryMessages`` active then, or keeps until one is; those no one took are written to the terminal at the
process's exit, so nothing is lost. Imported at the command's first line: the standard library's modules loaded
by then, and no others."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any


class _Early:
    """The early pipe, its reading thread, and the lines it kept (module docstring)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.kept: list[str] = []
        self.sink: Any = None
        import threading

        self.lock = threading.Lock()
        self.thread: Any = None

    def _put(self, line: str) -> None:
        with self.lock:
            if self.sink is not None:
                self.sink.add(line)
            else:
                self.kept.append(line)

    def _read(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self.read_fd, 65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for ln in lines:
                    self._put(ln.decode("utf-8", "replace"))
        finally:
            os.close(self.read_fd)
        if pending:
            self._put(pending.decode("utf-8", "replace"))

    def attach(self, sink: Any) -> None:
        with self.lock:
            self.sink = sink
            kept, self.kept = self.kept, []
        for line in kept:
            sink.add(line)

    def detach(self, sink: Any) -> None:
        with self.lock:
            if self.sink is sink:
                self.sink = None

    def flush(self) -> None:
        """(At the process's exit.) The lines no ``LibraryMessages`` took, to the terminal."""
        with self.lock:
            kept, self.kept = [ln for ln in self.kept if ln.strip()], []
        if kept:
            try:
                os.write(2, ("\n".join(kept) + "\n").encode("utf-8", "replace"))
            except OSError:
                pass


_EARLY: _Early | None = None


@contextlib.contextmanager
def early_descriptor() -> Iterator[None]:
    """The processes started in this block get the early pipe as their descriptor 2 (this process's own is back
    after it); :func:`read_early` starts reading it once they are started. Where this process's stderr has no
    descriptor, a no-op."""
    global _EARLY
    try:
        sys.stderr.flush()
        sys.stderr.fileno()
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        yield
        return
    if _EARLY is None or _EARLY.thread is not None:  # (a pipe being read has its write end closed: a new one)
        _EARLY = _Early()
    saved = os.dup(2)
    os.dup2(_EARLY.write_fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def attach(sink: Any) -> None:
    """``sink`` (a ``LibraryMessages`` that begins) takes the early pipe's lines, those kept first."""
    if _EARLY is not None:
        _EARLY.attach(sink)


def detach(sink: Any) -> None:
    """``sink`` ends: the early pipe's lines are kept again."""
    if _EARLY is not None:
        _EARLY.detach(sink)


def read_early() -> None:
    """The early pipe read from now on, by a thread (after the processes are started: a fork wants one thread),
    and its unclaimed lines written out at exit; this process's write end closed, so the pipe ends with them."""
    early = _EARLY
    if early is None or early.thread is not None:
        return
    import atexit
    import threading

    os.close(early.write_fd)
    early.thread = threading.Thread(target=early._read, name="gpubatch-early-stderr", daemon=True)
    early.thread.start()
    atexit.register(early.flush)
