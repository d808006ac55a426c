"""The image codec on the GPU, registered for the run flow: the GPU engine's batched decoder and
encoder, imported when first asked for, so that naming the codec (as a CPU-only machine does when it
asks whether images run on the GPU) loads no GPU library."""

from __future__ import annotations

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


register_codec("image", "*", DEVICE, ImageDeviceCodec())
