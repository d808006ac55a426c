"""The audio codec on the GPU, registered for the run flow: records decoded on the CPU (FLAC and MP3 have
no GPU decoder), their chain run a batch at a time by :mod:`gpubatch.engine.gpu.audio` (imported when a
run asks, so that naming the codec loads no GPU library)."""

from __future__ import annotations

from ..media import DEVICE, MediaSpec, register_codec


class AudioDeviceCodec:
    """Audio on the GPU: decode in threads on the CPU, the chain on the GPU a batch at once."""

    spec = MediaSpec("audio", layout="CT", dtype="float32", channels=None)


register_codec("audio", "*", DEVICE, AudioDeviceCodec())
