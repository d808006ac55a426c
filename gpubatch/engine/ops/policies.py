"""Automatic augmentation policies: RandAugment, TrivialAugment (wide) and AutoAugment (ImageNet policy).

Each picks, per image, which op to apply and how strongly, with the published op spaces and magnitudes
(as torchvision implements them, nearest-neighbour warps by default). A layer of the policy is one step
launch over the batch with a different code per image; geometric picks move boxes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import UsageError
from .base import colour, positive
from .pixel import (
    AUTOCONTRAST,
    BRIGHTNESS,
    CONTRAST,
    COPY_STEP,
    EQUALIZE,
    INVERT,
    POSTERIZE,
    SATURATION,
    SHARPNESS,
    SOLARIZE,
    Step,
    StepOp,
    register_step_op,
)
from .warp import INTERPOLATIONS, rotation, shear, translation, warp_step

# AutoAugment's ImageNet policy: 25 sub-policies of two (op, probability, magnitude bin) each.
IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)
POLICIES = {"imagenet": IMAGENET_POLICY}


def _space(bins: int, h: int, w: int, wide: bool, identity: bool) -> dict[str, tuple[np.ndarray, bool]]:
    """op name -> (magnitudes, signed): RandAugment's/AutoAugment's space, or TrivialAugment's wide one."""
    lin = np.linspace
    top = 0.99 if wide else 0.9
    space: dict[str, tuple[np.ndarray, bool]] = {"Identity": (np.zeros(()), False)} if identity else {}
    space.update({
        "ShearX": (lin(0.0, 0.99 if wide else 0.3, bins), True),
        "ShearY": (lin(0.0, 0.99 if wide else 0.3, bins), True),
        "TranslateX": (lin(0.0, 32.0 if wide else 150.0 / 331.0 * w, bins), True),
        "TranslateY": (lin(0.0, 32.0 if wide else 150.0 / 331.0 * h, bins), True),
        "Rotate": (lin(0.0, 135.0 if wide else 30.0, bins), True),
        "Brightness": (lin(0.0, top, bins), True),
        "Color": (lin(0.0, top, bins), True),
        "Contrast": (lin(0.0, top, bins), True),
        "Sharpness": (lin(0.0, top, bins), True),
        "Posterize": (8 - np.round(np.arange(bins) / ((bins - 1) / (6 if wide else 4))).astype(int), False),
        "Solarize": (lin(255.0, 0.0, bins), False),
        "AutoContrast": (np.zeros(()), False),
        "Equalize": (np.zeros(()), False),
    })
    return space


_FACTOR = {"Brightness": BRIGHTNESS, "Color": SATURATION, "Contrast": CONTRAST, "Sharpness": SHARPNESS}
_PLAIN = {"AutoContrast": AUTOCONTRAST, "Equalize": EQUALIZE, "Invert": INVERT}


def op_step(name: str, mag: float, h: int, w: int, fill: tuple[float, float, float], nearest: bool) -> Step:
    """The step of one policy op at magnitude ``mag`` on an (h, w) image (torchvision's _apply_op)."""
    if name == "Identity":
        return COPY_STEP
    if name in _FACTOR:
        return Step((float(_FACTOR[name]), 1.0 + mag))
    if name in _PLAIN:
        return Step((float(_PLAIN[name]),))
    if name == "Posterize":
        return Step((float(POSTERIZE), float(int(mag))))
    if name == "Solarize":
        return Step((float(SOLARIZE), float(mag)))
    fwd = {"ShearX": lambda: shear(mag, 0.0), "ShearY": lambda: shear(0.0, mag),
           "TranslateX": lambda: translation(float(int(mag)), 0.0),
           "TranslateY": lambda: translation(0.0, float(int(mag))),
           "Rotate": lambda: rotation(mag, w / 2.0, h / 2.0)}[name]()
    return warp_step(fwd, (h, w), fill, nearest)


@dataclass(frozen=True)
class _Policy(StepOp):
    fill: Any = 0
    interpolation: str = "nearest"
    moves_boxes = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "fill", colour(f"{self.name} fill", self.fill))
        if self.interpolation not in INTERPOLATIONS:
            raise UsageError(f"{self.name} interpolation {self.interpolation!r}; supported: {', '.join(INTERPOLATIONS)}")

    def _pick(self, space: dict[str, tuple[np.ndarray, bool]], name: str, bin_: int | None, rng: Any) -> tuple[str, float]:
        mags, signed = space[name]
        mag = float(mags[bin_]) if mags.ndim and bin_ is not None else 0.0
        if signed and rng.random() < 0.5:
            mag = -mag
        return name, mag

    def make_steps(self, h: int, w: int, params: list[tuple[str, float]]) -> list[Step]:
        nearest = self.interpolation == "nearest"
        steps = [op_step(name, mag, h, w, self.fill, nearest) for name, mag in params]
        return steps + [COPY_STEP] * (self.n_steps - len(steps))


@register_step_op
@dataclass(frozen=True)
class RandAugment(_Policy):
    """RandAugment: ``num_ops`` ops drawn uniformly per image from the 14-op space, all at ``magnitude``
    (a bin of ``num_magnitude_bins``)."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    name = "randaugment"

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("randaugment num_ops", self.num_ops)
        positive("randaugment num_magnitude_bins", self.num_magnitude_bins)
        if not isinstance(self.magnitude, int) or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise UsageError(f"randaugment magnitude must be an integer in [0, {self.num_magnitude_bins}), got {self.magnitude!r}")

    @property
    def n_steps(self) -> int:
        return self.num_ops

    def draw(self, h: int, w: int, rng: Any) -> list[tuple[str, float]]:
        space = _space(self.num_magnitude_bins, h, w, wide=False, identity=True)
        names = list(space)
        return [self._pick(space, names[int(rng.integers(0, len(names)))], self.magnitude, rng)
                for _ in range(self.num_ops)]


@register_step_op
@dataclass(frozen=True)
class TrivialAugment(_Policy):
    """TrivialAugment (wide): one op per image, uniformly drawn, at a uniformly drawn magnitude bin."""

    num_magnitude_bins: int = 31
    name = "trivialaugment"

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("trivialaugment num_magnitude_bins", self.num_magnitude_bins)

    def draw(self, h: int, w: int, rng: Any) -> list[tuple[str, float]]:
        space = _space(self.num_magnitude_bins, h, w, wide=True, identity=True)
        names = list(space)
        name = names[int(rng.integers(0, len(names)))]
        return [self._pick(space, name, int(rng.integers(0, self.num_magnitude_bins)), rng)]


@register_step_op
@dataclass(frozen=True)
class AutoAugment(_Policy):
    """AutoAugment with a learned ``policy`` ("imagenet"): one of 25 sub-policies per image, each op of it
    applied with its own probability and magnitude bin (10 bins)."""

    policy: str = "imagenet"
    name = "autoaugment"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy not in POLICIES:
            raise UsageError(f"autoaugment policy {self.policy!r}; supported: {', '.join(POLICIES)}")

    @property
    def n_steps(self) -> int:
        return 2

    def draw(self, h: int, w: int, rng: Any) -> list[tuple[str, float]]:
        space = _space(10, h, w, wide=False, identity=False)
        space["Invert"] = (np.zeros(()), False)
        sub = POLICIES[self.policy][int(rng.integers(0, len(POLICIES[self.policy])))]
        out = []
        for name, prob, bin_ in sub:
            if rng.random() <= prob:
                out.append(self._pick(space, name, bin_, rng))
        return out
