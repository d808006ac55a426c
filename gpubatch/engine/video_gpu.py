"""Video on the GPU: NVDEC decoders (PyNvVideoCodec), several at once so that every NVDEC engine works,
the frames through the chain's kernels, frames encoded by the GPU's JPEG encoder.

Each decoding thread owns one ``SimpleDecoder`` (reconfigured from video to video, as its construction
is the dominant per-file cost) and its own CUDA stream, launcher and encoder. A thread takes a whole
video: it decodes only the frames the video's outputs take (the decoder seeks to the keyframe before
them), a bounded number at a time (:class:`GpuFrameCursor`), runs each output's frames through the
chain with one set of drawn parameters, and encodes them. A file NVDEC cannot decode (its codec,
profile or size; ``GetDecoderCaps``) or whose frame count differs from the demuxer's goes to the CPU
path, counted as a fallback.

The GPU-NOTES figures: one decoder session reaches ~400 frames/s on 1080p H.264; seven reach ~2,400.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import ErrorRouter, RecordError, RunStats, Stage
from ..types import Media, Record
from .codecs.video import clip_members, encode_clip, info_of
from .codecs.video_gpu_caps import nvdec_supports
from .device import Device
from .plan import Plan
from .run import Job, RecordSink, RecordSource, outputs_of, read_counted, write_results

#: containers whose frames NVDEC's SimpleDecoder gives by the demuxer's indices (tested against PyAV); a
#: Matroska file gave other frames (2026-11-25, H100), so other containers decode on the CPU for now
INDEXED = frozenset({"mp4", "mov"})
#: frames a cursor decodes ahead in one call (bounded GPU memory: 64 1080p RGB frames are 400 MB)
CHUNK = 32


class NvdecSession:
    """One thread's decoder and CUDA stream, launcher and encoder on one GPU."""

    def __init__(self, gpu: int):
        import cupy as cp
        import PyNvVideoCodec as nvc

        from .batch import PinnedStaging
        from .launch import Launcher

        self.cp, self.nvc, self.gpu = cp, nvc, gpu
        cp.cuda.Device(gpu).use()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.staging = PinnedStaging(cp)
        self.launch = Launcher(cp, self.stream, self.staging)
        self.decoder: Any = None
        self._encoder: Any = None
        self.frames_decoded = 0
        self.pos = 0  # the index of the frame the decoder gives next

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from .codecs.image_encode_gpu import GpuImageEncoder

            self._encoder = GpuImageEncoder(self.gpu, 2, "batched", self.staging)
        return self._encoder

    def open(self, data: bytes, frames: int) -> Any:  # noqa: C901
        """The thread's decoder on ``data`` (reconfigured when it exists; made anew where that fails), or
        None where it does not see the ``frames`` frames the demuxer counted (the CPU decodes that file).
        A container whose header holds no frame count (Matroska, WebM) is scanned once."""
        self.pos = 0
        self.why = ""
        if self.decoder is not None:
            try:
                self.decoder.reconfigure_decoder(data)
                if len(self.decoder) == frames:
                    return self.decoder
            except Exception:  # noqa: BLE001 - a stream the cached decoders cannot take: a new one
                pass
            self.decoder = None
        for scan in (0, 1):
            try:
                # its own stream: on the legacy default stream every session's conversions and copies
                # would wait for one another
                self.decoder = self.nvc.SimpleDecoder(data, gpu_id=self.gpu, use_device_memory=True,
                                                      cuda_stream=self.stream.ptr,
                                                      need_scanned_stream_metadata=scan,
                                                      output_color_type=self.nvc.OutputColorType.RGB)
            except Exception as e:  # noqa: BLE001 - no frame count in the header (scan), or no NVDEC for it
                self.decoder = None
                self.why = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
                continue
            if len(self.decoder) == frames:
                return self.decoder
            self.why = f"NVDEC counts {len(self.decoder)} frames, the demuxer {frames}"
        self.decoder = None
        return None

    def decode(self, indices: list[int], keyframes: Any = None) -> list[Any]:
        """Frames ``indices`` of the open video as uint8 (H, W, 3) CuPy arrays of their own (copied out of
        the decoder's surfaces, on this session's stream), in the order asked.

        Frames are decoded in sequence: from where the decoder stands where the next frame asked lies
        before the next keyframe after it (``keyframes``, the demuxer's), else from a seek. A seek by
        index decodes from the keyframe before it, so runs of frames never pay it twice.
        """
        cp = self.cp
        want = sorted(set(indices))
        got: dict[int, Any] = {}
        k = 0
        while k < len(want):
            first = want[k]
            if first != self.pos and not (first > self.pos and _same_gop(keyframes, self.pos, first)):
                self.decoder.seek_to_index(first)
                self.pos = first
            last = first
            while k + 1 < len(want) and (want[k + 1] - last <= 1 or _same_gop(keyframes, last, want[k + 1])):
                k += 1
                last = want[k]
            k += 1
            while self.pos <= last:
                n = min(CHUNK, last + 1 - self.pos)
                frames = self.decoder.get_batch_frames(n)
                if not frames:
                    break
                with self.stream:
                    for f in frames:
                        if self.pos in got or self.pos not in want:
                            self.pos += 1
                            continue
                        a = cp.from_dlpack(f)
                        if a.ndim == 3 and a.shape[0] == 3 and a.shape[2] != 3:  # planar RGB: to HWC
                            a = a.transpose(1, 2, 0)
                        got[self.pos] = cp.ascontiguousarray(a).copy()
                        self.pos += 1
                self.frames_decoded += len(frames)
        return [got[i] for i in indices if i in got]

    def close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
        self.decoder = None


def _same_gop(keyframes: Any, a: int, b: int) -> bool:
    """Whether no keyframe lies in (a, b]: decoding on from ``a`` reaches ``b`` sooner than a seek."""
    if keyframes is None:
        return b - a <= CHUNK
    return bisect.bisect_right(keyframes, b) == bisect.bisect_right(keyframes, a)


class GpuFrameCursor:
    """A video's decoded frames on the GPU for its outputs asked in turn (the GPU twin of
    :class:`~gpubatch.engine.codecs.video.FrameCursor`): missing frames are decoded together with the
    next ones later outputs take, up to :data:`CHUNK`; a frame is dropped once its last output had it."""

    def __init__(self, session: NvdecSession, wanted: list[list[int]], key: str, origin: str, keyframes: Any = None):
        self.session, self.key, self.origin, self.keyframes = session, key, origin, keyframes
        self.order = [i for frames in wanted for i in frames]  # frames in the order outputs ask
        self.need: Counter = Counter(self.order)
        self.cache: dict[int, Any] = {}
        self._next = 0

    def frames(self, indices: list[int]) -> list[Any]:
        missing = sorted({i for i in indices if i not in self.cache})
        if missing:
            ahead: list[int] = []
            while self._next < len(self.order) and len(missing) + len(ahead) < CHUNK:
                i = self.order[self._next]
                self._next += 1
                if i not in self.cache and i not in missing and i not in ahead and self.need[i] > 0:
                    ahead.append(i)
            todo = sorted(set(missing) | set(ahead))
            try:
                got = self.session.decode(todo, self.keyframes)
            except Exception as e:  # noqa: BLE001 - a damaged stream: the outputs that need it fail
                raise RecordError(self.key, self.origin, Stage.DECODE, f"NVDEC: {str(e).splitlines()[0][:200]}") from None
            if len(got) != len(todo):
                raise RecordError(self.key, self.origin, Stage.DECODE,
                                  f"NVDEC gave {len(got)} of the {len(todo)} frames asked (damaged stream?)")
            self.cache.update(zip(todo, got))
        out = [self.cache[i] for i in indices]
        for i, n in Counter(indices).items():
            self.need[i] -= n
            if self.need[i] <= 0:
                self.cache.pop(i, None)
        return out


def _chain(session: NvdecSession, plan: Plan, frames: list[Any], params: list) -> list[Any]:
    """The chain on a clip's frames (one set of parameters for all), as uint8 HWC CuPy arrays."""
    if not plan.ops:
        return frames
    from .batch import Ragged
    from .gpu_chain import run_chain

    cp = session.cp
    with session.stream:
        out = run_chain(session, plan.ops, Ragged.from_items(cp, frames), [params] * len(frames))
        return out.items()


def _host(arrays: list[Any], session: NvdecSession) -> np.ndarray:
    cp = session.cp
    with session.stream:
        stacked = cp.stack(arrays) if arrays else cp.zeros((0, 1, 1, 3), cp.uint8)
        host = cp.asnumpy(stacked, stream=session.stream)
    session.stream.synchronize()
    return host


def _encode_job(session: NvdecSession, job: Job, cursor: GpuFrameCursor, plan: Plan, info: Any,
                stats: RunStats) -> Record:
    t = job.template
    frames = list(t.meta.get("frames") or ())
    params, _, _ = job.settle(plan, info.height, info.width)
    try:
        if t.codec == "mp4":  # the whole video: frame chunks through the chain, encoded on the CPU
            def stream() -> Iterator[np.ndarray]:
                for s in range(0, len(frames), CHUNK):
                    part = frames[s: s + CHUNK]
                    yield from _host(_chain(session, plan, cursor.frames(part), params), session)

            out = encode_clip(stream(), t, plan)
        else:
            done = _chain(session, plan, cursor.frames(frames), params)
            image_out = t.media is Media.IMAGE and "frame" in t.meta
            if image_out or t.codec in ("jpeg", "png"):
                codec = plan.out_codec(t.codec) if image_out else t.codec
                encoded = session.encoder.encode(done, codec, plan.jpeg_quality, session.stream)
                if any(b is None for b in encoded):
                    raise RecordError(t.key, t.origin, Stage.ENCODE, "the GPU encoder failed")
                if image_out:
                    out = t.with_(data=bytes(encoded[0]), codec=codec)
                else:
                    out = clip_members(t, [bytes(b) for b in encoded], codec)
            else:
                out = encode_clip(_host(done, session), t, plan)
    except RecordError:
        raise
    except Exception as e:  # noqa: BLE001 - the record boundary
        raise RecordError(t.key, t.origin, Stage.TRANSFORM, f"{type(e).__name__}: {e}") from None
    if plan.augmenting:
        stats.drawn[t.key] = params
    stats.add(transcoded=1)
    return out


def expand_device(session: NvdecSession, record: Record, plan: Plan, stats: RunStats,
                  fallback: Callable[[Record], list]) -> list[Record | RecordError]:
    """Everything one video record becomes, decoded by this thread's NVDEC session (the CPU path,
    counted, where NVDEC cannot decode it)."""
    outs = outputs_of(record, plan, stats)
    jobs = [j for j in outs if isinstance(j, Job)]
    if not jobs:
        return outs
    info = info_of(record, plan)
    why = ("rotated" if info.rotation else "a decoded clip" if info.container == "npy" else
           "" if info.container in INDEXED else f"{info.container}: NVDEC's frame indices are checked on MP4 and "
           "MOV files only") or (
        "" if nvdec_supports(info, session.gpu) else f"NVDEC here does not decode {info.codec} {info.pix_fmt} "
        f"{info.width}x{info.height}")
    if not why and session.open(record.data, info.frames) is None:  # NVDEC refused it, or counts other frames
        why = session.why or "NVDEC refused it"
    if why:
        stats.add(fallbacks=1)
        if stats.fallbacks <= 10:  # the first few by name (the summary counts them all)
            stats.warn(f"decoded on the CPU: {record.key} ({why})")
        return fallback(record)
    cursor = GpuFrameCursor(session, [list(j.template.meta.get("frames") or ()) for j in jobs], record.key,
                            record.origin, info.keyframes)
    result: list[Record | RecordError] = []
    for item in outs:
        if not isinstance(item, Job):
            result.append(item)
            continue
        try:
            result.append(_encode_job(session, item, cursor, plan, info, stats))
        except RecordError as e:
            result.append(e)
            if e.stage is Stage.DECODE:
                break
    return result


def run_video_device(device: Device, reader: RecordSource, entries: list[Any], writer: RecordSink, plan: Plan,
                     router: ErrorRouter, decoders: int, tick: Callable[[int], None] | None = None) -> None:
    """The whole run flow for video records on the GPU, ``decoders`` NVDEC sessions at once."""
    from .executor import expand_host, ordered_map
    from .media import DEVICE

    stats = router.stats
    plan.validate(DEVICE)
    import PyNvVideoCodec as nvc

    try:  # the driver readies this many decoder sessions (NVIDIA's multi-decoder recipe)
        nvc.SimpleDecoder.set_session_count(decoders)
    except Exception:  # noqa: BLE001 - an older PyNvVideoCodec without it: sessions start on demand
        pass
    local = threading.local()
    sessions: list[NvdecSession] = []
    lock = threading.Lock()

    def session() -> NvdecSession:
        s = getattr(local, "s", None)
        if s is None:
            s = local.s = NvdecSession(device.index)
            with lock:
                sessions.append(s)
        return s

    def work(entry: Any) -> list[Record | RecordError]:
        record = read_counted(reader, entry, stats)
        if isinstance(record, RecordError):
            return [record]
        if record.media is not Media.VIDEO:
            return expand_host(record, plan, stats)
        return expand_device(session(), record, plan, stats, lambda r: expand_host(r, plan, stats))

    try:
        write_results((r for rs in ordered_map(work, entries, decoders) for r in rs), writer, router, tick)
    finally:
        for s in sessions:
            s.close()
