"""Device selection: ``auto`` | ``cpu`` | ``gpu``, resolved once per run, with the reason said.

Probing imports CuPy and nvImageCodec only when asked about a GPU; ``cpu`` imports neither.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .install import _no_cupy, install_hint


class DeviceKind(str, enum.Enum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class Device:
    """The device a run uses.

    Attributes:
        kind: cpu or gpu.
        index: CUDA device ordinal (0 for the CPU).
        name: "NVIDIA H100 80GB HBM3", or the CPU description.
        reason: why this device was chosen, shown to the user.
        gpus: every GPU the run spreads over (``--gpus``), the first being ``index``; empty for one.
    """

    kind: DeviceKind
    index: int = 0
    name: str = "cpu"
    reason: str = ""
    gpus: tuple[int, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.kind is DeviceKind.GPU

    @property
    def indexes(self) -> tuple[int, ...]:
        """The GPUs the run uses (one unless ``--gpus`` named several); empty on the CPU."""
        return (self.gpus or (self.index,)) if self.is_gpu else ()

    def one(self, index: int) -> Device:
        """This device narrowed to GPU ``index`` (what one worker process of a several-GPU run is given)."""
        return dataclasses.replace(self, index=index, gpus=())

    def __str__(self) -> str:
        if not self.is_gpu:
            return "cpu"
        if len(self.indexes) > 1:
            return f"gpus:{','.join(map(str, self.indexes))} ({len(self.indexes)} x {self.name})"
        return f"gpu:{self.index} ({self.name})"


#: whether this process has initialised the CUDA driver (``cuInit``), as :func:`_driver` does
driver_asked = False


@functools.lru_cache(maxsize=8)
def _driver() -> tuple[object, int] | str:
    """(the CUDA driver library, its device count) through ``libcuda`` itself, or why not: the driver is
    asked without importing CuPy (half a second a process, which the GPU workers spend anyway)."""
    import ctypes

    global driver_asked
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA GPU driver here (libcuda.so.1 is not loadable)"
    count = ctypes.c_int()
    driver_asked = True  # (from here a child this process forks cannot use CUDA: processes.fork_safe)
    err = cuda.cuInit(0)
    if err == 100:  # CUDA_ERROR_NO_DEVICE
        return "no CUDA device found"
    if err != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return f"no usable CUDA device (the CUDA driver's error {err})"
    return cuda, count.value


def device_count() -> int:
    """The CUDA devices this process sees (0 without a usable driver)."""
    found = _driver()
    return 0 if isinstance(found, str) else found[1]


#: device index -> the thread of :func:`probe_ahead` that asks :func:`gpu_problem` for it
_AHEAD: dict[int, Any] = {}


def probe_ahead(index: int = 0) -> None:
    """:func:`gpu_problem` for device ``index`` begun in a thread of its own, so that the driver's start (``cuInit``
    alone took 0.19-0.24 s on an H200 host) runs beside the command's imports: the ``gpubatch`` command's start
    (:func:`.execute.early.sniff`) begins it where its arguments look like a GPU run's, once its workers are forked;
    :func:`gpu_problem` waits for it. Never raises (the probe's answer, or error, is the command's to give)."""
    import threading

    if index in _AHEAD:
        return

    def ask() -> None:
        try:
            _gpu_problem(index)
        except Exception:  # noqa: BLE001 - asked again, and said, where the command resolves its device
            pass

    _AHEAD[index] = t = threading.Thread(target=ask, name="gpubatch-probe", daemon=True)
    t.start()


def gpu_problem(index: int = 0) -> tuple[str | None, str]:
    """(None, device name) when the GPU engine can run on device ``index``, else (reason, ""). CuPy is
    found, not imported: a worker whose import of it fails says so (GpuEngine). Asked once a process (where
    :func:`probe_ahead` asked it already, its answer, waited for)."""
    ahead = _AHEAD.get(index)
    if ahead is not None:
        ahead.join()
    return _gpu_problem(index)


@functools.lru_cache(maxsize=8)
def _gpu_problem(index: int = 0) -> tuple[str | None, str]:
    import ctypes
    import importlib.util

    try:
        if importlib.util.find_spec("cupy") is None:
            return _no_cupy(), ""
    except (ImportError, ValueError) as e:
        return f"CuPy failed to load ({type(e).__name__}: {e})", ""
    found = _driver()
    if isinstance(found, str):
        return found, ""
    cuda, count = found
    if count == 0:
        return "no CUDA device found", ""
    if not 0 <= index < count:
        return f"--gpu {index} does not exist: this machine has {count} GPU(s) (0..{count - 1})", ""
    try:  # its C library, loaded without importing the Python binding (which makes an instance)
        from .codecs.nvimgcodec_c import library_path

        ctypes.CDLL(library_path())
    except Exception:
        try:  # the decoder falls back to the Python binding where the C library is not usable
            from nvidia import nvimgcodec  # noqa: F401
        except ImportError:
            return f"nvImageCodec is not installed: {install_hint()}", ""
        except Exception as e:
            return f"nvImageCodec failed to load ({type(e).__name__}: {e})", ""
    dev, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    if cuda.cuDeviceGet(ctypes.byref(dev), index) != 0 or cuda.cuDeviceGetName(name, 256, dev) != 0:
        return f"cannot query GPU {index}", ""
    return None, name.value.decode(errors="replace")


def resolve(request: str = "auto", index: int = 0) -> Device:
    """Resolve ``auto``/``cpu``/``gpu`` to a :class:`Device`.

    Raises:
        UsageError: ``gpu`` was asked for and no usable GPU is present (the message says why), or the
            request is not one of the three names.
    """
    request = (request or "auto").lower()
    if request == "cpu":
        return Device(DeviceKind.CPU, reason="--device cpu")
    if request not in ("auto", "gpu"):
        raise UsageError(f"unknown device {request!r}; supported: auto, cpu, gpu")
    problem, name = gpu_problem(index)
    if problem is None:
        why = "--device gpu" if request == "gpu" else "auto: CUDA GPU, CuPy and nvImageCodec usable"
        return Device(DeviceKind.GPU, index, name, why)
    if request == "gpu":
        raise UsageError(f"--device gpu: {problem}")
    return Device(DeviceKind.CPU, reason=f"auto: {problem}")


def parse_gpus(spec: str) -> tuple[int, ...] | None:
    """``--gpus``: "all" (None: every GPU the machine has) or ordinals "0,1,3" (a UsageError otherwise)."""
    text = str(spec).strip().lower()
    if text == "all":
        return None
    try:
        out = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        out = ()
    if not out or any(i < 0 for i in out):
        raise UsageError(f"--gpus {spec!r}: give all, or GPU ordinals such as 0,1,3")
    if len(set(out)) != len(out):
        raise UsageError(f"--gpus {spec!r} names a GPU twice")
    return out


def resolve_gpus(request: str = "auto", index: int = 0, gpus: str | None = None) -> Device:
    """:func:`resolve`, spread over several GPUs where ``gpus`` ("all", "0,1,3") asks for them.

    ``--device auto`` falls back to the CPU, saying why, where no GPU is usable at all; a GPU that is
    named and missing is refused whatever the device."""
    if gpus is None:
        return resolve(request, index)
    request = (request or "auto").lower()
    if request == "cpu":
        raise UsageError(f"--gpus {gpus} asks for GPUs and --device cpu for none: drop one of them")
    wanted = parse_gpus(gpus)
    problem, _ = gpu_problem(wanted[0] if wanted else 0)
    if problem is not None and (wanted is None or request == "auto" and "does not exist" not in problem):
        if request == "gpu":
            raise UsageError(f"--gpus {gpus}: {problem}")
        return Device(DeviceKind.CPU, reason=f"auto: --gpus {gpus}: {problem}")
    if wanted is None:
        wanted = tuple(range(device_count()))
    names = []
    for i in wanted:
        problem, name = gpu_problem(i)
        if problem is not None:
            raise UsageError(f"--gpus {gpus}: {problem.replace(f'--gpu {i} does not exist', f'GPU {i} does not exist')}")
        names.append(name)
    name = names[0] if len(set(names)) == 1 else " + ".join(names)
    why = f"--gpus {gpus}: {len(wanted)} GPU{'s' if len(wanted) > 1 else ''}"
    return Device(DeviceKind.GPU, wanted[0], name, why, wanted if len(wanted) > 1 else ())


def page_lock(buf: object, device_index: int = 0) -> tuple[int, object] | None:
    """Page-lock the host memory of ``buf`` (a buffer: shared memory, a NumPy array) for GPU
    ``device_index``, so that copies from it are DMAs a call only queues. Returns (its address, the
    function that unlocks it), or None where the driver refused (then nothing changed). The caller
    unlocks it only once no copy from it is queued or running."""
    import cupy as cp
    import numpy as np

    view = np.frombuffer(buf, np.uint8)
    ptr, size = view.ctypes.data, view.nbytes
    del view  # no export of the buffer may outlive this call (shared memory closes only without one)
    rt = cp.cuda.runtime
    try:
        with cp.cuda.Device(device_index):
            rt.hostRegister(ptr, size, 0)
    except rt.CUDARuntimeError:
        return None

    def unlock() -> None:
        try:
            with cp.cuda.Device(device_index):
                rt.hostUnregister(ptr)
        except rt.CUDARuntimeError:
            pass

    return ptr, unlock
