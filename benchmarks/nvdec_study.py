"""Why NVDEC sessions in threads do not scale: 1080p frames/s over the same clips, four ways.

- simple-threads: PyNvVideoCodec's SimpleDecoder, one per thread (what gpubatch's video path used
  first): RGB frames by index, each copied out.
- simple-procs: the same, one process per session (a GIL each).
- core-threads: NVIDIA's multi-decoder recipe, CreateDemuxer + CreateDecoder per thread, NV12 frames
  counted (not copied).
- pyav-threads: PyAV demuxes (with the mp4-to-Annex-B bitstream filter) and feeds packets with their
  timestamps to CreateDecoder per thread: the frames come back with the demuxer's timestamps, so they
  map to the same frame indices as the CPU path.
- gpubatch, gpubatch-python: gpubatch's NvdecSession (the path convert and VideoPipeline take) with its
  native loop (ThreadedDecoder) and with its Python packet loop, every frame by index in chunks of 32,
  RGB frames of their own (gpubatch's NV12-to-RGB kernel).
- threaded: PyNvVideoCodec 2.2's ThreadedDecoder (demux and decode on a native thread), one per thread,
  NV12 frames in batches of 32 counted; threaded-rgb: the same, each frame made RGB by gpubatch's kernel.
- spdl: SPDL's ``spdl.io.demux_video`` + ``decode_packets_nvdec`` (one native call per file into one CUDA
  buffer of RGB frames); needs FFmpeg's shared libraries (PyAV's, under their plain names).

    python3 benchmarks/nvdec_study.py --files 8 --cache /tmp/vcache --sessions 1,4,8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _files(cache: Path, codec: str, n: int, seconds: float) -> list[Path]:
    from gpubatch.synthetic import _clip

    enc = {"h264": "libx264", "hevc": "libx265"}[codec]
    cache.mkdir(parents=True, exist_ok=True)
    paths = [cache / f"{codec}_1080p_{k}_{seconds:g}s.mp4" for k in range(n)]
    todo = [(p, k, 1920, 1080, enc, seconds, 30) for k, p in enumerate(paths) if not p.exists()]
    if todo:
        with ProcessPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            list(pool.map(_clip, todo))
    return paths


def _threads(work, paths: list[Path], sessions: int) -> tuple[int, float]:
    queue = list(paths) * 2
    lock = threading.Lock()
    done = [0]
    ready = threading.Barrier(sessions + 1)

    def run() -> None:
        state = work(None, None)  # set up (decoder objects of this thread)
        ready.wait()
        ready.wait()
        while True:
            with lock:
                if not queue:
                    break
                p = queue.pop()
            n = work(state, p)
            with lock:
                done[0] += n

    ts = [threading.Thread(target=run) for _ in range(sessions)]
    for t in ts:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    ready.wait()
    for t in ts:
        t.join()
    import cupy as cp

    cp.cuda.Device(0).synchronize()
    return done[0], time.perf_counter() - t0


def simple(state, path):
    import PyNvVideoCodec as nvc

    if path is None:
        return {}
    d = nvc.SimpleDecoder(str(path), gpu_id=0, use_device_memory=True, output_color_type=nvc.OutputColorType.RGB)
    n = 0
    while True:
        frames = d.get_batch_frames(32)
        if not frames:
            return n
        n += len(frames)


def core(state, path):
    import PyNvVideoCodec as nvc

    if path is None:
        return {}
    dmx = nvc.CreateDemuxer(filename=str(path))
    key = dmx.GetNvCodecId()
    dec = state.get(key)
    if dec is None:
        dec = state[key] = nvc.CreateDecoder(gpuid=0, codec=key, cudacontext=0, cudastream=0, usedevicememory=True)
    n = 0
    for packet in dmx:
        n += len(dec.Decode(packet))
    n += len(dec.Decode(nvc.PacketData()))  # flush
    return n


FACTS: dict = {}


def pyav(state, path):
    import av
    import numpy as np
    import PyNvVideoCodec as nvc

    if path is None:
        return {}
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        bsf = av.BitStreamFilterContext(f"{s.codec_context.name}_mp4toannexb", s)
        codec = {"h264": nvc.cudaVideoCodec.H264, "hevc": nvc.cudaVideoCodec.HEVC}[s.codec_context.name]
        dec = state.get("dec")
        if dec is None:
            dec = state["dec"] = nvc.CreateDecoder(gpuid=0, codec=codec, cudacontext=0, cudastream=0,
                                                   usedevicememory=True)
        n = 0
        pts_out = []
        for p in c.demux(s):
            for q in bsf.filter(p) if p.size else []:
                buf = np.frombuffer(bytes(q), np.uint8)
                pk = nvc.PacketData()
                pk.bsl_data, pk.bsl, pk.pts = buf.ctypes.data, buf.size, int(q.pts)
                got = dec.Decode(pk)
                n += len(got)
                if not FACTS.get("frame") and got:
                    f = got[0]
                    FACTS["frame"] = [a for a in dir(f) if not a.startswith("__")]
                    FACTS["frame_shape"] = str(getattr(f, "shape", None))
                    FACTS["frame_ts"] = str(getattr(f, "timestamp", None))
                pts_out += [getattr(f, "timestamp", None) for f in got]
        got = dec.Decode(nvc.PacketData())
        n += len(got)
        pts_out += [getattr(f, "timestamp", None) for f in got]
        FACTS.setdefault("pts_sample", pts_out[:8])
        return n


def gpubatch_path(state, path, loop: str = "native"):
    from gpubatch.engine.codecs.video_probe import probe
    from gpubatch.engine.gpu.video import CHUNK, NvdecSession

    if path is None:
        return {"s": NvdecSession(0, loop=loop)}
    s = state["s"]
    data = path.read_bytes()
    info = probe(data)
    if not s.open(data, info, str(path)):
        raise RuntimeError(s.why)
    for a in range(0, info.frames, CHUNK):
        s.decode(list(range(a, min(a + CHUNK, info.frames))))
    s.stream.synchronize()
    return info.frames


def gpubatch_python(state, path):
    return gpubatch_path(state, path, "python")


def _threaded(state, path, rgb: bool):
    import PyNvVideoCodec as nvc

    if path is None:
        return {}
    d = state.get("dec")
    if d is None:
        d = state["dec"] = nvc.ThreadedDecoder(str(path), 32, gpu_id=0, use_device_memory=True,
                                               output_color_type=nvc.OutputColorType.NATIVE)
    else:
        d.reconfigure_decoder(str(path))
    n = 0
    if rgb and "stream" not in state:
        import cupy as cp

        state["cp"], state["stream"] = cp, cp.cuda.Stream(non_blocking=True)
    while True:
        frames = d.get_batch_frames(32)
        if not frames:
            break
        if not FACTS.get("threaded_frame"):
            f = frames[0]
            FACTS["threaded_frame"] = [a for a in dir(f) if not a.startswith("__")]
            FACTS["threaded_ts"] = [getattr(x, "timestamp", None) for x in frames[:8]]
        if rgb:  # (gpubatch's conversion, as NvdecSession makes it, frame by frame)
            from gpubatch.engine.gpu.video import yuv_coefficients, yuv_to_rgb

            coef = yuv_coefficients(1, 1, 1080)
            for f in frames:
                yuv_to_rgb(state["cp"], state["stream"], f, coef)
            state["stream"].synchronize()
        n += len(frames)
    return n


def threaded(state, path):
    return _threaded(state, path, False)


def threaded_rgb(state, path):
    return _threaded(state, path, True)


def spdl(state, path):
    import spdl.io as sio

    if path is None:
        return {"cfg": sio.cuda_config(device_index=0)}
    buf = sio.decode_packets_nvdec(sio.demux_video(str(path)), device_config=state["cfg"])
    import cupy as cp

    a = cp.asarray(buf)
    FACTS.setdefault("spdl_shape", str(a.shape))
    cp.cuda.Device(0).synchronize()
    return int(a.shape[0])


def _proc(args):
    paths, = args
    return sum(simple({}, p) for p in paths)


def procs(paths: list[Path], sessions: int) -> tuple[int, float]:
    import multiprocessing as mp

    work = [list(paths) * 2][0]
    chunks = [[work[i] for i in range(k, len(work), sessions)] for k in range(sessions)]
    with ProcessPoolExecutor(max_workers=sessions, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_proc, [([paths[0]],)] * sessions))  # warm: CUDA contexts exist
        t0 = time.perf_counter()
        n = sum(pool.map(_proc, [(c,) for c in chunks]))
        return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--codec", default="h264")
    ap.add_argument("--sessions", default="1,4,8")
    ap.add_argument("--modes", default="simple-threads,simple-procs,core-threads,pyav-threads")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vcache"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    out: dict = {}
    for codec in a.codec.split(","):
        paths = _files(a.cache, codec, a.files, a.seconds)
        for mode in a.modes.split(","):
            for n in (int(x) for x in a.sessions.split(",")):
                try:
                    if mode == "simple-procs":
                        runs = [procs(paths, n)]
                    else:
                        fn = {"simple-threads": simple, "core-threads": core, "pyav-threads": pyav, "gpubatch": gpubatch_path,
                              "gpubatch-python": gpubatch_python,
                              "threaded": threaded, "threaded-rgb": threaded_rgb, "spdl": spdl}[mode]
                        runs = [_threads(fn, paths, n) for _ in range(2)]
                    fps = statistics.median(f / s for f, s in runs)
                    out.setdefault(codec, {}).setdefault(mode, {})[n] = round(fps, 1)
                    print(f"{codec} {mode:15s} x{n:<2}: {fps:8.0f} frames/s ({runs[0][0]} frames)", flush=True)
                except Exception as e:  # noqa: BLE001 - a study: say what failed and go on
                    print(f"{codec} {mode} x{n}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    print("facts:", json.dumps(FACTS, default=str)[:1500])
    if a.json:
        a.json.write_text(json.dumps({"fps": out, "facts": FACTS}, indent=2, default=str))


if __name__ == "__main__":
    main()
