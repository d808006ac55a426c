"""The video codec on the GPU, registered for the run flow: NVDEC decoders through PyNvVideoCodec, run
by :mod:`gpubatch.engine.video_gpu` (imported when a run asks, so that naming the codec loads no GPU
library)."""

from __future__ import annotations

from typing import Any

from ..media import DEVICE, MediaSpec, register_codec


class VideoDeviceCodec:
    """Video on the GPU: its runs go through the NVDEC executor, ``decoders`` sessions at once."""

    spec = MediaSpec("video", layout="FHWC")

    @staticmethod
    def run(device: Any, reader: Any, opener: Any, entries: list, writer: Any, plan: Any, router: Any,
            req: Any, workers: int, tick: Any, settings: Any) -> None:
        from ..video_gpu import run_video_device

        run_video_device(device, reader, entries, writer, plan, router, settings.video_decoders, tick,
                         getattr(req, "gpu_memory", None), settings.stack_bytes)


register_codec("video", "*", DEVICE, VideoDeviceCodec())
