"""The hardware JPEG engine through nvJPEG's batched API, called directly (``libnvjpeg`` via ctypes).

nvImageCodec drives the same engine through the same nvJPEG calls, with a per-image layer around them:
a code stream and an output descriptor per image, and per image a second parse of its header
(``nvjpegJpegStreamParseHeader``) and a capability check on the decoder's worker threads before the
batched call. gpubatch has already read every header (kind, size) when it routes a batch, so here a
call is one ``nvjpegDecodeBatched`` over the encoded bytes and the output places, nothing per image.

One :class:`HwBatchDecoder` is one nvJPEG handle and decode state. nvJPEG keeps a call's bitstreams in
the state's pinned buffers until the engine has read them, so a call first waits (on the host) until
the same instance's previous call has finished on the GPU; callers alternate over two or more
instances so that this wait finds the work done.
"""

from __future__ import annotations

import ctypes as C
import functools
import importlib.util
import os
import time
from typing import Any

from ...errors import DependencyError
from ..gpu.context import record_held
from .hw_native import STEPS, Call, Driver, address
from .hw_native import library as native_library

BACKEND_HARDWARE = 3  # nvjpegBackend_t
OUTPUT_YUV = 1  # nvjpegOutputFormat_t: the JPEG's own planes (Y, Cb, Cr at their sampled sizes)
OUTPUT_RGBI = 5  # nvjpegOutputFormat_t: interleaved RGB
STATUS_SUCCESS = 0
# NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION: chroma upsampled by interpolation, as libjpeg (and so
# Pillow) does it, and as nvImageCodec asks for it. Without it the engine's 4:2:0 and 4:2:2 output
# differed from Pillow's by up to 28-32 levels (mean 0.9-1.4); with it, it equals nvImageCodec's
# hardware decoder's and is within 1 level of Pillow's, at 7-9% less speed for the engine alone
# (21,908 against 23,993 and 26,366 against 28,242 images/s; H200, the decode study (docs/engine.md), group
# "nvjpeg", mode 0 without it)
FLAGS = 1 << 5
_MAX_COMPONENT = 4


class NvjpegError(RuntimeError):
    """An nvJPEG call failed (``status``: its nvjpegStatus_t)."""

    def __init__(self, call: str, status: int):
        super().__init__(f"{call} failed with nvJPEG status {status}")
        self.status = status


class _Image(C.Structure):  # nvjpegImage_t (CUDA 13: size_t pitches)
    _fields_ = [("channel", C.c_void_p * _MAX_COMPONENT), ("pitch", C.c_size_t * _MAX_COMPONENT)]


def library_path() -> str:
    """``libnvjpeg.so.13`` where the CUDA 13 nvJPEG wheel puts it (``nvidia/cu13/lib``), else the bare
    name for the dynamic loader."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []):
        path = os.path.join(root, "cu13", "lib", "libnvjpeg.so.13")
        if os.path.exists(path):
            return path
    return "libnvjpeg.so.13"


def _declare(lib: Any, calls: dict[str, list[Any]]) -> Any:
    """Give ``lib``'s ``calls`` their argument types (each returns an nvjpegStatus_t); returns ``lib``."""
    for name, args in calls.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, C.c_int
    return lib


@functools.cache
def library() -> Any:
    """libnvjpeg, its calls declared (the GIL is released for each)."""
    try:
        lib = C.CDLL(library_path())
    except OSError as e:
        from ..install import install_hint

        raise DependencyError(f"nvJPEG's library is not loadable ({e}): {install_hint()}") from None
    vp, st = C.c_void_p, C.c_int
    return _declare(lib, {
        "nvjpegCreateEx": [st, vp, vp, C.c_uint, C.POINTER(vp)],
        "nvjpegDestroy": [vp],
        "nvjpegJpegStateCreate": [vp, C.POINTER(vp)],
        "nvjpegJpegStateDestroy": [vp],
        "nvjpegGetHardwareDecoderInfo": [vp, C.POINTER(C.c_uint), C.POINTER(C.c_uint)],
        "nvjpegDecodeBatchedInitialize": [vp, vp, C.c_int, C.c_int, st],
        "nvjpegDecodeBatched": [vp, vp, C.POINTER(vp), C.POINTER(C.c_size_t), C.POINTER(_Image), vp],
        "nvjpegDecodeBatchedPreAllocate": [vp, vp, C.c_int, C.c_int, C.c_int, st, st],
        "nvjpegDecodeBatchedEx": [vp, vp, C.POINTER(vp), C.POINTER(C.c_size_t), C.POINTER(_Image), C.POINTER(vp), vp],
        "nvjpegDecodeParamsCreate": [vp, C.POINTER(vp)],
        "nvjpegDecodeParamsDestroy": [vp],
    })


@functools.cache
def short_calls() -> Any:
    """libnvjpeg again (loaded by :func:`library` first), for its short calls with the GIL kept: the
    decode parameters' setters (a few field writes each; a region call makes one or more per image) and
    a call's ``nvjpegDecodeBatchedInitialize``. A thread that lets the GIL go must wait to get it back
    while the process's other threads run Python, a switch interval or more each time: releasing it for
    each setter ran the training chain with region decode at 15,500-16,400 images/s against
    21,600-22,500 in full (H200), and the hardware engine alone, two busy Python threads beside it,
    got 5,400-8,300 images a second out of its calls against 21,300-24,100 (``benchmarks/hw_rate.py
    --gil-threads``, 2026-12-03 "15:23 to 15:38"). Only ``nvjpegDecodeBatched`` itself, which takes
    milliseconds, lets it go, and the wait for the instance's previous call where a query finds it
    unfinished; the call's end event is recorded with the GIL kept as well
    (:func:`~gpubatch.engine.gpu.context.record_held`, where the measured gain is)."""
    library()
    vp, st = C.c_void_p, C.c_int
    return _declare(C.PyDLL(library_path()), {
        "nvjpegDecodeParamsSetOutputFormat": [vp, st],
        "nvjpegDecodeParamsSetROI": [vp, C.c_int, C.c_int, C.c_int, C.c_int],
        "nvjpegDecodeParamsSetExifOrientation": [vp, st],
        "nvjpegDecodeBatchedInitialize": [vp, vp, C.c_int, C.c_int, st],
    })


def _check(call: str, status: int) -> None:
    if status != STATUS_SUCCESS:
        raise NvjpegError(call, status)


def call_args(sources: list[tuple[int, int]], outputs: list[tuple[int, ...]]) -> tuple[int, Any, Any, Any]:
    """The arrays one ``nvjpegDecodeBatched`` call takes, for :meth:`HwBatchDecoder.decode` (``args=``):
    built ahead, in a thread other than the one making the calls, which is the pipeline's pace."""
    n = len(sources)
    data = (C.c_void_p * n)(*[a for a, _ in sources])
    sizes = (C.c_size_t * n)(*[s for _, s in sources])
    images = (_Image * n)()
    for img, places in zip(images, outputs):
        for c in range(len(places) // 2):
            img.channel[c], img.pitch[c] = places[2 * c], places[2 * c + 1]
    return n, data, sizes, images


class HwBatchDecoder:
    """One nvJPEG hardware-backend handle and decode state (see the module docstring). Make it with the
    device current; ``cp`` is CuPy (for the event that tracks the previous call), or None to make it
    before CuPy is imported (a worker's start: ``device`` named, its context current through the driver),
    CuPy then imported at the first call."""

    def __init__(self, cp: Any, device: int | None = None):
        self.lib, self.held = library(), short_calls()  # (held: its short calls, the GIL kept)
        self._cp = cp
        # (made current in each calling thread: nvJPEG allocates there)
        self.device = cp.cuda.runtime.getDevice() if device is None else device
        self.handle, self.state = C.c_void_p(), C.c_void_p()
        _check("nvjpegCreateEx", self.lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, FLAGS, C.byref(self.handle)))
        try:
            _check("nvjpegJpegStateCreate", self.lib.nvjpegJpegStateCreate(self.handle, C.byref(self.state)))
            # nvJPEG's memory pool for the hardware path (nvImageCodec makes this call for the same reason,
            # at the same minimal size)
            _check("nvjpegDecodeBatchedPreAllocate",
                   self.lib.nvjpegDecodeBatchedPreAllocate(self.handle, self.state, 1, 1, 1, 0, OUTPUT_RGBI))
        except NvjpegError:
            if self.state:
                self.lib.nvjpegJpegStateDestroy(self.state)
            self.lib.nvjpegDestroy(self.handle)
            raise
        self.done: Any = None  # the previous call's end on its stream (an event made at the first call)
        self.waited = 0.0  # seconds :meth:`decode` waited for the previous call's end, summed
        self.pending: _Pending | None = None  # the last call queued on a native driver (:meth:`submit`)
        self.params: list[Any] = []  # per-image decode parameters of region calls (made as needed, reused)
        self._params_fmt: list[int] = []  # the output format each of them was set to

    @property
    def cp(self) -> Any:
        if self._cp is None:
            import cupy

            self._cp = cupy
        return self._cp

    def engines(self) -> tuple[int, int]:
        """(hardware engines, cores per engine) nvJPEG reports."""
        n, cores = C.c_uint(), C.c_uint()
        _check("nvjpegGetHardwareDecoderInfo",
               self.lib.nvjpegGetHardwareDecoderInfo(self.handle, C.byref(n), C.byref(cores)))
        return n.value, cores.value

    def decode(self, sources: list[tuple[int, int]], outputs: list[tuple[int, ...]], stream: Any,
               fmt: int = OUTPUT_RGBI, regions: list[tuple[int, int, int, int] | None] | None = None,
               args: tuple[int, Any, Any, Any] | None = None) -> None:
        """Decode ``sources`` ((host address, size) of each JPEG's bytes, valid until this instance's
        next call has begun) into ``outputs`` on ``stream``, not waited for: per image (device address,
        row pitch) of its interleaved RGB (``fmt`` :data:`OUTPUT_RGBI`), or those of its Y, Cb and Cr
        planes, six numbers (:data:`OUTPUT_YUV`). ``regions`` gives per image None or the (y0, x0, y1, x1)
        part to decode (``nvjpegDecodeBatchedEx``; its output is that part's size; each call sets every
        image's ROI afresh). ``args``: :func:`call_args` of ``sources`` and ``outputs``, made already.
        Raises :class:`NvjpegError` where nvJPEG refused the call (the whole call: a corrupt image fails
        its batch)."""
        n, data, sizes, images = args if args is not None else call_args(sources, outputs)
        if not n:
            return
        self._settle()
        done = self.done
        if done is not None and not done.done:  # (a query keeps the GIL; a wait lets it go)
            t0 = time.perf_counter()
            done.synchronize()  # the state's buffers are free again
            self.waited += time.perf_counter() - t0
        lib = self.lib
        with self.cp.cuda.Device(self.device):
            if done is None:  # one event, made at the first call and recorded again at each (record_held)
                done = self.done = self.cp.cuda.Event(disable_timing=True)
            _check("nvjpegDecodeBatchedInitialize",
                   self.held.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, 1, fmt))
            try:
                if regions is None:
                    _check("nvjpegDecodeBatched", lib.nvjpegDecodeBatched(self.handle, self.state, data, sizes, images,
                                                                           C.c_void_p(stream.ptr)))
                else:
                    params = self._region_params(regions, fmt)
                    _check("nvjpegDecodeBatchedEx", lib.nvjpegDecodeBatchedEx(self.handle, self.state, data, sizes,
                                                                               images, params, C.c_void_p(stream.ptr)))
            finally:
                record_held(done, stream)

    def submit(self, driver: Any, sources: list[tuple[int, int]], outputs: list[tuple[int, ...]], stream: Any,
               fmt: int = OUTPUT_RGBI, regions: list[tuple[int, int, int, int] | None] | None = None,
               args: tuple[int, Any, Any, Any] | None = None, publish: Any = None) -> _Pending | None:
        """:meth:`decode`, queued on ``driver`` (a :class:`~gpubatch.engine.codecs.hw_native.Driver`) to be made
        by its native thread instead of here: returns what :meth:`finish` takes (None: nothing to decode).
        ``publish``: an event the driver records on ``stream`` after the call, besides the instance's own.
        ``sources`` must stay valid, and the arrays are kept, until :meth:`finish` has returned. A region
        call first waits for this instance's call still queued (their parameters are the instance's)."""
        n, data, sizes, images = args if args is not None else call_args(sources, outputs)
        if not n:
            return None
        if self.done is None:  # (one event, made at the first call and recorded again at each)
            with self.cp.cuda.Device(self.device):
                self.done = self.cp.cuda.Event(disable_timing=True)
        params = None
        if regions is not None:
            self._settle()
            params = self._region_params(regions, fmt)
        call = Call(self.handle, self.state, n, fmt, C.addressof(data), C.addressof(sizes), C.addressof(images),
                    C.addressof(params) if params is not None else None, stream.ptr, self.done.ptr, self.done.ptr,
                    publish.ptr if publish is not None else None)
        pending = _Pending(driver, call, (data, sizes, images, params, publish, stream))
        driver.submit(call)
        self.pending = pending
        return pending

    @staticmethod
    def finish(pending: _Pending) -> tuple[bool, float]:
        """Wait for a :meth:`submit`'s call: (whether nvJPEG decoded it, the driver's seconds in it). Raises
        RuntimeError where a CUDA call of it failed (nvJPEG's refusal is a False, as :meth:`decode`'s
        :class:`NvjpegError`: a corrupt image fails its call)."""
        pending.driver.wait(pending.call)
        call = pending.call
        if call.status and call.step not in (2, 3):
            raise RuntimeError(f"hardware decode: {STEPS.get(call.step, call.step)} failed with CUDA error {call.status}")
        return not call.status, call.ns / 1e9

    def _settle(self) -> None:
        """Wait for this instance's call still queued on a native driver, if any."""
        if self.pending is not None:
            self.pending.driver.wait(self.pending.call)
            self.pending = None

    def _region_params(self, regions: list[tuple[int, int, int, int] | None], fmt: int) -> Any:
        """The per-image parameters of a region call: each object's ROI set for this call, its output
        format where it was last set to another, its orientation (upright) once, when it is made."""
        lib = self.lib
        put = self.held
        fmt_of, turn_of, roi_of = (put.nvjpegDecodeParamsSetOutputFormat, put.nvjpegDecodeParamsSetExifOrientation,
                                   put.nvjpegDecodeParamsSetROI)
        while len(self.params) < len(regions):
            p = C.c_void_p()
            _check("nvjpegDecodeParamsCreate", lib.nvjpegDecodeParamsCreate(self.handle, C.byref(p)))
            self.params.append(p)
            self._params_fmt.append(-1)
            _check("nvjpegDecodeParamsSetExifOrientation", turn_of(p, 1))
        for k, (p, r) in enumerate(zip(self.params, regions)):
            if self._params_fmt[k] != fmt:
                _check("nvjpegDecodeParamsSetOutputFormat", fmt_of(p, fmt))
                self._params_fmt[k] = fmt
            status = roi_of(p, 0, 0, -1, -1) if r is None else roi_of(p, r[1], r[0], r[3] - r[1], r[2] - r[0])
            if status:
                _check("nvjpegDecodeParamsSetROI", status)
        return (C.c_void_p * len(regions))(*[p.value for p in self.params[: len(regions)]])

    def close(self) -> None:
        self._settle()
        if self.done is not None:
            self.done.synchronize()
            self.done = None
        for p in self.params:
            self.lib.nvjpegDecodeParamsDestroy(p)
        self.params, self._params_fmt = [], []
        if self.state:
            self.lib.nvjpegJpegStateDestroy(self.state)
            self.state = C.c_void_p()
        if self.handle:
            self.lib.nvjpegDestroy(self.handle)
            self.handle = C.c_void_p()


class _Pending:
    """A call queued on a native driver (:meth:`HwBatchDecoder.submit`), and what must live until it is made."""

    __slots__ = ("driver", "call", "keep")

    def __init__(self, driver: Any, call: Call, keep: tuple):
        self.driver, self.call, self.keep = driver, call, keep


def nvjpeg_driver(device_index: int, folder: str = "", compiler: str = "") -> Driver | None:
    """A :class:`~gpubatch.engine.codecs.hw_native.Driver` of nvJPEG's and the CUDA driver's calls whose thread works
    in device ``device_index``'s primary context; None where the driver's library cannot be built (warned) or
    CUDA's driver is not loaded."""
    if native_library(folder, compiler) is None:
        return None
    try:
        cuda = C.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, ctx = C.c_int(), C.c_void_p()
    if cuda.cuDeviceGet(C.byref(dev), device_index) or cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), dev):
        return None  # (the context the decoders use exists already: this takes a reference, given back at close)
    nv = library()
    fns = [nv.nvjpegDecodeBatchedInitialize, nv.nvjpegDecodeBatched, nv.nvjpegDecodeBatchedEx, cuda.cuCtxSetCurrent,
           cuda.cuEventQuery, cuda.cuEventSynchronize, cuda.cuEventRecord]
    try:
        return Driver([address(f) for f in fns], ctx.value or 0, folder, compiler=compiler,
                      on_close=lambda: cuda.cuDevicePrimaryCtxRelease(dev))
    except OSError:
        cuda.cuDevicePrimaryCtxRelease(dev)
        raise
