#!/usr/bin/env python3
"""Generate gpubatch's committed sample data, deterministically and without downloads.

    python sample_data/make_sample_data.py [OUT_DIR]     # default: the folder of this script

Makes:
  imagenet/<class>/*.jpg  4 classes x 15 photo-like JPEGs of varied sizes, chroma subsampling and
                          quality, including one grayscale, one CMYK, one EXIF-rotated JPEG, one
                          RGBA PNG and one palette PNG.
  coco/                   images/ + annotations/instances.json: 12 images with boxed shapes
                          (boxes and polygon segmentations exact by construction).
  video/                  short CFR clips: two H.264 and one HEVC MP4 (+ DALI file_list.txt).
  audio/                  one-second clips as WAV, FLAC and OGG/Vorbis (+ NeMo manifest.json).
"""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ["bird", "car", "flower", "mountain"]
PER_CLASS = 15
SUBSAMPLING = ["4:2:0", "4:2:2", "4:4:4"]


def photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A photo-like RGB image: smooth colour field, a few soft blobs, fine grain."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(40, 200, 3).astype(np.float32)
    grad = rng.uniform(-0.25, 0.25, (2, 3)).astype(np.float32)
    img = base + xx[..., None] * grad[0] * 255 / w + yy[..., None] * grad[1] * 255 / h
    for _ in range(rng.integers(3, 7)):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = rng.uniform(0.08, 0.35) * min(h, w)
        col = rng.uniform(-90, 90, 3).astype(np.float32)
        img += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))[..., None] * col
    img += rng.normal(0, 6, (h, w, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg(im: Image.Image, quality: int, subsampling: str | None = None, **kw) -> bytes:
    buf = io.BytesIO()
    opts = {"quality": quality, **kw}
    if subsampling and im.mode == "RGB":
        opts["subsampling"] = subsampling
    im.save(buf, "JPEG", **opts)
    return buf.getvalue()


def make_imagenet(out: Path, rng: np.random.Generator) -> None:
    for ci, cls in enumerate(CLASSES):
        d = out / "imagenet" / cls
        d.mkdir(parents=True, exist_ok=True)
        for i in range(PER_CLASS):
            h, w = int(rng.integers(120, 360)), int(rng.integers(140, 400))
            arr = photo(rng, h, w)
            im = Image.fromarray(arr)
            q = int(rng.integers(75, 98))
            sub = SUBSAMPLING[int(rng.integers(0, 3))]
            name = f"{cls}_{i:03d}"
            special = (ci, i)
            if special == (0, 0):  # grayscale JPEG
                (d / f"{name}.jpg").write_bytes(jpeg(im.convert("L"), q))
            elif special == (1, 0):  # CMYK JPEG (Adobe)
                (d / f"{name}.jpg").write_bytes(jpeg(im.convert("CMYK"), q))
            elif special == (2, 0):  # EXIF orientation 6 (stored rotated, shown upright)
                exif = Image.Exif()
                exif[0x0112] = 6
                (d / f"{name}.jpg").write_bytes(jpeg(im.transpose(Image.Transpose.ROTATE_90), q, sub, exif=exif))
            elif special == (3, 0):  # RGBA PNG with a transparent hole
                alpha = np.full((h, w), 255, np.uint8)
                alpha[h // 4 : h // 2, w // 4 : w // 2] = 0
                rgba = Image.fromarray(np.dstack([arr, alpha]), "RGBA")
                rgba.save(d / f"{name}.png", optimize=False)
            elif special == (3, 1):  # palette PNG
                im.quantize(64, dither=Image.Dither.NONE).save(d / f"{name}.png")
            else:
                (d / f"{name}.jpg").write_bytes(jpeg(im, q, sub))


SHAPES = [(1, "square", "shape"), (2, "disc", "shape"), (3, "triangle", "shape")]


def make_coco(out: Path, rng: np.random.Generator) -> None:
    d = out / "coco"
    (d / "images").mkdir(parents=True, exist_ok=True)
    (d / "annotations").mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i in range(12):
        h, w = int(rng.integers(200, 320)), int(rng.integers(240, 400))
        im = Image.fromarray(photo(rng, h, w))
        draw = ImageDraw.Draw(im)
        for _ in range(int(rng.integers(1, 5))):
            cat = int(rng.integers(1, 4))
            bw, bh = int(rng.integers(24, w // 2)), int(rng.integers(24, h // 2))
            x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            col = tuple(int(c) for c in rng.integers(0, 256, 3))
            if cat == 1:
                poly = [x0, y0, x0 + bw, y0, x0 + bw, y0 + bh, x0, y0 + bh]
                draw.rectangle([x0, y0, x0 + bw - 1, y0 + bh - 1], fill=col)
            elif cat == 2:
                cx, cy = x0 + bw / 2, y0 + bh / 2
                poly = [v for t in range(16) for v in (round(cx + bw / 2 * math.cos(t * math.pi / 8), 2),
                                                       round(cy + bh / 2 * math.sin(t * math.pi / 8), 2))]
                draw.ellipse([x0, y0, x0 + bw - 1, y0 + bh - 1], fill=col)
            else:
                poly = [x0 + bw / 2, y0, x0 + bw, y0 + bh, x0, y0 + bh]
                draw.polygon([(poly[0], poly[1]), (poly[2], poly[3]), (poly[4], poly[5])], fill=col)
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cat,
                         "bbox": [x0, y0, bw, bh], "area": float(bw * bh), "iscrowd": 0,
                         "segmentation": [[float(v) for v in poly]]})
        name = f"{i + 1:012d}.jpg"
        (d / "images" / name).write_bytes(jpeg(im, 90, "4:2:0"))
        images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
    doc = {"info": {"description": "gpubatch sample COCO set (synthetic shapes)", "version": "1.0"},
           "licenses": [], "images": images, "annotations": anns,
           "categories": [{"id": c, "name": n, "supercategory": s} for c, n, s in SHAPES]}
    (d / "annotations" / "instances.json").write_text(json.dumps(doc, indent=1) + "\n")


def make_video(out: Path, rng: np.random.Generator) -> None:
    import av

    d = out / "video"
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (codec, label) in enumerate([("libx264", 0), ("libx264", 1), ("libx265", 0)]):
        name = f"clip_{i}_{'h264' if codec == 'libx264' else 'hevc'}.mp4"
        with av.open(str(d / name), "w") as c:
            s = c.add_stream(codec, rate=24)
            s.width, s.height, s.pix_fmt = 160, 96, "yuv420p"
            s.codec_context.gop_size = 12
            s.codec_context.thread_count = 1
            s.options = {"threads": "1"} if codec == "libx264" else {"x265-params": "pools=1:frame-threads=1:log-level=none"}
            base = photo(rng, 96, 160)
            for t in range(24):
                frame = np.roll(base, shift=4 * t, axis=1)
                for p in s.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        lines.append(f"{name} {label} 0 1\n")
    (d / "file_list.txt").write_text("".join(lines))


def make_audio(out: Path, rng: np.random.Generator) -> None:
    import soundfile as sf

    d = out / "audio"
    d.mkdir(parents=True, exist_ok=True)
    sr = 16000
    t = np.arange(sr) / sr
    manifest = []
    for i, (ext, fmt, sub, text) in enumerate([("wav", "WAV", "PCM_16", "a rising tone"),
                                               ("flac", "FLAC", "PCM_16", "a falling tone"),
                                               ("ogg", "OGG", "VORBIS", "two tones")]):
        f0, f1 = [(220, 880), (880, 220), (330, 330)][i]
        phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / 2)
        x = 0.4 * np.sin(phase) + 0.01 * rng.normal(size=sr)
        if i == 2:
            x += 0.2 * np.sin(2 * np.pi * 550 * t)
        name = f"clip_{i}.{ext}"
        sf.write(d / name, x.astype(np.float32), sr, format=fmt, subtype=sub)
        manifest.append(json.dumps({"audio_filepath": name, "duration": 1.0, "text": text}))
    (d / "manifest.json").write_text("\n".join(manifest) + "\n")


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    rng = np.random.default_rng(20261121)
    make_imagenet(out, rng)
    make_coco(out, rng)
    make_video(out, rng)
    make_audio(out, rng)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.suffix != ".py")
    print(f"sample data in {out}: {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
