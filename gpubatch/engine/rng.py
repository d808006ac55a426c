"""Seeded per-record randomness: the parameters of a record depend on (seed, record key) only.

So a run is reproducible with ``--seed``, and the CPU and GPU paths, or a resumed run, draw exactly
the same crops and flips for the same record, whatever the batch it lands in or the thread it runs on.

:class:`KeyedRandom` is a counter-mode generator over BLAKE2b: each block of 64 bytes is
``blake2b(seed, stream, key, counter)``. Creating one costs about a microsecond, against ~20 us for a
seeded NumPy Generator: at 25,000 images/s the per-record host budget is 40 us in total.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from typing import Any

_U53 = 1.0 / (1 << 53)


class KeyedRandom:
    """The subset of ``numpy.random.Generator`` that ops use (scalar ``random``, ``uniform``, ``integers``)."""

    __slots__ = ("_prefix", "_block", "_buf", "_pos")

    def __init__(self, seed: int, key: str, stream: int = 0):
        self._prefix = f"{int(seed)}\x00{int(stream)}\x00{key}\x00".encode()
        self._block = 0
        self._buf: tuple[int, ...] = ()
        self._pos = 0

    def _next64(self) -> int:
        if self._pos >= len(self._buf):
            digest = hashlib.blake2b(self._prefix + struct.pack("<Q", self._block), digest_size=64).digest()
            self._buf = struct.unpack("<8Q", digest)
            self._block += 1
            self._pos = 0
        v = self._buf[self._pos]
        self._pos += 1
        return v

    def random(self) -> float:
        """Uniform float in [0, 1) with 53 random bits."""
        return (self._next64() >> 11) * _U53

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int | None = None) -> int:
        """Uniform integer in [low, high) (or [0, low) with one argument)."""
        if high is None:
            low, high = 0, low
        span = int(high) - int(low)
        if span <= 0:
            raise ValueError(f"integers: empty range [{low}, {high})")
        return int(low) + (self._next64() % span)  # bias below 2**-40 for spans under 2**24


def record_rng(seed: int, key: str, stream: int = 0) -> KeyedRandom:
    """The generator of record ``key`` under ``seed`` (``stream`` separates independent uses)."""
    return KeyedRandom(seed, key, stream)


def file_visits(files: Any, repeat: bool = False, epoch: int = 0) -> Iterator[tuple[str, str]]:
    """(path, draw key) for each visit of each file, in order: every file once, forever with ``repeat``.
    A visit's key, ``<file>#e<epoch>#v<visit>``, is what a training pipeline draws its parameters from,
    so every epoch and visit draws anew, and reproducibly."""
    visit = 0
    while True:
        for f in files:
            yield str(f), f"{os.path.splitext(str(f))[0]}#e{epoch}#v{visit}"
        visit += 1
        if not repeat:
            return
