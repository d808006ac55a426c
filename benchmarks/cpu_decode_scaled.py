#!/usr/bin/env python3
"""The CPU transcode's decode and resample, done as gpubatch does them (Pillow: the whole image decoded, then
one antialiased bilinear resample of the crop's box) against libjpeg-turbo decoding straight to a smaller size
(its DCT scaling by M/8, through ``simplejpeg``; Pillow's own draft only halves), then the same resample of the
smaller image; per image, one process, and how far the scaled path's pixels are from the whole decode's (PSNR).

    pip install simplejpeg   # (not a gpubatch dependency: the trial's decoder)
    python3 benchmarks/cpu_decode_scaled.py --src DIR [--images 600] [--repeats 5] [--json out.json]

The chain is the transcode's ``--resize-shorter 256 --center-crop 224``. ``scaled`` takes, for each image, the
smallest M for which the shorter side times M/8 is still at least 256, so the resample after it still shrinks.
Also timed: each decoder alone, simplejpeg's whole decode into a Pillow image (the same pixels as Pillow's), and
each path with the transcode's JPEG encode after it; every one in turn in each round.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

SHORTER, CROP = 256, 224


def _box(w: int, h: int, f: float = 1.0) -> tuple[float, float, float, float]:
    """The crop's box in an image of ``w`` x ``h`` decoded at scale ``f``."""
    s = SHORTER / min(w, h)
    x0, y0 = (w * s - CROP) / 2 / s * f, (h * s - CROP) / 2 / s * f
    return x0, y0, x0 + CROP / s * f, y0 + CROP / s * f


def pillow(b: bytes) -> np.ndarray:
    im = Image.open(io.BytesIO(b))
    im.load()
    im = im if im.mode == "RGB" else im.convert("RGB")
    return np.asarray(im.resize((CROP, CROP), Image.BILINEAR, box=_box(*im.size)))


def simplejpeg_whole(b: bytes) -> np.ndarray:
    import simplejpeg

    arr = simplejpeg.decode_jpeg(b, "RGBX")
    h, w = arr.shape[:2]
    im = Image.frombuffer("RGBX", (w, h), arr, "raw", "RGBX", 0, 1)
    return np.asarray(im.resize((CROP, CROP), Image.BILINEAR, box=_box(w, h)))[..., :3]


def simplejpeg_scaled(b: bytes) -> np.ndarray:
    import simplejpeg

    h, w = simplejpeg.decode_jpeg_header(b)[:2]
    m = max(1, min(8, -(-8 * SHORTER // min(w, h))))
    arr = simplejpeg.decode_jpeg(b, "RGBX", min_height=-(-h * m // 8), min_width=-(-w * m // 8))
    hh, ww = arr.shape[:2]
    f = round(ww * 8 / w) / 8  # (the scale libjpeg-turbo took: M/8)
    im = Image.frombuffer("RGBX", (ww, hh), arr, "raw", "RGBX", 0, 1)
    return np.asarray(im.resize((CROP, CROP), Image.BILINEAR, box=_box(w, h, f)))[..., :3]


def _pillow_decode(b: bytes) -> None:
    im = Image.open(io.BytesIO(b))
    im.load()


def _simplejpeg_decode(b: bytes) -> None:
    import simplejpeg

    simplejpeg.decode_jpeg(b, "RGB")


def encoded(fn):
    """``fn``, its result encoded as the transcode encodes it (JPEG, quality 90)."""
    def run(b: bytes) -> bytes:
        out = io.BytesIO()
        Image.fromarray(fn(b)).save(out, "JPEG", quality=90)
        return out.getvalue()
    return run


def per_image(fns: dict, blobs: list[bytes], repeats: int) -> dict[str, float]:
    """Median ms an image of each of ``fns`` over ``repeats`` rounds (each round runs every one in turn,
    so that the machine's drift falls on each alike), after one untimed pass."""
    for fn in fns.values():
        for b in blobs[:50]:
            fn(b)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            for b in blobs:
                fn(b)
            times[name].append(time.perf_counter() - t)
    return {name: round(statistics.median(ts) / len(blobs) * 1e3, 4) for name, ts in times.items()}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="a folder of JPEGs (any depth)")
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    try:
        import simplejpeg
    except ImportError:
        sys.exit("this trial needs simplejpeg: pip install simplejpeg")
    files = sorted(p for p in a.src.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[: a.images]
    blobs = [p.read_bytes() for p in files]
    out = {"images": len(blobs), "src": str(a.src), "simplejpeg": simplejpeg.__version__,
           "pillow": Image.__version__, "ms_per_image": {}}
    fns = {"pillow decode": _pillow_decode, "simplejpeg decode": _simplejpeg_decode,
           "pillow decode + resample (gpubatch's)": pillow,
           "simplejpeg whole decode + resample": simplejpeg_whole,
           "simplejpeg scaled decode + resample": simplejpeg_scaled,
           "pillow decode + resample + encode": encoded(pillow),
           "simplejpeg whole decode + resample + encode": encoded(simplejpeg_whole),
           "simplejpeg scaled decode + resample + encode": encoded(simplejpeg_scaled)}
    out["ms_per_image"] = per_image(fns, blobs, a.repeats)
    for name, ms in out["ms_per_image"].items():
        print(f"{name:46s} {ms:.3f} ms an image")
    same = sum(np.array_equal(pillow(b), simplejpeg_whole(b)) for b in blobs)
    ps = sorted(psnr(pillow(b), simplejpeg_scaled(b)) for b in blobs)
    out["whole_decode_same_pixels"] = f"{same}/{len(blobs)}"
    out["scaled_psnr_db"] = {"median": round(statistics.median(ps), 2), "p10": round(ps[len(ps) // 10], 2),
                             "min": round(ps[0], 2)}
    print(f"simplejpeg's whole decode: the same pixels as Pillow's for {same} of {len(blobs)} images")
    print(f"scaled decode against the whole decode: PSNR median {out['scaled_psnr_db']['median']} dB, "
          f"10th percentile {out['scaled_psnr_db']['p10']}, min {out['scaled_psnr_db']['min']}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
