"""Audio bytes in and out: soundfile (libsndfile) reads WAV, FLAC, OGG Vorbis, Opus and MP3, PyAV what
libsndfile cannot (m4a/AAC); outputs are written as FLAC, WAV or ``.npy`` (float32 samples, or float16
features). The run flow's codec on top of these is :mod:`.audio`; whether a file holds what its header says (cut
short, damaged) is told from its bytes by :mod:`.audio_end` before a sample is decoded.

Decoded audio is an :class:`AudioData`: float32 samples (channels, samples) and their rate, or, after a
feature op, the features (bins, frames) per channel. The chain's parameters are drawn for the pair
``(sample rate, samples)`` of a waveform and ``(bins, frames)`` of features (:meth:`AudioHostCodec.size`):
the audio ops read them as such (:mod:`..ops.audio`).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...errors import DependencyError
from .audio_end import (
    audio_shortfall,
    file_shortfall,
    id3_end,
    mp3_count,
    ogg_chained,
    sniff_audio,
    tail_bytes,
)

__all__ = ["AUDIO_FORMATS", "AudioData", "AudioInfo", "audio_shortfall", "cut_audio", "decode_audio", "encode_audio",
           "leading_seconds", "npy_header", "probe_audio", "sniff_audio"]

#: what ``--audio-format`` writes
AUDIO_FORMATS = ("keep", "flac", "wav", "npy")
MAX_CHANNELS = 32
MIN_RATE, MAX_RATE = 1_000, 768_000
#: decoded samples (all channels) a record may hold: 4 hours of 48 kHz stereo float32 is 5.5 GB
DEFAULT_MAX_SAMPLES = 48_000 * 2 * 3600 * 4


def soundfile():
    try:
        import soundfile as sf
    except (ImportError, OSError) as e:  # pragma: no cover - a declared dependency (libsndfile missing: OSError)
        raise DependencyError(f"audio needs soundfile (libsndfile): pip install soundfile ({e})") from None
    return sf


@dataclass(frozen=True)
class AudioInfo:
    """An audio file's facts, read from its header (no samples decoded).

    Attributes:
        codec: wav, flac, ogg, opus, mp3, m4a...; ``subtype``: the sample coding (PCM_16, PCM_24, FLOAT,
            VORBIS, MPEG_LAYER_III, aac...).
        rate: samples per second; ``channels``; ``frames``: samples per channel (0 where unknown).
        bits: bits per sample of a PCM coding (8, 16, 24, 32), else 0.
    """

    codec: str
    subtype: str
    rate: int
    channels: int
    frames: int
    bits: int = 0
    reader: str = "soundfile"

    @property
    def duration(self) -> float:
        return self.frames / self.rate if self.rate else 0.0


_BITS = {"PCM_S8": 8, "PCM_U8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32, "FLOAT": 32, "DOUBLE": 64}


def _check(info: AudioInfo) -> AudioInfo:
    if not MIN_RATE <= info.rate <= MAX_RATE:
        raise ValueError(f"sample rate {info.rate} Hz is outside {MIN_RATE:,}-{MAX_RATE:,} Hz")
    if not 1 <= info.channels <= MAX_CHANNELS:
        raise ValueError(f"{info.channels} channels (at most {MAX_CHANNELS})")
    return info


#: the largest bytes handed to libsndfile in a memfd (a copy of them); larger ones go through a ``BytesIO``,
#: which shares the bytes (a record of an hour's audio is not held twice), and whose Python read per block
#: costs nothing beside such a record's decode
MEMFD_MAX = 16 << 20


class _Source:
    """Audio bytes (or a file's path) as libsndfile reads them: a path, or the bytes in an anonymous
    in-memory file (``memfd``) whose descriptor libsndfile reads with its own I/O. A ``BytesIO`` would
    make libsndfile call back into Python for every read, holding the GIL: decoding threads would then
    run one at a time. Used as a context manager; ``BytesIO`` where ``memfd_create`` is missing."""

    def __init__(self, data: bytes | str | Path):
        self.data, self.fd = data, None

    def __enter__(self) -> Any:
        if isinstance(self.data, (str, Path)):
            return str(self.data)
        if hasattr(os, "memfd_create") and len(self.data) <= MEMFD_MAX:
            try:
                self.fd = os.memfd_create("gpubatch-audio", getattr(os, "MFD_CLOEXEC", 0))
                view = memoryview(self.data)
                while view:
                    view = view[os.write(self.fd, view):]
                os.lseek(self.fd, 0, os.SEEK_SET)
                return self.fd
            except OSError:
                self.__exit__()
        return io.BytesIO(self.data)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _sf_open(src: Any) -> Any:
    sf = soundfile()
    return sf.SoundFile(src, closefd=False) if isinstance(src, int) else sf.SoundFile(src)


def _info_of(f: Any) -> AudioInfo:
    """The facts of an open ``soundfile.SoundFile``."""
    codec = {"WAV": "wav", "WAVEX": "wav", "RF64": "wav", "FLAC": "flac", "MPEG": "mp3",
             "OGG": "opus" if f.subtype == "OPUS" else "ogg"}.get(f.format, f.format.lower())
    return AudioInfo(codec, f.subtype, int(f.samplerate), int(f.channels), int(f.frames), _BITS.get(f.subtype, 0))


def probe_audio(data: bytes | str | Path) -> AudioInfo:
    """The header facts of audio bytes (or a file); ValueError where they are no audio gpubatch reads
    (empty, truncated header, 0 Hz or absurd rates, more than 32 channels, no samples)."""
    if isinstance(data, (str, Path)):
        data_path, data = data, None
        if os.path.getsize(data_path) == 0:
            raise ValueError("empty file (0 bytes)")
    elif not data:
        raise ValueError("empty file (0 bytes)")
    try:
        with _Source(data if data is not None else data_path) as src, _sf_open(src) as i:
            info = _info_of(i)
    except Exception:  # noqa: BLE001 - libsndfile cannot read it: PyAV (m4a/AAC...), or it is no audio
        if data is None:
            data = Path(data_path).read_bytes()
        said = _wav_header(data)
        if said is not None:  # a WAV header libsndfile refuses: say what is wrong with it
            _check(AudioInfo("wav", "", *said, 0))
        info = _probe_av(data)
    _check(info)
    if info.codec == "mp3" and info.reader == "soundfile":  # (its frames walked: whole MP3 files are small)
        if data is None:
            data = Path(data_path).read_bytes()
        held, through_av = mp3_count(data, info.frames)
        if through_av:  # (libsndfile counts fewer than its frames hold, less the encoder's delay)
            info = replace(_probe_av(data), frames=held)
        elif held != info.frames:  # (no header frame: libsndfile's count was a guess from the file's size)
            info = replace(info, frames=held)
    if info.codec in ("ogg", "opus") and info.reader == "soundfile" and ogg_chained(data if data is not None
                                                                                   else data_path):
        if data is None:
            data = Path(data_path).read_bytes()
        info = _chained(data)
    counted = 0 if info.reader != "soundfile" else info.frames  # (PyAV reads every Ogg stream, every MP3 frame)
    if data is not None:
        head = data[: max(1 << 16, id3_end(data[:10]) + 4096)]  # (an MP3's first frames after its tags, cover art and all)
        n = tail_bytes(data[:64])
        tail = data[-n:] if n else b""
        short = audio_shortfall(head, tail, len(data), counted)
    else:
        short = file_shortfall(data_path, counted)
    if short is not None:  # (before the count of samples: a file cut inside its first pages may have none)
        raise ValueError(short)
    if info.frames <= 0:
        raise ValueError("no audio samples")
    return info


def _chained(data: bytes) -> AudioInfo:
    """The facts of a chained Ogg file (streams one after another, as stream recorders write them; libsndfile reads
    the first alone), read through PyAV, every stream. Streams of other rates, which FFmpeg's demuxer does not read
    past, are read each on its own and resampled to the highest (``reader="chains"``: :func:`_decode_chains`);
    ValueError where they differ in channels."""
    from .container_end import ogg_chains
    from .resample import ratio, resampled_length

    chains = ogg_chains(data)
    lost = [first for rate, _, _, first in chains if not rate]
    if lost:  # (a stream whose header is damaged: no decoder reads it, and its samples would go with no word)
        raise ValueError(f"a chained Ogg file of {len(chains)} streams, the one from byte {lost[0]:,} with no readable "
                         "header (damaged): its samples cannot be read")
    if len({channels for _, channels, *_ in chains}) != 1:
        said = ", ".join(f"{rate:,} Hz x {channels}" for rate, channels in sorted({c[:2] for c in chains}))
        raise ValueError(f"a chained Ogg file whose {len(chains)} streams differ in channels ({said}): convert "
                         "each stream to a file of its own first")
    if len({rate for rate, *_ in chains}) == 1:
        return replace(_probe_av(data), frames=sum(n for _, _, n, _ in chains))
    top = max(rate for rate, *_ in chains)
    frames = sum(resampled_length(n, *ratio(rate, top)) for rate, _, n, _ in chains)
    codec = sniff_audio(data) or "ogg"
    return AudioInfo(codec, "OPUS" if codec == "opus" else "VORBIS", top, chains[0][1], frames, 0, "chains")


def _decode_chains(data: bytes, info: AudioInfo, frames: int) -> np.ndarray:
    """The samples of a chained Ogg file whose streams differ in rate: each stream's pages decoded as a file of their
    own, resampled to ``info.rate`` (soxr), one after another; the first ``frames`` where given. A damaged stream is
    the file's error, as in any file."""
    from .container_end import ogg_chains
    from .resample import resample_cpu

    starts = [first for *_, first in ogg_chains(data)] + [len(data)]
    out, got = [], 0
    for a, b in zip(starts, starts[1:]):
        piece = decode_audio(data[a:b])
        out.append(resample_cpu(piece.samples, piece.rate, info.rate))
        got += out[-1].shape[1]
        if frames and got >= frames:
            break
    x = np.concatenate(out, axis=1)
    want = min(frames or info.frames, info.frames)
    if x.shape[1] < want - _AV_SLACK:  # (streams that hold fewer samples than their pages count)
        raise ValueError(f"decoded {x.shape[1]:,} samples a channel where its streams' pages count {want:,}: the file "
                         "is damaged or cut short")
    return np.ascontiguousarray(x[:, :frames] if frames else x)


class _Counted(Exception):
    """A file whose samples ``probe_audio`` counts beyond libsndfile's count (MP3, Ogg)."""


def _wav_header(data: bytes) -> tuple[int, int] | None:
    """(rate, channels) from a RIFF/WAVE file's ``fmt `` chunk, or None."""
    if data[:4] not in (b"RIFF", b"RF64") or data[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= min(len(data), 1 << 16):
        size = int.from_bytes(data[pos + 4: pos + 8], "little")
        if data[pos: pos + 4] == b"fmt " and pos + 16 <= len(data):
            channels = int.from_bytes(data[pos + 10: pos + 12], "little")
            rate = int.from_bytes(data[pos + 12: pos + 16], "little")
            return rate, channels
        pos += 8 + size + (size & 1)
    return None


def _probe_av(data: bytes) -> AudioInfo:
    from .video_probe import (
        BOXES_CUT,
        FRAGMENT_CUT,
        INDEX_CUT,
        av,
        mp4_boxes_cut,
        mp4_index_whole,
        sample_table,
        sniff_container,
    )

    a = av("audio that libsndfile does not read (m4a/AAC, or a file it refuses)")
    try:
        with a.open(io.BytesIO(data), mode="r") as c:
            if not c.streams.audio:
                raise ValueError("no audio stream" + (" (a video file)" if c.streams.video else ""))
            s = c.streams.audio[0]
            if s.codec_context is None:  # (a codec FFmpeg does not know: a damaged header, or an exotic one)
                raise ValueError("not an audio file gpubatch reads: its audio stream names no codec FFmpeg knows "
                                 "(a damaged header?)")
            table = sample_table(s)  # (MP4/M4A: every packet's place; one past the file's end: a file cut short)
            if table and max(pos + size for pos, size in table.items()) > len(data):
                whole = sum(pos + size <= len(data) for pos, size in table.items())
                raise ValueError(f"the file is cut short: its index lists {len(table):,} packets, {whole:,} are in the "
                                 f"file whole")
            cut = mp4_boxes_cut(data) if sniff_container(data) in ("mp4", "mov", "3gp") else ""
            if cut == "fragment":  # (a fragmented M4A cut inside a fragment: the demuxer ends at the last whole one)
                raise ValueError(f"{BOXES_CUT}: {FRAGMENT_CUT}")
            if table is not None and cut:  # (cut inside its index at its end: its samples whole)
                raise ValueError(BOXES_CUT)
            rate = int(s.rate or s.codec_context.sample_rate or 0)
            # (a stream's ``frames`` counts packets, not samples)
            frames = int(round(float(s.duration * s.time_base) * rate)) if s.duration and s.time_base else 0
            if not frames and c.duration:
                frames = int(round(c.duration / 1_000_000 * rate))
            return AudioInfo(sniff_audio(data) or s.codec_context.name, s.codec_context.name, rate,
                             int(s.codec_context.channels or 0), frames, 0, "pyav")
    except a.FFmpegError as e:
        if sniff_container(data) in ("mp4", "mov", "3gp"):
            if not mp4_index_whole(data):  # (an M4A cut before its index at its end)
                raise ValueError(INDEX_CUT) from None
            if mp4_boxes_cut(data) == "fragment":  # (cut inside a fragment, where FFmpeg's demuxer refuses the file:
                raise ValueError(f"{BOXES_CUT}: {FRAGMENT_CUT}") from None  # PyAV 18.1.1's, 2026-12-07)
        why = getattr(e, "strerror", None) or str(e).split(": ", 1)[0]
        if why == "End of file":  # (the demuxer ran out of bytes inside the file's data: an Ogg file cut short, say)
            raise ValueError("the file ends inside its data (End of file): it is cut short, or damaged") from None
        raise ValueError(f"not an audio file gpubatch reads ({why})") from None


class AudioData(NamedTuple):
    """Decoded audio: ``samples`` float32 (channels, samples) at ``rate``; after a feature op
    ``features`` is its name and ``samples`` holds (channels, bins, frames)."""

    samples: Any
    rate: int
    features: str = ""
    bits: int = 16  # the PCM depth a FLAC/WAV output keeps (24 for 24-bit and float sources)
    npy: Any = None  # a .npy file's bytes (bytearray) whose data ``samples`` is, where decoded in place

    @property
    def size(self) -> tuple[int, int]:
        """(rate, samples) of a waveform, (bins, frames) of features: what the chain's draws are for."""
        if self.features:
            return int(self.samples.shape[-2]), int(self.samples.shape[-1])
        return int(self.rate), int(self.samples.shape[-1])


def npy_bytes(shape: tuple[int, ...], dtype: Any) -> tuple[bytearray, np.ndarray]:
    """A ``.npy`` file's bytes for an array of ``shape`` and ``dtype`` (its header written, its data not yet)
    and the array that views that data: what is written into the array is the file."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                "fortran_order": False, "shape": tuple(shape)})
    h = head.getvalue()
    buf = bytearray(len(h) + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    buf[: len(h)] = h
    return buf, np.frombuffer(buf, dtype, offset=len(h)).reshape(shape)


def _read_into(f: Any, frames: int, channels: int, npy: bool = False) -> tuple[np.ndarray, Any]:
    """(channels, frames) float32 samples of an open ``SoundFile``, read a block at a time into their
    place (no (frames, channels) array transposed after), into a ``.npy`` file's data where ``npy``;
    and that file's bytes (or None). Fewer where the file holds fewer."""
    if npy:
        buf, x = npy_bytes((frames,) if channels == 1 else (channels, frames), np.float32)
        x = x.reshape(channels, frames)
    else:
        buf, x = None, np.empty((channels, frames), np.float32)
    block = np.empty((min(frames, 1 << 16), channels), np.float32)
    pos = 0
    while pos < frames:
        got = f.read(frames=min(len(block), frames - pos), dtype="float32", always_2d=True, out=block)
        if not len(got):
            break
        x[:, pos : pos + len(got)] = got.T
        pos += len(got)
    return (x, buf) if pos == frames else (x[:, :pos], None)


def _is_data_of(x: np.ndarray, npy: bytearray) -> bool:
    """Whether ``x`` is the data of the ``.npy`` file ``npy``: float32, contiguous, its bytes the file's last."""
    if x.dtype != np.float32 or not x.flags.c_contiguous or x.nbytes > len(npy):
        return False
    tail = np.frombuffer(npy, np.uint8, offset=len(npy) - x.nbytes)
    return x.__array_interface__["data"][0] == tail.__array_interface__["data"][0]


def decode_audio(data: bytes | str | Path, info: AudioInfo | None = None, max_samples: int = DEFAULT_MAX_SAMPLES,
                 seconds: float | None = None, npy: bool = False) -> AudioData:
    """Float32 (channels, samples) of audio bytes or a file (the first ``seconds`` only, where given);
    ValueError where they cannot be decoded, hold NaN or infinite samples, or more than ``max_samples``
    samples. With ``npy`` the samples are decoded into the data of a ``.npy`` file's bytes
    (``AudioData.npy``), which a ``.npy`` output of them then is, without a copy."""
    if info is None and isinstance(data, (str, Path)):  # a file: opened once for its facts and samples
        try:
            with _Source(data) as src, _sf_open(src) as f:
                info = _check(_info_of(f))
                if info.codec in ("mp3", "ogg", "opus"):  # (an MP3's frames walked first, an Ogg file's streams
                    raise _Counted  # counted: ``probe_audio``)
                if info.frames <= 0:
                    raise ValueError("no audio samples")
                frames = _frames_asked(info, seconds, max_samples)
                if frames:
                    x, buf = _read_into(f, frames, info.channels, npy)
                else:
                    x, buf = np.ascontiguousarray(f.read(dtype="float32", always_2d=True).T), None
            short = file_shortfall(data, info.frames) if seconds is None else None
            if short is None and frames and x.shape[1] < frames:
                short = f"decoded {x.shape[1]:,} samples a channel where the header counts {frames:,}: it is cut short"
            if short is not None:
                raise ValueError(short)
            return _checked(x, info)._replace(npy=buf)
        except ValueError:
            raise
        except Exception:  # noqa: BLE001 - not for libsndfile (m4a...), or damaged: the path below says which
            info = None
    info = info or probe_audio(data)
    frames = _frames_asked(info, seconds, max_samples)
    buf = None
    if info.reader == "soundfile":
        try:
            with _Source(data) as src, _sf_open(src) as f:
                if frames:
                    x, buf = _read_into(f, frames, info.channels, npy)
                else:
                    x = np.ascontiguousarray(f.read(dtype="float32", always_2d=True).T)
        except Exception as e:  # noqa: BLE001 - libsndfile's errors (a corrupt FLAC frame...)
            raise ValueError(f"cannot decode: {str(e).splitlines()[0][:160]}") from None
        if frames and x.shape[1] < frames:
            raise ValueError(f"decoded {x.shape[1]:,} samples a channel where the header counts {frames:,}: the file "
                             "is cut short")
    else:
        x = _decode_av(data if isinstance(data, bytes) else Path(data).read_bytes(), info, frames)
    return _checked(x, info)._replace(npy=buf)


def _frames_asked(info: AudioInfo, seconds: float | None, max_samples: int) -> int:
    """Samples a channel to decode (the first ``seconds`` where given), within the bound on one record."""
    frames = info.frames
    if seconds is not None and seconds > 0:
        frames = min(frames, int(np.ceil(seconds * info.rate))) if frames else int(np.ceil(seconds * info.rate))
    if max_samples and frames * info.channels > max_samples:
        raise ValueError(f"{info.duration / 3600:.1f} h of {info.channels}-channel audio ({frames * info.channels:,} "
                         f"samples) is above the {max_samples:,}-sample bound on one record")
    return frames


def _checked(x: np.ndarray, info: AudioInfo) -> AudioData:
    """Decoded samples, refused where there are none or some are NaN or infinite."""
    if x.shape[-1] == 0:
        raise ValueError("no audio samples decoded")
    if not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise ValueError(f"{bad:,} NaN or infinite samples")
    return AudioData(x, info.rate, bits=24 if info.bits >= 24 else 16)


#: samples a channel a decode through PyAV may fall short of its header's count by (AAC's priming and padding)
_AV_SLACK = 4096
#: how packets of no sound begin, which a decoder refuses in an MP3 stream: ID3v2, ID3v1 and APE tags (MP3 files
#: joined one after another keep each file's)
_TAGS = (b"ID3", b"TAG", b"APE")


def _decode_av(data: bytes, info: AudioInfo, frames: int) -> np.ndarray:
    if info.reader == "chains":
        return _decode_chains(data, info, frames)
    from .video_probe import _why, av

    a = av("audio that libsndfile does not read (m4a/AAC, or a file it refuses)")
    chunks = []
    got = 0
    error = None  # (the first packet of sound the decoder refused: a damaged frame)
    try:
        with a.open(io.BytesIO(data), mode="r") as c:
            s = c.streams.audio[0]
            fmt = a.AudioResampler(format="fltp", layout=s.codec_context.layout, rate=info.rate)
            for packet in c.demux(s):
                try:
                    decoded = packet.decode()
                except a.FFmpegError as e:  # (the packets after it are still decoded: what it cost is counted)
                    if bytes(packet)[:3] not in _TAGS:  # (the tags of MP3 files joined one after another: no sound)
                        error = error or e
                    continue
                for frame in decoded:
                    for f in fmt.resample(frame):
                        arr = f.to_ndarray().astype(np.float32, copy=False)
                        chunks.append(arr)
                        got += arr.shape[-1]
                if frames and got >= frames:
                    break
    except a.FFmpegError as e:  # (the demuxer's: the stream breaks off)
        if not chunks:
            raise ValueError(f"cannot decode: {_why(e)}") from None
        error = error or e
    if not chunks:
        raise ValueError("no audio samples decoded" + (f" ({_why(error)})" if error is not None else ""))
    x = np.concatenate(chunks, axis=-1)
    want = min(frames or info.frames, info.frames)  # (what the header counts, as far as asked; 0 where it says none)
    if error is not None or x.shape[1] < want - _AV_SLACK:  # (a damaged frame the decoder refused, or a stretch it
        # passed over, short by more than an AAC track's priming)
        said = f"the header counts {want:,}" if want else "the stream breaks off"
        raise ValueError(f"decoded {x.shape[1]:,} samples a channel where {said}{f' ({_why(error)})' if error else ''}: "
                         "the file is damaged or cut short")
    return np.ascontiguousarray(x[:, :frames] if frames else x)


def encode_audio(audio: AudioData, fmt: str, bits: int = 16) -> tuple[bytes, str]:
    """(bytes, codec) of ``audio`` as ``fmt``: FLAC or WAV (PCM of ``bits``, 16 or 24; samples beyond
    +-1 clipped), or ``.npy``: float32 samples ((samples,) for mono, else (channels, samples)) or
    float16 features ((bins, frames) for mono, else (channels, bins, frames))."""
    x = np.asarray(audio.samples)
    if audio.features or fmt == "npy":
        if audio.npy is not None and not audio.features and _is_data_of(x, audio.npy):
            return audio.npy, "npy"  # decoded in place, and nothing since made other samples: the file is made
        arr = np.ascontiguousarray(x, np.float16 if audio.features else np.float32)  # (no copy where it is so)
        if arr.shape[0] == 1:
            arr = arr[0]
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(arr))
        return b"".join((head.getvalue(), memoryview(arr).cast("B"))), "npy"  # one allocation, one copy
    sf = soundfile()
    buf = io.BytesIO()
    subtype = "PCM_24" if bits >= 24 else "PCM_16"
    sf.write(buf, np.clip(x, -1.0, 1.0).T, int(audio.rate), format=fmt.upper(), subtype=subtype)
    return buf.getvalue(), fmt


#: how far past a recording's end a segment's end may lie and still be taken as running to the end
#: (NeMo manifests round durations)
SEGMENT_SLACK = 0.05


def cut_audio(data: bytes, info: AudioInfo, start: float, end: float) -> tuple[bytes, str]:
    """(bytes, codec) of the stretch ``start``..``end`` seconds of an audio file, decoded from there
    (libsndfile seeks; PyAV decodes up to ``end``) and written as WAV or FLAC of the source's own
    sample coding: a WAV or FLAC segment holds exactly the source's samples. Other codecs (decoded
    already) become FLAC of 16 or 24 bits. ValueError where the stretch lies outside the recording."""
    if not (0 <= start < end) or start >= info.duration:
        raise ValueError(f"the segment {start:g}-{end:g} s lies outside the recording ({info.duration:g} s)")
    if end > info.duration + SEGMENT_SLACK:
        raise ValueError(f"the segment ends at {end:g} s, past the recording's end at {info.duration:g} s")
    a = int(round(start * info.rate))
    b = min(int(round(end * info.rate)), info.frames) if info.frames else int(round(end * info.rate))
    sf = soundfile()
    if info.reader == "soundfile":
        native = {"PCM_16": "int16", "PCM_S8": "int16", "PCM_U8": "int16", "PCM_24": "int32", "PCM_32": "int32",
                  "DOUBLE": "float64"}.get(info.subtype, "float32")
        try:
            with _Source(data) as src, _sf_open(src) as f:
                f.seek(a)
                x = f.read(frames=b - a, dtype=native, always_2d=True)
        except Exception as e:  # noqa: BLE001 - libsndfile's errors (a corrupt frame in the stretch)
            raise ValueError(f"cannot decode the segment: {str(e).splitlines()[0][:160]}") from None
        fmt = info.codec if info.codec in ("wav", "flac") else "flac"
        subtype = info.subtype if fmt == info.codec and info.subtype in sf.available_subtypes(fmt.upper()) else None
        if subtype is None:
            subtype = "PCM_24" if info.bits >= 24 or native.startswith("float") else "PCM_16"
            x = x.astype(np.float32) / (32768.0 if native == "int16" else 2.0**31) if native.startswith("int") else x
    else:
        x = _decode_av(data, info, b)[:, a:b].T
        fmt, subtype = "flac", "PCM_16"
    if not len(x):
        raise ValueError(f"no audio samples in the segment {start:g}-{end:g} s")
    buf = io.BytesIO()
    sf.write(buf, np.clip(x, -1.0, 1.0) if x.dtype.kind == "f" else x, int(info.rate), format=fmt.upper(),
             subtype=subtype)
    return buf.getvalue(), fmt


def leading_seconds(ops: Any) -> float | None:
    """Seconds of audio a chain reads at most (a leading fixed duration), so that a long file is decoded
    only that far; None for the whole file."""
    for op in ops:
        if op.name == "fix_duration":
            return None if op.pad == "repeat" else float(op.seconds)
        if op.name not in ("mono",):
            return None
    return None


def npy_header(data: bytes) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of ``.npy`` bytes, from their header; ValueError where they are no .npy."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)  # the header alone, no data read
    except Exception as e:  # noqa: BLE001 - not an array: the record's error
        raise ValueError(f"not a .npy array: {e}") from None
    return tuple(int(n) for n in shape), str(dtype)
