"""The ctypes declarations of nvImageCodec's C API (no GPU needed): layouts and host addresses."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gpubatch.engine.codecs import nvimgcodec_c as capi
from gpubatch.engine.codecs.decode_buffers import _host_address
from gpubatch.engine.settings import Settings


def test_structure_layouts_match_the_0_9_header():
    """Sizes and offsets as gcc lays out nvimgcodec.h of nvImageCodec 0.9 (x86-64): a field added,
    dropped or retyped here would shift everything after it and corrupt the library's reads."""
    assert ctypes.sizeof(capi._ImageInfo) == 2160
    assert (capi._ImageInfo.orientation.offset, capi._ImageInfo.plane_info.offset) == (296, 344)
    assert (capi._ImageInfo.buffer.offset, capi._ImageInfo.cuda_stream.offset) == (2136, 2152)
    assert ctypes.sizeof(capi._PlaneInfo) == 56
    assert ctypes.sizeof(capi._Region) == 112
    assert (ctypes.sizeof(capi._CodeStreamView), capi._CodeStreamView.bitstream_offset.offset) == (152, 144)
    assert ctypes.sizeof(capi._Backend) == 64
    assert (ctypes.sizeof(capi._ExecutionParams), capi._ExecutionParams.backends.offset) == (80, 72)
    assert ctypes.sizeof(capi._DecodeParams) == 32
    assert (ctypes.sizeof(capi._InstanceCreateInfo), capi._InstanceCreateInfo.message_category.offset) == (64, 60)


@pytest.mark.parametrize("kind", ["bytes", "view", "readonly", "bytearray"])
def test_host_address_points_at_the_bytes(kind):
    data = bytes(range(256)) * 3
    shm = bytearray(b"x" * 100 + data)
    blob = {"bytes": data, "view": np.frombuffer(shm, np.uint8, len(data), 100),
            "readonly": memoryview(data), "bytearray": bytearray(data)}[kind]
    addr, size, keep = _host_address(blob)
    assert size == len(data) and keep is not None
    assert ctypes.string_at(addr, size) == data


def test_part_buffers_take_few_sizes_so_freed_ones_are_reused():
    """A part's buffer is rounded up to a quarter of its leading power of two (at least
    ``slab_round``), and takes the size of the largest part before it unless that is over a third
    larger; each decoder keeps its own largest size."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.decode_buffers import DecodeBuffers

    mib = 1 << 20
    dec = SimpleNamespace(_slab_cap={True: 0, False: 0}, settings=Settings())
    size = lambda hw, need: DecodeBuffers._slab_size(dec, hw, need) // mib  # noqa: E731
    assert size(True, 1) == Settings().slab_round // mib   # an empty or tiny part still gets a buffer
    assert size(True, 70 * mib) == 80                     # 16 MiB steps from 64 MiB
    assert size(True, 41 * mib) == 48                     # 8 MiB steps from 32: far smaller, its own size
    assert size(True, 61 * mib) == 80                     # within a third of the largest: its size
    assert dec._slab_cap[True] == 80 * mib
    assert size(True, 100 * mib) == 112 and dec._slab_cap[True] == 112 * mib   # a larger one raises it
    assert size(False, 40 * mib) == 40                    # the other decoder has its own


def test_chunks_split_each_call_evenly():
    from gpubatch.engine.codecs.decode_buffers import _pieces

    assert _pieces(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert _pieces(list(range(8)), 8) == [list(range(8))]
    assert _pieces(list(range(9)), 8) == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    assert _pieces([], 3) == [[]]


def test_a_part_becomes_the_calls_chunked_decode_makes(monkeypatch):
    """Each kind's list in pieces of at most ``chunk`` (the hardware engine's: ``hw_chunk``), and at
    least ``min_calls`` calls (1 by default: whole calls)."""
    from gpubatch.engine.codecs.decode_buffers import _call_lists

    st = Settings()
    assert st.hw_chunk == 256 and st.min_calls == 1
    assert [len(c) for c in _call_lists([list(range(128))], True, 64, st)] == [128]  # a kind whole
    assert [len(c) for c in _call_lists([list(range(130)), list(range(130, 180))], True, 64, st)] == [130, 50]
    assert [len(c) for c in _call_lists([list(range(136))], False, 64, st)] == [46, 45, 45]
    assert _call_lists([list(range(77))], False, 256, st) == [list(range(77))]  # the default chunk: the part whole
    st = Settings(min_calls=2)
    assert [len(c) for c in _call_lists([list(range(128))], True, 64, st)] == [64, 64]  # one kind: two calls at least
    assert [len(c) for c in _call_lists([list(range(85)), list(range(85, 128))], True, 64, st)] == [85, 43]
    assert _call_lists([list(range(50))], False, 96, st) == [list(range(25)), list(range(25, 50))]  # two at least
    assert _call_lists([[5]], False, 96, st) == [[5]]


def test_ring_banks_give_a_parts_calls_the_slots_of_its_bank_in_turn():
    """One slot a call (the default): call k of every part takes slot k. With ``ring_banks`` 2 a decoder's parts
    take two banks of slots in turn (interleaved in its ring), so a part is decoded into one bank while the part
    before is still read from the other; ``hw_ring`` (slots taken in turn, a capped pipeline's) leaves banks aside."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from gpubatch.engine.codecs.decode_buffers import DecodeBuffers, _Job

    def slots_of(settings: Settings, calls_per_part: list[int]) -> list[list[int]]:
        dec = SimpleNamespace(settings=settings, _rings={True: [], False: []}, _ring_turn={True: 0, False: 0},
                              _ring_part={True: 0, False: 0}, _batch=([], {}), device_index=0,
                              _describe=lambda *a: None,
                              cp=SimpleNamespace(cuda=SimpleNamespace(
                                  Device=lambda i: nullcontext(),
                                  runtime=SimpleNamespace(mallocAsync=lambda size, stream: 4096))))
        dec._most_bytes = lambda idx, total: 0
        out = []
        for calls in calls_per_part:
            job = _Job(True, [[0]] * calls, stream=SimpleNamespace(ptr=0), consumer=None)
            for _ in range(calls):
                DecodeBuffers._ring_bind(dec, job, [0], {0: (8, 8)}, {}, {0: 192})
            out.append([dec._rings[True].index(s) for s in job.slots])
        return out

    assert slots_of(Settings(), [1, 2, 1, 3]) == [[0], [0, 1], [0], [0, 1, 2]]
    assert slots_of(Settings(ring_banks=2), [1, 2, 1, 3, 1]) == [[0], [1, 3], [0], [1, 3, 5], [0]]
    assert slots_of(Settings(ring_banks=3), [2, 2, 2, 2]) == [[0, 3], [1, 4], [2, 5], [0, 3]]
    assert slots_of(Settings(ring_banks=2, hw_ring=3), [2, 2]) == [[0, 1], [2, 0]]


def test_fixed_size_chains_are_found():
    """Chains that end in one resample to a size that does not depend on the image's are run chunk
    by chunk (ImagePipeline); the others whole."""
    from gpubatch.engine.ops import CenterCrop, Flip, Normalize, RandomResizedCrop, Resize, ResizeShorter
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.windows import fixed_window_chain

    fixed = lambda *ops: fixed_window_chain(Plan(ops=ops))  # noqa: E731
    idx, norm, size = fixed(RandomResizedCrop(224), Flip(), Normalize(layout="CHW", dtype="float16"))
    assert (idx, size, norm.dtype) == ([0, 1], (224, 224), "float16")
    assert fixed(ResizeShorter(256), CenterCrop(224))[1:] == (None, (224, 224))
    assert fixed(Resize(97, 311))[2] == (97, 311)
    assert fixed(ResizeShorter(256)) is None  # the output follows the image's aspect
    assert fixed(Flip()) is None


def test_library_path_says_what_is_missing(monkeypatch, tmp_path):
    """No nvImageCodec wheel, or one without the C library where the wheel puts it: a one-line
    DependencyError naming what is missing (the package is looked up, not imported)."""
    import importlib.util
    from types import SimpleNamespace

    from gpubatch.errors import DependencyError

    real = importlib.util.find_spec
    found: dict = {"spec": None}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: found["spec"] if name == "nvidia.nvimgcodec" else real(name, *a))
    with pytest.raises(DependencyError, match="need nvImageCodec"):
        capi.library_path()
    found["spec"] = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    with pytest.raises(DependencyError, match="libnvimgcodec.so.0"):
        capi.library_path()


def test_headers_and_image_descriptors_from_two_threads_keep_their_own_values():
    """The decoder's two threads read headers and fill image descriptors at once, the GIL passing
    between them at any statement: each must get its own image's values (scratch structures shared
    between threads once mixed them, and the CUDA decoder failed the mixed images)."""
    import sys
    import threading

    from tests.helpers import jpeg_bytes, photo

    try:
        lib = capi.library()
    except Exception as e:  # noqa: BLE001 - no nvImageCodec here (CI): nothing to test against
        pytest.skip(f"nvImageCodec's library is not loadable: {e}")
    get = lib.fast.nvimgcodecImageGetImageInfo
    get.argtypes, get.restype = [ctypes.c_void_p, ctypes.POINTER(capi._ImageInfo)], ctypes.c_int
    blobs = [jpeg_bytes(photo(40 + 30 * k, 200 - 40 * k, seed=k)) for k in range(2)]
    wrong: list[str] = []

    def run(k: int) -> None:
        data = blobs[k]
        info = capi._new(capi._ImageInfo, capi._T_IMAGE_INFO)
        for n in range(3000):
            cs = lib.code_stream(ctypes.cast(data, ctypes.c_void_p).value, len(data))
            hdr = lib.header(cs)
            if (hdr.width, hdr.height) != (200 - 40 * k, 40 + 30 * k):
                wrong.append(f"thread {k}: header {hdr.width}x{hdr.height}")
            ptr = (k + 1) << 40 | n << 12
            img = lib.image(ptr, 10 + k, 20 + k, 60 + 3 * k, 0, (90 * k, 0, 0))
            info.struct_next = None
            get(img, ctypes.byref(info))
            p = info.plane_info[0]
            if (info.buffer, p.height, p.width, p.row_stride, info.orientation.rotated) != (ptr, 10 + k, 20 + k, 60 + 3 * k,
                                                                                          90 * k):
                wrong.append(f"thread {k}: image {info.buffer:#x} {p.height}x{p.width}")
            lib.destroy([cs], [img])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong, wrong[:5]


def test_a_batch_of_code_streams_and_descriptors_equals_them_one_by_one():
    """``open_streams`` and ``images`` (a batch part at a time) make a new handle per image, with the
    values ``code_stream``/``header``/``image`` give one by one; what is not an image gives None.
    (nvImageCodec re-initializes a handle left in the output argument instead of making a new one:
    reused out-arguments once gave every image of a batch the same handle, which crashed on destroy.)"""
    from gpubatch.engine.codecs.decode_buffers import _host_address
    from tests.helpers import jpeg_bytes, photo

    try:
        lib = capi.library()
    except Exception as e:  # noqa: BLE001 - no nvImageCodec here (CI): nothing to test against
        pytest.skip(f"nvImageCodec's library is not loadable: {e}")
    blobs = [jpeg_bytes(photo(30 + 7 * k, 50 - 3 * k, seed=k)) for k in range(5)] + [b"not an image at all"]
    hosts = [_host_address(b) for b in blobs]
    sources = [(a, n, (2, 3, 20, 30) if k == 2 else None) for k, (a, n, _) in enumerate(hosts)]
    opened = lib.open_streams(sources)
    assert opened[-1] is None
    handles = [o[0] for o in opened[:-1]]
    assert len(set(handles)) == len(handles) and all(handles)
    for k, (_, h, w, turn) in enumerate(opened[:-1]):
        one = lib.code_stream(*sources[k])
        hdr = lib.header(one)
        assert (h, w, turn) == (hdr.height, hdr.width, hdr.orientation)
        if k != 2:  # (item 2 is a region of its image)
            assert (h, w) == (30 + 7 * k, 50 - 3 * k)
        lib.destroy([one], [])
    specs = [((k + 1) << 20, 10 + k, 20 + k, 60 + 3 * k, (90 * (k % 2), 0, k % 2)) for k in range(4)]
    imgs = lib.images(specs, 0)
    assert len(set(imgs)) == 4 and all(imgs)
    get = lib.fast.nvimgcodecImageGetImageInfo
    get.argtypes, get.restype = [ctypes.c_void_p, ctypes.POINTER(capi._ImageInfo)], ctypes.c_int
    info = capi._new(capi._ImageInfo, capi._T_IMAGE_INFO)
    for img, (ptr, h, w, row, (rot, fx, fy)) in zip(imgs, specs):
        info.struct_next = None
        get(img, ctypes.byref(info))
        p, o = info.plane_info[0], info.orientation
        assert (info.buffer, p.height, p.width, p.row_stride, o.rotated, o.flip_x, o.flip_y) == (ptr, h, w, row, rot,
                                                                                                   fx, fy)
    lib.destroy(handles, imgs)


@pytest.mark.parametrize("takes, expect", [("slowest", {"baseline/4:4:4": 25, "baseline/4:2:2": 5}),
                                           ("cheapest", {"baseline/4:2:0": 30})])
def test_the_cuda_decoders_share_comes_from_the_kinds_its_order_names(takes, expect):
    """The CUDA decoder takes ``cuda_share`` of the batch: from the kinds the hardware engine is
    slowest on, or from those its own host threads decode cheapest; what the hardware engine refuses
    (progressive) goes to the CUDA decoder whatever the share."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.decode_routing import DecodeRouting

    groups, at = {}, 0
    for kind, n in [("baseline/4:2:0", 50), ("baseline/4:2:2", 25), ("baseline/4:4:4", 25), ("progressive/4:2:0", 2)]:
        groups[kind], at = list(range(at, at + n)), at + n
    dec = SimpleNamespace(hw=None, hw_cs=[], hw_direct=[object()], hw_refuses=set(), cuda_share=32 / 102,
                          cuda_takes=takes, settings=Settings())
    hw_lists, cuda = DecodeRouting._split(dec, groups)
    kind_of = {i: k for k, idx in groups.items() for i in idx}
    taken: dict[str, int] = {}
    for i in cuda:
        taken[kind_of[i]] = taken.get(kind_of[i], 0) + 1
    assert taken == {**expect, "progressive/4:2:0": 2}
    assert sorted(i for lst in hw_lists for i in lst) == sorted(set(range(102)) - set(cuda))
    assert all(len({kind_of[i] for i in lst}) == 1 for lst in hw_lists)  # one kind per hardware call


def test_each_kind_keeps_its_hardware_instances():
    """A call goes to an instance whose last call was of its kind (or an unused one), least recently
    used first: kinds as many as instances get one each; a kind alone alternates over all of them;
    a kind more than instances takes the least recently used one. Instances past ``_hw_first`` (the
    split route after the hardware route added them) are spares: taken only by a kind none of the
    first has."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    def run(pool: list, calls: list[str], first: int | None = None) -> list[int]:
        dec = SimpleNamespace(_hw_turn=0, _hw_last={}, _hw_first=len(pool) if first is None else first)
        return [pool.index(GpuImageDecoder._hw_instance(dec, pool, k)) for k in calls]

    two, three = [object(), object()], [object(), object(), object()]
    assert run(three, ["420", "422", "444"] * 3) == [0, 1, 2] * 3
    assert run(two, ["420", "422"] * 3) == [0, 1] * 3
    assert run(two, ["420"] * 5) == [0, 1, 0, 1, 0]
    assert run(two, ["420", "422", "420", "444", "420", "422"]) == [0, 1, 0, 1, 0, 1]
    assert run(three, ["420", "gray", "420", "420", "gray"]) == [0, 1, 2, 0, 1]
    assert run(three, ["420", "422"] * 3, first=2) == [0, 1] * 3  # the spare left alone
    assert run(three, ["420"] * 4, first=2) == [0, 1, 0, 1]
    assert run(three, ["420", "422", "444"] * 2, first=2) == [0, 1, 2] * 2  # a third kind takes it


def test_a_part_of_more_kinds_than_instances_gets_an_instance_a_kind():
    """With ``hw_per_kind`` (and no memory cap), a hardware part of more kinds than the engine has instances
    makes one more instance a kind, up to ``hw_only_instances``; the new ones are spares, so each kind then
    keeps an instance of its own. Without it, or with no hardware instance at all, nothing is made."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.hw_instances import HwInstances
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    def decoder(grow: bool, pool: list) -> SimpleNamespace:
        dec = SimpleNamespace(hw_direct=pool, hw_cs=[], grow_hw=grow, settings=Settings(hw_only_instances=3),
                              _hw_turn=0, _hw_last={}, _hw_first=2)
        dec._more_hw = lambda n, direct: dec.hw_direct.extend(object() for _ in range(n))
        return dec

    dec = decoder(True, [object(), object()])
    HwInstances._enough_hw(dec, 2)
    assert len(dec.hw_direct) == 2  # (as many kinds as instances)
    HwInstances._enough_hw(dec, 5)
    assert len(dec.hw_direct) == 3  # (at most hw_only_instances)
    pool = dec.hw_direct
    assert [pool.index(GpuImageDecoder._hw_instance(dec, pool, k)) for k in ["420", "422", "444"] * 2] == [0, 1, 2] * 2
    for grow, pool in ((False, [object(), object()]), (True, [])):
        dec = decoder(grow, pool)
        HwInstances._enough_hw(dec, 3)
        assert len(dec.hw_direct) == len(pool)

    def failing(n: int, direct: bool) -> None:
        raise RuntimeError("out of memory")

    dec = decoder(True, [object(), object()])
    dec._more_hw = failing
    with pytest.warns(RuntimeWarning, match="no more hardware-engine instances"):
        HwInstances._enough_hw(dec, 3)
    assert dec.grow_hw is False and len(dec.hw_direct) == 2  # (the two decode on; no second try)


def test_the_instances_a_start_makes_later_are_taken_as_they_come(monkeypatch):
    """A decoder that takes the worker's start's instances as they come (``hw_later``) is built on those made
    so far and counts the rest as coming; before a part's calls it asks for them and takes those made since;
    where the start ended short, it makes the rest itself, or says in a warning why not and decodes on."""
    import threading
    from types import SimpleNamespace

    from gpubatch.engine.codecs import hw_instances
    from gpubatch.engine.codecs.nvjpeg_hw import NvjpegError
    from gpubatch.engine.gpu import start

    first, second = object(), object()
    begun = SimpleNamespace(hw=[first], first=threading.Event(), go=threading.Event(), hw_done=threading.Event())
    begun.first.set()  # (the first instance and the library made; the others not asked for yet)
    monkeypatch.setitem(start._STARTS, 9, begun)
    dec = SimpleNamespace(device_index=9, hw_later=True, _hw_coming=0, _cold=set(), cp=None)
    dec.hw_direct = hw_instances.HwInstances._direct_instances(dec, 3)
    assert dec.hw_direct == [first] and dec._hw_coming == 2 and not begun.go.is_set()
    hw_instances.HwInstances._adopt_hw(dec)  # (none made since: none taken, the rest asked for)
    assert begun.go.is_set() and dec.hw_direct == [first] and dec._hw_coming == 2
    begun.hw.append(second)
    hw_instances.HwInstances._adopt_hw(dec)
    assert dec.hw_direct == [first, second] and dec._hw_coming == 1 and dec._cold == {id(second)}
    assert not begun.hw  # (taken once)

    def refused(cp):
        raise NvjpegError("nvjpegCreateEx", 5)

    monkeypatch.setattr(hw_instances, "HwBatchDecoder", refused)
    begun.hw_done.set()  # the start ended one short
    with pytest.warns(RuntimeWarning, match="no more hardware-engine instances"):
        hw_instances.HwInstances._adopt_hw(dec)
    assert dec.hw_direct == [first, second] and dec._hw_coming == 0


def test_the_warm_up_calls_make_no_instance_a_kind():
    """The warm-up's calls (``first_call``: tiny JPEGs of every kind) run with ``grow_hw`` off, so only real
    batches' kinds make instances; the setting is back afterwards, also where the call fails."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder, tiny_jpegs

    seen = []

    def run(job, blobs, regions, kinds):
        seen.append(dec.grow_hw)
        if len(seen) == 2:
            raise RuntimeError("the call failed")

    done = SimpleNamespace(result=lambda: None)
    sync = SimpleNamespace(synchronize=lambda: None)
    dec = SimpleNamespace(grow_hw=True, hw_direct=[object()], hw_stream=sync, cuda_stream=sync,
                          _prepare=lambda *a, **k: object(), _run=run,
                          _cuda_thread=SimpleNamespace(submit=lambda f: done), _hw_finish=None)
    GpuImageDecoder.first_call(dec, True, tiny_jpegs(6))
    with pytest.raises(RuntimeError, match="the call failed"):
        GpuImageDecoder.first_call(dec, False, tiny_jpegs(6))
    assert seen == [False, False] and dec.grow_hw is True


@pytest.mark.parametrize("planes, regions, later", [(True, False, False), (False, False, False), (False, True, False),
                                                    (False, False, True)])
def test_the_warm_up_makes_plane_and_region_calls_only_where_asked(planes, regions, later):
    """The warm-up makes a call into planes on each hardware instance only with ``planes`` (``convert``'s GPU
    image unit, which never decodes into planes, leaves them out) and region calls only with ``regions``;
    the hardware calls come either way, and the CUDA decoder's, made and waited for, or with ``cuda_later``
    queued on its thread as a warm-up's part (its seconds not a run's) and not waited for; each step's seconds
    are kept."""
    import threading
    from types import SimpleNamespace

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    calls, synced = [], []
    hw_sync = SimpleNamespace(synchronize=lambda: synced.append("hw"))
    cuda_sync = SimpleNamespace(synchronize=lambda: synced.append("cuda"))
    dec = SimpleNamespace(lib=object(), hw_cs=[], hw_direct=[object(), object()], settings=Settings(), hw=None,
                          cuda=None, hw_stream=hw_sync, cuda_stream=cuda_sync, _calling=threading.Lock(),
                          _hw_last={}, _hw_coming=0, warm_steps={},
                          first_call=lambda hw, blobs, planes=False, regions=None, queued=False: calls.append(
                              ("hw" if hw else "cuda", planes, regions is not None, queued)))
    GpuImageDecoder.warm_up(dec, 8, regions=regions, planes=planes, cuda_later=later)
    assert calls.count(("hw", False, False, False)) == 2
    assert calls.count(("hw", True, False, False)) == (2 if planes else 0)
    assert calls.count(("hw", False, True, False)) == (2 if regions else 0)
    assert calls.count(("cuda", False, False, later)) == 1 and ("cuda" in synced) != later
    assert set(dec.warm_steps) == {"hardware", "hardware: planes", "hardware: regions",
                                   "cuda (queued)" if later else "cuda", "nvImageCodec"}

    # without the C API (nvImageCodec's Python decoders alone) nothing is queued: their calls are waited for
    calls.clear(), synced.clear()
    dec.lib, dec.hw_direct, dec.warm_steps = None, [], {}
    GpuImageDecoder.warm_up(dec, 8, regions=regions, planes=planes, cuda_later=later)
    assert calls == [] and synced == ["hw", "cuda"] and set(dec.warm_steps) == {"nvImageCodec"}


def test_a_queued_first_call_goes_to_the_cuda_decoders_thread_as_a_warm_up_part():
    """``first_call(False, ..., queued=True)`` hands the CUDA decoder's part to that decoder's thread, marked as a
    warm-up's (its seconds not a run's), and neither runs it nor waits for anything itself."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder, tiny_jpegs

    queued = []
    dec = SimpleNamespace(hw_direct=[object()], hw_stream=None, grow_hw=True,
                          _prepare=lambda hw, blobs, regions, lists, consumer, plane_kinds=None: SimpleNamespace(
                              hw=hw, lists=lists, warm=False),
                          _run=object(), _hw_finish=None,
                          _cuda_thread=SimpleNamespace(submit=lambda fn, job, *a: queued.append((fn, job))))
    GpuImageDecoder.first_call(dec, False, tiny_jpegs(6), queued=True)
    ((fn, job),) = queued
    assert fn is dec._run and not job.hw and job.warm and job.lists == [list(range(6))] and dec.grow_hw


def test_calls_are_cut_by_their_decoded_bytes_under_a_budget():
    """With ``call_bytes`` (a memory cap's plan) a kind's list is cut where its decoded bytes would pass
    the budget as well as by count; an image larger than the budget is a call alone; where the even
    pieces by count fit, they are kept."""
    from gpubatch.engine.codecs.decode_buffers import _byte_pieces, _call_lists

    mib = 1 << 20
    small = {i: mib for i in range(40)}
    assert _byte_pieces(list(range(40)), 256, 10 * mib, small) == [list(range(a, min(a + 10, 40)))
                                                                    for a in range(0, 40, 10)]
    mixed = {0: mib, 1: 30 * mib, 2: mib, 3: mib, 4: 9 * mib, 5: mib}
    assert _byte_pieces(list(range(6)), 256, 10 * mib, mixed) == [[0], [1], [2, 3], [4, 5]]
    assert _byte_pieces(list(range(8)), 4, 100 * mib, small) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # count: even
    assert _byte_pieces([7, 9], 256, mib, {}) == [[7, 9]]  # items not sized (failed to open) count nothing
    st = Settings(call_bytes=10 * mib)
    calls = _call_lists([list(range(25)), list(range(25, 40))], False, 256, st, small)
    assert [len(c) for c in calls] == [10, 10, 5, 10, 5] and sum(calls, []) == list(range(40))
    assert all(sum(small[i] for i in c) <= 10 * mib for c in calls)
    assert _call_lists([list(range(25))], False, 256, st) == [list(range(25))]  # no sizes: by count
    assert _call_lists([list(range(25))], False, 256, Settings(), small) == [list(range(25))]  # no budget



@pytest.mark.parametrize("share", [0.0, 32 / 102])
def test_kinds_named_for_the_cuda_decoder_go_there_by_their_header(share):
    """``cuda_kinds`` (GPUBATCH_CUDA_KINDS): those kinds go to the CUDA decoder whatever the batch holds, on the
    hardware route (share 0) as on the split route; the hardware engine keeps a call per kind of the rest."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.decode_routing import DecodeRouting

    groups, at = {}, 0
    for kind, n in [("baseline/4:2:0", 50), ("baseline/4:2:2", 25), ("baseline/4:4:4", 25)]:
        groups[kind], at = list(range(at, at + n)), at + n
    settings = Settings.from_env({"GPUBATCH_CUDA_KINDS": "baseline/4:4:4"})
    dec = SimpleNamespace(hw=None, hw_cs=[], hw_direct=[object()], hw_refuses=set(), cuda_share=share,
                          cuda_takes="slowest", settings=settings)
    hw_lists, cuda = DecodeRouting._split(dec, groups)
    assert set(groups["baseline/4:4:4"]) <= set(cuda)
    assert not set(groups["baseline/4:4:4"]) & {i for lst in hw_lists for i in lst}
    if share == 0.0:  # the hardware route: nothing else moves
        assert sorted(cuda) == groups["baseline/4:4:4"] and len(hw_lists) == 2
    # the same images of a kind go the same way in any batch: half the batch routes its 4:4:4 images alike
    half = {k: v[: len(v) // 2] for k, v in groups.items()}
    assert set(DecodeRouting._split(dec, half)[1]) >= set(half["baseline/4:4:4"])
    from gpubatch.errors import UsageError

    with pytest.raises(UsageError, match="GPUBATCH_CUDA_KINDS"):
        Settings.from_env({"GPUBATCH_CUDA_KINDS": "4:4:4"})


def test_an_image_left_to_the_cpu_gives_the_region_the_feed_cut():
    """A CMYK JPEG is upright with a known size, so a feed cuts its region (and moves its window into it),
    but no GPU decoder takes its kind: the CPU decodes it, and hands over that region alone, as the GPU
    decoders would. A region outside the image is that image's error, not a misplaced window."""
    import io

    from PIL import Image

    from gpubatch.engine.codecs import image as host
    from gpubatch.engine.codecs.headers import jpeg_facts
    from gpubatch.engine.codecs.image_gpu import _host_decode

    rgb = np.random.default_rng(3).integers(0, 256, (120, 160, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    size, (kind, _, _), turn = jpeg_facts(data)
    assert size == (120, 160) and turn == 1 and kind is None  # (cut by a feed; left to the CPU by the decoders)
    whole = host.decode(data, 0)
    got, err = _host_decode(data, 0, (10, 20, 90, 150))
    assert err is None and got.flags.c_contiguous and np.array_equal(got, whole[10:90, 20:150])
    assert np.array_equal(_host_decode(data, 0)[0], whole)
    bad, err = _host_decode(data, 0, (10, 20, 130, 150))
    assert bad is None and "outside its 160x120 pixels" in err
