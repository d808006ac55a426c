"""The audio codec on the GPU, registered for the run flow: records decoded on the CPU (FLAC and MP3 have
no GPU decoder), their chain run a batch at a time by :mod:`gpubatch.engine.audio_gpu` (imported when a
run asks, so that naming the codec loads no GPU library)."""

from __future__ import annotations

from typing import Any

from ..media import DEVICE, MediaSpec, register_codec


class AudioDeviceCodec:
    """Audio on the GPU: decode in threads on the CPU, the chain on the GPU a batch at once."""

    spec = MediaSpec("audio", layout="CT", dtype="float32", channels=None)

    @staticmethod
    def run(device: Any, reader: Any, opener: Any, entries: list, writer: Any, plan: Any, router: Any,
            req: Any, workers: int, tick: Any, settings: Any) -> None:
        from ..audio_gpu import run_audio_device

        run_audio_device(device, reader, entries, writer, plan, router, workers,
                         getattr(req, "batch_size", 256) or 256, tick, getattr(req, "gpu_memory", None),
                         settings.stack_bytes)


register_codec("audio", "*", DEVICE, AudioDeviceCodec())
