"""The video codec on the GPU, registered for the run flow: NVDEC decoders through PyNvVideoCodec, run
by :mod:`gpubatch.engine.gpu.video` (imported when a run asks, so that naming the codec loads no GPU
library)."""

from __future__ import annotations

from ..media import DEVICE, MediaSpec, register_codec


class VideoDeviceCodec:
    """Video on the GPU: its runs go through the NVDEC executor, ``decoders`` sessions at once."""

    spec = MediaSpec("video", layout="FHWC")


register_codec("video", "*", DEVICE, VideoDeviceCodec())
