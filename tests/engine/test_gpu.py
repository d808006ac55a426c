"""GPU kernels and codecs against their CPU references (marked gpu: skipped without a usable GPU)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from gpubatch import convert
from gpubatch.api import open_dataset
from gpubatch.engine.codecs import image as host
from gpubatch.engine.device import resolve
from gpubatch.engine.ops import CenterCrop, Flip, Normalize, RandomResizedCrop, Resize, ResizeShorter, Window
from gpubatch.engine.ops.normalize import normalize_cpu
from gpubatch.engine.plan import Plan
from gpubatch.engine.settings import Settings
from tests.conftest import SAMPLE
from tests.helpers import child_env, jpeg_bytes, photo

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine():
    from gpubatch.engine.gpu.engine import GpuEngine

    eng = GpuEngine(resolve("gpu"), cpu_threads=4, decode_route="split")  # (made before the autouse fixtures)
    yield eng
    eng.close()


def _windows(plan: Plan, key: str, h: int, w: int):
    from gpubatch.pipelines.image import chain_windows

    return chain_windows(plan.ops, plan.draw(key, h, w), h, w)


def _cpu_chain(plan: Plan, key: str, img: np.ndarray):
    from gpubatch.engine.registry import HOST, get_kernel

    for op, p in zip(plan.ops, plan.draw(key, *img.shape[:2])):
        img = get_kernel(op.name, HOST)(op, [img], [p])[0]
    return img


CHAINS = {
    "val": (ResizeShorter(256), CenterCrop(224)),
    "train": (RandomResizedCrop(224), Flip(p=0.5)),
    "resize": (Resize(97, 311),),
    "upscale": (ResizeShorter(600),),
    "pad": (CenterCrop(400),),
    "vflip": (Flip(horizontal=False, vertical=True, p=1.0),),
}
SIZES = [(375, 500), (500, 333), (97, 1003), (1, 1), (17, 5), (224, 224)]


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_resample_matches_cpu(engine, chain):
    import cupy as cp

    plan = Plan(ops=CHAINS[chain], seed=7)
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]
    copies = [im.copy() for im in imgs]
    dev = [cp.asarray(im) for im in imgs]
    wins = [_windows(plan, f"k{i}", *im.shape[:2])[0] for i, im in enumerate(imgs)]
    batch = engine.launch.resample(dev, wins)
    engine.stream.synchronize()
    for i, im in enumerate(imgs):
        ref = _cpu_chain(plan, f"k{i}", im)
        got = batch.item(i).get()
        assert got.shape == ref.shape
        diff = np.abs(got.astype(int) - ref.astype(int))
        assert diff.max() <= 3 and diff.mean() < 0.6, (chain, SIZES[i], diff.max(), diff.mean())
        assert np.array_equal(imgs[i], copies[i])  # input untouched
        assert np.array_equal(dev[i].get(), copies[i])


def test_batched_equals_one_by_one_and_empty(engine):
    import cupy as cp

    plan = Plan(ops=CHAINS["train"], seed=1)
    imgs = [cp.asarray(photo(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]
    wins = [_windows(plan, f"k{i}", *im.shape[:2])[0] for i, im in enumerate(imgs)]
    together = engine.launch.resample(imgs, wins)
    for i in range(len(imgs)):
        alone = engine.launch.resample([imgs[i]], [wins[i]])
        assert cp.array_equal(together.item(i), alone.item(0))
    assert len(engine.launch.resample([], [])) == 0


def test_fused_normalize_fp16_chw(engine):
    import cupy as cp

    norm = Normalize(layout="CHW", dtype="float16")
    plan = Plan(ops=(ResizeShorter(256), CenterCrop(224), norm))
    imgs = [photo(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]
    wins = [_windows(plan, "k", *im.shape[:2]) for im in imgs]
    batch = engine.launch.resample([cp.asarray(im) for im in imgs], [w for w, _ in wins], norm)
    out = batch.stacked().get()
    assert out.shape == (len(imgs), 3, 224, 224) and out.dtype == np.float16
    for i, im in enumerate(imgs):
        ref = normalize_cpu(_cpu_chain(Plan(ops=plan.ops[:2]), "k", im), Normalize(layout="CHW", dtype="float32"))
        np.testing.assert_allclose(out[i].astype(np.float32), ref, atol=0.06)


def test_gpu_decode_matches_pillow(engine):
    blobs = [p.read_bytes() for p in sorted((SAMPLE / "imagenet").rglob("*.*"))]
    res = engine.decoder.decode(blobs, engine.stream)
    engine.stream.synchronize()
    assert all(e is None for e in res.errors)
    assert res.on_gpu >= 50 and res.on_gpu + res.fallbacks == len(blobs)
    for b, a in zip(blobs, res.arrays):
        ref = host.decode(b)
        got = a.get()
        assert got.shape == ref.shape  # EXIF orientation applied on both
        assert np.abs(got.astype(int) - ref.astype(int)).mean() < 3.0


def test_c_api_decoder_equals_python_binding():
    """The decoder through nvImageCodec's C API (one device buffer per batch) gives the pixels of the
    Python binding, with the same routing, EXIF orientation, regions and fallbacks."""
    from gpubatch.engine.codecs.headers import jpeg_kind
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    blobs = [p.read_bytes() for p in sorted((SAMPLE / "imagenet").rglob("*.*"))]
    for i in range(12):
        sub = ("4:2:0", "4:2:2", "4:4:4")[i % 3]
        blobs.append(jpeg_bytes(photo(150 + 7 * i, 230 - 3 * i, seed=i), 80 + i, subsampling=sub))
    blobs.append(jpeg_bytes(photo(120, 170, seed=40)[..., 0], 85))  # gray
    blobs += [blobs[-2][:300], b"not an image"]
    regions = []
    for i, b in enumerate(blobs):
        _, w, h = jpeg_kind(b)
        regions.append((i % 5, i % 7, h - i % 3, w - 1) if i % 2 and h > 8 and w > 8 else None)
    out = {}
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    for api in ("python", "c"):
        dec = GpuImageDecoder(0, 4, api=api, hw_direct=False)  # the same hardware decoder (the direct path: below)
        for name, reg in (("full", None), ("region", regions)):
            res = dec.decode(blobs, stream, regions=reg)
            stream.synchronize()
            out[api, name] = ([None if a is None else a.get() for a in res.arrays], res.errors, res.on_gpu,
                              res.fallbacks)
        dec.close()
    for name in ("full", "region"):
        (py, py_err, py_gpu, py_fb), (c, c_err, c_gpu, c_fb) = out["python", name], out["c", name]
        assert (c_gpu, c_fb) == (py_gpu, py_fb) and c_gpu >= 60
        assert [e is None for e in c_err] == [e is None for e in py_err]
        assert c_err[-1] and c_err[-2]
        for a, b in zip(py, c):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(a, b)


def test_auto_route_follows_the_free_cores(monkeypatch):
    """"auto" splits batches where ``split_min_cores`` cores are free, and gives the hardware engine
    everything (with an instance per common kind) where fewer are; the engine says which and why."""
    from gpubatch.engine.gpu.engine import GpuEngine
    from gpubatch.engine.settings import Settings

    monkeypatch.delenv("GPUBATCH_DECODE_ROUTE")
    st = Settings()
    HW_ONLY_INSTANCES, SPLIT_MIN_CORES = st.hw_only_instances, st.split_min_cores
    for cores, route, share in ((SPLIT_MIN_CORES, "split", 0.3), (SPLIT_MIN_CORES - 1, "hardware", 0.0)):
        eng = GpuEngine(resolve("gpu"), cpu_threads=4, route_cores=cores)
        try:
            dec = eng.decoder
            assert (eng.decode_route, eng.route_cores, dec.route, dec.cuda_share) == (route, cores, route, share)
            if route == "hardware":
                assert len(dec.hw_direct or dec.hw_cs) == HW_ONLY_INSTANCES
        finally:
            eng.close()
    eng = GpuEngine(resolve("gpu"), cpu_threads=4)  # measured: somewhere between none and every core
    try:
        import os

        assert 0 <= eng.route_cores <= os.cpu_count()
    finally:
        eng.close()


def test_a_split_decoder_makes_an_instance_a_kind_for_real_batches_only(tmp_path):
    """The split route starts on two hardware instances (its warm-up's tiny JPEGs of every kind make none);
    a batch whose hardware part holds three kinds makes a third, where ``hw_per_kind`` is on; one of two
    kinds there, or the setting off, makes none. The images right throughout."""
    from gpubatch.engine.settings import Settings
    from gpubatch.pipelines.image import ImagePipeline

    paths = _jpeg_files(tmp_path, 12, lambda i: (120 + 9 * i, 200 - 3 * i), lambda i: 80 + i)
    blobs, keys = [p.read_bytes() for p in paths], [p.stem for p in paths]
    ops = [ResizeShorter(72), CenterCrop(64)]
    with ImagePipeline(ops, device="cpu") as cpu:
        ref = np.stack(cpu(blobs, keys)).astype(int)
    # four of each kind: a 0.34 share takes the four 4:4:4 (two kinds left), 0.1 one of them (three left)
    for share, per_kind, made in ((0.34, True, 2), (0.1, True, 3), (0.1, False, 2)):
        st = Settings(decode_route="split", cuda_share=share, hw_per_kind=per_kind)
        with ImagePipeline(ops, device="gpu", seed=0, settings=st) as pipe:
            dec = pipe.engine.decoder
            assert len(dec.hw_direct or dec.hw_cs) == 2, share
            for _ in range(2):
                got = pipe(blobs, keys).stacked().get().astype(int)
                assert np.abs(got - ref).mean() < 1.5
            assert len(dec.hw_direct or dec.hw_cs) == made, (share, per_kind)


def test_auto_route_follows_the_load_as_the_run_goes(tmp_path, monkeypatch):
    """With "auto" the route follows the cores other processes take while the run goes (the probe of
    the host's load stands in here): split, then the hardware route two checks after the load came,
    with an instance made for each of the three kinds and both decoders' chunk buffers given back at
    each switch, then split again once it went; the images right throughout. An explicit route, or ``follow_load=False``, keeps its route."""
    from types import SimpleNamespace

    from gpubatch.engine.settings import Settings
    from gpubatch.pipelines.image import ImagePipeline

    monkeypatch.delenv("GPUBATCH_DECODE_ROUTE")
    # "auto" splits at the start: the host's free cores measured then are stood in for (a busy host,
    # as when other work runs beside the tests, would start it on the hardware route); a check every
    # batch, a route held no longer than the checks ask
    monkeypatch.setattr("gpubatch.engine.gpu.affinity.free_cores", lambda *a, **k: 64.0)
    st = Settings(split_min_cores=1.0, follow_check_s=0.0, follow_hold_s=0.0)
    paths = _jpeg_files(tmp_path, 48, lambda i: (200 + 9 * i, 330 - 3 * i), lambda i: 80 + i % 17)
    keys = [p.stem for p in paths]
    ops = [ResizeShorter(72), CenterCrop(64)]
    with ImagePipeline(ops, device="cpu") as cpu:
        ref = np.stack(cpu([p.read_bytes() for p in paths], keys))
    with ImagePipeline(ops, device="gpu", seed=0, settings=st) as pipe:
        dec = pipe.engine.decoder
        assert pipe.engine.decode_route == "split" and dec.follower is not None
        assert len(dec.hw_direct or dec.hw_cs) == 2
        load = [0.0]
        dec._probe = SimpleNamespace(take=lambda: {"others": load[0]})  # cores busy in other processes
        freed, free_slots = [], dec._free_slots

        def spy(hw, olds, wait=None):
            if wait is None:  # (a switch's; a growing buffer's own waits GROW_WAIT)
                freed.append((dec.route, hw, len(olds)))
            return free_slots(hw, olds, wait)

        dec._free_slots = spy
        kinds_on_hw = set()
        it = pipe.iterate_files(paths, keys, batch_size=16, repeat=True)
        for k in range(36):
            load[0] = 1000.0 if 8 <= k < 24 else 0.0
            got = next(it).stacked()
            pipe.stream.synchronize()
            i = (16 * k) % 48
            assert np.abs(got.get().astype(int) - ref[i : i + 16].astype(int)).mean() < 1.5
            if dec.route == "hardware":
                kinds_on_hw |= {kind for kind, _ in dec._hw_last.values()}
            if k == 22:  # well into the hardware route: the CUDA decoder's buffers were given back
                assert dec.route == "hardware" and all(sl.size == 0 for sl in dec._rings[False])
        it.close()
        assert [r for _, r, _ in dec.follower.switches] == ["hardware", "split"]
        # each switch gave back every buffer both decoders had (the hardware route's CUDA decoder: none);
        # the two decoders' threads free theirs side by side, in either order
        assert sorted((r, hw) for r, hw, n in freed if n) == [("hardware", False), ("hardware", True), ("split", True)]
        assert dec.route == "split" and dec.cuda_share == st.cuda_share and dec._hw_first == 2
        assert len(dec.hw_direct or dec.hw_cs) == st.hw_only_instances
        assert dec.route_batches["hardware"] >= 8 and dec.route_batches["split"] >= 8
        assert kinds_on_hw == {"baseline/4:2:0", "baseline/4:2:2", "baseline/4:4:4"}
    for kw in ({"follow_load": False}, {"decode_route": "split"}):
        with ImagePipeline(ops, device="gpu", warm_up=0, **kw) as pipe:
            assert pipe.engine.decoder.follower is None


@pytest.mark.parametrize("direct", [True, False])
def test_hardware_route_gives_the_engine_every_kind_an_instance_each(direct):
    """Route "hardware": the hardware engine decodes every kind it takes, each kind always on the same
    instance of its own, the CUDA decoder only what the engine does not take or fails; the pixels are
    the split route's within the two decoders' difference, and Pillow's."""
    import cupy as cp

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder
    from gpubatch.engine.settings import Settings

    HW_ONLY_INSTANCES = Settings().hw_only_instances

    rng = np.random.default_rng(7)
    kinds = ("4:2:0", "4:2:2", "4:4:4")
    blobs = [jpeg_bytes(photo(int(rng.integers(90, 260)), int(rng.integers(90, 260)), seed=i),
                        int(rng.integers(75, 98)), subsampling=kinds[i % 3]) for i in range(36)]
    cut = blobs[:35] + [blobs[35][:400]]  # a 4:4:4 JPEG cut short
    stream = cp.cuda.Stream(non_blocking=True)
    out = {}
    for route in ("hardware", "split"):
        dec = GpuImageDecoder(0, 4, route=route, hw_direct=direct)
        assert dec.route == route and len(dec.hw_direct or dec.hw_cs) == (HW_ONLY_INSTANCES if route == "hardware" else 2)
        picked: dict = {}

        def spy(pool, kind, pick=dec._hw_instance, picked=picked):
            got = pick(pool, kind)
            picked.setdefault(kind, set()).add(id(got))
            return got

        dec._hw_instance = spy
        out[route] = [_finished(dec.decode(b, stream), stream) for b in (blobs, blobs, cut)]
        dec.close()
        if route == "hardware":
            assert all(len(ids) == 1 for ids in picked.values()) and len(set().union(*picked.values())) == 3
    (first, again, failed), (split, _, _) = out["hardware"], out["split"]
    assert first[2:] == again[2:] == (36, 36, 0)          # all on the hardware engine, the same each time
    assert split[2] == 36 and split[3] < 30              # the split route gives the CUDA decoder a part
    # the cut JPEG fails: with no end marker it goes to Pillow, which refuses it (sort_by_kind)
    assert failed[1].count(False) == 1 and failed[2] == 35 and failed[3] >= 24
    for a, b, blob in zip(first[0], split[0], blobs):
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 1.5
        assert np.abs(a.astype(int) - host.decode(blob).astype(int)).mean() < 3.0
    for a, b in zip(first[0][:35], failed[0][:35]):
        assert np.abs(a.astype(int) - b.astype(int)).mean() < 1.5


def test_hw_direct_path_matches_nvimagecodec_and_retries_a_failed_call(monkeypatch):
    """The hardware engine driven through nvJPEG directly (the default) gives nvImageCodec's hardware
    decoder's pixels, chroma upsampled by interpolation as libjpeg does; EXIF-turned images go to the
    CUDA decoder, which turns them; a call nvJPEG fails is decoded again by the CUDA decoder, its images
    all kept."""
    import cupy as cp

    from gpubatch.engine.codecs import nvjpeg_hw
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    blobs = [jpeg_bytes(photo(150 + 7 * i, 230 - 3 * i, seed=i), 80 + i, subsampling=("4:2:0", "4:2:2", "4:4:4")[i % 3])
             for i in range(24)]
    blobs.append(jpeg_bytes(photo(120, 170, seed=40)[..., 0], 85))  # gray
    blobs.append((SAMPLE / "imagenet/flower/flower_000.jpg").read_bytes())  # EXIF orientation 6
    stream = cp.cuda.Stream(non_blocking=True)
    got = {}
    for direct in (True, False):
        dec = GpuImageDecoder(0, 4, api="c", cuda_share=0.0, hw_direct=direct)
        assert bool(dec.hw_direct) == direct and bool(dec.hw_cs) != direct
        dec.warm_up(64)
        res = dec.decode(blobs, stream)
        got[direct] = _finished(res, stream)
        dec.close()
    (d_px, d_ok, d_gpu, d_hw, d_fb), (n_px, n_ok, n_gpu, n_hw, n_fb) = got[True], got[False]
    assert all(d_ok) and all(n_ok) and d_gpu == n_gpu == len(blobs) and d_fb == n_fb == 0
    assert d_hw == len(blobs) - 1 and n_hw >= d_hw  # the turned photo went to the CUDA decoder
    for b, x, y in zip(blobs, d_px, n_px):
        assert x.shape == y.shape == host.decode(b).shape
        assert np.abs(x.astype(int) - y.astype(int)).max() <= 1
    assert np.abs(d_px[-1].astype(int) - host.decode(blobs[-1]).astype(int)).mean() < 3.0

    real, real_finish = nvjpeg_hw.HwBatchDecoder.decode, nvjpeg_hw.HwBatchDecoder.finish
    for native in (True, False):  # (the calls made by the native driver's thread, or from Python)
        calls = []

        def fail_first(self, sources, outputs, stream, fmt=nvjpeg_hw.OUTPUT_RGBI, regions=None, args=None, *,
                       calls=calls):
            calls.append(len(sources))
            if len(calls) == 1:
                raise nvjpeg_hw.NvjpegError("nvjpegDecodeBatched", 3)
            return real(self, sources, outputs, stream, fmt, regions, args)

        def fail_first_made(pending, calls=calls):
            calls.append(pending.call.n)
            ok, seconds = real_finish(pending)
            return (False, seconds) if len(calls) == 1 else (ok, seconds)

        dec = GpuImageDecoder(0, 4, api="c", cuda_share=0.0, hw_direct=True,
                              settings=Settings.from_env(hw_native=native))
        assert (dec._driver is not None) == native
        try:
            dec.warm_up(64)
            if native:
                monkeypatch.setattr(nvjpeg_hw.HwBatchDecoder, "finish", staticmethod(fail_first_made))
            else:
                monkeypatch.setattr(nvjpeg_hw.HwBatchDecoder, "decode", fail_first)
            px, ok, on_gpu, hw, fb = _finished(dec.decode(blobs, stream), stream)
        finally:
            monkeypatch.undo()
            dec.close()
        assert all(ok) and on_gpu == len(blobs) and fb == 0 and hw == len(blobs) - 1 - calls[0]
        for x, y in zip(px, d_px):
            assert np.abs(x.astype(int) - y.astype(int)).mean() < 1.0  # the retried call: CUDA decoder's pixels


def _shape_or_none(blob: bytes):
    """A JPEG's decoded shape, or None (not a JPEG, or not decodable)."""
    if not blob.startswith(b"\xff\xd8"):
        return None
    try:
        return host.decode(blob).shape
    except ValueError:
        return None


@pytest.mark.parametrize("chunk,ring", [(0, 0), (3, 0), (3, 2)])
def test_the_native_driver_decodes_what_the_calls_from_python_decode(chunk, ring):
    """The hardware engine's calls made by the native driver's thread (``GPUBATCH_HW_NATIVE=1``) give, bit for
    bit, what the same calls made from the decoder's Python thread give: whole parts and chunks (several calls
    a part, over the instances), regions, a corrupt image's call retried; its timings counted. With two ring
    slots taken in turn (``hw_ring``, as under a memory cap) a part's later calls wait for slots its earlier
    calls give back once read: never until ``ring_wait`` runs out."""
    import cupy as cp

    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    batches = _mixed_batches(21, 72, (60, 300), corrupt=5, png=13)
    shapes = [[_shape_or_none(b) for b in bs] for bs in batches]
    cuts = [[None if s is None or k % 3 == 0 else (2 + k % 5, 3, s[0] - 4, s[1] - 1 - k % 7)
             for k, s in enumerate(sh)] for sh in shapes]
    stream = cp.cuda.Stream(non_blocking=True)
    got = {}
    for native in (True, False):
        dec = GpuImageDecoder(0, 4, api="c", route="split", cuda_share=0.0, hw_direct=True,
                              settings=Settings.from_env(hw_native=native, hw_chunk=4, hw_ring=ring, ring_wait=30.0))
        assert (dec._driver is not None) == native
        dec.warm_up(64, regions=True)
        out = []
        for b, cut in [(b, None) for b in batches] + [(batches[1], cuts[1]), (batches[2], cuts[2])]:
            if chunk:
                out.append(_read_chunks(dec.decode(b, stream, order=False, wait=False, chunk=chunk, regions=cut),
                                        stream, len(b)))
            else:
                out.append(_finished(dec.decode(b, stream, regions=cut), stream))
        timings, waits = dict(dec.timings), dec.ring_waits
        dec.close()
        got[native] = out
        assert waits == 0
        if native:
            assert timings["hw_queue"] > 0 and timings["hw_nvjpeg"] > 0
    for a, b in zip(got[True], got[False]):
        _same_result(a, b)
    whole = got[True][:3]  # (the cut JPEG fails once; most images go to the engine)
    assert sum(g[1].count(False) for g in whole) == 1 and all(g[3] > 10 for g in whole)


def test_nvjpeg_binding_decodes_regions_and_planes():
    """The direct binding's region calls (``nvjpegDecodeBatchedEx``, each image's parameters reused
    from call to call) give the part of the whole decode they name, whole images beside them; its
    planes (a plain call, then a call with parameters, which switches their output format, then
    regions in RGB again), read with libjpeg's arithmetic, are Pillow's decode."""
    import cupy as cp

    from gpubatch.engine.codecs import nvjpeg_hw, planes

    stream = cp.cuda.Stream(non_blocking=True)
    dec = nvjpeg_hw.HwBatchDecoder(cp)
    made = []  # the instance's end event of each call: made at the first, recorded again at the others
    for sub in ("4:2:0", "4:2:2"):
        blobs = [jpeg_bytes(photo(101 + 17 * i, 223 - 9 * i, seed=i), 80 + i, subsampling=sub) for i in range(6)]
        host_bytes = [np.frombuffer(b, np.uint8) for b in blobs]
        src = [(h.ctypes.data, h.nbytes) for h in host_bytes]
        shapes = [host.decode(b).shape for b in blobs]
        full = [cp.zeros(s, cp.uint8) for s in shapes]
        dec.decode(src, [(a.data.ptr, a.shape[1] * 3) for a in full], stream)
        made.append(dec.done)
        hs, vs = planes.SUBSAMPLING[sub]
        # region calls (twice: the reused parameters must not keep the last call's regions), planes by a
        # plain call and by a call with parameters (their output format switched), regions again
        for step in ("rgb0", "rgb1", "yuv", "yuv-ex", "rgb2"):
            if step.startswith("rgb"):
                rnd = int(step[3])
                regions = [None if (i + rnd) % 3 == 0 else (3 + i, 5 * i + rnd, s[0] - 2 * i, s[1] - 7)
                           for i, s in enumerate(shapes)]
                part = [cp.zeros((s[0], s[1], 3) if r is None else (r[2] - r[0], r[3] - r[1], 3), cp.uint8)
                        for r, s in zip(regions, shapes)]
                dec.decode(src, [(a.data.ptr, a.shape[1] * 3) for a in part], stream, regions=regions)
                stream.synchronize()
                for r, a, f in zip(regions, part, full):
                    want = f if r is None else f[r[0] : r[2], r[1] : r[3]]
                    assert int(cp.abs(a.astype(cp.int16) - want.astype(cp.int16)).max()) <= 1
                continue
            bufs = [cp.zeros(planes.plane_bytes(s[1], s[0], hs, vs), cp.uint8) for s in shapes]
            dec.decode(src, [planes.plane_places(b.data.ptr, s[1], s[0], hs, vs) for b, s in zip(bufs, shapes)],
                       stream, nvjpeg_hw.OUTPUT_YUV, regions=[None] * len(blobs) if step == "yuv-ex" else None)
            stream.synchronize()
            for b, s, blob in zip(bufs, shapes, blobs):
                rgb = planes.planes_to_rgb(*planes.plane_views(b.get(), s[1], s[0], hs, vs), hs, vs)
                assert np.abs(rgb.astype(int) - host.decode(blob).astype(int)).max() <= 1
    assert made[0] is made[1] is dec.done and dec.done.done
    dec.close()


SPIN_THEN_SET = r"""
extern "C" __global__ void spin_then_set(long long* x, unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    x[0] = 7;
}
"""


def test_events_recorded_with_the_gil_kept_order_streams():
    """``record_held`` and ``wait_held`` (``cuEventRecord``, ``cuStreamWaitEvent`` with the GIL kept): an
    event recorded after a 50-ms kernel is not done at once, and work on a stream made to wait for it
    reads what that kernel wrote."""
    import cupy as cp

    from gpubatch.engine.gpu.context import record_held, wait_held

    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(1, cp.int64)
    cp.cuda.Device().synchronize()  # (made on the default stream)
    cp.RawKernel(SPIN_THEN_SET, "spin_then_set")((1,), (1,), (x, np.uint64(50_000_000)), stream=a)
    ev = record_held(cp.cuda.Event(disable_timing=True), a)
    assert not ev.done
    wait_held(b, ev)
    with b:
        y = x * 2
    b.synchronize()
    assert ev.done and int(y[0]) == 14
    # an event made through the driver (event_held) is a CuPy event of the class asked for, CuPy's to
    # record, wait for and destroy
    from gpubatch.engine.gpu.context import event_held, owned_event_class

    cls = owned_event_class(cp)
    made = event_held(cls)
    assert type(made) is cls and made.ptr and made.done
    cp.RawKernel(SPIN_THEN_SET, "spin_then_set")((1,), (1,), (x, np.uint64(50_000_000)), stream=a)
    record_held(made, a)
    assert not made.done
    b.wait_event(made)
    made.synchronize()
    assert made.done
    del made  # (cudaEventDestroy through CuPy; an event destroyed twice or foreign would fail here or later)
    cp.cuda.Device().synchronize()


def test_held_calls_copy_query_and_sync_as_cupy_does():
    """The driver calls the consumer's thread makes with the GIL kept: ``copy_held`` copies page-locked host
    bytes after the work before it on its stream; an event made once (``held_event``) and recorded again
    orders each use; ``query_held`` and ``sync_held`` tell and wait; ``current_device_held`` is CuPy's
    device."""
    import cupy as cp

    from gpubatch.engine.gpu.context import (
        copy_held,
        current_device_held,
        held_event,
        query_held,
        record_held,
        sync_held,
        wait_held,
    )

    stream = cp.cuda.Stream(non_blocking=True)  # (CuPy's context made, current in this thread: run alone too)
    assert current_device_held() == cp.cuda.runtime.getDevice()
    host_mem = cp.cuda.alloc_pinned_memory(8)
    host = np.frombuffer(host_mem, np.int64, 1)
    host[0] = 11
    x = cp.zeros(1, cp.int64)
    other = cp.cuda.Stream(non_blocking=True)
    ev = held_event(cp)
    assert query_held(ev)  # (never recorded: done)
    for round_ in range(2):  # (the same event recorded again orders the second use too)
        cp.RawKernel(SPIN_THEN_SET, "spin_then_set")((1,), (1,), (x, np.uint64(50_000_000)), stream=stream)
        copy_held(x.data.ptr, host.ctypes.data, 8, stream)  # (after the kernel's 7, on the same stream)
        record_held(ev, stream)
        assert not query_held(ev)
        wait_held(other, ev)
        with other:
            y = x * 2
        sync_held(ev)
        assert query_held(ev)
        other.synchronize()
        assert int(y[0]) == 22 + 2 * round_
        host[0] = 12
    del ev
    from gpubatch.engine.gpu.context import owned_event_class, record_again

    again = record_again(None, other, cp)  # (made where there is none, then the same one recorded again)
    assert isinstance(again, owned_event_class(cp)) and record_again(again, other, cp) is again
    cp.cuda.Device().synchronize()


def test_a_thread_whose_first_cuda_call_makes_an_event_or_encodes_gets_a_context():
    """A thread with no CUDA context yet (a user's thread, or a decoder's before its first runtime call)
    whose first call is one of the driver's (``held_event``) gets the runtime's device's primary context,
    so a JPEG encoder made in one thread encodes from another (it failed with driver error 201)."""
    import threading

    import cupy as cp

    from gpubatch.engine.codecs.image_encode_gpu import GpuImageEncoder
    from gpubatch.engine.gpu.context import held_event

    enc = GpuImageEncoder(0)
    img = cp.asarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8))
    cp.cuda.Device().synchronize()
    want = enc.encode([img], "jpeg", 90, cp.cuda.Stream(non_blocking=True))
    got: list = []

    def first_calls() -> None:
        try:
            got.append(bool(held_event(cp).ptr))
            got.append(enc.encode([img] * 40, "jpeg", 90, cp.cuda.Stream(non_blocking=True)))
        except Exception as e:  # (the assertion below names it)
            got.append(e)

    for _ in range(2):
        t = threading.Thread(target=first_calls)
        t.start()
        t.join()
    assert not [g for g in got if isinstance(g, Exception)], got
    assert got[0] is True and got[2] is True, got
    assert all(bytes(b) == bytes(want[0]) for b in got[1] + got[3])
    enc.close()


def test_planes_are_pillows_pixels_and_resample_as_rgb(engine):
    """``decode(..., planes=True)``: the hardware engine's 4:2:0 and 4:2:2 images come in the JPEG's
    planes (``sampling`` set; the other kinds, the EXIF-turned photo and the CPU's fallback as RGB), in
    fewer bytes; made RGB by libjpeg's arithmetic they are Pillow's decode; and the fused resample
    reads them as it reads the same pixels interleaved, in one launch with RGB images beside them."""
    import cupy as cp

    from gpubatch.engine.codecs import planes
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    subs = ("4:2:0", "4:2:2", "4:4:4")
    blobs = [jpeg_bytes(photo(97 + 13 * i, 211 - 5 * i, seed=i), 75 + i, subsampling=subs[i % 3]) for i in range(18)]
    blobs.append(jpeg_bytes(photo(120, 170, seed=40)[..., 0], 85))  # gray
    blobs.append((SAMPLE / "imagenet/flower/flower_000.jpg").read_bytes())  # EXIF orientation 6
    blobs.append(blobs[0][:300])  # cut short: the CPU
    stream = cp.cuda.Stream(non_blocking=True)
    dec = GpuImageDecoder(0, 4, api="c", cuda_share=0.0, hw_direct=True)
    dec.warm_up(64)
    res = dec.decode(blobs, stream, planes=True)
    stream.synchronize()
    imgs = res.arrays
    for i, img in enumerate(imgs[:18]):
        want = planes.SUBSAMPLING.get(subs[i % 3])
        assert img.sampling == want
        if want:
            h, w, _ = img.shape
            assert img.row_stride == w and planes.plane_bytes(w, h, *want) < h * w * 3
    assert all(img.sampling is None for img in imgs[18:20]) and imgs[20] is None
    for b, img in zip(blobs[:19], imgs[:19]):  # (the turned photo: the CUDA decoder's turn, checked elsewhere)
        d = np.abs(img.get().astype(int) - host.decode(b).astype(int))
        assert d.max() <= 1 if img.sampling else d.mean() < 1.0  # planes: libjpeg's arithmetic, Pillow's pixels

    rgb = [img.cupy() for img in imgs[:20]]  # the same pixels, interleaved (converted on the host)
    norm = Normalize(dtype="float32")
    for chain in sorted(CHAINS):
        plan = Plan(ops=CHAINS[chain], seed=3)
        wins = [_windows(plan, f"k{i}", *img.shape[:2])[0] for i, img in enumerate(imgs[:20])]
        a, b = engine.launch.resample(imgs[:20], wins, norm), engine.launch.resample(rgb, wins, norm)
        engine.stream.synchronize()
        for i in range(20):
            assert np.abs(a.item(i).get() - b.item(i).get()).max() < 1e-4, (chain, i)
    dec.close()


def _mixed_batches(seed: int, n: int, sides: tuple[int, int], corrupt: int, png: int) -> list[list[bytes]]:
    """``n`` JPEGs of random sizes and qualities, the three subsamplings in turn, blob ``corrupt`` cut
    short (no end marker: Pillow's, which fails it) and blob ``png`` a PNG (straight to Pillow), dealt into three
    batches."""
    rng = np.random.default_rng(seed)
    blobs = [jpeg_bytes(photo(int(rng.integers(*sides)), int(rng.integers(*sides)), seed=i), int(rng.integers(75, 98)),
                        subsampling=i % 3) for i in range(n)]
    blobs[corrupt] = blobs[corrupt][:400]
    blobs[png] = (SAMPLE / "imagenet/mountain/mountain_000.png").read_bytes()
    return [blobs[k::3] for k in range(3)]


def _jpeg_files(folder, n: int, size, quality) -> list:
    """``n`` JPEG files img00.jpg, ... in ``folder``: image i of ``size(i)`` (h, w) at ``quality(i)``, the
    three chroma subsamplings in turn."""
    paths = []
    for i in range(n):
        p = folder / f"img{i:02d}.jpg"
        p.write_bytes(jpeg_bytes(photo(*size(i), seed=i), quality(i), subsampling=("4:2:0", "4:2:2", "4:4:4")[i % 3]))
        paths.append(p)
    return paths


def _finished(res, stream):
    """(host pixels or None, decoded-or-not, on_gpu, hw, fallbacks) of a whole (not chunked) result."""
    stream.synchronize()
    return ([None if a is None else a.get() for a in res.arrays], [e is None for e in res.errors], res.on_gpu,
            res.hw, res.fallbacks)


def test_decoders_threads_run_batches_ahead_with_the_same_result(engine):
    """Batches handed to the decoders' threads several at a time (``wait=False``) and completed later
    give what batches decoded one at a time give: pixels, routing, hardware share, fallbacks, errors;
    a result dropped unread leaves the next batches intact; and so with the GIL passing between the
    threads at almost any statement."""
    batches = _mixed_batches(3, 60, (90, 260), corrupt=6, png=9)
    dec, stream = engine.decoder, engine.stream

    one_by_one = [_finished(dec.decode(b, stream), stream) for b in batches]
    assert one_by_one[0][2] >= 15 and one_by_one[0][3] > 0 and one_by_one[0][4] >= 1
    assert one_by_one[0][1].count(False) == 1
    # the GIL passing between threads at almost every statement, a busy Python thread beside them
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(100))

    busy = threading.Thread(target=spin, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    busy.start()
    try:
        for _ in range(3):
            ahead = [dec.decode(b, stream, order=False, wait=False) for b in batches]
            dec.decode(batches[0], stream, order=False, wait=False)  # dropped unread
            ahead.append(dec.decode(batches[1], stream, order=False, wait=False))
            got = []
            for res in ahead:
                res.order(stream)
                got.append(_finished(res, stream))
            for g, ref in zip(got, one_by_one + [one_by_one[1]]):
                assert g[1:] == ref[1:]
                for a, b in zip(g[0], ref[0]):
                    assert (a is None) == (b is None)
                    if a is not None:
                        np.testing.assert_array_equal(a, b)
    finally:
        stop.set()
        busy.join()
        sys.setswitchinterval(interval)


def test_chunked_decode_reuses_few_buffers_with_the_same_result(engine, monkeypatch):
    """``decode(chunk=N)``: calls of at most N images into a ring of buffers per decoder (which grow
    where a call needs more) give, read through ``chunks()``, what whole-part decodes give, with
    several batches handed over ahead; a chunked result dropped unread frees its buffers for the next
    batches; one read out of order is slowed (its calls take buffers of their own), never stuck."""

    batches = _mixed_batches(5, 72, (60, 300), corrupt=5, png=13)
    dec, stream = engine.decoder, engine.stream

    def read(res, n):
        return _read_chunks(res, stream, n)

    ref = [_finished(dec.decode(b, stream), stream) for b in batches]
    assert ref[0][2] >= 15 and ref[0][3] > 0 and ref[1][4] >= 1 and ref[2][1].count(False) == 1
    monkeypatch.setattr(dec, "settings", dec.settings.with_(hw_chunk=4))  # the hardware engine's calls split too

    same = _same_result

    waits = dec.ring_waits
    ahead = [dec.decode(b, stream, order=False, wait=False, chunk=3) for b in batches]
    dec.decode(batches[0], stream, order=False, wait=False, chunk=3)  # dropped unread
    ahead.append(dec.decode(batches[1], stream, order=False, wait=False, chunk=5))
    for res, want in zip(ahead, ref + [ref[1]]):
        got = read(res, len(want[0]))
        assert max(got[5]) <= 5 and len(got[5]) >= 6  # many calls, each a few images (the CPU's last)
        same(got, want)
    assert dec.ring_waits == waits
    assert len(dec._rings[False]) <= 5  # call k of a part: slot k (about 12 images a part, calls of 3)
    monkeypatch.setattr(dec, "settings", dec.settings.with_(ring_banks=2))  # the parts' calls in two banks in turn
    banked = [dec.decode(b, stream, order=False, wait=False, chunk=3) for b in batches]
    for res, want in zip(banked, ref):
        same(read(res, len(want[0])), want)
    assert dec.ring_waits == waits and len(dec._rings[False]) <= 10
    # (a measurement) each direct call first waits for the work pending on its stream, outside nvJPEG: the same result
    behind = dec.timings["hw_calls_behind"]
    monkeypatch.setattr(dec, "settings", dec.settings.with_(ring_banks=1, hw_stream_wait=True))
    for b, want in zip(batches, ref):
        same(_finished(dec.decode(b, stream), stream), want)
    assert dec.timings["hw_stream_wait"] >= 0.0 and dec.timings["hw_calls_behind"] >= behind
    assert (dec.timings["hw_stream_wait"] > 0.0) == (dec.timings["hw_calls_behind"] > behind)
    monkeypatch.setattr(dec, "settings", dec.settings.with_(hw_stream_wait=False))
    with pytest.raises(ValueError):
        dec.decode(batches[0], stream, chunk=3)  # must be read through chunks()
    early = dec.decode(batches[0], stream, order=False, wait=False, chunk=2)
    late = dec.decode(batches[2], stream, order=False, wait=False, chunk=2)
    monkeypatch.setattr(dec, "settings", dec.settings.with_(ring_wait=0.2))
    same(read(late, len(ref[2][0])), ref[2])  # out of order: its calls find the slots held
    same(read(early, len(ref[0][0])), ref[0])
    assert dec.ring_waits > waits
    monkeypatch.setattr(dec, "settings", dec.settings.with_(cuda_ring=2))  # the CUDA decoder's calls over two slots in turn
    same(read(dec.decode(batches[1], stream, order=False, wait=False, chunk=3), len(ref[1][0])), ref[1])


def test_a_growing_chunk_buffer_gives_the_old_one_back_first(engine, monkeypatch):
    """A ring slot that must grow gives its old buffer back before it takes the new one, once the call
    before in it has been read (never both at once), with the images right; where that call is not
    read within GROW_WAIT (a batch handed over ahead in the same thread) the old one is freed late,
    once read, and the images are still right."""

    small, big, bigger = (_mixed_batches(seed, 72, sides, corrupt=4, png=10)[0]
                          for seed, sides in ((11, (60, 120)), (12, (200, 300)), (13, (320, 400))))
    dec, stream = engine.decoder, engine.stream
    ref = {id(b): _finished(dec.decode(b, stream), stream) for b in (small, big, bigger)}
    events, free, malloc = [], dec._free_slots, dec.cp.cuda.runtime.mallocAsync

    def spy_free(hw, olds, wait=None):
        events.append(("free", hw, [ptr for _, ptr in olds]))
        return free(hw, olds, wait)

    def spy_malloc(size, stream_ptr):
        ptr = malloc(size, stream_ptr)
        events.append(("malloc", size, ptr))
        return ptr

    monkeypatch.setattr(dec, "_free_slots", spy_free)
    monkeypatch.setattr(dec.cp.cuda.runtime, "mallocAsync", spy_malloc)
    late = dec.frees_late

    def read(b):
        return _read_chunks(dec.decode(b, stream, order=False, wait=False, chunk=256), stream, len(b))

    _same_result(read(small), ref[id(small)])
    sizes = {hw: [sl.size for sl in dec._rings[hw]] for hw in (True, False)}
    events.clear()
    _same_result(read(big), ref[id(big)])  # every slot grows: each old buffer given back, then the new taken
    grown = [(hw, k) for hw in (True, False) for k, sl in enumerate(dec._rings[hw])
             if k < len(sizes[hw]) and sl.size > sizes[hw][k]]
    assert grown and dec.frees_late == late
    kinds = [e[0] for e in events]
    assert kinds.count("free") >= len(grown) and kinds.index("free") < kinds.index("malloc")
    assert all(kinds[i + 1] == "malloc" for i, k in enumerate(kinds) if k == "free")  # each free, then its malloc
    ahead = dec.decode(big, stream, order=False, wait=False, chunk=256)  # handed over, not read yet
    monkeypatch.setattr(dec, "settings", dec.settings.with_(grow_wait=0.05))
    after = dec.decode(bigger, stream, order=False, wait=False, chunk=256)  # grows past the unread batch's
    assert dec.frees_late > late
    _same_result(_read_chunks(ahead, stream, len(big)), ref[id(big)])
    _same_result(_read_chunks(after, stream, len(bigger)), ref[id(bigger)])
    dec._give_back_slots()  # (empty rings again)
    monkeypatch.setattr(dec, "settings", dec.settings.with_(free_before_grow=False))  # the new one first, the old freed once read
    _same_result(read(small), ref[id(small)])
    events.clear()
    _same_result(read(big), ref[id(big)])
    assert [e[0] for e in events if e[0] == "free"] == [] and any(e[0] == "malloc" for e in events)


def test_buffers_made_after_a_give_back_fit_the_most_of_a_kind_seen(engine, monkeypatch):
    """After every chunk buffer was given back (as a switch of the decode route does), a batch with few
    images of a kind makes that kind's buffer large enough for the most of it a batch has had, so a
    later batch with many takes no new buffer; sized by the call alone (``SIZE_BY_MOST`` off) it grows.
    The images are right throughout."""

    def blobs(n444: int, seed: int) -> list[bytes]:
        rng = np.random.default_rng(seed)
        sub = ["4:2:0"] * 20 + ["4:4:4"] * n444
        return [jpeg_bytes(photo(int(rng.integers(150, 200)), int(rng.integers(150, 200)), seed=seed + i), 85,
                           subsampling=s) for i, s in enumerate(sub)]

    many, few = blobs(40, 100), blobs(10, 300)
    dec, stream = engine.decoder, engine.stream
    monkeypatch.setattr(dec, "cuda_share", 0.0)  # a call per kind, each kind whole (as the hardware route)
    ref = {id(b): _finished(dec.decode(b, stream), stream) for b in (many, few)}
    malloc, taken = dec.cp.cuda.runtime.mallocAsync, []

    def spy_malloc(size, stream_ptr):
        taken.append(size)
        return malloc(size, stream_ptr)

    monkeypatch.setattr(dec.cp.cuda.runtime, "mallocAsync", spy_malloc)

    def read(b):
        _same_result(_read_chunks(dec.decode(b, stream, order=False, wait=False, chunk=256), stream, len(b)),
                     ref[id(b)])

    for by_most in (True, False):
        monkeypatch.setattr(dec, "settings", dec.settings.with_(size_by_most=by_most))
        read(many)  # the most of 4:4:4 seen: 40 images
        dec._give_back_slots()
        taken.clear()
        read(few)  # new buffers, 4:2:0's and 4:4:4's
        assert len(taken) == 2
        taken.clear()
        read(many)
        assert (taken == []) == by_most, taken
        dec._give_back_slots()


def test_pipeline_chunks_equal_whole_batches_and_close_up_failures(tmp_path, monkeypatch):
    """A fixed-size chain resampled part by part (whole decoder parts from the pool, whole calls in
    reused buffers as by default, or chunks of 3) into its rows gives the batches one resample of the
    whole decoded batch gives, in ``iterate_files`` and in ``__call__``; images that fail are left out
    and reported, the rows after them closed up. With the hardware engine's images in their planes
    (split calls' default) the batches are the same to a level (the planes read as Pillow decodes,
    the engine's RGB within a level of it)."""
    from gpubatch.engine.settings import Settings
    from gpubatch.pipelines.image import ImagePipeline

    # (from the environment too: the tests' fixed "split" route, so each image goes to the same decoder)
    rgb, planes = Settings.from_env(hw_planes="never"), Settings.from_env(hw_planes="chunked")

    paths = _jpeg_files(tmp_path, 40, lambda i: (150 + 9 * i, 300 - 4 * i), lambda i: 80 + i % 15)
    paths[7].write_bytes(paths[7].read_bytes()[:300])  # corrupt: cut short, Pillow's, which fails it
    paths[21].write_bytes(b"not an image")
    blobs = [p.read_bytes() for p in paths]
    keys = [p.stem for p in paths]
    out = {}
    for chunk in ("whole", 0, 3, None):
        calls = 0 if chunk == "whole" else chunk
        for chain in ((RandomResizedCrop(64), Flip(), Normalize(layout="CHW", dtype="float16")),
                      (ResizeShorter(80), CenterCrop(64))):
            with ImagePipeline(chain, device="gpu", seed=2, ring=8, decode_chunk=calls, settings=rgb) as pipe:
                assert pipe._fixed is not None and pipe.chunk == (rgb.decode_chunk if calls is None else calls)
                if chunk == "whole":
                    pipe._fixed = None  # the path of other chains: one resample once the batch is decoded
                fed = [b.stacked().get() for b in pipe.iterate_files(paths, keys, batch_size=16, workers=2)]
                called, errors = [], []
                for a in range(0, 40, 16):
                    called.append(pipe(blobs[a : a + 16], keys[a : a + 16]).stacked().get())
                    errors.append([i for i, _ in pipe.last_errors])
                out[chunk, len(chain)] = fed, called, errors
    for n in (2, 3):
        for chunk in (0, 3, None):
            for got, want in zip(out[chunk, n][0] + out[chunk, n][1], out["whole", n][0] + out["whole", n][1]):
                np.testing.assert_array_equal(got, want)
            assert out[chunk, n][2] == out["whole", n][2] == [[7], [5], []]
            assert sum(len(b) for b in out[chunk, n][0]) == 38
    for chain, tol in (((RandomResizedCrop(64), Flip(), Normalize(layout="CHW", dtype="float16")), 0.02),
                       ((ResizeShorter(80), CenterCrop(64)), 1)):
        with ImagePipeline(chain, device="gpu", seed=2, ring=8, decode_chunk=3, settings=planes) as pipe:
            assert pipe._planes
            fed = [b.stacked().get() for b in pipe.iterate_files(paths, keys, batch_size=16, workers=2)]
            assert pipe.stats["hw"] > 0
        for got, want in zip(fed, out["whole", len(chain)][0]):
            assert got.shape == want.shape
            assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() <= tol


def test_gpu_decode_falls_back_and_reports(engine):
    good = jpeg_bytes(photo(64, 80))
    blobs = [good, good[:300], b"not an image", (SAMPLE / "imagenet/car/car_000.jpg").read_bytes(),
             (SAMPLE / "imagenet/mountain/mountain_000.png").read_bytes()]
    res = engine.decoder.decode(blobs, engine.stream)
    assert res.arrays[0] is not None and res.errors[0] is None
    assert res.arrays[1] is None and res.errors[1]
    assert res.arrays[2] is None and res.errors[2]
    assert res.arrays[3] is not None and res.arrays[4] is not None  # CMYK and PNG through the CPU
    assert res.fallbacks >= 2


def test_gpu_encode_roundtrip(engine):
    import cupy as cp

    imgs = [photo(120, 160, seed=s) for s in range(4)]
    out = engine.encoder.encode([cp.asarray(im) for im in imgs], "jpeg", 92, engine.stream)
    for im, data in zip(imgs, out):
        assert data[:3] == b"\xff\xd8\xff"
        assert np.abs(host.decode(data).astype(int) - im).mean() < 4.0  # q92 on grainy pixels
    png = engine.encoder.encode([cp.asarray(imgs[0])], "png", 0, engine.stream)[0]
    assert np.array_equal(host.decode(png), imgs[0])


def test_convert_on_gpu_matches_cpu(imagenet, tmp_path):
    g = convert(imagenet, tmp_path / "g", to="webdataset", resize_shorter=64, center_crop=56, quality=95,
                device="gpu")
    c = convert(imagenet, tmp_path / "c", to="webdataset", resize_shorter=64, center_crop=56, quality=95,
                device="cpu")
    assert g.device.startswith("gpu") and g.records_out == c.records_out == 60 and not g.skipped
    gpu = {r.key: host.decode(r.data) for r in open_dataset(tmp_path / "g")}
    cpu = {r.key: host.decode(r.data) for r in open_dataset(tmp_path / "c")}
    assert gpu.keys() == cpu.keys()
    for k in gpu:
        assert gpu[k].shape == (56, 56, 3)
        assert np.abs(gpu[k].astype(int) - cpu[k].astype(int)).mean() < 4.0


def test_gpu_run_reads_a_source_pattern_in_its_reader_processes(imagenet, tmp_path):
    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=20)  # 3 shards
    s = convert(tmp_path / "wds" / "data-00000[01].tar", tmp_path / "g", to="folder", resize_shorter=48,
                device="gpu")
    assert s.device.startswith("gpu") and s.records_in == s.records_out == 40 and not s.skipped


def test_convert_on_gpu_skips_bad_records_and_moves_boxes(coco, tmp_path):
    (coco / "images" / "000000000003.jpg").write_bytes(b"\xff\xd8\xff\xe0broken")
    s = convert(coco, tmp_path / "g", to="coco", resize_shorter=100, device="gpu")
    assert s.records_out == 11 and len(s.skipped) == 1
    src = {r.key: r for r in open_dataset(coco)}
    for r in open_dataset(tmp_path / "g"):
        oh, ow = src[r.key].boxes.canvas
        h, w = host.decode(r.data).shape[:2]
        assert min(h, w) == 100 and r.boxes.canvas == (h, w)
        scale = np.array([w / ow, h / oh, w / ow, h / oh], np.float32)
        np.testing.assert_allclose(r.boxes.xyxy, src[r.key].boxes.xyxy * scale, atol=0.05)


def test_batch_split_under_memory_cap(tmp_path):
    import cupy as cp

    from gpubatch.engine.gpu.engine import GpuEngine
    from gpubatch.engine.gpu.images import _resample_encode

    eng = GpuEngine(resolve("gpu"), cpu_threads=2, gpu_memory="64MiB")
    try:
        imgs = [cp.asarray(photo(300, 300, seed=i)) for i in range(12)]
        wins = [Window(0.0, 0.2, 0.0, 0.2, 1500, 1500)] * 12  # upscaled: 12 x 6.75 MB of output > cap
        out = _resample_encode(eng, Plan(image_format="jpeg"), ["jpeg"] * 12, imgs, wins)
        assert len(out) == 12 and all(isinstance(o, bytes) for o in out)
    finally:
        cp.get_default_memory_pool().set_limit(size=0)
        eng.close()


def test_hardware_decoder_thread_has_a_core_of_its_own():
    """Where 8 or more cores are usable the engine takes one for the hardware engine's thread: the thread that
    built it (and what it starts) leaves the core, that thread runs on it and decodes there, and closing the
    engine gives the building thread its cores back."""
    import os

    from gpubatch.engine.gpu import affinity
    from gpubatch.engine.gpu.engine import GpuEngine

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("CPU affinity is Linux's")
    blobs = [jpeg_bytes(photo(200, 300, seed=i), 95) for i in range(8)]
    out: dict = {}

    def run():  # in a thread of its own: the test runner's CPU mask is not touched
        before = os.sched_getaffinity(0)
        eng = GpuEngine(resolve("gpu"), cpu_threads=2)
        try:
            res = eng.cores
            out["reserved"] = res is not None
            if res is not None:
                out["building thread"] = os.sched_getaffinity(0) == before - {res.core} == res.others
                out["hw thread"] = eng.decoder._hw_thread.submit(os.sched_getaffinity, 0).result() == {res.core}
            got = eng.decoder.decode(blobs, eng.stream)
            out["decoded"] = all(a is not None for a in got.arrays) and got.hw >= 4
        finally:
            eng.close()
        out["released"] = os.sched_getaffinity(0) == before

    t = threading.Thread(target=run)
    t.start()
    t.join()
    enough = len(os.sched_getaffinity(0)) >= affinity.MIN_CPUS
    want = {"reserved": True, "building thread": True, "hw thread": True} if enough else {"reserved": False}
    assert out == {**want, "decoded": True, "released": True}


def _read_chunks(res, stream, n: int):
    """(host pixels or None, decoded-or-not, on_gpu, hw, fallbacks, images per call) of a result read
    through ``chunks()``."""
    got: list = [None] * n
    sizes = []
    for items, on in res.chunks(stream):
        assert on is stream
        sizes.append(len(items))
        with stream:  # ordered after the chunk's decode; its buffer goes back to the decoder after this
            for i, a in items:
                got[i] = a.cupy().copy()
    stream.synchronize()
    return [None if a is None else a.get() for a in got], [e is None for e in res.errors], res.on_gpu, res.hw, \
        res.fallbacks, sizes


def _same_result(got, want) -> None:
    assert got[1:5] == want[1:5]
    for a, b in zip(got[0], want[0]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


_OUTLIVE = """
import gc, sys
import cupy as cp
from gpubatch.engine.codecs import nvjpeg_hw
from gpubatch.engine.codecs.image_gpu import GpuImageDecoder
from tests.helpers import jpeg_bytes, photo

blobs = [jpeg_bytes(photo(90 + 5 * i, 140 - 3 * i, seed=i), 85, subsampling=i % 3) for i in range(24)]
stream = cp.cuda.Stream(non_blocking=True)
dec = GpuImageDecoder(0, 4, api="c")
dec.warm_up(32)
kept = [dec.decode(blobs, stream), dec.decode(blobs, stream, order=False, wait=False),
        dec.decode(blobs, stream, order=False, wait=False, chunk=256)]
part = next(kept[2].chunks(stream))  # a chunk read, the rest not

def broken(self, *a, **k):  # a stand-in that fails unlike nvJPEG (as a test's outdated stand-in did)
    raise TypeError("decode() got an unexpected keyword argument")

real = nvjpeg_hw.HwBatchDecoder.decode
nvjpeg_hw.HwBatchDecoder.decode = broken
try:
    dec.decode(blobs, stream)
except TypeError:
    kept.append(sys.exc_info())  # its traceback keeps the batch's buffers
nvjpeg_hw.HwBatchDecoder.decode = real
dec.close()
del kept, part
gc.collect()
again = GpuImageDecoder(0, 4, api="c")


def cycle(chunk):  # batches and the stream they were decoded for in a reference cycle, as a test's
    local = cp.cuda.Stream(non_blocking=True)  # kept traceback holds them: the collector may finalize
    got = [again.decode(blobs, local, order=False, wait=False, chunk=chunk) for _ in range(2)]  # the stream
    part = next(got[0].chunks(local)) if chunk else got[0].wait()  # and its events first
    box = [local, got, part]
    box.append(box)


for chunk in (0, 256, 0, 256):
    cycle(chunk)
gc.collect()
res = again.decode(blobs, stream)
stream.synchronize()
assert all(a is not None for a in res.arrays) and res.hw > 0
del res
for chunk in (0, 256):
    cycle(chunk)
again.close()  # collected after their decoder closed
gc.collect()
last = GpuImageDecoder(0, 4, api="c")
res = last.decode(blobs, stream)
stream.synchronize()
assert all(a is not None for a in res.arrays) and res.hw > 0
del res
last.close()
print("survived")
"""


def test_batches_that_outlive_their_decoder_free_safely():
    """Decoded batches still held when their decoder closes (read, unread, half-read in chunks, and one
    whose hardware call raised, kept by its traceback) free their memory when dropped afterwards, and so
    do batches collected in a reference cycle with the stream they were decoded for (whose CUDA stream
    and events the collector may destroy first), before and after their decoder closes; a new decoder
    then works: the process neither crashes nor hangs (a subprocess of its own)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = child_env()
    p = subprocess.run([sys.executable, "-c", _OUTLIVE], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "survived" in p.stdout, p.stderr[-2000:]


def test_image_pipeline_reproducible_and_matches_cpu():
    from gpubatch.pipelines.image import ImagePipeline

    blobs = [jpeg_bytes(photo(300 + 7 * i, 400 - 5 * i, seed=i), 92) for i in range(8)]
    keys = [f"img{i}" for i in range(8)]
    ops = [RandomResizedCrop(224), Flip(), Normalize(layout="CHW", dtype="float32")]
    with ImagePipeline(ops, device="gpu", seed=3) as gp, ImagePipeline(ops, device="cpu", seed=3) as cp_:
        a = gp(blobs, keys).stacked().get()
        b = gp(blobs, keys).stacked().get()
        ref = np.stack(cp_(blobs, keys))
    assert a.shape == (8, 3, 224, 224) and np.array_equal(a, b)
    assert np.abs(a - ref).mean() < 0.05


@pytest.mark.parametrize("chunk,regions_for", [(None, "hw+cuda"), (0, "hw+cuda"), (5, "hw+cuda"), (None, "hw"), (None, "")])
def test_region_decode_matches_full_decode(tmp_path, monkeypatch, chunk, regions_for):
    """``region_decode``: each image decoded only where the random crop reads (with the filter's reach)
    gives the batches a full decode gives, up to the rounding of the moved window origin; the
    hardware engine's part goes through the direct path's region calls (the default reused buffers,
    whole parts, and chunks). A decoder not in ``settings.regions_for`` decodes whole images and gives
    views of the regions."""
    from gpubatch.engine.codecs.nvjpeg_hw import HwBatchDecoder
    from gpubatch.engine.settings import Settings
    from gpubatch.pipelines.image import ImagePipeline

    st = Settings.from_env(regions_for=tuple(filter(None, regions_for.split("+"))))

    paths = _jpeg_files(tmp_path, 32, lambda i: (300 + 11 * i, 420 - 5 * i), lambda i: 85 + i % 10)
    ops = [RandomResizedCrop(96), Flip(), Normalize(layout="HWC", dtype="uint8")]
    calls: list = []  # the regions of each direct-path call
    real, real_submit = HwBatchDecoder.decode, HwBatchDecoder.submit  # (calls from Python, or queued on the driver)
    monkeypatch.setattr(HwBatchDecoder, "decode", lambda self, *a, **k: (calls.append(k.get("regions")),
                                                                         real(self, *a, **k))[1])
    monkeypatch.setattr(HwBatchDecoder, "submit", lambda self, *a, **k: (calls.append(k.get("regions")),
                                                                         real_submit(self, *a, **k))[1])
    out = {}
    for roi in (False, True):
        with ImagePipeline(ops, device="gpu", seed=9, ring=8, region_decode=roi, decode_chunk=chunk,
                           settings=st) as pipe:
            calls.clear()  # (not the warm-up's)
            batches = list(pipe.iterate_files(paths, batch_size=8, workers=2))
            pipe.stream.synchronize()
            out[roi] = np.concatenate([b.stacked().get() for b in batches]).astype(int)
            assert pipe.stats["fallbacks"] == 0
            if pipe.engine.decoder.hw_direct:
                cut = sum(r is not None for c in calls if c for r in c)
                assert pipe.stats["hw"] > 0 and (cut > 0) == (roi and "hw" in regions_for), (pipe.stats, cut)
    diff = np.abs(out[True] - out[False])
    assert out[True].shape == (32, 96, 96, 3)
    assert diff.max() <= 2 and diff.mean() < 0.1, (diff.max(), diff.mean())


def test_region_decode_of_images_the_cpu_decodes_matches_full_decode(tmp_path):
    """``region_decode`` where some images go to the CPU (CMYK JPEGs: upright with a known size, so the feed
    cuts their regions, but of a kind no GPU decoder takes): the CPU hands over the region alone, and the
    batches are those of whole images, up to the rounding of the moved window's origin."""
    import io

    from PIL import Image

    from gpubatch.pipelines.image import ImagePipeline

    paths = _jpeg_files(tmp_path, 12, lambda i: (300 + 11 * i, 420 - 5 * i), lambda i: 85 + i % 10)
    for i in (1, 4, 7, 10):  # (CMYK copies of some)
        buf = io.BytesIO()
        Image.open(paths[i]).convert("CMYK").save(buf, "JPEG", quality=92)
        paths[i].write_bytes(buf.getvalue())
    ops = [RandomResizedCrop(96), Flip(), Normalize(layout="HWC", dtype="uint8")]
    out, fallbacks = {}, {}
    for roi in (False, True):
        with ImagePipeline(ops, device="gpu", seed=9, ring=8, region_decode=roi) as pipe:
            batches = list(pipe.iterate_files(paths, batch_size=6, workers=2))
            pipe.stream.synchronize()
            out[roi] = np.concatenate([b.stacked().get() for b in batches]).astype(int)
            fallbacks[roi] = pipe.stats["fallbacks"]
    assert fallbacks[True] >= 4 and fallbacks[False] >= 4  # (the CMYK images, on the CPU both times)
    diff = np.abs(out[True] - out[False])
    assert out[True].shape == (12, 96, 96, 3)
    assert diff.max() <= 2 and diff.mean() < 0.1, (diff.max(), diff.mean())


def test_ring_of_one_waits_for_the_consumers_reads(tmp_path, monkeypatch):
    """With one output buffer the next batch overwrites the last, yet GPU work reading a batch that
    was enqueued (on the stream it was taken on) before the next batch was asked for still reads
    that batch: the pipeline's streams wait for the reader's. The reader is held back by a kernel
    that spins for about a second first; without that wait (``settings.fence_readers`` off) it sees the
    next batch."""
    import time

    import cupy as cp

    from gpubatch.engine.settings import Settings
    from gpubatch.pipelines.image import ImagePipeline

    paths = _jpeg_files(tmp_path, 16, lambda i: (200 + 9 * i, 260 - 3 * i), lambda i: 80 + i % 15)
    blobs, keys = [p.read_bytes() for p in paths], [p.stem for p in paths]
    batches = [(blobs[:8], keys[:8]), (blobs[8:], keys[8:])]
    ops = [RandomResizedCrop(64), Flip(), Normalize(layout="CHW", dtype="float16")]
    spin = cp.RawKernel(r"""
    extern "C" __global__ void spin(long long cycles) {
        long long t0 = clock64();
        while (clock64() - t0 < cycles) { }
    }""", "spin")
    cycles = np.int64(cp.cuda.Device().attributes["ClockRate"] * 1000)  # (kHz) about a second
    for fenced in (True, False):
        with ImagePipeline(ops, device="gpu", seed=5, ring=1, settings=Settings.from_env(fence_readers=fenced)) as pipe:
            ref = [pipe(b, k).stacked().get() for b, k in batches]
            if fenced:  # one-batch calls do not take the ring's buffer: each result stays valid
                held = [pipe(b, k) for b, k in batches]
                for r, h in zip(ref, held):
                    np.testing.assert_array_equal(h.stacked().get(), r)
            consumer = cp.cuda.Stream(non_blocking=True)
            it = pipe.iterate(iter(batches))
            first = next(it)
            time.sleep(0.3)  # the second batch decodes meanwhile: asking for it then takes milliseconds
            with consumer:
                consumer.wait_event(pipe.stream.record())
                spin((1,), (1,), (cycles,))  # the reader is late
                copy = first.stacked().copy()  # taken and read here, before the next batch is asked for
            with cp.cuda.Stream(non_blocking=True):  # asked for from another stream
                second = next(it)
            consumer.synchronize()
            pipe.stream.synchronize()
            np.testing.assert_array_equal(second.stacked().get(), ref[1])
            if fenced:
                np.testing.assert_array_equal(copy.get(), ref[0])
            else:
                np.testing.assert_array_equal(copy.get(), ref[1])
            it.close()


def test_stream_ordered_batches_and_iterate_files_match_finished_calls(tmp_path):
    """Batches that nobody waited for (decode, free and kernels all stream-ordered) equal finished
    one-batch calls; ``iterate_files`` (reader processes, parameters drawn there) gives the same."""
    from gpubatch.pipelines.image import ImagePipeline

    paths = _jpeg_files(tmp_path, 48, lambda i: (200 + 9 * i, 260 - 3 * i), lambda i: 80 + i % 15)
    keys = [p.stem for p in paths]
    blobs = [p.read_bytes() for p in paths]
    ops = [RandomResizedCrop(96), Flip(), Normalize(layout="CHW", dtype="float16")]
    spans = [(i, i + 8) for i in range(0, 48, 8)]
    with ImagePipeline(ops, device="gpu", seed=4, ring=8) as pipe:
        ref = [pipe(blobs[a:b], keys[a:b]).stacked().get() for a, b in spans]
        held = list(pipe.iterate((blobs[a:b], keys[a:b]) for a, b in spans))  # never synchronized in between
        pipe.stream.synchronize()
        for r, batch in zip(ref, held):
            np.testing.assert_array_equal(batch.stacked().get(), r)
        fed = list(pipe.iterate_files(paths, keys, batch_size=8, workers=2))
        pipe.stream.synchronize()
        for r, batch in zip(ref, fed):
            np.testing.assert_array_equal(batch.stacked().get(), r)


def test_pin_host_page_locks_shared_memory_and_unpins_it():
    """``GpuEngine.pin_host`` registers a shared-memory ring with the driver (its pages become host
    memory the GPU copies from by DMA) and the function it returns gives them back."""
    from multiprocessing.shared_memory import SharedMemory

    import cupy as cp

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.gpu.engine import GpuEngine

    engine = GpuEngine(Device(DeviceKind.GPU, 0, reason="test"), 2)
    shm = SharedMemory(create=True, size=8 << 20)
    try:
        view = np.frombuffer(shm.buf, np.uint8)
        addr = view.ctypes.data + (3 << 20)
        del view
        unpin = engine.pin_host(shm.buf)
        assert unpin is not None
        assert cp.cuda.runtime.pointerGetAttributes(addr).type == 1  # cudaMemoryTypeHost: registered
        unpin()
        assert cp.cuda.runtime.pointerGetAttributes(addr).type == 0  # unregistered again
    finally:
        engine.close()
        shm.close()
        shm.unlink()


@pytest.mark.parametrize("pin", ["1", "0"])
@pytest.mark.parametrize("chain", ["train", "val"])
def test_iterate_files_with_reused_slots_matches_one_batch_calls(tmp_path, monkeypatch, pin, chain):
    """Many passes over the files (the feed's slots each reused several times, while with a
    page-locked ring the GPU copies from a slot after the decode call returned) give every batch
    exactly as one-batch calls do: a slot is refilled only once the GPU has read it. The validation
    chain (no random op) takes the feed's windows without drawing anything again."""
    from gpubatch.pipelines.image import ImagePipeline

    monkeypatch.setenv("GPUBATCH_PIN_FEED", pin)
    paths = _jpeg_files(tmp_path, 40, lambda i: (240 + 13 * i, 380 - 4 * i), lambda i: 78 + i % 19)
    keys = [p.stem for p in paths]
    blobs = [p.read_bytes() for p in paths]
    ops = ([RandomResizedCrop(64), Flip(), Normalize(layout="CHW", dtype="float16")] if chain == "train"
           else [ResizeShorter(72), CenterCrop(64), Normalize(layout="CHW", dtype="float16")])
    spans = [(i, i + 8) for i in range(0, 40, 8)]
    epochs = 5
    with ImagePipeline(ops, device="gpu", seed=6, ring=4) as pipe:
        # each pass an epoch of its own: the training chain draws anew every epoch
        ref = [pipe(blobs[a:b], keys[a:b], epoch=e).stacked().get() for e in range(epochs) for a, b in spans]
        it = pipe.iterate_files(paths, keys, batch_size=8, workers=2, repeat=True)
        for k in range(epochs * len(spans)):  # the ring holds 4 outputs: read each before the next ones
            got = next(it).stacked()
            pipe.stream.synchronize()
            np.testing.assert_array_equal(got.get(), ref[k])
        if chain == "train":
            assert not np.array_equal(ref[0], ref[len(spans)])
        it.close()


_SYNC_PROBE = """
import os, sys
from gpubatch.engine.gpu import context as ge
if sys.argv[1] == "host-first":  # a host program used the GPU before gpubatch
    import cupy as cp
    cp.zeros(1)
from gpubatch.pipelines.image import ImagePipeline
from gpubatch.engine.ops import CenterCrop
pipe = ImagePipeline([CenterCrop(8)], device="auto", warm_up=0)
print(pipe.device.kind.value, pipe.engine.sync, *ge.sync_policy_state(0))
pipe.close()
"""


@pytest.mark.parametrize("case,env,want", [("fresh", None, "auto"), ("fresh", "blocking", "blocking"),
                                           ("host-first", "blocking", "auto")])
def test_sync_policy_is_set_only_where_gpubatch_makes_the_context(case, env, want):
    """A fresh process (as the CLI's) gets ``SYNC_POLICY`` (``auto``) or ``GPUBATCH_SYNC`` before its
    context exists, ``--device auto``'s probe included; a context a host program made first keeps its
    own (``auto``: the driver's default) whatever ``GPUBATCH_SYNC`` says."""
    import os
    import subprocess

    run_env = {k: v for k, v in os.environ.items() if k != "GPUBATCH_SYNC"}
    if env:
        run_env["GPUBATCH_SYNC"] = env
    out = subprocess.run([sys.executable, "-c", _SYNC_PROBE, case], capture_output=True, text=True, env=run_env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    kind, was_set, policy, active = out.stdout.split()[-4:]
    assert (kind, policy, active) == ("gpu", want, "True")
    assert was_set == str(case == "fresh")


_OTHER_GPU = """
import sys, threading, time
from pathlib import Path
import cupy as cp
from gpubatch import convert
from gpubatch.engine.gpu import context as ge
from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop
from gpubatch.pipelines.image import ImagePipeline
try:
    import pynvml
    pynvml.nvmlInit()
    gpu0 = pynvml.nvmlDeviceGetHandleByIndex(0)
except Exception:  # no NVML: only this process is looked at
    gpu0 = None

def on_gpu0():
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)} if gpu0 else set()

before, seen, done = on_gpu0(), set(), threading.Event()

def watch():  # processes that appear on GPU 0 while this runs (the convert worker's included)
    while not done.is_set():
        seen.update(on_gpu0() - before)
        time.sleep(0.05)

threading.Thread(target=watch, daemon=True).start()
src, out = Path(sys.argv[1]), Path(sys.argv[2])
files = sorted(src.rglob("*.jpg"))
ops = [RandomResizedCrop(64), Flip(), Normalize(layout="CHW", dtype="float16")]
with ImagePipeline(ops, device="gpu", gpu=1, seed=0) as pipe:
    for k, b in enumerate(pipe.iterate_files(files, batch_size=16, repeat=True)):
        b.stacked()
        if k == 5:
            break
    x = pipe([f.read_bytes() for f in files[:8]]).stacked()
    pipe.stream.synchronize()
    with cp.cuda.Device(1):
        img = cp.ascontiguousarray(x[0].transpose(1, 2, 0).astype(cp.uint8))
    enc = pipe.engine.encoder.encode([img], "jpeg", 90, pipe.stream)
    assert enc[0]
s = convert(src, out, to="webdataset", resize_shorter=48, quality=90, device="gpu", gpu=1)
assert s.records_out == 60, s
time.sleep(0.3)
done.set()
print("gpu0-context", ge.sync_policy_state(0)[1], "gpu1-context", ge.sync_policy_state(1)[1],
      "gpu0-new-processes", len(seen))
"""


def test_a_run_on_the_second_gpu_leaves_the_first_alone(imagenet, tmp_path):
    """A pipeline (files and in-memory batches, the encoder) and a ``convert`` on GPU 1 make no CUDA
    context on GPU 0, in the process or in the convert's worker: every CUDA call gpubatch makes, in
    whichever thread, is made on the run's device (a context there takes about 500 MiB of another
    run's GPU). Needs two GPUs."""
    import subprocess
    from pathlib import Path

    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    root = Path(__file__).resolve().parents[2]
    env = child_env()
    p = subprocess.run([sys.executable, "-c", _OTHER_GPU, str(imagenet), str(tmp_path / "out")], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-6:] == ["gpu0-context", "False", "gpu1-context", "True", "gpu0-new-processes", "0"]


def test_gpu_run_skips_records_an_op_would_make_too_large(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, (h, w) in enumerate([(48, 64), (60, 60), (64, 48)]):
        (src / f"{i}.jpg").write_bytes(jpeg_bytes(photo(h, w, i)))
    s = convert(src, tmp_path / "out", to="folder", resize_shorter=64, max_pixels=5000, device="gpu")
    assert s.records_out == 1 and len(s.skipped) == 2
    assert all("resize_shorter would make a" in e["reason"] for e in s.skipped), s.skipped


def test_gpu_run_keeps_the_contract_on_damaged_and_odd_input(imagenet, tmp_path):
    """On the GPU as on the CPU: a damaged stretch of a shard costs its sample only, GIF bytes named
    .jpg are decoded (on the CPU, counted as a fallback), an image beyond JPEG's side limit is that
    record's error naming it, and every record is written or listed as skipped."""
    import io
    import shutil
    import tarfile

    from PIL import Image

    src = tmp_path / "src"
    shutil.copytree(imagenet, src)
    cls = sorted(p for p in src.iterdir() if p.is_dir())[0]
    buf = io.BytesIO()
    Image.fromarray(photo(40, 56)).save(buf, "GIF")
    (cls / "moving.jpg").write_bytes(buf.getvalue())
    Image.fromarray(np.full((1, 65000, 3), 128, np.uint8)).save(cls / "strip.jpg")
    convert(src, tmp_path / "wds", to="webdataset", max_pixels=0)
    shard = next((tmp_path / "wds").glob("*.tar"))
    members = tarfile.open(shard).getmembers()
    raw = bytearray(shard.read_bytes())
    raw[members[len(members) // 2].offset + 100] ^= 0x40  # a header's checksum fails
    shard.write_bytes(bytes(raw))
    s = convert(tmp_path / "wds", tmp_path / "g", to="webdataset", resize_shorter=16, max_pixels=0, device="gpu")
    assert s.device.startswith("gpu")
    assert s.records_out + len(s.skipped) == s.records_in == 62
    reasons = [e["reason"] for e in s.skipped]
    assert len(s.skipped) == 2 and any("65,535" in r for r in reasons) and any("damaged" in r for r in reasons)
    assert s.fallbacks >= 1  # the GIF, decoded on the CPU


def test_a_jpeg_cut_short_is_skipped_on_the_gpu_as_on_the_cpu(imagenet, tmp_path):
    """nvJPEG decodes what there is of a JPEG cut short, and the GPU path wrote that damaged image as a good one where
    the CPU path skips it. A JPEG without its end marker now goes to Pillow on either path: the same records skipped
    for the same reasons, and one with other bytes after its end marker written, with the CPU path's pixels."""
    from tests.cli.test_cli import _add_bad_files

    _add_bad_files(imagenet)  # (a cut JPEG, text named .jpg, an empty PNG)
    good = sorted((imagenet / "car").glob("*.jpg"))[0]
    (imagenet / "car" / "tail.jpg").write_bytes(good.read_bytes() + b"trailing-junk")
    runs = {d: convert(imagenet, tmp_path / d, to="webdataset", resize_shorter=48, device=d) for d in ("cpu", "gpu")}
    for d, s in runs.items():
        assert s.device.startswith(d) and s.records_in == 64 and s.records_out == 61, d
        assert sorted(e["origin"].rsplit("/", 1)[-1] for e in s.skipped) == ["empty.png", "text.jpg", "truncated.jpg"], d
    cut = next(e["reason"] for e in runs["gpu"].skipped if e["origin"].endswith("truncated.jpg"))
    assert cut == next(e["reason"] for e in runs["cpu"].skipped if e["origin"].endswith("truncated.jpg"))
    assert runs["gpu"].fallbacks >= 1  # (the file with bytes after its end: decoded by Pillow)


def test_what_the_decoders_print_in_a_gpu_run_is_held_back_as_in_a_cpu_run(imagenet, tmp_path):
    """A GPU image command's workers start at its first line, before it holds back what libraries print; libtiff's
    lines from their CPU fallback went straight to the terminal. They now come through the early pipe
    (``engine/execute/early_stderr.py``) and are counted in the summary, as a CPU run's are."""
    import json

    from tests.cli.test_user_defects import _noisy_tiff
    from tests.helpers import child_env, run_cli

    for k in range(3):
        (imagenet / "bird" / f"fax{k}.tif").write_bytes(_noisy_tiff())
    p = run_cli("convert", imagenet, tmp_path / "a", "--to", "webdataset", "--resize-shorter", "32", "--device", "gpu",
                "--json", env=child_env(COLUMNS="400"))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["device"].startswith("gpu") and "Fax4Decode" not in p.stderr
    assert summary["library_messages"] >= 3


def test_gpu_iterate_files_draws_anew_each_epoch_and_matches_the_cpu(tmp_path):
    """repeat=True: every epoch new crops and flips on the GPU, the same ones on a rerun, and the same
    draws as the CPU path's epochs (pixels agree to the resamplers' rounding)."""
    from gpubatch.pipelines.image import ImagePipeline

    files = []
    for i in range(8):
        files.append(tmp_path / f"img{i}.jpg")
        files[-1].write_bytes(jpeg_bytes(photo(200 + 9 * i, 260 - 7 * i, seed=i), 92))
    ops = [RandomResizedCrop(64), Flip(), Normalize(layout="CHW", dtype="float32")]

    def epochs(device: str) -> list:
        with ImagePipeline(ops, device=device, seed=5) as pipe:
            out = []
            for k, batch in enumerate(pipe.iterate_files(files, batch_size=8, repeat=True, workers=1)):
                out.append(batch.stacked().get() if device == "gpu" else np.stack(batch))
                if k == 2:
                    break
        return out

    gpu, again, cpu = epochs("gpu"), epochs("gpu"), epochs("cpu")
    assert all(np.array_equal(a, b) for a, b in zip(gpu, again))
    assert not np.array_equal(gpu[0], gpu[1]) and not np.array_equal(gpu[1], gpu[2])
    for g, c in zip(gpu, cpu):
        assert np.abs(g - c).mean() < 0.05


def test_images_of_several_frames_are_counted_on_the_gpu_path_as_on_the_cpu(tmp_path):
    """The animated GIF, WebP and PNG and the TIFF of pages that a re-encoding run writes the first frame of are
    counted by the GPU run's feed as by the CPU's run (``first_frames``), the stills not."""
    from tests.cli.test_user_defects import _several_frames

    _several_frames(tmp_path / "src" / "a")
    for dev in ("cpu", "gpu"):
        s = convert(tmp_path / "src", tmp_path / dev, to="webdataset", resize_shorter=32, device=dev)
        assert s.records_out == 9 and s.first_frames == 4 and not s.skipped, (dev, s.as_dict())
