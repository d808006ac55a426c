#!/usr/bin/env python3
"""Where decode throughput is lost: synchronous vs stream-ordered decode, decoder thread counts, busy
Python threads alongside, feeding from processes, and the JPEG encoder's rate on small images.

    python3 benchmarks/decode_study.py [--images 4096] [--data DIR] [--only NAME,...] [--calls 96]

Every figure is images/s over 2 passes of the set (batch 256) after 2 warm-up batches, with the GPU
synchronized before the clock is read. One line per condition, then a JSON summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from _data import DEFAULT_DATA, jpeg_set, load_blobs  # noqa: E402  (benchmarks/_data.py, beside this script)

RESULTS: dict[str, float] = {}
GROUPS = ("capi", "calls", "overlap", "hwpar", "nvjpeg", "routed", "reuse", "hw4", "hw8", "cuda8", "cuda15", "async", "gil", "default", "views",
          "host", "encode", "roi")
# --only takes any of these (each prefix-matches the conditions it runs)


CORES = [0.0]  # CPU cores the process kept busy during the last timed() run


def _cpu_seconds() -> float:
    import os

    t = os.times()
    return t.user + t.system


@contextlib.contextmanager
def busy_thread():
    """One CPU-bound Python thread running beside the body (GIL pressure, as a busy consumer makes)."""
    stop = threading.Event()

    def busy() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i * i

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def threads_wall(jobs: list, sync) -> float:
    """Run each (function, args) of ``jobs`` in its own thread at once; the seconds until all are done
    and ``sync()`` (the GPU) has returned. Sets the cores the process kept busy meanwhile."""
    t0, c0 = time.perf_counter(), _cpu_seconds()
    ths = [threading.Thread(target=fn, args=args) for fn, args in jobs]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    sync()
    wall = time.perf_counter() - t0
    CORES[0] = (_cpu_seconds() - c0) / wall
    return wall


def _decoded(groups: dict[str, list[int]], mode: str) -> int:
    """Images of a batch (kind -> indices) the hwpar and nvjpeg groups decode in ``mode`` (n: no 4:4:4)."""
    return sum(len(v) for k, v in groups.items() if not ("n" in mode and k.endswith("4:4:4")))


def _hw_rate(run, kind_batches: list[dict[str, list[int]]], passes: int, n_threads: int, mode: str, sync) -> float:
    """Images/s of ``passes`` over the set in ``n_threads`` threads, thread w running ``run(w, batch ids)``
    on every n-th batch (the hwpar and nvjpeg groups)."""
    ids = [b for _ in range(passes) for b in range(len(kind_batches))]
    wall = threads_wall([(run, (w, ids[w::n_threads])) for w in range(n_threads)], sync)
    return sum(_decoded(kind_batches[b], mode) for b in ids) / wall


def _hw_calls(kind_batches: list[dict[str, list[int]]], ids: list[int], mode: str, inst: int, streams: int):
    """One thread's calls in the hwpar and nvjpeg groups, in order: (instance, stream, item indices, first
    call of its batch) per call, a call per kind of each batch ``ids`` names (modes: the hwpar group's)."""
    turn = 0
    for b in ids:
        groups = kind_batches[b]
        if "n" in mode:
            groups = {k: v for k, v in groups.items() if not k.endswith("4:4:4")}
        if "f" in mode or "s" in mode:
            groups = {k: groups[k] for k in sorted(groups)}
            turn = b if "s" in mode else 0
        for k, idx in enumerate(groups.values()):
            yield turn % inst, turn % inst % streams, idx, k == 0
            turn += 1


def report(name: str, rate: float, extra: str = "") -> None:
    RESULTS[name] = round(rate)
    print(f"{name:58s} {rate:9,.0f} img/s  {CORES[0]:4.1f} cores  {extra}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--only", default="")
    ap.add_argument("--passes", type=int, default=2, help="passes over the set per measurement")
    ap.add_argument("--start-at", type=float, default=0.0,
                    help="routed group: wait for this time.time() before measuring (to run processes side by side)")
    ap.add_argument("--configs", default="", help="routed group: share[:cuda_threads],... (e.g. 0.5:15,0.6); "
                    "capi group: api:hw_instances:share:cuda_threads[:ahead],... (e.g. c:3:0.5:11:2); "
                    "hwpar group: threads:instances[:modes],... (e.g. 1:3:f,1:3:s,2:3:fx; modes in the group's comment)")
    ap.add_argument("--timeout", type=float, default=90, help="seconds per group (each in its own process)")
    ap.add_argument("--calls", type=int, default=96, help="calls group: the most images per decode call of the "
                    "chunked halves (as ImagePipeline(decode_chunk=N) makes them, two calls a half at least)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    if not only:  # every group in its own process: a clean CUDA context each, and a hang costs one group
        import subprocess
        import sys

        jpeg_set(args.data, args.images)
        for group in GROUPS:
            try:
                subprocess.run([sys.executable, __file__, "--images", str(args.images), "--data", args.data,
                                "--only", group, "--configs", args.configs], timeout=args.timeout, check=False)
            except subprocess.TimeoutExpired:
                print(f"{group}: did not finish in {args.timeout:.0f} s", flush=True)
        return
    import cupy as cp
    import numpy as np
    from nvidia import nvimgcodec as nic

    from gpubatch.engine.codecs.headers import jpeg_kind
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder

    files, blobs, batches = load_blobs(args.data, args.images)
    stream = cp.cuda.Stream(non_blocking=True)
    params = nic.DecodeParams(apply_exif_orientation=True, color_spec=nic.ColorSpec.SRGB, allow_any_depth=False)
    kinds = [jpeg_kind(b)[0] for b in blobs]
    kind_batches = []
    for start in range(0, len(blobs), 256):
        groups: dict[str, list[int]] = {}
        for i in range(start, min(start + 256, len(blobs))):
            groups.setdefault(kinds[i], []).append(i)
        kind_batches.append(groups)

    def want(name: str) -> bool:
        return not only or any(name.startswith(o) for o in only)

    def timed(fn, passes: int = args.passes, drain=None) -> float:
        """``drain``: completes what ``fn`` left in flight (before the clock is read)."""
        for b in range(2):
            fn(b)
        if drain is not None:
            drain()
        cp.cuda.runtime.deviceSynchronize()
        c0, t0 = _cpu_seconds(), time.perf_counter()
        for _ in range(passes):
            for b in range(len(batches)):
                fn(b)
        if drain is not None:
            drain()
        cp.cuda.runtime.deviceSynchronize()
        wall = time.perf_counter() - t0
        CORES[0] = (_cpu_seconds() - c0) / wall
        return passes * len(blobs) / wall

    def decoupled(limit: int = 0) -> None:
        """The two decoders decoupled: each batch split as the routed decoder splits it (share 0.5), the
        hardware part decoded by one thread and the CUDA part by another, each running through the
        batches at its own pace (no barrier between the two halves of a batch). ``limit``: each half in
        calls of at most that many images, two at least (as chunked decode makes them); 0: one call."""
        from gpubatch.engine.codecs.image_gpu import _call_lists

        router = GpuImageDecoder(0, 16, cuda_share=0.5, api="c")
        splits = [router._split(kb) for kb in kind_batches]
        router.close()
        dec_hw = GpuImageDecoder(0, 16, cuda_share=0.0, api="c")
        dec_cu = GpuImageDecoder(0, 16, hw_decoder=False, api="c")
        for d in (dec_hw, dec_cu):
            d.warm_up(256)

        def calls(which: int, b: int) -> list[list[int]]:
            lists = splits[b][0] if which == 0 else [splits[b][1]]
            if not limit:
                return [[i for lst in lists for i in lst]]
            return _call_lists(lists, which == 0, limit)  # as the engine splits a part

        def half(dec, which: int, ids: list[int], s) -> None:
            ring: deque = deque()
            for b in ids:
                for idx in calls(which, b):
                    res = dec.decode([blobs[i] for i in idx], s)
                    ring.append((s.record(), res))
                    if len(ring) > 4:
                        ring.popleft()[0].synchronize()

        how = f"calls of at most {limit}" if limit else "one call a half"
        for label, parts in (("HW half alone", (0,)), ("CUDA half alone", (1,)), ("both halves at once", (0, 1))):
            for warm in (True, False):
                ids = list(range(len(batches))) * (1 if warm else args.passes)
                wall = threads_wall([(half, ((dec_hw, dec_cu)[w], w, ids, cp.cuda.Stream(non_blocking=True)))
                                     for w in parts], cp.cuda.runtime.deviceSynchronize)
            report(f"capi: decoupled, {label}, {how} (images/s of whole batches)", len(ids) * 256 / wall)
        dec_hw.close()
        dec_cu.close()

    # the decoders alone with each batch half in one call against the chunked pipeline's calls
    if want("calls"):
        import sys

        from gpubatch.engine.gpu_engine import SWITCH_INTERVAL

        sys.setswitchinterval(SWITCH_INTERVAL)  # as the engine sets it
        decoupled()
        decoupled(args.calls)

    # the CUDA decoder alone on its half of every batch, calls waited for one by one against the next
    # call started before the last is finished (does one decoder take calls in flight together?)
    if want("overlap"):
        dec = GpuImageDecoder(0, 16, hw_decoder=False, api="c")
        dec.warm_up(256)
        router = GpuImageDecoder(0, 16, cuda_share=0.5, api="c")
        halves = [router._split(kb)[1] for kb in kind_batches]
        router.close()
        s = dec.cuda_stream
        for size in (128, 64):
            for overlap in (False, True):
                jobs = [dec._prepare(False, blobs, None, [idx[a : a + size]], s)
                        for _ in range(args.passes) for idx in halves for a in range(0, len(idx), size)]
                cp.cuda.runtime.deviceSynchronize()
                t0 = time.perf_counter()
                prev, n = None, 0
                for job in jobs:
                    idx = list(job.streams)
                    started = dec.cuda_c.start([job.streams[i] for i in idx], [job.images[i] for i in idx])
                    if not overlap:
                        n += sum(dec.cuda_c.finish(started))
                        continue
                    if prev is not None:
                        n += sum(dec.cuda_c.finish(prev))
                    prev = started
                if prev is not None:
                    n += sum(dec.cuda_c.finish(prev))
                cp.cuda.runtime.deviceSynchronize()
                wall = time.perf_counter() - t0
                for job in jobs:
                    dec.lib.destroy(list(job.streams.values()), list(job.images.values()))
                report(f"overlap: CUDA decoder alone, calls of {size}, " + ("next started before the last is finished"
                       if overlap else "each finished before the next"), n / wall,
                       f"decoded {n} of {sum(len(j.streams) for j in jobs)}")
                del jobs
        dec.close()

    # 0. the routed decoder through nvImageCodec's Python binding against its C API (ctypes), alone
    # and beside one busy Python thread (as in a pipeline whose consumer runs Python)
    if want("capi"):
        import sys

        keep0: deque = deque()
        fell = [0]  # images the GPU decoders did not decode (none in the mixed set: each one is a fault)

        def product0(dec, ahead: int = 0) -> float:
            """Batches through ``dec``: each waited for (``ahead`` 0), or ``ahead`` batches handed to the
            decoders' threads before the oldest is completed (as ``decode_ahead`` does in a pipeline)."""
            pend: deque = deque()

            def done(res) -> None:
                res.order(stream)
                fell[0] += res.fallbacks + sum(e is not None for e in res.errors)
                keep0.append((stream.record(), res))
                if len(keep0) > 2:
                    keep0.popleft()[0].synchronize()

            def fn(b: int) -> None:
                pend.append(dec.decode(batches[b], stream, order=False, wait=not ahead))
                if len(pend) > ahead:
                    done(pend.popleft())

            def drain() -> None:
                while pend:
                    done(pend.popleft())

            return timed(fn, drain=drain)

        sys.setswitchinterval(0.0002)  # 0.2 ms (the engine sets 1 ms, gpu_executor.SWITCH_INTERVAL)
        if not args.configs:
            decoupled()
        configs = [("python", 1, 0.5, None, 0), ("c", 3, 0.5, None, 0), ("c", 3, 0.5, None, 1), ("c", 3, 0.5, None, 2),
                   ("c", 3, 0.5, None, 3), ("c", 3, 0.0, None, 0), ("c", 1, 1.0, None, 0)]
        if args.configs:  # api:hw_instances:share:cuda_threads[:ahead],...
            configs = [(a, int(i), float(s), int(t) if t else None, int(ah[0]) if ah else 0)
                       for a, i, s, t, *ah in (c.split(":") for c in args.configs.split(","))]
        for api, inst, share, cu_threads, ahead in configs:
            dec = GpuImageDecoder(0, 16, cuda_share=share, api=api, hw_instances=inst, cuda_threads=cu_threads)
            dec.warm_up(256)
            product0(dec, ahead)  # warm-up pass
            for k in dec.timings:
                dec.timings[k] = 0.0
            name = (f"capi: {api} API, {inst} HW decoder(s), CUDA share {share}, {dec.cuda_threads} CUDA threads, "
                    + (f"{ahead} batch(es) handed over ahead" if ahead else "each batch waited for"))
            fell[0] = 0
            report(name, product0(dec, ahead), f"{dict((k, round(v, 2)) for k, v in dec.timings.items())}, "
                   f"not decoded on the GPU: {fell[0]}")
            fell[0] = 0
            with busy_thread():
                report(name + ", 1 busy thread", product0(dec, ahead), f"not decoded on the GPU: {fell[0]}")
            keep0.clear()
            dec.close()

    # 0b. the hardware engine alone through the C API: more decoder instances, and host work in
    # several threads at once (each thread its own instances and stream)
    if want("hwpar"):
        import numpy as np

        from gpubatch.engine.codecs.nvimgcodec_c import BACKEND_HW_GPU_ONLY, library

        lib = library()
        addr = [np.frombuffer(b, np.uint8) for b in blobs]
        dims = []
        for a in addr:
            cs = lib.code_stream(a.ctypes.data, a.nbytes)
            dims.append(lib.header(cs))
            lib.destroy([cs], [])
        slab_bytes = 256 * max(d.width * d.height for d in dims) * 3
        confs = [(1, 3, ""), (1, 6, ""), (2, 3, ""), (3, 3, ""), (4, 2, "")]
        if args.configs:  # threads:instances[:modes],...
            confs = [(int(t), int(i), m[0] if m else "") for t, i, *m in (c.split(":") for c in args.configs.split(","))]
        # Each thread has instances of its own and takes every n-th batch, one call per kind. Modes (letters):
        # f: each batch's kinds in one fixed order (4:2:0, 4:2:2, 4:4:4), so that with as many instances as
        # kinds each instance always meets the same kind; s: that order, with the first kind's instance
        # moved on by one each batch, so each instance meets another kind each batch (as many calls per
        # instance as f: only the kinds an instance meets in turn differ); x: each instance decodes on a
        # CUDA stream of its own (else one stream per thread, which orders all its calls on the GPU); n: the
        # 4:4:4 images left out (the pipeline sends them to the CUDA decoder); p:
        # each instance preallocates nvJPEG's hardware pool for 128 images of 640x640. No mode: the kinds
        # in the order each batch first shows them, the calls over the instances in turn.
        for n_threads, inst, mode in confs:
            hw_opts = ("nvjpeg_hw_decoder:preallocate_batch_size=128 nvjpeg_hw_decoder:preallocate_height_hint=640"
                       " nvjpeg_hw_decoder:preallocate_width_hint=640") if "p" in mode else ""
            workers = []
            for _ in range(n_threads):
                decs = [lib.decoder(0, 2, BACKEND_HW_GPU_ONLY, hw_opts) for _ in range(inst)]
                sts = [cp.cuda.Stream(non_blocking=True) for _ in range(inst if "x" in mode else 1)]
                workers.append((decs, sts, cp.empty(slab_bytes, cp.uint8)))

            def run(w: int, ids: list[int], workers=workers, inst=inst, mode=mode) -> None:
                decs, sts, slab = workers[w]
                off = 0
                for d, s, idx, first in _hw_calls(kind_batches, ids, mode, inst, len(sts)):
                    dec, st, off = decs[d], sts[s], 0 if first else off
                    css, imgs = [], []
                    for i in idx:
                        css.append(lib.code_stream(addr[i].ctypes.data, addr[i].nbytes))
                        dm = dims[i]
                        imgs.append(lib.image(slab.data.ptr + off, dm.height, dm.width, dm.width * 3, st.ptr))
                        off += dm.width * dm.height * 3
                    dec.finish(dec.start(css, imgs))
                    lib.destroy(css, imgs)

            sync = cp.cuda.runtime.deviceSynchronize
            _hw_rate(run, kind_batches, 1, n_threads, mode, sync)
            report(f"hwpar: HW only, C API, {n_threads} thread(s) x {inst} decoders{' ' + mode if mode else ''}",
                   _hw_rate(run, kind_batches, args.passes, n_threads, mode, sync))
            for decs, _, _ in workers:
                for d in decs:
                    d.close()

    # 0c. the same engine through nvJPEG's batched API directly (gpubatch.engine.codecs.nvjpeg_hw): no
    # per-image code stream, descriptor, header re-parse or capability check; the calls as in hwpar
    # (configs threads:instances[:modes], modes f, s, x, n as there; 0: without nvjpeg_hw.FLAGS, that is
    # chroma upsampled without interpolation). First the pixels of one call against nvImageCodec's.
    if want("nvjpeg"):
        import numpy as np

        from gpubatch.engine.codecs import nvjpeg_hw
        from gpubatch.engine.codecs.nvjpeg_hw import HwBatchDecoder

        default_flags = nvjpeg_hw.FLAGS

        host = [np.frombuffer(b, np.uint8) for b in blobs]
        dims = [jpeg_kind(b)[1:] for b in blobs]
        slab_bytes = 256 * max(w * h for w, h in dims) * 3
        from gpubatch.engine.codecs import image as host_codec

        for kind in sorted(kind_batches[0]):
            idx = kind_batches[0][kind]
            ref = nic.Decoder(backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)]).decode(
                [blobs[i] for i in idx[:16]], params=params)
            pil = [host_codec.decode(blobs[i]).astype(np.int16) for i in idx[:16]]
            for flags in (default_flags, 0):
                nvjpeg_hw.FLAGS = flags
                probe = HwBatchDecoder(cp)
                if flags and kind == "baseline/4:2:0":
                    print(f"nvjpeg: hardware engines, cores per engine: {probe.engines()}", flush=True)
                out = cp.zeros(slab_bytes, cp.uint8)
                places, off = [], 0
                for i in idx:
                    places.append((out.data.ptr + off, dims[i][0] * 3))
                    off += dims[i][0] * dims[i][1] * 3
                probe.decode([(host[i].ctypes.data, host[i].nbytes) for i in idx], places, stream)
                stream.synchronize()
                diffs = {"direct/nvimgcodec": [], "direct/pillow": [], "nvimgcodec/pillow": []}
                for (ptr, _), i, r, p in zip(places, idx, ref, pil):
                    w, h = dims[i]
                    got = out[ptr - out.data.ptr : ptr - out.data.ptr + w * h * 3].reshape(h, w, 3).get().astype(np.int16)
                    nv = cp.asnumpy(cp.asarray(r)).astype(np.int16)
                    for name, (a, b) in zip(diffs, ((got, nv), (got, p), (nv, p))):
                        d = np.abs(a - b)
                        diffs[name].append((int(d.max()), float(d.mean()), float((d > 4).mean())))
                print(f"nvjpeg {kind} ({len(idx)} in one call, flags {flags}): max / mean / share >4 over 16: "
                      + "; ".join(f"{k} {max(x[0] for x in v)} / {np.mean([x[1] for x in v]):.3f} / "
                                  f"{np.mean([x[2] for x in v]):.4f}" for k, v in diffs.items()), flush=True)
                probe.close()
        nvjpeg_hw.FLAGS = default_flags
        confs = [(1, 2, "f"), (1, 3, "f"), (1, 3, "fx"), (2, 3, "fx")]
        if args.configs:
            confs = [(int(t), int(i), m[0] if m else "") for t, i, *m in (c.split(":") for c in args.configs.split(","))]
        for n_threads, inst, mode in confs:
            workers = []
            for _ in range(n_threads):
                nvjpeg_hw.FLAGS = 0 if "0" in mode else default_flags
                decs = [HwBatchDecoder(cp) for _ in range(inst)]
                nvjpeg_hw.FLAGS = default_flags
                sts = [cp.cuda.Stream(non_blocking=True) for _ in range(inst if "x" in mode else 1)]
                workers.append((decs, sts, cp.empty(slab_bytes, cp.uint8)))
            spent = {"call": 0.0}

            def run(w: int, ids: list[int], workers=workers, inst=inst, mode=mode, spent=spent) -> None:
                decs, sts, slab = workers[w]
                off = 0
                for d, s, idx, first in _hw_calls(kind_batches, ids, mode, inst, len(sts)):
                    off = 0 if first else off
                    places = []
                    for i in idx:
                        places.append((slab.data.ptr + off, dims[i][0] * 3))
                        off += dims[i][0] * dims[i][1] * 3
                    t0 = time.perf_counter()
                    decs[d].decode([(host[i].ctypes.data, host[i].nbytes) for i in idx], places, sts[s])
                    spent["call"] += time.perf_counter() - t0

            sync = cp.cuda.runtime.deviceSynchronize
            _hw_rate(run, kind_batches, 1, n_threads, mode, sync)
            spent["call"] = 0.0
            rate = _hw_rate(run, kind_batches, args.passes, n_threads, mode, sync)
            report(f"nvjpeg: HW only, direct, {n_threads} thread(s) x {inst} instances{' ' + mode if mode else ''}",
                   rate, f"(host s in decode calls: {spent['call']:.2f})")
            for decs, _, _ in workers:
                for d in decs:
                    d.close()

    # 1. gpubatch's decoder: adaptive share, and fixed shares (the deterministic mode writers use)
    if want("routed"):
        keep: deque = deque()

        def product(dec) -> float:
            def fn(b: int) -> None:
                res = dec.decode(batches[b], stream)
                keep.append((stream.record(), res))  # the event: this batch's images are ready
                if len(keep) > 2:
                    keep.popleft()[0].synchronize()

            return timed(fn)

        configs = [(0.4, None), (0.5, None), (0.6, None), (0.5, 11)]
        if args.configs:
            configs = [(float(c.split(":")[0]), int(c.split(":")[1]) if ":" in c else None)
                       for c in args.configs.split(",")]
        for share, cu_threads in configs:
            dec = GpuImageDecoder(0, 16, cuda_share=share, cuda_threads=cu_threads)
            product(dec)  # warm-up pass: memory pools and the decoders' buffers grow to the data
            for k in dec.timings:
                dec.timings[k] = 0.0
            while time.time() < args.start_at:
                time.sleep(0.001)
            report(f"routed: CUDA share {share} on {cu_threads or 'default'} threads", product(dec),
                   f"{dict((k, round(v, 2)) for k, v in dec.timings.items())}")
            if (share, cu_threads) == configs[-1] and not args.configs:
                dec.deterministic = False
                report("routed: same, adaptive share", product(dec), f"share {dec.cuda_share:.2f}")
            keep.clear()
            dec.close()
        if args.configs:
            return print("RESULT " + json.dumps(RESULTS), flush=True)
        dec = GpuImageDecoder(0, 16, cuda_share=0.0)
        product(dec)
        report("routed: hardware engine only (share 0)", product(dec), f"hw refuses {sorted(dec.hw_refuses)}")
        keep.clear()
        dec.close()

    def in_flight(submit, stream, depth: int = 2):
        """fn(b): submit batch b on ``stream`` without waiting; keep ``depth`` batches in flight."""
        keep: deque = deque()

        def fn(b: int) -> None:
            keep.append((None, submit(b)))
            keep[-1] = (stream.record(), keep[-1][1])
            if len(keep) > depth:
                keep.popleft()[0].synchronize()

        return fn

    def study_hw(threads: int) -> None:
        hw = nic.Decoder(max_num_cpu_threads=threads, backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        s = cp.cuda.Stream(non_blocking=True)
        host = {"s": 0.0}

        def per_kind(b: int) -> list:
            t = time.perf_counter()
            outs = [hw.decode([blobs[i] for i in idx], params=params, cuda_stream=s.ptr)
                    for idx in kind_batches[b].values()]
            host["s"] += time.perf_counter() - t
            return outs

        def synced(b: int) -> None:
            per_kind(b)
            s.synchronize()

        report(f"hw{threads}: HW only, per kind, sync per batch", timed(synced), f"host {host['s']:.2f}s")
        host["s"] = 0.0
        report(f"hw{threads}: HW only, per kind, stream-ordered (2 in flight)", timed(in_flight(per_kind, s)),
               f"host {host['s']:.2f}s")
        mixed = in_flight(lambda b: hw.decode(batches[b], params=params, cuda_stream=s.ptr), s)
        report(f"hw{threads}: HW only, mixed calls, stream-ordered", timed(mixed))

    def study_cuda(threads: int) -> None:
        cu = nic.Decoder(max_num_cpu_threads=threads, backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)],
                         options="nvjpeg_cuda_decoder:hybrid_huffman_threshold=0")
        s = cp.cuda.Stream(non_blocking=True)
        fn = in_flight(lambda b: cu.decode(batches[b], params=params, cuda_stream=s.ptr), s)
        report(f"cuda{threads}: CUDA decoder only, stream-ordered", timed(fn))

    # 2b. hardware engine only: decoding into reused Images (images=) instead of fresh allocations
    if want("reuse"):
        d = nic.Decoder(max_num_cpu_threads=2, backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        s1 = cp.cuda.Stream(non_blocking=True)
        ring: deque = deque()

        def fresh(b: int) -> list:
            return d.decode(batches[b], params=params, cuda_stream=s1.ptr)

        def reused(b: int) -> list:
            if len(ring) >= 3:
                old = ring.popleft()
                s1.synchronize()  # measured upper bound: the old images are free once the stream is done
                out = d.decode(batches[b], images=old, params=params, cuda_stream=s1.ptr)
            else:
                out = d.decode(batches[b], params=params, cuda_stream=s1.ptr)
            ring.append(out)
            return out

        report("reuse: HW only, one mixed call, fresh Images", timed(in_flight(fresh, s1)))
        report("reuse: HW only, one mixed call, images= reused (ring of 3)", timed(reused))
        ring.clear()
        report("reuse: HW only, one mixed call, fresh Images, synchronized each batch",
               timed(lambda b: (fresh(b), s1.synchronize())))

    # 2. hardware engine only, one kind per call, thread counts, synchronous vs stream-ordered
    for threads in (2, 4, 8):
        if want(f"hw{threads}"):
            study_hw(threads)

    # 3. CUDA decoder (Huffman on GPU) alone, stream-ordered, thread counts
    for threads in (4, 8, 15, 24, 32, 48):
        if want(f"cuda{threads}"):
            study_cuda(threads)

    # 4. routed and stream-ordered: HW per kind on one thread, CUDA share on a second, nothing waits
    def routed_async_factory(hw_threads: int, cuda_threads: int, share: float):
        hw = nic.Decoder(max_num_cpu_threads=hw_threads, backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        cu = nic.Decoder(max_num_cpu_threads=cuda_threads, backends=[nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)],
                         options="nvjpeg_cuda_decoder:hybrid_huffman_threshold=0")
        s_hw, s_cu = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
        side = ThreadPoolExecutor(1)
        keep: deque = deque()
        order = ("4:2:0", "4:2:2", "4:4:4")

        def fn(b: int) -> None:
            groups = kind_batches[b]
            total = sum(len(v) for v in groups.values())
            want_cuda = int(share * total)
            hw_lists, cuda_idx = [], []
            for k in sorted(groups, key=lambda k: order.index(k.split("/")[1]) if k.split("/")[1] in order else 9):
                hw_lists.append(list(groups[k]))
            for lst in reversed(hw_lists):
                take = min(want_cuda - len(cuda_idx), len(lst))
                if take <= 0:
                    break
                cuda_idx.extend(lst[len(lst) - take:])
                del lst[len(lst) - take:]
            fut = side.submit(cu.decode, [blobs[i] for i in cuda_idx], params=params, cuda_stream=s_cu.ptr)
            outs = [hw.decode([blobs[i] for i in lst], params=params, cuda_stream=s_hw.ptr) for lst in hw_lists if lst]
            outs.append(fut.result())
            keep.append((s_hw.record(), s_cu.record(), outs))
            if len(keep) > 2:
                e1, e2, _ = keep.popleft()
                e1.synchronize()
                e2.synchronize()

        return fn, side

    for hw_t, cu_t, share in ((4, 14, 0.4), (4, 14, 0.5), (4, 14, 0.6), (2, 14, 0.5)):
        name = f"async hw{hw_t}/cuda{cu_t} share {share}"
        if not want("async"):
            continue
        fn, side = routed_async_factory(hw_t, cu_t, share)
        report(name + ": routed, stream-ordered", timed(fn))
        side.shutdown()

    # 5. the same with a CPU-bound Python thread alongside (GIL pressure), by switch interval
    if want("gil"):
        import sys

        fn, side = routed_async_factory(4, 14, 0.5)

        for interval in (0.001, 0.0002, 0.00005):
            sys.setswitchinterval(interval)
            with busy_thread():
                report(f"gil: routed async + 1 busy Python thread, switch interval {interval * 1e3:g} ms",
                       timed(fn, passes=1))
        side.shutdown()

    # 6. default Decoder (and DALI-like split in one Decoder), stream-ordered, mixed batches
    if want("default"):
        for name, kw in (
            ("default Decoder()", {}),
            ("one Decoder: HW load 0.9 adaptive + CUDA (GPU Huffman)",
             {"backends": [nic.Backend(nic.BackendKind.HW_GPU_ONLY, load_hint=0.9,
                                       load_hint_policy=nic.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME),
                           nic.Backend(nic.BackendKind.HYBRID_CPU_GPU)],
              "options": "nvjpeg_cuda_decoder:hybrid_huffman_threshold=0"}),
        ):
            d = nic.Decoder(**kw)
            s = cp.cuda.Stream(non_blocking=True)
            fn = in_flight(lambda b, d=d, s=s: d.decode(batches[b], params=params, cuda_stream=s.ptr), s)
            report(f"default: {name}, stream-ordered", timed(fn))

    # 7. decode from numpy views of one shared buffer (what a feeding process would hand over)
    if want("views"):
        fn, side = routed_async_factory(4, 14, 0.5)
        flat = np.frombuffer(b"".join(blobs), np.uint8)
        offs = np.cumsum([0] + [len(b) for b in blobs])
        views = [flat[offs[i]:offs[i + 1]] for i in range(len(blobs))]
        saved = list(blobs)
        blobs[:] = views
        report("views: routed async, inputs are numpy views of one buffer", timed(fn))
        blobs[:] = saved
        side.shutdown()

    # 8. per-image host costs of the GPU process
    if want("host"):
        t = time.perf_counter()
        for b in blobs:
            jpeg_kind(b)
        report("host: jpeg_kind header parse (Python)", len(blobs) / (time.perf_counter() - t))
        t = time.perf_counter()
        css = [nic.CodeStream(b) for b in blobs]
        report("host: nic.CodeStream(bytes) (header parse in C++)", len(blobs) / (time.perf_counter() - t),
               f"attrs {[a for a in dir(css[0]) if not a.startswith('_')]}")
        t = time.perf_counter()
        paths = [str(f) for f in files]
        [nic.CodeStream(p) for p in paths]
        report("host: nic.CodeStream(path)", len(blobs) / (time.perf_counter() - t))
        d = nic.Decoder(max_num_cpu_threads=4, backends=[nic.Backend(nic.BackendKind.HW_GPU_ONLY)])
        out = d.decode(batches[0], params=params, cuda_stream=stream.ptr)
        stream.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            [im.__cuda_array_interface__ for im in out if im is not None]
        report("host: Image.__cuda_array_interface__", 10 * len(out) / (time.perf_counter() - t))

    # 9. JPEG encode of 224x224 and ~256x340 images, batch 256, encoder thread counts
    if want("encode"):
        rng = np.random.default_rng(0)
        for hw_ in ((224, 224), (256, 341)):
            src = cp.asarray(rng.integers(0, 255, (256, *hw_, 3), dtype=np.uint8))
            src = cp.asarray(cp.asnumpy(src))  # noisy content is the worst case for Huffman
            smooth = cp.asarray(np.repeat(np.repeat(cp.asnumpy(src[:, ::8, ::8]), 8, 1), 8, 2)[:, : hw_[0], : hw_[1]])
            for threads in (0, 4, 8):
                enc = nic.Encoder(max_num_cpu_threads=threads) if threads else nic.Encoder()
                ep = nic.EncodeParams(quality_type=nic.QualityType.QUALITY, quality_value=90.0,
                                      chroma_subsampling=nic.ChromaSubsampling.CSS_420)
                imgs = [nic.as_image(smooth[i], cuda_stream=stream.ptr) for i in range(256)]

                def run_enc(b: int, enc=enc, imgs=imgs, ep=ep) -> None:
                    [bytes(c) for c in enc.encode(imgs, "jpeg", params=ep, cuda_stream=stream.ptr)]

                rate = timed(run_enc, passes=1)  # one pass encodes as many images as the set holds
                report(f"encode: {hw_[0]}x{hw_[1]} q90, encoder threads {threads or 'default'}", rate)
                del enc

    # 13. region (ROI) decode of the train chain's random-resized-crop windows, against full decode
    if want("roi"):
        from gpubatch.engine.ops import RandomResizedCrop
        from gpubatch.engine.rng import record_rng

        rrc = RandomResizedCrop(224)
        heads = [jpeg_kind(b) for b in blobs]
        regions, kept = [], []
        for i, (_, w, h) in enumerate(heads):
            top, left, ch, cw = rrc.make_params(h, w, record_rng(0, f"img{i}"))
            regions.append(nic.Region(top, left, top + ch, left + cw))
            kept.append(ch * cw / (h * w))
        t0 = time.perf_counter()
        subs = [nic.CodeStream(b).get_sub_code_stream(region=r) for b, r in zip(blobs, regions)]
        per_image_us = 1e6 * (time.perf_counter() - t0) / len(blobs)
        sub_batches = [subs[i : i + 256] for i in range(0, len(subs), 256)]
        head_batches = [heads[i : i + 256] for i in range(0, len(heads), 256)]
        area = float(np.mean(kept))
        print(f"roi: mean kept area {area:.2f}; CodeStream + sub-stream per image {per_image_us:.1f} us", flush=True)
        keep: deque = deque()
        for name, share in (("hardware engine only", 0.0), ("CUDA decoder only", 1.0), ("routed, share 0.5", 0.5)):
            dec = GpuImageDecoder(0, 16, cuda_share=share, api="python")  # takes sub-stream objects

            def run(which, dec=dec):
                def fn(b: int) -> None:
                    if which == "full":
                        res = dec.decode(batches[b], stream, headers=head_batches[b])
                    elif which == "roi":
                        res = dec.decode(sub_batches[b], stream, headers=head_batches[b])
                    else:  # sub-streams made in the timed loop, as a pipeline would make them
                        lo = b * 256
                        made = [nic.CodeStream(x).get_sub_code_stream(region=r)
                                for x, r in zip(batches[b], regions[lo : lo + 256])]
                        res = dec.decode(made, stream, headers=head_batches[b])
                    keep.append((stream.record(), res))
                    if len(keep) > 2:
                        keep.popleft()[0].synchronize()

                return fn

            for which in ("full", "roi", "roi+make"):
                timed(run(which))  # warm-up pass
                report(f"roi: {name}, {which}", timed(run(which)))
            keep.clear()
            dec.close()

    print("RESULT " + json.dumps(RESULTS), flush=True)


if __name__ == "__main__":
    main()
