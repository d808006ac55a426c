"""Audio bytes in and out: soundfile (libsndfile) reads WAV, FLAC, OGG Vorbis, Opus and MP3, PyAV what
libsndfile cannot (m4a/AAC); outputs are written as FLAC, WAV or ``.npy`` (float32 samples, or float16
features). The run flow's codec on top of these is :mod:`.audio`.

Decoded audio is an :class:`AudioData`: float32 samples (channels, samples) and their rate, or, after a
feature op, the features (bins, frames) per channel. The chain's parameters are drawn for the pair
``(sample rate, samples)`` of a waveform and ``(bins, frames)`` of features (:meth:`AudioHostCodec.size`):
the audio ops read them as such (:mod:`..ops.audio`).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...errors import DependencyError
from .container_end import W64_RIFF, adts_at, sound_end

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


def sniff_audio(data: bytes) -> str | None:
    """The codec of audio bytes from their first bytes (wav, flac, ogg/opus, mp3, aac, m4a, aiff, weba/mka, wma, and
    libsndfile's au, caf and w64), or None. Sound in WebM is named "weba" (the extension browsers give it), so that
    what gpubatch writes of it (a ``.weba`` file or member) reads back as audio, where ``.webm`` reads as video."""
    head = data[:64]
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "opus" if b"OpusHead" in head else "ogg"
    if adts_at(head):  # (AAC as a raw stream, .aac)
        return "aac"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[4:8] == b"ftyp":
        return "m4a"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # (Matroska's EBML header: an audio-only WebM, as yt-dlp writes, or .mka)
        return "weba" if b"webm" in head else "mka"
    if head[:16] == bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c"):  # (ASF's header object: .wma)
        return "wma"
    if head[:4] in (b".snd", b"dns."):  # (Sun/NeXT audio, big- or little-endian: GTZAN's .au files)
        return "au"
    if head[:4] == b"caff":  # (Apple's Core Audio Format)
        return "caf"
    if head[:16] == W64_RIFF:  # (Sony Wave64: a WAV of 64-bit sizes)
        return "w64"
    return None


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
    if data is not None:
        head = data[: max(1 << 16, id3_end(data[:10]) + 4096)]  # (an MP3's first frames after its tags, cover art and all)
        tail = data[-tail_bytes(data[:64]) :] if tail_bytes(data[:64]) else b""
        short = audio_shortfall(head, tail, len(data), info.frames)
    else:
        short = _file_shortfall(data_path, info.frames)
    if short is not None:  # (before the count of samples: a file cut inside its first pages may have none)
        raise ValueError(short)
    if info.frames <= 0:
        raise ValueError("no audio samples")
    return info


def _file_shortfall(path: str | Path, frames: int = 0) -> str | None:
    """:func:`audio_shortfall` of a file, reading its first and last bytes only."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        size = os.fstat(f.fileno()).st_size
        if len(head) < id3_end(head) + 64 <= 16 << 20:  # (an MP3's tags, cover art and all, longer than that)
            f.seek(0)
            head = f.read(id3_end(head) + 4096)
        n = tail_bytes(head)
        if n:
            f.seek(max(0, size - n))
        return audio_shortfall(head, f.read(n) if n else b"", size, frames)


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


def wav_shortfall(head: bytes, size: int) -> tuple[int, int] | None:
    """(bytes the WAV header's ``data`` chunk promises, bytes present) where a ``size``-byte file whose
    first bytes are ``head`` holds fewer than it promises (a file cut short: libsndfile reads what is
    there as if whole), else None. A stream's unknown length (0 or 0xFFFFFFFF, as a pipe writes it)
    and RF64 promise nothing."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(head):
        n = int.from_bytes(head[pos + 4 : pos + 8], "little")
        if head[pos : pos + 4] == b"data":
            have = size - pos - 8
            return (n, have) if 0 < n < 0xFFFFFFFF and have < n else None
        pos += 8 + n + (n & 1)
    return None


_FLAC_BLOCK = {1: 192, **{n: 576 << (n - 2) for n in range(2, 6)}, **{n: 256 << (n - 8) for n in range(8, 16)}}


def _crc8(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
        table.append(crc)
    return table


_CRC16 = _crc16_table()


def _crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ b]
    return crc


def _flac_frame_header(buf: bytes, p: int, fixed: int) -> tuple[int, int] | None:
    """(first sample, samples) of the FLAC frame whose header starts at ``buf[p]`` (its sync code, fields
    and CRC-8 checked), or None; ``fixed``: STREAMINFO's block size of a fixed-block stream."""
    if p + 6 > len(buf) or buf[p] != 0xFF or buf[p + 1] & 0xFE != 0xF8:
        return None
    variable = buf[p + 1] & 1
    code, rate_code = buf[p + 2] >> 4, buf[p + 2] & 0xF
    if code == 0 or rate_code == 15 or (buf[p + 3] >> 4) > 10 or buf[p + 3] & 1:
        return None
    q, first = p + 4, buf[p + 4]  # the frame or sample number, coded as UTF-8 is
    extra = next((n for n in range(7) if not first & (0x80 >> n)), 7)
    if extra == 1 or extra == 7:
        return None
    number = first & (0x7F >> extra) if extra else first
    for k in range(1, extra):
        if q + k >= len(buf) or buf[q + k] & 0xC0 != 0x80:
            return None
        number = number << 6 | (buf[q + k] & 0x3F)
    q += max(extra, 1)
    if code in (6, 7):
        size = (buf[q] if code == 6 else int.from_bytes(buf[q : q + 2], "big")) + 1
        q += code - 5
    else:
        size = _FLAC_BLOCK[code]
    q += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if q >= len(buf) or _crc8(buf[p:q]) != buf[q]:
        return None
    return (number if variable else number * fixed), size


def flac_shortfall(head: bytes, tail: bytes) -> str | None:
    """Why a FLAC file whose first bytes are ``head`` and last ``tail`` (at least its largest frame, as
    STREAMINFO gives it: :func:`tail_bytes`) is cut short, or None where its last frame is whole and ends
    at the last sample its STREAMINFO counts: a cheap check of the file's end (its last frame's header
    and CRC-16) that a pass-through makes instead of decoding the whole file."""
    if head[:4] != b"fLaC" or len(head) < 42 or head[4] & 0x7F != 0:
        return None
    info = head[8:42]
    fixed = int.from_bytes(info[0:2], "big") if info[0:2] == info[2:4] else 0
    total = int.from_bytes(info[13:18], "big") & ((1 << 36) - 1)
    if tail[-128:-125] == b"TAG":  # an ID3v1 tag after the audio
        tail = tail[:-128]
    rate = max(_flac_rate(info), 1)
    for p in range(len(tail) - 8, -1, -1):  # the last whole frame: a header whose frame ends the file
        if tail[p] != 0xFF:
            continue
        frame = _flac_frame_header(tail, p, fixed)
        if frame is None or _crc16(tail[p:-2]) != int.from_bytes(tail[-2:], "big"):
            continue
        end = frame[0] + frame[1]
        if total and end < total:
            return (f"the file ends after sample {end:,} of the {total:,} its header counts ({end / rate:.3f} of "
                    f"{total / rate:.3f} s): it is cut short")
        return None
    return "the file does not end with a whole FLAC frame: it is cut short (or damaged at its end)"


def tail_bytes(head: bytes) -> int:
    """How many of a file's last bytes :func:`audio_shortfall` reads, from its first bytes."""
    if head[:4] == b"fLaC" and len(head) >= 42:
        return (int.from_bytes(head[15:18], "big") or (1 << 20)) + 16 + 128
    if head[:4] == b"OggS":
        return 1 << 17  # (two pages of the largest size)
    if adts_at(head):
        return 1 << 15  # (four ADTS frames of the largest size)
    return 0


def audio_shortfall(head: bytes, tail: bytes, size: int, frames: int = 0) -> str | None:
    """Why an audio file (``size`` bytes, its first 64 KiB ``head``, its last :func:`tail_bytes` ``tail``)
    holds less than its header says, or None: a WAV whose ``data`` chunk runs past the file's end, a
    FLAC that stops before its last frame or last sample, an AIFF whose FORM chunk or a Matroska/WebM file whose
    Segment does, an AU, W64 or CAF file shorter than its header's sizes, an MP3 that holds fewer bytes of frames than
    its header frame counts, a WMA shorter than its ASF header's file size, an Ogg (Vorbis, Opus) or AAC (ADTS) file
    that ends inside its last page or frame, an Ogg file chained or whose ``frames`` fall short of its last page's."""
    kind = sniff_audio(head)
    short = wav_shortfall(head, size)
    if short is not None:
        want, have = short
        return f"the WAV header promises {want:,} bytes of samples, the file holds {have:,}: it is cut short"
    if kind == "aiff" and 8 + int.from_bytes(head[4:8], "big") > size:  # (its FORM chunk's size)
        return (f"the AIFF header promises {8 + int.from_bytes(head[4:8], 'big'):,} bytes, the file holds {size:,}: "
                "it is cut short")
    end = sound_end(head, kind)
    if end > size:
        return f"the {kind.upper()} header promises {end:,} bytes, the file holds {size:,}: it is cut short"
    from .container_end import declared_end, matroska_end, ogg_last_sample, tail_end

    if kind in ("weba", "mka"):
        end = matroska_end(head)
        if end > size:
            return f"its Matroska header promises {end:,} bytes, the file holds {size:,}: it is cut short"
    if kind == "wma":
        end, _ = declared_end(head, "wmv")
        if end > size:
            return f"its ASF header promises {end:,} bytes, the file holds {size:,}: it is cut short"
    if kind in ("ogg", "opus", "aac"):
        what = "Ogg page" if kind in ("ogg", "opus") else "AAC (ADTS) frame"
        end = tail_end(tail, size, "ogg" if kind in ("ogg", "opus") else "adts")
        if end > size:
            return f"its last {what} runs past the file's end ({end:,} bytes, the file holds {size:,}): it is cut short"
        if (last := ogg_last_sample(head, tail) if frames and kind != "aac" else None) == -1:
            return "a chained Ogg file (streams one after another): its first alone is read, the others' samples lost"
        if last is not None and last > frames + 1:
            return (f"its last Ogg page ends at sample {last:,}, {frames:,} can be read: it is damaged (pages that fail "
                    "their checksum were passed over)")
    short_mp3 = mp3_shortfall(head, size) if kind == "mp3" else None
    if short_mp3 is not None:
        want, have = short_mp3
        return f"the MP3's header frame counts {want:,} bytes of frames, the file holds {have:,}: it is cut short"
    return flac_shortfall(head, tail) if kind == "flac" else None


def id3_end(head: bytes) -> int:
    """Where the ID3v2 tag an MP3 begins with ends (its size is syncsafe; a footer adds 10 bytes), or 0."""
    if head[:3] != b"ID3" or len(head) < 10:
        return 0
    return 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10])) + (10 if head[5] & 0x10 else 0)


def mp3_shortfall(head: bytes, size: int) -> tuple[int, int] | None:
    """(bytes of frames an MP3's header frame counts, bytes from its first frame to the file's end) where a
    ``size``-byte file whose first bytes are ``head`` holds more than 1% fewer than that header frame (LAME's
    Xing/Info frame, or Fraunhofer's VBRI) counts: a file cut short, which decoders play to the cut without an
    error. None where it holds them, or has no such frame to tell by."""
    start = id3_end(head)
    if len(head) < start + 64 or head[start] != 0xFF or head[start + 1] & 0xE0 != 0xE0:
        return None
    version, layer, mono = (head[start + 1] >> 3) & 3, (head[start + 1] >> 1) & 3, (head[start + 3] >> 6) == 3
    if layer != 1 or version == 1:  # (Layer III only; version 1 is reserved)
        return None
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    at = start + 4 + side
    want = None
    if head[at : at + 4] in (b"Xing", b"Info"):
        flags = int.from_bytes(head[at + 4 : at + 8], "big")
        if flags & 2:
            p = at + 8 + (4 if flags & 1 else 0)
            want = int.from_bytes(head[p : p + 4], "big")
    elif head[start + 36 : start + 40] == b"VBRI":
        want = int.from_bytes(head[start + 46 : start + 50], "big")
    have = max(0, size - start)
    if not want or want - have <= want // 100:
        return None
    return want, have


def _flac_rate(streaminfo: bytes) -> int:
    return int.from_bytes(streaminfo[10:13], "big") >> 4


def _probe_av(data: bytes) -> AudioInfo:
    from .video_probe import INDEX_CUT, av, mp4_index_whole, sample_table, sniff_container

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
            rate = int(s.rate or s.codec_context.sample_rate or 0)
            # (a stream's ``frames`` counts packets, not samples)
            frames = int(round(float(s.duration * s.time_base) * rate)) if s.duration and s.time_base else 0
            if not frames and c.duration:
                frames = int(round(c.duration / 1_000_000 * rate))
            return AudioInfo(sniff_audio(data) or s.codec_context.name, s.codec_context.name, rate,
                             int(s.codec_context.channels or 0), frames, 0, "pyav")
    except a.FFmpegError as e:
        if sniff_container(data) in ("mp4", "mov", "3gp") and not mp4_index_whole(data):  # (an M4A cut before its
            # index at its end)
            raise ValueError(INDEX_CUT) from None
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
                if info.frames <= 0:
                    raise ValueError("no audio samples")
                frames = _frames_asked(info, seconds, max_samples)
                if frames:
                    x, buf = _read_into(f, frames, info.channels, npy)
                else:
                    x, buf = np.ascontiguousarray(f.read(dtype="float32", always_2d=True).T), None
            short = _file_shortfall(data, info.frames) if seconds is None else None
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


def _decode_av(data: bytes, info: AudioInfo, frames: int) -> np.ndarray:
    from .video_probe import _why, av

    a = av("audio that libsndfile does not read (m4a/AAC, or a file it refuses)")
    chunks = []
    got = 0
    error = None
    try:
        with a.open(io.BytesIO(data), mode="r") as c:
            s = c.streams.audio[0]
            fmt = a.AudioResampler(format="fltp", layout=s.codec_context.layout, rate=info.rate)
            for frame in c.decode(s):
                for f in fmt.resample(frame):
                    arr = f.to_ndarray().astype(np.float32, copy=False)
                    chunks.append(arr)
                    got += arr.shape[-1]
                if frames and got >= frames:
                    break
    except a.FFmpegError as e:
        if not chunks:
            raise ValueError(f"cannot decode: {_why(e)}") from None
        error = e
    if not chunks:
        raise ValueError("no audio samples decoded")
    x = np.concatenate(chunks, axis=-1)
    want = min(frames or info.frames, info.frames)  # (what the header counts, as far as asked; 0 where it says none)
    if (error is not None and not want) or x.shape[1] < want - _AV_SLACK:  # (a damaged stretch: stopped, or passed)
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
