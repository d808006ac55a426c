#!/usr/bin/env python3
"""gpubatch's CUDA kernels on their own: what NVRTC takes for each, and the batched JPEG encoder's first use,
speed and bytes (to set two trees side by side: run it under each with ``PYTHONPATH=TREE``).

    python3 benchmarks/gpu_kernels.py compile [--json OUT]   # each kernel compiled alone, CuPy's cache empty
    python3 benchmarks/gpu_kernels.py encode --save OUT.pkl  # the encoder on a suite of batches, cache empty
    python3 benchmarks/gpu_kernels.py compare A.pkl B.pkl    # which batches two saved runs encoded otherwise

``encode`` times the encoder's first use (what a machine that never ran gpubatch pays at the first batch) and the
median of 40 encodes of two batches (256 images of 224x224; 128 of mixed sizes), and saves every output of 32
batches (1x1 to 1500x1000 pixels, noise, flat white and black, 1,500 images in one batch; qualities 50, 90 and 100;
and into a sink).
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # (after PYTHONPATH: the tree it names is the one measured)


def _empty_cache() -> None:
    os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpubatch-kernels-")  # (before CuPy is imported)


def compile_all() -> dict:
    _empty_cache()
    from gpubatch.engine import kernels

    out = {}
    for path in sorted(kernels._DIR.glob("*.cu")):
        for name in kernels.kernels_of(path.stem):
            t = time.perf_counter()
            kernels.kernel(path.stem, name)
            out[name] = round(time.perf_counter() - t, 3)
    return out


def _suite(np) -> dict:
    from tests.helpers import photo

    rng = np.random.default_rng(1)
    return {
        "one 1x1": [np.full((1, 1, 3), 200, np.uint8)],
        "small odd": [photo(h, w, seed=k) for k, (h, w) in enumerate([(7, 9), (17, 33), (8, 200), (255, 3), (16, 16)])],
        "224 x256": [photo(224, 224, seed=k) for k in range(256)],
        "mixed x128": [photo(int(rng.integers(17, 500)), int(rng.integers(17, 500)), seed=k) for k in range(128)],
        "noise x64": [rng.integers(0, 256, (int(rng.integers(8, 300)), int(rng.integers(8, 300)), 3), dtype=np.uint8)
                      for _ in range(64)],
        "white/black x40": [np.full((40 + k, 50 + 2 * k, 3), 255 * (k % 2), np.uint8) for k in range(40)],
        "many x1500": [photo(24 + k % 40, 32 + k % 24, seed=k) for k in range(1500)],
        "big x4": [photo(1000 + 7 * k, 1500 - 5 * k, seed=k) for k in range(4)],
    }


def encode(save: Path | None) -> dict:
    _empty_cache()
    import cupy as cp
    import numpy as np

    from gpubatch.engine.batch import PinnedStaging
    from gpubatch.engine.codecs.jpeg_gpu import BatchedJpegEncoder, Sink

    stream = cp.cuda.Stream(non_blocking=True)
    enc = BatchedJpegEncoder(cp, PinnedStaging(cp))
    t0 = time.perf_counter()
    enc.encode([cp.zeros((16, 16, 3), cp.uint8)], 90, stream)
    out: dict = {"first_encode_s": round(time.perf_counter() - t0, 3)}
    suite = _suite(np)
    saved: dict = {}
    for name, arrays in suite.items():
        dev = [cp.asarray(a) for a in arrays]
        for q in (50, 90, 100):
            saved[f"{name} q{q}"] = [bytes(b) for b in enc.encode(dev, q, stream)]
        sink = Sink(None)
        saved[f"{name} sink"] = [s.assemble(sink.view) for s in enc.encode(dev, 90, stream, sink)]

    def median_ms(arrays: list) -> float:
        dev = [cp.asarray(a) for a in arrays]
        enc.encode(dev, 90, stream)
        stream.synchronize()
        times = []
        for _ in range(40):
            t = time.perf_counter()
            enc.encode(dev, 90, stream)
            stream.synchronize()
            times.append(time.perf_counter() - t)
        return round(statistics.median(times) * 1e3, 3)

    out["ms, 256 images of 224x224"] = median_ms(suite["224 x256"])
    out["ms, 128 images of mixed sizes"] = median_ms(suite["mixed x128"])
    if save is not None:
        save.write_bytes(pickle.dumps({"timings": out, "outputs": saved}))
    return out


def compare(a: Path, b: Path) -> dict:
    x, y = pickle.loads(a.read_bytes()), pickle.loads(b.read_bytes())
    differ = [k for k in x["outputs"] if x["outputs"][k] != y["outputs"].get(k)]
    return {"batches": len(x["outputs"]), "differing": differ, a.name: x["timings"], b.name: y["timings"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compile", "encode", "compare"])
    ap.add_argument("files", nargs="*", type=Path, help="compare: the two saved runs")
    ap.add_argument("--save", type=Path, default=None, help="encode: save the outputs and timings here")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.what == "compile":
        res = compile_all()
    elif a.what == "encode":
        res = encode(a.save)
    else:
        if len(a.files) != 2:
            ap.error("compare takes two saved runs")
        res = compare(*a.files)
    from _data import emit  # (benchmarks/_data.py, beside this script; ROOT is on the path by now)

    emit(res, a.json)


if __name__ == "__main__":
    main()
