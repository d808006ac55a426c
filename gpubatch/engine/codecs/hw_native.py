"""The hardware JPEG engine's calls made by a native thread (``hw_driver.c``), outside the GIL.

A Python thread making nvJPEG's batched calls lets the GIL go in each and must take it back after, waiting
while the process's other threads run Python: under ``convert`` that thread was inside its calls for the
whole run, at about half the rate the same calls reach alone (docs/engine.md, "the hardware engine's
thread"). Here the decoder's thread queues each call on a :class:`Driver` (the GIL kept, microseconds) and
goes on; the driver's own thread, which never needs the GIL, makes the queued calls back to back (the
instance's previous call waited for, ``nvjpegDecodeBatchedInitialize``, the decode, the end events
recorded), and a second Python thread takes each call's end in turn and hands its images on
(:mod:`.decode_calls`).

The driver is C, built on first use by the system C compiler (``settings.c_compiler``: ``$CC``, else ``cc``)
into gpubatch's cache (``settings.cache_dir``: ``GPUBATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpubatch`` or
``~/.cache/gpubatch``), as CuPy builds the kernels; where no compiler is found or the build fails, the calls are made from Python as before, with a
warning once.

Opt-in (``GPUBATCH_HW_NATIVE=1``). Measured on an H200 (2026-12-04, benchmarks/RESULTS.md): the same transcode's
medians 1-5% higher (16,384 images 4,208 against 4,156 images/s; 65,536 10,815 against 10,298 and 11,419 against
11,153; the runs overlap), the training loader 1.03x (not told apart), the engine's Python thread down from 5.4 s of
CPU to 0.04 s. And it told what the calls cost: 65-86 us of nvJPEG's host code an image under ``convert``, with no GIL
in them, as from Python, against 28-34 us in the bench (the wait for an instance's last call on the GPU 0.01 s of
5.6 s): slow in themselves under that load, not for want of the GIL (alone they take 30 us an image; the run's
own GPU work beside them stretches them: ``benchmarks/nvjpeg_calls.py``). That first form handed a part's calls
to the finishing thread together, which stalled under a memory cap (a later call waiting for a ring slot an
earlier one had not posted yet); each call now goes to it as it is queued, and the memory-cap tests pass with it
on an H200 (2026-12-04).
"""

from __future__ import annotations

import ctypes as C
import functools
import hashlib
import os
import shutil
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("hw_driver.c")
#: calls queued at once at most (each decoder instance has one or two in flight; the rest is room)
QUEUE = 64


class Call(C.Structure):
    """One queued call (``gb_call`` of ``hw_driver.c``)."""

    _fields_ = [("handle", C.c_void_p), ("state", C.c_void_p), ("n", C.c_int), ("fmt", C.c_int),
                ("data", C.c_void_p), ("sizes", C.c_void_p), ("images", C.c_void_p), ("params", C.c_void_p),
                ("stream", C.c_void_p), ("before", C.c_void_p), ("after", C.c_void_p), ("publish", C.c_void_p),
                ("status", C.c_int), ("step", C.c_int), ("ns", C.c_int64), ("wait_ns", C.c_int64),
                ("done", C.c_int)]


#: where a failed call failed (``Call.step``)
STEPS = {1: "the wait for the instance's previous call", 2: "nvjpegDecodeBatchedInitialize", 3: "the decode call",
         4: "an event's record", 5: "making the context current"}


def cache_root(folder: str = "") -> Path:
    """gpubatch's cache folder: ``folder`` where given (``settings.cache_dir``), else ``~/.cache/gpubatch``."""
    return Path(folder) if folder else Path.home() / ".cache" / "gpubatch"


_BUILD_LOCK = threading.Lock()


@functools.cache
def _built(folder: str, compiler: str = "") -> tuple[str | None, str]:
    """(the driver library's path, "") once built, or (None, why not)."""
    code = SOURCE.read_bytes()
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc) on the PATH"
    tag = hashlib.sha256(code + cc.encode()).hexdigest()[:16]
    out = cache_root(folder) / "native" / f"hw_driver-{tag}.so"
    if out.is_file():
        return str(out), ""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"cannot make {out.parent} ({e.strerror or e})"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(tmp), str(SOURCE)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode:
            last = (r.stderr or r.stdout).strip().splitlines()
            return None, f"{cc} failed: {last[-1] if last else r.returncode}"
        os.replace(tmp, out)  # (several processes may build it at once: each renames a whole file)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} did not run ({e})"
    finally:
        tmp.unlink(missing_ok=True)
    return str(out), ""


@functools.cache
def _library(path: str) -> tuple[Any, Any]:
    """(the library with its quick calls keeping the GIL, the same with ``gb_wait``/``gb_stop`` letting it go)."""
    held, free = C.PyDLL(path), C.CDLL(path)
    vp = C.c_void_p
    held.gb_start.argtypes, held.gb_start.restype = [C.POINTER(vp), vp, C.c_int], vp
    held.gb_submit.argtypes, held.gb_submit.restype = [vp, C.POINTER(Call)], C.c_int
    free.gb_wait.argtypes, free.gb_wait.restype = [vp, C.POINTER(Call), C.c_double], C.c_int
    free.gb_stop.argtypes, free.gb_stop.restype = [vp], None
    return held, free


def library(folder: str = "", compiler: str = "") -> tuple[Any, Any] | None:
    """The driver's library (built first where it is not in the cache), or None (where it cannot be built:
    warned once)."""
    with _BUILD_LOCK:
        path, why = _built(folder, compiler)
    if path is None:
        _warn_once(why)
        return None
    return _library(path)


@functools.cache
def _warn_once(why: str) -> None:
    warnings.warn(f"the hardware JPEG engine's calls are made from Python ({why}): slower beside busy threads",
                  RuntimeWarning, stacklevel=3)


def address(fn: Any) -> int:
    """A ctypes function's address, as :class:`Driver` takes its functions."""
    return C.cast(fn, C.c_void_p).value or 0


class Driver:
    """A native thread making queued hardware-decode calls (see the module docstring): ``functions`` are the
    seven addresses ``hw_driver.c`` names (``F_INIT`` ... ``F_EVENT_RECORD``), ``context`` the CUcontext its
    thread makes current first (or 0)."""

    def __init__(self, functions: list[int], context: int = 0, folder: str = "", queue: int = QUEUE,
                 compiler: str = "", on_close: Any = None):
        self._on_close = on_close  # (called once the thread has ended: gives back what the caller took for it)
        lib = library(folder, compiler)
        if lib is None:
            raise OSError("the hardware-decode driver could not be built")
        self._held, self._free = lib
        self._lock = threading.Lock()
        fns = (C.c_void_p * len(functions))(*functions)
        self.ptr = self._held.gb_start(fns, context or None, queue)
        if not self.ptr:
            raise OSError("the hardware-decode driver's thread could not be started")

    def submit(self, call: Call) -> None:
        """Queue ``call`` (kept alive by the caller until :meth:`wait` says it is made); where the queue is
        full, waits for room."""
        while True:
            with self._lock:
                if not self.ptr:
                    raise RuntimeError("the hardware-decode driver is closed")
                if self._held.gb_submit(self.ptr, C.byref(call)) == 0:
                    return
            self._free.gb_wait(self.ptr, C.byref(call), 0.001)  # (full: let the thread make some)

    def wait(self, call: Call, timeout: float = -1.0) -> bool:
        """Wait until ``call`` is made (``timeout`` seconds at most; < 0: no limit); whether it is."""
        if call.done:
            return True
        return bool(self._free.gb_wait(self.ptr, C.byref(call), timeout))

    def close(self) -> None:
        """Make every queued call, then end the thread."""
        with self._lock:
            ptr, self.ptr = self.ptr, None
        if ptr:
            self._free.gb_stop(ptr)
            if self._on_close is not None:
                self._on_close()
