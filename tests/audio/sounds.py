"""Audio made in the tests (small, generated, never committed): tones and speech-like clips in every codec."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import soundfile as sf


def tone(seconds: float = 1.0, rate: int = 16000, freq: float = 440.0, channels: int = 1, amp: float = 0.5) -> np.ndarray:
    """(samples, channels) float32: a sine per channel (channel k at freq * (k + 1))."""
    t = np.arange(int(seconds * rate)) / rate
    return np.stack([amp * np.sin(2 * np.pi * freq * (k + 1) * t) for k in range(channels)], 1).astype(np.float32)


def encoded(x: np.ndarray, rate: int, fmt: str = "wav", subtype: str | None = None) -> bytes:
    """``x`` (samples, channels) as ``fmt`` bytes: wav/flac/ogg/mp3/au/caf/w64 through soundfile (``subtype`` OPUS:
    Ogg Opus), m4a (AAC), aac (AAC as ADTS, a raw stream) and wma through PyAV."""
    if fmt in ("m4a", "aac", "wma"):
        import av

        buf = io.BytesIO()
        with av.open(buf, "w", format={"m4a": "mp4", "aac": "adts", "wma": "asf"}[fmt]) as c:
            s = c.add_stream("wmav2" if fmt == "wma" else "aac", rate=rate)
            s.layout = "mono" if x.shape[1] == 1 else "stereo"
            if fmt == "wma":
                s.bit_rate = 64000
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x.T), format="fltp", layout=s.layout)
            frame.sample_rate = rate
            for p in s.encode(frame):
                c.mux(p)
            for p in s.encode():
                c.mux(p)
        return buf.getvalue()
    buf = io.BytesIO()
    kind = {"wav": "WAV", "flac": "FLAC", "ogg": "OGG", "mp3": "MP3", "au": "AU", "caf": "CAF", "w64": "W64"}[fmt]
    default = {"ogg": "VORBIS", "mp3": "MPEG_LAYER_III"}.get(fmt, "PCM_16")
    sf.write(buf, x, rate, format=kind, subtype=subtype or default)
    return buf.getvalue()


def write(path: Path, x: np.ndarray, rate: int, fmt: str | None = None, subtype: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encoded(x, rate, fmt or path.suffix[1:], subtype))
    return path


def speech_commands(root: Path, words=("yes", "no", "up"), per_word: int = 2, rate: int = 16000) -> Path:
    """Speech Commands' layout: root/<word>/<clip>.wav, with a _background_noise_ folder left out."""
    rng = np.random.default_rng(0)
    for i, w in enumerate(words):
        for k in range(per_word):
            write(root / w / f"{k:04d}_nohash_0.wav", tone(0.5 + 0.1 * k, rate, 200 + 100 * i), rate)
    write(root / "_background_noise_" / "white.wav", rng.normal(0, 0.1, (rate, 1)).astype(np.float32), rate)
    return root


def fragmented_m4a(path: Path, x: np.ndarray, rate: int = 16000) -> Path:
    """Mono samples ``x`` as AAC in a fragmented MP4 (``moof`` boxes every half second, FFmpeg's index of them,
    ``mfra``, last), as live recorders write."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4", options={"movflags": "frag_keyframe+empty_moov",
                                                        "frag_duration": "500000"}) as c:
        s = c.add_stream("aac", rate=rate)
        s.layout = "mono"
        for i in range(0, len(x), 1024):
            f = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[None, i : i + 1024]), format="fltp", layout="mono")
            f.sample_rate, f.pts = rate, i
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path
