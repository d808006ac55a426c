#!/usr/bin/env python3
"""The CPU transcode's image work with its two colour conversions left out: libjpeg-turbo decodes to YCbCr (Pillow's
``draft("YCbCr")``), Pillow resamples the crop's box in YCbCr and its encoder takes YCbCr as it is, where gpubatch's
path converts to RGB after the decode, resamples RGB, then back to YCbCr in the encoder; beside gpubatch's path, and
that path without its NumPy round trip (``np.asarray`` then ``Image.fromarray``). Per image, one process, each path
in turn in every round, and how far the YCbCr path's output is from gpubatch's once both are decoded (PSNR).

    python3 benchmarks/cpu_ycbcr.py --src DIR [--images 600] [--repeats 5] [--json out.json]

The chain is the transcode's ``--resize-shorter 256 --center-crop 224 --quality 90``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

SHORTER, CROP, QUALITY = 256, 224, 90


def _box(w: int, h: int) -> tuple[float, float, float, float]:
    s = SHORTER / min(w, h)
    x0, y0 = (w * s - CROP) / 2 / s, (h * s - CROP) / 2 / s
    return x0, y0, x0 + CROP / s, y0 + CROP / s


def _save(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=QUALITY, subsampling="4:2:0", optimize=False)
    return buf.getvalue()


def rgb(b: bytes) -> bytes:
    """gpubatch's CPU path: RGB decode, the box resampled, NumPy in between, encoded."""
    im = Image.open(io.BytesIO(b))
    im.load()
    im = im if im.mode == "RGB" else im.convert("RGB")
    return _save(Image.fromarray(np.asarray(im.resize((CROP, CROP), Image.BILINEAR, box=_box(*im.size)))))


def rgb_direct(b: bytes) -> bytes:
    """The same, Pillow's image handed to the encoder as it is."""
    im = Image.open(io.BytesIO(b))
    im.load()
    im = im if im.mode == "RGB" else im.convert("RGB")
    return _save(im.resize((CROP, CROP), Image.BILINEAR, box=_box(*im.size)))


def ycbcr(b: bytes) -> bytes:
    """Decoded to YCbCr, resampled and encoded in it: no colour conversion."""
    im = Image.open(io.BytesIO(b))
    if im.mode == "RGB":
        im.draft("YCbCr", None)
    im.load()
    return _save(im.resize((CROP, CROP), Image.BILINEAR, box=_box(*im.size)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    blobs = [f.read_bytes() for f in sorted(a.src.rglob("*.jpg"))[: a.images]]
    paths = {"rgb (gpubatch's)": rgb, "rgb, no NumPy round trip": rgb_direct, "ycbcr": ycbcr}
    for f in paths.values():  # (warm: the libraries' first calls)
        f(blobs[0])
    ms: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(a.repeats):
        for k, f in paths.items():
            t = time.perf_counter()
            for b in blobs:
                f(b)
            ms[k].append((time.perf_counter() - t) / len(blobs) * 1e3)
    psnr = []
    for b in blobs[:200]:
        x = np.asarray(Image.open(io.BytesIO(rgb(b))).convert("RGB"), np.float64)
        y = np.asarray(Image.open(io.BytesIO(ycbcr(b))).convert("RGB"), np.float64)
        mse = float(((x - y) ** 2).mean())
        psnr.append(99.0 if mse == 0 else 10 * np.log10(255**2 / mse))
    out = {"images": len(blobs), "repeats": a.repeats,
           "ms_per_image": {k: round(statistics.median(v), 3) for k, v in ms.items()},
           "rounds": {k: [round(x, 3) for x in v] for k, v in ms.items()},
           "psnr_ycbcr_vs_rgb_db": {"median": round(statistics.median(psnr), 2), "lowest": round(min(psnr), 2)}}
    base = out["ms_per_image"]["rgb (gpubatch's)"]
    out["ratio_to_rgb"] = {k: round(base / v, 3) for k, v in out["ms_per_image"].items()}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
