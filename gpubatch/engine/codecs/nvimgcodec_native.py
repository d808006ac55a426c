"""Whole-part calls into nvImageCodec's C API, compiled at first use (``nvimgcodec_batch.c``).

:class:`~gpubatch.engine.codecs.nvimgcodec_c.Library` makes each image's code stream, header and output
descriptor with the GIL held (``ctypes.PyDLL``): a few microseconds per call, but on the lent H200 the
hand-over of a 256-image batch held the GIL about 3.6 ms, and a thread coming back from any native call
(the decoders' threads, after each call) then waited 0.5 ms for it on average, 1.4 ms one time in ten
(``benchmarks/memory_study.py --gil-probe``). The C loops here do a whole batch part per call, with the
GIL released (``ctypes.CDLL``).

It is off by default: ``GPUBATCH_NATIVE=1`` turns it on. On the lent H200 (benchmarks/RESULTS.md,
twelfth session) it cut the hand-over's time by about 30% and the probe's mean GIL wait by 40% (655 to
396 us), yet the pipeline was not faster: the training chain ran 5% slower in 5 of 5 alternating
pairs, the validation chain 4% faster in 3 of 3. The GIL is not what bounds the default pipeline;
the helper is kept for host programs whose own Python threads need the GIL.

The source is compiled once per source and header version into ``$XDG_CACHE_HOME/gpubatch`` (or
``~/.cache/gpubatch``; a temporary directory where neither is writable) with the system C compiler
(``$CC`` or ``cc``), against the ``nvimgcodec.h`` the installed wheel ships. Where there is no compiler
or the build fails, :func:`load` returns None (with a warning) and the Python loops are used: the same
results, more GIL.
"""

from __future__ import annotations

import ctypes as C
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("nvimgcodec_batch.c")
# the one CUDA type nvimgcodec.h needs, declared as the CUDA headers do (they are not installed with the wheel)
_CUDA_STANDIN = "#pragma once\ntypedef struct CUstream_st* cudaStream_t;\n"
# (gb_api_t field, nvImageCodec function), in the structure's order
_API = (("cs_from_host", "nvimgcodecCodeStreamCreateFromHostMem"), ("cs_sub", "nvimgcodecCodeStreamGetSubCodeStream"),
        ("cs_info", "nvimgcodecCodeStreamGetImageInfo"), ("cs_destroy", "nvimgcodecCodeStreamDestroy"),
        ("img_create", "nvimgcodecImageCreate"), ("img_destroy", "nvimgcodecImageDestroy"),
        ("decode", "nvimgcodecDecoderDecode"), ("wait", "nvimgcodecFutureWaitForAll"),
        ("status", "nvimgcodecFutureGetProcessingStatus"), ("future_destroy", "nvimgcodecFutureDestroy"))


class _Api(C.Structure):
    _fields_ = [(name, C.c_void_p) for name, _ in _API]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpubatch"


def build(include: str, out_dir: Path | None = None) -> Path:
    """Compile :data:`SOURCE` against the ``nvimgcodec.h`` in ``include``; returns the shared library's
    path (reused when already built from the same source and header). Raises OSError or
    CalledProcessError where it cannot be built."""
    header = Path(include) / "nvimgcodec.h"
    key = hashlib.sha256(SOURCE.read_bytes() + header.read_bytes()).hexdigest()[:16]
    for folder in ([out_dir] if out_dir is not None else [cache_dir(), Path(tempfile.gettempdir()) / "gpubatch"]):
        lib = folder / f"nvimgcodec_batch-{key}.so"
        if lib.exists():
            return lib
        try:
            folder.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(dir=folder))
        except OSError:
            continue
        try:
            (work / "cuda_runtime_api.h").write_text(_CUDA_STANDIN)
            cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
            if cc is None:
                raise OSError("no C compiler (cc or $CC) found")
            tmp = work / lib.name
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-std=c11", f"-I{work}", f"-I{include}", str(SOURCE),
                            "-o", str(tmp)], check=True, capture_output=True, timeout=120)
            os.replace(tmp, lib)  # atomic: a process loading it never sees half a file
            return lib
        finally:
            shutil.rmtree(work, ignore_errors=True)
    raise OSError("no writable directory to build the nvImageCodec helper in")


class Native:
    """The compiled helper bound to one loaded nvImageCodec library (``lib``: its ``ctypes.CDLL``)."""

    def __init__(self, path: Path, lib: C.CDLL):
        self.path = path
        self.so = C.CDLL(str(path))  # CDLL: every call releases the GIL
        if self.so.gb_api_size() != C.sizeof(_Api):
            raise OSError(f"{path.name}: its API structure does not match this module's")
        self.api = _Api(*[C.cast(getattr(lib, fn), C.c_void_p).value for _, fn in _API])
        self.ref = C.byref(self.api)
        u64, i32, vp = C.c_uint64, C.c_int32, C.c_void_p
        self.so.gb_open_streams.argtypes = [vp, vp, C.c_int, vp, vp, vp, vp, vp, vp]
        self.so.gb_images.argtypes = [vp, vp, C.c_int, vp, vp, vp, vp, u64, vp]
        self.so.gb_decode.argtypes = [vp, vp, C.c_int, vp, vp, vp, vp]
        self.so.gb_destroy.argtypes = [vp, C.c_int, vp, C.c_int, vp]
        for fn in ("gb_open_streams", "gb_images", "gb_decode"):
            getattr(self.so, fn).restype = i32
        self.so.gb_destroy.restype = None

    def open_streams(self, instance: int, addr: np.ndarray, size: np.ndarray, region: np.ndarray | None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(code streams, (height, width) as stored, EXIF orientation) per source; see gb_open_streams."""
        n = len(addr)
        addr = np.ascontiguousarray(addr, np.uint64)
        size = np.ascontiguousarray(size, np.uint64)
        reg = None if region is None else np.ascontiguousarray(region, np.int32)
        cs, hw, turn = np.zeros(n, np.uint64), np.zeros((n, 2), np.int32), np.zeros((n, 3), np.int32)
        self.so.gb_open_streams(self.ref, instance, n, addr.ctypes.data, size.ctypes.data,
                                None if reg is None else reg.ctypes.data, cs.ctypes.data, hw.ctypes.data,
                                turn.ctypes.data)
        return cs, hw, turn

    def images(self, instance: int, ptr: np.ndarray, hw: np.ndarray, row: np.ndarray, turn: np.ndarray,
               stream: int) -> np.ndarray | None:
        """Output descriptors (see gb_images); None where one could not be made (none is left then)."""
        n = len(ptr)
        ptr, row = np.ascontiguousarray(ptr, np.uint64), np.ascontiguousarray(row, np.uint64)
        hw, turn = np.ascontiguousarray(hw, np.int32), np.ascontiguousarray(turn, np.int32)
        img = np.zeros(n, np.uint64)
        bad = self.so.gb_images(self.ref, instance, n, ptr.ctypes.data, hw.ctypes.data, row.ctypes.data,
                                turn.ctypes.data, stream, img.ctypes.data)
        return None if bad else img

    def decode(self, decoder: int, cs: np.ndarray, img: np.ndarray, params: int) -> np.ndarray | None:
        """One decode call, waited for on the host: per image whether it decoded; None where the call
        was refused."""
        n = len(cs)
        cs, img = np.ascontiguousarray(cs, np.uint64), np.ascontiguousarray(img, np.uint64)
        ok = np.zeros(n, np.uint8)
        if self.so.gb_decode(self.ref, decoder, n, cs.ctypes.data, img.ctypes.data, params, ok.ctypes.data) < 0:
            return None
        return ok.astype(bool)

    def destroy(self, cs: np.ndarray, img: np.ndarray) -> None:
        cs, img = np.ascontiguousarray(cs, np.uint64), np.ascontiguousarray(img, np.uint64)
        self.so.gb_destroy(self.ref, len(cs), cs.ctypes.data, len(img), img.ctypes.data)


def enabled() -> bool:
    """Whether the engine uses the helper (``GPUBATCH_NATIVE=1``; off by default, see above)."""
    return os.environ.get("GPUBATCH_NATIVE", "0") == "1"


@functools.cache
def load(library_path: str) -> Native | None:
    """The helper for the nvImageCodec library at ``library_path`` (already loaded by the caller), or
    None where it cannot be had (then the Python loops are used; a warning says why, once)."""
    include = os.path.join(os.path.dirname(library_path), "include")
    try:
        return Native(build(include), C.CDLL(library_path))
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        detail = getattr(e, "stderr", b"") or b""
        why = detail.decode(errors="replace").strip().splitlines()[-1:] or [str(e)]
        warnings.warn(f"gpubatch's nvImageCodec helper could not be built ({why[0]}); making code streams and "
                      "image descriptors from Python instead (more time holding the GIL)", RuntimeWarning,
                      stacklevel=2)
        return None
