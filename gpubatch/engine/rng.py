"""Seeded per-record randomness: the parameters of a record depend on (seed, record key) only.

So a run is reproducible with ``--seed``, and the CPU and GPU paths, or a resumed run, draw exactly
the same crops and flips for the same record, whatever the batch it lands in or the thread it runs on.
"""

from __future__ import annotations

import hashlib

import numpy as np


def record_rng(seed: int, key: str, stream: int = 0) -> np.random.Generator:
    """A NumPy generator determined by ``seed``, the record ``key`` and a ``stream`` number."""
    digest = hashlib.blake2b(f"{int(seed)}\x00{stream}\x00{key}".encode(), digest_size=16).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))
