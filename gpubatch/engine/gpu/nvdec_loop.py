"""Where an NVDEC session's frames come from: the packet loop, native or in Python.

Both give an :class:`~.video.NvdecSession` the same thing: after ``seek(k)`` (frame index ``k`` of the
probe's frames, a keyframe) or ``rewind()`` (the file's first frame), the video's decoded NV12/P016
frames in display order, a list at a time, each with the timestamp its container gives it (``frame.timestamp``, in the stream's time base: the probe's ``pts``,
so a frame maps to the index the CPU path gives it).

- :class:`NativeLoop` (the default): PyNvVideoCodec's ``ThreadedDecoder``, which demuxes and decodes on
  a native thread of its own, a buffer of frames ahead. Python sees one call per batch of frames,
  not one per packet. Its demuxer reads a file, so a record's bytes are written to a spool file in
  memory (``/dev/shm``) unless the video is a file already. It takes H.264, HEVC, VP9 and AV1 in MP4 and
  MOV files.
- :class:`PythonLoop`: PyAV demuxes, FFmpeg's ``*_mp4toannexb`` filter makes the packets Annex B, and
  each packet goes to a ``CreateDecoder`` decoder from Python (H.264 and HEVC only). It is what older
  PyNvVideoCodec releases (without ``ThreadedDecoder``) get, and ``GPUBATCH_VIDEO_LOOP=python``.

benchmarks/nvdec_study.py measured both beside N raw decoders and SPDL's NVDEC path (RESULTS.md,
2026-12-01).
"""

from __future__ import annotations

import io
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..codecs.video_gpu_caps import CUDA_CODEC, nvc, nvdec_supports


def native_available(nvc: Any) -> bool:
    """Whether this PyNvVideoCodec has the native decode loop (2.2 and later)."""
    return hasattr(nvc, "CreateThreadedDecoder")


def loop_class(name: str, nvc: Any) -> type:
    """The loop a session of setting ``name`` ("native" or "python") runs with this PyNvVideoCodec: "native" is
    :class:`BothLoops` (the native loop for MP4 and MOV, the Python loop for the containers only it was checked on)."""
    return BothLoops if name == "native" and nvc is not None and native_available(nvc) else PythonLoop


def cpu_reason(info: Any, gpu: int, loop: type) -> str:
    """Why a video goes to the CPU path rather than to NVDEC on GPU ``gpu`` ("" where NVDEC takes it, as
    far as its probe tells: a codec NVDEC refuses when it opens the file goes to the CPU then). ``loop``:
    the session's packet loop (:mod:`.nvdec_loop`), whose frames were checked against the CPU's for its
    codecs in its containers (:class:`BothLoops`: the loop it routes the file to)."""
    if hasattr(loop, "route"):
        loop = loop.route(info) or (NativeLoop if info.container in NativeLoop.CONTAINERS else PythonLoop)
    if info.rotation:
        return "rotated"
    if info.container == "npy":
        return "a decoded clip"
    if info.placed:  # (NVDEC's frames are matched by their timestamps; the CPU path places untimed ones in turn)
        return f"{info.placed} of its frames carry no timestamp"
    if info.container not in loop.CONTAINERS:
        names = sorted(c.upper() for c in loop.CONTAINERS)
        return (f"{info.container}: NVDEC's frames are checked against the CPU's for {', '.join(names[:-1])} and "
                f"{names[-1]} files")
    if info.codec not in loop.CODECS:
        return f"{info.codec}: gpubatch's NVDEC path takes {', '.join(sorted(loop.CODECS))} here"
    return "" if nvdec_supports(info, gpu) else (f"NVDEC here does not decode {info.codec} {info.pix_fmt} "
                                                 f"{info.width}x{info.height}")


def nvdec_takes(videos: list, gpu: int = 0, loop: str = "native") -> int | None:
    """How many of ``videos`` (VideoInfo) the GPU path decodes on NVDEC here with loop ``loop`` (what
    ``info`` reports); None where there is no GPU decoder here."""
    mod = nvc()
    if mod is None:
        return None
    cls = loop_class(loop, mod)
    return sum(1 for v in videos if not cpu_reason(v, gpu, cls))


class PythonLoop:
    """PyAV's demuxer and bitstream filter, each packet handed to the decoder from Python."""

    #: the codecs this loop decodes (their packets made Annex B by FFmpeg's ``*_mp4toannexb`` filters)
    CODECS = frozenset({"h264", "hevc"})
    #: containers whose frames matched the CPU's, frame by frame, at every frame and at seeks forth and back:
    #: MP4 and MOV; Matroska, MPEG-TS and FLV (benchmarks/nvdec_containers.py, 2026-12-07, H100; an MKV file's clips
    #: had not on 2026-11-25, before the CPU path's frames were the reference they are now)
    CONTAINERS = frozenset({"mp4", "mov", "mkv", "ts", "flv"})
    #: containers whose demuxer seeks by decoding time: a seek to a keyframe's presentation time landed a group late
    BY_DECODING_TIME = frozenset({"ts"})

    def __init__(self, nvc: Any, gpu: int, stream: Any, batch: int = 0):
        self.nvc, self.gpu, self.stream = nvc, gpu, stream  # (``batch``: a packet's frames come a call)
        self._dec: Any = None
        self._dec_key: tuple = ()
        self._container: Any = None
        self._packets: Any = None
        self._ended = False

    def open(self, data: bytes, info: Any, path: str | None = None) -> str:
        import av

        name = CUDA_CODEC.get(info.codec) if info.codec in self.CODECS else None
        if name is None:
            return f"{info.codec}: gpubatch's NVDEC path takes H.264 and HEVC here"
        self.close_video()
        from ..codecs.video_probe import open_input

        try:
            self._container = open_input(io.BytesIO(data))
            self._vs = self._container.streams.video[0]
            self._bsf = av.BitStreamFilterContext(f"{info.codec}_mp4toannexb", self._vs)
            cc = self._vs.codec_context
            w, h = int(cc.width), int(cc.height)
            key = (name, info.bit_depth, w, h)
            if self._dec is None or self._dec_key != key:  # (a decoder made for larger frames gave a Matroska file's
                # 96x64 frames at the 160x120 of the MP4 before it, 2026-12-07, H100: one a frame size)
                self._dec = None  # (the last one freed before the next is made)
                self._dec = self.nvc.CreateDecoder(gpuid=self.gpu, codec=getattr(self.nvc.cudaVideoCodec, name),
                                                   cudacontext=0, cudastream=self.stream.ptr, usedevicememory=True,
                                                   maxwidth=w, maxheight=h)
                self._dec_key = key
        except Exception as e:  # noqa: BLE001 - no decoder for this stream here: the CPU decodes it
            self.close_video()
            return f"NVDEC: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}"
        self.info = info
        return ""

    def seek(self, k: int) -> None:
        if self._packets is not None and not self._ended:
            self._dec.Decode(self.nvc.PacketData())  # (what the decoder held is flushed)
        from ..codecs.video_probe import packets

        aim = int(self.info.pts[k]) - (int(self.info.reorder) if self.info.container in self.BY_DECODING_TIME else 0)
        self._container.seek(aim, stream=self._vs, backward=True, any_frame=False)
        self._packets = packets(self._container, self._vs)
        self._ended = False

    def rewind(self) -> None:
        self.seek(0)  # (a seek by timestamp: the keyframe before the first frame asked for)

    def next(self) -> list | None:
        """The frames the next packet completes; None once the stream is done. Where the demuxer or the
        bitstream filter fails (the file ends inside a packet, or a damaged stretch; PyAV 19 raises there)
        the stream ends: the frames the decoder holds are flushed out first."""
        from ..codecs.video_probe import av

        for packet in self._packets:
            if not packet.size:
                continue
            try:
                filtered = self._bsf.filter(packet)
            except av().FFmpegError:
                self._packets = iter(())  # (the stream ends here)
                break
            out: list = []
            for q in filtered:
                buf = np.frombuffer(q, np.uint8)
                pk = self.nvc.PacketData()
                t = q.pts if q.pts is not None else q.dts
                pk.bsl_data, pk.bsl, pk.pts = buf.ctypes.data, buf.size, int(t if t is not None else -1)
                out.extend(self._dec.Decode(pk))
            return out
        if self._ended:
            return None
        self._ended = True
        return list(self._dec.Decode(self.nvc.PacketData()))  # the frames still held back for display order

    def close_video(self) -> None:
        if self._container is not None:
            if self._dec is not None and self._packets is not None and not self._ended:
                self._dec.Decode(self.nvc.PacketData())  # flush what the decoder holds of this file
            self._container.close()
            self._container = None
        self._packets = None

    def close(self) -> None:
        self.close_video()
        self._dec = None


def _spool_dir() -> Path:
    """Where spool files go: memory (``/dev/shm``) where there is one, else the temporary folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


_SPOOL_PREFIX = "gpubatch-nvdec-"


def sweep_spool(where: Path | None = None) -> int:
    """Removes the spool files of processes that are gone (a worker killed before it closed its session);
    returns how many."""
    where = where or _spool_dir()
    gone = 0
    for p in where.glob(_SPOOL_PREFIX + "*"):
        try:
            pid = int(p.name[len(_SPOOL_PREFIX):].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
            gone += 1
        except (ValueError, PermissionError, OSError):
            continue
    return gone


def drop_spools(where: Path | None = None) -> int:
    """Removes this process's spool files (each holds the last video its session decoded, which may be
    hundreds of MB of ``/dev/shm``): a worker calls it once its videos are decoded, before it tells its
    executor it holds nothing of the run any more (which then ends it, its sessions' own close cut short);
    returns how many."""
    where = where or _spool_dir()
    gone = 0
    for p in where.glob(f"{_SPOOL_PREFIX}{os.getpid()}-*"):
        p.unlink(missing_ok=True)
        gone += 1
    return gone


class NativeLoop:
    """PyNvVideoCodec's ``ThreadedDecoder``: its own demuxer and decoder on a native thread, ``batch``
    frames a call (one decoder a session, reconfigured from video to video and for each seek; it keeps
    a small cache of decoders by size)."""

    #: every codec NVDEC decodes whose frames were checked against the CPU's (tests/video/test_video_gpu.py)
    CODECS = frozenset({"h264", "hevc", "vp9", "av1"})
    #: containers whose frames were checked against the CPU's, frame by frame. Not MKV/WebM: asked for frame
    #: 0 of a 40-frame MKV, its decoder gave frame 36 first (2026-12-01, H200); those decode on the CPU
    CONTAINERS = frozenset({"mp4", "mov"})
    _ids = itertools.count()
    _swept = False

    def __init__(self, nvc: Any, gpu: int, stream: Any, batch: int):
        if not NativeLoop._swept:  # once a process: the spool files of killed processes go
            NativeLoop._swept = True
            sweep_spool()
        self.nvc, self.gpu, self.stream = nvc, gpu, stream
        self.batch = max(1, batch)
        self._dec: Any = None
        self._path: str | None = None
        self._spool: Path | None = None  # this session's spool file (its last video's bytes)
        self._ended = True
        self._name = f"{_SPOOL_PREFIX}{os.getpid()}-{next(self._ids)}"

    def open(self, data: bytes, info: Any, path: str | None = None) -> str:
        if info.codec not in self.CODECS:
            return f"{info.codec}: gpubatch's NVDEC path takes {', '.join(sorted(self.CODECS))}"
        if path is None:
            if self._spool is None:
                self._spool = _spool_dir() / self._name
            # a new file for each video: the decoder's thread may still hold the last one open
            tmp = self._spool.with_name(self._spool.name + ".next")
            tmp.write_bytes(data)
            os.replace(tmp, self._spool)
            path = str(self._spool)
        self._path = path
        self.info = info
        self._ended = True  # (nothing is decoded before the first seek says from where)
        return ""

    def seek(self, k: int) -> None:
        self._start(k + self.info.offset)  # (the decoder counts the file's frames; a window's start at offset)

    def rewind(self) -> None:
        self._start(0)

    def _start(self, frame: int) -> None:
        if self._dec is None:
            self._dec = self.nvc.ThreadedDecoder(self._path, self.batch, gpu_id=self.gpu, cuda_context=0,
                                                 cuda_stream=self.stream.ptr, use_device_memory=True,
                                                 output_color_type=self.nvc.OutputColorType.NATIVE,
                                                 start_frame=frame)
        else:
            self._dec.reconfigure_decoder(self._path, frame)
        self._ended = False

    def next(self) -> list | None:
        if self._ended:
            return None
        # the last batch's frames are read by kernels on this stream: done before the decoder reuses them
        self.stream.synchronize()
        frames = self._dec.get_batch_frames(self.batch)
        if not frames:
            self._ended = True
            return None
        return list(frames)

    def close_video(self) -> None:
        self._ended = True

    def close(self) -> None:
        if self._dec is not None:
            try:
                self._dec.end()
            except Exception:  # noqa: BLE001 - the decoder is going anyway
                pass
            self._dec = None
        if self._spool is not None:
            self._spool.unlink(missing_ok=True)
            self._spool.with_name(self._spool.name + ".next").unlink(missing_ok=True)


class BothLoops:
    """A session's two loops, one a file: the native loop for the containers it was checked on (MP4, MOV), the Python
    loop for those only it was (Matroska, MPEG-TS, FLV; H.264 and HEVC). Asked for frame 0 of an MKV file with
    H.264, the native loop's decoder began at frame 36; asked to seek in an MPEG-TS file, its demuxer ended the
    process (PyNvVideoCodec 2.2.4, benchmarks/nvdec_containers.py, 2026-12-07). One loop holds a decoder at a
    time: the other's is closed when the session switches (``--gpu-memory`` plans one decoder a session)."""

    def __init__(self, nvc: Any, gpu: int, stream: Any, batch: int):
        self._args = (nvc, gpu, stream, batch)
        self._loops: dict[type, Any] = {}
        self._on: Any = None

    @staticmethod
    def route(info: Any) -> type | None:
        """The loop that takes ``info``'s container and codec, or None."""
        for cls in (NativeLoop, PythonLoop):
            if info.container in cls.CONTAINERS and info.codec in cls.CODECS:
                return cls
        return None

    def open(self, data: bytes, info: Any, path: str | None = None) -> str:
        cls = self.route(info) or NativeLoop
        if self._on is not None and not isinstance(self._on, cls):
            self._on.close()  # (its decoder freed: one a session)
        if cls not in self._loops:
            self._loops[cls] = cls(*self._args)
        self._on = self._loops[cls]
        return self._on.open(data, info, path)

    def seek(self, k: int) -> None:
        self._on.seek(k)

    def rewind(self) -> None:
        self._on.rewind()

    def next(self) -> list | None:
        return self._on.next()

    def close_video(self) -> None:
        if self._on is not None:
            self._on.close_video()

    def close(self) -> None:
        for loop in self._loops.values():
            loop.close()
