#!/usr/bin/env python3
"""Files cut exactly on a boundary of their container (between two fragments, pages, frames, chunks, clusters, packs
or tags), each converted whole and cut: what the cut run wrote (frames, or samples) against the whole run, and what
it said. A cut inside a packet is found by the packet's length; one on a boundary only by what the container says of
its end, so this is where a shorter file can pass for a whole one.

    python3 benchmarks/boundary_cuts.py [--only fmp4,m4a,ogg,opus,flac,avi,mkv,mpg,flv] [--device cpu|gpu|auto]

Run it at an older commit (a worktree) to see what that code did with the same files; ``--device gpu`` takes the GPU
path (NVDEC, the GPU audio unit).
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gpubatch.api import convert, open_dataset  # noqa: E402
from gpubatch.errors import GpubatchError  # noqa: E402


def _boxes(data: bytes, kind: bytes) -> list[int]:
    """Where each top-level MP4 box of ``kind`` begins."""
    out, at = [], 0
    while at + 8 <= len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        if data[at + 4 : at + 8] == kind:
            out.append(at)
        if size < 8:
            break
        at += size
    return out


def _starts(data: bytes, code: bytes, after: int = 0) -> list[int]:
    """Where ``code`` occurs in ``data`` from ``after`` on."""
    out, at = [], data.find(code, after)
    while at >= 0:
        out.append(at)
        at = data.find(code, at + 1)
    return out


def _flv_tags(data: bytes) -> list[int]:
    at, out = int.from_bytes(data[5:9], "big") + 4, []
    while at + 11 <= len(data):
        out.append(at)
        at += 11 + int.from_bytes(data[at + 1 : at + 4], "big") + 4
    return out


def _tone(seconds: float, rate: int) -> np.ndarray:
    n = int(seconds * rate)
    return (0.3 * np.sin(np.arange(n) * 2 * np.pi * 440 / rate)
            + 0.05 * np.random.default_rng(0).standard_normal(n)).astype(np.float32)


def _cases() -> dict:
    """name -> (file name, how to write it, where to cut it, media)."""
    import soundfile as sf

    from tests.audio.sounds import fragmented_m4a
    from tests.video.clips import make_clip

    mid = lambda xs: xs[len(xs) // 2]  # noqa: E731
    return {
        "fmp4": ("f.mp4", lambda p: make_clip(p, 48, movflags="frag_keyframe+empty_moov"),
                 lambda d: _boxes(d, b"moof")[2], "video"),
        "m4a": ("f.m4a", lambda p: fragmented_m4a(p, _tone(3.0, 16000)), lambda d: mid(_boxes(d, b"moof")), "audio"),
        "ogg": ("c.ogg", lambda p: sf.write(p, _tone(10, 16000), 16000, format="OGG"),
                lambda d: mid(_starts(d, b"OggS")), "audio"),
        "opus": ("c.opus", lambda p: sf.write(p, _tone(10, 48000), 48000, format="OGG", subtype="OPUS"),
                 lambda d: mid(_starts(d, b"OggS")), "audio"),
        "flac": ("c.flac", lambda p: sf.write(p, _tone(10, 16000), 16000, format="FLAC"),
                 lambda d: mid(_starts(d, b"\xff\xf8", 8192)), "audio"),
        "avi": ("c.avi", lambda p: make_clip(p, 48, 64, 48, codec="mpeg4"), lambda d: mid(_starts(d, b"00dc")),
                "video"),
        "mkv": ("c.mkv", lambda p: make_clip(p, 96, 64, 48), lambda d: mid(_starts(d, bytes.fromhex("1F43B675"))),
                "video"),
        "mpg": ("c.mpg", lambda p: make_clip(p, 96, 64, 48, codec="mpeg2video"),
                lambda d: mid(_starts(d, bytes.fromhex("000001BA"))), "video"),
        "flv": ("c.flv", lambda p: make_clip(p, 48, 64, 48), lambda d: mid(_flv_tags(d)), "video"),
    }


def _run(src: Path, dst: Path, media: str, device: str = "cpu") -> str:
    """What a run wrote (frames, or each recording's samples at 16 kHz) and what it said."""
    opts = {"frames": "every:1"} if media == "video" else {"sample_rate": 16000}
    try:
        s = convert(src, dst, to="webdataset", device=device, **opts)
    except GpubatchError as e:
        return f"error: {str(e)[:150]}"
    if media == "video":
        got = f"{s.records_out} frames"
    else:
        import soundfile as sf

        got = f"{sum(sf.info(io.BytesIO(r.data)).frames for r in open_dataset(dst)):,} samples"
    said = [f"skipped: {k['reason'][:110]}" for k in s.skipped[:1]] + [f"warning: {w[:110]}" for w in s.warnings[:1]]
    return f"{got}; " + ("; ".join(said) if said else "nothing said")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated cases")
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"))
    args = ap.parse_args()
    cases = _cases()
    names = args.only.split(",") if args.only else list(cases)
    t = Path(tempfile.mkdtemp(prefix="gpubatch-cuts-"))
    try:
        for name in names:
            fname, write, where, media = cases[name]
            whole = t / name / "whole" / "a" / fname
            whole.parent.mkdir(parents=True)
            write(whole)
            data = whole.read_bytes()
            at = where(data)
            cut = t / name / "cut" / "a" / fname
            cut.parent.mkdir(parents=True)
            cut.write_bytes(data[:at])
            print(f"{name}: whole ({len(data):,} bytes): {_run(whole.parent.parent, t / name / 'o1', media, args.device)}")
            print(f"{name}: cut at byte {at:,}: {_run(cut.parent.parent, t / name / 'o2', media, args.device)}")
    finally:
        shutil.rmtree(t, ignore_errors=True)


if __name__ == "__main__":
    main()
