"""The GPU image unit's marks: when a worker's steps came, from the run's start (``images._Marks``)."""

import time

from gpubatch.engine.gpu.images import _Marks


def test_marks_are_seconds_from_the_runs_start_each_taken_once():
    started = time.time() - 2.0
    m = _Marks(started)
    m.mark("unit start", booted=0.5)
    m.once("first batch read")
    m.once("first batch read")  # (kept the first time only)
    m.at("feed started", started + 1.25)
    taken = m.take()
    assert set(taken) == {"worker boot", "unit start", "first batch read", "feed started"}
    assert 1.9 <= taken["unit start"] < 3.0 and abs(taken["unit start"] - taken["worker boot"] - 0.5) < 1e-3
    assert taken["feed started"] == 1.25 and taken["first batch read"] >= taken["unit start"]
    assert not m.taken() and m.take() == {}
    m.once("first batch read")  # (a name marked before, taken with an earlier commit, is not marked again)
    m.mark("batch 25%")
    assert list(m.take()) == ["batch 25%"]


def test_no_marks_without_the_runs_start():
    m = _Marks(0.0)
    m.mark("unit start", booted=0.1)
    m.at("feed started", time.time())
    assert not m.taken()


def test_a_rings_pages_are_made_before_it_is_page_locked():
    """The feed's ring has its pages made and mapped off the CUDA driver's lock (``images.allocated``), and keeps
    what is in it."""
    from multiprocessing.shared_memory import SharedMemory

    from gpubatch.engine.gpu.images import allocated

    shm = SharedMemory(create=True, size=8 << 20)
    try:
        shm.buf[:5] = b"bytes"
        assert allocated(shm)
        assert bytes(shm.buf[:5]) == b"bytes" and shm.buf[(8 << 20) - 1] == 0
    finally:
        shm.close()
        shm.unlink()
