"""Where a sound file ends, told from its bytes before any sample is decoded: its codec from its first bytes
(:func:`sniff_audio`), and whether it holds less than its header says (:func:`audio_shortfall`): a WAV whose
``data`` chunk, an AIFF, AU, W64, CAF, Matroska or ASF file whose sizes run past the file's end, a FLAC that stops
before its last frame or sample (its last frame's header and CRC-16 read), an MP3 shorter than its header frame
counts, an Ogg or ADTS file that ends inside its last page or frame, an Ogg file chained or holding fewer samples
than its last page places. :mod:`.audio_io` reads and writes the samples; :mod:`.container_end` walks the
containers' ends.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .container_end import W64_RIFF, adts_at, sound_end


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


def file_shortfall(path: str | Path, frames: int = 0) -> str | None:
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


def ogg_chained(data: bytes | str | Path) -> bool:
    """Whether an Ogg file (bytes, or a file: its first and last bytes read) is chained: its last page belongs to
    another logical stream than its first."""
    from .container_end import ogg_last_sample

    if isinstance(data, (bytes, bytearray, memoryview)):
        n = tail_bytes(bytes(data[:64]))
        return ogg_last_sample(bytes(data[: 1 << 16]), bytes(data[-n:]) if n else b"") == -1
    with open(data, "rb") as f:
        head = f.read(1 << 16)
        n = tail_bytes(head)
        f.seek(max(0, os.fstat(f.fileno()).st_size - n))
        return ogg_last_sample(head, f.read(n) if n else b"") == -1


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
    that ends inside its last page or frame, an Ogg file whose last page does not end its stream (cut between two
    pages), an Ogg file chained or whose ``frames`` fall short of its last page's."""
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
        pages: list[int] = []
        end = tail_end(tail, size, "ogg" if kind in ("ogg", "opus") else "adts", pages)
        if end > size:
            return f"its last {what} runs past the file's end ({end:,} bytes, the file holds {size:,}): it is cut short"
        if kind != "aac" and end == size and pages and not tail[pages[-1] + 5] & 0x04:  # (its header type's flags)
            return ("its last Ogg page does not end its stream (no end-of-stream flag, which every Ogg stream's last "
                    "page carries): it is cut short between two pages, or its writer stopped")
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


def _first_frame(head: bytes) -> tuple[int, int, int] | None:
    """(where an MP3's first frame begins, where its side information ends: a Xing/Info header's place, samples a
    frame), or None where the first frame is no Layer III frame."""
    start = id3_end(head)
    if len(head) < start + 64 or head[start] != 0xFF or head[start + 1] & 0xE0 != 0xE0:
        return None
    version, layer, mono = (head[start + 1] >> 3) & 3, (head[start + 1] >> 1) & 3, (head[start + 3] >> 6) == 3
    if layer != 1 or version == 1:  # (Layer III only; version 1 is reserved)
        return None
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    return start, start + 4 + side, 1152 if version == 3 else 576


def mp3_counts(head: bytes) -> tuple[int, int, int, int] | None:
    """(where an MP3's first frame begins, the frames and the bytes its header frame counts, samples a frame) from
    its first bytes ``head``: LAME's Xing/Info frame or Fraunhofer's VBRI (a count it lacks is 0). None where the
    first frame is no Layer III header frame."""
    first = _first_frame(head)
    if first is None:
        return None
    start, at, per = first
    if head[at : at + 4] in (b"Xing", b"Info"):
        flags = int.from_bytes(head[at + 4 : at + 8], "big")
        frames = int.from_bytes(head[at + 8 : at + 12], "big") if flags & 1 else 0
        p = at + 8 + (4 if flags & 1 else 0)
        return start, frames, int.from_bytes(head[p : p + 4], "big") if flags & 2 else 0, per
    if head[start + 36 : start + 40] == b"VBRI":
        return (start, int.from_bytes(head[start + 50 : start + 54], "big"),
                int.from_bytes(head[start + 46 : start + 50], "big"), per)
    return None


def _crc16_arc_table() -> tuple[int, ...]:
    out = []
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ 0xA001 if n & 1 else n >> 1
        out.append(n)
    return tuple(out)


_CRC16_ARC = _crc16_arc_table()


def lame_tag_damage(head: bytes) -> str:
    """What a damaged LAME tag in an MP3's Xing/Info frame (its first bytes ``head``) costs, or "". The tag (LAME's
    since 3.90, FFmpeg's ``Lavc``/``Lavf``) gives the encoder's delay and padding, which decoders trim from the
    file's two ends, and ends with a CRC-16 of the frame up to it: a damaged delay or padding trims samples of the
    recording, or keeps padding, with no error from any decoder (a byte flip of 2026-12-07 trimmed 85 samples)."""
    first = _first_frame(head)
    if first is None:
        return ""
    start, at, _ = first
    if head[at : at + 4] not in (b"Xing", b"Info"):
        return ""
    flags = int.from_bytes(head[at + 4 : at + 8], "big")
    tag = at + 8 + 4 * bool(flags & 1) + 4 * bool(flags & 2) + 100 * bool(flags & 4) + 4 * bool(flags & 8)
    lame = re.match(rb"LAME(\d)\.(\d+)", head[tag : tag + 9])
    if len(head) < tag + 36 or not (head[tag : tag + 4] in (b"Lavc", b"Lavf") or
                                    (lame and (int(lame[1]), int(lame[2])) >= (3, 90))):
        return ""  # (no tag, or a LAME before 3.90, whose tag held no CRC)
    crc = 0
    for b in head[start : tag + 34]:  # (CRC-16/ARC: the polynomial 0x8005 reflected, from 0; a byte a lookup)
        crc = (crc >> 8) ^ _CRC16_ARC[(crc ^ b) & 0xFF]
    if crc == int.from_bytes(head[tag + 34 : tag + 36], "big"):
        return ""
    trims = int.from_bytes(head[tag + 21 : tag + 24], "big")
    return (f"its MP3 LAME tag is damaged (its CRC does not match): the encoder delay and padding it gives ({trims >> 12} "
            f"and {trims & 0xFFF} samples), which decoders trim from the file's ends, may be wrong, so a few of its "
            "samples may be lost or padding kept")


def mp3_shortfall(head: bytes, size: int) -> tuple[int, int] | None:
    """(bytes of frames an MP3's header frame counts, bytes from its first frame to the file's end) where a
    ``size``-byte file whose first bytes are ``head`` holds more than 1% fewer than that header frame (LAME's
    Xing/Info frame, or Fraunhofer's VBRI) counts: a file cut short, which decoders play to the cut without an
    error. None where it holds them, or has no such frame to tell by."""
    counts = mp3_counts(head)
    if counts is None:
        return None
    start, _, want, _ = counts
    have = max(0, size - start)
    if not want or want - have <= want // 100:
        return None
    return want, have


def mp3_count(data: bytes, counted: int) -> tuple[int, bool]:
    """(the samples a channel an MP3 holds, whether PyAV reads it) against ``counted``, libsndfile's count. Where its
    header frame's counts agree with ``counted`` and with the file's size, ``counted``, and its frames are not
    walked. Where its Layer III frames, walked, hold more than ``counted`` and the encoder's delay (MP3 files joined
    one after another, of which libsndfile counts the first; a damaged header frame; a VBR file with no header
    frame, whose count libsndfile guesses from the first frame's rate), those, read through PyAV. Where it has no
    header frame, the frames walked: libsndfile's count is a guess from the file's size then. ValueError where the
    walk passes over a stretch between frames that is no tag (damage: the decoders pass over it with no error)."""
    slack = 3 * 1152
    counts = mp3_counts(data[: id3_end(data[:10]) + 4096])
    if counts is not None:
        start, frames, nbytes, per = counts
        have = len(data) - start - (128 if data[-128:-125] == b"TAG" else 0)
        if frames and nbytes and abs(frames * per - counted) <= slack and abs(have - nbytes) <= nbytes // 100:
            return counted, False
    damaged: list[tuple[int, int]] = []
    held = mp3_samples(data, damaged)
    if damaged:  # (decoders pass over it with no error, its samples gone)
        (at, n), more = damaged[0], len(damaged) - 1
        raise ValueError(f"the MP3 is damaged: {n:,} bytes at byte {at:,} hold no frame"
                         + (f" (and {more} more such stretch{'es' * (more > 1)})" if more else "")
                         + ", and the samples of the frames there are lost")
    if held - counted > slack:
        return held, True
    return (held, False) if held and (counts is None or not counts[1]) else (counted, False)


_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # (by version)
_MP3_KBPS = {3: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}


def _mp3_frame(data: bytes, at: int, like: int | None = None) -> int:
    """The length of the Layer III frame whose header is at ``at`` (of the same version and rate as the header
    ``like``, where given), or 0."""
    if at + 4 > len(data) or data[at] != 0xFF or data[at + 1] & 0xE6 != 0xE2:  # (sync, Layer III)
        return 0
    version, rate_i, kbps_i = (data[at + 1] >> 3) & 3, (data[at + 2] >> 2) & 3, data[at + 2] >> 4
    if version == 1 or rate_i == 3 or kbps_i in (0, 15):
        return 0
    if like is not None and (data[at + 1] & 0xFE, data[at + 2] & 0x0C) != like:
        return 0
    rate, kbps = _MP3_RATES[version][rate_i], _MP3_KBPS[3 if version == 3 else 2][kbps_i]
    return (144 if version == 3 else 72) * kbps * 1000 // rate + ((data[at + 2] >> 1) & 1)


def _mp3_chained(data: bytes, at: int, like: tuple[int, int], end: int) -> bool:
    n = _mp3_frame(data, at, like)
    return bool(n) and (at + n >= end or bool(_mp3_frame(data, at + n, like)))


def mp3_samples(data: bytes, damaged: list[tuple[int, int]] | None = None) -> int:
    """The samples a channel an MP3's Layer III frames hold, walked from the first to the last (a damaged stretch
    passed over to the next frame of the same kind, and noted in ``damaged`` as (where, bytes) where given: not the
    tags of MP3 files joined one after another; the Xing/Info/VBRI header frame not counted; no encoder delay taken
    off); 0 where no frame is found."""
    at = id3_end(data[:10])
    if not _mp3_frame(data, at):
        return 0
    like = (data[at + 1] & 0xFE, data[at + 2] & 0x0C)
    per = 1152 if (data[at + 1] >> 3) & 3 == 3 else 576
    side = (17 if data[at + 3] >> 6 == 3 else 32) if per == 1152 else (9 if data[at + 3] >> 6 == 3 else 17)
    frames = -(data[at + 4 + side : at + 8 + side] in (b"Xing", b"Info") or data[at + 36 : at + 40] == b"VBRI")
    end = len(data) - (128 if data[-128:-125] == b"TAG" else 0)
    while at < end:
        n = _mp3_frame(data, at, like)
        if n and at + n <= end:
            frames += 1
            at += n
            continue
        if n:  # (the last frame, cut: no whole frame)
            break
        start, tag = at, data[at : at + 3] in (b"ID3", b"TAG") or data[at : at + 8] == b"APETAGEX"
        at = data.find(b"\xff", at + 1, end)  # (a damaged stretch: to the next header of the same kind that
        while at >= 0 and not _mp3_chained(data, at, like, end):  # another follows, or the end)
            at = data.find(b"\xff", at + 1, end)
        if at < 0:
            break
        if damaged is not None and not tag:  # (frames follow it: a stretch of frames lost, not the file's tail)
            damaged.append((start, at - start))
    return max(frames, 0) * per


def _flac_rate(streaminfo: bytes) -> int:
    return int.from_bytes(streaminfo[10:13], "big") >> 4
