"""Small test clips made with PyAV (nothing binary committed): moving colour ramps, so that a frame
taken one index off differs clearly from the right one."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np


def frame(i: int, h: int, w: int) -> np.ndarray:
    """Frame ``i`` of a test clip: ramps moving a few levels per frame in every channel."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 3 + i * 5) % 256, (y * 4 + i * 3) % 256, ((x + y) * 2 + i * 7) % 256], -1).astype(np.uint8)


def make_clip(path: Path, frames: int = 48, w: int = 96, h: int = 64, codec: str = "libx264", fps: int = 24,
              gop: int = 12, bframes: int = 2, pix_fmt: str = "yuv420p", times: list[float] | None = None,
              faststart: bool = False, movflags: str = "") -> Path:
    """Write a clip; ``times`` (seconds per frame) makes a variable-frame-rate one; ``faststart`` puts an
    MP4's index (``moov``) before its frames, as streaming sites do; ``movflags`` FFmpeg's MP4 muxer's flags
    (``frag_keyframe+empty_moov``: a fragmented MP4, as live recorders write)."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = "+".join(f for f in ("faststart" if faststart else "", movflags) if f)
    with av.open(str(path), "w", options={"movflags": flags} if flags else {}) as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height, s.pix_fmt = w, h, pix_fmt
        if codec == "libx264":
            s.options = {"g": str(gop), "bf": str(bframes), "preset": "ultrafast" if not bframes else "veryfast"}
        elif codec == "libx265":
            s.options = {"x265-params": f"keyint={gop}:min-keyint={gop}:bframes={bframes}:log-level=error:"
                                         "pools=none:frame-threads=1"}  # (its thread pool: crashed once on 16 cores)
        elif codec in ("libvpx-vp9", "libsvtav1"):
            s.options = {"g": str(gop)} | ({"svtav1-params": f"keyint={gop}:scd=0"} if codec == "libsvtav1" else {})
        if times is not None:
            s.codec_context.time_base = Fraction(1, 1000)
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(frame(i, h, w), format="rgb24")
            if times is not None:
                f.pts, f.time_base = int(round(times[i] * 1000)), Fraction(1, 1000)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def make_clip_with_sound(path: Path, fmt: str, vcodec: str, acodec: str, frames: int = 24) -> Path:
    """A clip of ``frames`` frames at 24 fps with a sound track beside it (a tone), as cameras and phones write."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format=fmt) as c:
        v = c.add_stream(vcodec, rate=24)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        a = c.add_stream(acodec, rate=48000)
        a.layout = "stereo"
        for i in range(frames):
            f = av.VideoFrame.from_ndarray(frame(i, 48, 64), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 24)
            for p in v.encode(f):
                c.mux(p)
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(frames * 2000) / 48000)).astype(np.float32)
        f = av.AudioFrame.from_ndarray(np.stack([tone, tone]), format="fltp", layout="stereo")
        f.sample_rate, f.pts = 48000, 0
        for p in [*a.encode(f), *a.encode(None), *v.encode(None)]:
            c.mux(p)
    return path


def class_folders(root: Path) -> Path:
    """A UCF101-like dataset: two classes, four clips (H.264 and HEVC, 30-60 frames)."""
    make_clip(root / "jump" / "j1.mp4", 48)
    make_clip(root / "jump" / "j2.mp4", 30)
    make_clip(root / "walk" / "w1.mp4", 60, codec="libx265")
    make_clip(root / "walk" / "w2.mkv", 36)
    return root
