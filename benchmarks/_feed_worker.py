"""What the per-record benchmarks of a GPU feed share (``loader_reads.py``, ``gpu_loop_host.py``): this process
made a feed's reader process over a dataset, a pass timed per record, and the report."""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def arguments(ap: Any, data_help: str, chain: str) -> Any:
    """The options both scripts take, parsed."""
    ap.add_argument("--data", type=Path, required=True, help=data_help)
    ap.add_argument("--chain", default=chain)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one pass")
    ap.add_argument("--json", type=Path)
    return ap.parse_args()


@contextlib.contextmanager
def feed_worker(data: Path, plan: Any, slots: int = 4, slot: int = 64 << 20) -> Iterator[list]:
    """This process as one of a feed's reader processes over ``data`` under ``plan`` (``feed._init``, a ring of
    ``slots`` slots): yields the dataset's entries; the ring goes at the end."""
    from multiprocessing.shared_memory import SharedMemory

    from gpubatch.engine.gpu import feed as F
    from gpubatch.formats import open_reader

    shm = SharedMemory(create=True, size=slots * slot)
    try:
        F._init(shm.name, plan, slot, functools.partial(open_reader, data, None))
        yield F._W["reader"].entries()
    finally:
        F._W.clear()
        shm.close()
        shm.unlink()


def per_record(one_pass: Callable[[], float | None], records: int, repeats: int, profile: bool) -> list[float]:
    """µs a record of ``repeats`` passes after an untimed one (``one_pass`` returns the seconds it counts, or
    None to be timed whole); with ``profile``, cProfile's top functions of one more."""
    def timed() -> float:
        t = time.perf_counter()
        own = one_pass()
        return own if own is not None else time.perf_counter() - t

    timed()  # (the page cache and the imports warm)
    runs = [timed() / records * 1e6 for _ in range(repeats)]
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(one_pass)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return runs


def report(a: Any, records: int, runs: list[float], digits: int = 1) -> None:
    """Print the median and the runs (and write them to ``a.json``)."""
    import gpubatch

    out = {"gpubatch": str(Path(gpubatch.__file__).parent), "data": str(a.data), "records": records,
           "chain": a.chain, "us_per_record_runs": [round(r, digits) for r in runs],
           "us_per_record": round(statistics.median(runs), digits)}
    print(f"{out['gpubatch']}: {out['us_per_record']} us a record (runs {out['us_per_record_runs']}), "
          f"{records:,} records")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
