"""Where the device memory of a GPU run goes, and whether ``--gpu-memory`` bounds it, read from the
driver (NVML: the device memory of each process of the run, CUDA context included).

    python3 benchmarks/gpu_memory.py parts               # one process, step by step
    python3 benchmarks/gpu_memory.py caps --images 2048  # convert under caps, every process sampled
    python3 benchmarks/gpu_memory.py caps --media video --caps default,1GiB  # the same for video frames
    python3 benchmarks/gpu_memory.py pipeline --cap 640MiB  # ImagePipeline under a cap, step by step
    python3 benchmarks/gpu_memory.py video --size 1280x720  # one NVDEC session, step by step

``parts`` builds a GPU engine a step at a time in a fresh process and prints what each step added:
the CUDA context, the kernels, the engine (decoders; the hardware decoder's preallocation at a few
sizes), the warm-up with the JPEG encoder, one batch decoded and transformed. ``caps`` runs
``gpubatch convert`` (a synthetic mixed JPEG set, resize 256, crop 224, JPEG 90, WebDataset) under each
cap in turn, samples every process of the run every 20 ms and prints the peak of their sum beside the
cap, with a digest of the written shards (outputs must not depend on the cap). ``pipeline`` runs
``ImagePipeline(gpu_memory=CAP)`` (random-resized crop 224, flip, float16 CHW, batches of 256) and after
each step (engine, plan, feed, each batch) prints the process's memory as NVML counts it, its sampled
peak so far, what CuPy's pool holds and what the driver's stream-ordered pool reserves, beside the plan.
``video`` opens one NVDEC session (as a capped video run measures it) on a synthetic H.264 clip and
prints, after each step (context, decoder, the first frame, 8 and 32 frames held, frames dropped,
session closed), the process's memory once NVML's figure has held still, and CuPy's pool.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_PARTS = r"""
import sys, time, json
sys.path.insert(0, {root!r})
from gpubatch.engine.gpu.memory import ProcessMemory
import os
mem = ProcessMemory(0, [os.getpid()])
steps = {{}}
def note(name):
    time.sleep(0.05)
    steps[name] = mem.now() >> 20
import cupy as cp
cp.cuda.Device(0).use(); cp.zeros(1)
note("context")
from gpubatch.engine.kernels import kernel
kernel("resample", "resample_u8_hwc"); kernel("resample", "resample_f16_chw")
note("kernels")
from gpubatch.engine.gpu.engine import GpuEngine
from gpubatch.engine.device import Device, DeviceKind
pre = {pre!r}
eng = GpuEngine(Device(DeviceKind.GPU, 0, reason="study"), 8, None, hw_preallocate=pre)
note("engine (decoders)")
eng.warm_up({batch}, encoder=True)
note("warm-up (decoders' first calls, JPEG encoder)")
from pathlib import Path
files = sorted(Path({data!r}).rglob("*.jpg"))[:{batch}]
blobs = [f.read_bytes() for f in files]
res = eng.decoder.decode(blobs, eng.stream)
eng.stream.synchronize()
note("one batch decoded")
del res
eng.stream.synchronize()
note("after the batch")
print(json.dumps({{"preallocate": pre, "method": mem.method, "MiB": steps}}))
"""


_PIPELINE = r"""
import sys, time, json
sys.path.insert(0, {root!r})
from pathlib import Path
import cupy as cp
from gpubatch.engine.gpu.memory import ProcessMemory
from gpubatch.pipelines.image import ImagePipeline
from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop
mem = ProcessMemory(0).start()
rows = []
def note(name, pipe=None):
    time.sleep(0.05)
    rt = cp.cuda.runtime
    pool = rt.deviceGetDefaultMemPool(0)
    cpool = cp.get_default_memory_pool()
    rows.append({{"step": name, "now": mem.now() >> 20, "peak": mem.peak >> 20,
                 "cupy_used": cpool.used_bytes() >> 20, "cupy_held": cpool.total_bytes() >> 20,
                 "driver_reserved": rt.memPoolGetAttribute(pool, 5) >> 20,
                 "driver_used": rt.memPoolGetAttribute(pool, 7) >> 20,
                 "driver_high": rt.memPoolGetAttribute(pool, 6) >> 20}})
    print(json.dumps(rows[-1]), flush=True)
files = sorted(Path({data!r}).rglob("*.jpg"))
pipe = ImagePipeline([RandomResizedCrop(224), Flip(), Normalize(layout="CHW", dtype="float16")], device="gpu",
                     gpu_memory={cap!r})
note("engine, warm-up, plan")
print(json.dumps({{"plan": pipe.memory_plan.describe(), "pool_limit": pipe.memory_plan.pool_limit >> 20,
                  "decode": pipe.memory_plan.decode >> 20, "chunk": pipe.chunk}}), flush=True)
for k, b in enumerate(pipe.iterate_files(files, batch_size=256, repeat=True)):
    b.stacked()
    pipe.stream.synchronize()
    note(f"batch {{k}}")
    if k == 5:
        break
pipe.stream.synchronize()
note("after")
pipe.close()
print(json.dumps({{"peak": mem.stop() >> 20}}))
"""


_VIDEO = r"""
import sys, json
sys.path.insert(0, {root!r})
import cupy as cp
from gpubatch.engine.gpu.memory import ProcessMemory, lower_stack
from gpubatch.engine.gpu.video import NvdecSession
from gpubatch.engine.codecs.video_probe import probe as probe_video
mem = ProcessMemory(0)
cp.cuda.Device(0).use()
lower_stack(cp, 16)
cp.zeros(1)
rows = []
def note(step):
    cp.cuda.Device(0).synchronize()
    pool = cp.get_default_memory_pool()
    rows.append({{"step": step, "MiB": mem.settled() >> 20, "cupy_used": pool.used_bytes() >> 20}})
    print(json.dumps(rows[-1]), flush=True)
note("context, stack lowered")
data = open({clip!r}, "rb").read()
info = probe_video(data)
s = NvdecSession(0)
s.open(data, info)
note("session open (decoder made)")
held = [s.decode([0])]
note("first frame")
held.append(s.decode(list(range(8))))
note("8 more frames held")
held.append(s.decode(list(range(8, 40))))
note("32 more frames held")
held = None
cp.get_default_memory_pool().free_all_blocks()
note("frames dropped, CuPy's pool emptied")
s.close()
note("session closed")
"""


def video(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.video.clips import make_clip

    w, h = (int(v) for v in a.size.split("x"))
    clip = Path(tempfile.mkdtemp()) / "clip.mp4"
    make_clip(clip, 48, w, h)
    out = subprocess.run([sys.executable, "-c", _VIDEO.format(root=str(ROOT), clip=str(clip))],
                         capture_output=True, text=True)
    print(out.stdout.strip())
    if out.returncode:
        print(out.stderr[-3000:])


def pipeline(a: argparse.Namespace) -> None:
    from _data import jpeg_set

    jpeg_set(a.data, a.images)
    code = _PIPELINE.format(root=str(ROOT), data=str(a.data), cap=a.cap)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "GPUBATCH_DECODE_ROUTE": "hardware"})
    print(out.stdout.strip())
    if out.returncode:
        print(out.stderr[-3000:])


def parts(a: argparse.Namespace) -> None:
    from _data import jpeg_set

    jpeg_set(a.data, a.batch)
    for pre in (None, (64, 640, 640), (256, 640, 640), (512, 640, 640)):
        code = _PARTS.format(root=str(ROOT), pre=pre, batch=a.batch, data=str(a.data))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-3000:])
            continue
        print(out.stdout.strip().splitlines()[-1])


def _steps(trace: list, most: int = 24) -> list:
    """The trace's level changes (MiB, at the share of the run's time), at most ``most``."""
    out, last = [], None
    end = trace[-1][0] if trace else 1.0
    for t, b, _ in trace:
        if b >> 20 != last:
            out.append(f"{t / end:.0%} {b >> 20}")
            last = b >> 20
    return out[:most]


def caps(a: argparse.Namespace) -> None:
    from _data import jpeg_set

    from gpubatch.bench.measure import shard_digest
    from gpubatch.engine.gpu.memory import ProcessMemory

    if a.media == "video":  # the GPU test's run: frames of six 1280x720 H.264 clips, every fourth, resized
        sys.path.insert(0, str(ROOT))
        from tests.video.clips import make_clip

        src = Path(tempfile.mkdtemp()) / "clips"
        for k in range(6):
            make_clip(src / "c" / f"v{k}.mp4", 40, 1280, 720)
        job = [str(src), "--frames", "every:4", "--resize-shorter", "256"]
    else:
        jpeg_set(a.data, a.images)
        job = [str(a.data), "--resize-shorter", "256", "--center-crop", "224", "--quality", "90", "--batch-size",
               str(a.batch)]
    rows = []
    for cap in a.caps.split(","):
        out = Path(tempfile.mkdtemp()) / "o"
        cmd = [sys.executable, "-m", "gpubatch", "convert", job[0], str(out), "--to", "webdataset", "--device", "gpu",
               *job[1:]]
        if cap != "default":
            cmd += ["--gpu-memory", cap]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        mem = ProcessMemory(0, [p.pid], children=True, interval=0.01, trace=True)
        mem.start()
        text, _ = p.communicate()
        peak = mem.stop()
        end = mem.trace[-1][0] if mem.trace else 1.0
        top = sorted(mem.trace, key=lambda s: -s[1])[:3]  # when the run peaked: the share of its time
        row = {"cap": cap, "rc": p.returncode, "peak_mib": peak >> 20, "method": mem.method,
               "seconds": round(time.perf_counter() - t0, 1),
               "peaks_at": [f"{t / end:.0%}: {b >> 20} MiB" for t, b, _ in top],
               "steps_mib": _steps(mem.trace, 48 if a.media == "video" else 24),
               "digest": shard_digest(out)[:16] if p.returncode == 0 else None,
               "summary": [ln for ln in text.splitlines() if "gpu memory" in ln.lower() or "error" in ln.lower()][-3:]}
        rows.append(row)
        print(json.dumps(row))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("parts")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--data", type=Path, default=ROOT / ".bench-data" / "mixed")
    p.set_defaults(run=parts)
    c = sub.add_parser("caps")
    c.add_argument("--images", type=int, default=2048)
    c.add_argument("--batch", type=int, default=512)
    c.add_argument("--caps", default="default,1GiB,768MiB,512MiB,384MiB,256MiB")
    c.add_argument("--media", choices=("image", "video"), default="image")
    c.add_argument("--data", type=Path, default=ROOT / ".bench-data" / "mixed")
    c.add_argument("--json", default=None)
    c.set_defaults(run=caps)
    q = sub.add_parser("pipeline")
    q.add_argument("--cap", default="640MiB")
    q.add_argument("--images", type=int, default=384)
    q.add_argument("--data", type=Path, default=ROOT / ".bench-data" / "mixed")
    q.set_defaults(run=pipeline)
    v = sub.add_parser("video")
    v.add_argument("--size", default="1280x720")
    v.set_defaults(run=video)
    a = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    a.run(a)


if __name__ == "__main__":
    main()
