"""A GPU run's worker processes started before the run needs them, so that their GPUs' start (the CUDA context,
the hardware decoder's instances, the kernels: :mod:`..gpu.start`) runs beside what the command's own process
does first: :func:`started_early` once the run knows its device and its records' media, before it lists the
source and plans the shards; :func:`prestart` earlier still, the moment ``convert`` or ``augment`` has checked its
options, before its process probes the device (``cuInit`` alone took 0.19-0.24 s on an H200 host, 2026-12-04,
benchmarks/RESULTS.md "07:28 to 08:11") and opens the source; and :func:`sniff` first of all, at the ``gpubatch``
command's start, from its arguments alone, before it imports its options' parser and the rest of gpubatch (the
0.2-0.3 s before :func:`prestart`, most of it imports: ``benchmarks/cli_start.py``). What a run takes is a :class:`~.local.Started`; the processes
it does not take end with it.

A run on the host unit (every CPU run, and every pass-through) has its worker processes forked by :func:`sniff` too,
a core each: they import what their unit runs (Pillow, NumPy, the formats) while the command imports its own,
lists the source and plans the shards, where they were spawned after the plan before.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

#: ``convert``'s options that decode pixels (``--image-format`` unless ``keep``)
PIXEL_OPTIONS = ("--resize-shorter", "--center-crop", "--quality", "--image-format")
#: ``convert``'s audio options: a run over audio records (:func:`sniff` starts a GPU audio run's workers for them)
AUDIO_OPTIONS = ("--sample-rate", "--mono", "--duration", "--pad", "--audio-format", "--features")
#: ``convert``'s video options: a run over video records (:func:`sniff` starts a GPU video run's worker for them)
VIDEO_OPTIONS = ("--frames", "--clip-length", "--clip-stride", "--frame-step", "--clip-positions", "--clips-per-video",
                 "--clip-format", "--video-codec", "--fps")
#: options of runs that :func:`sniff` starts nothing for: a table's columns, several GPUs, parts, help and lists
NOT_EARLY = ("--path-column", "--label-column", "--gpus", "--num-parts", "--part", "--help", "-h", "--list-ops",
             "--list-presets", "--version")

#: the NVIDIA driver's control device node, where the machine has the driver
NODE = "/dev/nvidiactl"


def gpu_procs(req: Any, strategy: Any, records: int | None = None, gpus: int = 1) -> int:
    """The worker processes a GPU of a GPU run (``--gpu-procs``, else the strategy's; for a local run without
    a cap, its ``long_run``'s where it has at least that many ``records``, and its ``wide``'s where the host
    has that many cores for each of its ``gpus``; one for audio and video under a cap: their plans')."""
    free = not req.gpu_procs and req.gpu_memory is None and getattr(req, "executor", "local") == "local"
    procs = req.gpu_procs or (strategy.per_gpu_here(gpus) if free else strategy.per_gpu)
    long = strategy.long_run
    if long and free and records is not None and records >= long[0]:
        procs = max(procs, long[1])
    return 1 if req.gpu_memory is not None and strategy.name != "gpu-image" else procs


def started_early(req: Any, finish: bool, plan: Any, device: Any, settings: Any, ahead: Any = None) -> Any:
    """A GPU run's worker processes, started before its source is listed and its shards planned
    (:class:`~.local.Started`): ``ahead`` (:func:`prestart`'s) where they began what this run's would, else
    those :func:`sniff` started where they did, else started now (``ahead`` and :func:`sniff`'s end). A run on the
    host unit (the CPU's, a pass-through) takes the host workers :func:`sniff` started, and gets None where it
    started none (its executor spawns them with its tasks); so does a run that is not the local executor's (Ray, a
    part, ``finish``)."""
    from .local import Started
    from .strategies import strategy_for
    from .worker import RunContext

    strategy = None
    if getattr(req, "executor", "local") == "local" and not finish and getattr(req, "num_parts", None) is None:
        strategy = strategy_for(plan, device)
    sniffed = taken_sniffed()
    if strategy is None or not strategy.gpu:
        if ahead is not None:
            ahead.close()
        if strategy is not None and sniffed is not None and sniffed.kind == HOST:  # (the host unit's: a core each)
            return Started.taking(strategy, sniffed.begun, sniffed)
        if sniffed is not None:
            sniffed.close()
        return None

    procs = gpu_procs(req, strategy, gpus=len(device.indexes))
    ctx = RunContext(opener=None, sink=None, plan=plan, device=device, settings=settings, gpu_memory=req.gpu_memory,
                     gpu_procs=procs, on_gpu=True)
    workers = procs * max(1, len(device.indexes))
    if ahead is not None:
        if ahead.fits(ctx, strategy, workers):
            if sniffed is not None:
                sniffed.close()
            return ahead
        ahead.close()
    if sniffed is not None:
        from .local import boots

        begun = boots(ctx, strategy, 0, workers)
        if sniffed.kind != HOST and sniffed.fits(strategy, begun):  # (a host run's never fit a GPU run)
            return Started.taking(strategy, sniffed.begin(begun), sniffed)
        sniffed.close()
    return Started(ctx, strategy, workers)


def run_settings(gpu: bool) -> Any:
    """The engine's settings of a run (``GPUBATCH_*`` over the defaults); on a GPU the decode route ``auto`` is
    fixed to ``hardware``: the route goes by each image's kind, never by load, so the bytes written do not follow
    the host's load."""
    from ..settings import Settings

    settings = Settings.from_env()
    if gpu and settings.decode_route == "auto":
        settings = settings.with_(decode_route="hardware")
    return settings


def gpu_node() -> bool:
    """Whether this machine has an NVIDIA GPU's device node and CuPy is installed (found, not imported; no driver
    call), and ``CUDA_VISIBLE_DEVICES`` does not hide every device (empty, or a first entry such as ``-1``, which
    CUDA takes as the list's end): what :func:`prestart` asks before it starts anything."""
    import importlib.util

    from ..processes import devices_hidden

    if devices_hidden():
        return False
    try:
        return os.path.exists(NODE) and importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        return False


def prestart(req: Any, plan: Any) -> Any:
    """A GPU image run's worker processes, started the moment its options are checked: before its device is
    probed and its source opened, so that their GPUs' start runs beside both. They begin what a run of ``plan``
    over image records on GPU ``--gpu`` would; the run takes them where its device and records prove to be those
    (:func:`started_early`), and they end otherwise. None where nothing is started: no pixel option, video or
    audio options, a CPU device, no GPU device node or no CuPy, ``--gpus``, Ray, a part, ``finish``, or
    ``GPUBATCH_EARLY_START=0``."""
    from ..device import Device, DeviceKind

    if (str(req.device or "auto").lower() not in ("auto", "gpu") or getattr(req, "gpus", None) is not None
            or getattr(req, "executor", "local") != "local" or getattr(req, "num_parts", None) is not None
            or req.finish or not plan.touches_pixels or plan.sample is not None or plan.audio_format != "keep"
            or not all("image" in op.media for op in plan.ops) or not gpu_node()):
        close_sniffed("image")  # (an audio run's, which sniff started, wait for started_early: it takes them)
        return None
    settings = run_settings(gpu=True)
    if not settings.early_start:
        close_sniffed()
        return None
    device = Device(DeviceKind.GPU, int(req.gpu or 0))
    return started_early(req, False, dataclasses.replace(plan, media="image"), device, settings)


def _given(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of option ``name`` in ``args`` (``--name VALUE`` or ``--name=VALUE``; the last one given), else
    ``default``."""
    found = default
    for k, a in enumerate(args):
        if a == name and k + 1 < len(args):
            found = args[k + 1]
        elif a.startswith(name + "="):
            found = a[len(name) + 1:]
    return found


#: the kind of run :func:`guessed` names for the host unit (a CPU run, a pass-through)
HOST = "host"


def guessed(args: list[str], gpu_here: bool | None = None) -> tuple[str, int, int] | None:
    """(the kind of run, "image", "audio", "video" or "host"; its GPU; its processes a GPU, or the host run's
    processes) of the run whose workers :func:`sniff` starts, guessed from the ``gpubatch`` command's arguments alone
    (no device probe; ``gpu_here``: whether this machine has a GPU's device node and CuPy, :func:`gpu_node` where not
    given); None where it would start none or the arguments do not say: not ``convert`` or ``augment``, audio and
    video options together, audio or video options under ``--gpu-memory`` (their plans measure the context as they
    make it), ``--gpus``, Ray, a part, help. A run on the host unit (``--device cpu``; ``--device auto`` with no GPU
    here; a ``convert`` with neither a pixel, an audio nor a video option, whose bytes pass through) is "host", its
    processes ``--workers``, else a core each, as the executor starts them (none where that is one: the run works in
    the command's own process). An audio or video run's processes a GPU are ``--gpu-procs``, else its strategy's on
    this host (``Strategy.per_gpu_here``); a video run of more than one (whose workers share one queue, which
    :meth:`Sniffed.fits` refuses) gets none. A wrong guess costs only the processes it starts, which the run ends
    where they do not fit."""
    names = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    command = next((a for a in args if not a.startswith("-")), None)
    if command not in ("convert", "augment") or names & set(NOT_EARLY) or _given(args, "--executor", "local") != "local":
        return None
    audio, video = bool(names & set(AUDIO_OPTIONS)), bool(names & set(VIDEO_OPTIONS))
    if audio and video:
        return None
    device = (_given(args, "--device", "auto") or "").lower()
    passing = not (audio or video) and not _pixels(args, names, command)
    if device == "cpu" or passing or device == "auto" and not (gpu_node() if gpu_here is None else gpu_here):
        return _host_guess(args)
    if (audio or video) and "--gpu-memory" in names or device not in ("auto", "gpu"):
        return None
    try:
        gpu, procs = int(_given(args, "--gpu", "0") or 0), int(_given(args, "--gpu-procs", "0") or 0)
    except ValueError:  # (the options' parser says what is wrong)
        return None
    kind = "audio" if audio else "video" if video else "image"
    if not procs and kind != "image":
        from .strategies import TABLE

        procs = TABLE[(kind, "gpu")].per_gpu_here()
    procs = procs or 1
    if kind == "video" and procs > 1:  # (its workers share one queue of tasks: a run takes one sniffed worker only)
        return None
    return (kind, gpu, procs) if gpu >= 0 and procs >= 1 else None


def _pixels(args: list[str], names: set[str], command: str | None) -> bool:
    """Whether the command (``command``, its options' ``names``) decodes pixels: ``augment``, or ``convert`` with a
    pixel option (``--image-format`` other than ``keep``)."""
    return command == "augment" or any(n in names and (n != "--image-format" or _given(args, n) != "keep")
                                       for n in PIXEL_OPTIONS)


def _host_guess(args: list[str]) -> tuple[str, int, int] | None:
    """A host run's guess (:func:`guessed`): its processes ``--workers``, else a core each (the executor's, for a
    run of as many tasks; one it takes fewer leaves the rest to end); None for one (the run works in the command's
    process), or a ``--workers`` the options' parser refuses."""
    from ..processes import cores

    try:
        procs = int(_given(args, "--workers", "0") or 0) or cores()
    except ValueError:
        return None
    return (HOST, 0, procs) if procs > 1 else None


class Sniffed:
    """Worker processes :func:`sniff` started at the command's start, a slot each (their tasks dealt, as the GPU
    image unit's are), each waiting for its run: ``begun`` says what each slot's boot began (:func:`~.local.boots`'s
    pairs, the kernels left out: the plan that names them is not known yet)."""

    def __init__(self, begun: list[tuple[Any, dict[str, str]]], fork: bool = False, kind: str = "image"):
        import multiprocessing as mp

        from .boot import new_slots

        self.begun, self.kind = begun, kind
        self.results = mp.get_context("spawn").Queue()
        # (a host run's workers take the next task from one queue as they free up: strategies' host unit)
        self.setups, self.tasks, self.procs = new_slots(begun, kind != HOST, self.results, fork=fork)
        self.at = time.time()

    def fits(self, strategy: Any, begun: list[tuple[Any, dict[str, str]]]) -> bool:
        """Whether a run whose slots begin ``begun`` (:func:`~.local.boots`) with ``strategy`` can take these
        processes: its tasks dealt (or one process: its queue is the run's one queue), and each slot the same GPU
        start, its kernels aside, in the same environment."""
        return (strategy.dealt or len(begun) == 1) and len(begun) == len(self.begun) and all(
            e is not None and e._replace(kernels=()) == mine and env == my_env
            for (e, env), (mine, my_env) in zip(begun, self.begun))

    def begin(self, begun: list[tuple[Any, dict[str, str]]]) -> list[tuple[Any, dict[str, str]]]:
        """Each slot's start told the kernels its run launches (compiled beside its hardware decoder's start,
        :data:`.boot.KERNELS`); returns ``begun``."""
        from .boot import KERNELS

        for q, (e, _) in zip(self.setups, begun):
            if e.kernels:
                q.put((KERNELS, e.kernels))
        return begun

    def close(self) -> None:
        """The processes ended at once, not waited for (they hold nothing; a CUDA context's end takes a fifth of
        a second), and their queues closed."""
        from ..processes import leave_dying

        leave_dying(self.procs)
        for q in (*self.setups, *self.tasks, self.results):
            q.cancel_join_thread()
            q.close()


_SNIFFED: list[Sniffed] = []  # (what sniff started and no run has taken)


def taken_sniffed() -> Sniffed | None:
    """What :func:`sniff` started, now the caller's (None where it started nothing or it was taken)."""
    return _SNIFFED.pop() if _SNIFFED else None


def close_sniffed(kind: str | None = None) -> None:
    """What :func:`sniff` started and no run took, ended (only where it was for a run of ``kind``, where given)."""
    if kind is not None and not any(s.kind == kind for s in _SNIFFED):
        return
    sniffed = taken_sniffed()
    if sniffed is not None:
        sniffed.close()


def sniff(args: list[str]) -> None:
    """At the ``gpubatch`` command's start (``args``: its arguments), before it imports its options' parser:
    where they look like a GPU image, audio or video run's (:func:`guessed`) on a machine with an NVIDIA device node
    and CuPy (:func:`gpu_node`), that run's worker processes started now, their GPU's start begun (an image or video
    run's kernels once the plan names them: :meth:`Sniffed.begin`; an audio run's decoding processes and its
    warm-up, as ``gpu.start.early("audio")`` has them); where they look like a host run's (the CPU's, a
    pass-through), its workers started now, importing what their unit runs (:func:`_sniff_host`). :func:`started_early` takes them where they fit its run and ends them
    otherwise (so does :func:`prestart` an image run's); so does the command's exit where it never gets there (a
    usage error). Never raises: a bad setting or option is the command's to report. ``GPUBATCH_EARLY_START=0``
    turns it off with :func:`prestart`."""
    try:
        here = gpu_node()
        guess = guessed(args, here)
        if guess is None:
            return
        settings = run_settings(gpu=True)
        if not settings.early_start:
            return
        import atexit

        from ..processes import fork_safe, visible_name

        kind, gpu, procs = guess
        if kind == HOST:
            _sniff_host(args, procs, settings.early_fork and fork_safe(), here)
            atexit.register(close_sniffed)
            return
        from ..gpu.start import Early, audio_decoders, instances_wanted

        env = {"CUDA_VISIBLE_DEVICES": visible_name(gpu)} if gpu else {}  # (as RunContext.for_slot)
        if kind == "audio":  # (as gpu.start.early("audio"): the run's context, decoding processes and warm-up)
            early = Early(0, settings, sync=False, library=False, decoders=audio_decoders(procs), warm="audio")
        elif kind == "video":  # (as gpu.start.early("video"), its kernels told once the plan names them)
            early = Early(0, settings, sync=False, library=False, warm="video")
        else:
            early = Early(0, settings, instances_wanted(settings), (), reserve=gpu if procs == 1 else None, host=procs)
        from .early_stderr import early_descriptor, read_early

        # forked where the command may (one thread, no CUDA): a fresh interpreter's start and imports left out;
        # what they print (a decoder's lines from C) held back as the command's own workers' is (report/noise.py)
        with early_descriptor():
            _SNIFFED.append(Sniffed([(early, dict(env)) for _ in range(procs)],
                                    fork=settings.early_fork and fork_safe(), kind=kind))
        read_early()
        atexit.register(close_sniffed)  # (before multiprocessing's own, which would wait for them)
        from ..device import probe_ahead

        probe_ahead(gpu)  # (the command's own device probe beside its imports; after the fork: a thread now)
    except Exception:  # noqa: BLE001 - a guess: the command runs as it would have
        return


def _sniff_host(args: list[str], procs: int, fork: bool, here: bool) -> None:
    """:func:`sniff` of a host run: its ``procs`` worker processes (forked where ``fork``), each importing what its
    unit runs while it waits for its run (:class:`.boot.HostStart`: the formats and the run's steps, and Pillow and
    NumPy where the run touches pixels); the device probe begun where the run asks for a GPU (``--device gpu``: a
    pass-through's, which runs on the host all the same; ``--gpu`` its index)."""
    from .boot import HOST_MODULES, PIXEL_MODULES, HostStart

    names = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    command = next((a for a in args if not a.startswith("-")), None)
    start = HostStart(HOST_MODULES + (PIXEL_MODULES if _pixels(args, names, command) else ()))
    _SNIFFED.append(Sniffed([(start, {}) for _ in range(procs)], fork=fork, kind=HOST))
    if (_given(args, "--device", "auto") or "").lower() == "gpu" and here:
        from ..device import probe_ahead

        try:
            probe_ahead(int(_given(args, "--gpu", "0") or 0))
        except ValueError:  # (the options' parser says what is wrong)
            pass
