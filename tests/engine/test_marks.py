"""The GPU image unit's marks: when a worker's steps came, from the run's start (``marks.Marks``)."""

import time

from gpubatch.engine.gpu.marks import Marks


def test_marks_are_seconds_from_the_runs_start_each_taken_once():
    started = time.time() - 2.0
    m = Marks(started)
    m.mark("unit start", booted=0.5)
    m.once("first batch read")
    m.once("first batch read")  # (kept the first time only)
    m.at("feed started", started + 1.25)
    taken = m.take()
    assert set(taken) == {"worker boot", "unit start", "first batch read", "feed started"}
    assert 1.9 <= taken["unit start"] < 3.0 and abs(taken["unit start"] - taken["worker boot"] - 0.5) < 1e-3
    assert taken["feed started"] == 1.25 and taken["first batch read"] >= taken["unit start"]
    assert m.take() == {}
    m.once("first batch read")  # (a name marked before, taken with an earlier commit, is not marked again)
    m.mark("batch 25%")
    assert list(m.take()) == ["batch 25%"]


def test_no_marks_without_the_runs_start():
    m = Marks(0.0)
    m.mark("unit start", booted=0.1)
    m.at("feed started", time.time())
    assert m.take() == {}


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


def test_the_gpu_image_units_feed_takes_the_readers_its_workers_boot_started():
    """The GPU image unit's feed (``images.record_feed``) reads its tasks' entries through the readers the worker's
    boot forked (``gpu.feed_start``), in batches never across two tasks; without them it starts its own."""
    import functools
    from pathlib import Path
    from types import SimpleNamespace

    from gpubatch.engine.gpu import feed_start
    from gpubatch.engine.gpu.images import record_feed
    from gpubatch.engine.gpu.marks import Marks
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.settings import Settings
    from gpubatch.formats import open_reader

    src = Path(__file__).resolve().parents[2] / "sample_data" / "imagenet"
    reader = open_reader(src, "folder")
    entries = reader.entries()
    tasks = [SimpleNamespace(entries=entries[:7]), SimpleNamespace(entries=entries[7:12])]
    ctx = SimpleNamespace(opener=functools.partial(open_reader, src, "folder"), plan=Plan(ops=[]),
                          settings=Settings(feed_depth=2, feed_slot_bytes=8 << 20))
    for prestarted in (False, True):
        if prestarted:
            feed_start.prestart(2)
        feed = record_feed(ctx, tasks, 4, 2, Marks(0.0))
        try:
            assert feed.prestarted == prestarted and not feed_start._PRESTARTED
            keys = []
            for fed in feed:  # (no pixel op: every record passes through, finished by the readers)
                keys.append([r.key for r in fed.results])
                fed.done()
        finally:
            feed.close()
        assert [len(k) for k in keys] == [4, 3, 4, 1]  # (7 then 5 entries, in batches of 4, none across the two)
        assert sum(keys, []) == [reader.read(e).key for e in entries[:12]]


def test_the_gpu_image_unit_starts_its_feed_on_the_readers_of_its_boot_beside_its_engine(monkeypatch):
    """The unit's own start (``GpuImageUnit.run``, on this machine up to its engine, which fails here): its feed is
    made in its thread, on the readers the boot forked, and ended with the engine's error, which is the one raised."""
    import functools
    from pathlib import Path

    import pytest

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.execute.worker import RunContext
    from gpubatch.engine.gpu import feed_start, images, start
    from gpubatch.engine.plan import make_plan
    from gpubatch.engine.settings import Settings
    from gpubatch.errors import GpubatchError
    from gpubatch.formats import open_reader
    from gpubatch.types import ShardTask

    src = Path(__file__).resolve().parents[2] / "sample_data" / "imagenet"
    entries = open_reader(src, "folder").entries()
    settings = Settings(reserve_core=False, feed_depth=2, feed_slot_bytes=8 << 20, pin_feed=False)
    ctx = RunContext(opener=functools.partial(open_reader, src, "folder"), sink=None,
                     plan=make_plan(64), device=Device(DeviceKind.GPU, 0), settings=settings,
                     batch_size=8, on_gpu=True)
    tasks = [ShardTask(index=k, start=k * 8, stop=(k + 1) * 8, entries=entries[k * 8:(k + 1) * 8], name=f"s{k}")
             for k in range(2)]
    readers = start.feed_readers(images.cores(), ctx.host_procs, settings)
    taken, fed = [], []
    real_taken, real_feed = feed_start.taken, images.record_feed

    def taking(n, init):
        got = real_taken(n, init)
        taken.append(got is not None)
        return got

    def feeding(*a, **k):
        f = real_feed(*a, **k)
        fed.append(f)
        return f

    class NoEngine:
        def __init__(self, *a, **k):
            for _ in range(500):  # (the feed's thread first: its readers taken before the engine fails)
                if fed:
                    break
                import time

                time.sleep(0.01)
            raise GpubatchError("no engine here")

    monkeypatch.setattr(feed_start, "taken", taking)
    monkeypatch.setattr(images, "record_feed", feeding)
    monkeypatch.setattr(images, "GpuEngine", NoEngine)
    monkeypatch.setattr(start, "booted", lambda index: (0.0, None))  # (as a worker whose boot began its start)
    feed_start.prestart(readers)
    try:
        with pytest.raises(GpubatchError, match="no engine here"):
            images.GpuImageUnit(ctx, 0).run(None, iter(tasks), lambda t: None, lambda r: None)
    finally:
        feed_start.close(now=True)
    assert taken == [True] and len(fed) == 1 and fed[0].prestarted


def test_a_runs_worker_walls_are_the_earliest_of_each_step_over_its_workers_in_order():
    """``runner.worker_walls``: each step's earliest time over the shards' marks (two workers' first shards here),
    the first batch as ``wall: first batch (from the run's start)``, the rest as ``wall (worker): NAME`` in the order
    they came; shards without marks add nothing."""
    from gpubatch.runner import worker_walls
    from gpubatch.types import ShardResult

    results = [ShardResult(0, "a", 0, 8, extra={"marks": {"unit start": 0.3, "first batch": 1.0, "engine made": 0.8}}),
               ShardResult(1, "b", 8, 16, extra={"marks": {"unit start": 0.2, "first batch": 1.1, "batch 25%": 1.5}}),
               ShardResult(2, "c", 16, 24)]
    walls = worker_walls(results)
    assert walls == {"wall: first batch (from the run's start)": 1.0, "wall (worker): unit start": 0.2,
                     "wall (worker): engine made": 0.8, "wall (worker): batch 25%": 1.5}
    assert list(walls)[1:] == ["wall (worker): unit start", "wall (worker): engine made", "wall (worker): batch 25%"]
    assert worker_walls([ShardResult(0, "a", 0, 8)]) == {}
