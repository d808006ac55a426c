"""Which videos this machine's NVDEC decodes: the driver's ``cuvidGetDecoderCaps`` per (codec, chroma
format, bit depth), checked against each video's size. Asked only where a GPU is; nothing is imported
on a machine without one.

The query runs in the device's primary context (the one CuPy, nvImageCodec and the decoders share),
retained for the call: PyNvVideoCodec's own ``GetDecoderCaps`` makes a context of its own for each
query, about 500 MiB with the driver's default stack for the moment it lives (inferred: a capped video
run's peak, 778 MiB = its 260 + 518, went with the query; benchmarks/gpu_memory.py caps --media video),
which a run under ``--gpu-memory`` cannot afford. Where the driver's entry points cannot be had, PyNvVideoCodec's query is used.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

# PyAV's codec names -> the name of cudaVideoCodec's member
CUDA_CODEC = {"h264": "H264", "hevc": "HEVC", "vp8": "VP8", "vp9": "VP9", "av1": "AV1", "mpeg1video": "MPEG1",
               "mpeg2video": "MPEG2", "mpeg4": "MPEG4", "vc1": "VC1", "mjpeg": "JPEG"}


@functools.lru_cache(maxsize=1)
def nvc() -> Any:
    """PyNvVideoCodec, or None where it or a GPU is missing."""
    from ..device import gpu_problem

    problem, _ = gpu_problem(0)
    if problem and "nvImageCodec" not in problem:
        return None
    try:
        import PyNvVideoCodec as mod
    except Exception:  # noqa: BLE001 - missing, or its driver libraries absent (no NVDEC here)
        return None
    return mod


def _chroma(pix_fmt: str) -> str:
    if "444" in pix_fmt:
        return "444"
    if "422" in pix_fmt:
        return "422"
    if pix_fmt.startswith("gray"):
        return "Monochrome"
    return "420"


def _member(enum: Any, *names: str) -> Any:
    for n in names:
        if hasattr(enum, n):
            return getattr(enum, n)
    raise AttributeError(names[0])


class _DecodeCaps(ctypes.Structure):
    """CUVIDDECODECAPS (cuviddec.h): three inputs, then what the driver fills in; the tail is room to
    spare for the reserved words of this and later versions of the struct."""

    _fields_ = [("codec", ctypes.c_int), ("chroma", ctypes.c_int), ("depth_minus8", ctypes.c_uint),
                ("reserved1", ctypes.c_uint * 3), ("is_supported", ctypes.c_ubyte),
                ("num_decoder_engines", ctypes.c_ubyte), ("output_formats", ctypes.c_ushort),
                ("width_max", ctypes.c_uint), ("height_max", ctypes.c_uint), ("mb_max", ctypes.c_uint),
                ("width_min", ctypes.c_ushort), ("height_min", ctypes.c_ushort), ("reserved3", ctypes.c_uint * 16)]


@functools.lru_cache(maxsize=1)
def _driver() -> tuple[Any, Any]:
    """(libcuda, cuvidGetDecoderCaps), loaded from the driver's libraries."""
    cuda, cuvid = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libnvcuvid.so.1")
    query = cuvid.cuvidGetDecoderCaps
    query.argtypes, query.restype = [ctypes.POINTER(_DecodeCaps)], ctypes.c_int
    return cuda, query


def _query(gpu: int, codec: int, chroma: int, depth: int) -> _DecodeCaps:
    """The driver's decode caps, asked in GPU ``gpu``'s primary context (retained for the call, so that
    one that a run already holds is shared and none is left behind)."""
    cuda, query = _driver()

    def check(rc: int, what: str) -> None:
        if rc:
            raise OSError(f"{what} failed: CUresult {rc}")

    dev, ctx, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuInit(0), "cuInit")
    check(cuda.cuDeviceGet(ctypes.byref(dev), gpu), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    try:
        check(cuda.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            caps = _DecodeCaps(codec=codec, chroma=chroma, depth_minus8=depth - 8)
            check(query(ctypes.byref(caps)), "cuvidGetDecoderCaps")
        finally:
            cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
    finally:
        cuda.cuDevicePrimaryCtxRelease_v2(dev)
    return caps


@functools.lru_cache(maxsize=64)
def _caps(gpu: int, codec: str, chroma: str, depth: int) -> tuple[int, int, int, int] | None:
    """(max width, max height, min width, min height) NVDEC decodes for this stream kind; None: not at all."""
    mod = nvc()
    name = CUDA_CODEC.get(codec)
    if mod is None or name is None:
        return None
    try:
        cc = _member(mod.cudaVideoCodec, name)
        cf = _member(mod.cudaVideoChromaFormat, f"_{chroma}", chroma, f"YUV{chroma}")
    except Exception:  # noqa: BLE001 - an API without this entry: decoding will tell per file
        return (1 << 16, 1 << 16, 0, 0)
    try:
        caps: Any = _query(gpu, int(cc), int(cf), depth)
    except (OSError, AttributeError, TypeError, ValueError):  # no driver entry points: PyNvVideoCodec asks
        try:
            caps = mod.GetDecoderCaps(gpuid=gpu, codec=cc, chromaformat=cf, bitdepth=depth)
        except Exception:  # noqa: BLE001 - an API without this entry: decoding will tell per file
            return (1 << 16, 1 << 16, 0, 0)
    get = caps.get if isinstance(caps, dict) else (lambda k, d=0: getattr(caps, k, d))
    if not get("is_supported", 1) or not get("width_max", 0) or not get("num_decoder_engines", 1):
        return None
    return int(get("width_max")), int(get("height_max")), int(get("width_min", 0)), int(get("height_min", 0))


def nvdec_supports(info: Any, gpu: int = 0) -> bool:
    """Whether NVDEC here decodes the video of ``info`` (codec, profile's chroma and depth, size)."""
    caps = _caps(gpu, info.codec, _chroma(info.pix_fmt), info.bit_depth)
    if caps is None:
        return False
    w, h = (info.height, info.width) if info.rotation in (90, 270) else (info.width, info.height)
    return caps[2] <= w <= caps[0] and caps[3] <= h <= caps[1]
