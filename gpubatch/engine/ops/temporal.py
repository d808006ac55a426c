"""Which frames of a video become which outputs: frame samplers (``--frames every:N | fps:F | uniform:K |
keyframes``), clip samplers (``--clip-length T --clip-stride S --frame-step D``) and the temporal ops of
an augment chain (``clip``, ``random_clip``).

A sampler turns one video record into its output records before anything is decoded, from the
frame timestamps of :func:`~gpubatch.engine.codecs.video_probe.probe`: each output's template names
the frame indices it takes (``meta["frames"]``) and their timestamps. Random positions and frame-step
jitter are drawn per output key from the run's seed, so a run is reproducible and the CPU and GPU
paths take the same frames. Every decoder then decodes only the frames some output takes, starting
at the keyframe before them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ...errors import RecordError, Stage, UsageError
from ...types import Media, Record
from ..media import MediaSpec
from .base import Op, positive

FRAME_MODES = ("every", "fps", "uniform", "keyframes")
CLIP_POSITIONS = ("stride", "uniform", "random")
CLIP_FORMATS = ("npy", "jpeg", "png", "mp4")
# stream number of the temporal draws (record_rng): apart from the pixel ops' stream 0
_TEMPORAL_STREAM = 7


@dataclass(frozen=True)
class Sampler:
    """Base of the samplers: what a video record becomes (:meth:`split`)."""

    kind: ClassVar[str] = ""

    def split(self, record: Record, info: Any, seed: int) -> list[Record]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class FrameSampler(Sampler):
    """Single frames out of each video, each an image record keyed ``<video key>/<frame:06d>``.

    ``every:N`` takes frames 0, N, 2N...; ``fps:F`` the frame shown at each 1/F seconds (by timestamp,
    so variable frame rates are sampled evenly in time); ``uniform:K`` K frames spread evenly over the
    video (the middle of K equal parts); ``keyframes`` every keyframe.
    """

    mode: str = "every"
    value: float = 1
    image_codec: str = "jpeg"
    kind: ClassVar[str] = "frames"

    @staticmethod
    def parse(text: str, image_codec: str = "jpeg") -> FrameSampler:
        mode, _, value = str(text).strip().partition(":")
        mode = mode.strip().lower()
        if mode not in FRAME_MODES:
            raise UsageError(f"--frames {text!r}: give every:N, fps:F, uniform:K or keyframes")
        if mode == "keyframes":
            if value:
                raise UsageError(f"--frames {text!r}: keyframes takes no number")
            return FrameSampler("keyframes", 0, image_codec)
        try:
            v = float(value)
        except ValueError:
            raise UsageError(f"--frames {text!r}: {mode} needs a number ({mode}:N)") from None
        if not v > 0 or not math.isfinite(v) or (mode != "fps" and v != int(v)):
            raise UsageError(f"--frames {text!r}: {mode} needs a positive {'number' if mode == 'fps' else 'whole number'}")
        return FrameSampler(mode, v if mode == "fps" else int(v), image_codec)

    def indices(self, info: Any) -> list[int]:
        import numpy as np

        n = info.frames
        if self.mode == "every":
            return list(range(0, n, int(self.value)))
        if self.mode == "keyframes":
            return list(info.keyframes)
        if self.mode == "uniform":
            k = min(int(self.value), n)
            return sorted({min(n - 1, int((i + 0.5) * n / k)) for i in range(k)})
        # fps: the frame on show at t = 0, 1/F, 2/F... (the last whose timestamp is <= t), found per frame from
        # its own timestamps: frame i is taken where a time k/F falls within [its time, the next one's), so
        # one index per frame at most, however long the duration a damaged file claims
        f = float(self.value)
        times = np.asarray(info.times, np.float64)
        if not n:
            return []
        ends = np.append(times[1:] - 1e-6, max(float(info.duration), float(times[-1])))
        first = np.ceil((times - 1e-6) * f)  # the first time k/F at or after each frame's
        taken = (first / f < ends) | (np.arange(n) == 0)
        return [int(i) for i in np.flatnonzero(taken)]

    def split(self, record: Record, info: Any, seed: int) -> list[Record]:
        out = []
        stem = record.filename.rsplit(".", 1)[0]
        ext = "png" if self.image_codec == "png" else "jpg"
        for r in self.indices(info):
            i = r + info.offset
            meta = {"clip": record.key, "frame": i, "time": round(float(info.times[r] + info.t0), 6), "frames": [i],
                    "source": record.filename, "filename": f"{stem}_{i:06d}.{ext}"}
            out.append(record.with_(key=f"{record.key}/{i:06d}", media=Media.IMAGE, codec=self.image_codec, data=b"",
                                    meta=meta))
        return out

    def describe(self) -> str:
        return self.mode if self.mode == "keyframes" else f"{self.mode}:{self.value:g}"


@dataclass(frozen=True)
class ClipSampler(Sampler):
    """Clips of ``length`` frames ``step`` apart out of each video, keyed ``<video key>/<clip:04d>``.

    Positions: ``stride`` starts a clip every ``stride`` frames (by default ``length * step``: clips
    side by side); ``uniform`` spreads ``count`` clips evenly; ``random`` draws ``count`` starts (and,
    with ``step_jitter`` j, a frame step within step -/+ j per clip) from the run's seed and the clip's
    key. A video shorter than one clip is its own error. ``fmt`` is how a clip is written: ``npy``
    (one uint8 (T, H, W, 3) array), ``jpeg``/``png`` (one image member per frame) or ``mp4``.
    """

    length: int = 16
    step: int = 1
    stride: int | None = None
    positions: str = "stride"
    count: int | None = None
    step_jitter: int = 0
    fmt: str = "npy"
    codec: str = "h264"  # the video codec of mp4 clips
    crf: int = 23
    kind: ClassVar[str] = "clips"

    def __post_init__(self) -> None:
        positive("--clip-length", self.length)
        positive("--frame-step", self.step)
        if self.stride is not None:
            positive("--clip-stride", self.stride)
        if self.positions not in CLIP_POSITIONS:
            raise UsageError(f"unknown clip positions {self.positions!r}; supported: {', '.join(CLIP_POSITIONS)}")
        if self.count is not None:
            positive("--clips-per-video", self.count)
        if not isinstance(self.step_jitter, int) or self.step_jitter < 0 or self.step_jitter >= self.step + 64:
            raise UsageError(f"step_jitter must be a whole number >= 0, got {self.step_jitter!r}")
        if self.fmt not in CLIP_FORMATS:
            raise UsageError(f"unknown --clip-format {self.fmt!r}; supported: {', '.join(CLIP_FORMATS)}")

    def span(self, step: int | None = None) -> int:
        return 1 + (self.length - 1) * (step or self.step)

    def clips(self, info: Any, key: str, seed: int) -> list[list[int]]:
        """The frame indices of each clip of a video with ``info``'s frames (empty where it is too short)."""
        import numpy as np

        n = info.frames
        if self.positions == "random":
            from ..rng import record_rng

            out = []
            for k in range(self.count or 1):
                rng = record_rng(seed, f"{key}#{k}", _TEMPORAL_STREAM)
                step = self.step
                if self.step_jitter:
                    step = max(1, step + rng.integers(-self.step_jitter, self.step_jitter + 1))
                    while step > 1 and self.span(step) > n:
                        step -= 1
                span = self.span(step)
                if span > n:
                    return []
                start = rng.integers(0, n - span + 1)
                out.append(list(range(start, start + span, step)))
            return out
        span = self.span()
        if span > n:
            return []
        if self.positions == "uniform":
            k = self.count or 1
            starts = sorted({int(round(x)) for x in np.linspace(0, n - span, k)}) if k > 1 else [(n - span) // 2]
        else:
            starts = list(range(0, n - span + 1, self.stride or self.length * self.step))
            if self.count:
                starts = starts[: self.count]
        return [list(range(s, s + span, self.step)) for s in starts]

    def split(self, record: Record, info: Any, seed: int) -> list[Record]:
        clips = self.clips(info, record.key, seed)
        if not clips:
            raise RecordError(record.key, record.origin, Stage.DECODE,  # (read, and counted, already)
                              f"too short for one clip: {info.frames} frame{'s' * (info.frames != 1)}, a clip spans "
                              f"{self.span(max(1, self.step - self.step_jitter))}")
        single = len(clips) == 1 and self.positions == "random"
        out = []
        for k, rel in enumerate(clips):
            frames = [i + info.offset for i in rel]
            meta = {"clip": record.key, "frames": frames, "times": [round(float(info.times[i] + info.t0), 6) for i in rel],
                    "fps": round(info.fps, 4), "source": record.filename}
            key = record.key if single else f"{record.key}/{k:04d}"
            out.append(record.with_(key=key, media=Media.VIDEO, codec=self.fmt, data=b"", meta=meta))
        return out

    def describe(self) -> str:
        return (f"clips of {self.length} frames, step {self.step}, {self.positions}"
                + (f" x{self.count}" if self.count else "") + (f", jitter {self.step_jitter}" if self.step_jitter else ""))


@dataclass(frozen=True)
class WholeVideo(Sampler):
    """The whole video, re-encoded (``codec`` on the CPU through PyAV; ``fps``: a new frame rate)."""

    codec: str = "h264"
    fps: float | None = None
    crf: int = 23
    kind: ClassVar[str] = "video"

    def split(self, record: Record, info: Any, seed: int) -> list[Record]:
        rel = FrameSampler("fps", self.fps).indices(info) if self.fps else list(range(info.frames))
        idx = [i + info.offset for i in rel]
        meta = {"frames_in": info.frames, "fps": self.fps or info.fps, "source": record.filename,
                "frames": idx}
        if info.offset or info.t0:  # a stretch of the file (a file list's start and end): where it lies
            meta["window"] = [round(float(info.t0), 6), round(float(info.t0 + info.duration), 6)]
        return [record.with_(codec="mp4", data=b"", meta={**meta, **{k: v for k, v in record.meta.items()
                                                                      if k not in meta}})]

    def describe(self) -> str:
        return f"re-encode {self.codec}" + (f" at {self.fps:g} fps" if self.fps else "")


class TemporalOp(Op):
    """An augment chain's temporal op: which frames of each video a variant takes. It leads the chain
    and becomes the run's sampler (:attr:`~gpubatch.engine.plan.Plan.sample`); the pixel ops after it
    apply to every frame of the clip with the same drawn parameters."""

    media: ClassVar[tuple[str, ...]] = ("video",)
    kind: ClassVar[str] = "temporal"

    def out_spec(self, spec: MediaSpec) -> MediaSpec:
        super().out_spec(spec)
        return spec

    def sampler(self) -> ClipSampler:
        raise NotImplementedError


@dataclass(frozen=True)
class Clip(TemporalOp):
    """One clip of ``length`` frames ``step`` apart from the middle of each video."""

    length: int = 16
    step: int = 1
    name: ClassVar[str] = "clip"

    def __post_init__(self) -> None:
        positive("length", self.length)
        positive("step", self.step)

    def sampler(self) -> ClipSampler:
        return ClipSampler(self.length, self.step, positions="uniform", count=1)


@dataclass(frozen=True)
class RandomClip(TemporalOp):
    """One clip at a random position of each video, its frame step drawn within step -/+ step_jitter."""

    length: int = 16
    step: int = 1
    step_jitter: int = 0
    name: ClassVar[str] = "random_clip"
    random: ClassVar[bool] = True

    def __post_init__(self) -> None:
        positive("length", self.length)
        positive("step", self.step)
        if not isinstance(self.step_jitter, int) or self.step_jitter < 0:
            raise UsageError(f"step_jitter must be a whole number >= 0, got {self.step_jitter!r}")

    def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> Any:
        return None  # drawn by the sampler, per output key, before decoding

    def sampler(self) -> ClipSampler:
        return ClipSampler(self.length, self.step, positions="random", count=1, step_jitter=self.step_jitter)


def sampler_from_options(frames: str | None = None, clip_length: int | None = None, clip_stride: int | None = None,
                         frame_step: int | None = None, clip_positions: str | None = None,
                         clips_per_video: int | None = None, clip_format: str | None = None,
                         video_codec: str | None = None, fps: float | None = None,
                         image_format: str = "keep") -> Sampler | None:
    """The sampler ``convert``'s video options ask for (None: none given), checked before any data moves."""
    clip_only = {"--clip-stride": clip_stride, "--frame-step": frame_step, "--clip-positions": clip_positions,
                 "--clips-per-video": clips_per_video, "--clip-format": clip_format}
    if frames and clip_length:
        raise UsageError("--frames and --clip-length both pick frames: give one")
    if not clip_length and any(v is not None for v in clip_only.values()):
        given = next(k for k, v in clip_only.items() if v is not None)
        raise UsageError(f"{given} shapes clips: give --clip-length too")
    if fps is not None and not (fps > 0 and math.isfinite(fps)):
        raise UsageError(f"--fps must be a positive number, got {fps}")
    if frames:
        if video_codec or fps:
            raise UsageError("--video-codec and --fps shape videos; --frames writes images")
        return FrameSampler.parse(frames, "png" if image_format == "png" else "jpeg")
    if clip_length:
        fmt = clip_format or "npy"
        return ClipSampler(clip_length, frame_step or 1, clip_stride, clip_positions or "stride", clips_per_video, fmt=fmt,
                           codec=video_codec or "h264")
    if video_codec or fps:
        return WholeVideo(video_codec or "h264", fps)
    return None
