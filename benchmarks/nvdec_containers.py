"""Which containers NVDEC's two packet loops (``gpubatch.engine.gpu.nvdec_loop``) give the right frames for: each loop's
frames against the CPU path's for clips in MP4, Matroska, WebM, MPEG-TS and FLV (H.264 and HEVC with B-frames, VP9),
at a run of every frame and at index patterns that seek forward and back. Each loop is let take every container here
(its ``CONTAINERS`` widened for the report), and the report says, per container and loop, whether its frames are
right and which frame came for which asked, and the same with the Python loop's seek aimed at a keyframe's decoding
time (``pts - reorder``). Its first run (2026-12-07) is why a GPU session sends Matroska, MPEG-TS and FLV to the
Python loop (``BothLoops``) and keeps WebM and the rest on the CPU.

    python3 benchmarks/nvdec_containers.py [--json out.json] [--only ts,flv] [--native-on mp4,mkv,webm]

(on a GPU machine; nothing is kept but the report). ``--native-on`` names the containers the native loop is tried on:
asked to seek in an MPEG-TS file, PyNvVideoCodec 2.2.4's demuxer ends the process (``terminate called after throwing
an instance of 'PyNvVCException'``: "Seek target index is out of range", 2026-12-07, H100).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

CLIPS = [("mp4", "libx264"), ("mkv", "libx264"), ("mkv", "libx265"), ("webm", "libvpx-vp9"), ("ts", "libx264"),
         ("ts", "libx265"), ("flv", "libx264"), ("mp4", "libx265")]
PATTERNS = {"every": list(range(40)), "seeks": [0, 5, 13, 14, 27, 39, 2], "back": [20, 3, 35, 0]}


def closest(frames: np.ndarray, img: np.ndarray) -> tuple[int, float]:
    """The index of the CPU frame nearest ``img``, and its mean absolute difference."""
    d = np.abs(frames - img.astype(np.int16)).mean(axis=(1, 2, 3))
    return int(np.argmin(d)), float(d.min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", default="", help="containers to try (default: all)")
    ap.add_argument("--native-on", default="mp4,mkv,webm", help="containers the native loop is tried on")
    args = ap.parse_args()
    only, native_on = set(filter(None, args.only.split(","))), set(args.native_on.split(","))
    import cupy as cp

    from gpubatch.engine.codecs.video import FrameCursor
    from gpubatch.engine.codecs.video_probe import probe
    from gpubatch.engine.gpu import nvdec_loop
    from gpubatch.engine.gpu.video import NvdecSession
    from tests.video.clips import make_clip

    for cls in (nvdec_loop.NativeLoop, nvdec_loop.PythonLoop):  # (every container let through, for this report;
        # BothLoops routes by these, the native loop first)
        cls.CONTAINERS = frozenset({"mp4", "mov", "mkv", "webm", "ts", "flv"})
    own_seek = nvdec_loop.PythonLoop.seek  # (since e6ddb77 it aims at the decoding time itself in MPEG-TS)

    def seek_by_decoding_time(self, k: int) -> None:
        if self._packets is not None and not self._ended:
            self._dec.Decode(self.nvc.PacketData())
        from gpubatch.engine.codecs.video_probe import packets

        self._container.seek(int(self.info.pts[k]) - int(self.info.reorder), stream=self._vs, backward=True,
                             any_frame=False)
        self._packets = packets(self._container, self._vs)
        self._ended = False

    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for ext, codec in CLIPS:
            if only and ext not in only:
                continue
            path = make_clip(Path(tmp) / f"{codec}.{ext}", 40, 320, 240, codec)
            data = path.read_bytes()
            info = probe(data)
            every = FrameCursor(data, info, [list(range(info.frames))]).frames(list(range(info.frames)))
            frames = every.astype(np.int16)
            for loop, variant in (("native", "as is"), ("python", "as is"), ("python", "aim at decoding time")):
                if (loop == "python" and codec not in ("libx264", "libx265")) or (loop == "native" and
                                                                                 ext not in native_on):
                    continue
                nvdec_loop.PythonLoop.seek = seek_by_decoding_time if variant != "as is" else own_seek
                row = {"container": ext, "codec": codec, "loop": loop, "variant": variant, "frames": info.frames,
                       "keyframes": list(info.keyframes), "reorder": int(info.reorder), "patterns": {}}
                s = NvdecSession(0, loop=loop)
                try:
                    if not s.open(data, info, None):
                        row["refused"] = s.why
                    else:
                        for name, idx in PATTERNS.items():
                            try:
                                got = [cp.asnumpy(a) for a in s.decode(idx)]
                            except Exception as e:  # noqa: BLE001 - reported
                                row["patterns"][name] = f"error: {type(e).__name__}: {str(e)[:160]}"
                                continue
                            came = [closest(frames, g) for g in got]
                            wrong = [(i, c, round(d, 2)) for i, (c, d) in zip(idx, came) if c != i or d > 2.0]
                            row["patterns"][name] = "right" if not wrong else f"wrong (asked, came, diff): {wrong[:8]}"
                finally:
                    s.close()
                print(json.dumps(row), flush=True)
                report.append(row)
    nvdec_loop.PythonLoop.seek = own_seek
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
