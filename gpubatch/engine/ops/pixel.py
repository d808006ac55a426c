"""Step ops: colour, tone, filters, noise, erasing and warps, run as per-sample programs.

An op here describes what it does to one image as a fixed number of :class:`Step` s; a step is a code
plus up to 15 float arguments (see ``kernels/step.cu``). On the GPU each step is one launch over the
whole ragged batch, every sample running its own code and arguments (so RandAugment, which picks an op
per image, is still one launch per layer). On the CPU :func:`step_cpu` computes the same float
expressions with NumPy; it is the reference the kernel is tested against.

Definitions follow torchvision's tensor transforms (luma weights 0.2989/0.587/0.114, ColorJitter's
ranges and random order, reflect-padded gaussian blur) and PIL's ImageOps/ImageEnhance for equalize,
autocontrast, posterize, solarize and sharpness. Every step rounds to uint8 at its end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ...errors import UsageError
from ...types import Boxes
from ..registry import HOST, register_kernel
from .base import OPS, Op, colour, pair, probability, spread

# The step codes, their parameter count and the largest blur kernel: the one source of these numbers.
# kernels/step.cu gets them as generated C (:func:`cuda_header`), so the two sides cannot drift apart.
NPRM = 16
MAX_KERNEL = 63
CODE_NAMES = ("copy", "brightness", "contrast", "saturation", "hue", "grayscale", "solarize", "posterize",
              "invert", "autocontrast", "equalize", "sharpness", "warp", "blur", "noise", "erase")
Code = IntEnum("Code", [name.upper() for name in CODE_NAMES], start=0)
(COPY, BRIGHTNESS, CONTRAST, SATURATION, HUE, GRAYSCALE, SOLARIZE, POSTERIZE,
 INVERT, AUTOCONTRAST, EQUALIZE, SHARPNESS, WARP, BLUR, NOISE, ERASE) = Code
LUMA = np.array([0.2989, 0.587, 0.114], np.float32)
LUMA_INT = np.array([2989, 5870, 1140], np.int64)  # grey sums in integers: order-independent on the GPU


def cuda_header() -> str:
    """The C text kernels/step.cu is compiled with: NPRM, MAXK and ``enum Code``, from the values above."""
    codes = ", ".join(f"{c.name} = {c.value}" for c in Code)
    return f"#define NPRM {NPRM}\n#define MAXK {MAX_KERNEL}\nenum Code {{ {codes} }};\n"


class Step(NamedTuple):
    """One per-sample program: ``prm[0]`` the code, then its arguments; ``out_hw`` when the size changes;
    ``fwd`` the 3x3 map of pixel coordinates (input -> output) of a geometric step, for boxes."""

    prm: tuple[float, ...]
    out_hw: tuple[int, int] | None = None
    fwd: np.ndarray | None = None


COPY_STEP = Step((float(COPY),))


def stats_needed(code: int) -> int:
    """Flags of stats_u8 that a code reads: 1 grey sum, 2 min/max, 4 histograms."""
    return {CONTRAST: 1, AUTOCONTRAST: 2, EQUALIZE: 4}.get(code, 0)


# --- the NumPy twin of kernels/step.cu ----------------------------------------------------------------


def _to_u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _pcg(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.uint32)
    state = v * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def _unit(seed: int, idx: np.ndarray) -> np.ndarray:
    """Uniform in (0, 1) per index: the kernel's counter-based stream."""
    return ((_pcg(np.uint32(seed) ^ _pcg(idx)) >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(
        1.0 / 16777216.0)


def _reflect(i: np.ndarray, n: int) -> np.ndarray:
    if n == 1:
        return np.zeros_like(i)
    i = np.abs(i)
    i = np.where(i >= n, 2 * n - 2 - i, i)
    return np.clip(i, 0, n - 1)


def _hue_cpu(x: np.ndarray, shift: np.float32) -> np.ndarray:
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    mx, mn = x.max(-1), x.min(-1)
    c = mx - mn
    s = np.where(mx > 0, c / np.where(mx > 0, mx, 1), 0).astype(np.float32)
    safe = np.where(c > 0, c, 1).astype(np.float32)
    h = np.where(mx == r, (g - b) / safe, np.where(mx == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    h = np.where(c > 0, h / np.float32(6), 0).astype(np.float32)
    h = h - np.floor(h)
    h = h + shift
    h = (h - np.floor(h)).astype(np.float32)
    h6 = h * np.float32(6)
    fl = np.floor(h6)
    f = h6 - fl
    i = fl.astype(np.int64) % 6
    v, one = mx, np.float32(1)
    p, q, t = v * (one - s), v * (one - s * f), v * (one - s * (one - f))
    out = np.empty_like(x)
    for k, (rr, gg, bb) in enumerate([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]):
        m = i == k
        out[..., 0][m], out[..., 1][m], out[..., 2][m] = rr[m], gg[m], bb[m]
    return out


def _warp_cpu(img: np.ndarray, p: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    oh, ow = out_hw
    h, w = img.shape[:2]
    m = p[1:10].reshape(3, 3)
    ys, xs = np.mgrid[0:oh, 0:ow].astype(np.float32) + np.float32(0.5)
    z = m[2, 0] * xs + m[2, 1] * ys + m[2, 2]
    x = (m[0, 0] * xs + m[0, 1] * ys + m[0, 2]) / z
    y = (m[1, 0] * xs + m[1, 1] * ys + m[1, 2]) / z
    fill = p[10:13]

    def tap(yi: np.ndarray, xi: np.ndarray) -> np.ndarray:
        inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
        v = img[np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)].astype(np.float32)
        return np.where(inside[..., None], v, fill)

    if p[13] != 0:
        return _to_u8(tap(np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)))
    fx, fy = x - np.float32(0.5), y - np.float32(0.5)
    x0, y0 = np.floor(fx), np.floor(fy)
    ax, ay = (fx - x0)[..., None], (fy - y0)[..., None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    one = np.float32(1)
    out = ((one - ay) * ((one - ax) * tap(y0, x0) + ax * tap(y0, x0 + 1))
           + ay * ((one - ax) * tap(y0 + 1, x0) + ax * tap(y0 + 1, x0 + 1)))
    return _to_u8(out)


def _gauss(k: int, sigma: float) -> np.ndarray:
    d = (np.arange(k, dtype=np.float32) - np.float32((k - 1) * 0.5)) / np.float32(sigma)
    return np.exp(np.float32(-0.5) * d * d).astype(np.float32)


def _blur_cpu(img: np.ndarray, p: np.ndarray) -> np.ndarray:
    kx, ky = min(int(p[1]), MAX_KERNEL), min(int(p[2]), MAX_KERNEL)
    wx, wy = _gauss(kx, p[3]), _gauss(ky, p[4])
    h, w = img.shape[:2]
    x = img.astype(np.float32)
    rows = np.zeros_like(x)
    for i in range(kx):
        rows += wx[i] * x[:, _reflect(np.arange(w) + i - kx // 2, w)]
    out = np.zeros_like(x)
    for j in range(ky):
        out += wy[j] * rows[_reflect(np.arange(h) + j - ky // 2, h)]
    return _to_u8(out * (np.float32(1) / (wx.sum(dtype=np.float32) * wy.sum(dtype=np.float32))))


def equalize_lut_cpu(img: np.ndarray) -> np.ndarray:
    """(3, 256) LUTs of PIL's ImageOps.equalize."""
    lut = np.empty((3, 256), np.uint8)
    for c in range(3):
        hist = np.bincount(img[..., c].reshape(-1), minlength=256).astype(np.int64)
        nz = np.flatnonzero(hist)
        step = (int(hist.sum()) - int(hist[nz[-1]])) // 255 if len(nz) > 1 else 0
        if step == 0:
            lut[c] = np.arange(256)
            continue
        acc = step // 2 + np.concatenate([[0], np.cumsum(hist)[:-1]])
        lut[c] = np.minimum(acc // step, 255)
    return lut


def step_cpu(img: np.ndarray, step: Step) -> np.ndarray:
    """One step on one uint8 HWC RGB image: the reference of ``step_u8``."""
    p = np.zeros(NPRM, np.float32)
    p[: len(step.prm)] = step.prm
    code = int(p[0])
    h, w = img.shape[:2]
    if code == COPY:
        return img
    if code == WARP:
        return _warp_cpu(img, p, step.out_hw or (h, w))
    if code == BLUR:
        return _blur_cpu(img, p)
    x = img.astype(np.float32)
    one = np.float32(1)
    if code == BRIGHTNESS:
        x = x * p[1]
    elif code == CONTRAST:
        mean = np.float32(float((img.reshape(-1, 3).astype(np.int64) @ LUMA_INT).sum()) / (10000.0 * h * w))
        x = p[1] * x + (one - p[1]) * mean
    elif code == SATURATION:
        g = (x @ LUMA)[..., None]
        x = p[1] * x + (one - p[1]) * g
    elif code == HUE:
        x = _hue_cpu(x, p[1])
    elif code == GRAYSCALE:
        x = np.repeat((x @ LUMA)[..., None], 3, axis=-1)
    elif code == SOLARIZE:
        x = np.where(x >= p[1], 255 - x, x)
    elif code == POSTERIZE:
        mask = (0xFF << (8 - int(p[1]))) & 0xFF
        return img & np.uint8(mask)
    elif code == INVERT:
        return 255 - img
    elif code == AUTOCONTRAST:
        lo = img.reshape(-1, 3).min(0).astype(np.float32)
        hi = img.reshape(-1, 3).max(0).astype(np.float32)
        scale = np.where(hi > lo, np.float32(255) / np.where(hi > lo, hi - lo, 1), 1).astype(np.float32)
        x = np.where(hi > lo, (x - lo) * scale, x)
    elif code == EQUALIZE:
        lut = equalize_lut_cpu(img)
        return np.stack([lut[c][img[..., c]] for c in range(3)], -1)
    elif code == SHARPNESS:
        if h > 2 and w > 2:
            acc = 4 * x[1:-1, 1:-1].copy()
            for dy in (0, 1, 2):
                for dx in (0, 1, 2):
                    acc += x[dy : h - 2 + dy, dx : w - 2 + dx]
            smooth = np.rint(acc / np.float32(13))
            x[1:-1, 1:-1] = smooth + p[1] * (x[1:-1, 1:-1] - smooth)
    elif code == NOISE:
        idx = 2 * np.arange(h * w * 3, dtype=np.uint32).reshape(h, w, 3)
        u1, u2 = _unit(int(p[3]), idx), _unit(int(p[3]), idx + np.uint32(1))
        z = (np.sqrt(-2.0 * np.log(u1.astype(np.float64))) * np.cos(2.0 * np.pi * u2)).astype(np.float32)
        x = x + (p[2] + p[1] * z)
    elif code == ERASE:
        y0, x0, eh, ew = (int(v) for v in p[1:5])
        ys, xs = slice(max(y0, 0), max(y0 + eh, 0)), slice(max(x0, 0), max(x0 + ew, 0))
        if p[8] != 0:
            idx = 3 * np.arange(h * w, dtype=np.uint32).reshape(h, w, 1) + np.arange(3, dtype=np.uint32)
            x[ys, xs] = np.floor(_unit(int(p[9]), idx[ys, xs]) * np.float32(256))
        else:
            x[ys, xs] = p[5:8]
    else:
        raise ValueError(f"unknown step code {code}")
    return _to_u8(x)


# --- the op base ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOp(Op):
    """An op made of per-sample :class:`Step` s; ``p`` is the chance it applies to a record.

    Subclasses set ``n_steps`` (fixed per op instance, so a batch runs them as that many launches),
    draw in :meth:`draw` and describe each step in :meth:`steps`.
    """

    kind: ClassVar[str] = "step"
    random: ClassVar[bool] = True

    @property
    def n_steps(self) -> int:
        return 1

    @property
    def p_apply(self) -> float:
        return float(getattr(self, "p", 1.0))

    def make_params(self, h: int, w: int, rng: Any, boxes: Boxes | None = None) -> Any:
        if self.p_apply < 1.0 and rng.random() >= self.p_apply:
            return None
        return self.draw(h, w, rng)

    def draw(self, h: int, w: int, rng: Any) -> Any:
        """Parameters of one record when the op applies (deterministic ops return True)."""
        return True

    def steps(self, h: int, w: int, params: Any) -> list[Step]:
        """Exactly ``n_steps`` steps for an (h, w) image ([COPY...] when ``params`` is None)."""
        if params is None:
            return [COPY_STEP] * self.n_steps
        return self.make_steps(h, w, params)

    def make_steps(self, h: int, w: int, params: Any) -> list[Step]:
        raise NotImplementedError

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        for st in self.steps(h, w, params):
            if st.out_hw is not None:
                h, w = st.out_hw
        return h, w

    def move_boxes(self, boxes: Boxes | None, h: int, w: int, params: Any = None,
                   min_visible: float = 0.0) -> tuple[Boxes | None, int]:
        if boxes is None or not self.moves_boxes:
            return boxes, 0
        m, moved = np.eye(3), False
        for st in self.steps(h, w, params):
            if st.out_hw is not None:
                h, w = st.out_hw
            if st.fwd is not None:
                m, moved = st.fwd @ m, True
        if not moved:
            return boxes, 0
        return boxes.warp(m, (h, w), min_visible)


def run_steps_host(op: StepOp, img: np.ndarray, params: Any) -> np.ndarray:
    for st in op.steps(img.shape[0], img.shape[1], params):
        img = step_cpu(img, st)
    return img


def _steps_host(op: StepOp, images: list[np.ndarray], params: list[Any]) -> list[np.ndarray]:
    return [run_steps_host(op, im, p) for im, p in zip(images, params)]


def register_step_op(cls: type[StepOp]) -> type[StepOp]:
    """Class decorator: the host kernel of a step op (the device runs every step op the same way)."""
    register_kernel(cls.name, HOST)(_steps_host)
    return cls


def _factor(name: str, value: Any) -> tuple[float, float]:
    return spread(name, value, 1.0, 0.0, 1e6)


# --- colour and tone -----------------------------------------------------------------------------------


@register_step_op
@dataclass(frozen=True)
class ColorJitter(StepOp):
    """Random brightness, contrast, saturation and hue, applied in a random order per image.

    Each of brightness/contrast/saturation is a factor range, or ``x`` meaning [max(0, 1 - x), 1 + x];
    hue is a shift range within [-0.5, 0.5], or ``x`` meaning [-x, x] (torchvision's ColorJitter).
    """

    brightness: Any = 0.0
    contrast: Any = 0.0
    saturation: Any = 0.0
    hue: Any = 0.0
    p: float = 1.0
    name = "color_jitter"

    def __post_init__(self) -> None:
        for f in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, f, _factor(f"color_jitter {f}", getattr(self, f)))
        object.__setattr__(self, "hue", spread("color_jitter hue", self.hue, 0.0, -0.5, 0.5))
        object.__setattr__(self, "p", probability("color_jitter p", self.p))

    @property
    def parts(self) -> list[tuple[int, tuple[float, float]]]:
        out = [(code, rng) for code, rng in ((BRIGHTNESS, self.brightness), (CONTRAST, self.contrast),
                                              (SATURATION, self.saturation)) if rng != (1.0, 1.0)]
        if self.hue != (0.0, 0.0):
            out.append((HUE, self.hue))
        return out

    @property
    def n_steps(self) -> int:
        return max(1, len(self.parts))

    def draw(self, h: int, w: int, rng: Any) -> list[tuple[str, float]]:
        parts = self.parts
        order = list(range(len(parts)))
        for i in range(len(order) - 1, 0, -1):  # Fisher-Yates: torchvision draws a random permutation
            j = int(rng.integers(0, i + 1))
            order[i], order[j] = order[j], order[i]
        factors = [rng.uniform(*r) for _, r in parts]
        return [(CODE_NAMES[parts[k][0]], factors[k]) for k in order]

    def make_steps(self, h: int, w: int, params: list[tuple[str, float]]) -> list[Step]:
        steps = [Step((float(CODE_NAMES.index(name)), float(f))) for name, f in params]
        return steps or [COPY_STEP]


def _named(cls: type[StepOp], name: str, doc: str) -> type[StepOp]:
    """Name, document and register an op class made by a factory below."""
    cls.name = name
    cls.__name__ = cls.__qualname__ = "".join(s.title() for s in name.split("_"))
    cls.__doc__ = doc
    OPS[name] = cls
    return register_step_op(cls)


def _one_factor_op(name: str, code: int, doc: str):
    @dataclass(frozen=True)
    class _FactorOp(StepOp):
        factor: Any = 1.0
        p: float = 1.0

        def __post_init__(self) -> None:
            object.__setattr__(self, "factor", spread(f"{name} factor", self.factor, None, 0.0, 1e6))
            object.__setattr__(self, "p", probability(f"{name} p", self.p))

        def draw(self, h: int, w: int, rng: Any) -> float:
            lo, hi = self.factor
            return lo if lo == hi else rng.uniform(lo, hi)

        def make_steps(self, h: int, w: int, params: float) -> list[Step]:
            return [Step((float(code), float(params)))]

    return _named(_FactorOp, name, doc)


Brightness = _one_factor_op("brightness", BRIGHTNESS, "Multiply pixels by ``factor`` (a number or a (min, max) range).")
Contrast = _one_factor_op("contrast", CONTRAST, "Blend with the image's mean grey by ``factor`` (0 = flat grey).")
Saturation = _one_factor_op("saturation", SATURATION, "Blend with each pixel's grey by ``factor`` (0 = grayscale).")
Sharpness = _one_factor_op("sharpness", SHARPNESS,
                           "Blend with a 3x3 smoothed image by ``factor`` (PIL ImageEnhance.Sharpness; >1 sharpens).")


@register_step_op
@dataclass(frozen=True)
class Hue(StepOp):
    """Rotate hue by ``shift`` (fraction of the colour wheel, within [-0.5, 0.5], or a range)."""

    shift: Any = 0.0
    p: float = 1.0
    name = "hue"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shift", spread("hue shift", self.shift, None, -0.5, 0.5))
        object.__setattr__(self, "p", probability("hue p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> float:
        lo, hi = self.shift
        return lo if lo == hi else rng.uniform(lo, hi)

    def make_steps(self, h: int, w: int, params: float) -> list[Step]:
        return [Step((float(HUE), float(params)))]


def _plain_op(name: str, code: int, doc: str):
    @dataclass(frozen=True)
    class _PlainOp(StepOp):
        p: float = 1.0

        def __post_init__(self) -> None:
            object.__setattr__(self, "p", probability(f"{name} p", self.p))

        def make_steps(self, h: int, w: int, params: Any) -> list[Step]:
            return [Step((float(code),))]

    return _named(_PlainOp, name, doc)


Grayscale = _plain_op("grayscale", GRAYSCALE, "Replace RGB by luma in all three channels (with probability p).")
Invert = _plain_op("invert", INVERT, "255 - pixel (with probability p).")
Equalize = _plain_op("equalize", EQUALIZE, "Histogram-equalize each channel (PIL ImageOps.equalize).")
AutoContrast = _plain_op("autocontrast", AUTOCONTRAST,
                         "Stretch each channel to the full 0-255 range (PIL ImageOps.autocontrast).")


@register_step_op
@dataclass(frozen=True)
class Solarize(StepOp):
    """Invert pixels at or above ``threshold`` (0-256)."""

    threshold: float = 128.0
    p: float = 1.0
    name = "solarize"

    def __post_init__(self) -> None:
        if not 0 <= float(self.threshold) <= 256:
            raise UsageError(f"solarize threshold must be within [0, 256], got {self.threshold}")
        object.__setattr__(self, "p", probability("solarize p", self.p))

    def make_steps(self, h: int, w: int, params: Any) -> list[Step]:
        return [Step((float(SOLARIZE), float(self.threshold)))]


@register_step_op
@dataclass(frozen=True)
class Posterize(StepOp):
    """Keep the top ``bits`` bits (1-8) of every channel."""

    bits: int = 4
    p: float = 1.0
    name = "posterize"

    def __post_init__(self) -> None:
        if not isinstance(self.bits, (int, np.integer)) or not 1 <= int(self.bits) <= 8:
            raise UsageError(f"posterize bits must be an integer within [1, 8], got {self.bits!r}")
        object.__setattr__(self, "p", probability("posterize p", self.p))

    def make_steps(self, h: int, w: int, params: Any) -> list[Step]:
        return [Step((float(POSTERIZE), float(self.bits)))]


# --- filters, noise, erasing ---------------------------------------------------------------------------


@register_step_op
@dataclass(frozen=True)
class GaussianBlur(StepOp):
    """Gaussian blur with an odd ``kernel_size`` (one or (width, height)) and sigma drawn from ``sigma``
    (a number or a (min, max) range), reflect-padded as torchvision's GaussianBlur."""

    kernel_size: Any = 5
    sigma: Any = (0.1, 2.0)
    p: float = 1.0
    name = "gaussian_blur"

    def __post_init__(self) -> None:
        ks = (self.kernel_size, self.kernel_size) if isinstance(self.kernel_size, (int, np.integer)) else tuple(self.kernel_size)
        if len(ks) != 2 or any(not isinstance(k, (int, np.integer)) or k <= 0 or k % 2 == 0 or k > MAX_KERNEL for k in ks):
            raise UsageError(f"gaussian_blur kernel_size must be odd integers within [1, {MAX_KERNEL}], got {self.kernel_size!r}")
        object.__setattr__(self, "kernel_size", (int(ks[0]), int(ks[1])))
        object.__setattr__(self, "sigma", spread("gaussian_blur sigma", self.sigma, None, 1e-3, 1e3))
        object.__setattr__(self, "p", probability("gaussian_blur p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> float:
        lo, hi = self.sigma
        return lo if lo == hi else rng.uniform(lo, hi)

    def make_steps(self, h: int, w: int, params: float) -> list[Step]:
        kx, ky = self.kernel_size
        return [Step((float(BLUR), float(kx), float(ky), float(params), float(params)))]


@register_step_op
@dataclass(frozen=True)
class GaussianNoise(StepOp):
    """Add gaussian noise of standard deviation ``sigma`` (pixel levels; a number or a range) and
    ``mean``; the noise field is a counter-based hash of (seed, record), identical on CPU and GPU."""

    sigma: Any = 10.0
    mean: float = 0.0
    p: float = 1.0
    name = "gaussian_noise"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", spread("gaussian_noise sigma", self.sigma, None, 0.0, 255.0))
        object.__setattr__(self, "p", probability("gaussian_noise p", self.p))

    def draw(self, h: int, w: int, rng: Any) -> tuple[float, int]:
        lo, hi = self.sigma
        return (lo if lo == hi else rng.uniform(lo, hi)), int(rng.integers(0, 1 << 24))

    def make_steps(self, h: int, w: int, params: tuple[float, int]) -> list[Step]:
        sigma, seed = params
        return [Step((float(NOISE), float(sigma), float(self.mean), float(seed)))]


@register_step_op
@dataclass(frozen=True)
class RandomErasing(StepOp):
    """Erase a random rectangle (torchvision's RandomErasing): area ``scale`` of the image, aspect
    ``ratio``; filled with ``value`` (a level, three levels, or "random" for uniform noise)."""

    p: float = 0.5
    scale: Any = (0.02, 0.33)
    ratio: Any = (0.3, 3.3)
    value: Any = 0
    name = "random_erasing"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", probability("random_erasing p", self.p))
        object.__setattr__(self, "scale", pair("random_erasing scale", self.scale, 0.0, 1.0))
        object.__setattr__(self, "ratio", pair("random_erasing ratio", self.ratio, 1e-3, 1e3))
        if self.value != "random":
            object.__setattr__(self, "value", colour("random_erasing value", self.value))

    def draw(self, h: int, w: int, rng: Any) -> tuple[int, int, int, int, int] | None:
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            area = h * w * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if 0 < eh < h and 0 < ew < w:
                return (int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1)), eh, ew,
                        int(rng.integers(0, 1 << 24)))
        return None

    def make_steps(self, h: int, w: int, params: tuple[int, int, int, int, int] | None) -> list[Step]:
        if params is None:
            return [COPY_STEP]
        top, left, eh, ew, seed = params
        rand = self.value == "random"
        val = (0.0, 0.0, 0.0) if rand else self.value
        return [Step((float(ERASE), float(top), float(left), float(eh), float(ew), *val, float(rand), float(seed)))]


@register_step_op
@dataclass(frozen=True)
class PhotometricDistort(StepOp):
    """SSD's photometric distortion (torchvision RandomPhotometricDistort): brightness, contrast (before or
    after), saturation and hue, each with probability ``p``."""

    brightness: Any = (0.875, 1.125)
    contrast: Any = (0.5, 1.5)
    saturation: Any = (0.5, 1.5)
    hue: Any = (-0.05, 0.05)
    p: float = 0.5
    name = "photometric_distort"

    def __post_init__(self) -> None:
        for f in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, f, _factor(f"photometric_distort {f}", getattr(self, f)))
        object.__setattr__(self, "hue", spread("photometric_distort hue", self.hue, 0.0, -0.5, 0.5))
        object.__setattr__(self, "p", probability("photometric_distort p", self.p))

    @property
    def n_steps(self) -> int:
        return 4

    @property
    def p_apply(self) -> float:
        return 1.0  # p gates each part, not the whole op

    def draw(self, h: int, w: int, rng: Any) -> list[tuple[str, float]]:
        on = [rng.random() < self.p for _ in range(4)]
        contrast_first = rng.random() < 0.5
        parts: list[tuple[str, float]] = []
        if on[0]:
            parts.append(("brightness", rng.uniform(*self.brightness)))
        cf = ("contrast", rng.uniform(*self.contrast)) if on[1] else None
        if cf and contrast_first:
            parts.append(cf)
        if on[2]:
            parts.append(("saturation", rng.uniform(*self.saturation)))
        if on[3]:
            parts.append(("hue", rng.uniform(*self.hue)))
        if cf and not contrast_first:
            parts.append(cf)
        return parts

    def make_steps(self, h: int, w: int, params: list[tuple[str, float]]) -> list[Step]:
        steps = [Step((float(CODE_NAMES.index(name)), float(f))) for name, f in params]
        return steps + [COPY_STEP] * (4 - len(steps))
