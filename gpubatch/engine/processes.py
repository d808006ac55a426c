"""Processes of a run: the worker pools that CPU paths start (one BLAS thread each, freed memory kept)
and this process's allocator. Light on purpose: the command line imports it at start."""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
# glibc's malloc: arrays up to 32 MiB from the heap, kept when freed, instead of a fresh mmap (and its
# page faults) for every array above 128 KiB
_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def cores() -> int:
    """The CPU cores this process may run on (its affinity, where the system has one)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def default_workers() -> int:
    """Worker processes by default: the usable cores, at most 32."""
    return min(32, cores())


def default_readers(cores: int | None = None, route: str | None = None, settings: Any = None) -> int:
    """Reader processes a GPU pipeline's feed starts by default: a quarter of the cores, 1 to 4; half
    of them (up to 4) on the "hardware" decode route, whose decoders leave the cores to the readers
    (``settings.readers_hw``, a :class:`~.settings.Settings`)."""
    cores = cores or default_workers()
    if route == "hardware" and settings is None:
        from .settings import Settings

        settings = Settings()
    halves = route == "hardware" and settings.readers_hw
    return max(1, min(4, cores // (2 if halves else 4)))


def shm_free() -> int | None:
    """Bytes free in /dev/shm (where shared memory lives on Linux), or None where it cannot be told."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def keep_freed_memory() -> bool:
    """In this process, glibc's malloc keeps freed memory for the next arrays (what ``_MALLOC`` asks of
    worker processes, set through ``mallopt`` in a running one): per-record arrays above 128 KiB then
    stop costing a fresh ``mmap`` and its page faults each (a one-thread CPU convert to log-mel: 0.651 ->
    0.357 s, benchmarks/audio_cpu.py). The command line calls it for its own process; a library never
    changes its caller's allocator. False where the C library has no ``mallopt`` (not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # (the process's own symbols, the C library's among them)
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def detached_main() -> Iterator[None]:
    """Processes started inside (spawn, forkserver) do not import the caller's ``__main__``.

    ``multiprocessing`` runs the main script again in every spawned child (as ``__mp_main__``) so that
    what it defines can be unpickled there; a script that calls gpubatch without an ``if __name__ ==
    "__main__":`` guard then starts the whole run again in each worker. gpubatch's workers run gpubatch's
    own code only, so while they start ``sys.modules["__main__"]`` is an empty module: nothing names the
    script to the children. An object of the script sent to them (a class defined there) cannot be
    pickled then: one clear error says to define it in a module instead.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or (getattr(main, "__file__", None) is None and getattr(spec, "name", None) is None):
        yield  # an interactive session or ``python -c``: no script to run again
        return
    with _MAIN_LOCK:
        sys.modules["__main__"] = types.ModuleType("__main__", "gpubatch: workers do not import the main script")
        try:
            yield
        except (pickle.PicklingError, AttributeError) as e:
            if "__main__" not in str(e):
                raise
            from ..errors import UsageError

            raise UsageError(f"an object defined in your script goes to gpubatch's worker processes, which do not "
                             f"run your script ({str(e).splitlines()[0]}): define it in a module your script imports"
                             ) from None
        finally:
            sys.modules["__main__"] = main


@contextlib.contextmanager
def _worker_env(env: dict[str, str] | None = None) -> Iterator[None]:
    """Processes started inside get the workers' settings (one BLAS thread, freed memory kept) and ``env``
    in their environment, and do not import the caller's main script (:func:`detached_main`); this
    process's own environment is left as it was."""
    extra = {**dict.fromkeys(_ONE_THREAD, "1"), **_MALLOC, **(env or {})}
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        with detached_main():
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def started_pool(workers: int, context: str = "spawn", initializer: Any = None, initargs: tuple = ()) -> Any:
    """A ``ProcessPoolExecutor`` of ``workers`` processes, every one started now (not on the first tasks)
    and without importing the caller's main script (:func:`detached_main`)."""
    import multiprocessing as mp
    import time
    from concurrent.futures import ProcessPoolExecutor

    if context not in mp.get_all_start_methods():
        context = "spawn"
    with detached_main():
        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(context), initializer=initializer,
                                   initargs=initargs)
        for f in [pool.submit(time.sleep, 0.05) for _ in range(workers)]:  # none idle: every worker starts now
            f.result()
    return pool


def single_threaded_pool(workers: int, initializer: Any = None, initargs: tuple = (), wait: bool = True) -> Any:
    """A spawn-started process pool whose workers run NumPy's BLAS and FFT on one thread each (a process
    a core already: 16 processes each starting 16 BLAS threads oversubscribe the cores), and reuse freed
    memory for their per-record arrays (an audio record's frames and spectra: 6.11 -> 3.75 ms an
    audio-clf record on one CI core, benchmarks/audio_cpu.py). Every worker is started now, from the
    calling thread, with these settings in its environment only, and runs ``initializer(*initargs)``;
    with ``wait`` the call returns once each has started, else at once (their imports then run beside
    the caller's own start-up)."""
    import multiprocessing as mp
    import time
    from concurrent.futures import ProcessPoolExecutor

    with _worker_env():
        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=initializer,
                                   initargs=initargs)
        # (a process is started per task while none is idle)
        started = [pool.submit(time.sleep, 0.2 if wait else 0.0) for _ in range(workers)]
    if wait:
        for f in started:
            f.result()
    return pool


def worker_processes(target: Any, args: tuple, count: int, daemon: bool = True,
                     env: dict[str, str] | None = None, method: str = "spawn") -> list[Any]:
    """``count`` processes started by ``method`` (``spawn``; ``fork`` only where :func:`fork_safe`) running
    ``target(*args)`` (daemons unless they start processes of their own), with the pools' settings (one BLAS
    thread, freed memory kept: a forked one's target calls :func:`as_spawned`) and ``env`` in their environment
    only."""
    import multiprocessing as mp

    ctx = mp.get_context(method)
    with _worker_env(env):
        procs = [ctx.Process(target=target, args=args, daemon=daemon, name=f"gpubatch-worker-{i}")
                 for i in range(count)]
        for p in procs:
            p.start()
    return procs


def fork_safe() -> bool:
    """Whether this process may fork workers that run gpubatch's code: it has one thread, has not imported CuPy and
    has not initialised the CUDA driver (a forked child could not use CUDA then), on a system with ``fork``."""
    import multiprocessing as mp
    import threading

    device = sys.modules.get(f"{__package__}.device")
    return ("fork" in mp.get_all_start_methods() and threading.active_count() == 1 and "cupy" not in sys.modules
            and not getattr(device, "driver_asked", False))


def as_spawned() -> None:
    """(A worker forked from the ``gpubatch`` command's start, first thing.) What a spawned worker gets from its new
    interpreter: Python's own Ctrl-C handler (the command's start has its own) and glibc's malloc settings
    (:data:`_MALLOC`, read from the environment only when a process starts)."""
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, int(_MALLOC["MALLOC_MMAP_THRESHOLD_"]))  # M_MMAP_THRESHOLD
        libc.mallopt(-1, int(_MALLOC["MALLOC_TRIM_THRESHOLD_"]))  # M_TRIM_THRESHOLD
    except (AttributeError, OSError):  # pragma: no cover - not glibc
        pass


def unlink_semaphores(*objects: Any) -> int:
    """The named semaphores behind ``objects`` (multiprocessing's locks, semaphores, conditions, barriers and
    queues, a process pool's queues) unlinked now, as their finalizers would unlink them when collected or at this
    process's exit; returns how many. Call it once every process that uses them has started (each opened them
    when it unpickled them, and keeps them): none can open them any more. A worker ended without waiting for it
    (:func:`leave_dying`) never runs its finalizers: multiprocessing's resource tracker then unlinks what it made
    at its own end, warning of "leaked semaphore objects" on the terminal. Uses multiprocessing's finalizer
    registry; where that differs (another Python), nothing is done and the finalizers run as before."""
    names: set[str] = set()

    def collect(obj: Any, depth: int) -> None:
        semlock = getattr(obj, "_semlock", None)
        name = getattr(semlock, "name", None)
        if isinstance(name, str):
            names.add(name)
            return
        module = type(obj).__module__ or ""
        if depth and (module.startswith("multiprocessing") or module.startswith("concurrent.futures")):
            for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
                collect(value, depth - 1)

    for obj in objects:
        collect(obj, 3)
    try:
        from multiprocessing import synchronize, util

        registry, cleanup = util._finalizer_registry, synchronize.SemLock._cleanup
        found = [f for f in list(registry.values())
                 if getattr(f, "_callback", None) is cleanup and (getattr(f, "_args", None) or (None,))[0] in names]
    except (ImportError, AttributeError):
        return 0
    done = 0
    for finalizer in found:
        try:
            finalizer()  # (SemLock._cleanup: the name unlinked and told to the tracker; the finalizer gone)
            done += 1
        except OSError:  # (unlinked already)
            pass
    return done


def leave_dying(procs: list[Any]) -> None:
    """Processes that hold nothing any more, ended (``terminate``) and left to die without waiting for them:
    a GPU worker's end is the kernel tearing down its CUDA context (0.2-0.23 s of an H200 worker, after its
    last shard was committed, 2026-12-04, benchmarks/RESULTS.md), which neither the run nor the interpreter's
    exit need wait for. A daemon thread reaps them, and they are no longer multiprocessing's children (whose
    exit joins every child); where that registry is not there, nothing changes but the thread. At the
    interpreter's exit (an ``atexit`` callback), where Python 3.12 and later start no thread, they are left to
    the system's init, which reaps an exited process's children."""
    import multiprocessing.process as mpp

    alive = [p for p in procs if p.is_alive()]  # (is_alive reaps those dead already)
    if not alive:
        return
    for p in alive:
        p.terminate()
    children = getattr(mpp, "_children", None)

    def reap() -> None:
        for p in alive:
            with contextlib.suppress(Exception):  # (already reaped elsewhere)
                p.join()

    if isinstance(children, set):
        for p in alive:
            children.discard(p)
    try:
        threading.Thread(target=reap, name="gpubatch-reaper", daemon=True).start()
    except RuntimeError:  # at the interpreter's exit (Python 3.12 starts no thread then): init reaps them
        pass


#: what a worker's death by these signals most often means, for the run's one-line error
_DEATHS = {
    "SIGKILL": "the system's out-of-memory killer, or kill -9",
    "SIGBUS": "a file mapped in memory that could not be written: a full /dev/shm, or a full disk under a mapped file",
    "SIGSEGV": "a crash in a native library",
}


def died(exitcode: int | None) -> str:
    """How a child process ended, in words: ``exit code 3``, or the signal that killed it with its likely
    cause (``killed by SIGBUS: a file mapped in memory ...``)."""
    import signal

    if exitcode is None or exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"killed by signal {-exitcode}"
    why = _DEATHS.get(name)
    return f"killed by {name}" + (f": {why}" if why else "")


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (``PR_SET_PDEATHSIG``); elsewhere nothing. A
    run killed with ``kill -9`` then leaves no worker writing behind it."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass


def devices_hidden() -> bool:
    """Whether this process's ``CUDA_VISIBLE_DEVICES`` hides every CUDA device: empty, or a first entry such as
    ``-1`` (CUDA reads the list up to its first invalid entry)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and (not visible.strip() or visible.split(",")[0].strip().startswith("-"))


def visible_name(ordinal: int) -> str:
    """How ``CUDA_VISIBLE_DEVICES`` names CUDA device ``ordinal`` of this process (the entry of this process's
    own ``CUDA_VISIBLE_DEVICES`` where it has one)."""
    seen = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return seen[ordinal] if ordinal < len(seen) else str(ordinal)
