"""DALI's ops for the bench's ResNet-50 chains, shared by its contenders on files (:mod:`.contenders`) and on a
dataset's shards (:mod:`.loader`)."""

from __future__ import annotations

from typing import Any


def dali_chain(fn: Any, types: Any, jpegs: Any, chain: str, setting: str = "best") -> Any:
    """DALI's ops for a ResNet-50 ``chain`` (or a decode) on encoded ``jpegs``, at ``setting`` (see
    :func:`.contenders.dali_pipeline`), inside a pipeline definition."""
    load = {"hw_decoder_load": 0.9} if setting == "best" else {}
    if chain == "train" and setting == "defaults":
        imgs = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB)
        imgs = fn.resize(imgs, resize_x=224, resize_y=224)
    else:
        imgs = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, **load)
        if chain == "train":
            imgs = fn.random_resized_crop(imgs, size=224)
        elif chain == "val":
            imgs = fn.resize(imgs, resize_shorter=256)
    if chain == "decode":
        return imgs
    return fn.crop_mirror_normalize(imgs, dtype=types.FLOAT16, output_layout="CHW", crop=(224, 224),
                                    mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                    std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
                                    mirror=fn.random.coin_flip() if chain == "train" else 0)
