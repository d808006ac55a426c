"""The benchmarks' data: the synthetic mixed JPEG sets (in memory for the profiling scripts, as folders for
bench_convert.py), sets of hard links made in seconds; and their results printed as JSON (:func:`emit`)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DEFAULT_DATA = ROOT / ".bench-data" / "mixed"


def parse_mix(text: str) -> tuple[tuple[str, float], ...] | None:
    """``"4:2:0=0.5,4:4:4=0.5"`` as make_jpeg_set's ``mix``; "" as None (the default mix)."""
    return tuple((k, float(v)) for k, v in (p.split("=") for p in text.split(","))) if text else None


def jpeg_set(data: str | Path, n: int, mix: tuple[tuple[str, float], ...] | None = None) -> list[Path]:
    """Make (if needed) the set of ``n`` JPEGs at ``data`` (``mix``: its chroma subsamplings, as
    make_jpeg_set takes them) and list its files, in the bench's order."""
    from gpubatch.bench.contenders import data_files
    from gpubatch.synthetic import SUBSAMPLING_MIX, make_jpeg_set

    make_jpeg_set(Path(data), n, mix=mix or SUBSAMPLING_MIX)
    return data_files(str(data), n)


def load_blobs(data: str | Path, n: int, batch_size: int = 256,
               mix: tuple[tuple[str, float], ...] | None = None) -> tuple[list[Path], list[bytes], list[list[bytes]]]:
    """:func:`jpeg_set`, read: (files, blobs, batches of blobs)."""
    files = jpeg_set(data, n, mix)
    blobs = list(ThreadPoolExecutor(16).map(Path.read_bytes, files))
    return files, blobs, [blobs[i : i + batch_size] for i in range(0, len(blobs), batch_size)]


def run_beside_busy(ap, run) -> None:
    """Parse ``ap`` (with a ``--busy N`` option added) and call ``run(args)`` with N busy processes
    (nice 19) beside it, as ``gpubatch bench --busy`` runs them."""
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N busy processes (nice 19) beside the run, as gpubatch bench --busy")
    args = ap.parse_args()
    from gpubatch.bench.measure import BusyLoad

    with BusyLoad(args.busy):
        run(args)


def image_set(root: Path, n: int) -> Path:
    from gpubatch.synthetic import SUBSAMPLING_MIX, make_jpeg_set

    d = root / f"jpeg-{n}"
    make_jpeg_set(d, n, mix=SUBSAMPLING_MIX)
    return d


def linked_set(src: Path, times: int) -> Path:
    """``src``'s files hard-linked ``times`` over (new names, the same bytes): a big set made in seconds."""
    dst = src.with_name(f"{src.name}-x{times}")
    if (dst / ".complete").exists():
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    files = sorted(p for p in src.rglob("*.jpg"))
    for k in range(times):
        for f in files:
            rel = f.relative_to(src)
            out = dst / rel.parent / f"{k}_{rel.name}"
            out.parent.mkdir(parents=True, exist_ok=True)
            os.link(f, out)
    (dst / ".complete").touch()
    return dst


def tiny_set(root: Path, n: int) -> Path:
    """``n`` copies of one small JPEG (hard links) in 100 class folders: many records, little disk."""
    d = root / f"tiny-{n}"
    if (d / ".complete").exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), np.uint8)).save(buf, "JPEG", quality=80)
    for c in range(100):  # (a file a folder: a file system caps the links to one file, ext4 at 65,000)
        (d / f"c{c:02d}").mkdir(parents=True)
        (d / f"c{c:02d}" / "one.jpg").write_bytes(buf.getvalue())
    for i in range(n):
        folder = d / f"c{i % 100:02d}"
        os.link(folder / "one.jpg", folder / f"{i:07d}.jpg")
    for c in range(100):
        (d / f"c{c:02d}" / "one.jpg").unlink()
    (d / ".complete").touch()
    return d


def emit(result: dict, path: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``path`` where one is given."""
    text = json.dumps(result, indent=1)
    if path:
        path.write_text(text)
    print(text)
