"""nvImageCodec's C API through ctypes: batched decode without the Python binding's per-image costs.

Why this exists beside the ``nvidia.nvimgcodec`` Python binding (nvImageCodec 0.9):

- Its ``Decoder.decode(list)`` releases and retakes the GIL once per image while it prepares a batch
  (to read each image's header). With any other Python thread busy, each retake waits for that
  thread's switch interval: one busy thread cut the decoder from about 16,000 to 641 images/s
  (the decode study (docs/engine.md), group "gil"). Here the per-image calls (code stream, header, image
  descriptor: a few microseconds each) run with the GIL held (``ctypes.PyDLL``), and the GIL is
  released once per decode call (``ctypes.CDLL``).
- Its decode call returns only when all of the batch's host work is done, so routing a batch over two
  decoders took a second Python thread. ``nvimgcodecDecoderDecode`` returns a future once the
  per-image work is scheduled on the decoder's own threads (the hardware decoder's batched host work
  runs in the calling thread), so one thread can start several decoders and then wait for them.
- It allocates every output image on its own. Here the caller gives each image its place in one
  device buffer per batch.

Only what gpubatch needs is declared: instance, decoder, code streams (with an optional region),
images on caller-owned device memory, decode, futures. The structures follow ``nvimgcodec.h`` of
nvImageCodec 0.9 (shipped in the wheel under ``nvidia/nvimgcodec/include``); ``tests/engine/test_gpu.py``
decodes through both bindings and compares the pixels.
"""

from __future__ import annotations

import ctypes as C
import os
import threading
from dataclasses import dataclass

from ...errors import DependencyError

# enum values from nvimgcodec.h (0.9)
_T_INSTANCE_CREATE_INFO = 2
_T_DECODE_PARAMS = 5
_T_ORIENTATION = 7
_T_REGION = 8
_T_CODE_STREAM_VIEW = 9
_T_IMAGE_INFO = 11
_T_IMAGE_PLANE_INFO = 12
_T_BACKEND = 17
_T_BACKEND_PARAMS = 29
_T_EXECUTION_PARAMS = 30
COLORSPEC_SRGB = 1
SAMPLEFORMAT_I_RGB = 8
SAMPLE_UINT8 = 0x0802
BUFFER_STRIDED_DEVICE = 1
LOAD_HINT_FIXED = 2
BACKEND_HYBRID_CPU_GPU = 3
BACKEND_HW_GPU_ONLY = 4
STATUS_SUCCESS = 1
_SEVERITY_ERROR_FATAL = 0x00010000 | 0x00100000
_CATEGORY_ALL = 0x0FFFFFFF
_MAX_PLANES = 32
_MAX_DIM = 5


def _head() -> list:
    return [("struct_type", C.c_int), ("struct_size", C.c_size_t), ("struct_next", C.c_void_p)]


class _Orientation(C.Structure):
    _fields_ = _head() + [("rotated", C.c_int), ("flip_x", C.c_int), ("flip_y", C.c_int)]


class _PlaneInfo(C.Structure):
    _fields_ = _head() + [("width", C.c_uint32), ("height", C.c_uint32), ("row_stride", C.c_size_t),
                          ("num_channels", C.c_uint32), ("sample_type", C.c_int), ("precision", C.c_uint8)]


class _ImageInfo(C.Structure):
    _fields_ = _head() + [("codec_name", C.c_char * 256), ("color_spec", C.c_int), ("chroma_subsampling", C.c_int),
                          ("sample_format", C.c_int), ("orientation", _Orientation), ("num_planes", C.c_uint32),
                          ("plane_info", _PlaneInfo * _MAX_PLANES), ("buffer", C.c_void_p), ("buffer_kind", C.c_int),
                          ("cuda_stream", C.c_void_p)]


class _OutOfBounds(C.Structure):
    _fields_ = [("value", C.c_uint32), ("type", C.c_int)]


class _Region(C.Structure):
    _fields_ = _head() + [("ndim", C.c_int), ("start", C.c_int * _MAX_DIM), ("end", C.c_int * _MAX_DIM),
                          ("out_of_bounds_policy", C.c_int), ("out_of_bounds_samples", _OutOfBounds * 5)]


class _CodeStreamView(C.Structure):
    _fields_ = _head() + [("image_idx", C.c_size_t), ("region", _Region), ("bitstream_offset", C.c_size_t)]


class _BackendParams(C.Structure):
    _fields_ = _head() + [("load_hint", C.c_float), ("load_hint_policy", C.c_int)]


class _Backend(C.Structure):
    _fields_ = _head() + [("kind", C.c_int), ("params", _BackendParams)]


class _ExecutionParams(C.Structure):
    _fields_ = _head() + [("device_allocator", C.c_void_p), ("pinned_allocator", C.c_void_p),
                          ("max_num_cpu_threads", C.c_int), ("executor", C.c_void_p), ("device_id", C.c_int),
                          ("pre_init", C.c_int), ("skip_pre_sync", C.c_int), ("num_backends", C.c_int),
                          ("backends", C.POINTER(_Backend))]


class _DecodeParams(C.Structure):
    _fields_ = _head() + [("apply_exif_orientation", C.c_int)]


class _InstanceCreateInfo(C.Structure):
    _fields_ = _head() + [("load_builtin_modules", C.c_int), ("load_extension_modules", C.c_int),
                          ("extension_modules_path", C.c_char_p), ("create_debug_messenger", C.c_int),
                          ("debug_messenger_desc", C.c_void_p), ("message_severity", C.c_uint32),
                          ("message_category", C.c_uint32)]


def _new(cls, struct_type: int):
    s = cls()
    s.struct_type, s.struct_size = struct_type, C.sizeof(cls)
    return s


_H = C.c_void_p  # every handle is an opaque pointer
_P = C.POINTER(C.c_void_p)
# (name, argtypes, through the GIL-releasing handle): the long calls release the GIL
_SIGNATURES = (
    ("nvimgcodecInstanceCreate", [_P, C.POINTER(_InstanceCreateInfo)], True),  # (a second: extensions load)
    ("nvimgcodecInstanceDestroy", [_H], False),
    ("nvimgcodecDecoderCreate", [_H, _P, C.POINTER(_ExecutionParams), C.c_char_p], True),
    ("nvimgcodecDecoderDestroy", [_H], True),
    ("nvimgcodecDecoderDecode", [_H, _P, _P, C.c_int, C.POINTER(_DecodeParams), _P], True),
    ("nvimgcodecFutureWaitForAll", [_H], True),
    ("nvimgcodecFutureGetProcessingStatus", [_H, C.POINTER(C.c_uint32), C.POINTER(C.c_size_t)], False),
    ("nvimgcodecFutureDestroy", [_H], False),
    ("nvimgcodecCodeStreamCreateFromHostMem", [_H, _P, C.c_void_p, C.c_size_t, C.POINTER(_CodeStreamView)], False),
    ("nvimgcodecCodeStreamGetSubCodeStream", [_H, _P, C.POINTER(_CodeStreamView)], False),
    ("nvimgcodecCodeStreamGetImageInfo", [_H, C.POINTER(_ImageInfo)], False),
    ("nvimgcodecCodeStreamDestroy", [_H], False),
    ("nvimgcodecImageCreate", [_H, _P, C.POINTER(_ImageInfo)], False),
    ("nvimgcodecImageDestroy", [_H], False),
)


class CApiError(RuntimeError):
    pass


@dataclass
class Header:
    """What a code stream says of its (first) image: size as stored and EXIF orientation (rotation in
    degrees, mirroring). The decoders apply the orientation written in the *output* image's
    descriptor, so :meth:`Library.image` takes it back."""

    width: int
    height: int
    rotated: int = 0
    flip_x: int = 0
    flip_y: int = 0

    @property
    def orientation(self) -> tuple[int, int, int]:
        return self.rotated, self.flip_x, self.flip_y


class Library:
    """One nvImageCodec instance, loaded from the installed wheel's ``libnvimgcodec.so.0``."""

    def __init__(self, path: str | None = None):
        path = path or library_path()
        self.path = path
        self.fast = C.PyDLL(path)  # calls that keep the GIL: microseconds each, no hand-over per image
        self.slow = C.CDLL(path)   # calls that release it: decoder creation, decode, waiting
        self._f = {}
        for name, args, releases in _SIGNATURES:
            fn = getattr(self.slow if releases else self.fast, name)
            fn.argtypes, fn.restype = args, C.c_int
            self._f[name] = fn
        info = _new(_InstanceCreateInfo, _T_INSTANCE_CREATE_INFO)
        info.load_builtin_modules = 1
        info.load_extension_modules = 1
        info.extension_modules_path = os.path.join(os.path.dirname(path), "extensions").encode()
        info.create_debug_messenger = 1  # errors and fatal messages to stderr, as the Python binding does
        info.message_severity = _SEVERITY_ERROR_FATAL
        info.message_category = _CATEGORY_ALL
        inst = C.c_void_p()
        self._check("nvimgcodecInstanceCreate", C.byref(inst), C.byref(info))
        self.instance = inst
        self.params = _new(_DecodeParams, _T_DECODE_PARAMS)
        self.params.apply_exif_orientation = 1
        # Scratch structures (a header read into, the template every output image is filled from),
        # one set per thread: the GIL may pass to another thread between the Python statements that
        # fill one, so shared ones mixed two threads' images (the decoders' two threads made
        # the CUDA decoder fail images with "Invalid parameter" before they were per thread).
        self._local = threading.local()

    def _scratch(self) -> tuple[_ImageInfo, _ImageInfo, _PlaneInfo]:
        """This thread's (header scratch, output template, the template's plane)."""
        local = self._local
        try:
            return local.scratch
        except AttributeError:
            info = _new(_ImageInfo, _T_IMAGE_INFO)
            out = _new(_ImageInfo, _T_IMAGE_INFO)
            out.orientation = _new(_Orientation, _T_ORIENTATION)
            out.color_spec, out.sample_format, out.num_planes = COLORSPEC_SRGB, SAMPLEFORMAT_I_RGB, 1
            out.buffer_kind = BUFFER_STRIDED_DEVICE
            plane = out.plane_info[0]
            plane.struct_type, plane.struct_size = _T_IMAGE_PLANE_INFO, C.sizeof(_PlaneInfo)
            plane.num_channels, plane.sample_type = 3, SAMPLE_UINT8
            local.scratch = (info, out, plane)
            return local.scratch

    def _check(self, name: str, *args) -> None:
        status = self._f[name](*args)
        if status != 0:
            raise CApiError(f"{name} failed with nvImageCodec status {status}")

    def close(self) -> None:
        if self.instance:
            self._f["nvimgcodecInstanceDestroy"](self.instance)
            self.instance = None

    # -- decoders ------------------------------------------------------------------------------------

    def decoder(self, device_id: int, threads: int, backend: int, options: str = "",
                allocators: tuple[int, int] | None = None) -> Decoder:
        """A decoder of one backend kind with ``threads`` worker threads. ``allocators``: addresses of an
        ``nvimgcodecDeviceAllocator_t`` and an ``nvimgcodecPinnedAllocator_t`` for nvJPEG's own buffers
        (kept alive by the caller as long as the decoder), else nvJPEG allocates them itself."""
        b = _new(_Backend, _T_BACKEND)
        b.kind = backend
        b.params = _new(_BackendParams, _T_BACKEND_PARAMS)
        b.params.load_hint, b.params.load_hint_policy = 1.0, LOAD_HINT_FIXED
        ep = _new(_ExecutionParams, _T_EXECUTION_PARAMS)
        ep.max_num_cpu_threads, ep.device_id = threads, device_id
        ep.num_backends, ep.backends = 1, C.pointer(b)
        if allocators is not None:
            ep.device_allocator, ep.pinned_allocator = allocators
        handle = C.c_void_p()
        self._check("nvimgcodecDecoderCreate", self.instance, C.byref(handle), C.byref(ep), options.encode())
        return Decoder(self, handle)

    # -- code streams and images (GIL held: a few microseconds each) ---------------------------------

    def code_stream(self, address: int, size: int, region: tuple[int, int, int, int] | None = None) -> int:
        """A code stream over ``size`` bytes at host ``address`` (kept valid by the caller until the
        decode's future is done), or over the (y0, x0, y1, x1) region of it; 0 when not an image."""
        cs = C.c_void_p()
        if self._f["nvimgcodecCodeStreamCreateFromHostMem"](self.instance, C.byref(cs), address, size, None) != 0:
            return 0
        return self._region(cs.value or 0, region) if region is not None else (cs.value or 0)

    def _region(self, cs: int, region: tuple[int, int, int, int]) -> int:
        """The (y0, x0, y1, x1) region of code stream ``cs`` as a code stream of its own (``cs`` is
        released: the sub-stream holds it, nvImageCodec reference-counts them); 0 on failure."""
        view = _new(_CodeStreamView, _T_CODE_STREAM_VIEW)
        view.region = _new(_Region, _T_REGION)
        view.region.ndim = 2
        view.region.start[0], view.region.start[1], view.region.end[0], view.region.end[1] = region
        sub = C.c_void_p()
        status = self._f["nvimgcodecCodeStreamGetSubCodeStream"](cs, C.byref(sub), C.byref(view))
        self._f["nvimgcodecCodeStreamDestroy"](cs)
        return (sub.value or 0) if status == 0 else 0

    def header(self, cs: int) -> Header | None:
        info = self._scratch()[0]
        info.struct_type, info.struct_size, info.struct_next = _T_IMAGE_INFO, C.sizeof(_ImageInfo), None
        if self._f["nvimgcodecCodeStreamGetImageInfo"](cs, C.byref(info)) != 0:
            return None
        p, o = info.plane_info[0], info.orientation
        return Header(int(p.width), int(p.height), int(o.rotated), int(o.flip_x), int(o.flip_y))

    def open_streams(self, sources: list[tuple[int, int, tuple[int, int, int, int] | None]]
                     ) -> list[tuple[int, int, int, tuple[int, int, int]] | None]:
        """:meth:`code_stream` then :meth:`header` for each (host address, size, region or None): per
        source (code stream, height, width, EXIF orientation as :attr:`Header.orientation`), the size
        as stored, or None where it is not an image (nothing is left to destroy then).

        A whole batch part at a time, with the calls and structures bound once: this runs with the GIL
        held, and every microsecond of it per image is a microsecond the other threads (the decoders'
        own among them) wait per image: 3 ms more of it per batch cost the training chain 7%
        (the memory study (docs/engine.md) ``gil=3``, H200)."""
        f = self._f
        create, info_of = f["nvimgcodecCodeStreamCreateFromHostMem"], f["nvimgcodecCodeStreamGetImageInfo"]
        destroy = f["nvimgcodecCodeStreamDestroy"]
        inst = self.instance
        info = self._scratch()[0]
        ref_info = C.byref(info)
        plane, o = info.plane_info[0], info.orientation  # views into ``info``: they read each call's result
        cs = C.c_void_p()
        ref_cs = C.byref(cs)
        kind, size_of = _T_IMAGE_INFO, C.sizeof(_ImageInfo)
        out: list[tuple[int, int, int, tuple[int, int, int]] | None] = []
        append = out.append
        for address, size, region in sources:
            cs.value = None  # a handle already there is re-initialized, not a new one made
            if create(inst, ref_cs, address, size, None) != 0:
                append(None)
                continue
            handle = cs.value or 0
            if region is not None and handle:
                handle = self._region(handle, region)
            if not handle:
                append(None)
                continue
            info.struct_type = kind
            info.struct_size = size_of
            info.struct_next = None
            if info_of(handle, ref_info) != 0:
                destroy(handle)
                append(None)
                continue
            append((handle, plane.height, plane.width, (o.rotated, o.flip_x, o.flip_y)))
        return out

    def image(self, ptr: int, height: int, width: int, row_stride: int, stream_ptr: int,
              orientation: tuple[int, int, int] = (0, 0, 0)) -> int:
        """An image descriptor for uint8 RGB HWC pixels at device address ``ptr`` (caller-owned), of
        the size after ``orientation`` (the code stream's :attr:`Header.orientation`, which the
        decoders read from here: left at zero, a rotated JPEG is written unrotated into a buffer of
        the other shape)."""
        return self.images([(ptr, height, width, row_stride, orientation)], stream_ptr)[0]

    def images(self, specs: list[tuple[int, int, int, int, tuple[int, int, int]]], stream_ptr: int) -> list[int]:
        """:meth:`image` for each (device address, height, width, row stride, orientation), all ordered
        on ``stream_ptr``; a batch part at a time, for the reason :meth:`open_streams` gives."""
        create = self._f["nvimgcodecImageCreate"]
        inst = self.instance
        _, info, plane = self._scratch()  # this thread's template, filled in place
        o = info.orientation
        ref_info = C.byref(info)
        img = C.c_void_p()
        ref_img = C.byref(img)
        info.cuda_stream = stream_ptr
        turn = None
        out: list[int] = []
        for ptr, height, width, row_stride, orientation in specs:
            if orientation != turn:
                turn = orientation
                o.rotated, o.flip_x, o.flip_y = orientation
            plane.width = width
            plane.height = height
            plane.row_stride = row_stride
            info.buffer = ptr
            img.value = None  # (as in open_streams)
            if create(inst, ref_img, ref_info) != 0:
                self.destroy([], out)
                raise CApiError("nvimgcodecImageCreate failed")
            out.append(img.value)
        return out

    def destroy(self, code_streams: list[int], images: list[int]) -> None:
        d_cs, d_img = self._f["nvimgcodecCodeStreamDestroy"], self._f["nvimgcodecImageDestroy"]
        for cs in code_streams:
            if cs:
                d_cs(cs)
        for img in images:
            if img:
                d_img(img)


class Decoder:
    """One nvImageCodec decoder (one backend kind). :meth:`start` returns at once for per-image
    backends (the work runs on the decoder's threads) and after the host work for the hardware
    engine's batched backend; :meth:`finish` waits for the host work and gives each image's status.
    The GPU work is ordered on the images' stream and not waited for."""

    def __init__(self, lib: Library, handle: C.c_void_p):
        self.lib, self.handle = lib, handle

    def start(self, code_streams: list[int], images: list[int]):
        n = len(code_streams)
        if n == 0:
            return None
        cs_arr = (C.c_void_p * n)(*code_streams)
        img_arr = (C.c_void_p * n)(*images)
        fut = C.c_void_p()
        lib = self.lib
        lib._check("nvimgcodecDecoderDecode", self.handle, C.cast(cs_arr, _P), C.cast(img_arr, _P), n,
                   C.byref(lib.params), C.byref(fut))
        return fut, n

    def finish(self, started) -> list[bool]:
        if started is None:
            return []
        fut, n = started
        f = self.lib._f
        f["nvimgcodecFutureWaitForAll"](fut)
        status = (C.c_uint32 * n)()
        size = C.c_size_t(n)
        f["nvimgcodecFutureGetProcessingStatus"](fut, status, C.byref(size))
        f["nvimgcodecFutureDestroy"](fut)
        return [s == STATUS_SUCCESS for s in status[: size.value]] + [False] * (n - size.value)

    def close(self) -> None:
        if self.handle:
            self.lib._f["nvimgcodecDecoderDestroy"](self.handle)
            self.handle = None


def library_path() -> str:
    """Where the installed nvImageCodec wheel keeps ``libnvimgcodec.so.0`` (found without importing the
    Python binding, whose import makes an instance of its own and loads every extension)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        from ..install import install_hint

        raise DependencyError(f"GPU image codecs need nvImageCodec: {install_hint()}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "libnvimgcodec.so.0")
    if not os.path.exists(path):
        raise DependencyError(f"nvImageCodec's C library is not where the wheel puts it: {path}")
    return path


_MADE: list[Library] = []
_MAKING = threading.Lock()


def library() -> Library:
    """The process's instance (created once, kept until exit; a thread that asks while :func:`preload`'s
    thread makes it waits for that one)."""
    with _MAKING:
        if not _MADE:
            _MADE.append(Library())
        return _MADE[0]


def preload() -> None:
    """Start making the process's instance in a thread of its own: loading its extensions takes about a
    second (1.04 s on an H200 host, benchmarks/gpu_start.py), which then overlaps what the process does
    meanwhile (importing CuPy, making its CUDA context, starting its readers). Errors are left for the
    first real call to raise."""

    def make() -> None:
        try:
            library()
        except Exception:  # noqa: BLE001 - library() raises it again where it is needed
            pass

    threading.Thread(target=make, name="gpubatch-nvimgcodec-load", daemon=True).start()


def nvimgcodec():
    try:
        from nvidia import nvimgcodec as nic
    except ImportError:
        from ..install import install_hint

        raise DependencyError(f"GPU image codecs need nvImageCodec: {install_hint()}") from None
    return nic
