"""Where the GPU audio pipeline's time goes: ``AudioPipeline`` on a model's chain (whisper by default)
over synthetic clips, its producer run in this thread under cProfile (the functions that take the most
time, by their own time and by cumulative time), the stage times it keeps, the GPU's own time per batch
(CUDA events around each batch's work) and the clips/s of the profiled and of a plain run.

    python3 benchmarks/audio_gpu.py --clips 1024 --batches 48 [--flac cpu] --json out.json

``--flac cpu``: the pipeline with FLAC decoded by libsndfile in its processes (``AudioPipeline(flac_gpu=False)``);
by default on the GPU.

It also measures the ceiling the CPU puts on any pipeline that decodes FLAC with libsndfile (DALI's
``decoders.audio`` does too): every core decoding the clips and nothing else (one process a core, each
file read whole into float32, as the pipeline's workers do), and one core's time per clip.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _run(files: list, chain: str, batch: int, batches: int, profile: bool, flac_gpu: bool = False) -> dict:
    import cupy as cp

    from gpubatch.engine.spec import parse_chain
    from gpubatch.pipelines.audio import AudioPipeline

    pipe = AudioPipeline(parse_chain(chain), device="gpu", flac_gpu=flac_gpu)
    gen = pipe._gpu(files, batch, True, 0)  # the producer, in this thread (iterate_files runs it in another)
    for _ in range(4):  # warm-up: kernels loaded, FFT plans made, workers started
        next(gen).synchronize()
    for k in pipe.timings:
        pipe.timings[k] = 0.0
    prof = cProfile.Profile() if profile else None
    gpu_ms, clips = [], 0
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    last = None
    for _ in range(batches):
        start = cp.cuda.get_current_stream().record()
        b = next(gen)
        clips += len(b)
        if last is not None:
            last[1].synchronize()
            gpu_ms.append(cp.cuda.get_elapsed_time(*last))
        last = (start, b.ready)
    last[1].synchronize()
    if prof:
        prof.disable()
    seconds = time.perf_counter() - t0
    gen.close()
    pipe.close()
    out = {"clips_per_s": round(clips / seconds), "seconds": round(seconds, 3),
           "stages_s": {k: round(v, 3) for k, v in pipe.timings.items()},
           "gpu_ms_per_batch_median": round(statistics.median(gpu_ms), 2) if gpu_ms else None}
    if prof:
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(18)
            out[f"top_{key}"] = [ln for ln in s.getvalue().splitlines() if ln.strip()][-19:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="whisper")
    ap.add_argument("--clips", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--batch", type=int, default=0, help="default: the model's batch size")
    ap.add_argument("--cache", type=Path, default=ROOT / ".bench-data")
    ap.add_argument("--ceiling-seconds", type=float, default=3.0, help="how long the decode ceiling decodes")
    ap.add_argument("--ceiling-only", action="store_true")
    ap.add_argument("--flac", choices=("gpu", "cpu"), default="gpu", help="where FLAC is decoded (AudioPipeline's flac_gpu)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from gpubatch.bench import MODELS
    from gpubatch.synthetic import make_audio_set

    model = MODELS[a.model]
    seconds, rate = model.audio
    data = a.cache / f"{a.model}-{a.clips}"
    make_audio_set(data, a.clips, seconds=(seconds, seconds), rate=rate)
    files = sorted(data.rglob("*.flac"))
    chain, batch = model.chains["train"], a.batch or model.batch_size
    from gpubatch.bench.audio import decode_ceiling

    result = {"model": a.model, "clips": len(files), "batch": batch, "host_cores": os.cpu_count(), "flac": a.flac,
              "decode_ceiling": decode_ceiling(files, a.ceiling_seconds)}
    if not a.ceiling_only:
        result.update(plain=_run(files, chain, batch, a.batches, False, a.flac == "gpu"),
                      profiled=_run(files, chain, batch, a.batches, True, a.flac == "gpu"))
    text = json.dumps(result, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)


if __name__ == "__main__":
    main()
