"""Video on the CPU, as the run flow uses it (:class:`~gpubatch.engine.media.Codec`): PyAV decodes the
frames a run's outputs take, seeking to the keyframe before them; clips are written as ``.npy``
arrays, image members or MP4 (libx264 through PyAV: Hopper GPUs have no video encoder).

A video record becomes its outputs through the run's sampler (:mod:`..ops.temporal`): frames (image
records), clips or the whole video re-encoded. :meth:`VideoHostCodec.decode` gives a
:class:`FrameCursor` that decodes forward lazily and keeps a frame only while an output still to come
takes it, so memory stays bounded however long the video; a damaged stretch ends the frames there,
the outputs before it go out and the ones after are their own errors.
"""

from __future__ import annotations

import functools
import io
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...errors import RecordError, Stage, UsageError
from ...types import Media, Record
from ..media import HOST, LOST, MediaSpec, RunPlan, get_codec, register_codec
from .video_probe import VideoInfo, _why, av, open_container, packets, probe
from .video_sound import _audio_stream, _mux_audio, audio_packets

__all__ = ["FrameCursor", "FrameStream", "VideoHostCodec", "encode_clip", "info_of", "outputs_of_video"]


def info_of(record: Record, plan: RunPlan | None = None) -> VideoInfo:
    """The record's :class:`VideoInfo`, probed once and kept on the record object (RecordError where the
    bytes are no video gpubatch can read)."""
    cached = getattr(record, "_video_info", None)
    if cached is not None:
        return cached
    try:
        info = probe(record.data, getattr(plan, "max_pixels", 0) or 0)
    except ValueError as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None
    except Exception as e:  # noqa: BLE001 - the record boundary: damaged bytes PyAV's objects trip over
        raise RecordError(record.key, record.origin, Stage.DECODE,
                          f"not a readable video (damaged?): {type(e).__name__}: {e}") from None
    object.__setattr__(record, "_video_info", info)
    return info


def outputs_of_video(record: Record, plan: Any) -> list[Record]:
    """The output templates ``record`` becomes under ``plan``'s sampler (the whole video without one)."""
    from ..ops.temporal import WholeVideo

    info = info_of(record, plan)
    if plan.sample is None and info.container == "npy":  # a decoded clip stays one, its frames transformed
        return [record.with_(data=b"", meta={**record.meta, "frames": list(range(info.frames))})]
    if info.cut_short and plan.sample is None:  # the whole video re-encoded: it would be written as if whole
        raise RecordError(record.key, record.origin, Stage.DECODE, info.cut_short)
    present = info.frames
    start, end = record.meta.get("start") or 0.0, record.meta.get("end") or 0.0
    try:
        info = info.extended().window(float(start), float(end))
    except (TypeError, ValueError) as e:
        raise RecordError(record.key, record.origin, Stage.DECODE, str(e)) from None  # (read, and counted, already)
    outs = (plan.sample or WholeVideo()).split(record, info, plan.seed)
    if present < info.offset + info.frames:  # a file cut short: the outputs that take a missing frame are lost
        why = info_of(record, plan).cut_short
        outs = [o.with_(meta={**o.meta, LOST: f"it takes frames past the end of the file: {why}"})
                if max(o.meta.get("frames") or [0]) >= present else o for o in outs]
    return outs



# FFmpeg's AVColorSpace values -> the matrix PyAV's reformatter names
_MATRIX = {1: "ITU709", 4: "FCC", 5: "ITU601", 6: "SMPTE170M", 7: "SMPTE240M", 9: "BT2020", 10: "BT2020"}


def colour_matrix(colorspace: int, height: int) -> str:
    """The YUV-to-RGB matrix of a frame: the one its stream signals, else BT.709 from 720 lines up and
    BT.601 below (what NVDEC and players assume), so the CPU and GPU paths give the same pixels."""
    return _MATRIX.get(int(colorspace or 2)) or ("ITU709" if height >= 720 else "ITU601")


class FrameCursor:
    """The decoded frames of one video, in presentation order, for outputs asked in turn.

    ``wanted`` lists each output's frame indices in the order outputs are asked for. Decoding starts
    at the keyframe before the first frame asked and goes forward; it seeks ahead where the next
    frame asked lies beyond the next keyframe, and back where an output asks for frames behind.
    A frame is kept until the last output that takes it has had it.
    """

    def __init__(self, data: bytes, info: VideoInfo, wanted: list[list[int]], key: str = "", origin: str = "",
                 threads: int = 0):
        self.data, self.info, self.key, self.origin = data, info, key, origin
        self.need: Counter = Counter(i for frames in wanted for i in set(frames))
        self.cache: dict[int, np.ndarray] = {}
        self.pos = -1  # the last frame index decoded
        self.broken: str | None = None  # why decoding stopped early, where it did
        self.threads = threads
        self._container = None
        self._frames: Iterator | None = None
        self._index = {int(p): i for i, p in enumerate(info.pts)}
        # (frames with no timestamp, placed by the probe on the grid of those with one: each takes the step after
        # the frame decoded before it)
        self._step = int(info.pts[1] - info.pts[0]) if info.placed and len(info.pts) > 1 else 0
        self._last: int | None = None
        self.decoded = 0

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None
            self._frames = None

    def _open(self) -> Any:
        if self._container is None:
            self._container = open_container(self.data)
            s = self._container.streams.video[0]
            s.thread_type = "AUTO"
            if self.threads:
                s.thread_count = self.threads
        return self._container

    def _seek(self, index: int) -> None:
        """Decoding placed at the keyframe before frame ``index``: the file read again from its start for the first
        keyframe, or where the demuxer's seeks to it and to keyframes before it all land past it (MPEG-TS and
        MPEG-PS seek by byte position and the timestamps read there: a seek to an H.264 TS file's first frame landed
        on its second keyframe, and every frame before it was "not decoded")."""
        k = self.info.keyframe_before(index)
        self._last = None
        keys, pts, reorder = self.info.keyframes, self.info.pts, self.info.reorder
        at = keys.index(k)  # (keyframe_before gives one of them)
        tries = [(int(pts[k]), k)] + ([(int(pts[k]) - reorder, k)] if reorder else []) + [
            (int(pts[keys[at - back]]) - reorder, keys[at - back]) for back in (1, 4) if at - back > 0]
        if not k or not any(self._seek_to(t, kk) for t, kk in tries):  # (its timestamp, then its decoding time: TS
            # and PS seek by the latter; then a keyframe or four before it, its frames decoded on to the one asked)
            self.close()
            c = self._open()
            self._frames = _decoded(c, c.streams.video[0], self.info.cut_pts)
            self.pos = -1

    def _seek_to(self, ts: int, k: int) -> bool:
        """The demuxer's seek to timestamp ``ts``, for keyframe ``k``; False where the demuxer refuses it, or the first
        frame decoded after it comes after ``k``, or none does."""
        c = self._open()
        s = c.streams.video[0]
        try:
            c.seek(ts, stream=s, backward=True, any_frame=False)
        except (av().FFmpegError, OSError):  # (FLV's demuxer refuses a timestamp before its first: EPERM)
            return False
        frames = _decoded(c, s, self.info.cut_pts)
        peeked: list[Any] = []
        error: Exception | None = None
        try:
            for frame in frames:
                peeked.append(frame)
                i = self._index.get(int(frame.pts)) if frame.pts is not None else None
                if i is not None:
                    if i > k:
                        return False
                    break
            else:  # (no frame after it: landed at the end)
                return False
        except (av().FFmpegError, ValueError) as e:  # (damage: met again, in turn, by _advance)
            error = e
        self._frames = _replayed(peeked, frames, error)
        self.pos = k - 1
        return True

    def _advance(self) -> tuple[int, Any] | None:
        """The next decoded frame (index, PyAV frame); None at the end or after damage."""
        a = av()
        while True:
            try:
                frame = next(self._frames)
            except StopIteration:
                return None
            except (a.FFmpegError, ValueError) as e:
                where = f"after frame {self.pos}" if self.pos >= 0 else "before its first frame"
                self.broken = f"damaged stream {where}: {_why(e)}"
                return None
            pts = frame.pts
            if pts is None and self._step and self._last is not None:
                pts = self._last + self._step
            self._last = int(pts) if pts is not None else None
            i = self._index.get(int(pts)) if pts is not None else None
            if i is None:
                continue
            return i, frame

    def _rgb(self, frame: Any) -> np.ndarray:
        rgb = frame.reformat(format="rgb24", src_colorspace=colour_matrix(frame.colorspace, frame.height),
                             src_color_range="JPEG" if frame.color_range == 2 else "MPEG").to_ndarray()
        rot = (getattr(frame, "rotation", 0) or 0) if self.info.rotation else 0
        k = int(round(rot / 90.0)) % 4
        return np.ascontiguousarray(np.rot90(rgb, k)) if k else rgb

    def frames(self, indices: list[int]) -> np.ndarray:
        """The frames ``indices`` as one uint8 (T, H, W, 3) array; RecordError naming what is missing."""
        asked = set(indices)
        if self.info.container == "npy":  # a decoded clip: its frames are the array's
            clip = np.load(io.BytesIO(self.data), allow_pickle=False)
            return np.ascontiguousarray(clip[list(indices)])
        for target in sorted(asked):
            if target in self.cache:
                continue
            if self.broken is None and (self._frames is None or target <= self.pos
                                        or self.info.keyframe_before(target) > self.pos + 1):
                self._seek(target)
            while self.broken is None and self.pos < target:
                got = self._advance()
                if got is None:
                    if self.broken is None:
                        self.broken = f"the stream ends before frame {target}"
                    break
                i, frame = got
                self.pos = max(self.pos, i)
                if (self.need.get(i) or i in asked) and i not in self.cache:
                    self.cache[i] = self._rgb(frame)
                    self.decoded += 1
            if target not in self.cache:
                raise RecordError(self.key, self.origin, Stage.DECODE, self.broken or f"frame {target} not decoded")
        out = np.stack([self.cache[i] for i in indices])
        for i in set(indices):
            self.need[i] -= 1
            if self.need[i] <= 0:
                self.cache.pop(i, None)
        return out


def _replayed(peeked: list[Any], rest: Iterator[Any], error: Exception | None) -> Iterator[Any]:
    """The frames ``peeked`` again, then ``error`` where one ended the peek, else the ``rest``."""
    yield from peeked
    if error is not None:
        raise error
    yield from rest


def _decoded(c: Any, s: Any, cut_pts: int | None = None) -> Iterator[Any]:
    """The frames of stream ``s`` of container ``c`` from where it stands, packets demuxed and decoded in
    turn. Where demuxing fails (the file ends inside a packet, or a damaged stretch) the frames the decoder
    still holds are flushed out before the end: PyAV 19 raises there, earlier versions stopped quietly. The
    packet a file cut short ends inside (its timestamp ``cut_pts``, as the probe told it) ends the stream
    before it is decoded: the decoder, handed its part, fails and loses the frames it holds. A packet that
    fails to decode raises (the stream is damaged from there)."""
    for packet in packets(c, s):
        if cut_pts is not None and (packet.pts if packet.pts is not None else packet.dts) == cut_pts:
            break
        yield from packet.decode()  # (a whole stream's last, empty packet flushes the decoder)
    try:
        yield from s.codec_context.decode(None)  # (a stream cut short: what the decoder holds)
    except av().FFmpegError:  # (flushed already)
        pass


class SourcedFrames:
    """Frames (any iterable) with the bytes of the video they came from (``source``), whose audio track a
    re-encoded video copies."""

    def __init__(self, frames: Any, source: bytes):
        self.frames, self.source = frames, source

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.frames)


class FrameStream:
    """A video's frames one at a time, in order (a whole video re-encoded: memory bounded)."""

    def __init__(self, cursor: FrameCursor, frames: list[int]):
        self.cursor, self.frames = cursor, frames
        self.hw = (cursor.info.height, cursor.info.width)
        self.source = cursor.data  # the video's bytes (its audio track is copied beside the frames)

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in self.frames:
            yield self.cursor.frames([i])[0]


def _encode_npy(clip: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(clip, np.uint8), allow_pickle=False)
    return buf.getvalue()


#: ``--video-codec`` names -> the CPU encoders of PyAV's FFmpeg
ENCODERS = {"h264": "libx264", "hevc": "libx265", "h265": "libx265", "av1": "libsvtav1", "vp9": "libvpx-vp9"}


# x264's names of the instruction sets below AVX-512 -> the flags /proc/cpuinfo gives for them
_X264_SETS = (("MMX2", "mmxext"), ("SSE", "sse"), ("SSE2", "sse2"), ("SSE3", "pni"), ("SSSE3", "ssse3"),
              ("SSE4.1", "sse4_1"), ("SSE4.2", "sse4_2"), ("AVX", "avx"), ("AVX2", "avx2"), ("FMA3", "fma"),
              ("LZCNT", "abm"), ("BMI1", "bmi1"), ("BMI2", "bmi2"))


@functools.lru_cache(maxsize=1)
def x264_asm() -> dict[str, str]:
    """libx264's options that keep it off AVX-512 where the CPU has it: there, identical frames were
    encoded to different bytes from run to run (seen on an AMD EPYC, x264 core 165; the AVX2 code is
    deterministic and 6% slower). The sets named are only those the CPU has (never one it lacks)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((ln for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return {}
    if "avx512f" not in flags:
        return {}
    sets = [name for name, flag in _X264_SETS if flag in flags or (flag == "mmxext" and "sse" in flags)]
    return {"x264-params": "asm=" + ",".join(sets)}


def encode_mp4(frames: Iterator[np.ndarray] | np.ndarray, fps: float, codec: str = "h264", crf: int = 23,
               audio_from: bytes | None = None, start: float = 0.0, end: float = 0.0) -> bytes:
    """Frames (uint8 HWC RGB, all one size) as an MP4 (H.264 through libx264 by default) on the CPU;
    with ``audio_from`` (the source video's bytes) its audio track is copied beside them, the stretch from
    ``start`` to ``end`` seconds (see :func:`encode_video`)."""
    return encode_video(frames, fps, codec, crf, audio_from, start, end)[0]


def encode_video(frames: Iterator[np.ndarray] | np.ndarray, fps: float, codec: str = "h264", crf: int = 23,
                 audio_from: bytes | None = None, start: float = 0.0, end: float = 0.0) -> tuple[bytes, str]:
    """:func:`encode_mp4`, and what became of the source's audio: the codec copied, "" where it has none,
    "dropped: why" (a codec MP4 does not hold) or "damaged ...: what" (copied in part or not at all:
    :func:`.video_sound.audio_packets` says what the damage cost)."""
    a = av()
    encoder = ENCODERS.get(codec, codec)
    buf = io.BytesIO()
    source, packets, short = (audio_packets(audio_from, start, end) if audio_from is not None else (None, [], ""))
    sound, said = None, ""
    with a.open(buf, mode="w", format="mp4") as out:
        stream = None
        from fractions import Fraction

        rate = Fraction(fps).limit_denominator(1001) if fps else Fraction(25)
        count = 0
        for rgb in frames:
            rgb = np.ascontiguousarray(rgb)
            if stream is None:
                stream = out.add_stream(encoder, rate=rate)
                stream.width, stream.height = rgb.shape[1] - rgb.shape[1] % 2, rgb.shape[0] - rgb.shape[0] % 2
                stream.pix_fmt = "yuv420p"
                # one encoder thread: the same frames give the same bytes on every run and machine (threaded
                # encodes differed between identical runs); a run encodes many clips side by side instead
                if encoder == "libx264":
                    stream.options = {"crf": str(crf), "preset": "veryfast", "threads": "1", **x264_asm()}
                elif encoder == "libx265":
                    stream.options = {"crf": str(crf), "preset": "veryfast",
                                      "x265-params": "pools=1:frame-threads=1:log-level=error"}
                elif encoder == "libvpx-vp9":
                    stream.options = {"threads": "1", "row-mt": "0"}
                stream.codec_context.thread_count = 1
                if source is not None:  # (every stream before the first packet: the header holds them)
                    sound, said = _audio_stream(out, source)
            if rgb.shape[0] != stream.height or rgb.shape[1] != stream.width:
                rgb = np.ascontiguousarray(rgb[: stream.height, : stream.width])
            frame = a.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = count, 1 / rate
            count += 1
            for packet in stream.encode(frame):
                out.mux(packet)
        if stream is None:
            raise ValueError("no frame to encode")
        for packet in stream.encode():
            out.mux(packet)
        if sound is not None:
            left = _mux_audio(out, sound, packets)
            lost = [short] if short else []
            if left:
                lost.append(f"{left} of its {len(packets)} packets refused by the muxer (damaged)")
            if lost:
                said = f"damaged and copied in part ({said}): " + "; ".join(lost)
    if source is not None:
        source[0].close()
    elif short:
        said = f"damaged and not copied: {short}"
    return buf.getvalue(), said


def check_video_encoder(codec: str) -> None:
    """Refuse, before any data moves, a video encoder this machine cannot open: a GPU (NVENC) encoder
    where the GPU has none (Hopper: H100, H200), or a codec PyAV's FFmpeg lacks."""
    a = av()
    name = ENCODERS.get(codec, codec)
    try:
        ctx = a.CodecContext.create(name, "w")
        ctx.width, ctx.height, ctx.pix_fmt = 64, 64, "yuv420p" if "nvenc" not in name else "nv12"
        from fractions import Fraction

        ctx.time_base = Fraction(1, 25)
        ctx.open()
    except Exception as e:  # noqa: BLE001 - any failure to open is the refusal's reason
        if "nvenc" in name:
            raise UsageError(f"--video-codec {codec}: no NVENC video encoder here ({str(e).split(':')[0]}); Hopper "
                             "GPUs (H100, H200) have none. Video is encoded on the CPU: pass --video-codec h264 "
                             "(or hevc, av1, vp9)") from None
        raise UsageError(f"--video-codec {codec}: this machine's FFmpeg (PyAV) cannot encode it ({e}); "
                         "supported: h264, hevc, av1, vp9") from None


def encode_clip(data: Any, record: Record, plan: Any) -> Record:
    """A clip output's record from its transformed frames ((T, H, W, 3) uint8, or frames one by one
    for a whole video), in the clip's format (its template's codec)."""
    fmt = record.codec
    try:
        if fmt == "npy":
            return record.with_(data=_encode_npy(data), codec="npy")
        if fmt == "mp4":
            sampler = plan.sample
            codec = getattr(sampler, "codec", "h264")
            fps = float(record.meta.get("fps") or 25.0)
            source = getattr(data, "source", None) if "frames_in" in record.meta else None  # a whole video
            start, end = record.meta.get("window") or (0.0, 0.0)
            out, sound = encode_video(data, fps, codec, getattr(sampler, "crf", 23), source, start, end)
            meta = {**record.meta, "audio": sound} if sound else record.meta
            return record.with_(data=out, codec="mp4", meta=meta)
        if fmt in ("jpeg", "png"):  # one image member per frame: <key>.0000.jpg ...
            from .image import encode as encode_image

            return clip_members(record, [encode_image(np.ascontiguousarray(f), fmt, plan.jpeg_quality) for f in data],
                                fmt)
    except RecordError:
        raise
    except Exception as e:  # noqa: BLE001 - the record boundary
        raise RecordError(record.key, record.origin, Stage.ENCODE, f"{type(e).__name__}: {e}") from None
    raise RecordError(record.key, record.origin, Stage.ENCODE, f"unknown clip format {fmt!r}")


def clip_members(record: Record, encoded: list[bytes], codec: str) -> Record:
    """A clip written as images: the first frame the record's image, the others members ``0001.jpg``..."""
    import base64

    ext = "jpg" if codec == "jpeg" else codec
    members = {f"{i:04d}.{ext}": {"base64": base64.b64encode(b).decode("ascii")} for i, b in enumerate(encoded[1:], 1)}
    return record.with_(data=encoded[0], codec=codec, media=Media.IMAGE,
                        meta={**record.meta, "members": {**(record.meta.get("members") or {}), **members}})


class VideoHostCodec:
    """Video on the CPU. ``check`` probes the container (bytes that pass through untouched are a
    readable video); ``decode`` gives the :class:`FrameCursor` of the frames the outputs take;
    ``part`` one output's frames; ``encode`` an output's record (a frame as an image, a clip, a video)."""

    spec = MediaSpec("video", layout="FHWC")

    def check(self, record: Record, plan: RunPlan) -> Record:
        info = info_of(record, plan)
        if info.cut_short:  # passed through, a file cut short would be written as if whole
            raise RecordError(record.key, record.origin, Stage.DECODE, info.cut_short)
        return record if record.codec == info.container else record.with_(codec=info.container)

    def decode(self, record: Record, plan: Any, outputs: list[Record] | None = None) -> FrameCursor:
        if outputs is None:  # every output the plan makes of it (an augment run's variants too)
            outputs = [o for o, transform in plan.outputs(record) if transform and LOST not in o.meta]
        wanted = [list(o.meta.get("frames") or ()) for o in outputs]
        return FrameCursor(record.data, info_of(record, plan), wanted, record.key, record.origin)

    def part(self, decoded: FrameCursor, template: Record) -> Any:
        frames = list(template.meta.get("frames") or ())
        if template.media is Media.IMAGE and template.codec != "npy" and len(frames) == 1 and "frame" in template.meta:
            return decoded.frames(frames)[0]
        if template.codec == "mp4":  # the whole video, frame by frame (memory bounded)
            return FrameStream(decoded, frames)
        return decoded.frames(frames)

    def outputs(self, record: Record, plan: Any) -> list[Record]:
        return outputs_of_video(record, plan)

    def size(self, item: Any) -> tuple[int, int]:
        if isinstance(item, FrameStream):
            return item.hw
        return tuple(item.shape[-3:-1])  # type: ignore[return-value]

    def apply(self, fn: Callable[[np.ndarray], np.ndarray], item: Any) -> Any:
        """``fn`` (the chain with one clip's parameters) on every frame of ``item``."""
        if isinstance(item, np.ndarray) and item.ndim == 4:
            return np.stack([fn(f) for f in item]) if len(item) else item
        if isinstance(item, np.ndarray):
            return fn(item)
        frames = (fn(f) for f in item)
        return SourcedFrames(frames, item.source) if hasattr(item, "source") else frames

    def encode(self, data: Any, record: Record, plan: Any) -> Record:
        if record.media is Media.IMAGE and record.codec in ("jpeg", "png", "webp") and "frame" in record.meta:
            return get_codec("image", "*", HOST).encode(data, record, plan)
        return encode_clip(data, record, plan)


register_codec("video", "*", HOST, VideoHostCodec())
