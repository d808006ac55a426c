"""Audio on the CPU, as the run flow uses it (:class:`~gpubatch.engine.media.Codec`): the header checked
for bytes that pass through, samples decoded (:mod:`.audio_io`; a long record a block at a time,
:mod:`.audio_stream`), the chain's host kernels run, the output encoded.

Decoded audio is an :class:`AudioData`: float32 samples (channels, samples) and their rate, or, after a
feature op, the features (bins, frames) per channel. The chain's parameters are drawn for the pair
``(sample rate, samples)`` of a waveform and ``(bins, frames)`` of features (:meth:`AudioHostCodec.size`):
the audio ops read them as such (:mod:`..ops.audio`).
"""

from __future__ import annotations

from typing import Any

from ...errors import RecordError, Stage
from ...types import Record
from ..media import HOST, MediaSpec, RunPlan, register_codec
from ..ops.spectral import FeatureOp
from .audio_io import (
    AUDIO_FORMATS,
    DEFAULT_MAX_SAMPLES,
    AudioData,
    AudioInfo,
    decode_audio,
    encode_audio,
    leading_seconds,
    npy_header,
    probe_audio,
    sniff_audio,
)
from .audio_stream import AudioStream, run_stream, should_stream

__all__ = ["AUDIO_FORMATS", "AudioData", "AudioHostCodec", "AudioInfo", "decode_audio", "encode_audio", "info_of",
           "probe_audio", "sniff_audio"]


def info_of(record: Record) -> AudioInfo:
    """The record's :class:`AudioInfo`, probed once and kept on the record object."""
    cached = getattr(record, "_audio_info", None)
    if cached is not None:
        return cached
    try:
        info = probe_audio(record.data)
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
    except Exception as e:  # noqa: BLE001 - the record boundary: damaged bytes the libraries' objects trip over
        raise RecordError(record.key, record.origin, Stage.DECODE,
                          f"not an audio file gpubatch reads (damaged?): {type(e).__name__}: {e}") from None
    object.__setattr__(record, "_audio_info", info)
    return info


def out_format(plan: Any, codec: str) -> str:
    """The format an output of a ``codec`` source is written in: ``--audio-format``, else FLAC stays
    FLAC and WAV stays WAV, and lossy codecs (decoded already) become FLAC."""
    fmt = getattr(plan, "audio_format", "keep")
    if fmt != "keep":
        return fmt
    return codec if codec in ("flac", "wav") else "flac"


class AudioHostCodec:
    """Audio on the CPU: ``check`` reads the header (bytes that pass through untouched are audio
    gpubatch reads); ``decode`` gives an :class:`AudioData`; ``run_chain`` the chain's host kernels;
    ``encode`` the output's record."""

    spec = MediaSpec("audio", layout="CT", dtype="float32", channels=None)

    def check(self, record: Record, plan: RunPlan) -> Record:
        if record.codec == "npy":  # features gpubatch wrote: a readable array header
            try:
                npy_header(record.data)
            except ValueError as e:
                raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
            return record
        info = info_of(record)  # (a file cut short is refused here: its header's length is checked)
        if getattr(plan, "verify", "headers") == "full":  # every sample decoded
            try:
                decode_audio(record.data, info, getattr(plan, "max_samples", DEFAULT_MAX_SAMPLES))
            except ValueError as e:
                raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
        return record if record.codec == info.codec else record.with_(codec=info.codec)

    def decode_lazy(self, record: Record, plan: Any) -> Any:
        """An :class:`~.audio_stream.AudioStream` where ``record`` streams under ``plan`` (nothing decoded
        yet), else None."""
        if record.codec == "npy":
            return None
        info = info_of(record)
        ops = getattr(plan, "ops", ())
        if leading_seconds(ops) is not None or not should_stream(ops, info):
            return None
        npy = not (ops and isinstance(ops[-1], FeatureOp)) and out_format(plan, record.codec) == "npy"
        return AudioStream(record.data, info, npy)

    def decode(self, record: Record, plan: Any) -> Any:
        """An :class:`AudioData`, or for a long record whose chain streams an
        :class:`~.audio_stream.AudioStream` (decoded a block at a time by :meth:`run_chain`)."""
        if record.codec == "npy":
            return self._waveform(record, plan)
        stream = self.decode_lazy(record, plan)
        if stream is not None:
            return stream
        info = info_of(record)
        seconds = leading_seconds(getattr(plan, "ops", ()))
        in_place = not getattr(plan, "ops", ()) and out_format(plan, record.codec) == "npy"  # (the output is the decode)
        try:
            return decode_audio(record.data, info, getattr(plan, "max_samples", DEFAULT_MAX_SAMPLES), seconds, in_place)
        except ValueError as e:
            raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None

    @staticmethod
    def _waveform(record: Record, plan: Any) -> AudioData:
        """An array gpubatch wrote as ``.npy`` as decoded audio: a waveform (``--audio-format npy``: float32
        (samples,) or (channels, samples), its rate in ``meta["sample_rate"]``), or features (float16
        (bins, frames) or (channels, bins, frames), their kind in ``meta["features"]``), which SpecAugment's
        masks take."""
        import io

        import numpy as np

        rate = record.meta.get("sample_rate")
        features = record.meta.get("features")
        if not features and not isinstance(rate, int):
            raise RecordError(record.key, record.origin, Stage.DECODE, "an array of another tool (no sample rate in "
                              "its metadata) passes through as it is; the audio options and ops take audio files "
                              "and the arrays gpubatch writes")
        want = (2, 3) if features else (1, 2)  # features (bins, frames) per channel, a waveform (samples,) per channel
        try:
            shape, dtype = npy_header(record.data)
            if dtype not in ("float32", "<f4", "float16", "<f2") or len(shape) not in want or shape[0] > 32 * 1024:
                raise ValueError(f"{'features are' if features else 'a waveform is'} a float array of "
                                 f"{' or '.join(str(n) for n in want)} dimensions, not {dtype} {shape}")
            x = np.load(io.BytesIO(record.data), allow_pickle=False)
        except ValueError as e:
            raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
        x = np.ascontiguousarray(x[None] if x.ndim == want[0] else x, np.float32)
        if not x.shape[-1] or not np.isfinite(x).all():
            raise RecordError(record.key, record.origin, Stage.DECODE, "an empty array, or one with NaN values")
        return AudioData(x, rate if isinstance(rate, int) else 0, features or "", bits=24)

    def size(self, item: Any) -> tuple[int, int]:
        return item.size

    def run_chain(self, ops: Any, item: Any, params: list) -> AudioData:
        from ..registry import get_kernel

        if isinstance(item, AudioStream):
            try:
                return run_stream(item, ops, params)
            except Exception as e:  # noqa: BLE001 - libsndfile's errors mid-file (a corrupt FLAC frame...)
                raise ValueError(f"cannot decode: {str(e).splitlines()[0][:160]}") from None

        for op, p in zip(ops, params):
            item = get_kernel(op.name, HOST)(op, [item], [p])[0]
        return item

    def encode(self, data: AudioData, record: Record, plan: Any) -> Record:
        fmt = "npy" if data.features else out_format(plan, record.codec)
        try:
            out, codec = encode_audio(data, fmt, bits=data.bits)
        except Exception as e:  # noqa: BLE001 - the record boundary
            raise RecordError(record.key, record.origin, Stage.ENCODE, f"{type(e).__name__}: {e}") from None
        meta = {**record.meta, "sample_rate": int(data.rate)}
        if data.features:
            meta["features"] = data.features
        return record.with_(data=out, codec=codec, meta=meta)


register_codec("audio", "*", HOST, AudioHostCodec())
