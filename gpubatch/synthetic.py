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

from .engine.processes import detached_main

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
    with detached_main(), ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
        list(pool.map(_one, [(root, seed, i, tuple(mix)) for i in range(n)], chunksize=16))
    marker.touch()
    return root


# --- video ------------------------------------------------------------------------------------------------

#: the synthetic clip set's mix: (width, height, encoder) in turn
VIDEO_MIX = ((1920, 1080, "libx264"), (1280, 720, "libx264"), (1920, 1080, "libx265"), (1280, 720, "libx265"))


def _clip(args: tuple[Path, int, int, int, str, float, int]) -> str:
    """One synthetic clip: a photo-like background panning, with shapes moving over it (not a static frame)."""
    import av

    path, seed, w, h, encoder, seconds, fps = args
    rng = np.random.default_rng(seed)
    bg = photo_like(rng, h + 64, w + 64)
    n = int(seconds * fps)
    boxes = [(rng.uniform(0, w - 200), rng.uniform(0, h - 200), rng.uniform(-6, 6), rng.uniform(-6, 6),
              rng.integers(60, 255, 3).astype(np.uint8)) for _ in range(6)]
    tmp = path.with_name(path.name + ".part")
    with av.open(str(tmp), "w", format="mp4") as c:
        s = c.add_stream(encoder, rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        if encoder == "libx264":
            s.options = {"preset": "ultrafast", "g": str(fps), "crf": "26"}
        else:
            s.options = {"preset": "ultrafast", "x265-params": f"keyint={fps}:log-level=error", "crf": "28"}
        for i in range(n):
            oy, ox = int(32 + 30 * np.sin(i / 40)), int(32 + 30 * np.cos(i / 50))
            img = bg[oy: oy + h, ox: ox + w].copy()
            for x, y, dx, dy, col in boxes:
                x0, y0 = int((x + dx * i) % (w - 160)), int((y + dy * i) % (h - 160))
                img[y0: y0 + 120, x0: x0 + 160] = col
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    os.replace(tmp, path)
    return str(path)


def make_video_set(root: Path, count: int, seed: int = 0, seconds: tuple[float, float] = (5.0, 20.0),
                   fps: int = 30, workers: int | None = None) -> list[Path]:
    """``count`` clips (1080p and 720p, H.264 and HEVC, ``seconds`` long, moving content) under ``root``,
    made with PyAV once: clips already there are kept (a cache keyed by the arguments)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        w, h, enc = VIDEO_MIX[i % len(VIDEO_MIX)]
        secs = float(rng.uniform(*seconds))
        name = f"clip{i:04d}_{h}p_{'h264' if enc == 'libx264' else 'hevc'}.mp4"
        jobs.append((root / name, seed * 100_003 + i, w, h, enc, secs, fps))
    todo = [j for j in jobs if not j[0].exists()]
    if todo:
        with detached_main(), ProcessPoolExecutor(max_workers=workers or max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            list(pool.map(_clip, todo))
    return [j[0] for j in jobs]


def speech_like(rng: np.random.Generator, seconds: float, rate: int) -> np.ndarray:
    """Float32 mono audio that looks like speech to a feature extractor: voiced stretches (a harmonic
    series on a gliding pitch of 90-250 Hz, with formant-like weights and a syllable envelope), noise
    bursts (fricatives) and silences."""
    n = int(seconds * rate)
    out = np.zeros(n, np.float32)
    t = 0
    while t < n:
        kind = rng.choice(["voiced", "voiced", "noise", "silence"])
        length = min(int(rng.uniform(0.08, 0.45) * rate), n - t)
        if kind == "voiced":
            f0 = rng.uniform(90, 250) * np.exp(np.linspace(0, rng.uniform(-0.3, 0.3), length))
            phase = 2 * np.pi * np.cumsum(f0) / rate
            formants = rng.uniform([300, 900, 2200], [900, 2200, 3200])
            seg = np.zeros(length)
            for k in range(1, 30):
                fk = k * f0.mean()
                if fk > rate / 2 - 200:
                    break
                w = sum(np.exp(-((fk - f) / 180.0) ** 2) for f in formants) + 0.02
                seg += w * np.sin(k * phase) / k
            env = np.sin(np.linspace(0, np.pi, length)) ** 0.7
            out[t: t + length] = (0.3 * seg * env).astype(np.float32)
        elif kind == "noise":
            out[t: t + length] = (rng.normal(0, 0.05, length) * np.hanning(length)).astype(np.float32)
        t += length
    out += rng.normal(0, 0.002, n).astype(np.float32)  # a room's floor
    return np.clip(out, -1, 1)


def _audio_clip(args: tuple[Path, int, float, int, str]) -> str:
    import soundfile as sf

    path, seed, seconds, rate, fmt = args
    x = speech_like(np.random.default_rng(seed), seconds, rate)
    tmp = path.with_name(path.name + ".part")
    sf.write(str(tmp), x, rate, format=fmt.upper(), subtype="PCM_16")
    os.replace(tmp, path)
    return str(path)


def make_audio_set(root: Path, count: int, seed: int = 0, seconds: tuple[float, float] = (10.0, 30.0),
                   rate: int = 16000, fmt: str = "flac", classes: int = 0, workers: int | None = None) -> list[Path]:
    """``count`` speech-like clips (``seconds`` long, ``rate`` Hz, FLAC or WAV) under ``root``, in
    ``classes`` class folders where given; clips already there are kept (a cache keyed by the arguments)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        secs = float(rng.uniform(*seconds)) if seconds[0] != seconds[1] else float(seconds[0])
        folder = root / f"class_{i % classes:02d}" if classes else root
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"clip_{i:05d}.{fmt}"
        jobs.append((path, seed * 1_000_003 + i, secs, rate, fmt))
    todo = [j for j in jobs if not j[0].exists()]
    if todo:
        with detached_main(), ProcessPoolExecutor(max_workers=min(len(todo), workers or os.cpu_count() or 1)) as pool:
            list(pool.map(_audio_clip, todo, chunksize=8))
    return [j[0] for j in jobs]
