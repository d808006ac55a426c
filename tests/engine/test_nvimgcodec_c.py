"""The ctypes declarations of nvImageCodec's C API (no GPU needed): layouts and host addresses."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gpubatch.engine.codecs import nvimgcodec_c as capi
from gpubatch.engine.codecs.image_gpu import _host_address


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


def test_library_path_says_what_is_missing(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_nvimgcodec(name, *args, **kw):
        if name == "nvidia" and args and args[2] and "nvimgcodec" in args[2]:
            raise ImportError(name)
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_nvimgcodec)
    from gpubatch.errors import DependencyError

    with pytest.raises(DependencyError, match="nvImageCodec"):
        capi.library_path()
