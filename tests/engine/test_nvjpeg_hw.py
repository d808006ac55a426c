"""The hardware engine's direct path: what can be checked without a GPU (the GPU tests are in test_gpu.py)."""

from __future__ import annotations

import ctypes

import pytest

from gpubatch.engine.codecs import nvjpeg_hw
from gpubatch.engine.codecs.decode_buffers import want_planes
from gpubatch.engine.settings import Settings
from gpubatch.errors import DependencyError


def test_image_struct_matches_nvjpeg_h():
    """nvjpegImage_t of CUDA 13: four channel pointers, then four size_t pitches."""
    assert ctypes.sizeof(nvjpeg_hw._Image) == 8 * ctypes.sizeof(ctypes.c_void_p)
    assert nvjpeg_hw._Image.pitch.offset == 4 * ctypes.sizeof(ctypes.c_void_p)


def test_direct_path_is_chosen_by_argument_then_environment(monkeypatch):
    monkeypatch.delenv("GPUBATCH_HW_DIRECT", raising=False)
    assert Settings.from_env().hw_direct is True
    monkeypatch.setenv("GPUBATCH_HW_DIRECT", "0")
    assert Settings.from_env().hw_direct is False
    assert Settings.from_env(hw_direct=True).hw_direct is True  # an argument over the environment


def test_missing_nvjpeg_is_a_dependency_error(monkeypatch):
    """Where libnvjpeg cannot be loaded the binding says what to install (the decoder then falls back
    to nvImageCodec's hardware decoder, with a warning)."""
    nvjpeg_hw.library.cache_clear()
    monkeypatch.setattr(nvjpeg_hw, "library_path", lambda: "/nonexistent/libnvjpeg.so.13")
    try:
        with pytest.raises(DependencyError, match="nvJPEG"):
            nvjpeg_hw.library()
    finally:
        nvjpeg_hw.library.cache_clear()


def test_failed_call_names_the_call_and_status():
    e = nvjpeg_hw.NvjpegError("nvjpegDecodeBatched", 3)
    assert e.status == 3 and "nvjpegDecodeBatched" in str(e)
    with pytest.raises(nvjpeg_hw.NvjpegError):
        nvjpeg_hw._check("nvjpegDecodeBatched", 5)
    nvjpeg_hw._check("nvjpegDecodeBatched", nvjpeg_hw.STATUS_SUCCESS)


def test_planes_are_asked_for_with_chunked_decode_unless_told(monkeypatch):
    """Decoding into planes is slower in nvJPEG than its RGB, so whole parts keep RGB by default."""
    st = Settings()
    assert st.hw_planes == "chunked"
    assert want_planes(96, st) and not want_planes(0, st)
    assert not want_planes(st.decode_chunk, st)  # the default: whole calls, in RGB
    assert want_planes(0, Settings(hw_planes="always"))
    assert not want_planes(96, Settings(hw_planes="never"))
