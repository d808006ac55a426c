"""Ops: frozen parameter classes with their host and device kernels side by side.

Every op module registers its kernels on import; :data:`OPS` maps op names to classes.
"""

from __future__ import annotations

from .audio import AddNoise, FixDuration, Gain, Mono, Resample, Speed, TimeCrop, TimeShift
from .base import OPS, Op, Window
from .codec import JpegQuality
from .geometry import (
                       CenterCrop,
                       Expand,
                       Flip,
                       Pad,
                       RandomCrop,
                       RandomIoUCrop,
                       RandomResizedCrop,
                       Resize,
                       ResizeShorter,
)
from .normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from .pixel import (
                       AutoContrast,
                       Brightness,
                       ColorJitter,
                       Contrast,
                       Equalize,
                       GaussianBlur,
                       GaussianNoise,
                       Grayscale,
                       Hue,
                       Invert,
                       PhotometricDistort,
                       Posterize,
                       RandomErasing,
                       Saturation,
                       Sharpness,
                       Solarize,
                       Step,
                       StepOp,
)
from .policies import AutoAugment, RandAugment, TrivialAugment
from .spectral import MFCC, FreqMask, LogMel, Mel, Spectrogram, TimeMask
from .temporal import Clip, RandomClip
from .warp import Affine, Perspective, Rotate, Rotate90

__all__ = [
    "MFCC", "AddNoise", "FixDuration", "FreqMask", "Gain", "LogMel", "Mel", "Mono", "Resample", "Spectrogram", "Speed",
    "TimeCrop", "TimeMask", "TimeShift",
    "IMAGENET_MEAN", "IMAGENET_STD", "OPS", "Affine", "AutoAugment", "AutoContrast", "Brightness", "CenterCrop", "Clip",
    "ColorJitter", "Contrast", "Equalize", "Expand", "Flip", "GaussianBlur", "GaussianNoise", "Grayscale", "Hue",
    "Invert", "JpegQuality", "Normalize", "Op", "Pad", "Perspective", "PhotometricDistort", "Posterize",
    "RandAugment", "RandomClip", "RandomCrop", "RandomErasing", "RandomIoUCrop", "RandomResizedCrop", "Resize", "ResizeShorter", "Rotate",
    "Rotate90", "Saturation", "Sharpness", "Solarize", "Step", "StepOp", "TrivialAugment", "Window",
]
