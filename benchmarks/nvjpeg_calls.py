#!/usr/bin/env python3
"""nvJPEG's hardware-backend calls alone, as :class:`gpubatch.engine.codecs.nvjpeg_hw.HwBatchDecoder` makes them,
under call sizes that stay the same or change from call to call, nvJPEG's memory settings, and other work beside.

Why: under ``convert`` a hardware call cost 65-86 us of nvJPEG's host code an image against 28-34 in ``bench``
(H200, 2026-12-04), with or without the GIL in it, and py-spy found ``cuMemFree_v2`` (a free that waits for the
whole device) inside ``nvjpegDecodeBatched``. ``convert``'s hardware calls differ in size from call to call (a
batch's part of one kind); ``nvjpegDecodeBatchedInitialize`` is told each call's size.

Found (H200, 2026-12-04, benchmarks/RESULTS.md "01:37 to 02:11"): alone, 30 us an image (31,000 images a second
for one thread), whatever the call sizes, padding, pool or the cores' load; the call itself blocks while other
work holds the GPU: 57-59 us with the copy engines busy, 286-319 us with every SM busy, 54 us where each call's
stream first waits 2 ms, 60 us for each of two processes; the streams' priority changed none of it.
Then (2026-12-04 "09:20 to 09:22"): the pool preallocated changed nothing, and the calls stretched as much for
spinning kernels in another process as in their own (292 against 285 us), for copies less (47 against 58): they wait
for the GPU's work, whichever context holds it.
With half the SMs left free they still took 65 us, and 61 beside 20-us kernels back to back on every SM
("09:41 to 09:42"): not a wait for a free SM.

Each mode makes two instances (handle and state) with a CUDA stream each, as the decoder does, and alternates
calls between them, each call first waiting for its instance's previous call (as ``decode`` does):

- ``fixed``: every call ``--batch`` images;
- ``vary``: call sizes from ``--batch``/2 to ``--batch``, the same sequence in every mode;
- ``vary-padding``: ``vary`` with ``nvjpegSetDeviceMemoryPadding`` and ``nvjpegSetPinnedMemoryPadding``
  (``--padding-mib``);
- ``vary-pool``: ``vary`` with the hardware pool preallocated (``nvjpegDecodeBatchedPreAllocate``) for ``--batch``
  images of the set's largest size, where the decoder asks for one 1x1 image;

Each run also reports each instance's first call (``first_calls_ms``, host time): what an instance taken after a
``convert`` worker's warm-up costs its hardware thread (``decoder: hw_first_calls``);
(Modes that counted nvJPEG's allocations through ``nvjpegCreateEx``'s allocators ran once, at 4c38bed: with nvJPEG
13.3 the hardware backend made no call to them, from the handle's creation on, so they could not tell its
allocations and were dropped; py-spy saw ``cuMemFree_v2`` inside its calls.)

Images: the set's baseline 4:2:0 JPEGs (``--subsampling``: or its 4:2:2 or 4:4:4 ones; ``convert``'s hardware calls
take every kind, the bench's leave the slowest to the CUDA decoder) without EXIF orientation, read once into
page-locked memory, as ``convert``'s feed holds a batch's bytes; decoded as interleaved RGB into one device buffer.
Reported per mode: images a second over the timed calls, the host time in nvJPEG's calls per image, and apart
from it the time waiting for the instance's previous call to end on the GPU.

``--beside`` runs the modes again with other work beside the calls, one kind at a time, as ``convert`` has it:

- ``copies``: a thread copying 64 MiB to the device and back on a stream of its own, without a pause (page-locked
  memory: the copy engines busy);
- ``kernels``: a thread keeping every SM busy (a spinning kernel of 4,096 blocks, 1 ms, over and over);
  ``kernels-half``: half the SMs busy so (a block of 1,024 threads on each), the others free;
  ``kernels-short``: every SM busy in kernels of 20 us (4,096 blocks) launched back to back, 50 at a time;
- ``cpu``: 15 processes spinning in Python (every other core busy);
- ``bursts``: a thread keeping every SM busy 0.1 ms in each millisecond (a spinning kernel of 4,096 blocks), as
  the GPU JPEG encoder's kernels fill the device for moments;
- ``outputs``: a thread copying 5 MB from the device into pageable memory every 8 ms, as ``convert``'s JPEG encoder
  takes a batch's bytes, and more of them (the same options write about 3 MB a batch of 256: 49.4 MiB for 4,096
  images, ``convert --device cpu`` on the 2-core CI machine, 2026-12-04);
- ``twin``: a second process making the same calls on the same GPU (its hardware engines shared), as two GPU
  processes of a long ``convert`` do;
- ``encoder``: gpubatch's own JPEG encoder (``GpuImageEncoder``, quality 90) encoding batches of 256 smooth 224x224
  images over and over on a stream of its own; ``encoder-paced``: one such batch every 28 ms, ``convert``'s pace at
  9,000 images a second;
- ``copies-process``, ``kernels-process``, ``encoder-process``, ``encoder-paced-process``: that work in another
  process (its own CUDA context) instead of a thread of this one: whether the calls wait for the GPU's other work
  or for their own context's (a free inside nvJPEG's call, ``cuMemFree``, waits for the whole context).

    python3 benchmarks/nvjpeg_calls.py --data FOLDER [--batch 64] [--calls 300] [--repeats 3]
        [--beside copies,kernels,kernels-half,kernels-short,bursts,outputs,cpu,twin,encoder,encoder-paced,KIND-process] [--priority]
        [--depends-ms MS] [--subsampling 4:2:0|4:2:2|4:4:4] [--json OUT]

``--priority``: the calls' streams made at the device's greatest priority. ``--depends-ms MS``: before each call
its stream waits for a kernel of one block that spins MS ms on another stream, launched just before the call (as
a call's output buffer waits for its last readers): whether nvJPEG's call waits for its stream's earlier work.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes as C
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))
from hw_rate import SPIN  # noqa: E402  (a kernel that spins a given number of ns)

MODES = ["fixed", "vary", "vary-padding", "vary-pool"]
CSS_420 = 2  # nvjpegChromaSubsampling_t


def load(folder: Path, limit: int, subsampling: str = "4:2:0") -> tuple[list[bytes], int, int]:
    """Up to ``limit`` baseline JPEGs of ``subsampling`` with no EXIF turn: their bytes, and the largest height and
    width."""
    from gpubatch.engine.codecs import headers

    out, mh, mw = [], 0, 0
    for f in sorted(folder.rglob("*.jpg")):
        data = f.read_bytes()
        try:
            h = headers.probe(data)
        except ValueError:
            continue
        if h.codec != "jpeg" or h.subsampling != subsampling or h.orientation != 1 or h.mode != "RGB":
            continue
        out.append(data)
        mh, mw = max(mh, h.height), max(mw, h.width)
        if len(out) >= limit:
            break
    return out, mh, mw


def make_instance(cp, mode: str, batch: int, mh: int, mw: int, padding: int):
    """An ``HwBatchDecoder`` for ``mode``: its memory padding set, or its hardware pool preallocated."""
    from gpubatch.engine.codecs import nvjpeg_hw as nh

    dec = nh.HwBatchDecoder(cp)
    lib = dec.lib
    if mode.endswith("padding"):
        for name in ("nvjpegSetDeviceMemoryPadding", "nvjpegSetPinnedMemoryPadding"):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = [C.c_size_t, C.c_void_p], C.c_int
            nh._check(name, fn(padding, dec.handle))
    if mode.endswith("pool"):
        nh._check("nvjpegDecodeBatchedPreAllocate",
                  lib.nvjpegDecodeBatchedPreAllocate(dec.handle, dec.state, batch, mw, mh, CSS_420, nh.OUTPUT_RGBI))
    return dec


def run_mode(cp, mode: str, files: list[bytes], mh: int, mw: int, a) -> dict:
    from gpubatch.engine.codecs.nvjpeg_hw import call_args

    decs = [make_instance(cp, mode, a.batch, mh, mw, a.padding_mib << 20) for _ in range(2)]
    prio = -1024 if a.priority else 0  # (the driver clamps it to the greatest priority)
    streams = [cp.cuda.Stream(non_blocking=True, priority=prio) for _ in decs]
    # the files once in page-locked memory
    total = sum(len(f) for f in files)
    pinned = cp.cuda.alloc_pinned_memory(total)
    host = np.frombuffer(pinned, np.uint8, total)
    places, at = [], 0
    for f in files:
        host[at : at + len(f)] = np.frombuffer(f, np.uint8)
        places.append((pinned.ptr + at, len(f)))
        at += len(f)
    slot = mh * mw * 3
    outs = [cp.empty(a.batch * slot, cp.uint8) for _ in decs]  # an output buffer per instance
    side, spin = cp.cuda.Stream(non_blocking=True), cp.RawKernel(SPIN, "spin")
    rng = np.random.default_rng(0)
    sizes = [a.batch if mode.startswith("fixed") else int(rng.integers(a.batch // 2, a.batch + 1))
             for _ in range(a.warmup + a.calls)]
    k = 0
    host_ns, wait_ns, images, t0 = 0, 0, 0, 0.0
    first_ms: list[float] = []
    for c, n in enumerate(sizes):
        if c == a.warmup:
            for s in streams:
                s.synchronize()
            t0, host_ns, wait_ns, images = time.perf_counter(), 0, 0, 0
        i = c % 2
        srcs = [places[(k + j) % len(places)] for j in range(n)]
        k += n
        outputs = [(outs[i].data.ptr + j * slot, mw * 3) for j in range(n)]
        args = call_args(srcs, outputs)
        if a.depends_ms:
            spin((1,), (32,), (cp.uint64(int(a.depends_ms * 1e6)),), stream=side)
            streams[i].wait_event(side.record())
        s0 = time.perf_counter_ns()
        if decs[i].done is not None:  # the instance's previous call, waited for apart from the calls
            decs[i].done.synchronize()
        s1 = time.perf_counter_ns()
        decs[i].decode(srcs, outputs, streams[i], args=args)
        if c < len(decs):  # (each instance's first call: what a late instance's first call costs a run)
            first_ms.append(round((time.perf_counter_ns() - s1) / 1e6, 2))
        host_ns += time.perf_counter_ns() - s1
        wait_ns += s1 - s0
        images += n
    for s in streams:
        s.synchronize()
    seconds = time.perf_counter() - t0
    out = {"images_per_s": round(images / seconds, 1), "host_us_per_image": round(host_ns / 1e3 / images, 2),
           "wait_us_per_image": round(wait_ns / 1e3 / images, 2),
           "calls": a.calls, "images": images, "first_calls_ms": first_ms}
    for d in decs:
        d.close()
    del pinned
    return out


def _spinning(cp, stop: threading.Event, ns: int, launches: int, pause: float, blocks: int = 4096,
              threads: int = 128):
    """A thread's work: ``launches`` kernels of ``blocks`` blocks spinning ``ns`` each on a stream of its own,
    waited for, then ``pause`` seconds, over and over until ``stop``."""

    def run() -> None:
        fn = cp.RawKernel(SPIN, "spin")
        s = cp.cuda.Stream(non_blocking=True)
        while not stop.is_set():
            for _ in range(launches):
                fn((blocks,), (threads,), (cp.uint64(ns),), stream=s)
            s.synchronize()
            time.sleep(pause)

    return run


def _spin_cpu(stop) -> None:
    while not stop.is_set():
        sum(range(10000))


def _encoding(cp, stop: threading.Event, pace: float):
    """A loop that encodes a batch of 256 smooth 224x224 images with gpubatch's JPEG encoder until ``stop``,
    one batch every ``pace`` seconds at most (0: without a pause); prints the batches encoded."""
    from gpubatch.engine.codecs.image_encode_gpu import GpuImageEncoder

    enc = GpuImageEncoder(0)
    y = cp.linspace(0, 255, 224, dtype=cp.float32)
    img = ((y[:, None, None] + y[None, :, None] + cp.arange(3, dtype=cp.float32)[None, None, :] * 40) % 256
           ).astype(cp.uint8)
    arrays = [cp.ascontiguousarray(cp.roll(img, k, axis=1)) for k in range(256)]
    s = cp.cuda.Stream(non_blocking=True)
    enc.encode(arrays, "jpeg", 90, s)  # (its kernels and buffers made before the calls are timed)

    def run() -> None:
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            enc.encode(arrays, "jpeg", 90, s)
            n += 1
            left = pace - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)
        enc.close()
        print(f"  (the encoder: {n} batches of 256)", flush=True)
    return run


@contextlib.contextmanager
def beside(cp, kind: str, a):
    """Other work running while the block runs (see the module docstring)."""
    stop = threading.Event()
    procs: list = []
    threads: list = []
    if kind == "copies":
        def copies() -> None:
            n = 64 << 20
            host = cp.cuda.alloc_pinned_memory(n)
            dev = cp.cuda.alloc(n)
            s = cp.cuda.Stream(non_blocking=True)
            while not stop.is_set():
                cp.cuda.runtime.memcpyAsync(dev.ptr, host.ptr, n, 1, s.ptr)
                cp.cuda.runtime.memcpyAsync(host.ptr, dev.ptr, n, 2, s.ptr)
                s.synchronize()
        threads.append(threading.Thread(target=copies, daemon=True))
    elif kind == "bursts":
        threads.append(threading.Thread(target=_spinning(cp, stop, 50_000, 1, 0.0009), daemon=True))
    elif kind == "outputs":
        def outputs() -> None:
            n = 5 << 20
            dev = cp.empty(n, cp.uint8)
            out = np.empty(n, np.uint8)
            s = cp.cuda.Stream(non_blocking=True)
            while not stop.is_set():
                dev.get(stream=s, out=out)
                s.synchronize()
                time.sleep(0.008)
        threads.append(threading.Thread(target=outputs, daemon=True))
    elif kind == "kernels":
        threads.append(threading.Thread(target=_spinning(cp, stop, 1_000_000, 4, 0.0), daemon=True))
    elif kind == "kernels-half":  # (one block of 1,024 threads on each of half the SMs: the others left free)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        threads.append(threading.Thread(target=_spinning(cp, stop, 1_000_000, 4, 0.0, sms // 2, 1024), daemon=True))
    elif kind == "kernels-short":  # (every SM, in kernels of 20 us back to back: the chain's kernels' scale)
        threads.append(threading.Thread(target=_spinning(cp, stop, 20_000, 50, 0.0), daemon=True))
    elif kind in ("encoder", "encoder-paced"):
        threads.append(threading.Thread(target=_encoding(cp, stop, 0.028 if kind == "encoder-paced" else 0.0),
                                        daemon=True))
    elif kind == "cpu":
        ev = mp.get_context("fork").Event()
        procs = [mp.get_context("fork").Process(target=_spin_cpu, args=(ev,), daemon=True)
                 for _ in range(max(1, (os.cpu_count() or 2) - 1))]
        for p in procs:
            p.start()
    elif kind == "twin":
        twin = subprocess.Popen([sys.executable, __file__, "--data", str(a.data), "--images", str(a.images),
                                 "--batch", str(a.batch), "--calls", str(a.calls * 50), "--repeats", "1",
                                 "--modes", "fixed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(4.0)  # (its start: CUDA, the files, its first calls)
    elif kind.endswith("-process") and kind[:-8] in ("copies", "kernels", "encoder", "encoder-paced"):
        other = subprocess.Popen([sys.executable, __file__, "--data", str(a.data), "--busy", kind[:-8]])
        time.sleep(4.0)  # (its start: CUDA, its kernels, its first launches)
    elif kind != "none":
        raise SystemExit(f"unknown --beside {kind!r}")
    for t in threads:
        t.start()
    time.sleep(0.2)
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()
        if kind == "cpu":
            ev.set()
            for p in procs:
                p.join()
        if kind == "twin":
            twin.kill()
            twin.wait()
        if kind.endswith("-process"):
            other.kill()
            other.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a folder of JPEGs (searched recursively)")
    ap.add_argument("--images", type=int, default=2048, help="distinct files read (repeated as the calls need)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--padding-mib", type=int, default=64)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--beside", default="", help="other work beside the calls: copies,kernels,bursts,outputs,cpu,twin,encoder,encoder-paced, "
                    "copies-process,kernels-process,encoder-process,encoder-paced-process")
    ap.add_argument("--depends-ms", type=float, default=0.0, help="each call's stream first waits MS ms of other work")
    ap.add_argument("--priority", action="store_true", help="the calls' streams at the device's greatest priority")
    ap.add_argument("--subsampling", default="4:2:0", choices=("4:2:0", "4:2:2", "4:4:4"),
                    help="the JPEGs' chroma subsampling (a call is one kind, as the decoder makes them)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--busy", default="", help=argparse.SUPPRESS)  # (a -process kind's other process: that work only)
    a = ap.parse_args()
    import cupy as cp

    if a.busy:
        with beside(cp, a.busy, a):
            while True:
                time.sleep(1.0)

    files, mh, mw = load(a.data, a.images, a.subsampling)
    if not files:
        sys.exit(f"no baseline {a.subsampling} JPEG under {a.data}")
    res: dict = {"files": len(files), "subsampling": a.subsampling, "max_hw": [mh, mw], "batch": a.batch,
                 "calls": a.calls, "modes": {}}
    names = []
    for b in ["none", *[x for x in a.beside.split(",") if x]]:
        names += [(m, b) for m in a.modes.split(",")]
    runs: dict[str, list[dict]] = {(m if b == "none" else f"{m}+{b}"): [] for m, b in names}
    for _ in range(a.repeats):  # the modes in turn, each repeat
        for b in dict.fromkeys(b for _, b in names):
            with beside(cp, b, a):
                for m, b2 in names:
                    if b2 == b:
                        runs[m if b == "none" else f"{m}+{b}"].append(run_mode(cp, m, files, mh, mw, a))
    for m, rs in runs.items():
        res["modes"][m] = {"images_per_s": statistics.median(r["images_per_s"] for r in rs),
                           "host_us_per_image": statistics.median(r["host_us_per_image"] for r in rs),
                           "wait_us_per_image": statistics.median(r["wait_us_per_image"] for r in rs),
                           "runs": rs}
        print(f"{m:22s} {res['modes'][m]['images_per_s']:>10,.0f} images/s  "
              f"{res['modes'][m]['host_us_per_image']:6.1f} us/image in the calls, "
              f"{res['modes'][m]['wait_us_per_image']:6.1f} waiting for the instance; first calls (ms) "
              f"{[r['first_calls_ms'] for r in rs]}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
