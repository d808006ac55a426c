#!/usr/bin/env python3
"""The hardware JPEG engine's rate alone, under the two ways gpubatch calls its decoder: ``convert``'s (each
batch's part in whole calls into fresh buffers, ``decode(..., order=False, wait=False)``) and the pipelines'
(calls into reused ring slots, ``decode(..., chunk=256)``, read through ``result.chunks``). Nothing reads the
images: the consumer only orders its stream after the decode, as the chain would before its kernels, and
drops the batch. Two batches are decoded ahead of it (``gpu.engine.decode_ahead``), as in ``convert``. With
``--busy-ms MS`` each pattern runs again with the consumer's stream kept busy MS milliseconds a batch (one
spinning thread) before the batch is dropped, as ``convert``'s chain and JPEG encoder keep it before its batch's
memory is freed: fresh buffers taken on the decoder's stream may then wait for that work (the driver's pool
reuses memory freed on another stream after it), where ring slots wait only for their own readers.

    python3 benchmarks/hw_rate.py --data FOLDER [--images 16384] [--repeats 2] [--busy-ms 3] [--busy-blocks B]
        [--pinned] [--gil-threads N] [--json OUT]

On 2026-12-03 (H200) one hardware thread got 12,300-14,800 images a second out of its nvJPEG calls under
``convert`` and about 21,500 in ``bench``'s hardware route on the same files (benchmarks/RESULTS.md, "12:41 to
13:12"). This script told the causes apart ("15:23 to 15:38"): neither call pattern, nor a busy consumer stream,
nor the driver's pool keeping more (``GPUBATCH_POOL_KEEP_MIB=4096``), nor processes loading the host moved the
calls out of 16,900-25,000; two Python threads in the process (``--gil-threads 2``) took them to 5,400-8,300.
Since the thread's event calls keep the GIL (5fa8b0b), 8,700-9,300 against 5,500-6,700 ("17:59 to 19:00"); there
the files in page-locked memory gave 21,600 against 23,700 as Python bytes (``--pinned`` then locked every
repeat, 1.4 GB; since, each file once, as ``convert``'s feed ring holds a batch's bytes once: 21,364 against
20,147 on one machine, two calls apart, "19:49 to 20:21"), and every SM kept busy 2 ms a batch (``--busy-ms 2 --busy-blocks 2048``) 17,000-17,400 against
16,900-19,200 for the same process's runs without it (no effect told apart).
Files are read once into memory and repeated to ``--images``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))

SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a folder of JPEGs (searched recursively)")
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--busy-ms", type=float, default=3.0, help="the consumer's GPU work a batch in the busy runs (0: none)")
    ap.add_argument("--gil-threads", type=int, default=0,
                    help="threads of this process running Python bytecode all along, as convert's loop, writer and "
                         "feed threads do beside the hardware thread (whether its calls wait for the interpreter's lock)")
    ap.add_argument("--busy-blocks", type=int, default=1,
                    help="blocks of the busy runs' spinning kernel (1: one thread; the SMs' count and more: a full GPU,"
                         " as the chain's and the encoder's kernels fill it)")
    ap.add_argument("--pinned", action="store_true",
                    help="the files' bytes in page-locked memory, as convert's feed ring is (else Python bytes)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.gpu.engine import GpuEngine, decode_ahead
    from gpubatch.engine.settings import Settings

    files = sorted(a.data.rglob("*.jpg"))
    if not files:
        sys.exit(f"no .jpg files under {a.data}")
    blobs = [f.read_bytes() for f in files]
    blobs = (blobs * (a.images // len(blobs) + 1))[: a.images]
    batches = [blobs[i : i + 256] for i in range(0, len(blobs), 256)]
    settings = Settings.from_env(decode_route="hardware")
    engine = GpuEngine(Device(DeviceKind.GPU, 0, reason="hw_rate"), 16, None, deterministic=True,
                       decode_route="hardware", settings=settings)
    engine.warm_up(256)
    dec, stream = engine.decoder, engine.stream
    cp = engine.cp
    if a.pinned:  # views of one page-locked buffer, as the feed's ring hands them over (each file once)
        import cupyx

        files_bytes = blobs[: len(files)]
        ends = np.cumsum([len(b) for b in files_bytes])
        ring = cupyx.empty_pinned(int(ends[-1]), np.uint8)
        ring[:] = np.frombuffer(b"".join(files_bytes), np.uint8)
        view = memoryview(ring)
        views = [view[e - len(b) : e] for b, e in zip(files_bytes, ends)]
        blobs = (views * (a.images // len(views) + 1))[: a.images]
        batches = [blobs[i : i + 256] for i in range(0, len(blobs), 256)]
    # the consumer's work in the busy runs: threads spinning on the GPU's nanosecond timer (--busy-blocks)
    spin = cp.RawKernel(SPIN, "spin")
    busy_ns = np.uint64(int(a.busy_ms * 1e6))

    stop = threading.Event()

    def python_work() -> None:  # pure bytecode: holds the interpreter's lock but for the switch interval
        n = 0
        while not stop.is_set():
            for i in range(1000):
                n += i
    hogs = [threading.Thread(target=python_work, daemon=True) for _ in range(a.gil_threads)]
    for h in hogs:
        h.start()

    def whole(batch: list[bytes]):
        return dec.decode(batch, stream, 0, order=False, wait=False)

    def chunked(batch: list[bytes]):
        return dec.decode(batch, stream, 0, order=False, wait=False, chunk=256)

    def run(name: str) -> dict:
        pattern, busy = name.split("+")[0], name.endswith("+busy")
        before = dict(dec.timings)
        tm = {"read_wait": 0.0, "decode": 0.0, "decode_wait": 0.0}
        t = time.perf_counter()
        for _, res in decode_ahead(whole if pattern == "whole" else chunked, batches, 2, tm, 0):
            if pattern == "whole":
                res.order(stream)
                if busy:
                    spin((a.busy_blocks,), (1 if a.busy_blocks == 1 else 256,), (busy_ns,), stream=stream)
            else:
                for _items in res.chunks(stream):
                    pass
                if busy:
                    spin((a.busy_blocks,), (1 if a.busy_blocks == 1 else 256,), (busy_ns,), stream=stream)
            res = None
        stream.synchronize()
        wall = time.perf_counter() - t
        calls = dec.timings["hw_nvjpeg"] - before["hw_nvjpeg"]
        return {"wall_s": round(wall, 4), "images_per_s": round(len(blobs) / wall),
                "hw_nvjpeg_s": round(calls, 4), "images_per_s_of_calls": round(len(blobs) / calls) if calls else None,
                "decode_wait_s": round(tm["decode_wait"], 4)}

    out: dict = {"images": len(blobs), "distinct_files": len(files), "route": dec.route,
                 "instances": len(dec.hw_direct or dec.hw_cs), "busy_ms": a.busy_ms, "busy_blocks": a.busy_blocks,
                 "pinned": a.pinned, "gil_threads": a.gil_threads,
           "switch_interval_s": sys.getswitchinterval(), "runs": {}}
    names = ["whole", "chunked"] + (["whole+busy", "chunked+busy"] if a.busy_ms > 0 else [])
    out["runs"] = {name: [] for name in names}
    for name in names:  # one untimed pass each
        try:
            run(name)
        except Exception:  # noqa: BLE001 - say which pattern failed, run the other
            traceback.print_exc()
    for _ in range(a.repeats):
        for name in names:
            try:
                r = run(name)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                continue
            out["runs"][name].append(r)
            print(name, json.dumps(r), flush=True)
    for name, rs in out["runs"].items():
        if rs:
            out[f"{name}: median images/s of calls"] = statistics.median(r["images_per_s_of_calls"] or 0 for r in rs)
    stop.set()
    engine.close()
    from _data import emit  # (benchmarks/_data.py, beside this script; ROOT is on the path by now)

    emit(out, a.json)


if __name__ == "__main__":
    main()
