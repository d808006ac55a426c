#!/usr/bin/env python3
"""The video probe's cost (``video_probe.probe``: every packet's timestamps read, the container's checks) on one or
more gpubatch trees in turn, on long clips with a sound track in MKV, MPEG-TS and AVI, and the sound probe's
(``audio_io.probe_audio``) on a 5-s MP3 (48 kHz): the fastest of ``--passes`` probes of each (the MP3's, of 20 in
a row), each tree in a process of its own, rounds in turn (the median over rounds printed).

    python3 benchmarks/probe_cost.py --tree OLD --tree NEW [--seconds 120] [--rounds 5] [--passes 3]

A tree is a checkout or a folder holding the ``gpubatch`` package (``git archive REV gpubatch | tar -x -C DIR``).
The clips (64x48 at 24 fps, H.264 or MPEG-4 with AAC or MP3 beside it) are made with PyAV in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_ONE = r"""
import json, sys, time
from pathlib import Path
from gpubatch.engine.codecs.video_probe import probe
out = {}
for path in sorted(Path(sys.argv[1]).iterdir()):
    data = path.read_bytes()
    probe(data)  # (untimed: the bytecode, the libraries' first calls)
    runs = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        info = probe(data)
        runs.append(time.perf_counter() - t)
    out[path.name] = {"ms": min(runs) * 1e3, "frames": info.frames, "missing": info.missing}
import io
import numpy as np, soundfile as sf
from gpubatch.engine.codecs.audio_io import probe_audio
buf = io.BytesIO()
sf.write(buf, (0.3 * np.sin(np.arange(240000) * 2 * np.pi * 440 / 48000)).astype(np.float32), 48000, format="MP3")
mp3 = buf.getvalue()
probe_audio(mp3)
runs = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    for _ in range(20):
        info = probe_audio(mp3)
    runs.append((time.perf_counter() - t) / 20)
out["5s.mp3"] = {"ms": min(runs) * 1e3, "frames": info.frames, "missing": 0}
print(json.dumps(out))
"""


def main() -> None:
    from tests.video.clips import make_clip_with_sound

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", required=True)
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    clips = Path(tempfile.mkdtemp(prefix="gpubatch-probe-cost-"))
    try:
        for name, fmt, vcodec, acodec in (("long.mkv", "matroska", "libx264", "aac"),
                                          ("long.ts", "mpegts", "libx264", "aac"),
                                          ("long.avi", "avi", "mpeg4", "libmp3lame")):
            make_clip_with_sound(clips / name, fmt, vcodec, acodec, frames=24 * args.seconds)
        got: dict[str, list[dict]] = {t: [] for t in args.tree}
        for r in range(args.rounds):
            for tree in args.tree if r % 2 == 0 else args.tree[::-1]:  # (turned order: drift falls on each alike)
                p = subprocess.run([sys.executable, "-c", _ONE, str(clips), str(args.passes)], capture_output=True,
                                   text=True, check=True, env={"PYTHONPATH": str(Path(tree).resolve())}, cwd="/")
                got[tree].append(json.loads(p.stdout))
        for tree, runs in got.items():
            print(f"{tree}: " + "; ".join(
                f"{name} ({runs[0][name]['frames']:,} frames, {runs[0][name]['missing']} missing) "
                f"{statistics.median(x[name]['ms'] for x in runs):.3f} ms "
                f"({min(x[name]['ms'] for x in runs):.3f}-{max(x[name]['ms'] for x in runs):.3f})"
                for name in sorted(runs[0])))
    finally:
        shutil.rmtree(clips, ignore_errors=True)


if __name__ == "__main__":
    main()
