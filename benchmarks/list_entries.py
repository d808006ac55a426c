#!/usr/bin/env python3
"""How long listing a webdataset gpubatch wrote takes: from its shards' DALI index files (what readers and the
training loader do where the index stands for the tar) against the walk over every tar header (what they
do otherwise), the median of --repeats fresh readers each. With ``--folder``, how long a folder of class
folders takes instead: detecting its format and listing its entries (what every command does first), and moving
the listed reader from one process to another, pickled and unpickled (what ``gpubatch._prescan`` does at the
command's start).

    python3 benchmarks/list_entries.py [--images 16384] [--shard-size 1024] [--repeats 3]
    python3 benchmarks/list_entries.py --folder --images 100000 [--classes 100]

The data: --images tiny JPEGs (8x8, one class, or --classes class folders with --folder) made once under
--data-root (and converted to webdataset): the listing's cost is per sample and per member, not per byte.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from PIL import Image

    from gpubatch.api import convert
    from gpubatch.formats.webdataset import WebDatasetReader

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16384)
    ap.add_argument("--shard-size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-root", type=Path, default=ROOT / ".bench-data")
    ap.add_argument("--folder", action="store_true", help="list a folder of class folders instead")
    ap.add_argument("--classes", type=int, default=100, help="class folders of --folder's data")
    a = ap.parse_args()
    if a.folder:
        folder(a)
        return
    src = a.data_root / f"tiny-{a.images}"
    out = a.data_root / f"tiny-{a.images}-wds-{a.shard_size}"
    if not (src / ".complete").exists():
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (9, 9, 9)).save(buf, "JPEG")
        (src / "a").mkdir(parents=True, exist_ok=True)
        for i in range(a.images):
            (src / "a" / f"{i:07d}.jpg").write_bytes(buf.getvalue())
        (src / ".complete").touch()
    if not (out / "gpubatch.json").exists():
        convert(src, out, to="webdataset", shard_size=a.shard_size, overwrite=True)
    for label in ("index", "walk"):
        times = []
        for _ in range(a.repeats):
            reader = WebDatasetReader(out)
            if label == "walk":
                reader.manifest = {}  # (no manifest: a set another tool wrote, whose index is not taken)
            t = time.perf_counter()
            n = len(reader.entries())
            times.append(time.perf_counter() - t)
            reader.close()
        print(f"{label}: {n:,} samples listed in {statistics.median(times):.3f} s (median of {a.repeats})")


def folder(a: argparse.Namespace) -> None:
    """A folder of --classes class folders of tiny JPEGs: the format detected and the entries listed, a fresh
    reader each time."""
    from PIL import Image

    from gpubatch.formats import detect, open_reader

    src = a.data_root / f"tiny-{a.images}-{a.classes}-classes"
    if not (src / ".complete").exists():
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (9, 9, 9)).save(buf, "JPEG")
        for i in range(a.images):
            d = src / f"class_{i % a.classes:04d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:08d}.jpg").write_bytes(buf.getvalue())
        (src / ".complete").touch()
    import pickle

    times: dict[str, list[float]] = {"detect": [], "entries": [], "moved": []}
    for _ in range(a.repeats):
        t = time.perf_counter()
        fmt = detect(src)
        times["detect"].append(time.perf_counter() - t)
        with open_reader(src, fmt.name) as reader:
            t = time.perf_counter()
            n = len(reader.entries())
            times["entries"].append(time.perf_counter() - t)
            t = time.perf_counter()
            pickle.loads(pickle.dumps(reader, protocol=pickle.HIGHEST_PROTOCOL))
            times["moved"].append(time.perf_counter() - t)
    print(f"{src}: {fmt.name}, detected in {statistics.median(times['detect']):.3f} s; {n:,} entries listed in "
          f"{statistics.median(times['entries']):.3f} s; the listed reader pickled and unpickled in "
          f"{statistics.median(times['moved']):.3f} s (medians of {a.repeats})")


if __name__ == "__main__":
    main()
