"""The CUDA driver's side of a GPU's primary context, through ``libcuda`` itself (ctypes, no CuPy): how its
threads wait (the sync policy, set before the context exists), whether it is active, making it current
in a thread, and the short calls the decoders' threads and the consumer's thread make with the GIL kept
(:func:`record_held`: events, stream waits, the launch tables' copies). Light
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
    vp, u = ctypes.c_void_p, ctypes.c_uint
    for name, args in (("cuEventRecord", [vp, vp]), ("cuStreamWaitEvent", [vp, vp, u]),
                       ("cuEventCreate", [ctypes.POINTER(vp), u]), ("cuEventQuery", [vp]),
                       ("cuMemcpyHtoDAsync_v2", [ctypes.c_uint64, vp, ctypes.c_size_t, vp]),
                       ("cuCtxGetDevice", [ctypes.POINTER(ctypes.c_int)]),
                       ("cuCtxGetCurrent", [ctypes.POINTER(vp)])):
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


@functools.cache
def owned_event_class(cp: Any) -> Any:
    """CuPy's event class (timing disabled) whose handle reads 0 once destroyed, so that a finalizer that would
    wait on one (collected with it, in any order: ``decode_buffers._stream_ref``) can tell."""

    class OwnedEvent(cp.cuda.Event):
        def __init__(self) -> None:
            super().__init__(disable_timing=True)

        def __del__(self) -> None:
            super().__del__()
            self.ptr = 0

    return OwnedEvent


def held_event(cp: Any) -> Any:
    """A new :func:`owned_event_class` event made with the GIL kept (:func:`event_held`): for events made once
    and recorded again (:func:`record_held`) at each use."""
    return event_held(owned_event_class(cp))


def record_again(event: Any, stream: Any, cp: Any) -> Any:
    """Record ``event`` on ``stream`` with the GIL kept, made first (:func:`held_event`) where it is None: an event
    made once and recorded at each use; returns it."""
    return record_held(held_event(cp) if event is None else event, stream)


def _context_in_this_thread() -> None:
    """Make the runtime's device's primary context current in a thread that has none yet: the driver's calls
    need one, and a thread whose first CUDA call is one of these (a user's thread that encodes or decodes
    first, a decoder's ring slot made there) has none until the runtime's first call, which would make it
    (``cuEventCreate`` failed with error 201, an invalid context, in a thread that encoded first: H200,
    2026-12-04). The runtime's device: the one CuPy uses in that thread (0 unless set)."""
    ctx = ctypes.c_void_p()
    if _held().cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
        return
    import cupy

    make_current(cupy.cuda.runtime.getDevice())


def event_held(cls: Any) -> Any:
    """A new event of ``cls`` (a CuPy ``Event`` class or subclass: its ``__init__`` is not called) with
    timing disabled, made through the driver (``cuEventCreate``, in the current context) with the GIL kept
    (see :func:`record_held`); CuPy destroys it as its own when it is collected. Made once and recorded again
    where its owner outlives its uses (a decoder's ring slot, the launch tables' staging slots, the output
    ring's buffers): made per publish, its creation had held the GIL for 4% of the loader's GIL-holding
    samples (H200, 2026-12-03 "19:49 to 20:21")."""
    handle = ctypes.c_void_p()
    _context_in_this_thread()
    _check("cuEventCreate", _held().cuEventCreate(ctypes.byref(handle), 2))  # CU_EVENT_DISABLE_TIMING
    event = cls.__new__(cls)
    event.ptr = handle.value
    return event


def wait_held(stream: Any, event: Any) -> None:
    """Make ``stream`` wait for ``event`` (``cuStreamWaitEvent``) with the GIL kept (see :func:`record_held`)."""
    _check("cuStreamWaitEvent", _held().cuStreamWaitEvent(stream.ptr, event.ptr, 0))


# The consumer's thread (the one that launches the chain's kernels) makes its waits, records, table copies
# and event queries here too: through CuPy each let the GIL go, and getting it back behind the decoders'
# threads took 14% of that thread's time in a loader's native stacks (H200, 2026-12-03, 19:55; py-spy,
# benchmarks/loader_alone.py). With them here that wait went, the thread waited for the decoders instead
# (the loader's decode_wait 2.0-2.4 s -> 3.1-3.9 s of a 4-s window), and the rate did not move: the decoders'
# side holds it (benchmarks/RESULTS.md, 2026-12-03 "21:48 to 22:25"). A kernel launch with the GIL kept
# (cuLaunchKernel through ctypes) cost more of that thread's time in its argument packing than CuPy's
# launch and its wait for the GIL together, and is not used.


def query_held(event: Any) -> bool:
    """Whether the work before ``event`` (a CuPy event) is done (``cuEventQuery``), with the GIL kept."""
    status = _held().cuEventQuery(event.ptr)
    if status == 600:  # CUDA_ERROR_NOT_READY
        return False
    _check("cuEventQuery", status)
    return True


def sync_held(event: Any) -> None:
    """Wait for ``event`` on the host: at once where it is done (no GIL let go, see :func:`record_held`), else
    through CuPy (the GIL let go while it waits)."""
    if not query_held(event):
        event.synchronize()


def copy_held(dst: int, src: int, nbytes: int, stream: Any) -> None:
    """Copy ``nbytes`` from host address ``src`` (page-locked, so the copy is asynchronous) to device address
    ``dst`` on ``stream`` (``cuMemcpyHtoDAsync``), with the GIL kept."""
    _check("cuMemcpyHtoDAsync", _held().cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream.ptr))


def current_device_held() -> int:
    """The calling thread's current device (``cuCtxGetDevice``), with the GIL kept; -1 where no context
    is current in it."""
    dev = ctypes.c_int(-1)
    return dev.value if _held().cuCtxGetDevice(ctypes.byref(dev)) == 0 else -1
