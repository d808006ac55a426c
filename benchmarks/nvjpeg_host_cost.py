#!/usr/bin/env python3
"""What each JPEG decode path costs the host's CPU, image by image, on the mixed set's kinds.

    python3 benchmarks/nvjpeg_host_cost.py [--data .bench-data/mixed] [--images 64] [--in-flight NxK,...]

Two questions behind the GPU path's speed on a host with few free cores (RESULTS.md, twenty-first
session):

1. ``batched``: nvJPEG's batched call per backend, host time an image and the call's rate, one call at
   a time: the hardware engine from host memory (``HARDWARE``, what gpubatch uses) and from device
   memory (``HARDWARE_DEVICE``: the bitstreams uploaded first, so nvJPEG copies nothing), and the
   GPU-Huffman backends (``GPU_HYBRID_DEVICE``, ``GPU_HYBRID``).
2. ``phases``: the CUDA decoder's path, nvJPEG's decoupled API driven directly on one thread
   (``GPU_HYBRID``: Huffman on the GPU, as gpubatch asks nvImageCodec for; ``HYBRID``: on the CPU),
   each phase's thread CPU time (stream parse, ``nvjpegDecodeJpegHost``, transfer, device, the
   wait), against nvImageCodec's CUDA decoder on the same images with 1 and 11 threads (the process's
   CPU time an image).

3. ``--in-flight NxK,...``: nvJPEG's batched GPU-Huffman backends (and the hardware engine, to
   compare) with K calls of N images each in flight at once, each on a state and stream of its own,
   from one thread: host time an image, images/s, and the device memory the K states and their
   outputs took (the device's memory in use after the run less before the states were made). Only
   these rows are printed.

Each row also gives the largest difference from Pillow over the images it checks (levels).
"""

from __future__ import annotations

import argparse
import ctypes as C
import resource
import statistics
import time

from _data import DEFAULT_DATA, jpeg_set  # (benchmarks/_data.py, beside this script)

from gpubatch.engine.codecs.nvjpeg_hw import NvjpegError
from gpubatch.engine.codecs.nvjpeg_hw import _check as _check

KINDS = ("baseline/4:4:4", "baseline/4:2:2", "baseline/4:2:0")
BATCHED = ((3, "HARDWARE"), (5, "HARDWARE_DEVICE"), (4, "GPU_HYBRID_DEVICE"), (2, "GPU_HYBRID"))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Images:
    """The set's first images of each kind, their sizes, one output buffer, and a Pillow check."""

    def __init__(self, cp, data: str, n: int):
        from gpubatch.engine.codecs.headers import jpeg_kind

        self.cp = cp
        blobs = [f.read_bytes() for f in jpeg_set(data, 4096)[:1024]]
        self.by: dict[str, list[bytes]] = {}
        for b in blobs:
            k = jpeg_kind(b)[0]
            if k in KINDS and len(self.by.setdefault(k, [])) < n:
                self.by[k].append(b)
        self.dims = {k: [jpeg_kind(b)[1:] for b in v] for k, v in self.by.items()}
        self.out = cp.empty(max(sum(w * h * 3 for w, h in d) for d in self.dims.values()), cp.uint8)

    def places(self, kind: str) -> list[tuple[int, int]]:
        out, off = [], 0
        for w, h in self.dims[kind]:
            out.append((self.out.data.ptr + off, w * 3))
            off += w * h * 3
        return out

    def worst(self, kind: str, count: int = 8) -> int:
        """Largest difference from Pillow over the first ``count`` images as decoded into :meth:`places`."""
        import numpy as np

        from gpubatch.engine.codecs import image as host

        got, worst = self.out.get(), 0
        for (ptr, _), (w, h), b in list(zip(self.places(kind), self.dims[kind], self.by[kind]))[:count]:
            o = ptr - self.out.data.ptr
            img = got[o : o + w * h * 3].reshape(h, w, 3).astype(np.int16)
            worst = max(worst, int(np.abs(img - host.decode(b).astype(np.int16)).max()))
        return worst


def batched(cp, imgs: Images, backend: int, kind: str, calls: int = 20) -> str:
    import numpy as np

    from gpubatch.engine.codecs import nvjpeg_hw as nh

    lib = nh.library()
    handle, state = C.c_void_p(), C.c_void_p()
    flags = nh.FLAGS if backend in (3, 5) else 0
    _check("nvjpegCreateEx", lib.nvjpegCreateEx(backend, None, None, flags, C.byref(handle)))
    _check("nvjpegJpegStateCreate", lib.nvjpegJpegStateCreate(handle, C.byref(state)))
    data = imgs.by[kind]
    host = [np.frombuffer(b, np.uint8) for b in data]
    if backend in (4, 5):  # device-side input: the bitstreams uploaded once
        dev = cp.asarray(np.concatenate(host))
        offsets = np.cumsum([0] + [len(b) for b in data[:-1]])
        sources = [(dev.data.ptr + int(o), len(b)) for o, b in zip(offsets, data)]
    else:
        sources = [(h.ctypes.data, h.nbytes) for h in host]
    n, arr, sizes, out = nh.call_args(sources, imgs.places(kind))
    stream = cp.cuda.Stream(non_blocking=True)
    host_s, wall_s = [], []
    try:
        for k in range(calls + 3):
            stream.synchronize()
            t0 = time.perf_counter()
            _check("nvjpegDecodeBatchedInitialize", lib.nvjpegDecodeBatchedInitialize(handle, state, n, 1, nh.OUTPUT_RGBI))
            _check("nvjpegDecodeBatched", lib.nvjpegDecodeBatched(handle, state, arr, sizes, out, C.c_void_p(stream.ptr)))
            t1 = time.perf_counter()
            stream.synchronize()
            if k >= 3:
                host_s.append(t1 - t0)
                wall_s.append(time.perf_counter() - t0)
    finally:
        lib.nvjpegJpegStateDestroy(state)
        lib.nvjpegDestroy(handle)
    h, w = statistics.median(host_s), statistics.median(wall_s)
    return f"host {h / n * 1e6:.1f} us/img; a call at a time {n / w:,.0f} img/s; max diff {imgs.worst(kind)}"


def in_flight(cp, data: str, backend: int, kind: str, n: int, k: int, rounds: int = 12) -> str:
    """``k`` batched calls of ``n`` images of ``kind`` in flight (see the module docstring, 3)."""
    import numpy as np

    from gpubatch.engine.codecs import image as host
    from gpubatch.engine.codecs import nvjpeg_hw as nh
    from gpubatch.engine.codecs.headers import jpeg_kind

    blobs = [b for b in (f.read_bytes() for f in jpeg_set(data, 4096)) if jpeg_kind(b)[0] == kind][: n * k]
    if len(blobs) < n * k:
        return f"the set has {len(blobs)} images of this kind, fewer than {n * k}"
    lib = nh.library()
    cp.get_default_memory_pool().free_all_blocks()  # (the rows before: their buffers are counted there)
    free, total = cp.cuda.runtime.memGetInfo()
    used0 = total - free
    calls = []  # per call: handle, state, arguments, stream, its last end, what keeps its memory
    try:
        for c in range(k):
            part = blobs[c * n : (c + 1) * n]
            dims = [jpeg_kind(b)[1:] for b in part]
            out = cp.empty(sum(w * h * 3 for w, h in dims), cp.uint8)
            places, off = [], 0
            for w, h in dims:
                places.append((out.data.ptr + off, w * 3))
                off += w * h * 3
            arrays = [np.frombuffer(b, np.uint8) for b in part]
            keep: list = [out, arrays]
            if backend in (4, 5):  # device-side input: the bitstreams uploaded once
                dev = cp.asarray(np.concatenate(arrays))
                keep.append(dev)
                offsets = np.cumsum([0] + [len(b) for b in part[:-1]])
                sources = [(dev.data.ptr + int(o), len(b)) for o, b in zip(offsets, part)]
            else:
                sources = [(a.ctypes.data, a.nbytes) for a in arrays]
            handle, state = C.c_void_p(), C.c_void_p()
            _check("nvjpegCreateEx", lib.nvjpegCreateEx(backend, None, None, nh.FLAGS if backend in (3, 5) else 0,
                                                        C.byref(handle)))
            calls.append([handle, state, nh.call_args(sources, places), cp.cuda.Stream(non_blocking=True), None, keep])
            _check("nvjpegJpegStateCreate", lib.nvjpegJpegStateCreate(handle, C.byref(state)))
        spent = []
        for r in range(rounds + 2):
            t0, host_s = time.perf_counter(), 0.0
            for call in calls:
                handle, state, (m, arr, sizes, out_images), stream, done, _ = call
                if done is not None:
                    done.synchronize()
                t1 = time.perf_counter()
                _check("nvjpegDecodeBatchedInitialize",
                       lib.nvjpegDecodeBatchedInitialize(handle, state, m, 1, nh.OUTPUT_RGBI))
                _check("nvjpegDecodeBatched", lib.nvjpegDecodeBatched(handle, state, arr, sizes, out_images,
                                                                       C.c_void_p(stream.ptr)))
                host_s += time.perf_counter() - t1
                call[4] = stream.record()
            for call in calls:
                call[4].synchronize()
            if r >= 2:  # (the first rounds grow nvJPEG's buffers)
                spent.append((host_s, time.perf_counter() - t0))
        free, total = cp.cuda.runtime.memGetInfo()
        mib = (total - free - used0) / 2**20
        first = calls[0][5][0].get()
        worst, off = 0, 0
        for b in blobs[:6]:
            w, h = jpeg_kind(b)[1:]
            img = first[off : off + w * h * 3].reshape(h, w, 3).astype(np.int16)
            off += w * h * 3
            worst = max(worst, int(np.abs(img - host.decode(b).astype(np.int16)).max()))
    finally:
        for handle, state, *_ in calls:
            if state:
                lib.nvjpegJpegStateDestroy(state)
            lib.nvjpegDestroy(handle)
    h, w = statistics.median(x[0] for x in spent), statistics.median(x[1] for x in spent)
    return (f"host {h / (n * k) * 1e6:.1f} us/img; {n * k / w:,.0f} img/s; {mib:.0f} MiB "
            f"({mib / (n * k):.2f} an image); max diff {worst}")


def phases(cp, imgs: Images, backend: int, kind: str, passes: int = 3) -> str:
    from gpubatch.engine.codecs import nvjpeg_hw as nh

    lib = C.CDLL(nh.library_path())
    h, dec, st, pin, dev, js, prm = (C.c_void_p() for _ in range(7))
    _check("nvjpegCreateEx", lib.nvjpegCreateEx(0, None, None, nh.FLAGS, C.byref(h)))
    _check("nvjpegDecoderCreate", lib.nvjpegDecoderCreate(h, backend, C.byref(dec)))
    _check("nvjpegDecoderStateCreate", lib.nvjpegDecoderStateCreate(h, dec, C.byref(st)))
    _check("nvjpegBufferPinnedCreate", lib.nvjpegBufferPinnedCreate(h, None, C.byref(pin)))
    _check("nvjpegBufferDeviceCreate", lib.nvjpegBufferDeviceCreate(h, None, C.byref(dev)))
    _check("nvjpegStateAttachPinnedBuffer", lib.nvjpegStateAttachPinnedBuffer(st, pin))
    _check("nvjpegStateAttachDeviceBuffer", lib.nvjpegStateAttachDeviceBuffer(st, dev))
    _check("nvjpegJpegStreamCreate", lib.nvjpegJpegStreamCreate(h, C.byref(js)))
    _check("nvjpegDecodeParamsCreate", lib.nvjpegDecodeParamsCreate(h, C.byref(prm)))
    _check("nvjpegDecodeParamsSetOutputFormat", lib.nvjpegDecodeParamsSetOutputFormat(prm, nh.OUTPUT_RGBI))
    stream = cp.cuda.Stream(non_blocking=True)
    names = ("parse", "host", "transfer", "device", "wait")
    spent: dict[str, list[float]] = {k: [] for k in names}
    for p in range(passes):  # (the first pass grows nvJPEG's buffers: not counted)
        for b, (ptr, pitch) in zip(imgs.by[kind], imgs.places(kind)):
            out = nh._Image()
            out.channel[0], out.pitch[0] = ptr, pitch
            s = C.c_void_p(stream.ptr)
            marks = [time.thread_time()]
            _check("parse", lib.nvjpegJpegStreamParse(h, b, C.c_size_t(len(b)), 0, 0, js))
            marks.append(time.thread_time())
            _check("host", lib.nvjpegDecodeJpegHost(h, dec, st, prm, js))
            marks.append(time.thread_time())
            _check("transfer", lib.nvjpegDecodeJpegTransferToDevice(h, dec, st, js, s))
            marks.append(time.thread_time())
            _check("device", lib.nvjpegDecodeJpegDevice(h, dec, st, C.byref(out), s))
            marks.append(time.thread_time())
            stream.synchronize()
            marks.append(time.thread_time())
            if p:
                for k, a, z in zip(names, marks, marks[1:]):
                    spent[k].append(z - a)
    for fn, obj in (("nvjpegJpegStreamDestroy", js), ("nvjpegDecodeParamsDestroy", prm),
                    ("nvjpegJpegStateDestroy", st), ("nvjpegBufferPinnedDestroy", pin),
                    ("nvjpegBufferDeviceDestroy", dev), ("nvjpegDecoderDestroy", dec), ("nvjpegDestroy", h)):
        getattr(lib, fn)(obj)
    total = sum(statistics.mean(v) for v in spent.values())
    return (" / ".join(f"{k} {statistics.mean(v) * 1e6:.0f}" for k, v in spent.items())
            + f" us; total {total * 1e6:.0f} us/img of thread CPU; max diff {imgs.worst(kind)}")


def nvimgcodec_cuda(cp, imgs: Images, kind: str, threads: int, passes: int = 5) -> str:
    from gpubatch.engine.codecs.image_gpu import CUDA_DECODER_OPTIONS, nvimgcodec

    nic = nvimgcodec()
    dec = nic.Decoder(device_id=0, max_num_cpu_threads=threads, backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)],
                      options=CUDA_DECODER_OPTIONS)
    stream = cp.cuda.Stream(non_blocking=True)
    data = imgs.by[kind]
    dec.decode(data, cuda_stream=stream.ptr)
    stream.synchronize()
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(passes):
        dec.decode(data, cuda_stream=stream.ptr)
        stream.synchronize()
    n = passes * len(data)
    return f"process CPU {(_cpu() - c0) / n * 1e6:.0f} us/img, {n / (time.perf_counter() - t0):,.0f} img/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--images", type=int, default=64, help="images of each kind")
    ap.add_argument("--in-flight", default="", metavar="NxK,...",
                    help="only the in-flight rows: K calls of N images each at once (e.g. 128x1,256x1,128x2,128x4)")
    args = ap.parse_args()
    import cupy as cp

    if args.in_flight:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.in_flight.split(",")]
        for kind in ("baseline/4:4:4", "baseline/4:2:0"):
            for backend, name in ((4, "GPU_HYBRID_DEVICE"), (2, "GPU_HYBRID"), (3, "HARDWARE")):
                for n, k in shapes:
                    print(f"in flight {name:18s} {kind} {n}x{k}: {in_flight(cp, args.data, backend, kind, n, k)}",
                          flush=True)
        return
    imgs = Images(cp, args.data, args.images)
    for kind in KINDS:
        for backend, name in BATCHED:
            try:
                print(f"batched {name:18s} {kind}: {batched(cp, imgs, backend, kind)}", flush=True)
            except NvjpegError as e:
                print(f"batched {name:18s} {kind}: {e}", flush=True)
        for backend, name in ((2, "GPU_HYBRID"), (1, "HYBRID")):
            print(f"phases  {name:18s} {kind}: {phases(cp, imgs, backend, kind)}", flush=True)
        for threads in (1, 11):
            print(f"nvImageCodec CUDA decoder, {threads:2d} threads, {kind}: {nvimgcodec_cuda(cp, imgs, kind, threads)}",
                  flush=True)


if __name__ == "__main__":
    main()
