"""`convert --frames every:1 --resize-shorter 224` of clips in one container on the GPU path and on the CPU path, in
turn, each timed as the API call's wall time (start included), two rounds. Made for Matroska, which GPU runs decode on
NVDEC through the Python loop since 2026-12-07 (before, on the CPU).

    python3 benchmarks/video_containers_convert.py [--ext mkv] [--clips 8] [--frames 240] [--size 1280x720]

Clips are `tests/video/clips.py`'s moving ramps, H.264, a keyframe every 48 frames, made under a temporary folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ext", default="mkv")
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument("--frames", type=int, default=240)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from gpubatch.api import convert
    from tests.video.clips import make_clip

    w, h = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for i in range(args.clips):
            make_clip(t / "src" / "a" / f"c{i}.{args.ext}", args.frames, w, h, "libx264", gop=48)
        for r in range(args.rounds):
            for dev in ("gpu", "cpu"):
                t0 = time.perf_counter()
                s = convert(t / "src", t / f"out-{dev}-{r}", to="webdataset", frames="every:1", resize_shorter=224,
                            device=dev)
                dt = time.perf_counter() - t0
                print(f"round {r} {dev}: {s.records_out} frames, {len(s.skipped)} skipped, {s.fallbacks} to the CPU, "
                      f"{dt:.2f} s, {s.records_out / dt:.0f} frames/s", flush=True)


if __name__ == "__main__":
    main()
