"""When a GPU worker's steps came, from the run's start: the summary's ``wall (worker): NAME`` (the image and
audio units). Light on purpose: no import of the GPU stack."""

from __future__ import annotations

import time


class Marks:
    """When a GPU worker's steps came, in seconds from the run's start (``started``, the run's ``time.time()``; no
    marks where it is 0): each commit takes those made since the one before (:meth:`take`), and the run keeps the
    earliest of each over its workers (``runner``'s ``wall (worker): NAME``). ``booted``: a boot's seconds
    before the first mark, kept as "worker boot"."""

    def __init__(self, started: float):
        self.started = started
        self.marks: dict[str, float] = {}
        self.seen: set[str] = set()

    def at(self, name: str, when: float | None) -> None:
        if self.started and when is not None and name not in self.seen:
            self.seen.add(name)
            self.marks[name] = round(when - self.started, 4)

    def mark(self, name: str, booted: float | None = None) -> None:
        now = time.time()
        if booted is not None:
            self.at("worker boot", now - booted)
        self.at(name, now)

    def once(self, name: str) -> None:
        if name not in self.seen:
            self.mark(name)

    def take(self) -> dict[str, float]:
        out, self.marks = self.marks, {}
        return out
