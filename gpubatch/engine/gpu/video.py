"""Video on the GPU: NVDEC decoders (PyNvVideoCodec), several at once so that every NVDEC engine works,
the frames through the chain's kernels, frames encoded by the GPU's JPEG encoder.

Each decoding thread owns one :class:`NvdecSession`: its decoder and packet loop (:mod:`.nvdec_loop`,
kept from video to video), CUDA stream, launcher and encoder. A thread takes a whole video: it
decodes only the frames the video's outputs take (from the keyframe before them), a bounded number at
a time (:class:`GpuFrameCursor`), runs each output's frames through the chain with one set of drawn
parameters, and encodes them (outputs of one frame each, ``--frames``, a chunk at a time). A file NVDEC
cannot decode (codec, profile or size by ``GetDecoderCaps``; a codec or container the loop's frames
were not checked in; rotated files) goes to the CPU path, counted and named in the summary.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...errors import RecordError, RunStats, Stage, reason_of
from ...types import Media, Record
from ..codecs.video import SourcedFrames, clip_members, encode_clip, info_of
from ..device import Device
from ..plan import Plan
from ..run import Job, RecordSource, outputs_of, read_counted
from ..settings import Settings
from .nvdec_loop import cpu_reason

#: frames a cursor decodes ahead in one call (bounded GPU memory: 64 1080p RGB frames are 400 MB)
CHUNK = 32
#: frames a capped run's plan decodes at most to measure what a frame holds (fewer where the cap is small)
CALIBRATION_FRAMES = 8


class NvdecSession:
    """One thread's NVDEC decoder, CUDA stream, launcher and encoder on one GPU.

    The decoder's packet loop (:mod:`.nvdec_loop`) runs natively (PyNvVideoCodec's ``ThreadedDecoder``,
    the default) or in Python (PyAV demuxing into ``CreateDecoder``; ``loop="python"``). Either way the
    frames come back in display order with their container timestamps, which name their indices as the
    CPU path gives them. Decoding releases the GIL, so the sessions of several threads keep several
    NVDEC engines busy. The NV12 (P016 for 10 and 12 bits) frames become RGB in gpubatch's own kernel
    (kernels/yuv.cu), with the stream's matrix and range.
    """

    def __init__(self, gpu: int, chunk: int = CHUNK, loop: str = "native"):
        import cupy as cp
        import PyNvVideoCodec as nvc

        from ..batch import PinnedStaging
        from .launch import Launcher
        from .nvdec_loop import loop_class

        self.cp, self.nvc, self.gpu = cp, nvc, gpu
        self.chunk = chunk  # frames decoded ahead in one call (fewer under --gpu-memory)
        cp.cuda.Device(gpu).use()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.staging = PinnedStaging(cp)
        self.launch = Launcher(cp, self.stream, self.staging)
        self._encoder: Any = None
        self.frames_decoded = 0
        self.why = ""
        self.loop = loop_class(loop, nvc)  # (its codecs and containers: cpu_reason)
        self._loop: Any = self.loop(nvc, gpu, self.stream, chunk)

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from ..codecs.image_encode_gpu import GpuImageEncoder

            self._encoder = GpuImageEncoder(self.gpu, 2, "batched", self.staging)
        return self._encoder

    def open(self, data: bytes, info: Any, path: str | None = None) -> bool:
        """Ready to decode the video ``data`` (``info``: its probe; ``path``: its file, where it is one);
        False, with the reason in ``why``, where this path does not take it."""
        self.why = self._loop.open(data, info, path)
        if self.why:
            return False
        self.info = info
        self._index = {int(p): i for i, p in enumerate(info.pts)}
        self._coef = yuv_coefficients(info.colorspace, info.color_range, info.height)
        self._started = False
        self.pos = -1  # the greatest frame index the decoder gave since the last seek
        return True

    def _seek(self, index: int) -> None:
        """Decode on from the keyframe before frame ``index``."""
        k = self.info.keyframe_before(index)
        self._loop.seek(k)
        self._started = True
        self.pos = k - 1

    def _rgb(self, frame: Any) -> Any:
        """A decoded NV12/P016 frame as an RGB uint8 (H, W, 3) CuPy array of its own (on this stream)."""
        return yuv_to_rgb(self.cp, self.stream, frame, self._coef)

    def decode(self, indices: list[int]) -> list[Any]:
        """Frames ``indices`` of the open video as uint8 (H, W, 3) CuPy arrays of their own, in the order
        asked. Decoding goes on from where it stands where the next frame asked lies before the next
        keyframe after it, else from a seek to the keyframe before that frame (the CPU path's rule)."""
        want = set(indices)
        got: dict[int, Any] = {}
        for target in sorted(want):
            if target in got:
                continue
            sought = not self._started or target <= self.pos or self.info.keyframe_before(target) > self.pos + 1
            if sought:
                self._seek(target)
            again = False
            while target not in got:
                frames = self._loop.next()
                if frames is None:
                    raise ValueError(f"the stream ends before frame {target}")
                self.frames_decoded += len(frames)
                first = None
                for f in frames:
                    i = self._index.get(int(f.timestamp))
                    if i is None:
                        continue
                    first = i if first is None else first
                    self.pos = max(self.pos, i)
                    if i in want and i not in got:
                        got[i] = self._rgb(f)
                if sought and first is not None:
                    sought = False
                    if first > target and target not in got:  # the seek went past the frame (a timestamp off)
                        if again or (self.info.keyframe_before(target) == 0 and not self.info.offset):
                            raise ValueError(f"the decoder began at frame {first}, after frame {target}")
                        self._loop.rewind()  # from the file's start, then
                        self.pos, sought, again = -1, True, True
        return [got[i] for i in indices]

    def close(self) -> None:
        self._loop.close()
        if self._encoder is not None:
            self._encoder.close()


def yuv_to_rgb(cp: Any, stream: Any, frame: Any, coef: tuple[float, ...]) -> Any:
    """A decoded NV12/P016 frame (DLPack: its luma rows, then its chroma rows, one pitch) as an RGB uint8
    (H, W, 3) CuPy array of its own, made on ``stream`` with :func:`yuv_coefficients`' ``coef``."""
    from ..kernels import kernel

    with stream:
        a = cp.from_dlpack(frame)
        h, w = a.shape[0] * 2 // 3, a.shape[1]
        pitch = a.strides[0] // a.itemsize
        out = cp.empty((h, w, 3), cp.uint8)
        k = kernel("yuv", "p016_rgb" if a.itemsize == 2 else "nv12_rgb")
        k(((w + 255) // 256, h), (256,), (a, a[h:], np.int32(pitch), np.int32(h), np.int32(w), out,
                                           *(np.float32(c) for c in coef)))
    return out


#: Kr, Kb of the YUV matrices PyAV's reformatter names (colour_matrix)
_KRB = {"ITU709": (0.2126, 0.0722), "ITU601": (0.299, 0.114), "SMPTE170M": (0.299, 0.114), "FCC": (0.30, 0.11),
        "SMPTE240M": (0.212, 0.087), "BT2020": (0.2627, 0.0593)}


def yuv_coefficients(colorspace: int, color_range: int, height: int) -> tuple[float, ...]:
    """(ys, yo, crv, cgu, cgv, cbu) of kernels/yuv.cu for a stream's matrix (the one the CPU path
    takes: codecs.video.colour_matrix) and range (2: full, else limited)."""
    from ..codecs.video import colour_matrix

    kr, kb = _KRB[colour_matrix(colorspace, height)]
    kg = 1.0 - kr - kb
    ys, yo, cs = (1.0, 0.0, 1.0) if color_range == 2 else (255.0 / 219.0, 16.0, 255.0 / 224.0)
    return (ys, yo, 2 * (1 - kr) * cs, 2 * kb * (1 - kb) / kg * cs, 2 * kr * (1 - kr) / kg * cs, 2 * (1 - kb) * cs)


class GpuFrameCursor:
    """A video's decoded frames on the GPU for its outputs asked in turn (the GPU twin of
    :class:`~gpubatch.engine.codecs.video.FrameCursor`): missing frames are decoded together with the
    next ones later outputs take, up to the session's ``chunk``; a frame is dropped once its last output had it."""

    def __init__(self, session: NvdecSession, wanted: list[list[int]], key: str, origin: str):
        self.session, self.key, self.origin = session, key, origin
        self.order = [i for frames in wanted for i in frames]  # frames in the order outputs ask
        self.need: Counter = Counter(self.order)
        self.cache: dict[int, Any] = {}
        self._next = 0

    def frames(self, indices: list[int]) -> list[Any]:
        missing = sorted({i for i in indices if i not in self.cache})
        if missing:
            ahead: list[int] = []
            while self._next < len(self.order) and len(missing) + len(ahead) < self.session.chunk:
                i = self.order[self._next]
                self._next += 1
                if i not in self.cache and i not in missing and i not in ahead and self.need[i] > 0:
                    ahead.append(i)
            todo = sorted(set(missing) | set(ahead))
            try:
                got = self.session.decode(todo)
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


def _chain(session: NvdecSession, plan: Plan, frames: list[Any], params: Any, each: bool = False) -> list[Any]:
    """The chain on a clip's frames (one set of parameters for all; ``each``: ``params`` is a list, one set a
    frame), as uint8 HWC CuPy arrays."""
    if not plan.ops:
        return frames
    from ..batch import Ragged
    from .chain import run_chain

    cp = session.cp
    with session.stream:
        out = run_chain(session, plan.ops, Ragged.from_items(cp, frames), params if each else [params] * len(frames))
        return out.items()


def _host(arrays: list[Any], session: NvdecSession) -> np.ndarray:
    cp = session.cp
    with session.stream:
        stacked = cp.stack(arrays) if arrays else cp.zeros((0, 1, 1, 3), cp.uint8)
        host = cp.asnumpy(stacked, stream=session.stream)
    session.stream.synchronize()
    return host


def _encode_job(session: NvdecSession, job: Job, cursor: GpuFrameCursor, plan: Plan, info: Any,
                stats: RunStats, source: bytes = b"") -> Record:
    t = job.template
    frames = list(t.meta.get("frames") or ())
    params, _, _ = job.settle(plan, info.height, info.width)
    try:
        if t.codec == "mp4":  # the whole video: frame chunks through the chain, encoded on the CPU
            def stream() -> Iterator[np.ndarray]:
                for s in range(0, len(frames), session.chunk):
                    part = frames[s: s + session.chunk]
                    yield from _host(_chain(session, plan, cursor.frames(part), params), session)

            out = encode_clip(SourcedFrames(stream(), source), t, plan)  # (its audio track copied)
        else:  # (a clip: single frames as images go through _encode_frames)
            done = _chain(session, plan, cursor.frames(frames), params)
            if t.codec in ("jpeg", "png"):
                encoded = session.encoder.encode(done, t.codec, plan.jpeg_quality, session.stream)
                if any(b is None for b in encoded):
                    raise RecordError(t.key, t.origin, Stage.ENCODE, "the GPU encoder failed")
                out = clip_members(t, [bytes(b) for b in encoded], t.codec)
            else:
                out = encode_clip(_host(done, session), t, plan)
    except RecordError:
        raise
    except Exception as e:  # noqa: BLE001 - the record boundary
        raise RecordError(t.key, t.origin, Stage.TRANSFORM, reason_of(e)) from None
    if plan.augmenting:
        stats.drawn[t.key] = params
    stats.add(transcoded=1)
    return out


def _single_frame(job: Job) -> bool:
    """An output that is one frame as an image (``--frames``): such outputs of a video go through the chain
    and the encoder together, a batch at a time."""
    t = job.template
    return t.media is Media.IMAGE and "frame" in t.meta and len(t.meta.get("frames") or ()) == 1


def _encode_frames(session: NvdecSession, jobs: list[Job], cursor: GpuFrameCursor, plan: Plan, info: Any,
                   stats: RunStats, mark: Callable[[str], None] | None = None) -> list[Record | RecordError]:
    """Single-frame image outputs of one video (:func:`_single_frame`), in one decode call, one pass of the
    chain (each with its own drawn parameters) and one call of the encoder. A decode error fails them
    all (raised); an encode error, the frames the encoder failed."""
    frames = [j.template.meta["frames"][0] for j in jobs]
    params = [j.settle(plan, info.height, info.width)[0] for j in jobs]
    pixels = cursor.frames(frames)  # (a RecordError of the decode stage goes up: the video's outputs end)
    if mark is not None:
        mark("first frames decoded")
    try:
        done = _chain(session, plan, pixels, params, each=True)
        codec = plan.out_codec(jobs[0].template.codec)
        encoded = session.encoder.encode(done, codec, plan.jpeg_quality, session.stream)
    except Exception as e:  # noqa: BLE001 - the records' boundary
        return [RecordError(j.template.key, j.template.origin, Stage.TRANSFORM, reason_of(e))
                for j in jobs]
    out: list[Record | RecordError] = []
    for j, p, b in zip(jobs, params, encoded):
        t = j.template
        if b is None:
            out.append(RecordError(t.key, t.origin, Stage.ENCODE, "the GPU encoder failed"))
            continue
        if plan.augmenting:
            stats.drawn[t.key] = p
        stats.add(transcoded=1)
        out.append(t.with_(data=bytes(b), codec=codec))
    return out


def expand_device(session: NvdecSession, record: Record, plan: Plan, stats: RunStats,
                  fallback: Callable[[Record], list], mark: Callable[[str], None] | None = None) -> list[Record | RecordError]:
    """Everything one video record becomes, decoded by this thread's NVDEC session (the CPU path,
    counted, where NVDEC cannot decode it); ``mark`` told its steps (the worker's first video opened, its first
    frames decoded and encoded)."""
    outs = outputs_of(record, plan, stats)
    jobs = [j for j in outs if isinstance(j, Job)]
    if not jobs:
        return outs
    info = info_of(record, plan)
    if mark is not None:
        mark("first video probed")
    why = cpu_reason(info, session.gpu, session.loop)
    if mark is not None:
        mark("first video's decoder asked")
    if not why and not session.open(record.data, info):  # a codec this path does not take, or NVDEC refused it
        why = session.why or "NVDEC refused it"
    if why:
        stats.add(fallbacks=1)
        stats.warn(f"decoded on the CPU: {record.key} ({why})")  # (the summary names the first 10)
        return fallback(record)
    if mark is not None:
        mark("first video opened")
    cursor = GpuFrameCursor(session, [list(j.template.meta.get("frames") or ()) for j in jobs], record.key,
                            record.origin)
    result: list[Record | RecordError] = []
    batch: list[Job] = []  # single-frame outputs waiting to go through the chain and the encoder together

    def frames_out() -> None:
        result.extend(_encode_frames(session, batch, cursor, plan, info, stats, mark))
        batch.clear()
        if mark is not None:
            mark("first frames decoded and encoded")

    try:
        for item in outs:
            if isinstance(item, Job) and _single_frame(item):
                batch.append(item)
                if len(batch) >= session.chunk:
                    frames_out()
                continue
            if batch:
                frames_out()
            if not isinstance(item, Job):
                result.append(item)
                continue
            try:
                result.append(_encode_job(session, item, cursor, plan, info, stats, record.data))
            except RecordError as e:
                if e.stage is Stage.DECODE:
                    raise
                result.append(e)
        if batch:
            frames_out()
    except RecordError as e:  # the stream cannot be decoded on: the video's outputs end here
        if e.stage is not Stage.DECODE:
            raise
        result.append(e)
    return result


def fit_cap(spec: str, device: Device, reader: RecordSource, entries: list[Any], plan: Plan, decoders: int,
            stats: RunStats, stack_bytes: int | None = Settings.stack_bytes, n: int = 16,
            video_loop: str = Settings.video_loop) -> tuple[int, int]:
    """Under ``--gpu-memory``: (NVDEC sessions, frames a session decodes ahead) that keep this run's device
    memory under the cap, as the driver counts it (:mod:`.gpu_memory`).

    Measured: the CUDA context (its stack lowered to ``stack_bytes`` first, as the image engine does),
    then one session on the largest video NVDEC takes among ``n`` entries spread over the dataset (its
    decoder's surfaces, its stream and staging, the kernels), and a frame's working set: up to
    :data:`CALIBRATION_FRAMES` frames decoded and through the chain, held at once, against one (no less
    than the RGB frame, the chain's output twice and the decoder's output surface). A session holds its
    frames decoded ahead and those of its longest output at once; sessions go first, then frames ahead,
    down to one session decoding an output's frames only. CuPy's pool is bounded by what the cap leaves.
    Refuses, naming the parts, where that does not fit."""
    import cupy as cp

    from ...errors import GpubatchError
    from ..codecs.video import info_of
    from ..codecs.video_gpu_caps import nvc
    from .memory import MARGIN, MiB, below, named, spread, start_capped
    from .nvdec_loop import loop_class

    cap, mem, context = start_capped(spec, device.index, stack_bytes)
    loop = loop_class(video_loop, nvc())
    largest, frames = None, 1
    for entry in spread(entries, n):
        try:
            record = reader.read(entry)
            if record.media is not Media.VIDEO:
                continue
            info = info_of(record, plan)
            jobs = [j for j in outputs_of(record, plan, RunStats()) if isinstance(j, Job)]
        except Exception:  # noqa: BLE001 - a bad record is the run's to report
            continue
        longest = max((len(j.template.meta.get("frames") or ()) for j in jobs), default=0)
        if not jobs or cpu_reason(info, device.index, loop):
            continue
        if jobs[0].template.codec == "mp4":
            longest = min(longest, CHUNK)  # a whole video goes through the chain a chunk at a time
        frames = max(frames, longest)
        if largest is None or info.width * info.height > largest[1].width * largest[1].height:
            largest = (record, info)
    pool = cp.get_default_memory_pool()
    parts = {"context": context // MiB}

    def refuse(least: int, clip: int) -> GpubatchError:
        return GpubatchError(below(spec, least, parts | {"one clip's frames": -(-clip // MiB)}))

    if largest is not None:  # a cap that cannot hold even the frames of one output refuses before a decoder
        h, w = largest[1].height, largest[1].width
        clip = 2 * (3 * h * w + 3 * h * w // 2)
        if cap < context + MARGIN + clip:
            raise refuse(context + MARGIN + clip, clip)
    if largest is None:  # NVDEC takes none of the sample: the CPU decodes, the GPU holds the context
        fixed, per_session, frame = context, 0, 0
    else:
        record, info = largest
        session = NvdecSession(device.index, 1, video_loop)
        try:
            if not session.open(record.data, info):
                raise GpubatchError(f"--gpu-memory: NVDEC refused {record.key} ({session.why})")
            h, w = info.height, info.width
            params = plan.draw(record.key, h, w)
            try:
                oh, ow = plan.out_hw(h, w, params)
            except Exception:  # noqa: BLE001 - an op that refuses the size: the frame's own size bounds it
                oh, ow = h, w
            least = 3 * h * w + 2 * 3 * oh * ow + 3 * h * w // 2  # RGB, the chain's output twice, NV12
            # a calibration: one frame, then a few frames decoded and through the chain, held at once (what
            # a session's frames take as the driver counts it: the decoder's own frame buffers too), as many
            # as the cap leaves room for by the estimate, so that the calibration itself stays under it
            got = [_chain(session, plan, session.decode([0]), params)]
            session.stream.synchronize()
            one = mem.settled()
            k = max(1, min(CALIBRATION_FRAMES, len(info.times), (cap - one - MARGIN) // (4 * least)))
            if k > 1:
                got.append(_chain(session, plan, session.decode(list(range(k))), params))
                session.stream.synchronize()
            measured = (mem.settled() - one) // (k - 1) if k > 1 else 0
            del got
            pool.free_all_blocks()
            fixed = mem.settled()
        finally:
            session.close()
        per_session = max(0, fixed - context)
        parts["decoder and kernels"] = per_session // MiB
        frame = max(measured, least)
    room = cap - fixed - MARGIN

    def need(sessions: int, ahead: int) -> int:
        return sessions * (ahead + frames) * frame + (sessions - 1) * per_session

    sessions, ahead = max(1, decoders), CHUNK
    while sessions > 1 and need(sessions, ahead) > room:
        sessions -= 1
    while ahead > 1 and need(sessions, ahead) > room:
        ahead = max(1, ahead // 2)
    if need(1, 1) > room:
        raise refuse(fixed + MARGIN + need(1, 1), need(1, 1))
    pool.set_limit(size=max(0, room - (sessions - 1) * per_session))
    stats.gpu_memory.update(cap_mib=cap // MiB, processes=1, plan=(
        f"{fixed // MiB} MiB before the first frame ({named(parts)}), "
        f"{sessions} NVDEC session{'s' if sessions > 1 else ''} decoding {ahead} frames ahead"))
    return sessions, ahead


class VideoDeviceUnit:
    """Video on the GPU, in a GPU's worker process: ``settings.video_decoders`` NVDEC sessions, one a
    thread of a pool kept across the worker's tasks (a session is made once a thread, reconfigured per
    file), the records of the worker's tasks decoded in its threads, ``2 x sessions`` at a time across the
    tasks' boundaries, and written in dataset order into their shards, each committed once its last is in;
    a file NVDEC cannot decode goes to the CPU path, counted. Under ``--gpu-memory``, as many sessions as
    the cap holds, decoding as far ahead as it allows (:func:`fit_cap`, planned on the first task)."""

    def __init__(self, ctx: Any, slot: int):
        import sys

        import PyNvVideoCodec as nvc

        from ..media import DEVICE

        self.ctx = ctx
        self.plan = ctx.plan
        self.plan.validate(DEVICE)
        self.device = ctx.device
        # NVDEC sessions: the run's, shared out between the processes that share the GPU
        self.decoders = max(1, -(-ctx.settings.video_decoders // max(1, int(getattr(ctx, "gpu_procs", 1) or 1))))
        self.chunk = CHUNK
        self.nvc = nvc
        # the decoding threads hand the GIL over between their Python steps (as the image engine sets it)
        if sys.getswitchinterval() > ctx.settings.switch_interval:
            sys.setswitchinterval(ctx.settings.switch_interval)
        self.local = threading.local()
        self.sessions: list[NvdecSession] = []
        self.lock = threading.Lock()
        self.pool: Any = None
        self.marks: Any = None  # (when this worker's steps came: the summary's "wall (worker): NAME"; _run makes it)

    @classmethod
    def make(cls, ctx: Any, slot: int) -> VideoDeviceUnit:
        return cls(ctx, slot)

    def session(self) -> NvdecSession:
        s = getattr(self.local, "s", None)
        if s is None:
            s = self.local.s = NvdecSession(self.device.index, self.chunk, self.ctx.settings.video_loop)
            with self.lock:
                self.sessions.append(s)
            self._mark("first NVDEC session made")
        return s

    def _mark(self, name: str) -> None:
        if self.marks is not None:
            with self.lock:
                self.marks.once(name)

    def _start(self, reader: Any, entries: list[Any], stats: RunStats) -> None:
        from concurrent.futures import ThreadPoolExecutor

        if self.ctx.gpu_memory is not None:
            self.decoders, self.chunk = fit_cap(self.ctx.gpu_memory, self.device, reader, entries, self.plan,
                                                self.decoders, stats, self.ctx.settings.stack_bytes,
                                                video_loop=self.ctx.settings.video_loop)
        try:  # the driver readies this many decoder sessions (NVIDIA's multi-decoder recipe)
            self.nvc.SimpleDecoder.set_session_count(self.decoders)
        except Exception:  # noqa: BLE001 - an older PyNvVideoCodec without it: sessions start on demand
            pass
        self.pool = ThreadPoolExecutor(max_workers=self.decoders, thread_name_prefix="gpubatch-nvdec")

    def run(self, reader: Any, tasks: Any, writing: Callable[[Any], Any], done: Callable[[Any], None]) -> None:
        try:
            self._run(reader, tasks, writing, done)
        finally:
            from .nvdec_loop import drop_spools

            drop_spools()  # (the sessions' last videos: the process may be ended before it closes them)

    def _run(self, reader: Any, tasks: Any, writing: Callable[[Any], Any], done: Callable[[Any], None]) -> None:
        """The tasks' videos on the sessions' threads, ``2 x sessions`` at a time across the tasks'
        boundaries (:func:`~..execute.worker.write_across`): a shard of two videos (``--shard-size auto``'s
        least for video) kept two of the eight sessions at work while it drained, one shard at a time."""
        import itertools

        from ..execute.boot import TIMES as BOOT_TIMES
        from ..execute.worker import merge_part, stats_part, write_across
        from ..executor import expand_host
        from . import start
        from .marks import Marks

        plan = self.plan
        tasks = iter(tasks)  # (a queue's, where workers take tasks as they free up: taken as the window reaches them)
        first = next(tasks, None)
        if first is None:
            return
        if self.marks is None:
            self.marks = Marks(self.ctx.started)
            for name, when in BOOT_TIMES.items():  # (the boot's steps: its run came, unpickled)
                self.marks.at(name, when)
            self.marks.mark("unit start", start.booted(self.device.index)[0])
            for name, when in start.step_walls(self.device.index).items():  # (the GPU's start, step by step)
                self.marks.at(f"gpu start: {name}", when)
        started = RunStats()  # (the plan of --gpu-memory, which goes with the first shard)
        if self.pool is None:
            self._start(reader, list(first.entries), started)
            self._mark("sessions' threads started")

        def shard(task: Any) -> Any:
            w = writing(task)
            if task is first:
                merge_part(w.stats, stats_part(started))
            return w

        def work(entries: list[Any], stats: RunStats) -> list[tuple[list, None]]:
            out = []
            for entry in entries:
                record = read_counted(reader, entry, stats)
                self._mark("first record read")
                if isinstance(record, RecordError):
                    out.append(([record], None))
                elif record.media is not Media.VIDEO:
                    out.append((expand_host(record, plan, stats), None))
                else:
                    out.append((expand_device(self.session(), record, plan, stats,
                                              lambda r: expand_host(r, plan, stats), self._mark), None))
                    self._mark("first video's outputs made")
            return out

        def steps() -> dict | None:  # (a commit's: the worker's steps since the one before)
            with self.lock:
                taken = self.marks.take()
            return {"marks": taken} if taken else None

        write_across(itertools.chain([first], tasks), shard, done,
                     lambda entries, w: self.pool.submit(work, entries, w.stats), self.decoders * 2, extra=steps)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        for s in self.sessions:
            s.close()
