"""A GPU run's workers started at the ``gpubatch`` command's start, from its arguments alone
(``execute.early.sniff``), before it imports its options' parser: the guess, and what becomes of the processes
(the run takes them where they fit, with its kernels; they end otherwise). CPU tests: no CUDA here, so the
workers' start finds none and ends; the machine is told it has a GPU node where a test needs the guess acted on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpubatch.engine.execute import early
from gpubatch.engine.gpu.chain import kernels_needed
from gpubatch.engine.plan import make_plan
from gpubatch.engine.processes import cores
from tests.engine.test_shards import digest
from tests.helpers import ROOT, all_ended, cli_script

PIXELS = ["--to", "webdataset", "--resize-shorter", "40", "--center-crop", "32"]


#: an audio run's processes a GPU where --gpu-procs is not given: two on a host of 8 cores or more (Strategy.wide)
AUDIO_PROCS = 2 if cores() >= 8 else 1
#: a host run's processes where --workers is not given: a core each
HOST_PROCS = cores()


@pytest.mark.parametrize(("args", "guess"), [
    (["convert", "s", "d", *PIXELS], ("image", 0, 1)),
    (["--debug", "convert", "s", "d", *PIXELS, "--device", "gpu"], ("image", 0, 1)),
    (["convert", "s", "d", *PIXELS, "--device=GPU", "--gpu", "1"], ("image", 1, 1)),
    (["convert", "s", "d", *PIXELS, "--gpu=2", "--gpu-procs", "2"], ("image", 2, 2)),
    (["convert", "s", "d", "--to", "tfrecord", "--quality", "90"], ("image", 0, 1)),
    (["convert", "s", "d", "--to", "tfrecord", "--image-format", "png"], ("image", 0, 1)),
    (["augment", "s", "d", "--ops", "hflip(p=0.5)"], ("image", 0, 1)),
    (["convert", "s", "d", "--to", "tfrecord"], ("host", 0, HOST_PROCS)),  # (a pass-through: on the host)
    (["convert", "s", "d", "--to", "tfrecord", "--image-format", "keep", "--device", "gpu"], ("host", 0, HOST_PROCS)),
    (["convert", "s", "d", *PIXELS, "--device", "cpu"], ("host", 0, HOST_PROCS)),
    (["convert", "s", "d", *PIXELS, "--device", "cpu", "--workers", "3"], ("host", 0, 3)),
    (["convert", "s", "d", *PIXELS, "--device", "cpu", "--workers=1"], None),  # (the run works in its own process)
    (["convert", "s", "d", *PIXELS, "--device", "cpu", "--workers", "x"], None),
    (["convert", "s", "d", "--to", "tfrecord", "--executor", "ray"], None),
    (["convert", "s", "d", *PIXELS, "--gpus", "all"], None),
    (["convert", "s", "d", *PIXELS, "--executor", "ray"], None),
    (["convert", "s", "d", *PIXELS, "--num-parts", "2", "--part", "0"], None),
    (["convert", "s", "d", *PIXELS, "--frames", "every:4"], ("video", 0, 1)),
    (["convert", "s", "d", "--to", "webdataset", "--clip-length", "16", "--gpu", "1"], ("video", 1, 1)),
    (["convert", "s", "d", "--frames", "every:4", "--gpu-procs", "2"], None),  # (one queue: a run takes one only)
    (["convert", "s", "d", "--frames", "every:4", "--gpu-memory", "1GiB"], None),  # (its plan measures the context)
    (["convert", "s", "d", "--frames", "every:4", "--device", "cpu"], ("host", 0, HOST_PROCS)),
    (["convert", "s", "d", "--to", "webdataset", "--sample-rate", "16000"], ("audio", 0, AUDIO_PROCS)),
    (["convert", "s", "d", "--to", "webdataset", "--features", "log-mel", "--gpu", "1", "--gpu-procs", "3"],
     ("audio", 1, 3)),
    (["augment", "s", "d", "--ops", "gain(db=3)", "--audio-format", "flac"], ("audio", 0, AUDIO_PROCS)),
    (["convert", "s", "d", "--features", "log-mel", "--gpu-memory", "1GiB"], None),  # (its plan measures the context)
    (["convert", "s", "d", "--features", "log-mel", "--device", "cpu"], ("host", 0, HOST_PROCS)),
    (["convert", "s", "d", "--features", "log-mel", "--frames", "every:4"], None),
    (["convert", "s", "d", *PIXELS, "--help"], None),
    (["augment", "--list-ops"], None),
    (["convert", "s", "d", *PIXELS, "--gpu", "one"], None),  # (the options' parser says what is wrong)
    (["info", "s"], None),
    ([], None),
])
def test_the_commands_arguments_say_whether_a_gpu_runs_workers_start_at_once(args, guess):
    if guess is not None and guess[0] == "host" and guess[2] < 2:  # (a host of one core: the run's own process)
        guess = None
    assert early.guessed(args, gpu_here=True) == guess


@pytest.mark.parametrize("args", [["convert", "s", "d", *PIXELS], ["augment", "s", "d", "--ops", "hflip(p=0.5)"],
                                  ["convert", "s", "d", "--to", "webdataset", "--features", "log-mel"]])
def test_on_a_machine_without_a_gpu_every_run_guesses_the_host(args):
    """``--device auto`` where the machine has no GPU node: the run is the host unit's, a core each."""
    assert early.guessed(args, gpu_here=False) == (("host", 0, HOST_PROCS) if HOST_PROCS > 1 else None)
    assert early.guessed([*args, "--device", "gpu"], gpu_here=False) == early.guessed([*args, "--device", "gpu"],
                                                                                       gpu_here=True)


def _cli(args: list[str], node: bool) -> dict:
    """``gpubatch ARGS`` as the command (the sniff at its start), in a process of its own, told it has a GPU
    node where ``node``: which processes the sniff started, and which of them the run took."""
    script = f"""
import json, sys
from gpubatch.engine.execute import early, local
early.gpu_node = lambda: {node}
sys.argv = ["gpubatch", *{args!r}]
import gpubatch.cli as cli
sniffed = [p.pid for s in early._SNIFFED for p in s.procs]
taken = []
plain = local.Started.taking.__func__
local.Started.taking = classmethod(lambda cls, *a: taken.append(plain(cls, *a)) or taken[-1])
try:
    cli.main()
finally:
    print(json.dumps({{"sniffed": sniffed, "taken": [p.pid for s in taken for p in s.procs],
                      "kernels": [list(map(list, getattr(e, "kernels", ()))) for s in taken for e, _ in s.boots]}}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.no_gpu
def test_workers_started_at_the_commands_start_are_taken_by_its_run_and_the_bytes_do_not_change(imagenet, tmp_path):
    """Told it has a GPU node, the command starts a GPU image run's worker at once; ``--device auto`` takes it
    (the options checked: it fits, and is told its chain's kernels), then finds no usable GPU here and runs on the
    CPU: the bytes are those of a run where nothing was started ahead."""
    chain = ["--to", "webdataset", "--resize-shorter", "40", "--center-crop", "32", "--shard-size", "20", "--quiet"]
    seen = _cli(["convert", str(imagenet), str(tmp_path / "sniffed"), *chain], node=True)
    assert len(seen["sniffed"]) == 1 and seen["taken"] == seen["sniffed"]
    want = [list(map(list, kernels_needed(make_plan(40, 32).ops, encode=True)))]
    assert seen["kernels"] == want and want[0]
    plain = _cli(["convert", str(imagenet), str(tmp_path / "plain"), *chain, "--device", "cpu"], node=False)
    assert len(plain["sniffed"]) == (HOST_PROCS if HOST_PROCS > 1 else 0) and plain["taken"] == plain["sniffed"]
    assert digest(tmp_path / "sniffed") == digest(tmp_path / "plain")


def test_a_host_runs_workers_forked_at_the_commands_start_are_taken_and_those_it_needs_not_end(imagenet, tmp_path):
    """A pass-through (the host unit's on any machine) forks ``--workers`` processes at the command's start; its
    run takes them, the one its two shards leave idle ends with the others, and the bytes are those of a run that
    started its workers after the plan."""
    from gpubatch.api import convert

    chain = ["--to", "tfrecord", "--shard-size", "30", "--workers", "3", "--quiet"]
    seen = _cli(["convert", str(imagenet), str(tmp_path / "sniffed"), *chain], node=False)
    assert len(seen["sniffed"]) == 3 and seen["taken"] == seen["sniffed"]
    convert(imagenet, tmp_path / "plain", to="tfrecord", shard_size=30, workers=3)
    assert digest(tmp_path / "sniffed") == digest(tmp_path / "plain")
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in seen["sniffed"]):
        assert time.monotonic() < deadline, "a worker forked at the command's start outlived it"
        time.sleep(0.05)


def test_a_pass_throughs_command_imports_neither_numpy_nor_the_digest(imagenet, tmp_path):
    """The command's own process of a pass-through needs neither NumPy, the ops, the codecs, the ``crc32c`` package
    nor ``ctypes.util`` (together 50-120 ms of its start on the CI machine): its workers read, check, digest and frame
    the records. Every format's shards are still read back whole."""
    script = cli_script("", 'sorted(m for m in ("numpy", "crc32c", "ctypes.util", "gpubatch.engine.codecs.image", '
                            '"gpubatch.engine.ops.geometry") if m in sys.modules)')
    for to in ("webdataset", "tfrecord", "recordio", "lmdb"):
        args = ["convert", str(imagenet), str(tmp_path / to), "--to", to, "--workers", "2", "--shard-size", "20", "--quiet"]
        done = subprocess.run([sys.executable, "-c", script.replace("ARGS", repr(args))], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        # (RecordIO's finalize writes its .idx files through a digested file: that command imports crc32c)
        assert json.loads(done.stdout.strip().splitlines()[-1]) == (["crc32c"] if to == "recordio" else []), to
        from gpubatch.api import open_dataset

        with open_dataset(tmp_path / to) as ds:
            assert sum(1 for _ in ds) == 60


#: (sample_data's folder, the files taken, the options) of an audio and a video run, and their processes a GPU
_MEDIA_RUNS = {
    "audio": ("audio", None, ["--sample-rate", "16000", "--mono", "--duration", "1", "--features", "log-mel(n_mels=40)"],
              AUDIO_PROCS),
    "video": ("video", "clip_0_h264.mp4", ["--frames", "every:24", "--resize-shorter", "32"], 1),
}


@pytest.mark.no_gpu
@pytest.mark.parametrize("media", sorted(_MEDIA_RUNS))
def test_an_audio_or_video_commands_workers_started_at_its_start_end_when_it_runs_on_the_cpu(tmp_path, media):
    """Told it has a GPU node, an audio ``convert`` starts a GPU audio run's workers at once (their boot forks their
    decoding processes), a video one its one worker; ``--device auto`` finds no usable GPU here and runs on the CPU,
    which takes none of them: they end, and the bytes are those of a run where nothing was started ahead. (On the
    GPU a video run takes its worker: tests/video/test_video_gpu.py.)"""
    import shutil

    folder, only, options, procs = _MEDIA_RUNS[media]
    if media == "video":
        pytest.importorskip("av")
    src = tmp_path / folder
    if only is None:
        shutil.copytree(ROOT / "sample_data" / folder, src)
    else:
        src.mkdir()
        shutil.copy(ROOT / "sample_data" / folder / only, src)
    chain = ["--to", "webdataset", *options, "--quiet"]
    seen = _cli(["convert", str(src), str(tmp_path / "sniffed"), *chain], node=True)
    assert len(seen["sniffed"]) == procs and seen["taken"] == []
    plain = _cli(["convert", str(src), str(tmp_path / "plain"), *chain, "--device", "cpu"], node=False)
    assert plain["taken"] == plain["sniffed"]  # (the host unit's: a core each)
    assert list((tmp_path / "sniffed").glob("*.tar")) and digest(tmp_path / "sniffed") == digest(tmp_path / "plain")
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in seen["sniffed"]):
        assert time.monotonic() < deadline, "a worker started at the command's start outlived it"
        time.sleep(0.05)


def _state(pid: int) -> str:
    """A process's state letter (``/proc/PID/stat``), "" where it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_workers_started_at_the_commands_start_end_where_its_run_is_not_theirs(imagenet, tmp_path):
    """A guess the command does not bear out costs the processes only: a run that fails after taking them ends
    them with it; a usage error before its options are checked ends them at the command's exit, which does not
    wait for them; the command's outcome is its own."""
    script = """
import sys, time
from gpubatch.engine.execute import early
early.gpu_node = lambda: True
sys.argv = ["gpubatch", *ARGS]
import gpubatch.cli as cli
procs = [p for s in early._SNIFFED for p in s.procs]
assert len(procs) == 1, procs
print("pid", procs[0].pid, flush=True)
try:
    cli.main()
finally:
    from tests.helpers import all_ended
    print("ended", all_ended(procs), flush=True)
"""
    pixels = ["--to", "webdataset", "--resize-shorter", "40", "--quiet"]
    for args, code, said, ended in (
            ([str(imagenet), str(tmp_path / "a"), *pixels, "--limit", "0"], 1, "converts no record", "ended True"),
            ([str(imagenet), str(tmp_path / "b"), *pixels, "--on-error", "bogus"], 2, "--on-error", "ended False")):
        done = subprocess.run([sys.executable, "-c", script.replace("ARGS", repr(["convert", *args]))], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == code and said in done.stderr, (done.returncode, done.stderr[-2000:])
        assert ended in done.stdout, done.stdout  # (a usage error: still running when the command's code ended)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # (one line: no traceback, no warning)


def test_a_sniffed_worker_takes_its_kernels_before_its_run_and_ends_when_it_has_none(monkeypatch):
    """The protocol on a worker's run queue: the kernels first (``boot.KERNELS``, compiled after its context is
    made), then its run, or None: it ends, cleanly, having waited for neither."""
    from gpubatch.api import ConvertRequest

    monkeypatch.setattr(early, "gpu_node", lambda: True)
    monkeypatch.delenv("GPUBATCH_EARLY_START", raising=False)
    early.sniff(["convert", "s", "d", *PIXELS])
    sniffed = early._SNIFFED[0]
    started = early.prestart(ConvertRequest(src="s", dst="d", to="webdataset", resize_shorter=40, center_crop=32),
                             make_plan(40, 32))
    try:
        assert started.procs == sniffed.procs and not early._SNIFFED
        assert [e.kernels for e, _ in started.boots] == [kernels_needed(make_plan(40, 32).ops, encode=True)]
        started.setups[0].put(None)
        assert all_ended(started.procs) and started.procs[0].exitcode == 0
    finally:
        started.close()


def test_a_sniffed_worker_that_does_not_fit_the_run_ends_and_the_run_starts_its_own(monkeypatch):
    from gpubatch.api import ConvertRequest

    monkeypatch.setattr(early, "gpu_node", lambda: True)
    monkeypatch.delenv("GPUBATCH_EARLY_START", raising=False)
    early.sniff(["convert", "s", "d", *PIXELS])  # (GPU 0, one process)
    sniffed = early._SNIFFED[0].procs
    started = early.prestart(ConvertRequest(src="s", dst="d", to="webdataset", resize_shorter=40, gpu_procs=2),
                             make_plan(40))
    try:
        assert len(started.procs) == 2 and not set(started.procs) & set(sniffed)
        assert all_ended(sniffed)
    finally:
        started.close()
    early.sniff(["convert", "s", "d", *PIXELS])
    sniffed = early._SNIFFED[0].procs
    assert early.prestart(ConvertRequest(src="s", dst="d", to="webdataset", resize_shorter=40, device="cpu"),
                          make_plan(40)) is None
    assert all_ended(sniffed) and not early._SNIFFED


def test_a_sniffed_audio_run_keeps_its_workers_for_the_run_which_takes_them(monkeypatch):
    """An audio run's workers started at the command's start (its decoding processes and warm-up: ``Early.decoders``,
    ``Early.warm``) outlive ``prestart`` (an image run's), and the run takes them once it knows its device and media
    (``started_early``), as many as it would start; a run over image records does not, and they end."""
    from gpubatch.api import ConvertRequest, audio_ops
    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.gpu import start
    from gpubatch.engine.plan import Plan

    monkeypatch.setattr(early, "gpu_node", lambda: True)
    monkeypatch.delenv("GPUBATCH_EARLY_START", raising=False)
    args = ["convert", "s", "d", "--to", "webdataset", "--features", "log-mel(n_mels=80)"]
    req = ConvertRequest(src="s", dst="d", to="webdataset", features="log-mel(n_mels=80)")
    plan = Plan(ops=audio_ops(features="log-mel(n_mels=80)"), media="audio")
    gpu = Device(DeviceKind.GPU, 0, reason="test")
    early.sniff(args)
    sniffed = early._SNIFFED[0]
    assert sniffed.kind == "audio" and len(sniffed.procs) == AUDIO_PROCS
    assert [e for e, _ in sniffed.begun] == [start.Early(0, early.run_settings(True), sync=False, library=False,
                                                         decoders=start.audio_decoders(AUDIO_PROCS), warm="audio")] * AUDIO_PROCS
    assert early.prestart(req, plan) is None and early._SNIFFED == [sniffed]  # (not an image run's: kept)
    started = early.started_early(req, False, plan, gpu, early.run_settings(True))
    try:
        assert started.procs == sniffed.procs and not early._SNIFFED
    finally:
        started.close()
    assert all_ended(sniffed.procs)
    early.sniff(args)
    sniffed = early._SNIFFED[0].procs
    image = ConvertRequest(src="s", dst="d", to="webdataset", resize_shorter=40)
    started = early.started_early(image, False, make_plan(40), gpu, early.run_settings(True))
    try:
        assert not set(started.procs) & set(sniffed) and all_ended(sniffed) and not early._SNIFFED
    finally:
        started.close()


def test_host_workers_sniffed_for_a_run_that_proves_a_gpus_end_and_the_run_starts_its_own(monkeypatch):
    """A host guess (here: no GPU node seen) whose run proves to be a GPU image run: the host workers end, and the
    run starts its GPU workers afresh."""
    from gpubatch.api import ConvertRequest
    from gpubatch.engine.device import Device, DeviceKind

    monkeypatch.setattr(early, "gpu_node", lambda: False)
    monkeypatch.delenv("GPUBATCH_EARLY_START", raising=False)
    early.sniff(["convert", "s", "d", *PIXELS, "--workers", "2"])
    sniffed = early._SNIFFED[0].procs
    assert early._SNIFFED[0].kind == "host" and len(sniffed) == 2
    gpu = Device(DeviceKind.GPU, 0, reason="test")
    image = ConvertRequest(src="s", dst="d", to="webdataset", resize_shorter=40)
    started = early.started_early(image, False, make_plan(40), gpu, early.run_settings(True))
    try:
        assert started.strategy.gpu and not set(started.procs) & set(sniffed)
        assert all_ended(sniffed) and not early._SNIFFED
    finally:
        started.close()


def test_no_gpu_run_is_sniffed_where_the_machine_has_no_gpu_node_and_nothing_where_it_is_turned_off(monkeypatch):
    monkeypatch.setattr(early, "gpu_node", lambda: False)
    early.sniff(["convert", "s", "d", *PIXELS])
    assert [s.kind for s in early._SNIFFED] == (["host"] if HOST_PROCS > 1 else [])  # (the CPU's: a core each)
    procs = [p for s in early._SNIFFED for p in s.procs]
    early.close_sniffed()
    assert all_ended(procs) and not early._SNIFFED
    monkeypatch.setattr(early, "gpu_node", lambda: True)
    monkeypatch.setenv("GPUBATCH_EARLY_START", "0")
    early.sniff(["convert", "s", "d", *PIXELS])
    assert not early._SNIFFED
    monkeypatch.delenv("GPUBATCH_EARLY_START")
    monkeypatch.setenv("GPUBATCH_DECODE_ROUTE", "bogus")  # (a bad setting: the command's to report, not the guess's)
    early.sniff(["convert", "s", "d", *PIXELS])
    assert not early._SNIFFED


def test_the_commands_start_forks_its_workers_where_it_may_and_they_run_as_spawned_ones_would(tmp_path):
    """At the command's start (one thread, no CuPy) the sniffed workers are forked, not spawned
    (``GPUBATCH_EARLY_FORK=0`` spawns them); a forked one gets Python's own Ctrl-C handler back and glibc's malloc
    settings, as a spawned one has them; a process with a second thread spawns."""
    script = """
import os, signal, sys, threading
from gpubatch.engine import processes
from gpubatch.engine.execute import early
early.gpu_node = lambda: True
if sys.argv[1] == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
signal.signal(signal.SIGINT, lambda *a: None)  # (the command's start handler)
early.sniff(["convert", "s", "d", "--to", "webdataset", "--resize-shorter", "40"])
print(type(early._SNIFFED[0].procs[0]._popen).__module__)
early.close_sniffed()
from gpubatch.engine import device
for t in device._AHEAD.values():  # (the sniff's device probe, a thread begun after its forks: this test forks again)
    t.join()

def child(q):
    processes.as_spawned()
    q.put(signal.getsignal(signal.SIGINT) is signal.default_int_handler)

import multiprocessing as mp
q = mp.get_context("fork").Queue()
p = mp.get_context("fork").Process(target=child, args=(q,))
p.start()
print("default handler", q.get())
p.join()
"""
    import os

    seen = {}
    for how, env in (("plain", {}), ("off", {"GPUBATCH_EARLY_FORK": "0"}), ("thread", {})):
        done = subprocess.run([sys.executable, "-c", script, how], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr[-2000:]
        seen[how] = done.stdout.split()
    assert seen["plain"][0] == "multiprocessing.popen_fork" and seen["plain"][-1] == "True"
    assert seen["off"][0] == seen["thread"][0] == "multiprocessing.popen_spawn_posix"
