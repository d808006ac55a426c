"""The image codec on the GPU, registered for the run flow: the GPU engine's batched decoder and
encoder, imported when first asked for, so that naming the codec (as a CPU-only machine does when it
asks whether images run on the GPU) loads no GPU library."""

from __future__ import annotations

from typing import Any

from ..media import DEVICE, MediaSpec, register_codec


class ImageDeviceCodec:
    """Images on the GPU: decoded and encoded a batch at a time by the GPU engine's decoder and encoder."""

    spec = MediaSpec("image")

    @staticmethod
    def decoder() -> type:
        from .image_gpu import GpuImageDecoder

        return GpuImageDecoder

    @staticmethod
    def encoder() -> type:
        from .image_encode_gpu import GpuImageEncoder

        return GpuImageEncoder

    @staticmethod
    def run(device: Any, reader: Any, opener: Any, entries: list, writer: Any, plan: Any, router: Any,
            req: Any, workers: int, tick: Any, settings: Any) -> None:
        """A run's records through the GPU engine's worker processes (:mod:`..gpu_run`)."""
        from ..gpu_run import run_device

        run_device(device, opener, entries, writer, plan, router, req.gpu_procs or 1, workers, req.batch_size,
                   req.gpu_memory, tick, settings, read=reader.read)


register_codec("image", "*", DEVICE, ImageDeviceCodec())
