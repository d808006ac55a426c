"""Audio features and their masks: spectrogram, mel, Whisper's log-mel, MFCC and SpecAugment's frequency
and time masks, with their CPU kernels (NumPy) and GPU kernels (CuPy: cuFFT and cuBLAS) side by side; the
waveform ops they follow are in :mod:`.audio`, and the definitions the features match are in its
docstring.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...errors import RecordCondition, UsageError
from ..batch import stack
from ..codecs.audio_io import AudioData
from ..registry import DEVICE, HOST, register_kernel
from .audio import FEATURES, AudioOp, _by_shape, _cupy, _number, constant
from .base import positive

# --- features ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def hann(n: int) -> np.ndarray:
    """The periodic Hann window (torch.hann_window's default, librosa's get_window('hann'))."""
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, np.float64)
    mel = f / (200.0 / 3)
    log = f >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    f = m * (200.0 / 3)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), f)


@functools.lru_cache(maxsize=32)
def mel_filters(rate: int, n_fft: int, n_mels: int, f_min: float = 0.0, f_max: float = 0.0) -> np.ndarray:
    """The Slaney-scale, Slaney-normalised mel filter bank (librosa.filters.mel's defaults; Whisper's
    ``mel_filters``): (n_mels, n_fft/2 + 1) float32."""
    f_max = f_max or rate / 2.0
    fft_f = np.linspace(0, rate / 2.0, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_f[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    w = np.maximum(0, np.minimum(lower, upper))
    w *= (2.0 / (mel_f[2: n_mels + 2] - mel_f[:n_mels]))[:, None]
    return w.astype(np.float32)


@functools.lru_cache(maxsize=16)
def dct_matrix(n_out: int, n_in: int) -> np.ndarray:
    """The orthonormal DCT-II (scipy's ``dct(type=2, norm='ortho')``) as an (n_out, n_in) matrix."""
    k = np.arange(n_out)[:, None]
    n = np.arange(n_in)[None, :]
    m = np.cos(np.pi * k * (2 * n + 1) / (2 * n_in)) * np.sqrt(2.0 / n_in)
    m[0] /= np.sqrt(2.0)
    return m.astype(np.float32)


def frames_np(x: np.ndarray, n_fft: int, hop: int, pad: str, count: int | None = None) -> np.ndarray:
    """Centred, windowed frames of each row of ``x`` (rows, samples): (rows, frames, n_fft) float64 (the
    first ``count`` frames only, where given)."""
    half = n_fft // 2
    mode = "reflect" if pad == "reflect" and x.shape[-1] > half else "constant"
    xp_ = np.pad(x, ((0, 0), (half, half)), mode=mode)
    view = np.lib.stride_tricks.sliding_window_view(xp_, n_fft, axis=-1)[:, ::hop]
    return view[:, :count] * hann(n_fft).astype(np.float64)  # float64: what NumPy's FFT runs fastest on


def sounding_frames(x: np.ndarray, n_fft: int, hop: int) -> int:
    """How many of the centred frames of ``x`` (rows, samples) can hold a sample that is not zero: the
    rest lie in a zero tail (a record padded to a fixed duration) longer than half a window, whose
    reflection is zeros too, so their spectra are exactly zero and need no FFT."""
    n = x.shape[-1]
    total = 1 + n // hop
    sounding = (x != 0).any(0)
    last = n - 1 - int(np.argmax(sounding[::-1])) if sounding.any() else -1
    if n - 1 - last <= n_fft // 2:
        return total
    return min(total, max(0, (last + n_fft // 2) // hop + 1))


def frames_gpu(rows: list[Any], n_fft: int, hop: int, pad: str) -> tuple[Any, list[int]]:
    """Centred, windowed frames of every row (1-D CuPy float32 arrays) in one launch: (all frames,
    n_fft) float32 and the frame count of each row."""
    import cupy as cp

    from ..kernels import kernel

    lens = [int(r.shape[-1]) for r in rows]
    counts = [1 + n // hop for n in lens]
    if len(set(lens)) == 1:  # rows of one length (a batch cut to one duration): offsets made on the GPU
        src = stack(rows, cp).reshape(-1) if len(rows) > 1 else rows[0]
        in_off = cp.arange(len(rows) + 1, dtype=cp.int64) * lens[0]
        f_dev = cp.arange(len(rows) + 1, dtype=cp.int64) * counts[0]
        total = len(rows) * counts[0]
    else:
        src = cp.concatenate(rows) if len(rows) > 1 else rows[0]
        in_off = cp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        f_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        f_dev, total = cp.asarray(f_off), int(f_off[-1])
    out = cp.empty((total, n_fft), cp.float32)
    n = total * n_fft
    if n:
        kernel("audio", "frames")(((n + 255) // 256,), (256,),
                                  (src, out, in_off, f_dev, np.int32(len(rows)), constant(cp, hann, n_fft),
                                   np.int32(n_fft), np.int32(hop), np.int32(pad == "reflect"), np.int64(n)))
    return out, counts


@dataclass(frozen=True)
class FeatureOp(AudioOp):
    """An op that turns a waveform into features (bins, frames) per channel."""

    makes: ClassVar[str] = FEATURES
    drop_last: ClassVar[bool] = False

    def bins(self) -> int:
        """Features a frame: the mel bins (the coefficients of MFCC), else the FFT's bins."""
        return getattr(self, "n_mfcc", None) or getattr(self, "n_mels", None) or self.n_fft // 2 + 1

    def out_hw(self, h: int, w: int, params: Any = None) -> tuple[int, int]:
        """(bins, frames) of ``w`` samples. Raises ValueError where they make no frame (Whisper's log-mel drops its
        last frame: a recording shorter than one hop has none), before any work: a batch on the GPU had failed whole
        on such a record, and the CPU's reason was NumPy's."""
        frames = w // self.hop + (0 if self.drop_last else 1)
        if frames < 1:
            raise RecordCondition(f"too short for {self.name}: {w:,} sample{'s' * (w != 1)} at {h:,} Hz, under one hop "
                                  f"of {self.hop}, give one frame, and {self.name} drops its last frame")
        return self.bins(), frames

    def __post_init__(self) -> None:
        """Every feature op's sizes checked (n_fft, hop, and n_mels / n_mfcc where it has them)."""
        for f in ("n_fft", "hop", "n_mels", "n_mfcc"):
            if hasattr(self, f):
                object.__setattr__(self, f, positive(f"{self.name} {f}", getattr(self, f)))
        if getattr(self, "pad", "reflect") not in ("reflect", "constant"):
            raise UsageError(f"{self.name} pad must be reflect or constant, got {self.pad!r}")

    def from_power(self, p: Any, rate: int, xp: Any) -> Any:
        """Features of a power spectrogram ``p`` (rows, frames, bins), per row: (rows, bins', frames)."""
        raise NotImplementedError

    def finish(self, f: Any, xp: Any) -> Any:
        """The last per-record step on (channels, bins, frames), or on a batch of them (..., channels,
        bins, frames): Whisper's floor at each record's maximum less 8."""
        return f


def _power(frames: Any, xp: Any) -> Any:
    if xp is np:  # NumPy's float64 FFT runs about 5x faster than its float32 one (NumPy 2.x, 400 points)
        frames = np.asarray(frames, np.float64)
    spec = xp.fft.rfft(frames, axis=-1)
    return (spec.real * spec.real + spec.imag * spec.imag).astype(xp.float32)


def _mel_power(op: Any, p: Any, rate: int, xp: Any) -> Any:
    fb = constant(xp, mel_filters, int(rate), op.n_fft, op.n_mels, float(op.f_min), float(op.f_max))
    return xp.matmul(p, fb.T)  # (..., frames, n_mels)


def features_host(op: FeatureOp, it: AudioData) -> AudioData:
    """Features of one record on the CPU. Frames in a silent tail (a record padded to a fixed duration)
    are not transformed: their features are those of a zero spectrum, computed once."""
    x = np.asarray(it.samples, np.float32)
    total = 1 + x.shape[-1] // op.hop - (1 if op.drop_last else 0)
    count = min(sounding_frames(x, op.n_fft, op.hop), total)
    p = _power(frames_np(x, op.n_fft, op.hop, getattr(op, "pad", "reflect"), count), np)
    f = op.from_power(p, it.rate, np)
    if count < total:
        silent = op.from_power(np.zeros((p.shape[0], 1, p.shape[2]), np.float32), it.rate, np)
        f = np.concatenate([f, np.broadcast_to(silent, (*silent.shape[:-1], total - count))], axis=-1)
    f = op.finish(f, np)
    return it._replace(samples=np.ascontiguousarray(f, np.float32), features=op.name)


def features_device(op: FeatureOp, items: list[AudioData], chunk_bytes: int = 256 << 20) -> list[AudioData]:
    """Features of a batch on the GPU: the frames of all its rows in one launch, one batched rFFT, one
    matrix product per sample rate; split into records at the end (records of different shapes then
    take their last step, :meth:`FeatureOp.finish`, one at a time). Batches whose frames exceed
    ``chunk_bytes`` go in parts, so the frame buffer stays bounded."""
    cp = _cupy()
    rows = [(i, c) for i, it in enumerate(items) for c in range(it.samples.shape[0])]
    pad = getattr(op, "pad", "reflect")
    per_row = [(1 + items[i].samples.shape[-1] // op.hop) * op.n_fft * 4 for i, _ in rows]
    parts = []
    start = 0
    while start < len(rows):
        end, size = start, 0
        while end < len(rows) and (end == start or size + per_row[end] <= chunk_bytes):
            size += per_row[end]
            end += 1
        parts.append((start, end))
        start = end
    if len({it.samples.shape for it in items}) == 1 and len({it.rate for it in items}) == 1:
        # one shape and rate (a batch cut to one duration): each part's features straight into one array
        c = items[0].samples.shape[0]
        res = None
        for a, b in parts:
            fr, counts = frames_gpu([items[i].samples[ch] for i, ch in rows[a:b]], op.n_fft, op.hop, pad)
            p3 = _power(fr, cp).reshape(b - a, counts[0], -1)
            del fr
            f = op.from_power(p3[:, :-1] if op.drop_last else p3, items[0].rate, cp)  # (rows, bins, frames)
            if len(parts) == 1:
                res = f
                break
            if res is None:  # (bins: what from_power makes, before finish: MFCC's mel bands)
                res = cp.empty((len(rows), *f.shape[1:]), cp.float32)
            res[a:b] = f
        f = op.finish(res.reshape(len(items), c, *res.shape[1:]), cp)
        return [it._replace(samples=f[i], features=op.name) for i, it in enumerate(items)]
    outs: dict[tuple[int, int], Any] = {}
    for a, b in parts:
        part = rows[a:b]
        fr, counts = frames_gpu([items[i].samples[c] for i, c in part], op.n_fft, op.hop, pad)
        p = _power(fr, cp)  # (the part's frames end to end, bins)
        del fr
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        by_rate: dict[int, list[int]] = {}
        for k, (i, _) in enumerate(part):
            by_rate.setdefault(items[i].rate, []).append(k)
        for rate, ks in by_rate.items():  # the features of every frame of a rate at once (they are per frame)
            q = p if len(by_rate) == 1 else cp.concatenate([p[starts[k]: starts[k + 1]] for k in ks])
            f = op.from_power(q[None], rate, cp)[0]  # (bins', frames)
            off = 0
            for k in ks:
                n = int(counts[k])
                outs[part[k]] = f[:, off: off + n - (1 if op.drop_last else 0)]
                off += n
    result = []
    for i, it in enumerate(items):
        f = cp.stack([outs[(i, c)] for c in range(it.samples.shape[0])])
        result.append(it._replace(samples=op.finish(f, cp), features=op.name))
    return result


@dataclass(frozen=True)
class Spectrogram(FeatureOp):
    """The power (``power`` 2) or magnitude (1) spectrogram: (n_fft/2 + 1, 1 + samples/hop)."""

    n_fft: int = 400
    hop: int = 160
    power: float = 2.0
    pad: str = "reflect"
    name = "spectrogram"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "power", _number("spectrogram power", self.power, 0.5, 4))

    def from_power(self, p: Any, rate: int, xp: Any) -> Any:
        return xp.swapaxes(p if self.power == 2 else p ** (self.power / 2), -1, -2)


@dataclass(frozen=True)
class Mel(FeatureOp):
    """The mel power spectrogram (librosa's ``melspectrogram`` with Slaney filters): (n_mels, frames)."""

    n_mels: int = 80
    n_fft: int = 400
    hop: int = 160
    f_min: float = 0.0
    f_max: float = 0.0
    pad: str = "reflect"
    name = "mel"

    def from_power(self, p: Any, rate: int, xp: Any) -> Any:
        return xp.swapaxes(_mel_power(self, p, rate, xp), -1, -2)


@dataclass(frozen=True)
class LogMel(FeatureOp):
    """Whisper's log-mel spectrogram (``n_mels`` 80 or 128, n_fft 400, hop 160 at 16 kHz): frames =
    samples / hop (its last frame dropped), log10 floored at the maximum less 8, scaled (x + 4) / 4."""

    n_mels: int = 80
    n_fft: int = 400
    hop: int = 160
    f_min: float = 0.0
    f_max: float = 0.0
    name = "log_mel"
    drop_last: ClassVar[bool] = True

    def from_power(self, p: Any, rate: int, xp: Any) -> Any:
        m = _mel_power(self, p, rate, xp)
        return xp.swapaxes(xp.log10(xp.maximum(m, 1e-10)), -1, -2)

    def finish(self, f: Any, xp: Any) -> Any:
        top = f.max(axis=(-3, -2, -1), keepdims=True)
        return (xp.maximum(f, top - 8.0) + 4.0) / 4.0


@dataclass(frozen=True)
class MFCC(FeatureOp):
    """Mel-frequency cepstral coefficients as librosa computes them: ``power_to_db`` of the mel power
    (floored ``top_db`` under its maximum), then an orthonormal DCT-II; (n_mfcc, frames)."""

    n_mfcc: int = 40
    n_mels: int = 64
    n_fft: int = 400
    hop: int = 160
    f_min: float = 0.0
    f_max: float = 0.0
    top_db: float = 80.0
    pad: str = "reflect"
    name = "mfcc"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_mfcc > self.n_mels:
            raise UsageError(f"mfcc n_mfcc ({self.n_mfcc}) cannot exceed n_mels ({self.n_mels})")

    def from_power(self, p: Any, rate: int, xp: Any) -> Any:
        return xp.swapaxes(10.0 * xp.log10(xp.maximum(_mel_power(self, p, rate, xp), 1e-10)), -1, -2)

    def finish(self, f: Any, xp: Any) -> Any:
        db = xp.maximum(f, f.max(axis=(-3, -2, -1), keepdims=True) - self.top_db) if self.top_db else f
        return xp.matmul(constant(xp, dct_matrix, self.n_mfcc, self.n_mels), db)


for _cls in (Spectrogram, Mel, LogMel, MFCC):
    register_kernel(_cls.name, HOST)(lambda op, items, params: [features_host(op, it) for it in items])
    register_kernel(_cls.name, DEVICE)(lambda op, items, params: features_device(op, items))


# --- SpecAugment ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mask(AudioOp):
    width: int = 27
    count: int = 2
    value: float = 0.0
    takes: ClassVar[str] = FEATURES
    random = True
    axis: ClassVar[int] = -2

    def __post_init__(self) -> None:
        object.__setattr__(self, "width", positive(f"{self.name} width", self.width) if self.width else 0)
        if not isinstance(self.count, int) or self.count < 0:
            raise UsageError(f"{self.name} count must be an integer >= 0, got {self.count!r}")
        object.__setattr__(self, "value", _number(f"{self.name} value", self.value, -1e6, 1e6))

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> list[tuple[int, int]]:
        size = h if self.axis == -2 else w
        out = []
        for _ in range(self.count):
            width = int(rng.integers(0, min(self.width, size) + 1))
            start = int(rng.integers(0, size - width + 1))
            out.append((start, width))
        return out


@dataclass(frozen=True)
class FreqMask(_Mask):
    """SpecAugment's frequency masks: ``count`` bands of up to ``width`` bins set to ``value``."""

    name = "freq_mask"


@dataclass(frozen=True)
class TimeMask(_Mask):
    """SpecAugment's time masks: ``count`` stretches of up to ``width`` frames set to ``value``."""

    width: int = 100
    name = "time_mask"
    axis: ClassVar[int] = -1


def _mask(op: _Mask, items: list[AudioData], params: list, xp: Any) -> list[AudioData]:
    """The masks of a batch: the records of each shape masked by one comparison (:func:`_by_shape`)."""
    if not any(w for masks in params for _, w in masks):
        return items

    def apply(x: Any, rate: int, masks: list) -> Any:
        hit = np.zeros((len(masks), x.shape[op.axis]), bool)  # (records, bins or frames): True where masked
        for row, ms in enumerate(masks):
            for start, width in ms:
                hit[row, start: start + width] = True
        where = xp.asarray(hit)[:, None, :, None] if op.axis == -2 else xp.asarray(hit)[:, None, None, :]
        return xp.where(where, xp.float32(op.value), x)

    return _by_shape(items, params, apply, xp)


for _cls in (FreqMask, TimeMask):
    register_kernel(_cls.name, HOST)(lambda op, items, params: _mask(op, items, params, np))
    register_kernel(_cls.name, DEVICE)(lambda op, items, params: _mask(op, items, params, _cupy()))


