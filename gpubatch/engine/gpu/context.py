"""The CUDA driver's side of a GPU's primary context, through ``libcuda`` itself (ctypes, no CuPy): how its
threads wait (the sync policy, set before the context exists), whether it is active, making it current
in a thread, and the event calls a decoder's thread makes with the GIL kept (:func:`record_held`). Light
on purpose: a GPU worker's start (:mod:`.start`) makes the context here before CuPy is imported, so that
the context and the hardware decoder's instances are made while the worker's main thread still imports
and unpickles its run.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

# the primary context's scheduling flags of each sync policy (Settings.sync)
SYNC_POLICIES = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}


def _primary_context(device_index: int) -> tuple[Any, Any] | None:
    """(the driver library, the device handle) for ``device_index``, or None without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), device_index) != 0:
        return None
    return cuda, dev


def sync_policy_state(device_index: int) -> tuple[str | None, bool]:
    """(the primary context's scheduling policy, whether that context is active) for device
    ``device_index``; (None, False) without the driver."""
    found = _primary_context(device_index)
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if found is None or found[0].cuDevicePrimaryCtxGetState(found[1], ctypes.byref(flags), ctypes.byref(active)):
        return None, False
    names = {v: k for k, v in SYNC_POLICIES.items()}
    return names.get(flags.value & 7), bool(active.value)


def set_sync_policy(device_index: int, policy: str, only_before_context: bool = False) -> bool:
    """Set how every host thread of this process waits for device ``device_index`` (stream and event
    synchronizations, nvImageCodec's worker threads' among them): ``spin`` (busy-wait), ``yield``
    (busy-wait, yielding the core), ``blocking`` (sleep until woken) or ``auto`` (the driver's
    default: spin while there are fewer contexts than cores). Through the driver API on the primary
    context, which CuPy and nvImageCodec share; with ``only_before_context``, left alone where that
    context is already active (a host program made it). Returns whether the policy was set."""
    if policy not in SYNC_POLICIES:
        from ...errors import UsageError

        raise UsageError(f"GPU sync policy {policy!r}: one of {', '.join(SYNC_POLICIES)}")
    found = _primary_context(device_index)
    if found is None or (only_before_context and sync_policy_state(device_index)[1]):
        return False
    cuda, dev = found
    fn = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
    return fn(dev, ctypes.c_uint(SYNC_POLICIES[policy])) == 0


def make_current(device_index: int) -> bool:
    """Make device ``device_index``'s primary context (made now where it is not yet) current in the calling
    thread, through the driver API; CuPy, nvImageCodec and nvJPEG use that context (the runtime takes the
    context current in a thread). Returns whether it is current; False without a driver."""
    found = _primary_context(device_index)
    if found is None:
        return False
    cuda, dev = found
    ctx = ctypes.c_void_p()
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
        return False
    return cuda.cuCtxSetCurrent(ctx) == 0


@functools.cache
def _held() -> Any:
    """libcuda through ``ctypes.PyDLL``: its calls keep the GIL (for calls of microseconds)."""
    cuda = ctypes.PyDLL("libcuda.so.1")
    vp = ctypes.c_void_p
    for name, args in (("cuEventRecord", [vp, vp]), ("cuStreamWaitEvent", [vp, vp, ctypes.c_uint]),
                       ("cuEventCreate", [ctypes.POINTER(vp), ctypes.c_uint])):
        fn = getattr(cuda, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return cuda


def _check(call: str, status: int) -> None:
    if status:
        raise RuntimeError(f"{call} failed with CUDA driver error {status}")


def record_held(event: Any, stream: Any) -> Any:
    """Record ``event`` (a CuPy event) on ``stream`` (a CuPy stream) with the GIL kept; returns ``event``.

    CuPy 14 lets the GIL go for an event's creation, record and destruction (``with nogil``), and a thread
    that lets it go must wait to get it back while the process's other threads run Python: the hardware
    decoder's thread, two busy Python threads beside it, spent 63% of its time waiting for the GIL: 36.5%
    after those three event calls, 22.8% after its nvJPEG call (py-spy's native stacks of
    ``benchmarks/hw_rate.py --gil-threads 2``, H200, 2026-12-03; ``benchmarks/pyspy_threads.py``). Recorded
    here, its calls beside those threads ran 9,260 images a second against 6,747. A decoder's thread records
    its events here, on events it makes once where it can."""
    _check("cuEventRecord", _held().cuEventRecord(event.ptr, stream.ptr))
    return event


def event_held(cls: Any) -> Any:
    """A new event of ``cls`` (a CuPy ``Event`` class or subclass: its ``__init__`` is not called) with
    timing disabled, made through the driver (``cuEventCreate``, in the current context) with the GIL kept
    (see :func:`record_held`); CuPy destroys it as its own when it is collected. The hardware decoder's thread
    makes the event of each part it publishes here: no gain told apart from the runs' spread (H200, 2026-12-03
    "19:49 to 20:21"), and the creation holds the GIL for 4% of the loader's GIL-holding samples, so events
    made once and recorded again are the next step where a finalizer can still tell a destroyed one."""
    handle = ctypes.c_void_p()
    _check("cuEventCreate", _held().cuEventCreate(ctypes.byref(handle), 2))  # CU_EVENT_DISABLE_TIMING
    event = cls.__new__(cls)
    event.ptr = handle.value
    return event


def wait_held(stream: Any, event: Any) -> None:
    """Make ``stream`` wait for ``event`` (``cuStreamWaitEvent``) with the GIL kept (see :func:`record_held`)."""
    _check("cuStreamWaitEvent", _held().cuStreamWaitEvent(stream.ptr, event.ptr, 0))
