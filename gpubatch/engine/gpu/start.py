"""A GPU worker's start, begun in threads the moment the worker knows its GPU, in the order that costs least.

Measured on an H200 host (2026-11-27, ``benchmarks/gpu_start.py --quick``, a fresh process each): made first,
nvImageCodec's C library took 1.04 s and the first hardware-decoder instance 0.61 s after it; with the
instance made first, the instance took 0.62 s and the library 0.03 s (the two share nvJPEG's start, which
the library makes slowly). The CUDA kernels a run launches are compiled (or read from CuPy's cache) beside
them, each alone in a thread of its own (:func:`..kernels.load`): on a machine with no cache the warm-up took
9.3 s, most of it NVRTC, when each source file was compiled whole and its loops unrolled.

A worker process of the local executor begins it first thing (:func:`boot`, given an :class:`Early` by the
strategy table), before it unpickles its run (which imports most of gpubatch): the context is made through
the driver API (:mod:`.context`) and the hardware decoder's instances through nvJPEG, neither of which needs
CuPy or holds the GIL, so they are made while the main thread imports. A unit made without a boot begins
the same start itself.

The first hardware instance takes most of their time (nvJPEG's start; about 0.6 s of the three's 0.8 s on an
H200): nvImageCodec's library follows it, and the other instances are made after the decoder's warm-up,
while it decodes its first batches on the first instance (a decoder that takes instances as they come:
``GpuImageDecoder(hw_later=True)``). :func:`hardware_first` waits for the
first instance and the library, :func:`hardware_rest` asks for the others (once the decoder's warm-up is done:
made beside it, they slowed it), :func:`hardware_instances` hands the instances made to the decoder that asks
(all of them, or those made so far), :func:`hardware_coming` says whether more are being made,
:func:`kernels_ready` waits for the kernels, and :func:`booted` gives the core the boot reserved for the
hardware decoder's thread. Errors are kept for the real calls, which make what failed again and raise there.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, NamedTuple

from ..settings import Settings


class Early(NamedTuple):
    """What a GPU worker starts before anything else (:func:`boot`): device ``index``'s context (its sync
    policy set first where ``sync``), ``hw`` hardware-decoder instances, nvImageCodec's C ``library``, the
    ``kernels`` its run launches ((module, kernel) pairs, :func:`..kernels.kernel`); ``reserve``: the GPU
    ordinal whose core the hardware decoder's thread takes (:func:`.affinity.reserve`), taken before any of
    the start's threads, or None; ``host``: the GPU processes sharing the host's cores, where the worker's boot
    starts its feed's reader processes too (:func:`feed_readers` of them; an image run's), else 0; ``decoders``: the
    audio unit's decoding processes the worker's boot starts (an audio run's, :func:`audio_decoders`), else 0;
    ``warm``: "audio" (an audio run's): after the context the start runs a log-mel chain once on a second of silence
    (:data:`AUDIO_WARM`: CuPy, its FFT and BLAS libraries and their handles loaded, the common kernels made, while the
    worker unpickles its run; the unit warms its own chain's first batch after); "video" (a video run's: its boot
    imports PyNvVideoCodec and the video unit while it waits for its run, :data:`..execute.boot.VIDEO_MODULES`), else
    ""."""

    index: int
    settings: Settings
    hw: int = 0
    kernels: tuple[tuple[str, str], ...] = ()
    sync: bool = True
    library: bool = True
    reserve: int | None = None
    host: int = 0
    decoders: int = 0
    warm: str = ""


#: the hardware engine's instances a decoder makes off the hardware route (GpuImageDecoder.HW_INSTANCES)
HW_INSTANCES = 2


def instances_for(route: str, settings: Settings) -> int:
    """The hardware-engine instances a decoder on ``route`` makes at its start: one per common kind on the
    hardware route, :data:`HW_INSTANCES` otherwise (``settings.hw_instances`` where set)."""
    return settings.hw_instances or (settings.hw_only_instances if route == "hardware" else HW_INSTANCES)


def instances_wanted(settings: Settings) -> int:
    """The hardware engine's direct-path instances a decoder of ``settings`` makes at its start (0 where
    it makes none: the Python binding, or the direct path turned off): what a worker's start makes for it."""
    if settings.decode_api != "c" or not settings.hw_direct or settings.decode_route == "cuda":
        return 0
    return instances_for(settings.decode_route, settings)


def early(kind: str, ctx: Any) -> Early | None:
    """The :class:`Early` of a worker of ``ctx``'s run whose strategy starts ``kind`` (its table's ``start``):
    "image" (the context, the hardware decoder's instances, nvImageCodec, the kernels of its chain and of the
    JPEG encoder: what :class:`~.images.GpuImageUnit` would begin), "audio" (the context, and the audio unit's
    decoding processes forked first: :func:`audio_decoders`), "video" (the context and the kernels of
    :func:`video_kernels`), or none."""
    if kind == "image":
        from .chain import kernels_needed

        return Early(ctx.device.index, ctx.settings, instances_wanted(ctx.settings),
                     kernels_needed(ctx.plan.ops, encode=True),
                     reserve=ctx.gpu_ordinal if max(1, ctx.gpu_procs) == 1 else None, host=ctx.host_procs)
    if kind == "audio" and ctx.gpu_memory is None:  # (a capped run measures its context as it makes it)
        return Early(ctx.device.index, ctx.settings, sync=False, library=False,
                     decoders=audio_decoders(ctx.host_procs), warm="audio")
    if kind == "video" and ctx.gpu_memory is None:
        return Early(ctx.device.index, ctx.settings, kernels=video_kernels(ctx.plan), sync=False, library=False,
                     warm="video")
    return None


def video_kernels(plan: Any) -> tuple[tuple[str, str], ...]:
    """The kernels a GPU video run of ``plan`` launches (its frames' colour conversion, its chain's and the JPEG
    encoder's): what its worker's start compiles."""
    from .chain import kernels_needed

    return (("yuv", "nv12_rgb"), *kernels_needed(plan.ops, encode=True))


#: the chain an audio worker's start runs once on silence (``Early.warm``): what most audio chains' first batch loads
AUDIO_WARM = "mono() | log_mel(n_mels=80)"


def audio_decoders(host: int) -> int:
    """The GPU audio unit's decoding processes in a worker of ``host`` GPU processes sharing this host's cores: its
    share of the cores, one left to its loop and its shards' writer."""
    from ..processes import cores

    return max(1, cores() // max(1, host) - 1)


#: reader processes of a GPU worker's feed at most (a convert reads records through the formats' readers:
#: more Python a record than the pipelines' file reads)
CONVERT_READERS_MAX = 8


def feed_readers(have: int, host: int, settings: Settings) -> int:
    """The reader processes of a ``convert``/``augment`` GPU worker's feed, on ``have`` cores shared by ``host`` GPU
    processes: the pipelines' default for its share, and on the hardware route, whose decoders leave the cores to
    the readers, half its share (at most :data:`CONVERT_READERS_MAX`)."""
    from ..processes import default_readers

    host = max(1, host)
    readers = default_readers(max(1, have // host), settings=settings)
    if settings.decode_route == "hardware":
        readers = max(readers, min(CONVERT_READERS_MAX, have // (2 * host)))
    return readers


class _Start:
    def __init__(self, spec: Early):
        self.spec = spec
        self.index, self.settings, self.hw_wanted = spec.index, spec.settings, spec.hw
        self.hw: list[Any] = []
        self.times: dict[str, float] = {}
        self.walls: dict[str, float] = {}  # (each step's end, time.time(): the unit's marks)
        # first: the first instance and the library (what a decoder waits for); go: the rest asked for (after the
        # decoder's warm-up: made beside it, they slowed it); hw_done: every instance made or failed
        self.first, self.go, self.hw_done = threading.Event(), threading.Event(), threading.Event()
        self.context = threading.Event()  # the context made (or failed): kernels asked for later compile after it
        self.stopping = False  # the process exits: no more instances made (exit_wait)
        self._compiled: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._run, name="gpubatch-gpu-start", daemon=True)
        self.thread.start()

    def _step(self, name: str, t: float) -> float:
        now = time.perf_counter()
        self.times[name] = round(now - t, 4)
        self.walls[name] = time.time()
        return now

    def _run(self) -> None:
        t = time.perf_counter()
        try:
            from .context import make_current, set_sync_policy

            if self.spec.sync:  # how every thread waits for the device: set before the context exists (as GpuEngine would)
                set_sync_policy(self.index, self.settings.sync, only_before_context=True)
            if not make_current(self.index):  # (through the driver: CuPy is imported beside what follows)
                import cupy as cp

                cp.cuda.runtime.setDevice(self.index)
                cp.cuda.runtime.memGetInfo()  # (the CUDA context is made here)
            t = self._step("context", t)
            self.context.set()
            if self.spec.warm == "audio":  # (a log-mel chain, once, on silence)
                from ..plan import Plan
                from ..spec import parse_chain
                from .audio_chain import warm_chain

                warm_chain(Plan(ops=parse_chain(AUDIO_WARM), media="audio"), 16000, 16000, 1, 1)
                if self.settings.flac_gpu:  # (the FLAC decoder's kernel, compiled or read from CuPy's cache)
                    try:
                        from ..kernels import kernel

                        kernel("flac", "flac_frames")
                    except Exception:  # noqa: BLE001 - compiled again, and raised, at first use
                        pass
                t = self._step("chain warmed", t)
            if self.spec.kernels:  # NVRTC (or CuPy's cache) beside the decoders' start
                c = threading.Thread(target=self._compile, args=(self.spec.kernels,), name="gpubatch-compile",
                                     daemon=True)
                c.start()
                self._compiled.append(c)
            if self.hw_wanted:
                t = self._instances(1, "hardware instance 1", t)
            if self.spec.library:
                from ..codecs.nvimgcodec_c import library

                try:
                    library()
                except Exception:  # noqa: BLE001 - raised again where the decoder asks for it
                    pass
                t = self._step("nvImageCodec library", t)
            self.first.set()
            if self.hw_wanted > 1:  # (once asked for: while the decoder decodes its first batches on the first)
                if not self.settings.hw_rest_early:
                    self.go.wait()
                if not self.stopping:
                    self._instances(self.hw_wanted - 1, "hardware instances after the first", time.perf_counter())
        except Exception:  # noqa: BLE001 - no CUDA here: the engine's own start says why
            pass
        finally:
            self.context.set()
            self.first.set()
            self.hw_done.set()

    def _instances(self, n: int, name: str, t: float) -> float:
        """``n`` more hardware-decoder instances into :attr:`hw` (none more after one fails: the decoder
        makes them again, and says why not); the step's time kept as ``name``."""
        from ..codecs.nvjpeg_hw import HwBatchDecoder

        try:
            for _ in range(n):
                if self.stopping:
                    break
                made = HwBatchDecoder(None, self.index)
                with _LOCK:
                    self.hw.append(made)
        except Exception:  # noqa: BLE001
            pass
        return self._step(name, t)

    def compile_later(self, kernels: tuple[tuple[str, str], ...]) -> None:
        """``kernels`` compiled too, in a thread of their own once the context is made (:func:`compile_more`)."""

        def after_context() -> None:
            self.context.wait()
            self._compile(kernels)

        c = threading.Thread(target=after_context, name="gpubatch-compile", daemon=True)
        c.start()
        self._compiled.append(c)

    def _compile(self, kernels: tuple[tuple[str, str], ...]) -> None:
        t = time.perf_counter()
        try:
            from ..kernels import load

            self.times.update(load(kernels, self.index))
        except Exception:  # noqa: BLE001 - compiled again (and raised) at first use
            pass
        self.times["kernels"] = round(time.perf_counter() - t, 4)


_STARTS: dict[int, _Start] = {}
_LOCK = threading.Lock()


def _exit_wait(timeout: float = 10.0) -> None:
    """(At the interpreter's exit.) Every start told to make no more instances and waited for up to ``timeout``
    seconds: a process that ended while a start's thread was inside nvJPEG's making of an instance (an error
    raised by the code that booted it) was aborted by nvJPEG's exception (``terminate called after throwing
    an instance of 'nvjpeg::ExceptionJPEG'``) instead of exiting with its own error."""
    end = time.monotonic() + timeout
    for s in list(_STARTS.values()):
        s.stopping = True
        s.go.set()
    for s in list(_STARTS.values()):
        s.hw_done.wait(max(0.0, end - time.monotonic()))


_BOOTED: dict[int, tuple[float, Any]] = {}  # device index -> (when the boot began, the core it reserved or None)


def boot(spec: Early | None, readers: bool = False) -> None:
    """Begin device ``spec.index``'s start in this process (once): ``spec``'s core reserved, then its start
    in a thread (:class:`Early`); a GPU worker's first step, before it unpickles its run (where no boot
    did, its unit begins it so); nothing where ``spec`` is None. With ``readers`` (a worker's boot, while its
    process has one thread), its feed's reader processes are forked between the two where ``spec.host`` says
    (:mod:`.feed_start`)."""
    if spec is None:
        return
    with _LOCK:
        if spec.index in _STARTS:
            return
        reserved = None
        if spec.reserve is not None:
            from . import affinity

            reserved = affinity.reserve(spec.reserve, spec.settings)
        if readers and spec.host:  # an image run's worker: its feed's readers forked now, while it has one thread
            from ..processes import cores
            from . import feed_start

            feed_start.prestart(feed_readers(cores(), spec.host, spec.settings))
        elif readers and spec.decoders:  # an audio run's worker: its decoding processes forked now, likewise
            from . import feed_start

            feed_start.prestart(spec.decoders, "audio")
        _BOOTED[spec.index] = (time.perf_counter(), reserved)
        if not _STARTS:
            atexit.register(_exit_wait)
        _STARTS[spec.index] = _Start(spec)


def compile_more(index: int, kernels: tuple[tuple[str, str], ...]) -> None:
    """Device ``index``'s start (:func:`boot`'s, begun without them) told to compile ``kernels`` as well, beside
    its hardware decoder's start: what a worker started before its run's plan was known is told once it is
    (``execute.boot.KERNELS``); :func:`kernels_ready` waits for them too. Nothing where no start began."""
    s = _STARTS.get(index)
    if s is not None and kernels:
        s.compile_later(tuple(kernels))


def booted(index: int) -> tuple[float | None, Any]:
    """(the seconds since this process's boot began device ``index``'s start, or None where no boot did;
    the core it reserved for the hardware decoder's thread, or None): a unit takes that reservation
    instead of reserving again."""
    if index not in _BOOTED:
        return None, None
    t, reserved = _BOOTED.pop(index)
    return time.perf_counter() - t, reserved


def hardware_instances(index: int, n: int, wait: bool = True) -> list[Any]:
    """Up to ``n`` hardware-decoder instances :func:`boot` made for device ``index``: where ``wait``, once it
    has made all it makes (or failed; those after the first asked for now: :func:`hardware_rest`), else those
    made so far (after the first, waited for); the caller owns them."""
    s = _STARTS.get(index)
    if s is None:
        return []
    if wait:
        s.go.set()
    (s.hw_done if wait else s.first).wait()
    with _LOCK:
        out, s.hw[:] = s.hw[:n], s.hw[n:]
    return out


def hardware_coming(index: int) -> bool:
    """Whether :func:`boot`'s start for device ``index`` is still making hardware-decoder instances (those it
    makes after the first); False where none began."""
    s = _STARTS.get(index)
    return s is not None and not s.hw_done.is_set()


def hardware_rest(index: int) -> None:
    """Ask :func:`boot`'s start for device ``index`` to make the hardware-decoder instances after the first (a
    decoder that takes them as they come asks once its warm-up is done); nothing where none began."""
    s = _STARTS.get(index)
    if s is not None:
        s.go.set()


def hardware_first(index: int) -> None:
    """Wait until :func:`boot`'s first hardware-decoder instance for device ``index`` and nvImageCodec's
    library after it are made (or failed); at once where no start began. The library is made after the
    first instance: made beside it, it took about a second and slowed it (the module docstring)."""
    s = _STARTS.get(index)
    if s is not None:
        s.first.wait()


def step_walls(index: int) -> dict[str, float]:
    """When each step of :func:`boot`'s start for device ``index`` ended so far (``time.time()``); empty where none
    began."""
    s = _STARTS.get(index)
    return dict(s.walls) if s is not None else {}


def kernels_ready(index: int) -> dict[str, float]:
    """Wait until :func:`boot`'s kernels for device ``index`` are compiled and its first instance and the
    library made (not the instances after the first); the seconds of each of its steps so far."""
    s = _STARTS.get(index)
    if s is None:
        return {}
    s.first.wait()
    for c in s._compiled:
        c.join()
    return dict(s.times)
