"""The benchmark data both profiling scripts use: the synthetic mixed JPEG set, read into memory."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DEFAULT_DATA = ROOT / ".bench-data" / "mixed"


def load_blobs(data: str | Path, n: int, batch_size: int = 256) -> tuple[list[Path], list[bytes], list[list[bytes]]]:
    """Make (if needed) and read ``n`` JPEGs of the set at ``data``: (files, blobs, batches of blobs)."""
    from gpubatch.synthetic import make_jpeg_set

    make_jpeg_set(Path(data), n)
    files = sorted(Path(data).rglob("*.jpg"))[:n]
    blobs = list(ThreadPoolExecutor(16).map(Path.read_bytes, files))
    return files, blobs, [blobs[i : i + batch_size] for i in range(0, len(blobs), batch_size)]
