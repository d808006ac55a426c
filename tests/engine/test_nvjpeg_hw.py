"""The hardware engine's direct path: what can be checked without a GPU (the GPU tests are in test_gpu.py)."""

from __future__ import annotations

import ctypes

import pytest

from gpubatch.engine.codecs import image_gpu, nvjpeg_hw
from gpubatch.errors import DependencyError


def test_image_struct_matches_nvjpeg_h():
    """nvjpegImage_t of CUDA 13: four channel pointers, then four size_t pitches."""
    assert ctypes.sizeof(nvjpeg_hw._Image) == 8 * ctypes.sizeof(ctypes.c_void_p)
    assert nvjpeg_hw._Image.pitch.offset == 4 * ctypes.sizeof(ctypes.c_void_p)


def test_direct_path_is_chosen_by_argument_then_environment(monkeypatch):
    monkeypatch.delenv("GPUBATCH_HW_DIRECT", raising=False)
    assert image_gpu._want_direct(None) is True
    assert image_gpu._want_direct(False) is False
    monkeypatch.setenv("GPUBATCH_HW_DIRECT", "0")
    assert image_gpu._want_direct(None) is False
    assert image_gpu._want_direct(True) is True
    monkeypatch.setattr(image_gpu, "HW_DIRECT", False)
    monkeypatch.delenv("GPUBATCH_HW_DIRECT")
    assert image_gpu._want_direct(None) is False


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
    monkeypatch.setattr(image_gpu, "HW_PLANES", "chunked")
    assert image_gpu.want_planes(96) and not image_gpu.want_planes(0)
    assert not image_gpu.want_planes(image_gpu.DECODE_CHUNK)  # the default: whole calls, in RGB
    monkeypatch.setattr(image_gpu, "HW_PLANES", "always")
    assert image_gpu.want_planes(0)
    monkeypatch.setattr(image_gpu, "HW_PLANES", "never")
    assert not image_gpu.want_planes(96)
