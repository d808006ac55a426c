"""Long audio files through a chain in chunks, so that memory follows the output, not the input.

A record whose decoded samples exceed ``STREAM_SAMPLES`` (35 minutes of 16 kHz mono; 6 minutes of 48 kHz
stereo) and whose chain is made of ops that work sample by sample or frame by frame (``mono``,
``resample``, ``gain``, ``fix_duration`` without a repeat, and a final feature op) is decoded a block at
a time: soxr resamples the blocks as one stream, and the STFT frames are cut from a sliding buffer with
the same centring and reflect padding as the whole-file path, so the features are those of the whole
file (log-mel's floor and MFCC's ``top_db`` are applied once, at the end). Only the output is held
whole: an hour at 48 kHz stereo becomes 115 MB of 16 kHz float32, or 110 MB of 80-bin log-mel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .audio_io import AudioData, AudioInfo, npy_bytes

STREAM_SAMPLES = 1 << 25  # decoded samples (all channels) above which a streamable chain streams
BLOCK = 1 << 18  # frames a block


@dataclass
class AudioStream:
    """A long record not yet decoded: its bytes (or path) and header facts."""

    data: Any
    info: AudioInfo
    npy: bool = False  # the output is a .npy of the samples: they are written into its bytes as they come

    @property
    def size(self) -> tuple[int, int]:
        return int(self.info.rate), int(self.info.frames)


def streamable(ops: Any, info: AudioInfo) -> bool:
    """Whether ``ops`` can run on ``info``'s record in blocks (see the module's docstring): ``mono``,
    ``resample`` and ``gain``, a ``fix_duration`` after the last resample, and a final feature op whose
    hop is under half its window."""
    from ..ops.spectral import FeatureOp

    seen_cut = False
    for k, op in enumerate(ops):
        if isinstance(op, FeatureOp):
            if k != len(ops) - 1 or op.hop >= op.n_fft // 2:
                return False
        elif op.name == "fix_duration":
            if op.pad == "repeat" and op.seconds > info.duration:
                return False
            seen_cut = True
        elif op.name == "resample":
            if seen_cut:
                return False
        elif op.name not in ("mono", "gain"):
            return False
    return info.reader == "soundfile"


def should_stream(ops: Any, info: AudioInfo) -> bool:
    return info.frames * info.channels > STREAM_SAMPLES and streamable(ops, info)


class _Frames:
    """STFT frames of a signal that arrives in blocks: centred (``n_fft / 2`` of padding each side,
    reflected or zero) and ``hop`` apart, as :func:`~..ops.spectral.frames_np` cuts them from the whole."""

    def __init__(self, op: Any, rate: int):
        self.op, self.rate, self.half = op, rate, op.n_fft // 2
        self.reflect = getattr(op, "pad", "reflect") == "reflect"
        self.buf: np.ndarray | None = None
        self.start = 0  # padded-signal index of buf[0]
        self.next = 0  # the next frame's start, in the padded signal
        self.done = 0  # frames made
        self.seen = 0  # samples seen
        self.out: list[np.ndarray] = []

    def push(self, x: np.ndarray, last: bool) -> None:
        from ..ops.spectral import _power, hann

        op, half = self.op, self.half
        self.seen += x.shape[-1]
        if self.buf is None:  # the left padding, from the first block (longer than half a window)
            lead = (x[:, 1: half + 1][:, ::-1] if self.reflect and x.shape[-1] > half
                    else np.zeros((x.shape[0], half), np.float32))
            self.buf = np.concatenate([lead, x], axis=1)
        else:
            self.buf = np.concatenate([self.buf, x], axis=1)
        total = 1 + self.seen // op.hop
        if last:  # the right padding
            tail = (self.buf[:, -half - 1: -1][:, ::-1] if self.reflect and self.seen > half
                    else np.zeros((self.buf.shape[0], half), np.float32))
            self.buf = np.concatenate([self.buf, tail], axis=1)
        end = self.start + self.buf.shape[-1]
        count = (end - op.n_fft - self.next) // op.hop + 1 if end - op.n_fft >= self.next else 0
        if last:
            count = total - self.done
        if count > 0:
            s = self.next - self.start
            view = np.lib.stride_tricks.sliding_window_view(self.buf[:, s:], op.n_fft, axis=-1)[:, ::op.hop][:, :count]
            self.out.append(op.from_power(_power(view * hann(op.n_fft).astype(np.float64), np), self.rate, np))
            self.next += count * op.hop
            self.done += count
            drop = self.next - self.start
            self.buf = self.buf[:, drop:]
            self.start += drop

    def result(self) -> np.ndarray:
        f = np.concatenate(self.out, axis=-1)
        if self.op.drop_last:
            f = f[..., :-1]
        return self.op.finish(f, np)


def run_stream(stream: AudioStream, ops: Any, params: list) -> AudioData:
    """The chain on a long record, a block at a time; the output whole (samples, or features)."""
    import soxr

    from ..ops.audio import _fit
    from ..ops.spectral import FeatureOp
    from .audio_io import _sf_open, _Source
    from .resample import ratio, resampled_length

    info = stream.info
    # each op's stage: the resamplers (one stream per resample, all its channels), the final length
    rate, channels, n_out = info.rate, info.channels, info.frames
    stages: list[Any] = []
    for op in ops:
        if op.name == "mono":
            channels = 1
            stages.append(None)
        elif op.name == "resample" and op.rate != rate:
            stages.append(soxr.ResampleStream(rate, op.rate, channels, dtype="float32", quality="HQ"))
            n_out = resampled_length(n_out, *ratio(rate, op.rate))
            rate = op.rate
        elif op.name == "fix_duration":
            n_out = int(round(op.seconds * rate))
            stages.append(None)
        else:
            stages.append(None)
    feature = ops[-1] if ops and isinstance(ops[-1], FeatureOp) else None
    frames = _Frames(feature, rate) if feature is not None else None
    buf = None  # the output's samples, filled block by block (in a .npy file's data where that is the output)
    if frames is None:
        if stream.npy:
            buf, out = npy_bytes((n_out,) if channels == 1 else (channels, n_out), np.float32)
            out = out.reshape(channels, n_out)
        else:
            out = np.empty((channels, n_out), np.float32)
    emitted = 0
    with _Source(stream.data) as src, _sf_open(src) as f:
        blocks = f.blocks(blocksize=BLOCK, dtype="float32", always_2d=True)
        block = next(blocks, None)
        while block is not None:
            following = next(blocks, None)
            last = following is None
            x = np.ascontiguousarray(block.T)
            for op, p, stage in zip(ops, params, stages):
                if op.name == "mono" and x.shape[0] > 1:
                    x = x.mean(0, keepdims=True, dtype=np.float32)
                elif stage is not None:
                    x = np.ascontiguousarray(stage.resample_chunk(np.ascontiguousarray(x.T), last=last).T)
                elif op.name == "gain":
                    x = x * np.float32(p)
            if last and emitted + x.shape[-1] < n_out:  # the length the whole-file path makes
                x = _fit(x, n_out - emitted, "zero", np)
            x = x[:, : max(0, n_out - emitted)]
            emitted += x.shape[-1]
            reached = emitted >= n_out  # a cut reached: the rest of the file is not read
            if frames is not None:
                frames.push(x, last or reached)
            else:
                out[:, emitted - x.shape[-1] : emitted] = x
            if reached:
                break
            block = following
    if frames is not None:
        return AudioData(np.ascontiguousarray(frames.result(), np.float32), rate, feature.name)
    if emitted < n_out:  # (fewer samples than the header said: not the output asked for)
        raise ValueError(f"decoded {emitted:,} samples a channel where {n_out:,} were due: the file is cut short")
    return AudioData(out, rate, bits=24 if info.bits >= 24 else 16, npy=buf)
