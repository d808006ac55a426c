"""The one table that says how a run's shard tasks are worked: which unit, and how many workers.

(media, device) -> a :class:`Strategy`. On the CPU every media takes the host unit, a worker process
a core. On the GPU each media has a unit of its own: images through the GPU engine (decoders, the
chain's kernels, the JPEG encoder, with reader processes of its own), video through NVDEC sessions,
audio through the GPU chain fed by decoding processes; ``--gpu-procs`` processes a GPU (by default one for
images and video, two for audio on a host of 8 cores a GPU or more). A run whose records all pass through
untouched takes the host unit whatever the device. Units are named by import path, so a worker imports only the one it runs (CuPy never loads
in a CPU worker).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from ..processes import cores


@dataclass(frozen=True)
class Strategy:
    """How a run's tasks are worked: ``unit`` (``module:Class``), on the GPU or not, ``per_gpu`` worker
    processes a GPU (GPU units), whether each worker is ``dealt`` its tasks up front (else workers take
    the next task as they free up), and why this one was picked."""

    name: str
    unit: str
    gpu: bool = False
    per_gpu: int = 1
    why: str = ""
    dealt: bool = False  # its workers take their tasks up front, in shard order (a feed that reads ahead across them)
    #: what a worker starts first, before it unpickles its run (gpu.start.early: "image", "audio", "video")
    start: str = ""
    #: (records, processes): a run of at least that many records, no ``--gpu-procs`` and no ``--gpu-memory`` given,
    #: takes that many processes a GPU (the early ones, started before the run knew its length, and more beside them)
    long_run: tuple[int, int] | None = None
    #: (cores, processes): a host with at least that many cores for each of the run's GPUs, no ``--gpu-procs`` and no
    #: ``--gpu-memory`` given, takes that many processes a GPU (each with its share of the cores: the audio unit's
    #: decoding processes, its loop and its shards' writer)
    wide: tuple[int, int] | None = None

    def make(self, ctx: Any, slot: int) -> Any:
        module, cls = self.unit.split(":")
        return getattr(importlib.import_module(module), cls).make(ctx, slot)

    def per_gpu_here(self, gpus: int = 1) -> int:
        """The processes a GPU this strategy takes by default on this host for a run on ``gpus`` GPUs: ``wide``'s where
        the host has that many cores for each GPU, else ``per_gpu``."""
        if self.wide and cores() >= self.wide[0] * max(1, gpus):
            return max(self.per_gpu, self.wide[1])
        return self.per_gpu

    def workers(self, ctx: Any, tasks: int, asked: int | None = None) -> int:
        """Worker processes for ``tasks`` tasks: on the CPU ``asked`` or a worker a core; on the GPU
        ``per_gpu`` (``--gpu-procs``) for each of the run's GPUs; never more than there are tasks."""
        if self.gpu:
            n = max(1, int(getattr(ctx, "gpu_procs", None) or self.per_gpu))  # (the runner sets gpu_procs)
            n *= max(1, len(ctx.device.indexes))
        else:
            n = asked or cores()
        return max(1, min(n, tasks))


_HOST = "gpubatch.engine.execute.units:HostUnit"
#: (media, device) -> the unit and its workers ("*" any media)
TABLE: dict[tuple[str, str], Strategy] = {
    ("*", "cpu"): Strategy("host", _HOST, why="the CPU: a worker process a core"),
    # per_gpu (--gpu-procs): one worker process a GPU by default, the setting every GPU test ran with. Two
    # image processes ran 65,536 images 9-10% faster than one and 16,384 3% slower (both starting at once), at
    # twice the GPU memory (H200, 2026-12-02, benchmarks/RESULTS.md), so a run of 32,768 records or more
    # takes a second (long_run), begun once the plan knows the run's length, beside the one started early
    ("image", "gpu"): Strategy("gpu-image", "gpubatch.engine.gpu.images:GpuImageUnit", gpu=True, dealt=True,
                               why="images on the GPU: decoders, the chain's kernels and the JPEG encoder", start="image",
                               long_run=(32768, 2)),
    ("video", "gpu"): Strategy("gpu-video", "gpubatch.engine.gpu.video:VideoDeviceUnit", gpu=True,
                               why="video on the GPU: NVDEC sessions, the chain on the GPU", start="video"),
    # two audio processes a GPU on a host of 8 cores a GPU or more: each its own loop, shards' writer and share of
    # the decoding processes. On an H200 host of 16 cores, 2,048 10-s FLAC clips to Whisper log-mel ran at 824 clips/s
    # with two, 812 with four, 675 with eight, against 672 with one (2026-12-05, benchmarks/RESULTS.md), at 1.27 GiB
    # of GPU memory a process
    ("audio", "gpu"): Strategy("gpu-audio", "gpubatch.engine.gpu.audio:AudioDeviceUnit", gpu=True, dealt=True,
                               why="audio features on the GPU, decoded on the CPU in processes", start="audio",
                               wide=(8, 2)),
}


def on_host(plan: Any, device: Any) -> bool:
    """Whether a run of ``plan`` on ``device`` takes the host unit: every CPU run, and a GPU run whose
    records all pass through (or whose media has no GPU codec)."""
    from ..media import DEVICE, has_codec

    return not (device.is_gpu and plan.touches_pixels and has_codec(plan.media, DEVICE))


def unit_for(ctx: Any) -> Strategy:
    """The strategy of a run (its plan's media, its device; pass-through on the host)."""
    return strategy_for(ctx.plan, ctx.device)


def strategy_for(plan: Any, device: Any) -> Strategy:
    """The strategy of a run of ``plan`` on ``device`` (:func:`unit_for`; known before the shards are planned)."""
    if not on_host(plan, device):
        found = TABLE.get((plan.media, "gpu"))
        if found is None:
            raise UsageError(f"no GPU unit for {plan.media} records; known: "
                             + ", ".join(f"{m}/{d}" for m, d in sorted(TABLE)))
        return found
    return TABLE[("*", "cpu")]
