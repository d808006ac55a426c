"""``gpubatch info`` on one dataset by its header-reading paths, side by side: as it chooses (``default``),
the command's own process (``PROCESSES_FROM_S`` raised past any set) and a process a core (on 4 cores or more,
``PROCESSES_FROM_S`` at 0). Each run is a whole process; the paths take turns, after one untimed round. With ``--tree`` (twice or
more): ``gpubatch info SRC`` of each tree (a folder holding a ``gpubatch`` package, first on ``PYTHONPATH``)
instead, in turn, each by its default path.

    python3 benchmarks/info_paths.py SRC [--repeats 5] [--tree OLD --tree NEW]
    python3 benchmarks/info_paths.py SRC --readers 1,2,4,8 [--cold]

Prints the median wall seconds of each path (or tree) and each run's, as JSON. With ``--readers``: in this
process, every record's first bytes read by N reader threads (1: this thread alone) and parsed by this
thread, as ``info``'s own process does, N in turn; ``--cold`` evicts the files from the page cache first
(``posix_fadvise(DONTNEED)``): what ``report.info.CACHED_WAIT_S`` chooses between.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CODE = ("import sys, gpubatch.report.info as i; sys.argv[1] == '-' or setattr(i, 'PROCESSES_FROM_S', "
        "float(sys.argv[1])); from gpubatch.cli import main; sys.argv = ['gpubatch', 'info', sys.argv[2]]; main()")
PATHS = (("default", "-"), ("one process", "1e9"), ("processes", "0"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[], help="a tree to run (its own default path)")
    ap.add_argument("--readers", default=None, help="reader thread counts to time in this process, e.g. 1,4,8")
    ap.add_argument("--cold", action="store_true", help="with --readers: the files evicted from the cache first")
    a = ap.parse_args()
    if a.readers:
        print(json.dumps(readers(a.src, [int(n) for n in a.readers.split(",")], a.repeats, a.cold)))
        return
    # (name, argument after -c's code, PYTHONPATH's first entry or None)
    turns = ([(tree, "-", os.path.abspath(tree)) for tree in a.tree] if a.tree
             else [(name, first, None) for name, first in PATHS])
    if a.tree:
        for tree in a.tree:
            if not os.path.isdir(os.path.join(tree, "gpubatch")):
                sys.exit(f"{tree} holds no gpubatch package")
    runs: dict[str, list[float]] = {name: [] for name, _, _ in turns}
    for r in range(a.repeats + 1):
        for name, first, tree in turns:
            env = dict(os.environ)
            if tree is not None:  # (the tree's own default stands)
                env["PYTHONPATH"] = os.pathsep.join([tree, *filter(None, [env.get("PYTHONPATH")])])
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", CODE, first, a.src], capture_output=True, text=True, env=env,
                               cwd="/" if tree is not None else None)
            wall = time.perf_counter() - t
            if p.returncode:
                sys.exit(f"info exited {p.returncode}: {p.stderr.strip()[-2000:]}")
            if r:
                runs[name].append(round(wall, 3))
    print(json.dumps({k: {"median": statistics.median(v), "runs": v} for k, v in runs.items()}))


def readers(src: str, counts: list[int], repeats: int, cold: bool) -> dict:
    """Seconds to read and parse every record of ``src`` with each count of reader threads (medians)."""
    from pathlib import Path

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from gpubatch.engine.executor import ordered_map
    from gpubatch.formats import open_reader
    from gpubatch.report import info

    out: dict = {"cold": cold, "readers": {}}
    with open_reader(Path(src)) as reader:
        entries = reader.entries()
        chunks = [entries[i : i + info.CHUNK] for i in range(0, len(entries), info.CHUNK)]
        for n in counts:
            runs = []
            for _ in range(repeats):
                if cold:
                    for root, _dirs, files in os.walk(src):
                        for f in files:
                            fd = os.open(os.path.join(root, f), os.O_RDONLY)
                            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                            os.close(fd)
                t = time.perf_counter()
                fetches = ordered_map(lambda c: [info._fetch(reader, e) for e in c], chunks, n, window=2 * n)
                for chunk, fetched in zip(chunks, fetches):
                    for e, f in zip(chunk, fetched):
                        info._described(reader, e, f)
                runs.append(round(time.perf_counter() - t, 3))
            out["readers"][n] = {"median": statistics.median(runs), "runs": runs}
    out["records"] = len(entries)
    return out


if __name__ == "__main__":
    main()
