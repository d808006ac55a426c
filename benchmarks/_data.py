"""The benchmark data both profiling scripts use: the synthetic mixed JPEG set, read into memory."""

from __future__ import annotations

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
