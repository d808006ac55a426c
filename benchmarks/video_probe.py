"""How long a video's probe (``gpubatch.engine.codecs.video_probe.probe``: the container's header, one demux pass, the
rotation) takes, with the rotation of an MP4/MOV read from its track's matrix (the default) against a first frame
decoded for it (the way before 2026-12-06, and still the way for other containers), in turn over the same files.
Every video record is probed once, on the CPU, by either decode path (``convert``, ``info``, the pipelines); on the GPU
path a session's first video waits for it.

    python3 benchmarks/video_probe.py [--src DIR | --videos 8] [--rounds 7] [--json out.json]

Without ``--src`` it makes ``--videos`` 8-s clips (``gpubatch.synthetic.make_video_set``: 1080p and 720p, H.264 and
HEVC) under ``--data-root``. Prints the median milliseconds a pass over the files takes each way (the first round
untimed) and checks that both ways give the same rotation for every file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=None, help="a folder of videos (default: made under --data-root)")
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--data-root", type=Path, default=ROOT / ".bench-data")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    from gpubatch.engine.codecs import video_probe as vp

    src = a.src
    if src is None:
        from gpubatch.synthetic import make_video_set

        src = a.data_root / f"video-{a.videos}"
        make_video_set(src, a.videos, seconds=(8.0, 8.0))
    blobs = [p.read_bytes() for p in sorted(src.rglob("*")) if p.suffix.lower() in (".mp4", ".mov", ".mkv", ".webm")]
    if not blobs:
        raise SystemExit(f"{src}: no video files")
    boxes = vp._track_rotation
    ways = {"track matrix": boxes, "first frame decoded": lambda data: None}
    times: dict[str, list[float]] = {k: [] for k in ways}
    seen: dict[str, list[int]] = {}
    try:
        for r in range(a.rounds + 1):
            for name, way in ways.items():
                vp._track_rotation = way
                t = time.perf_counter()
                got = [vp.probe(d).rotation for d in blobs]
                if r:
                    times[name].append((time.perf_counter() - t) * 1000)
                seen[name] = got
    finally:
        vp._track_rotation = boxes
    same = len(set(map(tuple, seen.values()))) == 1
    out = {"files": len(blobs), "bytes": sum(map(len, blobs)), "rounds": a.rounds, "same_rotations": same,
           "ms_per_pass": {k: round(statistics.median(v), 1) for k, v in times.items()},
           "runs_ms": {k: [round(x, 1) for x in v] for k, v in times.items()},
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    m = out["ms_per_pass"]
    out["speedup"] = round(m["first frame decoded"] / m["track matrix"], 2)
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    if not same:
        raise SystemExit("the two ways gave different rotations")


if __name__ == "__main__":
    main()
