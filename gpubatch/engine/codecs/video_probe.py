"""What a video file holds, read without decoding a frame: its container and stream facts, and every
frame's presentation timestamp and keyframe flag (one pass of the demuxer, packets only).

Frame ``i`` of a video is the ``i``-th frame in presentation order: the rank of its packet's
timestamp among the stream's. Both decode paths (PyAV on the CPU, NVDEC on the GPU) and every sampler
use these indices and timestamps, so the same clip is the same frames whatever decodes it, and a
variable-frame-rate file is sampled by its real timestamps.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...errors import DependencyError
from .container_end import PACKET, avi_null_frames, declared_end, flv_told, matroska_blocks_after

# container names PyAV reports (comma lists) -> the extension gpubatch writes for such bytes
_CONTAINERS = (("mp4", "mp4"), ("mov", "mov"), ("matroska", "mkv"), ("webm", "webm"), ("avi", "avi"),
               ("mpegts", "ts"), ("mpeg", "mpg"), ("flv", "flv"), ("asf", "wmv"), ("ogg", "ogv"), ("mxf", "mxf"))
_ASF = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")  # (the ASF header object's GUID: WMV and ASF files)


def av(what: str = "video"):
    """PyAV, imported on first use (a core dependency; a clear error where it is missing, naming ``what``
    needed it)."""
    try:
        import av as _av
    except ImportError:  # pragma: no cover - a declared dependency
        raise DependencyError(f"{what} needs PyAV: pip install av") from None
    return _av


def sniff_container(data: bytes) -> str | None:
    """The container of video bytes from their first bytes (mp4/mov/3gp, mkv/webm, avi, ts/m2ts, mpg, wmv, flv, ogv,
    mxf), or None."""
    if data[4:8] == b"ftyp" or data[4:8] in (b"moov", b"mdat", b"free", b"wide", b"skip"):
        brand = data[8:12]
        return "mov" if brand == b"qt  " else "3gp" if brand[:3] in (b"3gp", b"3g2") else "mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "webm" if b"webm" in data[:64] else "mkv"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    if len(data) > 376 and data[0] == 0x47 and data[188] == 0x47:
        return "ts"
    if len(data) > 392 and data[4] == 0x47 and data[196] == 0x47:  # (192-byte packets: a time code before each)
        return "m2ts"
    if data[:4] == b"\x00\x00\x01\xba":  # (an MPEG program stream's pack header: .mpg, .vob)
        return "mpg"
    if data[:16] == _ASF:
        return "wmv"
    if data[:4] == b"FLV\x01":
        return "flv"
    if data[:4] == b"OggS":
        return "ogv"
    if data[:4] == b"\x06\x0e\x2b\x34":  # (a SMPTE universal label: an MXF partition pack)
        return "mxf"
    return None


#: why an MP4/MOV/M4A file whose index (``moov``) lies at its end, cut before it or inside it, is refused
INDEX_CUT = "the file is cut short: its index (the moov box, at its end) is not in it whole"
#: an MP4's cut that spares its frames' tables (:func:`mp4_boxes_cut`)
BOXES_CUT = "the file is cut short: its last box runs past its end"
#: a fragmented MP4's cut inside a fragment (:func:`mp4_boxes_cut`)
FRAGMENT_CUT = "a fragment (moof, mdat) of it, and what came after, is lost"
MAX_MISSING = 1 << 16  # the most frames a file cut short or damaged is taken to have lost (its header may claim any)


@dataclass(frozen=True)
class VideoInfo:
    """A video's facts, from its container and a demux of its video packets.

    Attributes:
        container: the container's extension (mp4, mkv, webm, mov, avi...).
        codec: the video stream's codec (h264, hevc, vp9, av1, mpeg4...); ``profile`` its profile.
        width, height: the frame size as displayed (after the rotation below).
        rotation: degrees counter-clockwise that display turns the coded frame (0, 90, -90, 180).
        bit_depth: bits per sample (8, 10, 12); ``pix_fmt`` the decoder's pixel format.
        fps: average frame rate; ``vfr``: the frame intervals differ by more than 1 % (variable rate).
        duration: seconds from the first frame's timestamp to the end of the last frame.
        times: seconds, per frame in presentation order, from the first frame.
        keyframes: indices of the frames a decoder can start from.
        bit_rate: bits per second of the whole file; ``audio_tracks``: its audio streams.
        colorspace, color_range: the stream's YUV matrix and range as FFmpeg numbers them (2: unspecified;
            range 2: full), for a decoder's own YUV-to-RGB conversion.
    """

    container: str
    codec: str
    profile: str | None
    width: int
    height: int
    rotation: int
    bit_depth: int
    pix_fmt: str
    fps: float
    vfr: bool
    duration: float
    times: np.ndarray = field(repr=False)
    keyframes: tuple[int, ...] = field(repr=False)
    bit_rate: int = 0
    audio_tracks: int = 0
    pts: np.ndarray = field(repr=False, default=None)  # stream time-base units, presentation order
    offset: int = 0  # a stretch of a video (window): the index of its first frame in the whole
    t0: float = 0.0  # and that frame's time
    missing: int = 0  # frames the file's index counts past its end: a file cut short (see ``cut_short``)
    colorspace: int = 2
    color_range: int = 0
    cut_inside: bool = False  # the file ends inside a packet, in a container that counts no frames (MPEG-TS...)
    cut_pts: int | None = None  # the timestamp of the packet a file cut short ends inside (not to be decoded)
    reorder: int = 0  # the most a frame's presentation timestamp lies after its decoding one (B-frames; a seek's aim)
    declared: float = 0.0  # a Matroska or FLV file's duration, where its frames end well before it (damaged: ``cut_short``)
    stopped: bool = False  # a Matroska file whose demuxer stopped at a damaged block: ``missing`` blocks after it
    counted: int = 0  # the frames the file's index counts, where more are missing than are taken (MAX_MISSING)
    skipped: int = 0  # frames a steady rate's timestamps skip (a damaged stretch the demuxer passed over) or
    # packets no timestamp places, from
    skip_at: float = 0.0  # this time on
    jump: float = 0.0  # seconds a steady rate's timestamps jump by no whole number of frames (damage that moved
    jump_at: float = 0.0  # them, or a splice: frames may be lost there), and from when
    placed: int = 0  # frames that carry no timestamp, placed on the grid of those that do (an MPEG stream's)
    boxes_cut: str = ""  # an MP4/MOV whose last top-level box runs past its end (:func:`mp4_boxes_cut`)

    @property
    def cut_short(self) -> str:
        """Why the file is damaged where it is cut short (its index counts frames it does not hold, or its last box
        runs past its end), or ""."""
        if not self.missing and self.boxes_cut == "index":
            return (f"{BOXES_CUT} (every video frame is in it; what came after them, its sound's index or its "
                    "metadata, is not)")
        if not self.missing:
            return f"{BOXES_CUT}: {FRAGMENT_CUT}" if self.boxes_cut else ""
        if self.cut_inside:
            return f"the file is cut short: it ends inside a packet, after {self.frames:,} whole frames"
        if self.declared:
            return (f"the file is damaged: its frames end at {self.duration:.3f} s of the {self.declared:.3f} s its "
                    f"header declares, after {self.frames:,} frames ({self.missing:,} missing)")
        if self.stopped:
            return (f"the file is damaged: its demuxer stops at a damaged block after {self.frames:,} frames "
                    f"({self.missing:,} blocks after it unread)")
        n = self.counted or self.frames + self.missing
        return (f"the file is cut short: its header counts {n:,} frames, {self.frames:,} are in the file "
                f"({self.missing:,} missing)")

    def extended(self) -> VideoInfo:
        """The video as its index describes it: the missing frames placed after the last one present, one
        median frame interval apart (what a sampler plans its outputs over; those that take a missing
        frame are then lost)."""
        if not self.missing:
            return self
        step = float(np.median(np.diff(self.times))) if self.frames > 1 else 1.0 / max(self.fps, 1e-9)
        more = self.times[-1] + step * np.arange(1, self.missing + 1)
        pstep = int(np.median(np.diff(self.pts))) if self.frames > 1 else 1
        return replace(self, times=np.concatenate([self.times, more]),
                       pts=np.concatenate([self.pts, self.pts[-1] + pstep * np.arange(1, self.missing + 1)]),
                       duration=float(more[-1] + step), missing=0)

    def window(self, start: float, end: float) -> VideoInfo:
        """The stretch from ``start`` to ``end`` seconds (both frames included; a negative time counts
        from the end, 0 and 0 the whole video, as DALI's file lists mean them), indices kept relative
        to it with ``offset`` and ``t0`` to the whole. ValueError where the stretch holds no frame."""
        if not start and not end:
            return self
        s = start + self.duration if start < 0 else start
        e = end + self.duration if end < 0 else (end or self.duration)
        i0 = int(np.searchsorted(self.times, s - 1e-6, side="left"))
        i1 = int(np.searchsorted(self.times, e + 1e-6, side="right")) - 1
        if i1 < i0 or i0 >= self.frames:
            raise ValueError(f"no frame between {start:g} s and {end:g} s (the video lasts {self.duration:.3f} s)")
        times = self.times[i0: i1 + 1]
        step = float(np.median(np.diff(self.times))) if self.frames > 1 else 1.0 / max(self.fps, 1e-9)
        keys = tuple(k - i0 for k in self.keyframes if i0 <= k <= i1)
        return replace(self, times=times - times[0], pts=self.pts[i0: i1 + 1], keyframes=keys or (0,),
                       duration=float(times[-1] - times[0] + step), offset=self.offset + i0,
                       t0=self.t0 + float(times[0]))

    @property
    def frames(self) -> int:
        return len(self.times)

    def keyframe_before(self, index: int) -> int:
        """The last keyframe at or before frame ``index`` (a decoder starts there to reach it)."""
        k = int(np.searchsorted(np.asarray(self.keyframes), index, side="right")) - 1
        return self.keyframes[max(k, 0)]


def _bit_depth(pix_fmt: str) -> int:
    for depth in (16, 14, 12, 10, 9):
        if f"p{depth}" in pix_fmt:
            return depth
    return 8


@functools.cache
def open_options() -> tuple[tuple[str, str], ...]:
    """The keyword arguments gpubatch gives :func:`av.open` for input, as the installed PyAV takes them:
    ``metadata_errors="ignore"`` up to PyAV 18 (a tag in a stray encoding would fail the open); PyAV 19
    removed the argument (tags are read as UTF-8 with ``surrogateescape``, which never fails). Asked of
    PyAV itself, once: its ``open`` is a compiled function without a signature to read."""
    a = av()
    try:
        with a.open(io.BytesIO(b""), mode="r", metadata_errors="ignore"):
            pass
    except TypeError:  # (PyAV 19: an unexpected keyword argument)
        return ()
    except Exception:  # noqa: BLE001 - the argument was taken; empty bytes are no file
        pass
    return (("metadata_errors", "ignore"),)


def open_input(source: Any) -> Any:
    """``av.open(source)`` for reading, with the options the installed PyAV takes (:func:`open_options`)."""
    return av().open(source, mode="r", **dict(open_options()))


def packets(c: Any, s: Any) -> Iterator[Any]:
    """Stream ``s``'s packets as container ``c`` demuxes them from where it stands, ending where demuxing
    fails: the file ends inside a packet, or a damaged stretch (PyAV 19 raises there; earlier versions
    stopped quietly). What came before is the stream."""
    it = c.demux(s)
    failed = av().FFmpegError
    while True:
        try:
            p = next(it)
        except (StopIteration, failed):
            return
        yield p


def open_container(data: bytes):
    """A PyAV input container over ``data``; ValueError (one line) where it is no video file."""
    a = av()
    if not data:
        raise ValueError("empty file (0 bytes)")
    try:
        return open_input(io.BytesIO(data))
    except a.FFmpegError as e:
        if sniff_container(data) in ("mp4", "mov", "3gp") and not mp4_index_whole(data):
            raise ValueError(INDEX_CUT) from None
        raise ValueError(f"not a readable video file: {_why(e)}") from None


def _why(e: Exception) -> str:
    text = getattr(e, "strerror", None) or str(e)
    return text.split(": '", 1)[0].strip() or type(e).__name__


def probe(data: bytes, max_pixels: int = 0) -> VideoInfo:
    """The facts of the video in ``data`` (see :class:`VideoInfo`): the container's header and one demux
    pass over the video stream's packets (no frame is decoded).

    Raises:
        ValueError: not a video (no moov atom, zero length, audio only), a size above ``max_pixels``
            (0: no limit), or no frame at all; the message says which.
    """
    if data[:6] == b"\x93NUMPY":
        return npy_clip(data, max_pixels)
    with open_container(data) as c:
        name = c.format.name or ""
        if not any(n in name.split(",") for n, _ in _CONTAINERS) and sniff_container(data) is None:
            what = f"an image ({name.removesuffix('_pipe')})" if name.endswith("_pipe") or name == "image2" else \
                f"a {name} file"
            from ...types import VIDEO_EXTENSIONS

            raise ValueError(f"{what}, not a video container gpubatch reads and writes back "
                             f"({', '.join(sorted(set(VIDEO_EXTENSIONS.values())))})")
        if not c.streams.video:
            if sniff_container(data) in ("mp4", "mov", "3gp") and not mp4_index_whole(data):
                raise ValueError(INDEX_CUT)
            audio = len(c.streams.audio)
            raise ValueError(f"no video stream ({audio} audio stream{'s' if audio != 1 else ''}: a folder of such "
                             "files is read as sound with --from audio)" if audio else "no video stream")
        s = c.streams.video[0]
        cc = s.codec_context
        if cc is None:  # (a codec FFmpeg does not know: a damaged sample description, or an exotic one)
            raise ValueError("not a readable video: its video stream names no codec FFmpeg knows (a damaged header?)")
        coded_w, coded_h = int(cc.width or 0), int(cc.height or 0)
        if coded_w <= 0 or coded_h <= 0:
            raise ValueError("not a readable video: its stream has no frame size (truncated?)")
        if max_pixels and coded_w * coded_h > max_pixels:
            raise ValueError(f"{coded_w}x{coded_h} frames are above --max-pixels {max_pixels:,}")
        pts: list[int] = []
        dts: list[int | None] = []  # (decoding order: a packet the damage took leaves a hole in a steady run)
        keys: list[bool] = []
        durations: list[int] = []
        table = sample_table(s)  # byte position -> size of every frame's packet (MP4/MOV), or None
        listed = len(table) if table is not None else int(s.frames or 0)  # the frames the file's index counts
        cut = 0  # packets the demuxer gave cut short (the file ends inside them)
        reorder = 0  # the most a packet's presentation time lies after its decoding time
        untimed = lead = 0  # packets of the video with no timestamp; those before the first with one
        taken = None  # the last packet taken (where its data lies in the file: a Matroska file's check)
        timed = not listed  # (decoding timestamps kept where the file counts no frames: MPEG-TS, Matroska...)
        for p in packets(c, s):  # (up to a damaged stretch: the frames before it are the video)
            t = p.pts if p.pts is not None else p.dts
            if t is None or p.size == 0:
                untimed += t is None and p.size > 0  # (a frame no timestamp places, unless the run's grid does)
                lead += t is None and p.size > 0 and not pts
                continue
            if p.pts is not None and p.dts is not None:
                reorder = max(reorder, int(p.pts - p.dts))
            if table is not None and table.get(p.pos, p.size) != p.size:
                cut += 1
                continue
            taken = p
            pts.append(int(t))
            if timed:
                dts.append(p.dts)
            keys.append(bool(p.is_keyframe))
            durations.append(int(p.duration or 0))
        sniffed = sniff_container(data)
        nulls = avi_null_frames(data, s.index) if sniffed == "avi" and listed > len(pts) else 0
        listed -= nulls  # (empty index entries: frames repeated to keep the rate, not frames missing)
        missing = max(0, listed - len(pts)) if listed > len(pts) + cut or cut else 0
        end, how = (0, "") if missing or table is not None else declared_end(data, sniffed)
        cut_pts = None  # the packet the file ends inside, as far as can be told: not taken, nor decoded
        if missing and table is None and pts:  # (no sizes to tell: the last packet read may be cut too)
            cut_pts, pts, keys, durations, missing = pts[-1], pts[:-1], keys[:-1], durations[:-1], missing + 1
        elif end > len(data):  # (a container that counts no frames, cut short: container_end.py. Its duration and
            # rate tell how many the whole held, at most MAX_MISSING more, as a hostile header may claim any; the last
            # packet read may be cut, so is neither taken nor decoded)
            by_time = round(min(float(c.duration or 0) / 1e6, 1e7) * float(s.average_rate or 0))
            cut_pts, pts, keys, durations = (pts[-1] if pts else None), pts[:-1], keys[:-1], durations[:-1]
            missing = max(1, min(by_time, len(pts) + MAX_MISSING) - len(pts))
            listed = len(pts) + missing
        counted = listed if missing > MAX_MISSING else 0  # (a count a damaged or hostile header may make any)
        missing = min(missing, MAX_MISSING)  # (each missing frame is planned: never billions of them)
        inside = bool(missing) and how == PACKET  # (cut inside a packet: how many frames followed is not known)
        if not pts:
            raise ValueError("no whole video frame in the file" + (
                ": it is cut short" + ("" if inside else f" (its header counts {listed:,} frames)") if missing
                else " (truncated?)"))
        order = np.argsort(np.asarray(pts, np.int64), kind="stable")
        spts = np.asarray(pts, np.int64)[order]
        keep = np.concatenate([[True], np.diff(spts) > 0])  # a repeated timestamp is no new frame
        order, spts = order[keep], spts[keep]
        key_flags = np.asarray(keys)[order]
        grid = _placed(spts, untimed) if untimed and not lead else None
        if grid is not None:  # (frames an MPEG stream leaves untimed, placed on its steady grid in turn)
            flags = np.zeros(len(grid), bool)
            flags[np.searchsorted(grid, spts)] = key_flags
            spts, key_flags, placed, untimed = grid, flags, untimed, 0
        else:
            placed = 0
        keyframes = tuple(int(i) for i in np.flatnonzero(key_flags)) or (0,)
        if keyframes[0] != 0:  # frames before the first keyframe (an open GOP cut): start there
            keyframes = (0, *keyframes)
        tb = float(s.time_base) if s.time_base else 1.0 / 90000
        times = (spts - spts[0]).astype(np.float64) * tb
        last = durations[int(order[-1])] * tb if durations else 0.0
        gaps = np.diff(times)
        rate = float(s.average_rate) if s.average_rate else (1.0 / float(np.median(gaps)) if len(gaps) else 0.0)
        if not last:
            last = float(np.median(gaps)) if len(gaps) else (1.0 / rate if rate else 0.0)
        duration = float(times[-1] + last)
        declared, stopped = 0.0, 0
        if not missing and not listed and sniffed in ("mkv", "webm") and len(c.streams) == 1 and rate:
            # (Matroska counts no frames, and its demuxer ends quietly at a damaged element: the frames after it
            # are lost without a word but for the Segment's Duration, which the muxer wrote at the end. Audio or
            # subtitles may outlast the video, so only a file of one video stream alone is judged)
            told = min(float(c.duration or 0) / 1e6, 1e7)
            end = float(spts[-1] * tb + last - float(c.start_time or 0) / 1e6)
            if told - end > max(2.0 / rate, 0.02 * told):
                missing, declared = min(round((told - end) * rate), MAX_MISSING), told
        if not missing and not listed and sniffed == "flv" and rate:
            # (nor does FLV: a file cut exactly between two tags ends on a whole one, and only the duration its
            # onMetaData declares, which FFmpeg's muxer writes at the end, tells the frames after it; its time line is
            # the tags', from 0, and its sound's last tag may end it)
            told, sound = flv_told(data)
            end = max(float(spts[-1] * tb + last), sound)
            if told - end > max(2.0 / rate, 0.02 * told, 0.1):
                missing, declared = min(round((told - end) * rate), MAX_MISSING), told - float(spts[0] * tb)
        last_pos = -1 if taken is None or taken.pos is None else int(taken.pos)
        if not missing and not listed and sniffed in ("mkv", "webm") and last_pos >= 0:
            # (or, whatever the Duration says, the video's blocks after the last one the demuxer read)
            missing = stopped = min(matroska_blocks_after(data, last_pos), MAX_MISSING)
        vfr = bool(len(gaps) > 1 and (gaps.max() - gaps.min()) > 0.01 * max(float(np.median(gaps)), 1e-9))
        skipped, skip_at, jump, jump_at = _skips(times, gaps)
        skipped = max(0, skipped - nulls)  # (an AVI's repeated frames keep their place in its timestamps)
        if timed and not missing and not placed and None not in dts:  # (a container that counts no frames: TS...)
            lost, lost_at = _lost_in_decoding_order(np.asarray(dts, np.int64), tb)
            if lost > skipped:
                skipped, skip_at = lost, lost_at
        skipped += untimed
        rotation = _rotation(s)
        if not rotation:  # (MP4/MOV: the track's matrix read from the file's boxes, else a frame decoded)
            from_track = _track_rotation(data) if sniffed in ("mp4", "mov", "3gp") else None
            rotation = from_track if from_track is not None else _first_frame_rotation(c, s, int(spts[0]))
        w, h = (coded_h, coded_w) if rotation in (90, 270) else (coded_w, coded_h)
        container = next((ext for name, ext in _CONTAINERS if name in (c.format.name or "").split(",")),
                         sniffed or (c.format.name or "video").split(",")[0])
        if (container == "mov" and sniffed == "mp4") or sniffed in ("3gp", "m2ts"):  # (the bytes' own kind)
            container = sniffed
        pix_fmt = str(cc.pix_fmt or "")
        return VideoInfo(
            container=container, codec=_codec_name(cc), profile=cc.profile, width=w, height=h, rotation=rotation,
            bit_depth=_bit_depth(pix_fmt), pix_fmt=pix_fmt, fps=rate or (len(times) / duration if duration else 0.0),
            vfr=vfr, duration=duration, times=times, keyframes=keyframes,
            bit_rate=int(c.bit_rate or 0), audio_tracks=len(c.streams.audio), pts=spts, missing=missing,
            colorspace=int(getattr(cc, "colorspace", 2) or 2), color_range=int(getattr(cc, "color_range", 0) or 0),
            cut_inside=inside, cut_pts=cut_pts, reorder=reorder, declared=declared, stopped=bool(stopped),
            counted=counted,
            skipped=skipped, skip_at=skip_at, jump=jump, jump_at=jump_at, placed=placed,
            boxes_cut=mp4_boxes_cut(data) if sniffed in ("mp4", "mov", "3gp") else "",
        )


def _placed(spts: np.ndarray, untimed: int) -> np.ndarray | None:
    """The timestamps of every frame where ``untimed`` frames carry none: an MPEG program or transport stream
    need time only one frame in several (FFmpeg's MPEG-PS muxer times one H.264 frame in four). Where the timed
    frames ``spts`` lie on a steady grid (their gaps whole multiples of the smallest step between them) whose holes
    the untimed frames fill, those after the last timed one at the end (no more than the longest untimed run
    between two timed ones), the grid is the frames' times; None where they do not fit (damage took frames, or
    their timestamps: the frames are then skipped, and said)."""
    if len(spts) < 2:
        return None
    gaps = np.diff(spts)
    step = int(np.gcd.reduce(gaps))
    if step <= 0:
        return None
    holes = int((gaps // step - 1).sum())
    if not 0 <= untimed - holes <= int(gaps.max() // step) - 1:
        return None
    return spts[0] + step * np.arange(len(spts) + untimed, dtype=np.int64)


def _skips(times: np.ndarray, gaps: np.ndarray) -> tuple[int, float, float, float]:
    """Where a video's frames come at a steady rate (three in four gaps the median interval, within a tenth) but
    for a few longer gaps: (frames skipped, the time of the first; a jump's length, its time). A gap of a whole
    number of intervals skips frames (a damaged stretch the demuxer passed over, a tag it took for another stream);
    one of more than one and a half intervals, and no whole number, is a jump of the timestamps (damage that moved
    them, as in an MPEG program stream, or a splice), whose lost frames cannot be counted. All zero where the gaps
    jitter by less (a variable rate)."""
    none = (0, 0.0, 0.0, 0.0)
    if len(gaps) < 8:
        return none
    step = float(np.median(gaps))
    if step <= 0:
        return none
    k = gaps / step
    whole = np.round(k)
    near = np.abs(k - whole) < 0.1
    far = ~near & (k > 1.5)
    if not (near | far).all() or (near & (whole == 1)).mean() < 0.75:
        return none
    holes = near & (whole >= 2) & (whole <= _MOST_SKIPPED)
    far |= near & (whole > _MOST_SKIPPED)
    first = int(np.argmax(holes))
    jumped = int(np.argmax(far))
    return (int((whole[holes] - 1).sum()), float(times[first] + step) if holes.any() else 0.0,
            float(gaps[jumped]) if far.any() else 0.0, float(times[jumped]) if far.any() else 0.0)


_MOST_SKIPPED = 256  # a gap of more intervals than this is a jump of the timestamps, not frames skipped


def _lost_in_decoding_order(dts: np.ndarray, tb: float) -> tuple[int, float]:
    """(frames lost, from when) told from the decoding timestamps of a steady stream, where the presentation
    timestamps show nothing: a packet the damage took out of an MPEG-TS file (its last frame in presentation order,
    say) leaves a hole in the decoding timestamps' run. Packets whose own decoding timestamp the damage changed
    (off the run, or one another's) fill as many holes, so they are not counted as lost."""
    v = np.unique(dts)
    if len(v) < 9:
        return 0, 0.0
    gaps = np.diff(v)
    step = float(np.median(gaps))
    if step <= 0:
        return 0, 0.0
    k = gaps / step
    whole = np.round(k)
    near = np.abs(k - whole) < 0.1
    far = (~near & (k > 1.5)) | (whole > _MOST_SKIPPED)
    if not (near | far).all() or (near & (whole == 1)).mean() < 0.75:
        return 0, 0.0
    cuts = np.flatnonzero(far)  # (the runs between jumps: the longest is the stream, the rest displaced packets)
    bounds = np.r_[0, cuts + 1, len(v)]
    longest = int(np.argmax(np.diff(bounds)))
    a, b = int(bounds[longest]), int(bounds[longest + 1])
    inner = whole[a : b - 1]
    lost = int((inner[inner >= 2] - 1).sum()) - (len(dts) - (b - a))
    if lost <= 0:
        return 0, 0.0
    first = a + int(np.argmax(inner >= 2))
    return lost, float((v[first] - v[a]) * tb + step * tb)


def _codec_name(cc: Any) -> str:
    """The stream's codec as FFmpeg names the format ("av1"), not the decoder that reads it ("libdav1d")."""
    return str(getattr(cc.codec, "canonical_name", None) or cc.name)


def npy_clip(data: bytes, max_pixels: int = 0) -> VideoInfo:
    """The facts of a decoded clip written as ``.npy`` (uint8 (T, H, W, 3), as ``--clip-format npy``
    writes them): its frames are the array's; no time is known (one frame a second is assumed)."""
    try:
        f = io.BytesIO(data)
        version = np.lib.format.read_magic(f)
        fmt = np.lib.format
        shape, fortran, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(f)
    except (ValueError, OSError) as e:
        raise ValueError(f"not a readable .npy clip: {e}") from None
    if dtype != np.uint8 or len(shape) != 4 or shape[3] != 3 or fortran or 0 in shape:
        raise ValueError(f"a .npy clip is a uint8 (T, H, W, 3) array, not {dtype} {tuple(shape)}")
    t, h, w, _ = (int(x) for x in shape)
    if max_pixels and h * w > max_pixels:
        raise ValueError(f"{w}x{h} frames are above --max-pixels {max_pixels:,}")
    if len(data) < t * h * w * 3:
        raise ValueError("a truncated .npy clip")
    return VideoInfo(container="npy", codec="rawvideo", profile=None, width=w, height=h, rotation=0, bit_depth=8,
                     pix_fmt="rgb24", fps=1.0, vfr=False, duration=float(t), times=np.arange(t, dtype=np.float64),
                     keyframes=tuple(range(t)), pts=np.arange(t, dtype=np.int64))


def _top_boxes(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(type, start, end) of each of an MP4/MOV file's top-level boxes, walked by their sizes (a box of size 0 runs
    to the file's end); the walk ends at a size smaller than its box's header."""
    at = 0
    while at + 8 <= len(data):
        size, head = int.from_bytes(data[at : at + 4], "big"), 8
        if size == 1 and at + 16 <= len(data):  # (a 64-bit size follows the type)
            size, head = int.from_bytes(data[at + 8 : at + 16], "big"), 16
        elif size == 0:
            size = len(data) - at
        if size < head:
            return
        yield bytes(data[at + 4 : at + 8]), at, at + size
        at += size


def mp4_index_whole(data: bytes) -> bool:
    """Whether an MP4/MOV file's top-level boxes hold a ``moov`` box that ends inside the file."""
    return next((end <= len(data) for kind, _, end in _top_boxes(data) if kind == b"moov"), False)


def mp4_boxes_cut(data: bytes) -> str:
    """Whether an MP4/MOV file's top-level boxes end with one that runs past the file's end (a file cut short), and
    where: "index" where its index (``moov``) holds every frame's tables (a cut inside it, where it comes last,
    that spares the video track's tables leaves every frame readable, and the file passed for whole: its sound's
    tables, or its metadata, lost), "fragment" in a fragmented file (``moof`` boxes: the frames from the cut
    fragment on are lost, and the demuxer ends at the last whole one with no error), else "". Bytes after the last
    box that are none (a type of other than letters and digits) leave it untold."""
    boxes = list(_top_boxes(data))
    if not _cut(boxes, len(data)):
        return ""
    return "fragment" if any(kind == b"moof" for kind, _, _ in boxes) else "index"


def _cut(boxes: list[tuple[bytes, int, int]], size: int) -> bool:
    """Whether the last of a file's top-level ``boxes`` (each named by letters and digits) runs past its ``size``."""
    return bool(boxes) and all(kind.isalnum() for kind, _, _ in boxes) and boxes[-1][2] > size


def mp4_open_end(data: bytes) -> bool:
    """Whether an MP4/MOV/M4A file (its ``ftyp`` first) is fragmented (``moof`` boxes, each with its frames'
    tables) and whole box by box but with no index of its fragments at its end (``mfra``, which FFmpeg's muxer
    writes last): cut exactly between two fragments, or left by a writer that stopped (a recorder killed), it reads
    as a shorter whole file, and nothing in it counts its frames; a writer may also leave the index out (FFmpeg's
    ``skip_trailer``). Said, not judged."""
    if bytes(data[4:8]) != b"ftyp":
        return False
    boxes = list(_top_boxes(data))  # (one walk: the kinds whole, and whether the last runs past the end)
    kinds = [kind for kind, _, end in boxes if end <= len(data)]
    return b"moof" in kinds and b"mfra" not in kinds and not _cut(boxes, len(data))


FRAGMENTS_OPEN = ("a fragmented MP4 with no index of its fragments at its end (mfra): if it was cut between two "
                  "fragments or its writer stopped early, the frames after its last whole fragment are not known")


def sample_table(stream: Any) -> dict[int, int] | None:
    """Byte position -> size of each frame's packet where the container indexes every frame (MP4 and
    MOV's sample table, read by PyAV 17 and later), so that a file cut after its index is seen as such;
    None otherwise (a Matroska index names keyframes only)."""
    entries = getattr(stream, "index_entries", None)
    if entries is None:
        return None
    try:
        table = {int(e.pos): int(e.size) for e in entries}
    except (TypeError, ValueError, AttributeError):
        return None
    frames = int(stream.frames or 0)
    return table if table and frames and len(table) >= frames else None


def _first_frame_rotation(container: Any, stream: Any, pts: int) -> int:
    """The display matrix's rotation as the first frame carries it (PyAV names no stream-level one for
    MP4's track matrix): one frame decoded; 0 where none decodes."""
    a = av()
    try:
        container.seek(pts, stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            return int(round(float(frame.rotation or 0) / 90.0)) * 90 % 360
    except (a.FFmpegError, ValueError, AttributeError):
        pass
    return 0


#: an MP4/MOV matrix that turns nothing ({a, b, u, c, d, v, x, y, w}: 16.16 fixed point, u, v, w 2.30)
_IDENTITY = (0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The ISO-BMFF boxes between ``start`` and ``end``: (type, payload start, payload end); ends at a box whose
    size does not fit."""
    import struct

    p = end if end - start < 8 else start
    while p + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, p)
        head = 8
        if size == 1:
            if p + 16 > end:
                return
            size, head = struct.unpack_from(">Q", data, p + 8)[0], 16
        elif size == 0:
            size = end - p
        if size < head or p + size > end:
            return
        yield kind, p + head, p + size
        p += size


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((a, b) for k, a, b in _boxes(data, start, end) if k == kind), None)


def _matrix(data: bytes, box: tuple[int, int], before: tuple[int, int]) -> tuple[int, ...] | None:
    """The 3x3 matrix of an ``mvhd`` or ``tkhd`` box (payload ``box``): after its version and flags, the fields of
    ``before`` bytes (version 0, version 1), 16 more, then nine 32-bit values."""
    import struct

    a, b = box
    at = a + 4 + (before[1] if data[a] == 1 else before[0]) + 16
    return struct.unpack_from(">9i", data, at) if at + 36 <= b else None


def _track_rotation(data: bytes) -> int | None:
    """Degrees counter-clockwise (0, 90, 180 or 270) the matrix of an MP4/MOV file's first video track turns its
    frames, read from the file's boxes as FFmpeg reads it into the display matrix its decoded frames carry
    (``av_display_rotation_get``; frame.rotation then); None where the boxes do not say: no ``moov`` or video
    track, a movie matrix (``mvhd``) that is not the identity (FFmpeg multiplies the two), a matrix that scales
    a side to nothing. Half of a 1080p probe's time was its first frame decoded for this (2026-12-06)."""
    import math

    moov = _child(data, 0, len(data), b"moov")
    if moov is None:
        return None
    mvhd = _child(data, *moov, b"mvhd")
    if mvhd is None or _matrix(data, mvhd, (16, 28)) != _IDENTITY:
        return None
    for kind, a, b in _boxes(data, *moov):
        if kind != b"trak":
            continue
        mdia = _child(data, a, b, b"mdia")
        hdlr = _child(data, *mdia, b"hdlr") if mdia is not None else None
        if hdlr is None or data[hdlr[0] + 8: hdlr[0] + 12] != b"vide":
            continue
        tkhd = _child(data, a, b, b"tkhd")
        m = _matrix(data, tkhd, (20, 32)) if tkhd is not None else None
        if m is None:
            return None
        s0, s1 = math.hypot(m[0], m[3]), math.hypot(m[1], m[4])
        if not s0 or not s1:
            return None
        ccw = -math.degrees(math.atan2(m[1] / s1, m[0] / s0))
        return int(round(ccw / 90.0)) * 90 % 360
    return None


def _rotation(stream: Any) -> int:
    """Degrees counter-clockwise the stream's display matrix turns its frames (0 where none)."""
    for sd in _side_data(stream):
        rot = getattr(sd, "rotation", None)
        if rot is not None:
            return int(round(float(rot) / 90.0)) * 90 % 360 if rot else 0
    rot = (stream.metadata or {}).get("rotate")  # older containers' tag: degrees clockwise
    if rot:
        try:
            return (-int(rot)) % 360
        except ValueError:
            return 0
    return 0


def _side_data(stream: Any) -> list:
    try:
        sd = stream.side_data
    except AttributeError:
        return []
    if isinstance(sd, dict):  # PyAV names its entries: {"DISPLAYMATRIX": angle}
        rot = sd.get("DISPLAYMATRIX") or sd.get("displaymatrix")
        return [type("SD", (), {"rotation": rot})()] if rot is not None else []
    return list(sd or [])
