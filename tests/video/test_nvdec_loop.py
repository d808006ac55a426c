"""The NVDEC packet loop's choice, its spool files and the reasons a video goes to the CPU: what needs no
GPU (the frames themselves are checked against PyAV's in test_video_gpu.py, on the GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest

from gpubatch.engine.codecs.video_probe import VideoInfo
from gpubatch.engine.gpu.nvdec_loop import (
    BothLoops,
    NativeLoop,
    PythonLoop,
    cpu_reason,
    drop_spools,
    loop_class,
    nvdec_takes,
    sweep_spool,
)
from gpubatch.engine.settings import Settings
from gpubatch.errors import UsageError


def _info(container: str = "mp4", codec: str = "h264", rotation: int = 0) -> VideoInfo:
    return VideoInfo(container=container, codec=codec, profile=None, width=320, height=240, rotation=rotation,
                     bit_depth=8, pix_fmt="yuv420p", fps=24.0, vfr=False, duration=1.0,
                     times=np.arange(24) / 24, keyframes=(0, 12), pts=np.arange(24) * 512)


def test_the_native_loop_where_pynvvideocodec_has_it_else_the_python_loop():
    with_native = types.SimpleNamespace(CreateThreadedDecoder=object())
    without = types.SimpleNamespace()
    assert loop_class("native", with_native) is BothLoops  # (the native loop for MP4 and MOV, else the Python loop)
    assert loop_class("native", without) is PythonLoop  # (PyNvVideoCodec before 2.2)
    assert loop_class("python", with_native) is PythonLoop
    assert loop_class("native", None) is PythonLoop
    for cls in (NativeLoop, PythonLoop, BothLoops):  # (a session makes any from the same arguments)
        cls(None, 0, None, 32).close()
    assert Settings.from_env({}).video_loop == "native"
    assert Settings.from_env({"GPUBATCH_VIDEO_LOOP": "python"}).video_loop == "python"
    with pytest.raises(UsageError, match="unknown video loop 'c'"):
        Settings.from_env({"GPUBATCH_VIDEO_LOOP": "c"})


def test_why_a_video_goes_to_the_cpu_names_the_loops_containers_and_codecs():
    # (each of these is told before the GPU's decode caps are asked)
    assert cpu_reason(_info(rotation=90), 0, NativeLoop) == "rotated"
    assert cpu_reason(_info("npy", "rawvideo"), 0, NativeLoop) == "a decoded clip"
    assert cpu_reason(_info("webm", "vp9"), 0, PythonLoop) == (
        "webm: NVDEC's frames are checked against the CPU's for FLV, MKV, MOV, MP4 and TS files")
    assert cpu_reason(_info("mkv"), 0, NativeLoop) == (
        "mkv: NVDEC's frames are checked against the CPU's for MOV and MP4 files")
    # a session of both loops: the one its container and codec were checked on, its reasons where neither was
    assert BothLoops.route(_info("mp4", "vp9")) is NativeLoop and BothLoops.route(_info("mov")) is NativeLoop
    assert BothLoops.route(_info("mkv")) is PythonLoop and BothLoops.route(_info("ts", "hevc")) is PythonLoop
    assert BothLoops.route(_info("flv")) is PythonLoop and BothLoops.route(_info("webm", "vp9")) is None
    assert cpu_reason(_info("webm", "vp9"), 0, BothLoops) == (
        "webm: NVDEC's frames are checked against the CPU's for FLV, MKV, MOV, MP4 and TS files")
    assert cpu_reason(_info("mkv", "vp9"), 0, BothLoops) == "vp9: gpubatch's NVDEC path takes h264, hevc here"
    assert cpu_reason(_info("mp4", "mpeg4"), 0, BothLoops) == (
        "mpeg4: gpubatch's NVDEC path takes av1, h264, hevc, vp9 here")
    assert cpu_reason(_info("mp4", "mpeg4"), 0, NativeLoop) == (
        "mpeg4: gpubatch's NVDEC path takes av1, h264, hevc, vp9 here")
    assert cpu_reason(_info("mp4", "vp9"), 0, PythonLoop) == "vp9: gpubatch's NVDEC path takes h264, hevc here"


def test_the_native_loop_spools_a_records_bytes_and_removes_them(tmp_path, monkeypatch):
    monkeypatch.setattr("gpubatch.engine.gpu.nvdec_loop._spool_dir", lambda: tmp_path)
    loop = NativeLoop(None, 0, None, 4)
    assert loop.open(b"first video", _info()) == ""
    (spool,) = tmp_path.iterdir()
    assert spool.name.startswith(f"gpubatch-nvdec-{os.getpid()}-") and spool.read_bytes() == b"first video"
    assert loop.open(b"the second", _info("mp4", "av1")) == ""
    assert [p.read_bytes() for p in tmp_path.iterdir()] == [b"the second"]  # (one file a session, replaced)
    assert loop.open(b"", _info(), path="/data/v.mp4") == "" and loop._path == "/data/v.mp4"  # a file: no copy
    assert "vp8" in loop.open(b"x", _info("mp4", "vp8"))
    loop.close()
    assert not list(tmp_path.iterdir())


def test_spool_files_of_processes_that_are_gone_are_swept(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    (tmp_path / f"gpubatch-nvdec-{dead}-0").write_bytes(b"left by a killed worker")
    mine = tmp_path / f"gpubatch-nvdec-{os.getpid()}-0"
    mine.write_bytes(b"in use")
    (tmp_path / "gpubatch-nvdec-notapid-0").write_bytes(b"not ours to judge")
    assert sweep_spool(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, "gpubatch-nvdec-notapid-0"])


def test_a_worker_drops_its_own_spool_files_once_its_videos_are_decoded(tmp_path):
    """A GPU worker may be ended as soon as it says it holds nothing of the run, before its sessions close:
    it drops its spool files first (the last videos its sessions decoded), leaving other processes' alone."""
    mine = [tmp_path / f"gpubatch-nvdec-{os.getpid()}-{k}" for k in range(2)]
    for p in mine:
        p.write_bytes(b"a last video")
    other = tmp_path / f"gpubatch-nvdec-{os.getppid()}-0"
    other.write_bytes(b"another worker's")
    assert drop_spools(tmp_path) == 2
    assert [p.name for p in tmp_path.iterdir()] == [other.name]


def test_info_counts_the_videos_the_gpu_path_sends_to_nvdec(monkeypatch):
    """``info``'s "NVDEC here" is what a GPU convert decodes there: not a WebM or a rotated file NVDEC could
    decode but the path sends to the CPU; None without a GPU decoder."""
    import gpubatch.engine.gpu.nvdec_loop as nl

    videos = [_info(), _info("mkv"), _info(rotation=90), _info("mp4", "vp9"), _info("mp4", "mpeg4"),
              _info("webm", "vp9")]
    monkeypatch.setattr(nl, "nvc", lambda: None)
    assert nvdec_takes(videos) is None
    monkeypatch.setattr(nl, "nvc", lambda: types.SimpleNamespace(CreateThreadedDecoder=object()))
    monkeypatch.setattr(nl, "nvdec_supports", lambda info, gpu: True)  # (the driver's caps: every codec here)
    assert nvdec_takes(videos, 0, "native") == 3  # the H.264 and the VP9 MP4s, the MKV (by the Python loop)
    assert nvdec_takes(videos, 0, "python") == 2  # the Python loop: H.264 and HEVC only
    monkeypatch.setattr(nl, "nvdec_supports", lambda info, gpu: info.codec != "vp9")
    assert nvdec_takes(videos, 0, "native") == 2
