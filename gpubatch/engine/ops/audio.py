"""Audio ops on waveforms: resampling, channel and length fixes and waveform augmentation, with their CPU
kernels (NumPy, soxr) and GPU kernels (CuPy and ``kernels/audio.cu``) side by side; the features made
from waveforms (spectrogram, mel, Whisper's log-mel, MFCC) and SpecAugment's masks are in
:mod:`.spectral`.

An audio op takes :class:`~gpubatch.engine.codecs.audio_io.AudioData`. Its parameters are drawn for the
pair the run flow passes as (h, w): ``(sample rate, samples)`` for a waveform and ``(bins, frames)`` for
features, and :meth:`out_hw` says what the op makes of that pair, so that every later op draws for the
right length. The draws are the same on both backends; the GPU kernels take a whole batch and do the
heavy steps (resampling, framing, FFT, mel projection) in one launch for all of it.

Definitions, so that features match the references they name:
- ``spectrogram``: centred frames (``pad``: "reflect" as torchaudio, "constant" as librosa), a periodic
  Hann window of ``n_fft``, ``|rfft|^power``: (n_fft/2 + 1, 1 + samples/hop).
- ``mel``: the power spectrogram through a Slaney-scale, Slaney-normalised filter bank (librosa's
  ``filters.mel`` defaults).
- ``log_mel``: Whisper's ``log_mel_spectrogram``: the mel power without the last frame,
  ``log10(max(x, 1e-10))``, floored at its maximum less 8, then ``(x + 4) / 4``.
- ``mfcc``: librosa's: ``power_to_db`` of the mel power (``10 log10``, floored 80 dB under the maximum),
  then an orthonormal DCT-II over the bins, the first ``n_mfcc``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...errors import UsageError
from ..batch import stack
from ..codecs.audio_io import AudioData
from ..codecs.resample import ratio, resample_cpu, resampled_length
from ..media import MediaSpec
from ..registry import DEVICE, HOST, register_kernel
from .base import Op, probability, spread


@functools.lru_cache(maxsize=1)
def _cupy() -> Any:
    import cupy as cp

    return cp


WAVE, FEATURES = "CT", "CFT"


_ON_DEVICE: dict[tuple, Any] = {}


def constant(xp: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` (a cached host table: a window, a filter bank, a filter) as an ``xp`` array; on the GPU
    uploaded once per device, not once per batch."""
    if xp is np:
        return fn(*args)
    key = (fn.__name__, args, xp.cuda.Device().id)
    if key not in _ON_DEVICE:
        table = xp.asarray(fn(*args))
        xp.cuda.get_current_stream().synchronize()  # (then any stream may read it)
        _ON_DEVICE[key] = table
    return _ON_DEVICE[key]


def _number(name: str, value: Any, low: float, high: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number, got {value!r}") from None
    if not (low <= v <= high) or math.isnan(v):
        raise UsageError(f"{name} must be within {low:g} and {high:g}, got {v:g}")
    return v


@dataclass(frozen=True)
class AudioOp(Op):
    """An op on audio; ``takes`` is the layout it needs (a waveform, or features), ``makes`` what it gives."""

    media: ClassVar[tuple[str, ...]] = ("audio",)
    kind: ClassVar[str] = "custom"
    takes: ClassVar[str] = WAVE
    makes: ClassVar[str] = ""

    def out_spec(self, spec: MediaSpec) -> MediaSpec:
        spec = super().out_spec(spec)
        if spec.layout != self.takes:
            have = "features" if spec.layout == FEATURES else "a waveform"
            want = "features (after log_mel, mel, mfcc or spectrogram)" if self.takes == FEATURES else "a waveform"
            raise UsageError(f"{self.name} takes {want}, not {have}: put it {'after' if self.takes == FEATURES else 'before'}"
                             " the feature op")
        return spec.with_(layout=self.makes or spec.layout, dtype="float32")


# --- resampling -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def resample_filter(up: int, down: int, half_per_rate: int = 32, beta: float = 10.0) -> np.ndarray:
    """The polyphase low-pass of an ``up``/``down`` resampling: a Kaiser-windowed sinc (beta 10: by Kaiser's formula about
    100 dB stop band), cut off at 0.95 of the lower Nyquist, ``2 * half_per_rate * max(up, down) + 1``
    taps at the upsampled rate, scaled by ``up`` (unit gain at DC)."""
    m = max(up, down)
    half = half_per_rate * m
    n = np.arange(-half, half + 1, dtype=np.float64)
    fc = 0.5 * 0.95 / m  # cycles per upsampled sample
    h = 2 * fc * np.sinc(2 * fc * n) * np.kaiser(2 * half + 1, beta)
    h *= up / h.sum()
    return h.astype(np.float32)


def resample_poly_np(x: np.ndarray, up: int, down: int) -> np.ndarray:
    """The GPU kernel's polyphase resampling written in NumPy (its reference in tests): rows of ``x``."""
    h = resample_filter(up, down).astype(np.float64)
    half = (len(h) - 1) // 2
    n = x.shape[-1]
    out = np.zeros((*x.shape[:-1], resampled_length(n, up, down)), np.float64)
    for j in range(out.shape[-1]):
        t = j * down + half
        k0, n0 = t % up, t // up
        ks = np.arange(k0, len(h), up)
        ns = n0 - (ks - k0) // up
        ok = (ns >= 0) & (ns < n)
        out[..., j] = x[..., ns[ok]] @ h[ks[ok]]
    return out.astype(np.float32)


def _resample_gpu(rows: list[Any], up: int, down: int) -> list[Any]:
    """Rows (1-D CuPy float32) resampled by ``up``/``down`` in one launch of ``kernels/audio.cu``."""
    import cupy as cp

    from ..kernels import kernel

    lens = [int(r.shape[-1]) for r in rows]
    outs = [resampled_length(n, up, down) for n in lens]
    src = cp.concatenate(rows) if len(rows) > 1 else rows[0]
    in_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    out_off = np.concatenate([[0], np.cumsum(outs)]).astype(np.int64)
    dst = cp.empty(int(out_off[-1]), cp.float32)
    h = constant(cp, resample_filter, up, down)
    total = int(out_off[-1])
    if total:
        kernel("audio", "resample_poly")(
            ((total + 255) // 256,), (256,),
            (src, dst, cp.asarray(in_off), cp.asarray(out_off), np.int32(len(rows)), h, np.int32(len(h)),
             np.int32(up), np.int32(down), np.int64(total)))
    return [dst[out_off[i]: out_off[i + 1]] for i in range(len(rows))]


def _resample_items_gpu(items: list[AudioData], src: list[float], dst: list[float]) -> list[Any]:
    """Each item's samples resampled from ``src[i]`` to ``dst[i]`` Hz (CuPy (channels, samples)), one
    launch per distinct ratio for the whole batch."""
    import cupy as cp

    groups: dict[tuple[int, int], list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(ratio(src[i], dst[i]), []).append(i)
    out = [it.samples for it in items]
    for (up, down), idx in groups.items():
        if (up, down) == (1, 1):
            continue
        rows = [items[i].samples[c] for i in idx for c in range(items[i].samples.shape[0])]
        res = _resample_gpu(rows, up, down)
        k = 0
        for i in idx:
            ch = items[i].samples.shape[0]
            out[i] = stack(res[k: k + ch], cp)  # (a record's rows lie back to back: a view)
            k += ch
    return out


@dataclass(frozen=True)
class Resample(AudioOp):
    """Resample to ``rate`` Hz: soxr's high-quality resampler on the CPU, a Kaiser-windowed-sinc
    polyphase kernel (Kaiser beta 10: a stop band near 100 dB by design) on the GPU."""

    rate: int = 16000
    name = "resample"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", int(_number("resample rate", self.rate, 1000, 768000)))

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        up, down = ratio(h, self.rate)
        return self.rate, resampled_length(w, up, down)


@register_kernel("resample", HOST)
def _resample_host(op: Resample, items: list[AudioData], params: list) -> list[AudioData]:
    return [it._replace(samples=resample_cpu(it.samples, it.rate, op.rate), rate=op.rate) for it in items]


@register_kernel("resample", DEVICE)
def _resample_device(op: Resample, items: list[AudioData], params: list) -> list[AudioData]:
    res = _resample_items_gpu(items, [it.rate for it in items], [op.rate] * len(items))
    return [it._replace(samples=x, rate=op.rate) for it, x in zip(items, res)]


@dataclass(frozen=True)
class Speed(AudioOp):
    """Speed perturbation (Kaldi's 0.9/1.0/1.1): one of ``factors`` drawn per record; the audio is
    resampled as if recorded at ``rate * factor``, so it plays ``factor`` times faster, pitch and all."""

    factors: Any = (0.9, 1.0, 1.1)
    name = "speed"
    random = True

    def __post_init__(self) -> None:
        fs = tuple(self.factors) if isinstance(self.factors, (tuple, list)) else (self.factors,)
        if not fs:
            raise UsageError("speed factors must name at least one factor")
        object.__setattr__(self, "factors", tuple(_number("speed factor", f, 0.25, 4.0) for f in fs))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> float:
        return float(self.factors[int(rng.integers(0, len(self.factors)))]) if len(self.factors) > 1 else self.factors[0]

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        up, down = ratio(h * (params or 1.0), h)
        return h, resampled_length(w, up, down)


@register_kernel("speed", HOST)
def _speed_host(op: Speed, items: list[AudioData], params: list) -> list[AudioData]:
    return [it._replace(samples=resample_cpu(it.samples, it.rate * f, it.rate)) for it, f in zip(items, params)]


@register_kernel("speed", DEVICE)
def _speed_device(op: Speed, items: list[AudioData], params: list) -> list[AudioData]:
    res = _resample_items_gpu(items, [it.rate * f for it, f in zip(items, params)], [it.rate for it in items])
    return [it._replace(samples=x) for it, x in zip(items, res)]


# --- channels, length, level ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mono(AudioOp):
    """Mix the channels down to one (their mean)."""

    name = "mono"


@register_kernel("mono", HOST)
def _mono_host(op: Mono, items: list[AudioData], params: list) -> list[AudioData]:
    return [it if it.samples.shape[0] == 1 else it._replace(samples=it.samples.mean(0, keepdims=True, dtype=np.float32))
            for it in items]


@register_kernel("mono", DEVICE)
def _mono_device(op: Mono, items: list[AudioData], params: list) -> list[AudioData]:
    """The records of several channels mixed down a shape at a time."""
    return _grouped(items, lambda it: tuple(it.samples.shape),
                    lambda k, idx: stack([items[i].samples for i in idx], _cupy()).mean(1, keepdims=True),
                    only=[i for i, it in enumerate(items) if it.samples.shape[0] > 1])


def _fit(x: Any, n: int, pad: str, xp: Any) -> Any:
    """``x`` (..., samples) cut to ``n`` samples, or padded: zeros, or the audio repeated."""
    have = x.shape[-1]
    if have >= n:
        return x[..., :n]
    if pad == "repeat" and have:
        reps = -(-n // have)
        return xp.tile(x, (1,) * (x.ndim - 1) + (reps,))[..., :n]
    out = xp.zeros((*x.shape[:-1], n), xp.float32)
    out[..., :have] = x
    return out


def _grouped(items: list[AudioData], key: Any, fn: Any, only: list[int] | None = None) -> list[AudioData]:
    """The records (those of ``only``, else all) a group of equal ``key(record)`` at a time through
    ``fn(key, indices)``, which gives the group's new samples stacked (one row a record): a few launches
    on the GPU for a group, not some a record; the records back as views of the rows, the rest as they are."""
    groups: dict[Any, list[int]] = {}
    for i in range(len(items)) if only is None else only:
        groups.setdefault(key(items[i]), []).append(i)
    out = list(items)
    for k, idx in groups.items():
        x = fn(k, idx)
        for row, i in enumerate(idx):
            out[i] = items[i]._replace(samples=x[row])
    return out


def _by_shape(items: list[AudioData], params: list, fn: Any, xp: Any) -> list[AudioData]:
    """``fn(stacked, rate, params)`` on the records of each (shape, rate) at once, stacked (N, ...)."""
    return _grouped(items, lambda it: (tuple(it.samples.shape), it.rate),
                    lambda k, idx: fn(stack([items[i].samples for i in idx], xp), k[1], [params[i] for i in idx]))


@dataclass(frozen=True)
class FixDuration(AudioOp):
    """Cut or pad every record to ``seconds`` (``pad``: "zero" or "repeat"); a leading one means a long
    file is decoded only that far."""

    seconds: float = 10.0
    pad: str = "zero"
    name = "fix_duration"

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _number("fix_duration seconds", self.seconds, 1e-3, 86400))
        if self.pad not in ("zero", "repeat"):
            raise UsageError(f"fix_duration pad must be zero or repeat, got {self.pad!r}")

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        return h, int(round(self.seconds * h))


def _fix(op: FixDuration, items: list[AudioData], params: list, xp: Any) -> list[AudioData]:
    return _by_shape(items, params, lambda x, rate, _: _fit(x, int(round(op.seconds * rate)), op.pad, xp), xp)


register_kernel("fix_duration", HOST)(lambda op, items, params: _fix(op, items, params, np))
register_kernel("fix_duration", DEVICE)(lambda op, items, params: _fix(op, items, params, _cupy()))


@dataclass(frozen=True)
class TimeCrop(AudioOp):
    """A random stretch of ``seconds`` of each record (zero-padded where the record is shorter)."""

    seconds: float = 1.0
    name = "time_crop"
    random = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _number("time_crop seconds", self.seconds, 1e-3, 86400))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> int:
        n = int(round(self.seconds * h))
        return int(rng.integers(0, w - n + 1)) if w > n else 0

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        return h, int(round(self.seconds * h))


def _crop(op: TimeCrop, it: AudioData, start: int, xp: Any) -> AudioData:
    n = int(round(op.seconds * it.rate))
    return it._replace(samples=_fit(it.samples[:, start: start + n], n, "zero", xp))


@register_kernel("time_crop", HOST)
def _crop_host(op: TimeCrop, items: list[AudioData], params: list) -> list[AudioData]:
    return [_crop(op, it, p, np) for it, p in zip(items, params)]


def window_rows(xs: list[Any], starts: list[int], n: int, xp: Any) -> Any:
    """Samples ``starts[r] .. starts[r] + n`` of each record ``xs[r]`` ((channels, samples), one channel
    count, any lengths), zero where that runs outside the record: (records, channels, n), from one
    gather over the records laid end to end (a few launches for the batch, not some a record)."""
    c = int(xs[0].shape[0])
    lens = np.array([int(x.shape[-1]) for x in xs], np.int64)
    base = np.concatenate([[0], np.cumsum(lens * c)[:-1]]).astype(np.int64)
    src = xp.concatenate([x.reshape(-1) for x in xs]) if len(xs) > 1 else xs[0].reshape(-1)
    pos = xp.asarray(np.asarray(starts, np.int64))[:, None, None] + xp.arange(n, dtype=xp.int64)[None, None, :]
    length = xp.asarray(lens)[:, None, None]
    valid = (pos >= 0) & (pos < length)
    flat = xp.asarray(base)[:, None, None] + xp.arange(c, dtype=xp.int64)[None, :, None] * length + pos
    got = src[xp.where(valid, flat, 0)] if src.size else xp.zeros(flat.shape, xp.float32)
    return xp.where(valid, got, xp.float32(0))


@register_kernel("time_crop", DEVICE)
def _crop_device(op: TimeCrop, items: list[AudioData], params: list) -> list[AudioData]:
    import cupy as cp

    return _grouped(items, lambda it: (int(it.samples.shape[0]), it.rate),
                    lambda k, idx: window_rows([items[i].samples for i in idx], [params[i] for i in idx],
                                               int(round(op.seconds * k[1])), cp))


@dataclass(frozen=True)
class TimeShift(AudioOp):
    """Shift each record by up to ``seconds`` either way (drawn), filling with silence; the length stays."""

    seconds: float = 0.1
    p: float = 1.0
    name = "time_shift"
    random = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _number("time_shift seconds", self.seconds, 0, 3600))
        object.__setattr__(self, "p", probability("time_shift p", self.p))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> int:
        m = int(round(self.seconds * h))
        shift = int(rng.integers(-m, m + 1)) if m else 0
        return shift if rng.random() < self.p else 0


def _shift(it: AudioData, s: int, xp: Any) -> AudioData:
    if not s:
        return it
    x = it.samples
    out = xp.zeros_like(x)
    if s > 0:
        out[:, s:] = x[:, : max(x.shape[-1] - s, 0)]
    else:
        out[:, : max(x.shape[-1] + s, 0)] = x[:, -s:]
    return it._replace(samples=out)


@register_kernel("time_shift", HOST)
def _shift_host(op: TimeShift, items: list[AudioData], params: list) -> list[AudioData]:
    return [_shift(it, s, np) for it, s in zip(items, params)]


@register_kernel("time_shift", DEVICE)
def _shift_device(op: TimeShift, items: list[AudioData], params: list) -> list[AudioData]:
    import cupy as cp

    return _grouped(items, lambda it: tuple(it.samples.shape),
                    lambda k, idx: window_rows([items[i].samples for i in idx], [-params[i] for i in idx], k[1], cp),
                    only=[i for i, s in enumerate(params) if s])


@dataclass(frozen=True)
class Gain(AudioOp):
    """Scale the level by a gain drawn from ``db`` (decibels, a range); samples are clipped to +-1 only
    when written as FLAC or WAV."""

    db: Any = (-6.0, 6.0)
    p: float = 1.0
    name = "gain"
    random = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "db", spread("gain db", self.db, None, -120.0, 60.0))
        object.__setattr__(self, "p", probability("gain p", self.p))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> float:
        lo, hi = self.db
        db = lo if lo == hi else float(rng.uniform(lo, hi))
        return float(10 ** (db / 20)) if rng.random() < self.p else 1.0


def _gain(items: list[AudioData], params: list, xp: Any) -> list[AudioData]:
    return _by_shape(items, params, lambda x, rate, g: x * xp.asarray(g, xp.float32)[:, None, None], xp)


register_kernel("gain", HOST)(lambda op, items, params: _gain(items, params, np))
register_kernel("gain", DEVICE)(lambda op, items, params: _gain(items, params, _cupy()))


def noise_np(seed: int, n: int) -> np.ndarray:
    """Unit gaussian noise of index 0..n-1 from the counter-based stream of ``seed`` (Box-Muller on
    the PCG hash that image noise uses): what the GPU kernel computes."""
    from .pixel import _unit

    idx = np.arange(n, dtype=np.uint32)
    u1 = _unit(seed, idx * np.uint32(2))
    u2 = _unit(seed, idx * np.uint32(2) + np.uint32(1))
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)).astype(np.float32)


@dataclass(frozen=True)
class AddNoise(AudioOp):
    """Add white gaussian noise at a signal-to-noise ratio drawn from ``snr`` (dB, a range), measured on
    each record's own power; the noise is a counter-based stream of (seed, record), the same on CPU and GPU."""

    snr: Any = (10.0, 30.0)
    p: float = 1.0
    name = "add_noise"
    random = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "snr", spread("add_noise snr", self.snr, None, -30.0, 120.0))
        object.__setattr__(self, "p", probability("add_noise p", self.p))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[float, int] | None:
        lo, hi = self.snr
        snr = lo if lo == hi else float(rng.uniform(lo, hi))
        seed = int(rng.integers(0, 1 << 24))
        return (snr, seed) if rng.random() < self.p else None


@register_kernel("add_noise", HOST)
def _noise_host(op: AddNoise, items: list[AudioData], params: list) -> list[AudioData]:
    out = []
    for it, p in zip(items, params):
        if p is None:
            out.append(it)
            continue
        snr, seed = p
        x = it.samples
        power = float(np.mean(np.square(x, dtype=np.float64)))
        sigma = np.float32(math.sqrt(power / 10 ** (snr / 10)))
        out.append(it._replace(samples=x + sigma * noise_np(seed, x.size).reshape(x.shape)))
    return out


@register_kernel("add_noise", DEVICE)
def _noise_device(op: AddNoise, items: list[AudioData], params: list) -> list[AudioData]:
    """The noisy records of a batch end to end in one buffer: their powers from one running sum (float64,
    as the host's mean), then one launch for all of them, each with its own sigma and stream."""
    import cupy as cp

    from ..kernels import kernel

    noisy = [i for i, p in enumerate(params) if p is not None]
    if not noisy:
        return items
    rows = [cp.ascontiguousarray(items[i].samples).reshape(-1) for i in noisy]
    lens = np.array([r.size for r in rows], np.int64)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    x = stack(rows, cp).reshape(-1) if len(set(lens.tolist())) == 1 else cp.concatenate(rows)
    sums = cp.concatenate([cp.zeros(1, cp.float64), cp.cumsum(cp.square(x, dtype=cp.float64))])
    dev_off = cp.asarray(off)
    power = (sums[dev_off[1:]] - sums[dev_off[:-1]]) / cp.asarray(lens)
    ratio = cp.asarray(np.array([10 ** (params[i][0] / 10) for i in noisy], np.float64))
    sigma = cp.sqrt(power / ratio).astype(cp.float32)
    seeds = cp.asarray(np.array([params[i][1] for i in noisy], np.uint32))
    y = cp.empty_like(x)
    total = int(off[-1])
    if total:
        kernel("audio", "add_noise")(((total + 255) // 256,), (256,),
                                     (x, y, dev_off, np.int32(len(noisy)), sigma, seeds, np.int64(total)))
    out = list(items)
    for k, i in enumerate(noisy):
        out[i] = items[i]._replace(samples=y[off[k]: off[k + 1]].reshape(items[i].samples.shape))
    return out
