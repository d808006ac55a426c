#!/usr/bin/env python3
"""Where the GPU path's device memory goes, and what each knob costs in memory and speed.

    python3 benchmarks/memory_study.py [--images 4096] [--chain train|val] [--seconds 4]
        [--configs "default;prefetch=1;ring=2;keep=0;threads=8;region=1"]

Each configuration runs in its own process (a fresh CUDA context). Device memory in use is read from
NVML as ``gpubatch bench`` reads it: minus the level before the process touched CUDA, CUDA context
included. Printed per configuration: after the CUDA context (CuPy), after the engine (decoders) is
built, after one warm-up pass over the set, the peak over the whole run, and the images/s of the timed
windows (median of 5, the stream synchronized after every batch) with ``iterate_files``, batch 256;
then what CuPy's pool holds (kernel outputs, launch tables), the high-water marks of the driver's
default pool (decoded images: what it reserved, and what was in use at once; the gap is
fragmentation), how many images the CPU decoded (none expected on the mixed set) and how many chunk
calls gave up waiting for their buffer and took one of their own (none expected).
The rest is the decoders' own buffers and the context.

Knobs (``key=value``, joined by commas; configurations by semicolons):
``prefetch`` (batches decoded ahead), ``ring`` (output buffers), ``threads`` (decoder CPU threads),
``keep`` (MiB of freed memory the driver pool keeps, ``image_gpu.POOL_KEEP``), ``round`` (the least step, MiB,
a batch part's device buffer is rounded up by, ``image_gpu.SLAB_ROUND``), ``fit`` (0: each part's buffer of its
own size instead of the largest part's, ``image_gpu.SLAB_FIT``), ``region`` (1: region decode),
``batch`` (batch size), ``workers`` (feed processes), ``stack`` (bytes of stack per GPU thread,
``gpu_executor.STACK_BYTES``, or ``none`` for the driver's default), ``options`` (extra nvImageCodec
decoder options, joined by "+"), ``api`` (``c``: nvImageCodec's C API, one device buffer per batch;
``python``: its Python binding, one allocation per image), ``hw`` (hardware-decoder instances),
``cuda`` (the CUDA decoder's threads, ``executor.default_decoder_threads``; ``threads`` caps it),
``switch`` (the interpreter's switch interval, seconds, ``gpu_executor.SWITCH_INTERVAL``), ``pin`` (0: the
feed's shared-memory ring not page-locked for the GPU, ``gpu_executor.PIN_FEED``), ``share``
(the CUDA decoder's share of each batch), ``takes`` (``slowest`` or ``cheapest``: the kinds the CUDA decoder's share
is taken from first, ``image_gpu.CUDA_TAKES``), ``cpus`` (the process keeps only the last N of its cores, as
under ``taskset``), ``route`` (``split``, ``hardware`` or ``auto``: how batches are split between the
decoders, ``image_gpu.ROUTE``), ``follow`` (0: the route ``auto`` chose stays for the run instead of
following the load, ``gpubatch.engine.follow``), ``busy_after`` (seconds after the run's process starts
that the ``busy`` processes start: load the route was not chosen by), ``busy_for`` (seconds after the
run's process starts that they stop: load the route was chosen by that goes), ``split_min`` (the free cores from which ``auto`` splits,
``image_gpu.SPLIT_MIN_CORES``), ``readers_hw`` (0: the feed of the ``hardware`` route starts a quarter of the
cores' reader processes instead of half, ``executor.READERS_HW``), ``coupled``
(1: the decode thread waits for both decoders' parts of each batch before it hands over the next,
instead of each decoder's thread going through the batches at its own pace; whole parts), ``chunk``
(images per decode call, each call into a buffer the same call of the next batch part reuses, the
resample run per call, ``ImagePipeline(decode_chunk=...)``; by default ``image_gpu.DECODE_CHUNK``, calls
whole; 0: whole batch parts, a buffer from the driver's pool each),
``hw_chunk`` (the hardware engine's calls are split only above this, ``image_gpu.HW_CHUNK``),
``fence`` (0: the output ring's writers do not wait for the streams the batches were taken on,
``gpu_executor.FENCE_READERS``), ``read`` (``legacy`` or ``own``: each batch is taken with ``stacked()`` on
the legacy default stream or on a non-blocking stream of the consumer's own, so the ring fences it), ``regions_for`` (with ``region=1``: which decoders' parts decode regions, ``hw``, ``cuda`` or
``hw+cuda``, ``image_gpu.REGIONS_FOR``), ``cuda_ring`` (the CUDA decoder's calls take this many buffers in turn; 0: call k of a part takes
buffer k, ``image_gpu.CUDA_RING``), ``slack`` (a chunk buffer grows to a call's size plus
1/slack, ``image_gpu.RING_SLACK``), ``grow`` (``free``: a chunk buffer that grows gives the old one back
first; ``overlap``: the new one is taken first, the old freed once read; ``image_gpu.FREE_BEFORE_GROW``), ``most`` (0: a
chunk buffer is sized by its call alone, not also by the most of its kind a batch has had, ``image_gpu.SIZE_BY_MOST``), ``core`` (0: no CPU core of its own for the hardware
decoder's thread, ``affinity.RESERVE_CORE``), ``sched`` (how host threads wait for the GPU: ``auto``, ``spin``,
``yield`` or ``blocking``, ``gpu_executor.SYNC_POLICY`` by default), ``connections``
(``CUDA_DEVICE_MAX_CONNECTIONS``), ``hw_threads`` (each hardware-decoder instance's worker
threads, ``GpuImageDecoder.HW_THREADS``), ``direct`` (0: the hardware engine through nvImageCodec's
hardware decoder instead of nvJPEG directly, ``image_gpu.HW_DIRECT``), ``planes`` (``always``, ``chunked`` or ``never``:
when the direct path decodes 4:2:0 and 4:2:2 images into their planes instead of interleaved RGB,
``image_gpu.HW_PLANES``), ``prio`` (the decoder streams made at the device's greatest
priority: ``hw``, ``cuda`` or ``hw+cuda``, ``image_gpu.HIGH_PRIORITY``), ``alloc`` (``count``, ``pool`` or ``cache``: give nvImageCodec's decoders
allocators of ours that count nvJPEG's own device and pinned memory, from ``cudaMalloc`` or from the
stream-ordered pool; ``cache`` also keeps freed pinned blocks for reuse instead of ``cudaFreeHost``), ``busy`` (that many busy processes at nice 19 beside the run, ``gpubatch bench --busy``; ``busy_kind``
``normal``: at nice 0, ``idle``: SCHED_IDLE), ``slice`` (us: the scheduler time slice the process's
threads ask for, Linux 6.12+ ``sched_setattr``), ``nice`` / ``nice_readers``
(the threads Python did not start, nvImageCodec's workers among them / the feed's processes set to this
nice value after the warm-up pass), ``growth`` (1: log each chunk buffer that grows and each route switch, with the driver pool's
reserved and in-use MiB after it), ``profile`` (1: wall time per function, cProfile, over the timed windows; in Python 3.12
it sees every thread, and slows them), ``gil`` (ms of pure-Python work, the GIL held, added to each batch's hand-over: how
much the pipeline suffers from other threads holding the GIL). ``--threads`` prints the CPU cores each thread (pool) of the process, and its
child processes together, kept busy during the timed windows; ``--gil-probe`` how late a thread
coming back from a 1 ms sleep got the GIL back (the wait a decoder thread has after each native call).
The context column is the CUDA context CuPy makes; the engine column is after the engine set the
stack size and built its decoders; the end column is what was in use when the timed windows ended
(below the peak where the peak passed, as at a switch of the decode route).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _data import DEFAULT_DATA, ROOT, jpeg_set, parse_mix  # noqa: F401  (benchmarks/_data.py, beside this script)

from gpubatch.bench.contenders import file_keys


def one(args: argparse.Namespace, knobs: dict[str, str]) -> dict:
    from gpubatch.bench.measure import GpuSampler, timed_windows

    if "cpus" in knobs:  # the process may use only the last N of its cores (as under taskset), from the start
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[-int(knobs["cpus"]):]))
    if "slice" in knobs:  # us: time slices asked for this process's threads (EEVDF custom slice; inherited)
        print(f"slice now {_ask_slice(int(float(knobs['slice']) * 1000))} ns", file=sys.stderr)
    if "connections" in knobs:  # CUDA_DEVICE_MAX_CONNECTIONS: the device's work queues streams map onto
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = knobs["connections"]
    from gpubatch.engine import gpu_executor

    # how host threads wait for the GPU, set before the context below exists (the engine sets its
    # default only where it makes the context itself)
    gpu_executor.set_sync_policy(0, knobs.get("sched", gpu_executor.SYNC_POLICY))
    sampler = GpuSampler(0)  # before CUDA is touched
    if not sampler.ok:
        return {"error": "NVML is not available"}
    mib = lambda: round((sampler.used() - sampler.base) / 2**20)  # noqa: E731
    import cupy as cp

    cp.cuda.Device(0).use()
    cp.zeros(1)
    out = {"context_mib": mib()}

    if "internal" in knobs:  # 0: the driver's pool may not make a stream wait on another to reuse memory
        pool = cp.cuda.runtime.deviceGetDefaultMemPool(0)
        cp.cuda.runtime.memPoolSetAttribute(pool, 3, int(knobs["internal"]))  # ReuseAllowInternalDependencies
    if "stack" in knobs:  # bytes of stack per GPU thread the engine sets (cudaLimitStackSize); none: the driver's
        gpu_executor.STACK_BYTES = None if knobs["stack"] == "none" else int(knobs["stack"])

    from gpubatch.bench import chain_ops, get_model
    from gpubatch.engine.codecs import image_gpu
    from gpubatch.engine.pipeline import ImagePipeline

    if "planes" in knobs:  # when the hardware engine's direct path decodes into planes (always, chunked, never)
        image_gpu.HW_PLANES = knobs["planes"]
    if "keep" in knobs:
        image_gpu.POOL_KEEP = int(knobs["keep"]) << 20
    if "round" in knobs:  # the least step (MiB) a batch part's buffer is rounded up by
        image_gpu.SLAB_ROUND = int(knobs["round"]) << 20
    if "fit" in knobs:  # 1: parts take the size of the largest part before them (within a third)
        image_gpu.SLAB_FIT = knobs["fit"] == "1"
    if "route" in knobs:  # how batches are split between the decoders (split, hardware, auto)
        os.environ["GPUBATCH_DECODE_ROUTE"] = knobs["route"]
    if "readers_hw" in knobs:  # 0: the hardware route's feed keeps a quarter of the cores' readers
        from gpubatch.engine import executor

        executor.READERS_HW = knobs["readers_hw"] == "1"
    if "follow" in knobs:  # 0: the route "auto" chose stays for the run (engine/follow.py)
        os.environ["GPUBATCH_FOLLOW"] = knobs["follow"]
    if "split_min" in knobs:  # free cores from which the auto route splits (image_gpu.SPLIT_MIN_CORES)
        image_gpu.SPLIT_MIN_CORES = float(knobs["split_min"])
    if "api" in knobs:  # the decoder through nvImageCodec's C API (c) or its Python binding (python)
        os.environ["GPUBATCH_DECODE_API"] = knobs["api"]
    if "hw" in knobs:  # hardware-decoder instances the calls take turns on
        os.environ["GPUBATCH_HW_DECODERS"] = knobs["hw"]
    if "cuda" in knobs:  # the CUDA decoder's threads (executor.default_decoder_threads)
        from gpubatch.engine import executor

        executor.default_decoder_threads = lambda: int(knobs["cuda"])
    if "pin" in knobs:  # 0: the feed's ring stays pageable (gpu_executor.PIN_FEED)
        os.environ["GPUBATCH_PIN_FEED"] = knobs["pin"]
    if "switch" in knobs:  # the interpreter's switch interval the engine sets (seconds)
        os.environ["GPUBATCH_SWITCH_INTERVAL"] = knobs["switch"]
    if knobs.get("coupled") == "1":  # the decode thread waits for both decoders' parts of each batch (whole)
        decode = image_gpu.GpuImageDecoder.decode
        image_gpu.GpuImageDecoder.decode = lambda self, *a, **k: decode(self, *a, **{**k, "wait": True, "chunk": 0})
    if "gil" in knobs:  # the hand-over thread holds the GIL this many more ms per batch (pure Python)
        extra = float(knobs["gil"]) / 1e3
        handed = image_gpu.GpuImageDecoder.decode

        def busy_decode(self, *a, **k):
            t_end = time.perf_counter() + extra
            while time.perf_counter() < t_end:
                pass
            return handed(self, *a, **k)

        image_gpu.GpuImageDecoder.decode = busy_decode
    if "hw_threads" in knobs:  # each hardware-decoder instance's worker threads (its header parsing)
        image_gpu.GpuImageDecoder.HW_THREADS = int(knobs["hw_threads"])
    if "hw_mixed" in knobs:  # 1: the hardware engine's part in one call, whatever the kinds (image_gpu.HW_MIXED)
        image_gpu.HW_MIXED = knobs["hw_mixed"] == "1"
    if "hw_chunk" in knobs:  # the hardware engine's calls are split above this many images (chunks)
        image_gpu.HW_CHUNK = int(knobs["hw_chunk"])
    if "calls" in knobs:  # calls a chunked part is split into at least (image_gpu.MIN_CALLS)
        image_gpu.MIN_CALLS = int(knobs["calls"])
    if "grow" in knobs:  # "free": a growing chunk buffer gives its old one back first; "overlap": the new first
        image_gpu.FREE_BEFORE_GROW = knobs["grow"] == "free"
    if "most" in knobs:  # 0: a chunk buffer sized by its call alone (image_gpu.SIZE_BY_MOST)
        image_gpu.SIZE_BY_MOST = knobs["most"] == "1"
    if "slack" in knobs:  # a chunk buffer grows to the call's size plus 1/slack
        image_gpu.RING_SLACK = int(knobs["slack"])
    if "hw_ring" in knobs:  # as cuda_ring, for the hardware engine
        image_gpu.HW_RING = int(knobs["hw_ring"])
    if "direct" in knobs:  # 0: the hardware engine through nvImageCodec instead of nvJPEG directly
        os.environ["GPUBATCH_HW_DIRECT"] = knobs["direct"]
    if "prio" in knobs:  # decoder streams at the greatest priority: hw, cuda or both ("+"-joined)
        image_gpu.HIGH_PRIORITY = tuple(knobs["prio"].split("+"))
    if "fence" in knobs:  # 0: the output ring's writers do not wait for the consumer's stream
        gpu_executor.FENCE_READERS = knobs["fence"] == "1"
    if "regions_for" in knobs:  # with region=1, which decoders' parts take the regions (hw, cuda, "+"-joined)
        image_gpu.REGIONS_FOR = tuple(knobs["regions_for"].split("+"))
    if "cuda_ring" in knobs:  # the CUDA decoder's calls over this many buffers in turn (0: one per call of a part)
        image_gpu.CUDA_RING = int(knobs["cuda_ring"])
    if "core" in knobs:  # 0: no CPU core reserved for the hardware decoder's thread (affinity.RESERVE_CORE)
        from gpubatch.engine import affinity

        affinity.RESERVE_CORE = knobs["core"] == "1"
    counted = _count_allocations(knobs["alloc"]) if "alloc" in knobs else None
    growth = _log_growth() if knobs.get("growth") == "1" else None
    files = jpeg_set(args.data, args.images, parse_mix(args.mix))
    keys = file_keys(files)
    ops = chain_ops(get_model("resnet50").chains[args.chain])
    batch = int(knobs.get("batch", 256))
    ring = {"ring": int(knobs["ring"])} if "ring" in knobs else {}
    pipe = ImagePipeline(ops, device="gpu", seed=0, **ring,
                         cpu_threads=int(knobs["threads"]) if "threads" in knobs else None,
                         region_decode=knobs.get("region", "0") == "1",
                         decoder_options=knobs.get("options", "").replace("+", " "),
                         decode_chunk=int(knobs["chunk"]) if "chunk" in knobs else None)
    out["engine_mib"] = mib()
    if "share" in knobs:  # the CUDA decoder's share of each batch
        pipe.engine.decoder.cuda_share, pipe.engine.decoder.follower = float(knobs["share"]), None
    if "takes" in knobs:  # which kinds the CUDA decoder's share is taken from first (slowest, cheapest)
        pipe.engine.decoder.cuda_takes = knobs["takes"]
    workers = int(knobs["workers"]) if "workers" in knobs else None
    it = pipe.iterate_files(files, keys, batch, repeat=True, prefetch=int(knobs.get("prefetch", 1)), workers=workers)
    for _ in range(-(-len(files) // batch)):
        next(it)
    pipe.engine.stream.synchronize()
    if "nice" in knobs or "nice_readers" in knobs:  # (study) native threads / the feed's processes at a lower priority
        import threading

        from gpubatch.engine.affinity import tree_cpu_seconds

        py = {t.native_id for t in threading.enumerate()}
        for tid in os.listdir("/proc/self/task") if "nice" in knobs else ():
            if int(tid) not in py:
                os.setpriority(os.PRIO_PROCESS, int(tid), int(knobs["nice"]))
        for pid in tree_cpu_seconds() if "nice_readers" in knobs else ():
            if pid != os.getpid():
                os.setpriority(os.PRIO_PROCESS, pid, int(knobs["nice_readers"]))
    out["after_pass_mib"] = mib()
    out["cupy_pool_mib"] = cp.get_default_memory_pool().total_bytes() >> 20  # kernel outputs, tables
    from gpubatch.bench.measure import CpuUse

    before, _ = thread_cpu()
    host = CpuUse()
    alloc_before = {k: (v["n"], v.get("frees", 0)) for k, v in counted.items()} if counted is not None else {}
    prof = None
    if knobs.get("profile") == "1":  # wall time per function (cProfile: every thread in 3.12), timed windows
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    probe = GilProbe() if knobs.get("probe") == "1" else None
    take = lambda: len(next(it))  # noqa: E731
    if knobs.get("read") in ("legacy", "own"):  # the batch taken (stacked()) on a stream, which the ring then fences
        own = cp.cuda.Stream(non_blocking=True) if knobs["read"] == "own" else cp.cuda.Stream.null

        def take() -> int:
            with own:
                return len(next(it).stacked())
    res = timed_windows(take, args.seconds, warmup=0, sync=pipe.engine.stream.synchronize)
    out["end_mib"] = mib()  # in use at the end of the timed windows (the peak may have been passing)
    if probe is not None:
        out["gil_wait_us"] = probe.stop()
    if prof is not None:
        prof.disable()
        out["profile"] = _top_functions(prof, 22)
    after, counts = thread_cpu()
    host.stop()
    out["host_cpu"] = host.host
    wall = res["seconds"]
    out["threads"] = {(f"{k} ({counts[k]})" if k in counts else k): round((v - before.get(k, 0.0)) / wall, 2)
                      for k, v in after.items()}
    out["images_per_s"] = round(res["images_per_s"])
    drv = cp.cuda.runtime.deviceGetDefaultMemPool(0)  # decoded images: high-water marks of the whole run
    out["driver_pool_high_mib"] = cp.cuda.runtime.memPoolGetAttribute(drv, 6) >> 20  # reserved (ReservedMemHigh)
    out["driver_used_high_mib"] = cp.cuda.runtime.memPoolGetAttribute(drv, 8) >> 20  # in use at once (UsedMemHigh)
    out["peak_mib"] = round(sampler.stop()["gpu_mem_gib"] * 1024)
    out["decoder_mib_kept"] = image_gpu.POOL_KEEP >> 20
    out["not_on_gpu"] = pipe.stats["images"] - pipe.stats["gpu"]  # CPU fallbacks (none expected on the set)
    out["ring_waits"] = pipe.engine.decoder.ring_waits  # chunk calls that took a buffer of their own
    out["frees_late"] = pipe.engine.decoder.frees_late  # buffers a switch or growth could not give back at once
    out["driver_pool_end_mib"] = (cp.cuda.runtime.memPoolGetAttribute(drv, 5) >> 20,  # reserved now
                                  cp.cuda.runtime.memPoolGetAttribute(drv, 7) >> 20)  # in use now
    from gpubatch.engine.executor import default_readers

    start = pipe.engine.decode_route  # the route at the start, which chose the readers (the decoder's may have followed the load since)
    out["route"] = (f"{start}" + (f" ({pipe.engine.route_cores} free)" if pipe.engine.route_cores else "")
                    + f", {workers or default_readers(route=start)} readers")
    fol = pipe.engine.decoder.follower
    if fol is not None and fol.switches:  # the route as it followed the load
        out["route"] += ", then " + ", ".join(f"{r} at {t:.0f} s ({c:.1f} free)" for t, r, c in fol.switches)
        out["route"] += " (batches " + "/".join(str(v) for v in pipe.engine.decoder.route_batches.values()) + ")"
        out["route"] += f"; {out['frees_late']} buffers given back late"
    out["route"] += f"; driver pool at the end {out['driver_pool_end_mib'][0]} MiB, {out['driver_pool_end_mib'][1]} in use"
    if counted is not None:
        out["decoder_alloc"] = {k: {"peak_mib": round(v["peak"] / 2**20, 1), "now_mib": round(v["now"] / 2**20, 1),
                                    "mallocs": v["n"], "frees": v.get("frees", 0), "largest_mib": round(v["big"] / 2**20, 2),
                                    "timed_mallocs_frees": (v["n"] - alloc_before.get(k, (0, 0))[0],
                                                            v.get("frees", 0) - alloc_before.get(k, (0, 0))[1])}
                                for k, v in counted.items()}
    if growth is not None:
        out["growth"] = growth
    out["stage_s"] = {k: round(v, 2) for k, v in {**pipe.timings, **pipe.engine.decoder.timings}.items() if v}
    it.close()
    pipe.close()
    return out


class GilProbe:
    """How long a thread coming back from native code waits for the GIL: a thread that sleeps 1 ms
    at a time (the GIL released, as in a ctypes or CUDA call) and notes how late it runs again. The
    lateness is the wait for the GIL plus the OS's wake-up delay (tens of microseconds on an idle
    machine); ``stop`` gives its mean and percentiles in microseconds."""

    def __init__(self, period: float = 1e-3):
        import threading

        self.period, self.late = period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        clock, sleep, late, period = time.perf_counter, time.sleep, self.late, self.period
        while not self._stop.is_set():
            t0 = clock()
            sleep(period)
            late.append(clock() - t0 - period)

    def stop(self) -> dict[str, float]:
        import numpy as np

        self._stop.set()
        self._thread.join()
        us = np.asarray(self.late) * 1e6
        if not len(us):
            return {}
        return {"n": len(us), "mean": round(float(us.mean()), 1),
                **{f"p{q}": round(float(np.percentile(us, q)), 1) for q in (50, 90, 99)}}


def _count_allocations(how: str) -> dict[str, dict[str, int]]:
    """Give every nvImageCodec decoder the engine makes (C API) a device and a pinned allocator of ours
    that count what nvJPEG takes, per decoder kind ("hw", "cuda") and memory ("device", "pinned"):
    bytes now, peak bytes, calls, largest. ``how``: ``count`` (cudaMalloc, as nvJPEG does by itself) or
    ``pool`` (the driver's stream-ordered pool, on the stream nvJPEG names)."""
    import ctypes as C

    import cupy as cp

    from gpubatch.engine.codecs import nvimgcodec_c as nc

    rt = cp.cuda.runtime
    stats: dict[str, dict[str, int]] = {}
    sizes: dict[int, tuple[str, int]] = {}
    malloc_t = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.c_size_t, C.c_void_p)
    free_t = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t, C.c_void_p)
    kinds = {1: "hw/device", 2: "hw/pinned", 3: "cuda/device", 4: "cuda/pinned"}

    def note(key: str, ptr: int, size: int) -> None:
        s = stats.setdefault(key, {"now": 0, "peak": 0, "n": 0, "big": 0})
        s["now"] += size
        s["n"] += 1
        s["peak"], s["big"] = max(s["peak"], s["now"]), max(s["big"], size)
        sizes[ptr] = (key, size)

    def forget(ptr: int) -> None:
        key, size = sizes.pop(ptr, (None, 0))
        if key is not None:
            stats[key]["now"] -= size

    def malloc(take):
        def call(ctx, out, size, stream):
            try:
                ptr = take(size, stream or 0)
            except Exception:  # nvJPEG reads the failure from the status
                return 1
            out[0] = ptr
            note(kinds[ctx], ptr, size)
            return 0

        return malloc_t(call)

    def free(give):
        def call(ctx, ptr, size, stream):
            if ptr:
                stats.setdefault(kinds[ctx], {"now": 0, "peak": 0, "n": 0, "big": 0})
                stats[kinds[ctx]]["frees"] = stats[kinds[ctx]].get("frees", 0) + 1
                forget(ptr)
                give(ptr, stream or 0)
            return 0

        return free_t(call)

    pool = how in ("pool", "cache")
    device = (malloc(rt.mallocAsync if pool else lambda n, _s: rt.malloc(n)),
              free(rt.freeAsync if pool else lambda p, _s: rt.free(p)))
    pinned = (malloc(lambda n, _s: rt.hostAlloc(n, 0)), free(lambda p, _s: rt.freeHost(p)))
    if how == "cache":  # pinned blocks kept for reuse, never given back (cudaFreeHost waits for the device)
        import threading

        lock, kept, block = threading.Lock(), {}, {}

        def bucket(n: int) -> int:
            return 1 << max(12, (n - 1).bit_length())

        def take(n: int, _s: int) -> int:
            b = bucket(n)
            with lock:
                if kept.get(b):
                    return kept[b].pop()
            p = rt.hostAlloc(b, 0)
            with lock:
                block[p] = b
            return p

        def give(p: int, _s: int) -> None:
            with lock:
                kept.setdefault(block[p], []).append(p)

        pinned = (malloc(take), free(give))

    class Allocator(C.Structure):  # nvimgcodecDeviceAllocator_t and nvimgcodecPinnedAllocator_t alike
        _fields_ = nc._head() + [("malloc", malloc_t), ("free", free_t), ("ctx", C.c_void_p), ("padding", C.c_size_t)]

    keep: list = []
    decoder = nc.Library.decoder

    def with_allocators(self, device_id, threads, backend, options=""):
        base = 1 if backend == nc.BACKEND_HW_GPU_ONLY else 3
        dev, pin = nc._new(Allocator, 3), nc._new(Allocator, 4)  # STRUCTURE_TYPE_DEVICE/PINNED_ALLOCATOR
        (dev.malloc, dev.free), dev.ctx = device, base
        (pin.malloc, pin.free), pin.ctx = pinned, base + 1
        keep.extend([dev, pin, device, pinned])
        return decoder(self, device_id, threads, backend, options, allocators=(C.addressof(dev), C.addressof(pin)))

    nc.Library.decoder = with_allocators
    nc._keep_allocators = keep  # the structures and callbacks live as long as the process
    return stats


def _log_growth() -> list[str]:
    """Log each chunk buffer that grows (seconds into the run, decoder, slot, MiB before and after) and
    each route switch, with the driver pool's reserved and in-use MiB after it (``growth=1``)."""
    import cupy as cp

    from gpubatch.engine.codecs import image_gpu

    log: list[str] = []
    rt, t0 = cp.cuda.runtime, time.perf_counter()

    def pool() -> str:
        drv = rt.deviceGetDefaultMemPool(0)
        return f"pool {rt.memPoolGetAttribute(drv, 5) >> 20}/{rt.memPoolGetAttribute(drv, 7) >> 20}"

    bind, follow = image_gpu.GpuImageDecoder._ring_bind, image_gpu.GpuImageDecoder._follow

    def ring_bind(self, job, idx, shapes, turns):
        ring = self._rings[job.hw]
        sizes = [sl.size for sl in ring]
        bind(self, job, idx, shapes, turns)
        for k, sl in enumerate(ring):
            if sl.size != (sizes[k] if k < len(sizes) else 0):
                log.append(f"{time.perf_counter() - t0:.2f} {'hw' if job.hw else 'cuda'}[{k}] "
                           f"{(sizes[k] if k < len(sizes) else 0) >> 20}->{sl.size >> 20} {pool()}")

    def follow_(self, now):
        route = self.route
        follow(self, now)
        if self.route != route:
            log.append(f"{time.perf_counter() - t0:.2f} switch to {self.route} {pool()}")

    image_gpu.GpuImageDecoder._ring_bind, image_gpu.GpuImageDecoder._follow = ring_bind, follow_
    return log


def _top_functions(prof, n: int) -> list[str]:
    """The ``n`` functions the profile saw most wall time spent in themselves (cProfile's tottime), with
    their calls and cumulative time. (In Python 3.12 cProfile sees every thread, not only its own.)"""
    import pstats

    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [f"{tt:7.3f}s self {ct:7.3f}s total {nc:7d} calls  {os.path.basename(f)}:{ln}({fn})"
            for (f, ln, fn), (_, nc, tt, ct, _) in rows]


def thread_cpu() -> tuple[dict[str, float], dict[str, int]]:
    """(CPU seconds so far per thread of this process, by the Python thread's name (threads of one pool
    summed: "gpubatch-cuda-decode_0" counts as "gpubatch-cuda-decode"), threads Python did not start
    (nvImageCodec's workers, the driver's) as "native", and all descendant processes (the feed's
    workers) as "children"; how many "native" threads and "children" there are); from /proc (Linux)."""
    import re
    import threading

    from gpubatch.engine.affinity import stat_cpu, tree_cpu_seconds

    names = {t.native_id: re.sub(r"_\d+$", "", t.name) for t in threading.enumerate()}
    out: dict[str, float] = {}
    native = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            c = stat_cpu(f"/proc/self/task/{tid}/stat")[1]
        except OSError:
            continue
        name = names.get(int(tid))
        if name is None:
            name, native = "native", native + 1
        out[name] = out.get(name, 0.0) + c
    kids = {pid: c for pid, c in tree_cpu_seconds().items() if pid != os.getpid()}
    out["children"] = sum(kids.values())
    return out, {"native": native, "children": len(kids)}


_LIMITS = ("stack", "printf FIFO", "malloc heap")  # cudaLimit 0, 1, 2


def breakdown(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(step, MiB above the level before CUDA, the context's limits) after each step of building and
    running the GPU path, train chain, defaults: where the memory goes, piece by piece. The decoders
    are first built alone (and destroyed) to price each, then the pipeline is built as ``bench`` does."""
    from gpubatch.bench.measure import GpuSampler

    sampler = GpuSampler(0)
    if not sampler.ok:
        return [("NVML is not available", 0, "")]
    import cupy as cp

    rows: list[tuple[str, int, str]] = []
    rt = cp.cuda.runtime

    def note(what: str) -> None:
        limits = ", ".join(f"{n} {rt.deviceGetLimit(i) >> 10} KiB" if i else f"{n} {rt.deviceGetLimit(i)} B"
                           for i, n in enumerate(_LIMITS))
        rows.append((what, round((sampler.used() - sampler.base) / 2**20), limits))

    cp.cuda.Device(0).use()
    rt.free(0)
    note("CUDA context (cudaFree(0))")
    cp.zeros(1)
    note("+ CuPy's first array")
    from gpubatch.engine import gpu_executor

    rt.deviceSetLimit(0, gpu_executor.STACK_BYTES or rt.deviceGetLimit(0))
    note(f"+ stack {gpu_executor.STACK_BYTES} bytes per thread")
    from gpubatch.engine.codecs import image_gpu
    from gpubatch.engine.codecs.image_gpu import GpuImageDecoder
    from gpubatch.engine.codecs.nvimgcodec_c import BACKEND_HW_GPU_ONLY, BACKEND_HYBRID_CPU_GPU, library
    from gpubatch.engine.executor import default_decoder_threads

    lib = library()
    note("+ nvImageCodec instance")
    built = []
    for k in range(GpuImageDecoder.HW_INSTANCES):
        built.append(lib.decoder(0, GpuImageDecoder.HW_THREADS, BACKEND_HW_GPU_ONLY))
        note(f"+ hardware decoder {k + 1}")
    built.append(lib.decoder(0, default_decoder_threads(), BACKEND_HYBRID_CPU_GPU, image_gpu.CUDA_DECODER_OPTIONS))
    note(f"+ CUDA decoder ({default_decoder_threads()} threads)")
    for d in built:
        d.close()
    note("decoders destroyed")
    from gpubatch.bench import chain_ops, get_model
    from gpubatch.engine.pipeline import ImagePipeline

    files = jpeg_set(args.data, args.images, parse_mix(args.mix))
    keys = file_keys(files)
    pipe = ImagePipeline(chain_ops(get_model("resnet50").chains[args.chain]), device="gpu", seed=0, warm_up=0)
    note("pipeline built (engine, decoders)")
    dec = pipe.engine.decoder
    blobs = image_gpu._tiny_jpegs(256)  # the warm-up's batch, one decoder at a time
    for k, _ in enumerate(dec.hw_cs or dec.hw_direct):
        dec.first_call(True, blobs)
        note(f"+ hardware decoder {k + 1}'s first call (256 tiny JPEGs)")
    dec.first_call(False, blobs)
    note("+ the CUDA decoder's first call")
    pipe.engine.warm_up(256)
    note("+ the rest of the engine's warm-up (resample kernels loaded)")
    drv = rt.deviceGetDefaultMemPool(0)
    it = pipe.iterate_files(files, keys, 256, repeat=True)
    next(it)
    pipe.engine.stream.synchronize()
    note("+ first batch")
    for _ in range(-(-len(files) // 256)):
        next(it)
    pipe.engine.stream.synchronize()
    note("+ one pass over the set")
    peak = round((sampler.stop()["gpu_mem_gib"] or 0) * 1024)
    pool = cp.get_default_memory_pool()
    other = sampler.used() - sampler.base - pool.total_bytes() - rt.memPoolGetAttribute(drv, 5)
    rows.append(("now, of which in neither pool (the context, the decoders' own buffers, kernels)", other >> 20, ""))
    rows.append((f"peak; CuPy pool {pool.total_bytes() >> 20} MiB (used {pool.used_bytes() >> 20}); driver pool "
                 f"reserved high {rt.memPoolGetAttribute(drv, 6) >> 20} MiB, used high "
                 f"{rt.memPoolGetAttribute(drv, 8) >> 20} MiB, reserved now {rt.memPoolGetAttribute(drv, 5) >> 20}",
                 peak, ""))
    it.close()
    pipe.close()
    return rows


def _knobs(config: str) -> dict[str, str]:
    """A configuration's knobs: "a=1,b=x" -> {"a": "1", "b": "x"}."""
    return dict(kv.split("=", 1) for kv in config.split(",") if "=" in kv)


def _ask_slice(ns: int) -> int | None:
    """Ask the scheduler (Linux 6.12+) for time slices of ``ns`` for the calling thread and what it
    starts, its policy and nice value kept (``sched_setattr`` with ``sched_runtime``, x86-64); returns
    the slice the kernel then reports, or None."""
    import ctypes as C

    class Attr(C.Structure):
        _fields_ = [("size", C.c_uint32), ("policy", C.c_uint32), ("flags", C.c_uint64), ("nice", C.c_int32),
                    ("priority", C.c_uint32), ("runtime", C.c_uint64), ("deadline", C.c_uint64), ("period", C.c_uint64)]

    import platform

    if platform.machine() != "x86_64":
        return None
    libc, attr = C.CDLL(None, use_errno=True), Attr()
    set_nr, get_nr = 314, 315  # sched_setattr, sched_getattr (x86-64)
    if libc.syscall(get_nr, 0, C.byref(attr), C.sizeof(Attr), 0) != 0 or attr.policy != 0:
        return None
    attr.size, attr.runtime = C.sizeof(Attr), ns
    if libc.syscall(set_nr, 0, C.byref(attr), 0) != 0:
        return None
    libc.syscall(get_nr, 0, C.byref(attr), C.sizeof(Attr), 0)
    return int(attr.runtime)


def _child(args: argparse.Namespace, one: str) -> tuple[object, str | None]:
    """Run ``--one ONE`` in a fresh process (a fresh CUDA context): (its result, None), or (None, the
    last line it wrote to stderr)."""
    cmd = [sys.executable, __file__, "--one", one, "--images", str(args.images), "--chain", args.chain,
           "--seconds", str(args.seconds), "--data", args.data, "--mix", args.mix]
    from gpubatch.bench.measure import BusyLoad, run_beside

    knobs = _knobs(one)
    busy = BusyLoad(int(knobs.get("busy", 0)), knobs.get("busy_kind", "nice"))  # beside the run (bench --busy)
    # from busy_after seconds after the run's process starts to busy_for seconds after (default: its end)
    p = run_beside(cmd, busy, after=float(knobs.get("busy_after", 0)),
                   until=float(knobs["busy_for"]) if "busy_for" in knobs else None)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return None, (p.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(line[7:]), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--chain", default="train", choices=["train", "val"])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--configs", default="default;stack=none;prefetch=2;ring=2;region=1")
    ap.add_argument("--stages", action="store_true", help="print the seconds each stage took (pipeline, decoder)")
    ap.add_argument("--threads", action="store_true",
                    help="print the CPU cores each thread (pool) kept busy during the timed windows")
    ap.add_argument("--breakdown", action="store_true",
                    help="only the memory after each step of building and running the default GPU path")
    ap.add_argument("--gil-probe", action="store_true",
                    help="print how late a thread returning from a 1 ms sleep got the GIL back (GilProbe)")
    ap.add_argument("--mix", default="", help="the set's chroma subsamplings when it is made, e.g. "
                    "4:2:0=0.5,4:4:4=0.5 (default: the synthetic set's mix); give such a set its own --data")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.breakdown:
        jpeg_set(args.data, args.images, parse_mix(args.mix))
        rows, failed = _child(args, "breakdown")
        if failed:
            print(f"breakdown failed: {failed}")
            return
        print(f"{args.chain} chain, {args.images} images; MiB of device memory in use above the level before CUDA")
        for what, mib, limits in rows:
            print(f"{mib:6d}  {what}" + (f"  ({limits})" if limits else ""))
        return
    if args.one == "breakdown":
        print("RESULT " + json.dumps(breakdown(args)), flush=True)
        return
    if args.one is not None:
        knobs = _knobs(args.one)
        print("RESULT " + json.dumps(one(args, knobs)), flush=True)
        return
    jpeg_set(args.data, args.images, parse_mix(args.mix))  # make the set once, outside the timed processes
    print(f"{args.chain} chain, {args.images} images; MiB of device memory in use above the level before CUDA")
    print(f"{'configuration':34s} {'context':>8s} {'engine':>8s} {'1 pass':>8s} {'peak':>8s} {'end':>5s} {'images/s':>9s}"
          f" {'CuPy pool':>9s} {'decoded':>8s} {'in use':>7s} {'CPU':>5s} {'waits':>5s}")
    for cfg in args.configs.split(";"):
        r, failed = _child(args, cfg + (",probe=1" if args.gil_probe else ""))
        if failed:
            print(f"{cfg:34s} failed: {failed}")
            continue
        if "error" in r:
            print(f"{cfg:34s} {r['error']}")
            continue
        print(f"{cfg:34s} {r['context_mib']:8d} {r['engine_mib']:8d} {r['after_pass_mib']:8d} {r['peak_mib']:8d} "
              f"{r.get('end_mib', 0):5d} {r['images_per_s']:9,d} {r['cupy_pool_mib']:9d} {r['driver_pool_high_mib']:8d} "
              f"{r['driver_used_high_mib']:7d} {r['not_on_gpu']:5d} {r['ring_waits']:5d}"
              + f"  {r['route']}"
              + (f"  host: {r['host_cpu']['others']} cores busy elsewhere, {r['host_cpu']['steal']} stolen"
                 if r.get("host_cpu") else ""), flush=True)
        if args.stages:
            print(f"{'':34s} seconds per stage, whole run: {r['stage_s']}", flush=True)
        if "gil_wait_us" in r:
            print(f"{'':34s} GIL wait after a 1 ms sleep (us): {r['gil_wait_us']}", flush=True)
        if "growth" in r:
            print(f"{'':34s} chunk buffers grown, switches (s, MiB; pool reserved/in use): " + "; ".join(r["growth"]), flush=True)
        if "decoder_alloc" in r:
            print(f"{'':34s} nvJPEG's own allocations: {r['decoder_alloc']}", flush=True)
        if "profile" in r:
            print("\n".join(f"{'':34s} {line}" for line in r["profile"]), flush=True)
        if args.threads:
            busy = sorted(r["threads"].items(), key=lambda kv: -kv[1])
            print(f"{'':34s} CPU cores busy per thread, timed windows: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in busy if v >= 0.01), flush=True)


if __name__ == "__main__":
    main()
