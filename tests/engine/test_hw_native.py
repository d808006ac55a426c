"""The native driver of the hardware engine's calls (codecs/hw_native.py, hw_driver.c), without a GPU: built
by the system C compiler into the cache, its thread given Python functions in place of nvJPEG's and the CUDA
driver's (ctypes callbacks; the real calls run in the GPU tests, test_gpu.py)."""

from __future__ import annotations

import ctypes as C
import shutil
import threading
import time

import pytest

from gpubatch.engine.codecs import hw_native, nvjpeg_hw
from gpubatch.engine.settings import Settings

pytestmark = pytest.mark.skipif(not shutil.which("cc") and not shutil.which("gcc"), reason="no C compiler")

vp, i = C.c_void_p, C.c_int
INIT = C.CFUNCTYPE(i, vp, vp, i, i, i)
BATCHED = C.CFUNCTYPE(i, vp, vp, vp, vp, vp, vp)
BATCHED_EX = C.CFUNCTYPE(i, vp, vp, vp, vp, vp, vp, vp)
ONE = C.CFUNCTYPE(i, vp)
RECORD = C.CFUNCTYPE(i, vp, vp)


class Fake:
    """The seven functions a driver calls, as Python callbacks that note each call; ``status`` sets what one
    returns, ``gate`` holds the decode until set."""

    def __init__(self):
        self.log: list[tuple] = []
        self.status: dict[str, int] = {}
        self.pending_events: set[int] = set()  # events a query finds unfinished (once)
        self.gate = threading.Event()
        self.gate.set()
        self.threads: set[int] = set()

        def note(name, *args):
            self.threads.add(threading.get_ident())
            self.log.append((name, *args))
            return self.status.get(name, 0)

        def batched(h, s, data, sizes, images, stream):
            self.gate.wait(10)
            return note("batched", h, s, data, sizes, images, stream)

        def query(ev):
            note("query", ev)
            if ev in self.pending_events:
                self.pending_events.discard(ev)
                return 600  # CUDA_ERROR_NOT_READY
            return 0

        self.funcs = [INIT(lambda h, s, n, t, f: note("init", h, s, n, t, f)), BATCHED(batched),
                      BATCHED_EX(lambda h, s, d, z, im, p, st: note("batched_ex", h, s, d, z, im, p, st)),
                      ONE(lambda ctx: note("ctx", ctx)), ONE(query), ONE(lambda ev: note("sync", ev)),
                      RECORD(lambda ev, st: note("record", ev, st))]

    def driver(self, folder, queue=hw_native.QUEUE):
        return hw_native.Driver([hw_native.address(f) for f in self.funcs], 0, str(folder), queue)


def _call(n=3, params=None, before=11, after=11, publish=None, stream=77):
    return hw_native.Call(1, 2, n, 5, 1000, 2000, 3000, params, stream, before, after, publish)


def test_the_driver_is_built_once_into_the_cache_and_found_there_again(tmp_path):
    hw_native._built.cache_clear()
    path, why = hw_native._built(str(tmp_path))
    assert path and not why and path.startswith(str(tmp_path / "native" / "hw_driver-"))
    made = (tmp_path / "native").stat().st_mtime_ns, C.CDLL(path).gb_start
    hw_native._built.cache_clear()
    assert hw_native._built(str(tmp_path))[0] == path  # (found, not built again)
    assert [p.name for p in (tmp_path / "native").iterdir()] == [path.rsplit("/", 1)[1]]  # no temporary left
    assert made[0] == (tmp_path / "native").stat().st_mtime_ns


def test_a_call_is_made_in_the_drivers_thread_in_order_with_its_events(tmp_path):
    fake = Fake()
    fake.pending_events.add(11)  # the instance's previous call not finished yet: waited for first
    d = fake.driver(tmp_path)
    try:
        call = _call(publish=12)
        d.submit(call)
        assert d.wait(call, 5)
    finally:
        d.close()
    assert (call.status, call.step, call.done) == (0, 0, 1) and call.ns >= call.wait_ns >= 0
    assert [e[0] for e in fake.log] == ["query", "sync", "init", "batched", "record", "record"]
    assert fake.log[2] == ("init", 1, 2, 3, 1, 5)  # (handle, state, images, one CPU thread, the output format)
    assert fake.log[3] == ("batched", 1, 2, 1000, 2000, 3000, 77)
    assert fake.log[4:] == [("record", 11, 77), ("record", 12, 77)]  # the instance's event, then the published one
    assert threading.get_ident() not in fake.threads  # (made by the driver's own thread)


def test_a_region_call_goes_through_the_ex_call(tmp_path):
    fake = Fake()
    d = fake.driver(tmp_path)
    try:
        call = _call(params=4000, before=None, after=None)
        d.submit(call)
        assert d.wait(call, 5)
    finally:
        d.close()
    assert [e[0] for e in fake.log] == ["init", "batched_ex"] and fake.log[1][6] == 4000


def test_calls_queued_together_are_made_one_after_another_in_their_order(tmp_path):
    fake = Fake()
    fake.gate.clear()  # the first decode waits: the others queue behind it
    d = fake.driver(tmp_path)
    calls = [_call(n=k + 1, before=None, after=None, stream=100 + k) for k in range(5)]
    try:
        for c in calls:
            d.submit(c)
        assert not d.wait(calls[0], 0.05)  # (a timeout: not made yet)
        assert not calls[-1].done
        fake.gate.set()
        for c in calls:
            assert d.wait(c, 5)
    finally:
        d.close()
    assert [e[6] for e in fake.log if e[0] == "batched"] == [100, 101, 102, 103, 104]
    assert [e[3] for e in fake.log if e[0] == "init"] == [1, 2, 3, 4, 5]


def test_a_full_queue_makes_the_submitter_wait_for_room(tmp_path):
    fake = Fake()
    fake.gate.clear()
    d = fake.driver(tmp_path, queue=2)
    calls = [_call(before=None, after=None, stream=k) for k in range(1, 5)]
    try:
        threading.Timer(0.1, fake.gate.set).start()
        t0 = time.perf_counter()
        for c in calls:
            d.submit(c)  # the third waits until the first two are made
        assert time.perf_counter() - t0 >= 0.05
        for c in calls:
            assert d.wait(c, 5)
    finally:
        d.close()
    assert [e[6] for e in fake.log if e[0] == "batched"] == [1, 2, 3, 4]


def test_closing_makes_what_is_queued_first(tmp_path):
    fake = Fake()
    fake.gate.clear()
    closed = []
    d = hw_native.Driver([hw_native.address(f) for f in fake.funcs], 0, str(tmp_path),
                         on_close=lambda: closed.append(all(c.done for c in calls)))
    calls = [_call(before=None, after=None) for _ in range(3)]
    for c in calls:
        d.submit(c)
    threading.Timer(0.05, fake.gate.set).start()
    d.close()
    d.close()  # (once only)
    assert all(c.done for c in calls) and closed == [True]
    with pytest.raises(RuntimeError, match="closed"):
        d.submit(_call())


def test_a_refused_decode_is_a_false_and_a_failed_cuda_call_an_error(tmp_path):
    """nvJPEG refusing a call (a corrupt image fails its call) is a False for the caller, which retries the
    images elsewhere, and the events are still recorded; a CUDA call failing raises, naming the step."""
    fake = Fake()
    fake.status["batched"] = 7
    d = fake.driver(tmp_path)
    try:
        call = _call(publish=12)
        d.submit(call)
        pending = nvjpeg_hw._Pending(d, call, ())
        assert nvjpeg_hw.HwBatchDecoder.finish(pending)[0] is False
        assert (call.status, call.step) == (7, 3)
        assert [e[0] for e in fake.log][-2:] == ["record", "record"]
        fake.status.update(batched=0, record=999)
        call = _call()
        d.submit(call)
        with pytest.raises(RuntimeError, match="event's record failed with CUDA error 999"):
            nvjpeg_hw.HwBatchDecoder.finish(nvjpeg_hw._Pending(d, call, ()))
    finally:
        d.close()


def test_without_a_compiler_the_calls_stay_in_python_with_one_warning(tmp_path, monkeypatch):
    hw_native._built.cache_clear()
    hw_native._warn_once.cache_clear()
    monkeypatch.setattr(hw_native.shutil, "which", lambda name: None)
    try:
        with pytest.warns(RuntimeWarning, match="made from Python .no C compiler"):
            assert hw_native.library(str(tmp_path)) is None
        assert nvjpeg_hw.nvjpeg_driver(0, str(tmp_path)) is None
        assert not (tmp_path / "native").exists()
    finally:
        hw_native._built.cache_clear()
        hw_native._warn_once.cache_clear()


def test_a_compiler_that_fails_says_so(tmp_path):
    hw_native._built.cache_clear()
    try:
        path, why = hw_native._built(str(tmp_path), "false")
        assert path is None and why.startswith("false failed")
        assert list((tmp_path / "native").iterdir()) == []  # (no temporary left)
    finally:
        hw_native._built.cache_clear()


def test_the_native_driver_its_cache_and_compiler_are_settings():
    st = Settings.from_env({})
    assert st.hw_native is False and st.cache_dir == "" and st.c_compiler == ""  # (opt-in: see hw_native.py)
    assert hw_native.cache_root() == hw_native.Path.home() / ".cache" / "gpubatch"
    st = Settings.from_env({"GPUBATCH_HW_NATIVE": "1", "XDG_CACHE_HOME": "/tmp/xdg", "CC": "clang"})
    assert st.hw_native is True and st.cache_dir == "/tmp/xdg/gpubatch" and st.c_compiler == "clang"
    st = Settings.from_env({"XDG_CACHE_HOME": "/tmp/xdg", "GPUBATCH_CACHE_DIR": "/tmp/x"})
    assert st.cache_dir == "/tmp/x" and hw_native.cache_root(st.cache_dir) == hw_native.Path("/tmp/x")


@pytest.mark.parametrize("native", [True, False])
def test_a_parts_calls_go_to_the_finishing_thread_one_by_one_so_a_ring_slot_comes_back(native):
    """With fewer ring slots than a part has calls (``hw_ring``, a memory cap's plan), call k+1 waits for the slot
    that call k's images give back once posted and read: each queued call must reach the finishing thread before
    the next call asks for its slot. (Handed over together after the last call was queued, every later call
    waited until ``ring_wait`` ran out: ``make gpu-test`` stalled under a 640-MiB cap, 2026-12-04.) Here the
    decoder's GPU parts are stand-ins: one slot, which a call gets back only once the call before it is posted. The
    calls made from Python (``native`` False) post each call's images before the next call too."""
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import nullcontext
    from types import SimpleNamespace

    from gpubatch.engine.codecs.decode_buffers import _Job
    from gpubatch.engine.codecs.decode_calls import DecodeCalls

    posted: list = []
    slot_back = threading.Semaphore(1)
    order: list = []

    class Instance:
        waited = 0.0  # (HwBatchDecoder's seconds waiting for its previous call, read around a call from Python)

        def submit(self, driver, sources, outputs, stream, fmt, regions=None, args=None, publish=None):
            order.append(("queued", tuple(sources)))
            return SimpleNamespace(call=SimpleNamespace(wait_ns=0), sources=tuple(sources))

        @staticmethod
        def finish(pending):
            return True, 0.001

        def decode(self, sources, outputs, stream, fmt, regions=None, args=None):
            order.append(("queued", tuple(sources)))

    class Decoder(DecodeCalls):
        pass

    dec = Decoder()
    finishing = ThreadPoolExecutor(1)
    dec.__dict__.update(
        cp=SimpleNamespace(cuda=SimpleNamespace(Device=lambda i: nullcontext())), device_index=0, _hw_coming=0,
        _warming=False, grow_hw=False, _driver=object() if native else None, _hw_finish=finishing, _cold=set(),
        settings=Settings(),
        lib=SimpleNamespace(destroy=lambda streams, images: None),
        timings={"hw_queue": 0.0, "hw_nvjpeg": 0.0, "hw_first_calls": 0.0, "hw_gpu_wait": 0.0, "hw": 0.0,
                 "hw_nvjpeg_cpu": 0.0},
        _hw_instance=lambda pool, kind: Instance(), hw_direct=[], _learn=lambda kinds, idx, ok: [],
        _call_event=lambda owner: None, _part_owner=lambda job: None)

    def take_slot(job, k):  # (the ring's one slot: back once the call before is posted and read)
        assert slot_back.acquire(timeout=5), f"call {k} waited for its slot: the call before was never posted"
        order.append(("slot", k))
        return SimpleNamespace(slot=None, event=None)

    def publish(job, done, owner, event=None):
        posted.append([i for i, _ in done])
        order.append(("posted", tuple(i for i, _ in done)))
        slot_back.release()

    ends: list = []
    dec.__dict__.update(_take_slot=take_slot, _publish=publish,
                        _end_part=lambda job, retry, blobs, regions, kinds: ends.append(retry))
    job = _Job(True, [[0, 1], [2, 3], [4, 5], [6]], stream=None, consumer=None, direct=True)
    job.slots = [object()] * 4
    job.sources = {i: (1000 + i, 10) for i in range(7)}
    job.outputs = {i: (2000 + i, 30) for i in range(7)}
    try:
        dec._run(job, [b""] * 7, None, ["4:2:0"] * 7)
        finishing.submit(int).result(10)
    finally:
        finishing.shutdown(wait=True)
    assert posted == [[0, 1], [2, 3], [4, 5], [6]] and ends == [[]]
    assert [e[0] for e in order][:4] == ["slot", "queued", "posted", "slot"]  # (call 0 posted before call 1's slot)
