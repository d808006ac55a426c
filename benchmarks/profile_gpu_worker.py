#!/usr/bin/env python3
"""Where a GPU worker's loop thread spends its time in the GPU transcode: cProfile over the worker's
``GpuImageUnit.run`` (the thread that hands batches to the decoders, runs the chain and the encoder and
passes the outputs to the shards' writer), in the worker process of a real ``convert``.

    python3 benchmarks/profile_gpu_worker.py [--images 8192] [--times 4] [--top 30] [--out DIR]

The data: benchmarks/bench_convert.py's ImageNet-like JPEGs (``--images`` made once under --data-root,
hard-linked ``--times`` over). One untimed run first (page cache, CuPy's kernel cache, bytecode), then the profiled
one: ``python3 -m gpubatch convert SET OUT --to webdataset --resize-shorter 256 --center-crop 224
--quality 90 --device gpu``, with a ``sitecustomize`` on the workers' path that wraps the unit's ``run`` in
cProfile and writes its stats to ``--out``. cProfile slows Python code more than the GPU's, so the shares
say where the thread's Python goes, not the run's speed. Prints the functions with the most time of their
own, then the cumulative time of gpubatch's functions.
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PROBE = '''
import os
if os.environ.get("GPUBATCH_PROFILE_OUT"):
    import cProfile
    from gpubatch.engine.gpu import images as _m
    _run = _m.GpuImageUnit.run
    def run(self, *a, **kw):
        prof = cProfile.Profile()
        try:
            return prof.runcall(_run, self, *a, **kw)
        finally:
            prof.dump_stats(os.path.join(os.environ["GPUBATCH_PROFILE_OUT"], f"worker-{os.getpid()}.prof"))
    _m.GpuImageUnit.run = run
'''

TRANSCODE = ["--resize-shorter", "256", "--center-crop", "224", "--quality", "90"]


def main() -> None:
    from bench_convert import ENV, image_set, linked_set

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--times", type=int, default=4, help="the set hard-linked this many times over")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--data-root", type=Path, default=ROOT / ".bench-data")
    ap.add_argument("--out", type=Path, default=None, help="where the .prof files go (default: a temp folder)")
    a = ap.parse_args()
    a.data_root.mkdir(parents=True, exist_ok=True)
    data = image_set(a.data_root, a.images)
    if a.times > 1:
        data = linked_set(data, a.times)
    out_dir = a.out or Path(tempfile.mkdtemp(prefix="gpubatch-prof-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.data_root) as t:
        probe = Path(t) / "probe"
        probe.mkdir()
        (probe / "sitecustomize.py").write_text(PROBE)
        cmd = [sys.executable, "-m", "gpubatch", "convert", str(data), str(Path(t) / "out"), "--to", "webdataset",
               *TRANSCODE, "--device", "gpu", "--overwrite", "-q"]
        # (untimed: the page cache, CuPy's kernel cache, the modules' bytecode: ENV lets it be written)
        subprocess.run(cmd, check=True, env=ENV)
        path = os.pathsep.join([str(probe), str(ROOT), os.environ.get("PYTHONPATH", "")])
        subprocess.run(cmd, check=True, env={**ENV, "PYTHONPATH": path, "GPUBATCH_PROFILE_OUT": str(out_dir)})
    profs = sorted(out_dir.glob("worker-*.prof"))
    if not profs:
        sys.exit("no worker profile was written (is the run on the GPU?)")
    text = io.StringIO()
    stats = pstats.Stats(*[str(p) for p in profs], stream=text)
    print(f"{len(profs)} worker(s), {stats.total_tt:.2f} s profiled; stats in {out_dir}")
    stats.sort_stats("tottime").print_stats(a.top)
    stats.sort_stats("cumulative").print_stats("gpubatch", a.top)
    print(text.getvalue())


if __name__ == "__main__":
    main()
