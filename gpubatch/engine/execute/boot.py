"""A worker process's first step, light on purpose: the GPU's start begun (:func:`..gpu.start.boot`), then
the run's parts unpickled and the worker's loop (:func:`work`) run; the local executor (:mod:`.local`) starts
its processes here.

The run's context and strategy come as bytes on a queue, pickled by the parent, so that the process's own
start (``spawn`` unpickles a process's arguments before it calls its target) imports only this module: the CUDA
context and the hardware decoder's instances are then made in a thread while this one imports the rest of
gpubatch and unpickles the run (on an H200 host the start had run 0.16-0.23 s by the time the image unit
asked for it: ``gpu_init: begun by the boot`` in the run's timings, benchmarks/RESULTS.md 2026-12-02).
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: a message on a worker's ``payload`` queue before its run: the kernels its start compiles besides those its
#: :class:`..gpu.start.Early` named (a process started at the command's start, before its plan was known:
#: :func:`.early.sniff`)
KERNELS = "kernels"

#: when this worker's boot got its run and had it unpickled (``time.time()``; the GPU image unit's marks)
TIMES: dict[str, float] = {}

#: what a GPU image worker's run imports, imported while its boot waits for the run (its idle time: a worker
#: started at the command's start waits about half a second), in a thread of its own: the run's unpickling and
#: the unit find them imported
IMAGE_MODULES = ("gpubatch.engine.execute.worker", "gpubatch.engine.execute.writer", "gpubatch.engine.gpu.images",
                 "gpubatch.engine.gpu.feed", "gpubatch.engine.gpu.engine", "gpubatch.formats", "cupy",
                 "gpubatch.engine.codecs.image_device", "gpubatch.engine.codecs.image_gpu",
                 "gpubatch.engine.codecs.jpeg_gpu", "gpubatch.engine.codecs.image_encode_gpu", "gpubatch.engine.gpu.chain")
#: what a GPU audio worker's run imports, likewise: CuPy and its FFT and BLAS libraries first (loaded beside the
#: context, which its start's warm-up, :data:`..gpu.start.AUDIO_WARM`, waits for), then the audio unit
AUDIO_MODULES = ("cupy", "cupy.cuda.cufft", "cupy_backends.cuda.libs.cublas", "cupy.fft", "gpubatch.engine.gpu.audio",
                 "gpubatch.engine.ops.spectral", "gpubatch.engine.execute.worker", "gpubatch.engine.execute.writer",
                 "gpubatch.formats", "gpubatch.engine.gpu.audio_records", "gpubatch.engine.gpu.audio_feed")
#: what a GPU video worker's run imports, likewise: CuPy and PyNvVideoCodec, the video unit, its encoder and writer
VIDEO_MODULES = ("cupy", "PyNvVideoCodec", "gpubatch.engine.gpu.video", "gpubatch.engine.gpu.nvdec_loop",
                 "gpubatch.engine.codecs.video", "gpubatch.engine.execute.worker", "gpubatch.engine.execute.writer",
                 "gpubatch.formats", "gpubatch.engine.gpu.chain", "gpubatch.engine.codecs.image_encode_gpu",
                 "gpubatch.engine.codecs.jpeg_gpu")
#: what a host unit's worker runs (every CPU run's, and a pass-through's), imported while it waits for its run
#: where the command's start forked it (:func:`.early.sniff`): NumPy and the digest (which the command's own process
#: no longer imports), the run's steps, its context's parts and the formats
HOST_MODULES = ("numpy", "crc32c", "gpubatch.runner", "gpubatch.engine.execute.units", "gpubatch.engine.execute.worker",
                "gpubatch.engine.executor", "gpubatch.engine.run", "gpubatch.engine.plan", "gpubatch.formats")
#: and where the run touches pixels: Pillow's JPEG and PNG codecs and the chain's host kernels
PIXEL_MODULES = ("PIL.Image", "PIL.JpegImagePlugin", "PIL.PngImagePlugin", "gpubatch.engine.host_chain",
                 "gpubatch.engine.codecs.image")


class HostStart(NamedTuple):
    """What a host unit's worker, forked at the command's start (:func:`.early.sniff`), begins before its run
    comes: ``modules`` imported (a GPU worker's start is a :class:`..gpu.start.Early`)."""

    modules: tuple[str, ...]


def boot(early: Any, payload: Any, slot: int, tasks: Any, results: Any) -> None:
    """Begin ``early`` (a :class:`..gpu.start.Early`, or None), then run worker ``slot`` over the run that
    comes on the queue ``payload`` (``pickle`` of its context and strategy: :class:`.local.Started`; None:
    no run for it, it ends; before it, ``(KERNELS, kernels)``: more kernels for the start to compile); a
    failure to unpickle it reported to ``results`` as a crash, as the worker's own failures are."""
    from ..processes import die_with_parent

    die_with_parent()
    if isinstance(early, HostStart):  # a host unit's: what it runs imported here, while its run is planned
        _imported(early.modules)
        early = None
    if early is not None:
        from ..gpu.start import boot as begin

        begin(early, readers=True)  # (an image run's: its feed's readers forked first, gpu.feed_start)
        modules = IMAGE_MODULES if early.host else {"audio": AUDIO_MODULES, "video": VIDEO_MODULES}.get(early.warm, ())
        if modules:  # an image or audio run's worker: its run's modules imported while it waits for the run
            import threading

            threading.Thread(target=_imported, args=(modules,), name="gpubatch-imports", daemon=True).start()
    import pickle
    import time

    while isinstance(message := payload.get(), tuple) and message[:1] == (KERNELS,):
        if early is not None:
            from ..gpu.start import compile_more

            compile_more(early.index, message[1])
    payload = message
    if payload is None:
        _readers_ended()
        return
    TIMES["boot: its run came"] = time.time()
    try:
        ctx, strategy = pickle.loads(payload)
        TIMES["boot: its run unpickled"] = time.time()
    except BaseException:  # noqa: BLE001 - the coordinator reports it; nothing else would see it
        import traceback

        results.put(("failed", "crash", traceback.format_exc()))
        return
    work(ctx, strategy, slot, tasks, results)


def boot_forked(early: Any, payload: Any, slot: int, tasks: Any, results: Any) -> None:
    """:func:`boot` in a process forked from the ``gpubatch`` command's start (:func:`.early.sniff`), made first as
    a spawned one would be (:func:`..processes.as_spawned`)."""
    from ..processes import as_spawned

    as_spawned()
    boot(early, payload, slot, tasks, results)


def _readers_ended() -> None:
    """The feed's readers this worker's boot started (:mod:`..gpu.feed_start`) and no feed took, ended at once."""
    import sys

    if "gpubatch.engine.gpu.feed_start" in sys.modules:
        sys.modules["gpubatch.engine.gpu.feed_start"].close(now=True)


def _imported(modules: tuple[str, ...]) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - imported again (and raised) where the run needs it
            pass


def work(ctx: Any, strategy: Any, slot: int, tasks: Any, results: Any) -> None:
    """A worker process's loop: its unit over the tasks it takes until a None, each task's progress and
    result sent to ``results``; a failure sent as ("failed", ...)."""
    import traceback

    from ...errors import LIMITS, GpubatchError, RecordFailed
    from .worker import ShardWriting, on_released, released

    unit = reader = None
    try:
        reader = ctx.open_reader()
        unit = strategy.make(ctx, slot)

        def take() -> Any:
            while True:
                task = tasks.get()
                if task is None:
                    return
                yield task

        where = ctx.gpu_label or None  # (a worker of a several-GPU run: its GPU, for the bar's row of it)

        def progress(n: int) -> None:
            results.put(("progress", n, where))

        # ("exit": this worker holds nothing of the run any more; a unit may say so before it closes its parts)
        on_released(lambda: results.put(("exit", slot)))
        unit.run(reader, take(), lambda t: ShardWriting(t, ctx, progress), lambda r: results.put(("done", r)))
        released()
    except RecordFailed as e:
        results.put(("failed", "record", e))
    except GpubatchError as e:
        results.put(("failed", "error", str(e)))
    except OSError as e:  # (a full disk, a folder that went away: the run's one-line write error, as in one process)
        results.put(("failed", "oserror", (e.errno, e.strerror or str(e), e.filename)))
    except MemoryError:
        results.put(("failed", "error", f"worker process {slot} ran out of memory: {LIMITS}"))
    except BaseException:  # noqa: BLE001 - the coordinator reports it; nothing else would see it
        results.put(("failed", "crash", traceback.format_exc()))
    finally:
        for part in (unit, reader):
            if part is not None:
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - closing after a failure
                    pass
        _readers_ended()  # (a run that failed before its feed took them)


def start_slots(started: list[tuple[Any, dict[str, str]]], runs: list, tasks: list, results: Any,
                first: int = 0, fork: bool = False) -> list:
    """A process a slot from slot ``first`` on, each given what its boot begins and its environment
    (``started``: :func:`.local.boots`) and the queue its run comes on (``runs[k]``); not daemons: a GPU unit
    starts reader processes of its own (they end with this process all the same). Spawned, or forked where
    ``fork`` (the command's start: :func:`.early.sniff`)."""
    from ..processes import worker_processes

    procs: list = []
    target, method = (boot_forked, "fork") if fork else (boot, "spawn")
    for k, ((early, env), run, task) in enumerate(zip(started, runs, tasks), start=first):
        procs += worker_processes(target, (early, run, k, task, results), 1, daemon=False, env=env, method=method)
    return procs


def new_slots(started: list[tuple[Any, dict[str, str]]], dealt: bool, results: Any, first: int = 0,
              shared: Any = None, fork: bool = False) -> tuple[list, list, list]:
    """Slots ``first`` on, started (:func:`start_slots`, forked where ``fork``) with a queue each for their run and,
    where their tasks are ``dealt``, one each for their tasks, else ``shared`` (or a new queue) for all: (run queues,
    task queues, processes)."""
    import multiprocessing as mp

    spawn = mp.get_context("spawn")
    runs = [spawn.Queue() for _ in started]
    tasks = [spawn.Queue() for _ in started] if dealt else [shared if shared is not None else spawn.Queue()] * len(started)
    return runs, tasks, start_slots(started, runs, tasks, results, first=first, fork=fork)
