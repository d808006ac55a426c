"""A GPU run's worker processes started before the run needs them, so that their GPUs' start (the CUDA context,
the hardware decoder's instances, the kernels: :mod:`..gpu.start`) runs beside what the command's own process
does first: :func:`started_early` once the run knows its device and its records' media, before it lists the
source and plans the shards; :func:`prestart` earlier still, the moment ``convert`` or ``augment`` has checked its
options, before its process probes the device (``cuInit`` alone took 0.19-0.24 s on an H200 host, 2026-12-04,
benchmarks/RESULTS.md "07:28 to 08:11") and opens the source. What a run takes is a
:class:`~.local.Started`; the processes it does not take end with it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

#: the NVIDIA driver's control device node, where the machine has the driver
NODE = "/dev/nvidiactl"


def gpu_procs(req: Any, strategy: Any, records: int | None = None) -> int:
    """The worker processes a GPU of a GPU run (``--gpu-procs``, else the strategy's, and its ``long_run``'s
    for a local run of at least that many ``records`` without a cap; one for audio and video under a cap:
    their plans')."""
    procs = req.gpu_procs or strategy.per_gpu
    long = strategy.long_run
    if (long and not req.gpu_procs and records is not None and records >= long[0] and req.gpu_memory is None
            and getattr(req, "executor", "local") == "local"):
        procs = max(procs, long[1])
    return 1 if req.gpu_memory is not None and strategy.name != "gpu-image" else procs


def started_early(req: Any, finish: bool, plan: Any, device: Any, settings: Any, ahead: Any = None) -> Any:
    """A GPU run's worker processes, started before its source is listed and its shards planned
    (:class:`~.local.Started`): ``ahead`` (:func:`prestart`'s) where they began what this run's would, else
    started now (``ahead`` ends); None where the run is not the local executor's on GPUs (a pass-through, Ray,
    a part, ``finish``)."""
    from .strategies import strategy_for
    from .worker import RunContext

    strategy = None
    if (device.is_gpu and getattr(req, "executor", "local") == "local" and not finish
            and getattr(req, "num_parts", None) is None):
        strategy = strategy_for(plan, device)
    if strategy is None or not strategy.gpu:
        if ahead is not None:
            ahead.close()
        return None
    from .local import Started

    procs = gpu_procs(req, strategy)
    ctx = RunContext(opener=None, sink=None, plan=plan, device=device, settings=settings, gpu_memory=req.gpu_memory,
                     gpu_procs=procs, on_gpu=True)
    workers = procs * max(1, len(device.indexes))
    if ahead is not None:
        if ahead.fits(ctx, strategy, workers):
            return ahead
        ahead.close()
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
    call): what :func:`prestart` asks before it starts anything."""
    import importlib.util

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
        return None
    settings = run_settings(gpu=True)
    if not settings.early_start:
        return None
    device = Device(DeviceKind.GPU, int(req.gpu or 0))
    return started_early(req, False, dataclasses.replace(plan, media="image"), device, settings)
