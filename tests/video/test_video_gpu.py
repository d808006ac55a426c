"""Video on the GPU (``make gpu-test``): NVDEC frames against PyAV's for the same indices, several
decoders at once, GPU convert to frames and clips against the CPU path, and the per-file fallback."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from gpubatch.api import convert

from .clips import class_folders, make_clip

pytestmark = pytest.mark.gpu
#: augment chains whose temporal op picks the same frames on the GPU as on the CPU (op coverage test)
@pytest.fixture(autouse=True)
def _pyav():
    pytest.importorskip("av", reason="PyAV (the CPU reference) is not installed")


TEMPORAL_CHAINS = {"random_clip": "random_clip(length=6, step=2) | random_resized_crop(size=40) | flip()",
                   "clip": "clip(length=4, step=3) | color_jitter(brightness=0.4)"}


#: (container, encoder, size): what the native loop's frames are checked for (the Python loop: MP4 H.264 and HEVC)
CASES = [("mp4", "libx264", (320, 240)), ("mp4", "libx265", (352, 288)), ("mp4", "libx264", (1280, 720)),
         ("mp4", "libvpx-vp9", (320, 240)), ("mp4", "libsvtav1", (320, 240)),
         # (the native session's BothLoops sends these to the Python loop: benchmarks/nvdec_containers.py)
         ("mkv", "libx264", (320, 240)), ("mkv", "libx265", (352, 288)), ("ts", "libx264", (320, 240)),
         ("ts", "libx265", (352, 288)), ("flv", "libx264", (320, 240))]


@pytest.mark.parametrize("loop,container,codec,size", [("native", *c) for c in CASES] +
                         [("python", *c) for c in CASES if c[1] in ("libx264", "libx265")])
def test_nvdec_frames_match_pyav_at_the_same_indices(tmp_path, loop, container, codec, size):
    import cupy as cp

    from gpubatch.engine.codecs.video import FrameCursor
    from gpubatch.engine.codecs.video_gpu_caps import nvdec_supports
    from gpubatch.engine.codecs.video_probe import probe
    from gpubatch.engine.gpu.nvdec_loop import BothLoops, PythonLoop
    from gpubatch.engine.gpu.video import NvdecSession, cpu_reason

    w, h = size
    path = make_clip(tmp_path / f"c.{container}", 40, w, h, codec)
    data = path.read_bytes()
    info = probe(data)
    if not nvdec_supports(info, 0):  # (the H200's decode caps refused the AV1 clip: such files go to the CPU)
        pytest.skip(f"NVDEC here does not decode {info.codec}")
    idx = [0, 5, 13, 14, 27, 39, 2]  # (seeks back and forth over keyframes 12 frames apart)
    cpu = FrameCursor(data, info, [idx]).frames(idx).astype(np.int16)
    s = NvdecSession(0, loop=loop)
    assert s.loop is (BothLoops if loop == "native" else PythonLoop)
    assert cpu_reason(info, 0, s.loop) == "" and info.frames == 40 and len(info.keyframes) == 4
    for source in (None, str(path)) if loop == "native" else (None,):  # from its bytes (a spool file), its file
        assert s.open(data, info, source), s.why
        gpu = np.stack([cp.asnumpy(a) for a in s.decode(idx)]).astype(np.int16)
        assert gpu.shape == cpu.shape
        per_frame = np.abs(gpu - cpu).mean(axis=(1, 2, 3))
        off_by_one = np.abs(gpu[1:] - cpu[:-1]).mean(axis=(1, 2, 3))
        print(f"{loop} {container} {codec} {w}x{h}: mean abs difference per frame {np.round(per_frame, 2).tolist()}, "
              f"neighbouring frames {np.round(off_by_one, 1).tolist()}")
        assert per_frame.max() <= 2.0  # the bound
        assert off_by_one.min() > 4 * max(per_frame.max(), 0.5)  # a frame one index off would show
    s.close()


def test_nvdec_native_loop_takes_a_window_and_every_frame_in_order(tmp_path):
    """A stretch of a video (DALI's file lists: its frames counted from its start) and every frame one
    after another, as ``--frames every:1`` takes them, through the native loop."""
    import cupy as cp

    from gpubatch.engine.codecs.video import FrameCursor
    from gpubatch.engine.codecs.video_probe import probe
    from gpubatch.engine.gpu.video import NvdecSession

    data = make_clip(tmp_path / "c.mp4", 60, 320, 240).read_bytes()
    whole = probe(data)
    for info in (whole, whole.window(1.0, 2.0)):
        idx = list(range(info.frames))
        cpu = FrameCursor(data, info, [idx]).frames(idx).astype(np.int16)
        s = NvdecSession(0, chunk=8, loop="native")
        assert s.open(data, info)
        gpu = np.concatenate([np.stack([cp.asnumpy(a) for a in s.decode(idx[i: i + 8])])
                              for i in range(0, len(idx), 8)]).astype(np.int16)
        s.close()
        assert np.abs(gpu - cpu).mean(axis=(1, 2, 3)).max() <= 2.0, info.offset


def _members(out: Path) -> dict[str, bytes]:
    got = {}
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                got[m.name] = t.extractfile(m).read()
    return got


def _img(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.int16)


@pytest.mark.parametrize("loop", ["native", "python"])
def test_gpu_convert_to_frames_and_clips_matches_the_cpu_path(tmp_path, monkeypatch, loop):
    src = class_folders(tmp_path / "src")
    for k in range(6):  # more clips than decoders: several sessions at once
        make_clip(src / "run" / f"r{k}.mp4", 40 + 4 * k, 160, 120)
    monkeypatch.setenv("GPUBATCH_VIDEO_DECODERS", "4")
    monkeypatch.setenv("GPUBATCH_VIDEO_LOOP", loop)
    from gpubatch.engine.gpu.nvdec_loop import sweep_spool

    sweep_spool()  # (what earlier runs, killed, left)
    frames = {}
    for dev in ("cpu", "gpu"):
        s = convert(src, tmp_path / f"frames-{dev}", to="webdataset", frames="every:5", resize_shorter=48,
                    device=dev)
        assert not s.skipped and s.records_in == 10
        if dev == "gpu":  # NVDEC's smallest HEVC frame is 144x144 (GetDecoderCaps); the MKV goes to the Python loop
            assert s.warnings == ["decoded on the CPU: walk/w1 (NVDEC here does not decode hevc yuv420p 96x64)"], (
                s.warnings)
            assert s.fallbacks == len(s.warnings)
        frames[dev] = _members(tmp_path / f"frames-{dev}")
    assert frames["cpu"].keys() == frames["gpu"].keys()
    jpgs = [k for k in frames["cpu"] if k.endswith(".jpg")]
    assert len(jpgs) == sum(len(range(0, n, 5)) for n in (48, 30, 60, 36, 40, 44, 48, 52, 56, 60))
    diffs = {k: np.abs(_img(frames["cpu"][k]) - _img(frames["gpu"][k])).mean() for k in jpgs}
    print(f"frames: {len(jpgs)} JPEGs, CPU vs GPU mean abs difference max {max(diffs.values()):.2f}")
    assert max(diffs.values()) <= 3.0, {k: round(v, 1) for k, v in diffs.items() if v > 3}
    meta = json.loads(frames["gpu"]["jump/j1/000010.json"])
    assert meta["meta"]["frame"] == 10 and meta["meta"]["time"] == pytest.approx(10 / 24, abs=1e-3)

    clips = {}
    for dev in ("cpu", "gpu"):
        s = convert(src, tmp_path / f"clips-{dev}", to="webdataset", clip_length=8, frame_step=2, resize_shorter=32,
                    center_crop=32, device=dev)
        assert not s.skipped, s.skipped
        clips[dev] = _members(tmp_path / f"clips-{dev}")
    assert clips["cpu"].keys() == clips["gpu"].keys()
    import io

    for k in (k for k in clips["cpu"] if k.endswith(".npy")):
        a, b = (np.load(io.BytesIO(clips[d][k])).astype(np.int16) for d in ("cpu", "gpu"))
        assert a.shape == b.shape == (8, 32, 32, 3)
        assert np.abs(a - b).mean() <= 2.0, k
    assert sweep_spool() == 0  # no worker of these runs left its sessions' spool files behind


def test_a_file_nvdec_cannot_decode_falls_back_to_the_cpu(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "a.mp4", 24)
    make_clip(src / "b.mkv", 24, codec="ffv1", pix_fmt="yuv420p", bframes=0)  # no NVDEC decoder for FFV1
    s = convert(src, tmp_path / "out", to="webdataset", frames="every:6", device="gpu")
    assert s.records_out == 8 and not s.skipped
    assert s.fallbacks == 1


def test_an_mpeg_program_stream_with_untimed_frames_goes_to_the_cpu_whole_and_named(tmp_path):
    """FFmpeg's MPEG-PS muxer times one H.264 frame in four; NVDEC's frames are matched by their times, so a GPU run
    hands such a file to the CPU path, which places the untimed frames in turn: every frame written, the
    fallback named with its reason (on the GPU machine, where the route is the one asked)."""
    from PIL import Image

    from .test_video_cpu import _closest

    src = tmp_path / "src"
    make_clip(src / "cls" / "v.mpg", 48, 96, 64, gop=12)
    make_clip(src / "cls" / "w.mp4", 24)
    s = convert(src, tmp_path / "out", to="folder", frames="every:1", device="gpu")
    assert s.records_out == 48 + 24 and not s.skipped and s.fallbacks == 1
    assert len(s.warnings) == 1 and "decoded on the CPU: cls/v" in s.warnings[0], s.warnings
    assert "of its frames carry no timestamp" in s.warnings[0], s.warnings
    files = sorted((tmp_path / "out" / "cls").glob("v*.jpg"))
    assert [_closest(np.asarray(Image.open(f).convert("RGB")), 48) for f in files] == list(range(48))


@pytest.mark.parametrize("loop", ["native", "python"])
def test_a_fragmented_mp4_gives_the_cpu_paths_frames_on_nvdec_and_its_open_end_is_said(tmp_path, monkeypatch, loop):
    """A fragmented MP4 (``moof`` boxes, as live recorders write) decoded on NVDEC: every frame, as the CPU path gives
    it; cut between two fragments, the same frames and the same warning as on the CPU."""
    from tests.helpers import mp4_boxes

    monkeypatch.setenv("GPUBATCH_VIDEO_LOOP", loop)
    path = make_clip(tmp_path / "src" / "a" / "f.mp4", 48, 160, 120, movflags="frag_keyframe+empty_moov")
    data = path.read_bytes()
    moofs = [at for kind, at in mp4_boxes(data) if kind == b"moof"]
    for name, n in (("whole", 48), ("cut", 24)):
        if name == "cut":
            path.write_bytes(data[: moofs[2]])
        got = {}
        for dev in ("cpu", "gpu"):
            s = convert(tmp_path / "src", tmp_path / f"{name}-{dev}", to="webdataset", frames="every:1",
                        resize_shorter=48, device=dev)
            assert s.records_out == n and not s.skipped and not s.fallbacks, (name, dev, s.warnings)
            assert len(s.warnings) == (name == "cut"), s.warnings
            got[dev] = _members(tmp_path / f"{name}-{dev}")
        jpgs = [k for k in got["cpu"] if k.endswith(".jpg")]
        assert got["cpu"].keys() == got["gpu"].keys() and len(jpgs) == n
        diffs = [np.abs(_img(got["cpu"][k]) - _img(got["gpu"][k])).mean() for k in jpgs]
        assert max(diffs) <= 3.0, (name, max(diffs))


def test_gpu_whole_video_reencode_and_augment(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "a.mp4", 30, 160, 120)
    s = convert(src, tmp_path / "re", to="video", resize_shorter=60, device="gpu")
    assert s.records_out == 1 and not s.skipped
    from gpubatch.engine.codecs.video_probe import probe

    info = probe((tmp_path / "re" / "a.mp4").read_bytes())
    assert (info.width, info.height, info.frames) == (80, 60, 30)
    import io

    from gpubatch.api import augment

    for name, chain in TEMPORAL_CHAINS.items():
        outs = {}
        for dev in ("cpu", "gpu"):
            a = augment(src, tmp_path / f"aug-{name}-{dev}", ops=chain, copies=2, seed=3, to="webdataset", device=dev)
            assert a.records_out == 2 and not a.skipped
            outs[dev] = _members(tmp_path / f"aug-{name}-{dev}")
        assert outs["cpu"].keys() == outs["gpu"].keys()
        for k in outs["cpu"]:
            if k.endswith(".json"):
                assert json.loads(outs["cpu"][k])["meta"]["frames"] == json.loads(outs["gpu"][k])["meta"]["frames"]
            if k.endswith(".npy"):
                a, b = (np.load(io.BytesIO(o[k])).astype(np.int16) for o in (outs["cpu"], outs["gpu"]))
                assert a.shape == b.shape and np.abs(a - b).mean() <= 2.0, (name, k)


@pytest.mark.parametrize("codec,chroma,depth", [("h264", "420", 8), ("hevc", "420", 10), ("hevc", "444", 8)])
def test_nvdec_caps_are_asked_in_the_runs_own_context(codec, chroma, depth):
    """The driver's decode caps, asked in the primary context the run holds: what PyNvVideoCodec's own
    query answers, and no second context (about 500 MiB while it lives) on the way."""
    import cupy as cp
    import PyNvVideoCodec as nvc

    from gpubatch.engine.codecs.video_gpu_caps import CUDA_CODEC, _member, _query
    from gpubatch.engine.gpu.memory import ProcessMemory

    cp.cuda.Device(0).use()
    cp.zeros(1).sum().item()  # the primary context, as a run holds it
    cc = _member(nvc.cudaVideoCodec, CUDA_CODEC[codec])
    cf = _member(nvc.cudaVideoChromaFormat, f"_{chroma}", chroma, f"YUV{chroma}")
    mem = ProcessMemory(interval=0.001)
    if not mem.ok:
        pytest.skip("no NVML here")
    before = mem.settled()
    mem.start()
    ours = _query(0, int(cc), int(cf), depth)
    peak = mem.stop()
    theirs = nvc.GetDecoderCaps(gpuid=0, codec=cc, chromaformat=cf, bitdepth=depth)
    get = theirs.get if isinstance(theirs, dict) else (lambda k: getattr(theirs, k, None))
    keys = ("is_supported", "num_decoder_engines", "width_max", "height_max", "width_min", "height_min")
    assert get("width_max") is not None, theirs
    for k in (k for k in keys if get(k) is not None):
        assert getattr(ours, k) == get(k), (k, theirs)
    assert ours.is_supported and ours.width_max >= 4096
    assert peak - before < 16 << 20, (before >> 20, peak >> 20)


def test_a_video_commands_worker_started_at_its_start_is_taken_on_the_gpu_and_writes_the_same_bytes(tmp_path):
    """The ``gpubatch`` command starts a GPU video run's worker from its arguments alone (``execute.early.sniff``):
    on the GPU the run takes it, told its kernels (the frames' colour conversion, the chain's, the JPEG encoder's),
    and writes the bytes of a run through the API, whose worker starts with its tasks; the summary has the worker's
    steps (``wall (worker): ...``)."""
    from gpubatch.engine.gpu.start import video_kernels
    from gpubatch.engine.plan import make_plan
    from tests.engine.test_shards import digest
    from tests.engine.test_sniff import _cli

    src = tmp_path / "src"
    for k in range(3):
        make_clip(src / f"v{k}.mp4", 36 + 6 * k, 320, 240)
    args = ["--to", "webdataset", "--frames", "every:3", "--resize-shorter", "64", "--device", "gpu", "--quiet"]
    seen = _cli(["convert", str(src), str(tmp_path / "sniffed"), *args], node=True)
    assert len(seen["sniffed"]) == 1 and seen["taken"] == seen["sniffed"]
    assert seen["kernels"] == [list(map(list, video_kernels(make_plan(64, None))))]
    s = convert(src, tmp_path / "api", to="webdataset", frames="every:3", resize_shorter=64, device="gpu")
    assert s.records_out == 12 + 14 + 16 and not s.skipped and not s.fallbacks
    assert digest(tmp_path / "sniffed") == digest(tmp_path / "api")
    steps = {k for k in s.timings if k.startswith("wall (worker): ")}
    assert {"wall (worker): unit start", "wall (worker): first NVDEC session made",
            "wall (worker): first video opened", "wall (worker): first frames decoded and encoded"} <= steps, steps
