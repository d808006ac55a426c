#!/usr/bin/env python3
"""The main job against its baselines, side by side in one call: `convert`, `info` and the same work
done another way on the same machine and the same files (the targets of the shards work).

    python3 benchmarks/bench_convert.py [--images 16384] [--only JOB,...] [--repeats 3] [--json OUT]

Jobs (``--only``; the default is every job the machine can run):

- ``gpu-transcode``: ``convert SRC DST --to webdataset --resize-shorter 256 --center-crop 224 --quality 90
  --device gpu`` on ``--images`` JPEGs (and on ``--big`` of them, the same files linked four times over),
  against the engine's ResNet-50 val chain (``benchmarks/bench_engine.py --only gpu-val``) on the same files.
- ``gpu-start-cold``: the same GPU transcode on ``--images``, each run (the first too) with an empty CuPy
  kernel cache (``CUPY_CACHE_DIR`` a new empty folder), as on a machine that never compiled gpubatch's
  kernels: the first batch's time (target: 3 s at most) and the run's images/s, beside the same runs with
  the cache kept. The libraries' files stay in the page cache, as after any earlier command.
- ``cpu-transcode``: the same options on the CPU ``--to folder`` against a ``multiprocessing.Pool`` of Pillow
  open / resize / crop / save (quality 90), a process a core.
- ``pass-through``: ``convert`` without pixel options to webdataset, tfrecord, recordio and lmdb against one
  process writing the same files into one tar with ``tarfile`` (the target's baseline); beside it, the same
  loop with its tar fsynced before its clock stops, as every shard gpubatch commits is. ``--sync shard,off``
  also runs gpubatch under ``--sync off`` (never fsynced, as the loop), each format's modes in turn. And the
  disk alone: webdataset's shards written from memory and fsynced, a thread a core (``disk_alone_s``), with the
  ratio to the loop that floor allows (``ratio_ceiling_by_disk``).
- ``info``: ``gpubatch info SRC`` (headers only) on the same files.
- ``audio``: ``--features "log-mel(n_mels=80)"`` on --clips 10-s FLAC clips to webdataset on the GPU and the
  CPU against ``AudioPipeline`` on the same chain and files (warm, writing nothing); and the disk alone: the
  output's files written from memory and fsynced shard by shard, a thread a core (``disk_alone_s``,
  :func:`durable_writes`; until 2026-12-06 one writing thread, whose floor a run of several writers may pass), the
  floor under any run that writes them durably, with the ratio to the pipeline that floor allows.
- ``video``: ``--frames every:1 --resize-shorter 224`` on --videos 1080p/720p H.264/HEVC clips on the GPU and
  the CPU against gpubatch's own NVDEC decode of the same files (benchmarks/video_decode.py, 4 sessions).
  ``--gpu-only`` leaves out the CPU path of audio and video (minutes on sets such as ``--clips 8192``
  or ``--videos 64``, where the GPU path's rate shows past its start).
- ``memory``: pass-through to webdataset of 10,000 and of 100,000 small JPEGs (one file hard-linked over,
  100 class folders): the peak memory of the whole run (the command's process and its workers, their RSS
  summed, sampled every 20 ms), and the ratio of the two (target: 100,000 at most 1.2x 10,000).
- ``remote``: the pass-through to and from an S3 server on 127.0.0.1 (moto's, in this process; the ``[s3]`` extra
  and moto): local -> local, local -> s3 (webdataset), s3 -> local (the webdataset shards to tfrecord),
  against fsspec copying the same bytes (``put``/``get`` of the shards, 8 at once): what the shard-by-shard
  mirror and upload cost over the store's own transfer rate.
- ``gpus``: the GPU transcode on 1, 2, 4... GPUs of the host (``--gpus``; on --big's set with --big), and on
  every GPU through ``--executor ray`` where Ray is installed: the scaling against N x one GPU's rate.

Each gpubatch figure is a whole process (``python3 -m gpubatch ...``, start-up included), timed from
outside (the Pillow pool and the ``tarfile`` loop, the targets' baselines, are timed inside this process,
without their interpreter's start or their listing of the files; each is also run as a whole process of its
own, timed as gpubatch is, and reported beside: ``*_whole_process_*``, ``ratio_to_whole_process_*``; so are
``AudioPipeline`` and the NVDEC decode, whose warm figures leave their start out): one untimed run first (page cache,
kernel cache), then the median of --repeats runs, each after
the previous output is removed and dirty pages written back (``sync``), as before each baseline run; the
command's own ``--json`` summary is kept beside it. Data: gpubatch.synthetic's photo-like sets, made once
under --data-root.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _baselines import audio_pipeline, durable_writes, nvdec_rate, pillow_pool, tarfile_loop  # noqa: E402 - (beside it)
from _data import image_set, linked_set, tiny_set  # noqa: E402 - (benchmarks/_data.py, beside this script)

# as a user's shell runs it: bytecode cached (the untimed first run writes it), whatever this shell says
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
JOBS = ["gpu-transcode", "gpu-start-cold", "cpu-transcode", "pass-through", "info", "memory", "remote", "audio", "video", "gpus"]
GPU_JOBS = {"gpu-transcode", "gpu-start-cold", "gpus"}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def timed(cmd: list[str], repeats: int, before=None, env: dict | None = None, untimed: bool = True) -> dict:
    """``cmd`` run once untimed (unless not ``untimed``), then ``repeats`` times: the median wall seconds, each
    run's, and the last run's ``--json`` summary where the command prints one (``summaries``: each run's)."""
    walls, summary, summaries = [], None, []
    for i in range(0 if untimed else 1, repeats + 1):
        if before is not None:
            before()
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **(env or {})})
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        if i:
            walls.append(wall)
        if p.stdout.lstrip().startswith("{"):
            try:
                summary = json.loads(p.stdout)
            except ValueError:
                summary = None
            if i:
                summaries.append(summary)
    return {"seconds": statistics.median(walls), "runs": [round(w, 3) for w in walls], "summary": summary,
            "summaries": summaries}


def fresh(*paths: Path):
    """A ``before`` hook for :func:`timed`: the previous run's output removed and every dirty page written
    back (``sync``) outside the timing, as the baselines start (no earlier run's writeback or removal
    lands in the next run's time)."""
    def before() -> None:
        for p in paths:
            if p.is_file():
                p.unlink()
            shutil.rmtree(p, ignore_errors=True)
        os.sync()
    return before


def gpubatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpubatch", *args]


def baseline(kind: str, data: Path, out: Path) -> list[str]:
    """A baseline (``pool``: :func:`pillow_pool` on every core; ``loop``: :func:`tarfile_loop`) as a whole
    process of its own, for :func:`timed`: its interpreter's start and its listing in its time, as gpubatch's."""
    return [sys.executable, str(Path(__file__).resolve()), "--baseline", kind, str(data), str(out)]


def rate(n: int, res: dict) -> float:
    return round(n / res["seconds"], 1)


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def slim(summary: dict | None) -> dict:
    if not summary:
        return {}
    keep = ("records_in", "records_out", "shards", "workers", "timings", "gpu_memory", "fallbacks", "skipped")
    out = {k: summary.get(k) for k in keep if k in summary}
    out["skipped"] = len(out.get("skipped") or [])
    if summary.get("seconds") is not None:  # (the run's own clock: the process's start and exit are outside it)
        out["run_seconds"] = round(summary["seconds"], 3)
    return out


# -- data -------------------------------------------------------------------------------------------

def count_files(d: Path, pattern: str = "*.jpg") -> int:
    return sum(1 for _ in d.rglob(pattern))


# -- jobs -------------------------------------------------------------------------------------------

TRANSCODE = ["--resize-shorter", "256", "--center-crop", "224", "--quality", "90"]


def job_gpu_transcode(a, tmp: Path) -> dict:
    out: dict = {}
    sets = [(a.images, image_set(a.data_root, a.images))]
    if a.big:
        sets.append((a.images * 4, linked_set(sets[0][1], 4)))
    for n, data in sets:
        res = timed(gpubatch("convert", str(data), str(tmp / "gpu"), "--to", "webdataset", *TRANSCODE,
                             "--device", "gpu", "--overwrite", "--json"), a.repeats, before=fresh(tmp / "gpu"))
        s = res["summary"] or {}
        t = s.get("timings", {})
        first = t.get("wall: first batch (from the run's start)")
        # after the first batch: the images but the first batch's over the run's time from it to the end
        # of its shards (finalize, manifest and the process's start and exit left out)
        after = None
        if first is not None and s.get("seconds"):
            span = t.get("wall: plan", 0) + t.get("wall: shards", 0) - first
            after = round((n - s.get("batch_size", 256)) / span, 1) if span > 0 else None
        out[str(n)] = {"images_per_s": rate(n, res), "seconds": res["seconds"], "runs": res["runs"],
                       "first_batch_s": first, "start_before_run_s": round(res["seconds"] - s.get("seconds", 0), 3),
                       "after_first_batch_images_per_s": after, **slim(s)}
    # the engine's val chain on the same files (its own process), for each set: the rate after the first batch
    # beside it on each (on --big's set the run's start weighs less against its steady rate)
    for n, data in sets:
        js = tmp / "engine.json"
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_engine.py"), "--only", "gpu-val",
                        "--images", str(n), "--data", str(data), "--repeats", "5", "--json", str(js)],
                       check=True, capture_output=True, text=True)
        eng = json.loads(js.read_text())
        val = eng.get("results", eng).get("gpu-val", {}).get("images_per_s") or 0
        row = out[str(n)]
        row["engine_val_images_per_s"] = val or None
        row["ratio_to_engine"] = ratio(row["images_per_s"], val)
        row["ratio_after_first_batch_to_engine"] = ratio(row["after_first_batch_images_per_s"] or 0, val)
    first = out[str(a.images)]
    out["engine_val_images_per_s"] = first["engine_val_images_per_s"]
    out["ratio_to_engine"] = first["ratio_to_engine"]
    out["ratio_after_first_batch_to_engine"] = first["ratio_after_first_batch_to_engine"]
    return out


def job_gpu_start_cold(a, tmp: Path) -> dict:
    """The GPU transcode with no compiled kernels (each run's CuPy cache a new empty folder) and with them."""
    data = image_set(a.data_root, a.images)
    cache = tmp / "kernel-cache"

    def empty_cache() -> None:
        fresh(tmp / "gpu")()
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()

    cmd = gpubatch("convert", str(data), str(tmp / "gpu"), "--to", "webdataset", *TRANSCODE, "--device", "gpu",
                   "--overwrite", "--json")
    out: dict = {"images": a.images}
    for name, res in (("no kernel cache", timed(cmd, a.repeats, before=empty_cache, untimed=False,
                                                env={"CUPY_CACHE_DIR": str(cache)})),
                      ("kernel cache kept", timed(cmd, a.repeats, before=fresh(tmp / "gpu")))):
        firsts = [(s or {}).get("timings", {}).get("wall: first batch (from the run's start)") for s in res["summaries"]]
        kept = [f for f in firsts if f is not None]
        out[name] = {"images_per_s": rate(a.images, res), "runs": res["runs"], "first_batch_s": firsts,
                     "first_batch_median_s": statistics.median(kept) if kept else None, **slim(res["summary"])}
    return out


def gpu_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no GPU: no scaling to measure
        return 0


def job_gpus(a, tmp: Path) -> dict:
    """The GPU transcode on 1, 2, 4... GPUs of this host (``--gpus``; all of them with two processes a GPU
    too), and on all of them through ``--executor ray`` where Ray is installed (on the cluster RAY_ADDRESS
    names, as a deployment starts one before its jobs; else on one each run starts): images/s, per GPU,
    the bound the run names, and the ratio to N x one GPU's rate (the target: >= 0.8 until a named bound)."""
    n_gpus = gpu_count()
    data = image_set(a.data_root, a.images)
    n = a.images
    if a.big:
        data, n = linked_set(data, 4), a.images * 4
    counts = [c for c in (1, 2, 4, 8) if c <= n_gpus]
    out: dict = {"images": n, "gpus_on_host": n_gpus}
    runs = [(str(c), ["--gpus", ",".join(str(i) for i in range(c))]) for c in counts]
    runs.append((f"procs2-{counts[-1]}", ["--gpus", "all", "--gpu-procs", "2"]))  # two processes a GPU
    try:
        import ray  # noqa: F401

        runs.append((f"ray-{n_gpus}", ["--executor", "ray", "--gpu-procs", "1"]))
    except ImportError:
        out["ray"] = "not installed"
    one = None
    for name, extra in runs:
        res = timed(gpubatch("convert", str(data), str(tmp / f"gpus-{name}"), "--to", "webdataset", *TRANSCODE,
                             "--device", "gpu", "--overwrite", "--json", *extra), a.repeats,
                    before=fresh(tmp / f"gpus-{name}"))
        s = res["summary"] or {}
        r = rate(n, res)
        c = int(name.split("-")[-1])
        if name.startswith("procs2") and str(c) in out:  # (the same GPUs as the plain run of c)
            out[name] = {"images_per_s": r, "seconds": res["seconds"], "runs": res["runs"], "bound": s.get("bound"),
                         "to_one_process_a_gpu": ratio(r, out[str(c)]["images_per_s"]), **slim(s)}
            continue
        one = r if name == "1" else one
        out[name] = {"images_per_s": r, "seconds": res["seconds"], "runs": res["runs"], "bound": s.get("bound"),
                     "usage": s.get("usage"), "per_gpu": s.get("per_gpu"),
                     "scaling": ratio(r, c * one) if one else None, **slim(s)}
    if "1" in out and f"{counts[-1]}" in out and f"ray-{n_gpus}" in out:
        out["ray_to_local"] = ratio(out[f"ray-{n_gpus}"]["images_per_s"], out[str(counts[-1])]["images_per_s"])
    return out


def job_cpu_transcode(a, tmp: Path) -> dict:
    data = image_set(a.data_root, a.cpu_images)
    n = count_files(data)
    res = timed(gpubatch("convert", str(data), str(tmp / "cpu"), "--to", "folder", *TRANSCODE, "--device", "cpu",
                         "--json"), a.repeats, before=fresh(tmp / "cpu"))
    pool = [pillow_pool(data, tmp / "pool", cores()) for _ in range(a.repeats + 1)][1:]
    whole = rate(n, timed(baseline("pool", data, tmp / "pool"), a.repeats, before=fresh(tmp / "pool")))
    mine, base = rate(n, res), statistics.median(pool)
    return {"images": n, "gpubatch_images_per_s": mine, "gpubatch_runs": res["runs"],
            "pillow_pool_images_per_s": round(base, 1), "pillow_pool_runs": [round(p, 1) for p in pool],
            "ratio": ratio(mine, base), "pillow_pool_whole_process_images_per_s": whole,
            "ratio_to_whole_process_pool": ratio(mine, whole), **slim(res["summary"])}


def job_pass_through(a, tmp: Path) -> dict:
    data = image_set(a.data_root, a.cpu_images)
    n = count_files(data)
    loops = [tarfile_loop(data, tmp / "loop.tar") for _ in range(a.repeats + 1)][1:]
    base = statistics.median(loops)
    # (context, not the target's baseline: the same loop with its tar fsynced, as each shard is committed)
    durable = statistics.median([tarfile_loop(data, tmp / "loop.tar", durable=True) for _ in range(a.repeats)])
    whole = rate(n, timed(baseline("loop", data, tmp / "loop.tar"), a.repeats, before=fresh(tmp / "loop.tar")))
    out: dict = {"records": n, "tarfile_loop_records_per_s": round(base, 1),
                 "tarfile_loop_fsynced_records_per_s": round(durable, 1),
                 "tarfile_loop_whole_process_records_per_s": whole}
    modes = a.sync.split(",")
    for k, fmt in enumerate(("webdataset", "tfrecord", "recordio", "lmdb")):
        for mode in modes if k % 2 == 0 else modes[::-1]:  # (the modes' order turned each format)
            res = timed(gpubatch("convert", str(data), str(tmp / f"pt-{fmt}"), "--to", fmt, "--sync", mode, "--json"),
                        a.repeats, before=fresh(tmp / f"pt-{fmt}"))
            out[fmt if mode == "shard" else f"{fmt} --sync {mode}"] = {
                "records_per_s": rate(n, res), "runs": res["runs"], "ratio": ratio(rate(n, res), base),
                "ratio_to_fsynced_loop": ratio(rate(n, res), durable),
                "ratio_to_whole_process_loop": ratio(rate(n, res), whole), **slim(res["summary"])}
    # the disk's part: webdataset's shards (the last run's, still there) written from memory and fsynced shard by
    # shard, a thread a core as the run's workers, with nothing else to do; with every shard synced (--sync shard,
    # the default) no run is faster than that
    written = [p.stat().st_size for p in sorted((tmp / "pt-webdataset").rglob("*.tar"))]
    out["output_bytes"] = sum(written)
    out["disk_alone_s"] = round(statistics.median(durable_writes(tmp / "disk-alone", written, writers=cores())
                                                  for _ in range(a.repeats)), 3)
    # the ratio to the loop a run as fast as its durable writes would reach
    out["ratio_ceiling_by_disk"] = ratio(n / out["disk_alone_s"], base)
    return out


def job_info(a, tmp: Path) -> dict:
    data = image_set(a.data_root, a.cpu_images)
    res = timed(gpubatch("info", str(data)), a.repeats)
    return {"files": count_files(data), "seconds": round(res["seconds"], 3), "runs": res["runs"]}


def tree_rss_peak(cmd: list[str]) -> tuple[float, int]:
    """Run ``cmd``: (seconds, the peak of the RSS summed over it and every process it starts, in bytes),
    read from /proc every 20 ms."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    t0, peak = time.perf_counter(), 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
    return seconds, peak


def _tree_rss(pid: int) -> int:
    from gpubatch.engine.gpu.memory import descendants

    total = 0
    for p in {pid} | descendants(pid):
        try:
            rss = next(ln for ln in Path(f"/proc/{p}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
            total += int(rss.split()[1]) * 1024
        except (OSError, StopIteration, ValueError):
            continue
    return total


def job_memory(a, tmp: Path) -> dict:
    out: dict = {}
    for n in (10_000, 100_000):
        data = tiny_set(a.data_root, n)
        runs = []
        for _ in range(a.repeats):
            shutil.rmtree(tmp / "mem", ignore_errors=True)
            runs.append(tree_rss_peak(gpubatch("convert", str(data), str(tmp / "mem"), "--to", "webdataset")))
        out[str(n)] = {"peak_mib": [round(r[1] / 2**20, 1) for r in runs], "seconds": [round(r[0], 2) for r in runs],
                       "median_peak_mib": round(statistics.median(r[1] for r in runs) / 2**20, 1)}
    out["ratio"] = ratio(out["100000"]["median_peak_mib"], out["10000"]["median_peak_mib"])
    return out


def job_remote(a, tmp: Path) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    store = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_ENDPOINT_URL": f"http://{host}:{port}", "GPUBATCH_CACHE": str(tmp / "cache")}
    saved = {k: os.environ.get(k) for k in store}
    os.environ.update(store)
    ENV.update(store)
    try:
        boto3.client("s3").create_bucket(Bucket="bench")
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        data = image_set(a.data_root, a.cpu_images)
        n = count_files(data)
        out: dict = {"records": n}
        wds = tmp / "wds"
        res = timed(gpubatch("convert", str(data), str(wds), "--to", "webdataset", "--overwrite", "--json"),
                    a.repeats, before=fresh(tmp / "wds"))
        out["local_to_local_records_per_s"] = rate(n, res)
        res = timed(gpubatch("convert", str(data), "s3://bench/up", "--to", "webdataset", "--overwrite", "--json"),
                    a.repeats)
        out["local_to_s3_records_per_s"] = rate(n, res)
        shards = sorted(p for p in wds.iterdir() if p.is_file())
        size = sum(p.stat().st_size for p in shards)

        def put_all() -> float:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda p: fs.put_file(str(p), f"bench/raw/{p.name}"), shards))
            return time.perf_counter() - t0

        def get_all() -> float:
            shutil.rmtree(tmp / "got", ignore_errors=True)
            (tmp / "got").mkdir()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda p: fs.get_file(f"bench/raw/{p.name}", str(tmp / "got" / p.name)), shards))
            return time.perf_counter() - t0

        put_s = statistics.median(put_all() for _ in range(a.repeats))
        get_s = statistics.median(get_all() for _ in range(a.repeats))
        out["fsspec_put_mib_per_s"] = round(size / put_s / 2**20, 1)
        out["fsspec_get_mib_per_s"] = round(size / get_s / 2**20, 1)
        out["local_to_s3_mib_per_s"] = round(out["local_to_s3_records_per_s"] * size / n / 2**20, 1)
        res = timed(gpubatch("convert", "s3://bench/raw", str(tmp / "down"), "--to", "tfrecord", "--overwrite",
                             "--json"), a.repeats)
        out["s3_to_local_records_per_s"] = rate(n, res)
        out["s3_to_local_mib_per_s"] = round(out["s3_to_local_records_per_s"] * size / n / 2**20, 1)
        out["upload_ratio"] = ratio(out["local_to_s3_mib_per_s"], out["fsspec_put_mib_per_s"])
        out["download_ratio"] = ratio(out["s3_to_local_mib_per_s"], out["fsspec_get_mib_per_s"])
        out["shard_mib"] = round(size / len([p for p in shards if p.suffix == ".tar"]) / 2**20, 1)
        return out
    finally:
        server.stop()
        for k, v in saved.items():
            ENV.pop(k, None)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def job_audio(a, tmp: Path) -> dict:
    from gpubatch.synthetic import make_audio_set

    data = a.data_root / f"flac-{a.clips}"
    make_audio_set(data, a.clips, seconds=(10.0, 10.0), fmt="flac")
    n = count_files(data, "*.flac")
    chain = ["--sample-rate", "16000", "--mono", "--duration", "30", "--features", "log-mel(n_mels=80)"]
    out: dict = {"clips": n}
    others = [m for m in a.sync.split(",") if m != "shard"] if a.gpu else []  # (--sync: the GPU path's modes)
    runs = [(dev, "shard") for dev in ((["gpu"] if a.gpu_only else ["gpu", "cpu"]) if a.gpu else ["cpu"])]
    for dev, mode in runs + [("gpu", m) for m in others]:
        res = timed(gpubatch("convert", str(data), str(tmp / f"audio-{dev}"), "--to", "webdataset", *chain,
                             "--device", dev, "--sync", mode, "--overwrite", "--json"), a.repeats,
                    before=fresh(tmp / f"audio-{dev}"))  # (the previous run's 1-4 GB of features gone outside the time)
        out[dev if mode == "shard" else f"{dev} --sync {mode}"] = {
            "clips_per_s": rate(n, res), "runs": res["runs"],
            "after_first_shard_clips_per_s": after_first_shard(n, res["summary"]), **slim(res["summary"])}
    # the disk's part: the same files' bytes written and fsynced shard by shard with nothing else to do (the last
    # run's output, still there), a thread a core: the floor under any run that writes them durably, however many
    # writers it has (a run of two GPU processes writes with two threads; one thread is no floor for it)
    written = [p.stat().st_size for p in sorted((tmp / f"audio-{runs[0][0]}").rglob("*")) if p.is_file()]
    out["output_bytes"] = sum(written)
    out["disk_alone_s"] = round(statistics.median(durable_writes(tmp / "disk-alone", written, writers=cores())
                                                  for _ in range(a.repeats)), 3)
    if a.gpu:
        out["audio_pipeline_clips_per_s"] = audio_pipeline(data)
        # for scale, the pipeline with its other FLAC decoder (the target's baseline is the pipeline as users run it)
        from gpubatch.engine.settings import Settings

        other = not Settings.from_env().flac_gpu
        out[f"audio_pipeline_flac_gpu_{str(other).lower()}_clips_per_s"] = audio_pipeline(data, flac_gpu=other)
        # the pipeline timed as the command is, a process from its start to its end (its figure above is warm)
        out["audio_pipeline_whole_process_clips_per_s"] = audio_pipeline(data, whole=a.repeats)
        out["ratio_gpu_to_pipeline_whole_process"] = ratio(out["gpu"]["clips_per_s"],
                                                           out["audio_pipeline_whole_process_clips_per_s"])
        # what the target's ratio could reach if the run took no longer than its output's durable writes
        out["ratio_ceiling_by_disk"] = ratio(n / out["disk_alone_s"], out["audio_pipeline_clips_per_s"])
        out["ratio_gpu_to_pipeline"] = ratio(out["gpu"]["clips_per_s"], out["audio_pipeline_clips_per_s"])
        for mode in others:
            out[f"ratio_gpu_sync_{mode}_to_pipeline"] = ratio(out[f"gpu --sync {mode}"]["clips_per_s"],
                                                              out["audio_pipeline_clips_per_s"])
        # the pipeline's figure leaves out its start (a warm pass): the unit's rate once its first shard is in
        out["ratio_after_first_shard_to_pipeline"] = ratio(out["gpu"]["after_first_shard_clips_per_s"] or 0,
                                                           out["audio_pipeline_clips_per_s"])
    return out


def after_first_shard(n: int, summary: dict | None) -> float | None:
    """Records a second from the first shard's commit to the last's (the shards' records over their time
    after the first; ``n`` records in equal shards): a run's rate with its start left out, beside a
    baseline measured warm."""
    t = (summary or {}).get("timings", {})
    first, whole, shards = t.get("wall: workers start (to the first shard committed)"), t.get("wall: shards"), \
        (summary or {}).get("shards")
    if not (first and whole and shards and shards > 1 and whole > first):
        return None
    return round((n - n / shards) / (whole - first), 1)


def job_video(a, tmp: Path) -> dict:
    from gpubatch.synthetic import make_video_set

    data = a.data_root / f"video-{a.videos}"
    make_video_set(data, a.videos, seconds=(8.0, 8.0))
    files = sorted(p for p in data.rglob("*") if p.suffix in (".mp4", ".mkv", ".mov"))
    out: dict = {"videos": len(files)}
    # "gpu": the native decode loop (the default); "gpu-python": the packet loop in Python, for comparison
    for name in (["gpu"] if a.gpu_only else ["gpu", "gpu-python", "cpu"]) if a.gpu else ["cpu"]:
        dev = name.split("-")[0]
        res = timed(gpubatch("convert", str(data), str(tmp / f"video-{name}"), "--to", "webdataset", "--frames",
                             "every:1", "--resize-shorter", "224", "--device", dev, "--overwrite", "--json"),
                    a.repeats, env={"GPUBATCH_VIDEO_LOOP": "python"} if name == "gpu-python" else None,
                    before=fresh(tmp / f"video-{name}"))
        frames = (res["summary"] or {}).get("records_out", 0)
        out[name] = {"frames_per_s": round(frames / res["seconds"], 1), "frames": frames, "runs": res["runs"],
                     "after_first_shard_frames_per_s": after_first_shard(frames, res["summary"]), **slim(res["summary"])}
    if a.gpu:
        out["nvdec_frames_per_s"] = nvdec_rate(files)
        out["ratio_gpu_to_nvdec"] = ratio(out["gpu"]["frames_per_s"], out["nvdec_frames_per_s"] or 0)
        # the decode timed as the command is, a process from its start to its end (its figure above is warm)
        out["nvdec_whole_process_frames_per_s"] = nvdec_rate(files, whole=a.repeats)
        out["ratio_gpu_to_nvdec_whole_process"] = ratio(out["gpu"]["frames_per_s"],
                                                        out["nvdec_whole_process_frames_per_s"] or 0)
        if "cpu" in out:
            out["gpu_faster_than_cpu"] = out["gpu"]["frames_per_s"] > out["cpu"]["frames_per_s"]
    return out


RUN = {"gpu-transcode": job_gpu_transcode, "gpu-start-cold": job_gpu_start_cold, "cpu-transcode": job_cpu_transcode, "pass-through": job_pass_through,
       "info": job_info, "memory": job_memory, "remote": job_remote, "audio": job_audio, "video": job_video,
       "gpus": job_gpus}


def has_gpu() -> bool:
    try:
        from gpubatch.engine.device import gpu_problem

        return gpu_problem(0)[0] is None
    except Exception:
        return False


def main() -> None:
    if sys.argv[1:2] == ["--baseline"]:  # (one baseline run, as a process of its own: baseline())
        kind, data, out = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
        pillow_pool(data, out, cores()) if kind == "pool" else tarfile_loop(data, out)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16384, help="JPEGs of the GPU transcode")
    ap.add_argument("--big", action="store_true", help="also the GPU transcode on 4x --images (hard links)")
    ap.add_argument("--cpu-images", type=int, default=None, help="JPEGs of the CPU jobs (default: --images)")
    ap.add_argument("--clips", type=int, default=2048)
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated jobs: " + ",".join(JOBS))
    ap.add_argument("--data-root", type=Path, default=ROOT / ".bench-data")
    ap.add_argument("--gpu-only", action="store_true",
                    help="audio and video: the GPU path and its baseline alone (for large sets, where the CPU path takes minutes)")
    ap.add_argument("--sync", default="shard",
                    help="pass-through (and audio's GPU path): the --sync modes to run gpubatch in, comma-separated "
                         "(shard, end, off)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    a.cpu_images = a.cpu_images or a.images
    a.gpu = has_gpu()
    jobs = a.only.split(",") if a.only else [j for j in JOBS if a.gpu or j not in GPU_JOBS]
    a.data_root.mkdir(parents=True, exist_ok=True)
    a.data_root, a.json = a.data_root.resolve(), a.json.resolve() if a.json else None
    # the runs import this tree's gpubatch: ``python -m`` puts the working directory first on the path, so
    # run from another checkout they would import that one's whatever PYTHONPATH says
    os.chdir(ROOT)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
                    "cores": cores(), "cpu": _cpu_name(), "gpu": _gpu_name(), "commit": _commit(),
                    # the engine's settings given in the environment (e.g. GPUBATCH_SHARD_WRITER=thread): what was measured
                    "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("GPUBATCH_")}, "jobs": {}}
    with tempfile.TemporaryDirectory(dir=a.data_root) as t:
        for job in jobs:
            t0 = time.perf_counter()
            try:
                report["jobs"][job] = RUN[job](a, Path(t))
            except Exception as e:  # a job that fails is reported, the others still run
                report["jobs"][job] = {"error": f"{type(e).__name__}: {e}"}
            report["jobs"][job]["job_seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps({job: report["jobs"][job]}), flush=True)
    text = json.dumps(report, indent=1)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text)
    print(text if not a.json else f"wrote {a.json}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _gpu_name() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return p.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                              text=True).stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    main()
