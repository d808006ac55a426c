"""Process-wide GPU settings the engine makes (no GPU needed): the memory cap's parsing and the
policy host threads wait for the GPU with."""

from __future__ import annotations

import ctypes

import pytest

from gpubatch.engine import gpu_engine as ge
from gpubatch.errors import UsageError


def test_memory_cap_sizes_and_fractions():
    total = 80 << 30
    assert ge.parse_memory("2GiB", total) == 2 << 30
    assert ge.parse_memory("512MiB", total) == 512 << 20
    assert ge.parse_memory("0.5", total) == 40 << 30
    assert ge.parse_memory(None, total) == min(ge.DEFAULT_GPU_MEMORY, total)
    for bad in ("lots", "2 parsecs", "1KiB"):
        with pytest.raises(UsageError):
            ge.parse_memory(bad, total)


def test_sync_policy_names_are_checked_and_need_the_driver(monkeypatch):
    with pytest.raises(UsageError, match="one of auto, spin, yield, blocking"):
        ge.set_sync_policy(0, "sometimes")

    def no_driver(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_driver)
    assert ge.set_sync_policy(0, "blocking") is False  # nothing to set without a driver: not an error
    assert ge.sync_policy_state(0) == (None, False)
    assert ge.SYNC_POLICY in ge.SYNC_POLICIES
