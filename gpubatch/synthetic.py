"""Synthetic ImageNet-like JPEG sets for benchmarks: no downloads, deterministic by seed.

Photo-like content (smooth colour fields, soft blobs, edges and film grain), sizes around 500x400,
about 80-120 KB each, chroma subsampling mixed as in real datasets (by default about half 4:2:0, a
quarter each 4:2:2 and 4:4:4) and quality 75-97. A set of one size and one subsampling flatters every decoder.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

SUBSAMPLING_MIX = (("4:2:0", 0.5), ("4:2:2", 0.25), ("4:4:4", 0.25))


def photo_like(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """An RGB uint8 image with the statistics JPEG cares about: smooth regions, edges and grain."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = rng.uniform(40, 200, 3).astype(np.float32) + (
        xx[..., None] * rng.uniform(-0.3, 0.3, 3) * 255 / w + yy[..., None] * rng.uniform(-0.3, 0.3, 3) * 255 / h
    ).astype(np.float32)
    for _ in range(int(rng.integers(4, 9))):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.05, 0.3) * min(h, w)
        d = ((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r)
        col = rng.uniform(-90, 90, 3).astype(np.float32)
        img += (np.exp(-d)[..., None] * col) if rng.random() < 0.5 else ((d < 1)[..., None] * col * 0.6)
    freq = rng.uniform(0.05, 0.4)
    img += (12 * np.sin(xx * freq + yy * freq * rng.uniform(-1, 1)))[..., None]
    img += rng.normal(0, 13, (h, w, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _one(args: tuple[Path, int, int, tuple[tuple[str, float], ...]]) -> int:
    from PIL import Image

    root, seed, i, mix = args
    rng = np.random.default_rng([seed, i])
    h, w = int(rng.integers(333, 500)), int(rng.integers(375, 560))
    if rng.random() < 0.3:
        h, w = w, h
    u, acc = rng.random(), 0.0
    sub = mix[-1][0]
    for name, share in mix:
        acc += share
        if u < acc:
            sub = name
            break
    buf = io.BytesIO()
    Image.fromarray(photo_like(rng, h, w)).save(buf, "JPEG", quality=int(rng.integers(75, 98)), subsampling=sub)
    d = root / f"class_{i % 16:02d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"img_{i:06d}.jpg").write_bytes(buf.getvalue())
    return len(buf.getvalue())


def make_jpeg_set(root: Path, n: int, seed: int = 0, workers: int | None = None,
                  mix: tuple[tuple[str, float], ...] = SUBSAMPLING_MIX) -> Path:
    """Write ``n`` JPEGs as an ImageNet-style folder of 16 classes under ``root`` (skipped if complete);
    ``mix``: (chroma subsampling, share) pairs, whose shares add up to 1."""
    root = Path(root)
    tag = "" if mix == SUBSAMPLING_MIX else "-" + "-".join(f"{name.replace(':', '')}_{share:g}" for name, share in mix)
    marker = root / f".complete-{n}-{seed}{tag}"
    if marker.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(".complete-*"):  # files rewritten from another seed or mix: those sets are gone
        if not old.name.endswith(f"-{seed}{tag}"):
            old.unlink()
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
        list(pool.map(_one, [(root, seed, i, tuple(mix)) for i in range(n)], chunksize=16))
    marker.touch()
    return root
