"""Process-wide GPU settings the engine makes (no GPU needed): the memory cap's parsing and the
policy host threads wait for the GPU with."""

from __future__ import annotations

import ctypes

import pytest

from gpubatch.engine.gpu import context as ge
from gpubatch.engine.gpu import memory as gm
from gpubatch.errors import UsageError


def test_memory_cap_sizes_and_fractions():
    total = 80 << 30
    assert gm.parse_memory("2GiB", total) == 2 << 30
    assert gm.parse_memory("512MiB", total) == 512 << 20
    assert gm.parse_memory("0.5", total) == 40 << 30
    assert gm.parse_memory(None, total) == min(gm.DEFAULT_GPU_MEMORY, total)
    for bad in ("lots", "2 parsecs", "1KiB"):
        with pytest.raises(UsageError):
            gm.parse_memory(bad, total)


def test_sync_policy_names_are_checked_and_need_the_driver(monkeypatch):
    with pytest.raises(UsageError, match="one of auto, spin, yield, blocking"):
        ge.set_sync_policy(0, "sometimes")

    def no_driver(name, *a, **k):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_driver)
    assert ge.set_sync_policy(0, "blocking") is False  # nothing to set without a driver: not an error
    assert ge.sync_policy_state(0) == (None, False)
    from gpubatch.engine.settings import SYNC_POLICIES, Settings

    assert Settings().sync in ge.SYNC_POLICIES and set(SYNC_POLICIES) == set(ge.SYNC_POLICIES)


def test_settings_come_from_arguments_over_the_environment_over_the_defaults(monkeypatch):
    """The one place the engine reads ``GPUBATCH_*`` variables: each setting from an argument, else its
    variable, else its default; a bad value is a one-line UsageError."""
    from gpubatch.engine.settings import Settings

    monkeypatch.setenv("GPUBATCH_DECODE_ROUTE", "hardware")
    monkeypatch.setenv("GPUBATCH_SWITCH_INTERVAL", "0.0005")
    monkeypatch.setenv("GPUBATCH_PIN_FEED", "0")
    st = Settings.from_env()
    assert (st.decode_route, st.switch_interval, st.pin_feed) == ("hardware", 0.0005, False)
    assert Settings.from_env(decode_route="split", sync=None).decode_route == "split"
    assert Settings.from_env(environ={}).decode_route == "auto"
    for bad in ({"decode_route": "fast"}, {"hw_planes": "sometimes"}, {"no_such_knob": 1}):
        with pytest.raises(UsageError):
            Settings.from_env(environ={}, **bad)
    monkeypatch.setenv("GPUBATCH_HW_DECODERS", "many")
    with pytest.raises(UsageError, match="GPUBATCH_HW_DECODERS"):
        Settings.from_env()
    monkeypatch.delenv("GPUBATCH_HW_DECODERS")
    assert Settings.from_env(environ={"GPUBATCH_CUDA_SHARE": "0.15"}).cuda_share == 0.15
    assert not Settings.from_env(environ={}).hw_per_kind  # (off by default; 1 turns it on)
    assert Settings.from_env(environ={"GPUBATCH_HW_PER_KIND": "1"}).hw_per_kind
    for share in ("1.5", "-0.1"):
        with pytest.raises(UsageError, match="GPUBATCH_CUDA_SHARE"):
            Settings.from_env(environ={"GPUBATCH_CUDA_SHARE": share})


def test_the_study_settings_come_from_the_environment():
    from gpubatch.engine.settings import Settings

    assert Settings.from_env(environ={}).high_priority == ()
    assert Settings.from_env(environ={"GPUBATCH_HIGH_PRIORITY": "hw, cuda"}).high_priority == ("hw", "cuda")
    with pytest.raises(UsageError, match="GPUBATCH_HIGH_PRIORITY='encoder'"):
        Settings.from_env(environ={"GPUBATCH_HIGH_PRIORITY": "encoder"})
    opts = "nvjpeg_cuda_decoder:hybrid_huffman_threshold=1000000"
    assert Settings.from_env(environ={"GPUBATCH_CUDA_DECODER_OPTIONS": opts}).cuda_decoder_options == opts
    assert "threshold=0" in Settings.from_env(environ={}).cuda_decoder_options
    assert Settings.from_env(environ={"GPUBATCH_POOL_KEEP_MIB": "2048"}).pool_keep == 2048 << 20
    with pytest.raises(UsageError, match="GPUBATCH_POOL_KEEP_MIB='2GiB': not a whole number of MiB"):
        Settings.from_env(environ={"GPUBATCH_POOL_KEEP_MIB": "2GiB"})
    assert (Settings.from_env(environ={}).hw_ring, Settings.from_env(environ={}).cuda_ring) == (0, 0)
    st = Settings.from_env(environ={"GPUBATCH_HW_RING": "4", "GPUBATCH_CUDA_RING": "2"})
    assert (st.hw_ring, st.cuda_ring) == (4, 2)
    with pytest.raises(UsageError, match=r"GPUBATCH_HW_RING='-1': not a whole number \(0 or more\)"):
        Settings.from_env(environ={"GPUBATCH_HW_RING": "-1"})
    assert Settings.from_env(environ={}).ring_banks == 0  # (0: the loader two banks, the pipelines one)
    assert Settings.from_env(environ={"GPUBATCH_RING_BANKS": "2"}).ring_banks == 2
    assert (Settings.from_env(environ={}).hw_stream_wait, Settings.from_env(environ={}).region_decode) == (False, None)
    st = Settings.from_env(environ={"GPUBATCH_HW_STREAM_WAIT": "1", "GPUBATCH_REGION_DECODE": "0"})
    assert (st.hw_stream_wait, st.region_decode) == (True, False)
    assert (Settings.from_env(environ={}).feed_slots, Settings.from_env(environ={"GPUBATCH_FEED_SLOTS": "16"}).feed_slots) == (6, 16)
    with pytest.raises(UsageError, match=r"GPUBATCH_FEED_SLOTS='0': not a whole number \(1 or more\)"):
        Settings.from_env(environ={"GPUBATCH_FEED_SLOTS": "0"})


def test_the_engine_reads_no_environment_outside_its_settings():
    """``GPUBATCH_*`` variables are read in engine/settings.py and nowhere else in the engine."""
    import re
    from pathlib import Path

    import gpubatch.engine

    root = Path(gpubatch.engine.__file__).parent
    reads = r"(os\.environ(\.get)?[\[(]|getenv\()\s*[\"'f]*GPUBATCH|GPUBATCH_\w*[\"']\s*in\s+os\.environ"
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if p.name != "settings.py" and re.search(reads, p.read_text()))
    assert readers == []
    # (the other uses of the environment: the thread limits a worker process starts with, written; and
    # CUDA_VISIBLE_DEVICES, read to find a CUDA device's NVML index)
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if p.name != "settings.py" and re.search(r"os\.environ|getenv\(", p.read_text()))
    assert users == ["gpu/memory.py", "processes.py"]
    assert re.findall(r"os\.environ\.get\(\"(\w+)\"", (root / "gpu" / "memory.py").read_text()) == ["CUDA_VISIBLE_DEVICES"]
