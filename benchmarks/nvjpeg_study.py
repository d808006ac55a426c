#!/usr/bin/env python3
"""The hardware JPEG engine through nvJPEG directly (gpubatch.engine.codecs.nvjpeg_hw): what each output
format and region decode cost in speed and device memory, and what pixels they give.

    python3 benchmarks/nvjpeg_study.py [--modes rgbi,yuv,unchanged,nv12,yuy2,region,rgbi,yuv] [--images 4096]

Each mode runs in its own process (a fresh CUDA context) over the 4:2:0 and 4:2:2 JPEGs of the mixed
set, a call per kind per batch of 256, two instances taking turns, from a worker thread (as the
engine's hardware thread), the encoded bytes page-locked (as the engine's feed). Modes: ``rgbi``
(interleaved RGB, the engine's default), ``yuv`` (the JPEG's planes, :mod:`gpubatch.engine.codecs.planes`),
``unchanged`` (nvJPEG's "as is" output, planar here), ``nv12`` (4:2:0 as Y and interleaved CbCr; 4:2:2
as RGB), ``yuy2`` (4:2:2 as YUYV; 4:2:0 as RGB), ``region`` (interleaved RGB of a random part of each
image, as RandomResizedCrop draws them: ``nvjpegDecodeBatchedEx``). Printed per mode: MiB of device
memory above the level before CUDA (after the context; after the output buffers, two calls' worth;
after the instances are made; after one pass; the peak), images/s (median of 5 passes), host ms per
call, failed calls, and the pixels of the first batch's calls (up to 24 images a kind) against Pillow:
planes made RGB with libjpeg's arithmetic, regions against Pillow's decode cropped.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _data import DEFAULT_DATA, load_blobs  # (benchmarks/_data.py, beside this script)

KINDS = ("baseline/4:2:0", "baseline/4:2:2")


def _layout(mode: str, kind: str) -> str:
    """How an image of ``kind`` is written in ``mode``: rgb, planar, nv12 or yuy2."""
    if mode in ("yuv", "unchanged"):
        return "planar"
    if mode == "nv12" and kind.endswith("4:2:0"):
        return "nv12"
    if mode == "yuy2" and kind.endswith("4:2:2"):
        return "yuy2"
    return "rgb"


def _regions(info: list[tuple[str | None, int, int]], seed: int = 0) -> list[tuple[int, int, int, int]]:
    """(y0, x0, y1, x1) per image: a part of 8-100% of its area, aspect 3/4-4/3, placed at random."""
    rng = np.random.default_rng(seed)
    out = []
    for _, w, h in info:
        area = rng.uniform(0.08, 1.0) * w * h
        r = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = min(w, max(1, round(np.sqrt(area * r)))), min(h, max(1, round(np.sqrt(area / r))))
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        out.append((y0, x0, y0 + ch, x0 + cw))
    return out


def one(mode: str, n_images: int) -> dict:
    from gpubatch.bench.measure import GpuSampler

    sampler = GpuSampler(0)
    mib = lambda: round((sampler.used() - sampler.base) / 2**20)  # noqa: E731
    import cupy as cp

    from gpubatch.engine.codecs import nvjpeg_hw
    from gpubatch.engine.codecs import planes as P
    from gpubatch.engine.codecs.headers import jpeg_kind
    from gpubatch.engine.gpu_engine import STACK_BYTES

    cp.cuda.Device(0).use()
    cp.zeros(1)
    cp.cuda.runtime.deviceSetLimit(0, STACK_BYTES or 1024)  # the engine's stack per GPU thread
    out: dict = {"mode": mode, "context": mib()}
    _, blobs, _ = load_blobs(DEFAULT_DATA, n_images)
    info = [jpeg_kind(b) for b in blobs]
    pinned = cp.cuda.alloc_pinned_memory(sum(len(b) for b in blobs))
    flat = np.frombuffer(pinned, np.uint8, sum(len(b) for b in blobs))
    src, pos = [], 0
    for b in blobs:
        flat[pos : pos + len(b)] = np.frombuffer(b, np.uint8)
        src.append((flat.ctypes.data + pos, len(b)))
        pos += len(b)
    regions = _regions(info) if mode == "region" else None
    fmts = {"rgb": nvjpeg_hw.OUTPUT_RGBI, "planar": nvjpeg_hw.OUTPUT_YUV, "nv12": 8, "yuy2": 9}

    def shape(i: int) -> tuple[int, int]:  # (width, height) of what is decoded
        _, w, h = info[i]
        return (regions[i][3] - regions[i][1], regions[i][2] - regions[i][0]) if regions else (w, h)

    def size(i: int) -> int:
        w, h = shape(i)
        return w * h * 3 if _layout(mode, info[i][0]) == "rgb" else P.plane_bytes(w, h, *P.SUBSAMPLING[info[i][0][9:]])

    def places(base: int, idx: list[int], gap: int = 0) -> list[tuple[int, ...]]:
        res = []
        for i in idx:
            w, h = shape(i)
            hs, vs = P.SUBSAMPLING[info[i][0][9:]]
            cw, _ = P.chroma_shape(w, h, hs, vs)
            res.append({"rgb": (base, w * 3), "planar": P.plane_places(base, w, h, hs, vs),
                        "nv12": (base, w, base + w * h, 2 * cw), "yuy2": (base, 4 * cw)}[_layout(mode, info[i][0])])
            base += size(i) + gap
        return res

    batches = []
    for b0 in range(0, len(blobs), 256):
        groups: dict[str, list[int]] = {}
        for i in range(b0, min(b0 + 256, len(blobs))):
            if info[i][0] in KINDS:
                groups.setdefault(info[i][0], []).append(i)
        batches.append([groups[k] for k in sorted(groups)])
    slab = max(sum(size(i) for i in idx) for calls in batches for idx in calls)
    slabs = [cp.cuda.runtime.malloc(slab) for _ in range(2)]
    out["buffers"] = mib()
    stream = cp.cuda.Stream(non_blocking=True)
    decs = [nvjpeg_hw.HwBatchDecoder(cp) for _ in range(2)]
    out["built"] = mib()
    spent = [0.0, 0]

    def call(d: int, idx: list[int], base: int, gap: int = 0) -> None:
        fmt = 0 if mode == "unchanged" else fmts[_layout(mode, info[idx[0]][0])]
        t0 = time.perf_counter()
        decs[d].decode([src[i] for i in idx], places(base, idx, gap), stream, fmt,
                       [regions[i] for i in idx] if regions else None)
        spent[0] += time.perf_counter() - t0
        spent[1] += 1

    def one_pass() -> None:
        turn = 0
        for calls in batches:
            for idx in calls:
                call(turn % 2, idx, slabs[turn % 2])
                turn += 1
        stream.synchronize()

    worker = ThreadPoolExecutor(1)
    try:
        worker.submit(one_pass).result()
    except nvjpeg_hw.NvjpegError as e:
        out["error"] = str(e)
        return out
    out["after_pass"] = mib()
    n = sum(len(idx) for calls in batches for idx in calls)
    rates = []
    spent[:] = [0.0, 0]
    for _ in range(5):
        t0 = time.perf_counter()
        worker.submit(one_pass).result()
        rates.append(n / (time.perf_counter() - t0))
    out.update(images_s=round(statistics.median(rates)), passes=[round(r) for r in rates],
               host_ms_per_call=round(spent[0] / spent[1] * 1e3, 2), peak=round((sampler.peak - sampler.base) / 2**20))
    out["pixels"] = _pixels(cp, mode, batches[0], blobs, info, regions, shape, call, stream, P)
    return out


def _pixels(cp, mode, calls, blobs, info, regions, shape, call, stream, P) -> dict:
    """Max / mean |difference| from Pillow's decode over the first batch's calls (up to 24 images each),
    and bytes written outside the images (4 KiB gaps between them)."""
    from PIL import Image

    res = {}
    gap = 4096
    for idx in calls:
        idx = idx[:24]
        kind = info[idx[0]][0]
        lay = _layout(mode, kind)
        hs, vs = P.SUBSAMPLING[kind[9:]]
        sizes = []
        for i in idx:
            w, h = shape(i)
            sizes.append((w, h, w * h * 3 if lay == "rgb" else P.plane_bytes(w, h, hs, vs)))
        buf = cp.full(sum(s + gap for _, _, s in sizes), 0xAB, cp.uint8)
        call(0, idx, buf.data.ptr, gap)
        stream.synchronize()
        host = buf.get()
        worst, means, dirty, pos = 0, [], 0, 0
        for i, (w, h, nb) in zip(idx, sizes):
            part = host[pos : pos + nb]
            dirty += int((host[pos + nb : pos + nb + gap] != 0xAB).sum())
            pos += nb + gap
            if lay == "rgb":
                got = part.reshape(h, w, 3)
            elif lay == "planar":
                got = P.planes_to_rgb(*P.plane_views(part, w, h, hs, vs), hs, vs)
            else:
                continue  # (nv12 / yuy2: not read back)
            ref = np.asarray(Image.open(io.BytesIO(blobs[i])).convert("RGB"))
            if regions:
                y0, x0, y1, x1 = regions[i]
                ref = ref[y0:y1, x0:x1]
            d = np.abs(got.astype(int) - ref.astype(int))
            worst, means = max(worst, int(d.max())), means + [float(d.mean())]
        res[kind] = {"max": worst, "mean": round(float(np.mean(means)), 4) if means else None, "gap bytes written": dirty}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="rgbi,yuv,unchanged,nv12,yuy2,region,rgbi,yuv,region")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.images)), flush=True)
        return
    for mode in args.modes.split(","):
        r = subprocess.run([sys.executable, __file__, "--one", mode, "--images", str(args.images)],
                           capture_output=True, text=True)
        line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        print(line[0][7:] if line else f"{mode}: failed\n{r.stdout[-2000:]}{r.stderr[-3000:]}", flush=True)


if __name__ == "__main__":
    main()
