"""The bench harness with a fake clock, the report renderers, the JSON schema and the CLI (CPU only)."""

from __future__ import annotations

import json
import time

import pytest

from gpubatch.bench import MODELS
from gpubatch.bench.measure import bottleneck, percentile, timed_windows
from gpubatch.bench.report import to_html, to_markdown
from gpubatch.bench.runner import SCHEMA, parse_sweep
from gpubatch.errors import UsageError
from tests.helpers import run_cli


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_windows_exclude_warmup_and_take_the_median():
    clock = FakeClock()
    calls = []
    costs = iter([100.0] * 3 + [0.1] * 1000)  # slow warm-up batches must not count

    def step():
        calls.append(1)
        clock.t += next(costs)
        return 10

    syncs = []
    r = timed_windows(step, seconds=1.0, warmup=3, windows=5, sync=lambda: syncs.append(clock.t), clock=clock)
    assert r["images_per_s"] == pytest.approx(100.0)  # 10 images per 0.1 s
    assert r["min"] == pytest.approx(100.0) and r["max"] == pytest.approx(100.0)
    assert r["batch_ms_p50"] == pytest.approx(100.0)
    assert r["whole_run_images_per_s"] == pytest.approx(100.0)
    assert len(syncs) == r["batches"] + 1  # synchronized before every clock read of a batch


def test_windows_report_spread_and_tail_latency():
    clock = FakeClock()
    pattern = iter(([0.1] * 9 + [1.0]) * 100)

    def step():
        clock.t += next(pattern)
        return 10

    r = timed_windows(step, seconds=5.0, warmup=0, windows=5, clock=clock, min_batches=10)
    assert r["min"] < r["images_per_s"] <= r["max"] * 1.0001
    assert r["whole_run_images_per_s"] == pytest.approx(r["images"] / r["seconds"])
    assert r["whole_run_images_per_s"] == pytest.approx(100 / 1.9)  # 10 images per batch, 1.9 s per 10 batches
    assert r["batch_ms_p99"] == pytest.approx(1000.0) and r["batch_ms_p50"] == pytest.approx(100.0)
    assert percentile([], 0.5) == 0.0 and bottleneck({"read": 1.0, "decode": 3.0, "x": None}) == "decode"


def _result():
    return {
        "schema": SCHEMA, "model": {"name": "resnet50", "doc": "d", "chains": MODELS["resnet50"].chains},
        "environment": {"gpu": "NVIDIA H200, 580", "cpu_model": "Xeon", "cpu_cores": 16, "cuda_runtime": "13.0",
                        "date": "2026-11-21", "command": "gpubatch bench --model resnet50"},
        "data": {"path": "/d", "kind": "synthetic", "images": 4096, "page_cache": "warm"},
        "settings": {"batch_size": 256, "seconds": 10, "windows": 5, "warmup_batches": 3},
        "results": {"train": {
            "gpubatch-gpu": {"images_per_s": 5000.0, "min": 4900.0, "max": 5100.0, "speedup_vs_cpu": 3.5,
                             "whole_run_images_per_s": 4950.0,
                             "gpu_mem_gib": 1.2, "gpu_util_pct": 40.0, "cpu_cores_used": 6.0, "batch_ms_p50": 50.0,
                             "batch_ms_p99": 60.0, "hw_decoder_share": 0.7, "bottleneck": "decode",
                             "fidelity": {"images": 16, "max_abs_diff": 3, "mean_abs_diff": 0.4, "units": "uint8 levels"},
                             "model": {"model": "resnet50", "model_alone_images_per_s": 3000.0,
                                       "model_plus_pipeline_images_per_s": 2900.0, "starved": False}},
            "gpubatch-cpu": {"images_per_s": 1400.0, "min": 1300.0, "max": 1500.0, "speedup_vs_cpu": 1.0},
            "dali": {"skipped": "nvidia.dali not importable"}}},
        "sweep": {"param": "batch_size", "chain": "train", "contender": "gpubatch-gpu",
                  "points": [{"value": 64, "images_per_s": 3000.0}, {"value": 256, "images_per_s": 5000.0}]},
    }


def test_reports_say_what_ran():
    r = _result()
    md = to_markdown(r)
    assert "| gpubatch-gpu | 5,000 | 4,900-5,100 | 4,950 | 3.5x | 1.20 GiB | 40% |" in md
    assert "| gpubatch-cpu | 1,400 | 1,300-1,500 | - | 1.0x |" in md  # a result from before the whole-run figure
    assert "dali | skipped: nvidia.dali not importable" in md and "max |diff| 3" in md and "the model is fed" in md
    assert "NVIDIA H200" in md and "warm-up batches excluded" in md and "## sweep batch_size" in md
    assert "GPU synchronized before every clock read" in md
    r["environment"]["gpu"] = None  # (a machine without one: the method says nothing of a GPU)
    assert "GPU synchronized" not in to_markdown(r) and "machine: no GPU" in to_markdown(r)
    r["environment"]["gpu"] = "NVIDIA H200"
    page = to_html(r)
    assert page.startswith("<!doctype html>") and page.count("<svg") == 2 and "<script" not in page
    assert "gpubatch-cpu" in page and "1,400" in page
    json.dumps(r)  # the schema is plain JSON
    plan = "under a 768 MiB cap: 338 MiB before the first batch (context 258), decode calls of at most 24 images"
    r["results"]["train"]["gpubatch-gpu"].update(gpu_memory_cap_mib=768, setting=plan)
    assert f"setting (gpubatch-gpu): {plan}" in to_markdown(r)  # the plan a capped run took


def test_model_verdict_accounts_for_the_pipelines_own_gpu_time():
    """--with-model: the ceiling both reach on one GPU adds the pipeline's GPU time per image (from its
    utilisation and speed) to the model's; the report says how much of the gap that explains."""
    from gpubatch.bench.contenders import model_sharing

    md = model_sharing(6000.0, 4300.0, 18500.0, 61.0)
    assert md["starved"] and abs(md["pipeline_gpu_us_per_image"] - 61.0 / 100 / 18500 * 1e6) < 1e-6
    assert abs(md["shared_ceiling_images_per_s"] - 1 / (1 / 6000 + 0.61 / 18500)) < 1e-6  # about 5,009
    assert model_sharing(6000.0, 5900.0, 18500.0, 61.0)["starved"] is False
    assert "shared_ceiling_images_per_s" not in model_sharing(6000.0, 4300.0, 18500.0, None)  # no NVML
    r = _result()
    r["results"]["train"]["gpubatch-gpu"]["model"] = {"model": "resnet50", **md}
    text = to_markdown(r)
    assert "model + pipeline 4,300: the model runs at 72% of its speed alone" in text
    assert "about 33 us of GPU time an image, which leaves both at most 5,009 images/s on one GPU (86% of that" in text


def test_sweep_parsing():
    assert parse_sweep("batch_size=64,128") == ("batch_size", [64, 128])
    assert parse_sweep("cuda-share=0.2,0.4") == ("cuda_share", [0.2, 0.4])
    assert parse_sweep("decode_chunk=0,96") == ("decode_chunk", [0, 96])
    assert parse_sweep("sync=auto,blocking") == ("sync", ["auto", "blocking"])
    assert parse_sweep("decode-route=split,hardware") == ("decode_route", ["split", "hardware"])
    for bad in ("nope=1", "batch_size=", "batch_size=a"):
        with pytest.raises(UsageError):
            parse_sweep(bad)


def test_cli_runs_on_the_cpu_and_writes_reports(tmp_path):
    from gpubatch.synthetic import make_jpeg_set

    data = make_jpeg_set(tmp_path / "jpegs", 24)
    r = run_cli("bench", "--model", "resnet50", "--data", data, "--batch-size", "8", "--seconds", "0.3",
                "--device", "cpu", "--baselines", "gpubatch-cpu,gpubatch-gpu", "--json", tmp_path / "r.json",
                "--report", tmp_path / "r.html", "--busy", "1")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["schema"] == SCHEMA and set(res["results"]) == {"train", "val"}
    assert res["settings"]["busy_processes"] == 1 and "1 busy processes (nice 19)" in r.stdout + r.stderr
    for chain in ("train", "val"):
        assert res["results"][chain]["gpubatch-cpu"]["images_per_s"] > 0
        assert set(res["results"][chain]["gpubatch-cpu"]["host_cpu"]) == {"others", "steal"}
        assert "no GPU" in res["results"][chain]["gpubatch-gpu"]["skipped"]
    assert {"gpu", "cpu_model", "cpu_cores", "versions", "command", "date"} <= set(res["environment"])
    assert "<svg" in (tmp_path / "r.html").read_text()


def test_a_dataset_gpubatch_wrote_benches_its_loader_against_the_format_s_readers(tmp_path, imagenet):
    from gpubatch.api import convert

    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=16)
    r = run_cli("bench", "--model", "resnet50", "--data", tmp_path / "wds", "--batch-size", "8", "--seconds", "0.3",
                "--device", "cpu", "--json", tmp_path / "r.json", "--report", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["data"]["kind"] == "a webdataset dataset gpubatch wrote" and res["data"]["format"] == "webdataset"
    assert res["data"]["images"] == 60 and "data: 60 records (a webdataset dataset gpubatch wrote)" in r.stdout + r.stderr
    for chain in ("train", "val"):
        got = res["results"][chain]
        assert set(got) == {"gpubatch-loader", "gpubatch-loader-cpu", "dali-reader", "webdataset-dataloader"}
        assert got["gpubatch-loader-cpu"]["images_per_s"] > 0 and got["gpubatch-loader-cpu"]["skipped_records"] == 0
        assert "no GPU" in got["gpubatch-loader"]["skipped"] and "no GPU" in got["dali-reader"]["skipped"]
    r = run_cli("bench", "--model", "decode-only", "--data", tmp_path / "wds")
    assert r.returncode == 2 and "measures the loader on --model resnet50" in r.stderr


def test_video_bench_runs_on_the_cpu(tmp_path):
    pytest.importorskip("av")
    from tests.video.clips import make_clip

    for k in range(3):
        make_clip(tmp_path / "clips" / f"c{k}.mp4", 70 + 5 * k, 320, 256)
    r = run_cli("bench", "--model", "video-clf", "--data", tmp_path / "clips", "--batch-size", "2", "--seconds", "0.3",
                "--device", "cpu", "--baselines", "gpubatch-cpu,gpubatch-gpu,dali", "--json", tmp_path / "r.json",
                "--report", tmp_path / "r.md")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())["results"]["train"]
    cpu = res["gpubatch-cpu"]
    assert cpu["clips_per_s"] > 0 and cpu["frames_per_s"] == pytest.approx(16 * cpu["clips_per_s"])
    assert "no GPU" in res["gpubatch-gpu"]["skipped"] and "no GPU" in res["dali"]["skipped"]
    assert "| clips/s |" in (tmp_path / "r.md").read_text()


def test_audio_bench_runs_on_the_cpu(tmp_path):
    from tests.audio.sounds import tone, write

    for k in range(4):
        write(tmp_path / "clips" / f"c{k}.flac", tone(1.0 + 0.5 * k, 44100, 300 + 50 * k), 44100)
    r = run_cli("bench", "--model", "audio-clf", "--data", tmp_path / "clips", "--batch-size", "2", "--seconds", "0.3",
                "--device", "cpu", "--baselines", "gpubatch-cpu,gpubatch-gpu,dali", "--json", tmp_path / "r.json",
                "--report", tmp_path / "r.html")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())["results"]["train"]
    assert res["gpubatch-cpu"]["clips_per_s"] > 0 and res["gpubatch-cpu"]["unit"] == "clips"
    assert "no GPU" in res["gpubatch-gpu"]["skipped"] and "no GPU" in res["dali"]["skipped"]
    page = (tmp_path / "r.html").read_text()
    assert "clips/s" in page and "decode workers" in page and "NVDEC" not in page
    ceiling = json.loads((tmp_path / "r.json").read_text())["data"]["decode_ceiling"]
    assert ceiling["clips_per_s"] > 0 and ceiling["ms_per_clip_one_core"] > 0 and ceiling["cores"] >= 1
    assert f"decode ceiling: {ceiling['clips_per_s']:,} clips/s" in page


@pytest.mark.parametrize("args,message", [
    (["--model", "vgg"], "unknown model 'vgg'"),
    (["--model", "whisper", "--synthetic", "4", "--baselines", "pyav-dataloader"], "unknown baseline"),
    (["--model", "video-clf", "--synthetic", "4", "--baselines", "torch-dataloader"], "unknown baseline"),
    ([], "bench needs --model"),
    (["--model", "resnet50"], "exactly one of --data PATH or --synthetic N"),
    (["--model", "resnet50", "--synthetic", "8", "--baselines", "caffe"], "unknown baseline 'caffe'"),
    (["--model", "resnet50", "--synthetic", "300", "--report", "x.pdf"], "give a .html or .md"),
    (["--model", "resnet50", "--synthetic", "300", "--decode-route", "fast"], "'fast' is not one of"),
    (["--model", "resnet50", "--synthetic", "300", "--busy-after", "2"], "--busy-after needs --busy N"),
    # refused before the bench runs, not after it (Linux's /proc holds no new folder)
    (["--model", "resnet50", "--synthetic", "300", "--json", "/proc/gpubatch-nowhere/r.json"], "cannot write it"),
    (["--model", "resnet50", "--synthetic", "300", "--report", "tests"], "give a .html or .md"),
])
def test_cli_errors(args, message):
    r = run_cli("bench", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_list_models():
    r = run_cli("bench", "--list-models")
    assert r.returncode == 0 and all(m in r.stdout for m in MODELS)


def test_synthetic_set_takes_a_chroma_mix(tmp_path):
    from collections import Counter

    from gpubatch.engine.codecs.headers import jpeg_header
    from gpubatch.synthetic import make_jpeg_set

    def kinds(root):
        return Counter(jpeg_header(p.read_bytes())[1] for p in sorted(root.rglob("*.jpg")))

    default = kinds(make_jpeg_set(tmp_path / "default", 48))
    assert set(default) == {"4:2:0", "4:2:2", "4:4:4"}
    two = make_jpeg_set(tmp_path / "two", 48, mix=(("4:2:0", 0.5), ("4:4:4", 0.5)))
    got = kinds(two)
    assert set(got) == {"4:2:0", "4:4:4"} and min(got.values()) >= 12
    assert len(list(two.glob(".complete-48-0-*"))) == 1  # a set of another mix is told apart from the default's
    assert kinds(make_jpeg_set(two, 48)) == default  # made again over it with the default mix
    make_jpeg_set(two, 24)  # fewer images, same seed and mix: the first 24 again, the 48's marker kept
    assert (two / ".complete-48-0").exists() and kinds(two) == default
    assert set(kinds(make_jpeg_set(two, 48, mix=(("4:2:0", 0.5), ("4:4:4", 0.5))))) == {"4:2:0", "4:4:4"}


def test_a_busy_machine_is_named_in_the_report():
    """Cores busy in other processes or taken by the hypervisor during a run get a note; an idle machine
    none."""
    r = _result()
    row = r["results"]["train"]["gpubatch-gpu"]
    row["host_cpu"] = {"others": 0.3, "steal": 0.0}
    assert "busy machine" not in to_markdown(r)
    row["host_cpu"] = {"others": 8.1, "steal": 0.2}
    assert "busy machine (gpubatch-gpu): 8.1 cores busy in other processes, 0.2 taken by the hypervisor" in to_markdown(r)
    row["decode_route"] = {"route": "hardware", "free_cores": 7.9}
    assert "decode route (gpubatch-gpu): hardware, chosen with 7.9 cores free" in to_markdown(r)
    row["decode_route"] = {"route": "split", "free_cores": 16.0, "switches": [[2.3, "hardware", 7.7]],
                           "batches": {"split": 33, "hardware": 364}}
    assert ("decode route (gpubatch-gpu): split, chosen with 16.0 cores free; followed the load: hardware at 2 s "
            "(7.7 cores free) (batches: split 33, hardware 364)") in " ".join(to_markdown(r).split())


def test_cpu_use_reads_the_whole_machine(monkeypatch):
    """CpuUse.host: the machine's busy cores less this process tree's, and the stolen ones, from
    /proc/stat's ticks over the run."""
    import gpubatch.bench.measure as m
    from gpubatch.engine.gpu import affinity

    ticks = iter([[1000, 5000, 10], [1000 + 900, 5000 + 700, 10 + 50]])  # over 1 s at 100 ticks/s
    clock = iter([0.0, 1.0])
    own = iter([2.0, 5.0])  # this tree: 3 cores
    monkeypatch.setattr(affinity, "cpu_ticks", lambda cpus=None: next(ticks))
    monkeypatch.setattr(affinity.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(affinity.HostLoad, "own_cpu", staticmethod(lambda: next(own)))
    monkeypatch.setattr("os.sysconf", lambda name: 100)
    use = m.CpuUse()
    assert use.stop() == 3.0
    assert use.host == {"others": 6.0, "steal": 0.5}


def test_host_cpu_ticks_reads_proc_stat():
    from gpubatch.engine.gpu.affinity import cpu_ticks as host_cpu_ticks

    t = host_cpu_ticks()
    if t is None:
        pytest.skip("no /proc/stat here")
    assert len(t) == 3 and all(isinstance(x, int) and x >= 0 for x in t) and t[0] + t[1] > 0


def test_cli_starts_the_busy_load_into_each_run(tmp_path):
    """--busy-after S: the busy processes start S seconds into each contender's run (the report says so)."""
    from gpubatch.synthetic import make_jpeg_set

    data = make_jpeg_set(tmp_path / "jpegs", 16)
    r = run_cli("bench", "--model", "resnet50", "--data", data, "--batch-size", "8", "--seconds", "0.2",
                "--device", "cpu", "--baselines", "gpubatch-cpu", "--json", tmp_path / "r.json",
                "--busy", "1", "--busy-after", "0.5")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["settings"]["busy_processes"], res["settings"]["busy_after_s"]) == (1, 0.5)
    assert "from 0.5 s into each contender's run (--busy-after)" in " ".join((r.stdout + r.stderr).split())
    assert all(res["results"][c]["gpubatch-cpu"]["images_per_s"] > 0 for c in ("train", "val"))


class _Load:
    """A stand-in load: when it was switched on and off (seconds of the monotonic clock)."""

    def __init__(self) -> None:
        self.on = self.off = None

    def __enter__(self):
        self.on = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.off = time.monotonic()


def test_run_beside_switches_the_load_on_and_off_inside_the_run():
    """run_beside: the load comes ``after`` seconds into the command and goes at ``until`` (or at its
    end); output larger than a pipe's buffer, written before the load came, is all kept; past the
    timeout the command is killed, the load switched off, and TimeoutExpired raised."""
    import subprocess
    import sys

    from gpubatch.bench.measure import run_beside

    talk = [sys.executable, "-c", "import sys, time; sys.stdout.write('x' * 300000); sys.stdout.flush(); time.sleep(1.2); print('end')"]
    load, t0 = _Load(), time.monotonic()
    p = run_beside(talk, load, after=0.4)
    t1 = time.monotonic()
    assert p.returncode == 0 and p.stdout == "x" * 300000 + "end\n"
    assert 0.4 <= load.on - t0 < 1.2 and load.off <= t1 and load.off - t0 >= 1.2
    load = _Load()
    t0 = time.monotonic()
    p = run_beside(talk, load, after=0.2, until=0.6)
    assert p.returncode == 0 and 0.2 <= load.on - t0 and 0.6 <= load.off - t0 < 1.2
    load = _Load()
    p = run_beside([sys.executable, "-c", "print('quick')"], load, after=5.0)
    assert p.stdout == "quick\n" and load.on is None  # it ended before the load was due
    load = _Load()
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_beside([sys.executable, "-c", "import time; time.sleep(30)"], load, after=0.1, timeout=0.8)
    assert load.on is not None and load.off is not None and time.monotonic() - t0 < 5


def test_busy_load_runs_its_processes_only_inside_the_block():
    from gpubatch.bench.measure import BusyLoad

    with BusyLoad(2) as load:
        procs = list(load.procs)
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs) and load.procs == []
    with BusyLoad(0) as load:
        assert load.procs == []
    with BusyLoad(1, "idle") as load:
        assert load.procs[0].poll() is None
    with pytest.raises(ValueError, match="one of nice, normal, idle"):
        BusyLoad(1, "fast")


def test_the_decode_ceiling_passes_over_what_libsndfile_does_not_read(tmp_path):
    from gpubatch.bench.audio import decode_ceiling
    from tests.audio.sounds import tone, write

    bad = tmp_path / "x.m4a"
    bad.write_bytes(b"\x00" * 64)
    assert "skipped" in decode_ceiling([bad], 0.1)
    good = [write(tmp_path / f"c{k}.flac", tone(0.5), 16000) for k in range(3)]
    c = decode_ceiling([bad, *good], 0.2)
    assert c["clips_per_s"] > 0 and c["cores"] >= 1


def test_a_contender_that_refuses_its_setting_reports_one_line(tmp_path):
    """A contender's own refusal (here: the GPU contender where no GPU is usable; on a GPU, a
    --gpu-memory below its minimum) comes back as its one line, not a traceback's last lines."""
    from gpubatch.bench.runner import run_contender
    from gpubatch.engine.device import gpu_problem

    if gpu_problem(0)[0] is None:
        pytest.skip("a usable GPU here: the GPU contender would run")
    res = run_contender({"contender": "gpubatch-gpu", "model": "resnet50", "chain": "train", "data": str(tmp_path),
                         "images": 4, "batch_size": 4, "seconds": 0.1}, timeout=120)
    assert res["error"].startswith("--device gpu:") and "\n" not in res["error"] and "Traceback" not in res["error"]


@pytest.mark.parametrize("width", [80, 100, 140])
def test_the_terminal_table_fits_80_and_100_columns_and_says_who_won(width):
    import io

    from rich.console import Console

    from gpubatch.bench.report import render_terminal

    r = _result()
    r["results"]["train"]["dali"] = {"images_per_s": 4700.0, "min": 4600.0, "max": 4800.0, "speedup_vs_cpu": 3.3,
                                     "gpu_mem_gib": 1.6, "gpu_util_pct": 50.0, "cpu_cores_used": 8.0,
                                     "batch_ms_p50": 54.0, "batch_ms_p99": 70.0, "bottleneck": "decode"}
    out = io.StringIO()
    render_terminal(r, Console(file=out, width=width, force_terminal=False, color_system=None))
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= width and "…" not in text
    assert all(h in text for h in ("img/s", "vs CPU", "GPU mem", "bound", "gpubatch-gpu", "dali", "5,000", "4,700"))
    assert "gpubatch-gpu is fastest: 5,000 images/s, 1.06x dali (4,700) at 0.75x its GPU memory; bound by decode" \
        in " ".join(text.split())
    assert ("(details)" in text) == (width < 120)  # a narrow terminal gets the details in a second table


def test_the_verdict_does_not_call_a_lone_contender_fastest():
    """On a machine without torch or a GPU only gpubatch-cpu runs: it was "fastest" of one."""
    from gpubatch.bench.report import verdict

    r = _result()
    for name in [n for n in r["results"]["train"] if n != "gpubatch-cpu"]:
        r["results"]["train"][name] = {"error": "skipped: not installed"}
    assert verdict(r, "train").startswith("gpubatch-cpu: 1,400 images/s (the only contender that ran)")
    assert verdict(_result(), "train").startswith("gpubatch-gpu is fastest: 5,000 images/s")


def test_the_html_report_has_a_verdict_and_labelled_axes():
    page = to_html(_result())
    assert "<p class='verdict'>gpubatch-gpu is fastest: 5,000 images/s, 3.57x gpubatch-cpu (1,400)" in page
    assert ">images/s</text>" in page and ">batch_size</text>" in page  # the axes' labels
    assert page.count("<line") >= 6  # the bars' axis and grid, the sweep's axes
    # a contender that did not run: its reason across the row, not wrapped in the images/s column
    assert "<tr><td>dali</td><td class='why' colspan='10'>skipped: nvidia.dali not importable</td></tr>" in page
    assert "<tr><td>gpubatch-cpu</td><td>1,400</td>" in page


def test_loader_alone_reads_a_dataset_in_its_own_process(tmp_path, imagenet):
    """benchmarks/loader_alone.py (the loader in one process, for py-spy): an untimed epoch, then batches for
    its seconds, the rate it read them at and the CPU cores it and its worker processes took."""
    import subprocess
    import sys
    from pathlib import Path

    from gpubatch.api import convert

    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=16)
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "loader_alone.py"
    r = subprocess.run([sys.executable, str(script), "--data", str(tmp_path / "wds"), "--seconds", "0.3",
                        "--batch-size", "8", "--device", "cpu", "--chain", "val"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rate, images = r.stdout.split(": ")[1].split(" images/s")[0], r.stdout.rsplit("(", 1)[1].split(" ")[0]
    cores = r.stdout.rsplit("; ", 1)[1].split(" CPU cores")[0]  # (this process and its workers, from /proc)
    assert float(rate) > 0 and int(images) >= 8 and float(cores) > 0


def test_ab_loader_times_trees_in_turned_rounds_and_tells_a_ratio_apart_only_where_its_interval_does(tmp_path,
                                                                                                      imagenet):
    """benchmarks/ab_loader.py: each contender (a tree, with settings after ``::``) once a round, its
    loader_alone.py run's rate as a JSON line; per contender beyond the first, the median of the rounds' ratios
    and a 90% interval of it, and the verdict by that interval (one that holds 1.0 tells nothing apart)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from gpubatch.api import convert

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from ab_loader import median_interval

    assert median_interval([1.1] * 6) == (1.1, 1.1)  # (every round the same: that ratio, told apart)
    lo, hi = median_interval([0.9, 1.1, 0.95, 1.05, 1.0, 0.98, 1.02, 1.01])
    assert lo < 1.0 < hi and median_interval([0.9, 1.1, 0.95, 1.05]) == median_interval([0.9, 1.1, 0.95, 1.05])

    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=16)
    out = tmp_path / "ab.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "ab_loader.py"), "--data", str(tmp_path / "wds"),
                        "--tree", str(root), "--tree", f"{root}::GPUBATCH_AB_LOADER_TEST=1", "--rounds", "2",
                        "--seconds", "0.2", "--batch-size", "8", "--device", "cpu", "--chain", "val", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    ref, other = report["trees"][str(root)], report["trees"][f"{root}::GPUBATCH_AB_LOADER_TEST=1"]
    assert report["reference"] == str(root) and "ratio_median" not in ref
    assert [x["round"] for x in ref["runs"]] == [x["round"] for x in other["runs"]] == [0, 1]
    assert all(x["images_per_s"] > 0 and x["images"] >= 8 for x in ref["runs"] + other["runs"])
    ratios = [x["images_per_s"] / y["images_per_s"] for x, y in zip(other["runs"], ref["runs"])]
    lo, hi = other["ratio_interval_90"]
    assert min(ratios) - 1e-3 <= lo <= other["ratio_median"] <= hi <= max(ratios) + 1e-3
    assert other["told_apart"] == (not lo <= 1.0 <= hi)
    assert "the first, 90% interval" in r.stdout and "(the reference)" in r.stdout


def test_ab_loader_with_dali_puts_its_reader_first_and_says_when_it_cannot_run(tmp_path, imagenet):
    """``ab_loader.py --dali``: DALI's reader of the format (``loader_alone.py --contender dali-reader``) is the
    first contender of every round, so one tree is enough; where DALI cannot run, the run stops on the first
    round with DALI's reason, not with a figure."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    from gpubatch.api import convert

    if importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None:
        pytest.skip("DALI is installed here: the reference runs (make gpu-test's machines)")
    root = Path(__file__).resolve().parents[2]
    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=16)
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "ab_loader.py"), "--data", str(tmp_path / "wds"),
                        "--tree", str(root), "--dali", "--rounds", "1", "--seconds", "0.2", "--batch-size", "8",
                        "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "dali-reader: exit" in r.stderr and "nvidia.dali not importable" in r.stderr, r.stderr
    one = subprocess.run([sys.executable, str(root / "benchmarks" / "ab_loader.py"), "--data", str(tmp_path / "wds"),
                          "--tree", str(root)], capture_output=True, text=True, timeout=120)
    assert one.returncode != 0 and "or one with --dali" in one.stderr


def test_a_tree_s_settings_may_hold_values_with_commas():
    """``ab_trees.py`` / ``ab_loader.py --tree PATH::VAR=VALUE,...``: a setting begins where ``NAME=`` does, so a
    comma-separated value (``GPUBATCH_CUDA_KINDS``) stays whole; a part that is no setting is refused."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from ab_trees import _contender

    name, tree, env = _contender(f"{root}::GPUBATCH_CUDA_KINDS=baseline/4:4:4,baseline/4:2:2,GPUBATCH_HW_RING=4")
    assert tree == root and env == {"GPUBATCH_CUDA_KINDS": "baseline/4:4:4,baseline/4:2:2", "GPUBATCH_HW_RING": "4"}
    assert name.endswith("::GPUBATCH_CUDA_KINDS=baseline/4:4:4,baseline/4:2:2,GPUBATCH_HW_RING=4")
    assert _contender(str(root)) == (str(root), root, {})
    assert _contender(f"{root}::GPUBATCH_HW_RING=4,four")[2] == {"GPUBATCH_HW_RING": "4,four"}  # (a value's comma)
    with pytest.raises(SystemExit, match="VAR=VALUE"):
        _contender(f"{root}::four")


def test_a_tree_may_carry_options_of_its_own():
    """``ab_trees.py --tree "PATH::VAR=VALUE++--gpu-procs 2"``: the options after ``++`` are that contender's
    alone, split as a shell would; a tree without them has none."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from ab_trees import _with_args

    assert _with_args(f"{root}::GPUBATCH_HW_RING=4++--gpu-procs 2 --ops 'resize(256)'") == (
        f"{root}::GPUBATCH_HW_RING=4", ["--gpu-procs", "2", "--ops", "resize(256)"])
    assert _with_args(str(root)) == (str(root), [])


def test_ab_trees_steps_list_each_trees_wall_timings_in_the_order_they_came():
    """``ab_trees.py --steps``: per tree its rate and runs, then its ``wall`` timings' medians sorted by when they came,
    the plan's and the finalize's (durations) left out."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from ab_trees import steps

    report = {"records": 4096, "date": "D", "trees": {"T": {"images_per_s": 2219.5, "runs": [1.82, 1.9], "timings_median": {
        "wall (worker): unit start": 0.16, "wall: plan": 0.02, "wall: first batch (from the run's start)": 0.97,
        "wall (worker): worker boot": -0.18, "decode": 3.0, "wall: finalize": 0.003}}}}
    lines = steps(report).splitlines()
    assert lines[1] == "T: 2,219.5 images/s (runs 1.820, 1.900 s)"
    assert [ln.split(None, 1)[1] for ln in lines[2:]] == [
        "wall (worker): worker boot", "wall (worker): unit start", "wall: first batch (from the run's start)"]


def test_convert_timeline_reports_when_records_were_written_and_what_the_end_waited_for(tmp_path):
    """``benchmarks/convert_timeline.py``: a run's records over time from its progress callback (every record
    counted, the marks in order, all before ``convert`` returned) and the main thread's stacks as spans."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import convert_timeline

    from gpubatch.synthetic import make_jpeg_set

    data = make_jpeg_set(tmp_path / "jpegs", 12)
    r = convert_timeline.one_run(data, {"to": "webdataset", "device": "cpu", "resize_shorter": 32,
                                        "center_crop": 24, "quality": 90})
    assert r["records"] == 12 and r["timings"]["wall: shards"] > 0
    marks = list(r["written_at"].values())
    assert None not in marks and marks == sorted(marks) and r["called"] <= marks[0] <= marks[-1] <= r["returned"]
    sampler = convert_timeline.Sampler(interval=0.001)
    time.sleep(0.05)
    sampler.stop()
    spans = sampler.spans(0.0, 1e9, least=0.0)
    assert spans and all(s >= 0 for _, s, _ in spans) and "test_bench.py" in " ".join(w for _, _, w in spans)


def test_cli_start_splits_the_commands_time_outside_its_run(imagenet, tmp_path):
    """``benchmarks/cli_start.py``: the command's points in the order they come, its run timed where the command
    itself calls it (nothing imported ahead of the command's own imports), and the time outside the run split into
    parts that add up to the process's whole time less the run's own seconds."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "start.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "cli_start.py"), "--runs", "1", "--plain", "--json", str(out),
                           "--", "convert", str(imagenet), str(tmp_path / "dst"), "--to", "webdataset", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(out.read_text())
    points = ["sniff", "prestart", "run begins", "run returned", "command returned", "exit handlers done",
              "process gone"]
    at = [got[p]["median_s"] for p in points]
    assert at == sorted(at) and at[0] < 0.5 * at[-1], at
    parts = got["outside the run (medians, s)"]
    whole = got["process gone"]["median_s"] - got["run's own seconds"]["median_s"]
    assert sum(parts.values()) == pytest.approx(whole, abs=0.002) and min(parts.values()) >= -0.001
    assert len(got["outside the run, the command as it is (s)"]) == 1 and got["outside the run, the command as it is (s)"][0] > 0
    assert (tmp_path / "dst").is_dir()  # (the command ran as it would)


def test_worker_gc_logs_every_process_s_collections(imagenet, tmp_path):
    """``benchmarks/worker_gc.py``: the command and each of its worker processes log their collections (the hook
    reaches spawned workers), the young ones counted, the full ones with when they came inside the run."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gc.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "worker_gc.py"), "--src", str(imagenet), "--runs", "1",
                           "--dst", str(tmp_path / "dst"), "--json", str(out), "--", "--to", "webdataset", "--workers", "2",
                           "--shard-size", "16",
                           "--resize-shorter", "32"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(out.read_text())["runs"][0]
    names = [n.split(" (")[0] for n in run["processes"]]
    assert "MainProcess" in names and sum(n.startswith("gpubatch-worker") for n in names) == 2, names
    for p in run["processes"].values():
        assert p["gen 0 (count, ms; as of its last line)"][0] > 0
        assert all(0 <= at <= run["wall_s"] and ms >= 0 for at, ms in p["gen 2 at s (ms)"])
    assert (tmp_path / "dst").is_dir()


def test_cpu_decode_scaled_crops_the_centre_and_names_its_missing_decoder(imagenet, tmp_path):
    """``benchmarks/cpu_decode_scaled.py``: the crop's box is the transcode's (centred, 224 of the shorter side's
    256), in a whole decode and in one scaled by M/8; without simplejpeg the script says so in one line."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    from PIL import Image

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import cpu_decode_scaled as m
    finally:
        sys.path.pop(0)
    x0, y0, x1, y1 = m._box(400, 300)
    assert (x0 + x1, y0 + y1) == pytest.approx((400, 300)) and x1 - x0 == pytest.approx(224 * 300 / 256)
    assert m._box(400, 300, 0.75) == pytest.approx(tuple(v * 0.75 for v in (x0, y0, x1, y1)))
    one = next(p for p in sorted(imagenet.rglob("*.jpg")) if min(Image.open(p).size) >= 224)
    assert m.pillow(one.read_bytes()).shape == (224, 224, 3)
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "cpu_decode_scaled.py"), "--src", str(imagenet),
                        "--images", "4", "--repeats", "1", "--json", str(tmp_path / "out.json")],
                       capture_output=True, text=True, timeout=300)
    if importlib.util.find_spec("simplejpeg") is None:
        assert r.returncode == 1 and r.stderr.strip() == "this trial needs simplejpeg: pip install simplejpeg"
    else:
        assert r.returncode == 0, r.stderr
        got = json.loads((tmp_path / "out.json").read_text())
        assert got["images"] == 4 and len(got["ms_per_image"]) == 8


def test_offcpu_sums_each_task_s_time_away_by_its_state_and_kernel_stack():
    """``benchmarks/offcpu.py``: from perf script's switch events, a task's time between its switch out and its next
    switch in, by state and the kernel frames below the scheduler's; the kernel's own threads left out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import offcpu
    finally:
        sys.path.pop(0)

    def switch(t, prev, pid, state, nxt, npid, frames):
        head = (f"{prev} {pid} [000] {t:.6f}: sched:sched_switch: prev_comm={prev} prev_pid={pid} prev_prio=120 "
                f"prev_state={state} ==> next_comm={nxt} next_pid={npid} next_prio=120")
        return [head] + [f"\tffffffff8224 {f}+0x10 ([kernel.kallsyms])" for f in ("__schedule", "schedule", *frames)] + [""]

    lines = (switch(1.0, "gpubatch", 7, "D", "swapper/0", 0, ["io_schedule", "folio_wait_writeback"])
             + switch(1.5, "swapper/0", 0, "R", "gpubatch", 7, ["schedule_idle"])
             + switch(2.0, "gpubatch", 7, "S", "kworker/0:1", 9, ["futex_do_wait"])
             + switch(2.25, "kworker/0:1", 9, "I", "gpubatch", 7, ["worker_thread"])
             + switch(3.0, "gpubatch", 7, "D", "swapper/0", 0, ["io_schedule", "folio_wait_writeback"])
             + switch(3.25, "swapper/0", 0, "R", "gpubatch", 7, ["schedule_idle"]))
    seconds, times = offcpu.off_cpu(lines)
    assert seconds == {("D", "io_schedule < folio_wait_writeback"): 0.75, ("S", "futex_do_wait"): 0.25}
    assert times[("D", "io_schedule < folio_wait_writeback")] == 2 and len(times) == 2


def test_bench_convert_runs_the_pass_through_in_each_sync_mode_beside_the_loop(tmp_path):
    """benchmarks/bench_convert.py's pass-through job (the targets' command) on a few images: each format in each
    --sync mode asked for, with its ratio to the tarfile loop measured in the same call."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "pt.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_convert.py"), "--images", "64", "--only",
                        "pass-through", "--repeats", "1", "--sync", "shard,off", "--data-root", str(tmp_path / "data"),
                        "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    job = json.loads(out.read_text())["jobs"]["pass-through"]
    assert job["records"] == 64 and job["tarfile_loop_records_per_s"] > 0
    for fmt in ("webdataset", "tfrecord", "recordio", "lmdb"):
        for key in (fmt, f"{fmt} --sync off"):
            assert job[key]["records_out"] == 64 and job[key]["ratio"] > 0, key
    # the disk alone: webdataset's shards' bytes written and fsynced with nothing else to do, beside the loop
    assert job["output_bytes"] > 64 * 1000 and job["disk_alone_s"] > 0 and job["ratio_ceiling_by_disk"] > 0


def test_bench_convert_times_the_audio_features_each_run_from_an_empty_output(tmp_path, monkeypatch):
    """benchmarks/bench_convert.py's audio job (here its CPU path: no GPU): each timed run starts with the previous
    run's output removed and the disk synced outside its time (``fresh``), as the pass-through's and the baselines'
    runs do, so that no run pays for deleting the last one's features; the disk alone is timed with a writing thread
    a core."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("bench_convert", root / "benchmarks" / "bench_convert.py")
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    seen: list = []
    plain_timed = bc.timed

    def timed(cmd, repeats, before=None, **kw):
        out = Path(cmd[cmd.index("convert") + 2])
        seen.append((out, before))

        def checked():
            before()
            assert not out.exists()  # (removed before the run is timed)
        return plain_timed(cmd, repeats, before=checked, **kw)

    monkeypatch.setattr(bc, "timed", timed)
    plain_writes, writers = bc.durable_writes, []

    def durable_writes(out, sizes, **kw):
        writers.append(kw.get("writers", 1))
        return plain_writes(out, sizes, **kw)

    monkeypatch.setattr(bc, "durable_writes", durable_writes)
    monkeypatch.setattr(bc, "cores", lambda: 3)
    a = SimpleNamespace(data_root=tmp_path / "data", clips=4, gpu=False, gpu_only=False, sync="shard", repeats=2)
    job = bc.job_audio(a, tmp_path)
    assert job["clips"] == 4 and job["cpu"]["records_out"] == 4 and len(job["cpu"]["runs"]) == 2
    assert [o.name for o, b in seen] == ["audio-cpu"] and seen[0][1] is not None
    # the disk alone: the output's bytes (the last run's files) written and fsynced with nothing else to do
    out = tmp_path / "audio-cpu"
    assert job["output_bytes"] == sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) > 4 * 80 * 3000 * 2
    assert job["disk_alone_s"] > 0 and not (tmp_path / "disk-alone").exists()
    assert writers == [3, 3]  # (a thread a core, as many as any run's writers: the disk's floor, not one writer's)


def test_bench_convert_times_audio_pipeline_warm_and_as_a_whole_process(tmp_path):
    """benchmarks/bench_convert.py's AudioPipeline baseline (here on the CPU): warm, the median of passes after an
    untimed one; and as ``convert`` is timed, whole processes from their start, whose start makes them slower."""
    import importlib.util
    from pathlib import Path

    from gpubatch.synthetic import make_audio_set

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("bench_convert", root / "benchmarks" / "bench_convert.py")
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    data = tmp_path / "flac"
    make_audio_set(data, 4, seconds=(1.0, 1.0), fmt="flac", workers=1)
    warm = bc.audio_pipeline(data, device="cpu")
    whole = bc.audio_pipeline(data, whole=2, device="cpu")
    assert 0 < whole < warm
