"""``gpubatch bench``: how fast a model's preprocessing runs here, GPU vs CPU vs peers, and where time goes.

Models are named preprocessing chains (:data:`MODELS`); contenders (:mod:`.contenders`) each run in
their own process on the same files, so their GPU memory is measured alone; :mod:`.runner` assembles the
result (JSON schema in the README) and :mod:`.report` renders it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError


@dataclass(frozen=True)
class Model:
    """A named preprocessing chain: ``chains`` maps a chain name to its op-chain text ("" = decode only;
    "transcode" chains end in a JPEG encode)."""

    name: str
    doc: str
    chains: dict[str, str]
    encode: bool = False
    torchvision: str | None = None  # the torchvision model --with-model trains
    media: str = "image"
    clip: tuple[int, int] = (0, 0)  # a video model's clip: frames, frame step
    batch_size: int = 256  # items a batch by default (clips for a video model)
    audio: tuple[float, int] = (0.0, 0)  # an audio model's synthetic clips: seconds, sample rate


NORM = "normalize(layout='CHW', dtype='float16')"
MODELS: dict[str, Model] = {
    "resnet50": Model("resnet50", "ImageNet ResNet-50: train (random resized crop 224, flip) and val "
                      "(resize 256, center crop 224), fp16 NCHW normalized",
                      {"train": f"random_resized_crop(size=224) | flip(p=0.5) | {NORM}",
                       "val": f"resize_shorter(size=256) | center_crop(size=224) | {NORM}"}, torchvision="resnet50"),
    "ssd300": Model("ssd300", "SSD300 (COCO): photometric distortion, zoom out, IoU crop, flip, resize 300",
                    {"train": "photometric_distort() | expand(p=0.5) | random_iou_crop() | flip(p=0.5) | "
                              f"resize(height=300, width=300) | {NORM}"}),
    "decode-only": Model("decode-only", "JPEG decode to uint8 RGB, nothing else", {"decode": ""}),
    "transcode": Model("transcode", "decode, resize shorter side to 256, JPEG encode q90",
                       {"transcode": "resize_shorter(size=256)"}, encode=True),
    "video-clf": Model("video-clf", "video classification (3D CNN): 16-frame clips, frame step 4, short side 256, "
                       "random crop 224, flip, fp16 NCTHW normalized",
                       {"train": f"resize_shorter(size=256) | random_crop(size=224) | flip(p=0.5) | {NORM}"},
                       media="video", clip=(16, 4), batch_size=8),
    "whisper": Model("whisper", "Whisper speech recognition: 16 kHz audio padded to 30 s, 80-bin log-mel "
                     "(Whisper's definition), fp16 (N, 80, 3000)",
                     {"train": "resample(rate=16000) | fix_duration(seconds=30) | log_mel(n_mels=80)"},
                     media="audio", batch_size=64, audio=(10.0, 16000)),
    "audio-clf": Model("audio-clf", "audio classification (ESC-50-like 5 s clips): 64-bin log-mel at 16 kHz, "
                       "SpecAugment (2 frequency masks of up to 8 bins, 2 time masks of up to 25 frames), fp16",
                       {"train": "resample(rate=16000) | fix_duration(seconds=5) | log_mel(n_mels=64) | "
                                 "freq_mask(width=8, count=2) | time_mask(width=25, count=2)"},
                       media="audio", batch_size=128, audio=(5.0, 44100)),
}


def get_model(name: str) -> Model:
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    return MODELS[name]


def chain_ops(text: str) -> tuple[Any, ...]:
    from ..engine.spec import parse_chain

    return parse_chain(text) if text else ()
