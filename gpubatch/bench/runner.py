"""Run a bench: data, one subprocess per contender and chain, the optional sweep, the environment.

The result is a JSON-able dict (schema ``gpubatch-bench/1``, documented in the README).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import MODELS, get_model
from .measure import BusyLoad, run_beside, warmup_batches

CONTENDERS = ("gpubatch-gpu", "gpubatch-cpu", "torch-dataloader", "dali", "dali-defaults")
GPU_CONTENDERS = ("gpubatch-gpu", "dali", "dali-defaults")
SWEEPABLE = {"batch_size": int, "threads": int, "cuda_share": float, "warm_up": int, "region_decode": int,
             "decode_chunk": int, "sync": str, "reserve_core": int, "decode_route": str}
SCHEMA = "gpubatch-bench/1"


def cache_dir() -> Path:
    return Path(os.environ.get("GPUBATCH_CACHE", Path.home() / ".cache" / "gpubatch"))


def parse_sweep(spec: str | None) -> tuple[str, list[Any]] | None:
    if not spec:
        return None
    name, _, values = spec.partition("=")
    name = name.strip().replace("-", "_")
    if name not in SWEEPABLE or not values:
        raise UsageError(f"--sweep {spec!r}: write PARAM=v1,v2,...; PARAM one of {', '.join(SWEEPABLE)}")
    try:
        return name, [SWEEPABLE[name](v) for v in values.split(",")]
    except ValueError:
        raise UsageError(f"--sweep {spec!r}: values of {name} must be {SWEEPABLE[name].__name__}s") from None


def environment(argv: list[str] | None = None) -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "command": " ".join(argv if argv is not None else sys.argv)}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        env["cpu_model"] = platform.processor() or None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        env["gpu"] = out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        env["gpu"] = None
    versions = {}
    for mod in ("gpubatch", "cupy", "nvidia.nvimgcodec", "PIL", "numpy", "torch", "torchvision", "nvidia.dali"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            versions[mod] = getattr(m, "__version__", "?")
        except Exception:
            versions[mod] = None
    env["versions"] = versions
    try:
        import cupy

        v = cupy.cuda.runtime.runtimeGetVersion()
        env["cuda_runtime"] = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        env["cuda_runtime"] = None
    return env


def run_contender(args: dict[str, Any], timeout: float, load: BusyLoad | None = None,
                  after: float = 0.0) -> dict[str, Any]:
    """One contender in its own process; its RESULT line, or an error with the last lines it printed.
    ``load``: busy processes started ``after`` seconds into the contender's process, until its end."""
    cmd = [sys.executable, "-m", "gpubatch.bench.contenders", json.dumps(args)]
    try:
        p = run_beside(cmd, load or BusyLoad(0), after=after, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line:
        return json.loads(line[7:])
    tail = " | ".join((p.stderr + p.stdout).strip().splitlines()[-6:])
    return {"error": f"exit {p.returncode}: {tail}"}


def run_bench(model: str, data: Path | None = None, synthetic: int | None = None, batch_size: int | None = None,
              seconds: float = 10.0, device: str = "auto", baselines: list[str] | None = None,
              sweep: str | None = None, with_model: bool = False, gpu: int = 0, images: int | None = None,
              argv: list[str] | None = None, say: Callable[[str], None] = lambda s: None,
              busy: int = 0, busy_after: float | None = None, decode_route: str | None = None,
              gpu_memory: str | None = None) -> dict[str, Any]:
    """Benchmark ``model``'s chains; see the module docstring for what comes back. ``busy``: that many
    busy processes run beside every contender (:class:`~gpubatch.bench.measure.BusyLoad`), from
    ``busy_after`` seconds into each contender's process where given (load the decode route was not
    chosen by: it follows the load, ``gpubatch.engine.gpu.follow``).
    ``decode_route``: how gpubatch's GPU contender splits batches between the decoders
    (``engine.settings.ROUTES``; by default "auto"). ``gpu_memory``: the GPU contender's cap
    (``ImagePipeline(gpu_memory=...)``)."""
    from ..engine.device import resolve

    m = get_model(model)
    batch_size = batch_size or m.batch_size
    sweep_spec = parse_sweep(sweep)
    valid, gpu_contenders = CONTENDERS, GPU_CONTENDERS
    from .loader import LOADER_CONTENDERS, LOADER_GPU, dataset_source

    dataset = dataset_source(Path(data)) if data is not None and m.media == "image" else None
    if dataset is not None:  # a dataset gpubatch wrote: the loader against its format's readers
        valid, gpu_contenders = LOADER_CONTENDERS, LOADER_GPU
    elif m.media == "video":
        from .video import VIDEO_CONTENDERS as valid
    elif m.media == "audio":
        from .audio import AUDIO_CONTENDERS as valid
    contenders = list(baselines or valid)
    unknown = [c for c in contenders if c not in valid]
    if unknown:
        raise UsageError(f"unknown baseline {unknown[0]!r}; valid for {m.name}: {', '.join(valid)}")
    if (data is None) == (synthetic is None):
        raise UsageError("give exactly one of --data PATH or --synthetic N")
    if m.media != "image" and (sweep or with_model or busy or gpu_memory):
        raise UsageError("--sweep, --with-model, --busy and --gpu-memory measure the image models")
    if gpu_memory is not None:
        from ..engine.gpu.memory import parse_memory

        parse_memory(gpu_memory, 80 << 30)  # a malformed size is refused before any contender runs
    if busy_after is not None and not busy:
        raise UsageError("--busy-after needs --busy N (the busy processes it starts)")
    if m.media != "image":
        data, source = _media_source(m, data, synthetic, images, say)
    elif synthetic is not None:
        if synthetic < batch_size:
            raise UsageError(f"--synthetic {synthetic} is smaller than one batch ({batch_size})")
        from ..synthetic import make_jpeg_set

        root = cache_dir() / f"synthetic-{synthetic}"
        say(f"synthetic data: {synthetic} JPEGs in {root}")
        data = make_jpeg_set(root, synthetic)
        source = {"path": str(data), "kind": "synthetic", "images": synthetic}
    elif dataset is not None:
        if m.name != "resnet50" or sweep or with_model or busy or gpu_memory:
            raise UsageError("--data DATASET (one gpubatch wrote) measures the loader on --model resnet50, "
                             "without --sweep, --with-model, --busy or --gpu-memory")
        data, source = Path(data), dataset
    else:
        data = Path(data)
        if not data.is_dir():
            raise UsageError(f"--data {data}: not a folder of JPEGs")
        from .contenders import data_files

        n = len(data_files(str(data), images or 0))
        if n < batch_size:
            raise UsageError(f"--data {data} holds {n} JPEGs, fewer than one batch ({batch_size})")
        source = {"path": str(data), "kind": "folder", "images": n}
    source["page_cache"] = "warm: every contender reads all files in its warm-up and windows; nothing is dropped"
    if m.media == "audio":  # the bound the host's CPU puts on decoding, whatever runs the chain
        from .audio import decode_ceiling
        from .measure import media_files

        say("decode ceiling: every core decoding the files ...")
        source["decode_ceiling"] = decode_ceiling(media_files(data, images or 0, "audio"), min(seconds, 3.0))
    dev = resolve(device, gpu) if device != "cpu" else None
    gpu_ok = dev is not None and dev.is_gpu
    base = {"model": m.name, "data": str(data), "images": images or source["images"], "batch_size": batch_size,
            "seconds": seconds, "gpu": gpu, "with_model": with_model}
    if dataset is not None:
        base.update(dataset=True, format=dataset["format"])
    if decode_route:
        base["decode_route"] = decode_route
    if gpu_memory:
        base["gpu_memory"] = gpu_memory
    timeout = 20 * seconds + 600
    if busy:
        say(f"{busy} busy processes at nice 19 run beside the contenders"
            + (f", from {busy_after:g} s into each" if busy_after is not None else ""))
    later = BusyLoad(busy) if busy_after is not None else None  # (started in each contender's run)
    with BusyLoad(busy if later is None else 0):
        results: dict[str, dict[str, Any]] = {}
        for chain in m.chains:
            results[chain] = {}
            for c in contenders:
                if c in gpu_contenders and not gpu_ok:
                    reason = dev.reason if dev is not None else "--device cpu"
                    results[chain][c] = {"skipped": f"no GPU: {reason}"}
                    continue
                say(f"{m.name}/{chain}: {c} ...")
                results[chain][c] = run_contender({**base, "contender": c, "chain": chain}, timeout, later,
                                                  busy_after or 0.0)
            cpu = results[chain].get("gpubatch-cpu", {}).get("images_per_s")
            for r in results[chain].values():
                if cpu and "images_per_s" in r:
                    r["speedup_vs_cpu"] = r["images_per_s"] / cpu
        sweep_out = None
        if sweep_spec and gpu_ok:
            name, values = sweep_spec
            chain = next(iter(m.chains))
            points = []
            for v in values:
                say(f"sweep {name}={v} ...")
                args = {**base, "contender": "gpubatch-gpu", "chain": chain, "fidelity": False, "with_model": False,
                        name: v}
                r = run_contender(args, timeout, later, busy_after or 0.0)
                points.append({"value": v, **{k: r.get(k) for k in ("images_per_s", "min", "max", "gpu_mem_gib", "error")}})
            sweep_out = {"param": name, "chain": chain, "contender": "gpubatch-gpu", "points": points}
        elif sweep_spec:
            sweep_out = {"param": sweep_spec[0], "skipped": "the sweep runs the GPU contender; no GPU"}
    return {"schema": SCHEMA, "model": {"name": m.name, "doc": m.doc, "chains": m.chains},
            "environment": environment(argv), "data": source,
            "settings": {"batch_size": batch_size, "seconds": seconds, "device": device, "contenders": contenders,
                         "with_model": with_model, "windows": 5, "busy_processes": busy,
                         "busy_after_s": busy_after,
                         "decode_route": decode_route or "auto", "gpu_memory": gpu_memory,
                         "warmup_batches": warmup_batches(base)},
            "results": results, "sweep": sweep_out}


def _media_source(m: Any, data: Path | None, synthetic: int | None, files: int | None,
                  say: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """The files a video or audio bench reads: a folder of them, or a synthetic set made once and cached
    (video: 1080p and 720p H.264 and HEVC clips; audio: speech-like FLAC of the model's length and rate)."""
    from ..types import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS
    from .measure import media_files

    what = f"{m.media} files"
    if synthetic is not None:
        from .. import synthetic as make

        if m.media == "video":
            root = cache_dir() / f"synthetic-video-{synthetic}"
            say(f"synthetic data: {synthetic} clips (1080p and 720p, H.264 and HEVC, 5-20 s) in {root}")
            make.make_video_set(root, synthetic)
        else:
            seconds, rate = m.audio
            root = cache_dir() / f"synthetic-audio-{synthetic}-{seconds:g}s-{rate}"
            say(f"synthetic data: {synthetic} speech-like FLAC clips ({seconds:g} s, {rate:,} Hz) in {root}")
            make.make_audio_set(root, synthetic, seconds=(seconds, seconds), rate=rate, fmt="flac")
        return root, {"path": str(root), "kind": "synthetic", "images": synthetic, "what": what}
    data = Path(data)
    n = len(media_files(data, files or 0, m.media))
    if not n:
        exts = VIDEO_EXTENSIONS if m.media == "video" else AUDIO_EXTENSIONS
        raise UsageError(f"--data {data}: no {what} ({', '.join(exts)})")
    return data, {"path": str(data), "kind": "folder", "images": n, "what": what}


def list_models() -> list[tuple[str, str, dict[str, str]]]:
    return [(m.name, m.doc, m.chains) for m in MODELS.values()]
