"""``--sync shard|end|off``: when a run makes what it writes durable. The same bytes in every mode; each
mode fsyncs what it says, in the command and in its worker processes; a resume in another boot of the
machine reads back what was not synced and writes again what the disk lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubatch import _commit
from gpubatch.api import convert
from gpubatch.errors import GpubatchError, UsageError
from tests.engine.test_shards import FORMATS, digest
from tests.helpers import ROOT, child_env


@pytest.fixture(autouse=True)
def _mode_restored():
    yield
    _commit.set_sync("shard")


@pytest.mark.parametrize("to", FORMATS)
def test_every_sync_mode_writes_the_same_bytes(imagenet, coco, tmp_path, to):
    src = coco if to == "coco" else imagenet
    got = {}
    for mode in _commit.SYNC_MODES:
        out = tmp_path / mode
        s = convert(src, out, to=to, shard_size=3 if to == "coco" else 5, workers=2, sync=mode)
        assert s.records_out > 0 and ("wall: sync" in s.timings) == (mode == "end")
        got[mode] = digest(out)
        assert json.loads((out / "gpubatch.json").read_text())["records"] == s.records_out
    assert got["shard"] == got["end"] == got["off"]


def test_an_unknown_mode_is_refused_in_one_line(imagenet, tmp_path):
    with pytest.raises(UsageError, match="unknown sync 'never'; supported: shard, end, off"):
        convert(imagenet, tmp_path / "out", to="webdataset", sync="never")
    assert not (tmp_path / "out").exists()


def test_the_commit_helpers_fsync_only_where_the_mode_says(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    for mode, each, final in (("shard", True, True), ("end", False, True), ("off", False, False)):
        calls.clear()
        with _commit.sync_as(mode):
            f = _commit.ShardFile(tmp_path, f"{mode}.bin")
            f.write(b"x" * 10)
            f.commit()
            _commit.write_json(tmp_path / f"{mode}.json", {"a": 1})
            _commit.fsync_dir(tmp_path)
            n_each = len(calls)
            _commit.fsync_dir(tmp_path, final=True)
        assert n_each == (3 if each else 0), mode
        assert len(calls) - n_each == (1 if final else 0), mode
        assert (tmp_path / f"{mode}.bin").read_bytes() == b"x" * 10
    assert _commit.sync_mode() == "shard"  # (the block's mode, undone after it)


SPY = """
import os, sys
log = os.environ["SYNC_SPY_LOG"]
def spy(name, real):
    def call(*a):
        with open(f"{log}.{os.getppid()}.{os.getpid()}", "a") as f:
            f.write(name + "\\n")
        return real(*a)
    return call
os.fsync = spy("fsync", os.fsync)
"""


@pytest.mark.parametrize("mode", ["shard", "off"])
def test_worker_processes_sync_as_the_command_says(imagenet, tmp_path, mode):
    """Each worker takes the run's mode from its shards' options: under ``off`` no process of the run
    fsyncs, under ``shard`` the workers fsync what they commit."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SPY)
    log = tmp_path / "log"
    env = child_env(site, SYNC_SPY_LOG=str(log))
    p = subprocess.run([sys.executable, "-m", "gpubatch", "convert", str(imagenet), str(tmp_path / "out"), "--to",
                        "webdataset", "--shard-size", "4", "--workers", "2", "--sync", mode, "-q"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    calls = {f.name: f.read_text().split() for f in tmp_path.glob("log.*")}  # (a process's: log.<parent>.<pid>)
    if mode == "off":
        assert not calls, calls
    else:  # the workers (one may take every shard on a busy machine), each shard's file and journal entry at least
        workers = {name: c for name, c in calls.items() if name.split(".")[1] != str(os.getpid())}  # (not the command)
        assert workers and sum(map(len, workers.values())) >= 2 * 15, calls


def _interrupted(src: Path, dst: Path, monkeypatch, **kw) -> Path:
    """A run stopped after every shard is committed, before finalize: its staging folder."""
    import gpubatch.runner as runner

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "sweep_partials", stop)
    with pytest.raises(KeyboardInterrupt):
        convert(src, dst, **kw)
    monkeypatch.undo()
    stage = dst.parent / f".{dst.name}.gpubatch-partial"
    assert stage.is_dir() and not dst.exists()
    return stage


def _entries(stage: Path) -> list[Path]:
    return sorted((stage / ".gpubatch" / "journal").glob("*.json"))


def test_a_resume_in_another_boot_reads_back_what_was_not_synced(imagenet, tmp_path, monkeypatch):
    kw = {"to": "webdataset", "shard_size": 5, "workers": 2}
    convert(imagenet, tmp_path / "whole", **kw)
    stage = _interrupted(imagenet, tmp_path / "out", monkeypatch, sync="off", **kw)
    entries = _entries(stage)
    assert len(entries) >= 3
    assert {json.loads(e.read_text())["unsynced"] for e in entries} == {_commit.boot_id() or "unknown"}
    for e in entries:  # the machine restarted since
        e.write_text(json.dumps({**json.loads(e.read_text()), "unsynced": "another-boot"}))
    lost = stage / next(iter(json.loads(entries[1].read_text())["files"]))
    size = lost.stat().st_size
    lost.write_bytes(b"\0" * size)  # (the disk kept its size, not its pages)
    s = convert(imagenet, tmp_path / "out", resume=True, **kw)
    said = [w for w in s.warnings if w.startswith("--resume:")]
    assert said and said[0].startswith(f"--resume: {len(entries) - 1} of {len(entries)} shards"), s.warnings
    assert digest(tmp_path / "out") == digest(tmp_path / "whole")


def test_a_resume_in_the_same_boot_takes_unsynced_shards_by_their_sizes(imagenet, tmp_path, monkeypatch):
    kw = {"to": "tfrecord", "shard_size": 5, "workers": 2}
    convert(imagenet, tmp_path / "whole", **kw)
    stage = _interrupted(imagenet, tmp_path / "out", monkeypatch, sync="end", **kw)
    n = len(_entries(stage))
    s = convert(imagenet, tmp_path / "out", resume=True, **kw)
    assert [w for w in s.warnings if w.startswith(f"--resume: {n} of {n} shards")], s.warnings
    assert digest(tmp_path / "out") == digest(tmp_path / "whole")


def test_shards_without_digests_are_written_again_after_a_restart(imagenet, tmp_path, monkeypatch):
    """A folder's shard files are synced in one call, not digested: not synced, in another boot, nothing
    says they are whole, so each shard runs again."""
    kw = {"to": "folder", "shard_size": 5, "workers": 2}
    convert(imagenet, tmp_path / "whole", **kw)
    stage = _interrupted(imagenet, tmp_path / "out", monkeypatch, sync="off", **kw)
    for e in _entries(stage):
        e.write_text(json.dumps({**json.loads(e.read_text()), "unsynced": "another-boot"}))
    s = convert(imagenet, tmp_path / "out", resume=True, **kw)
    assert not [w for w in s.warnings if w.startswith("--resume:")], s.warnings  # (none taken as committed)
    assert digest(tmp_path / "out") == digest(tmp_path / "whole")


def test_an_lmdb_not_synced_before_a_restart_is_refused_and_started_over_with_overwrite(imagenet, tmp_path,
                                                                                       monkeypatch):
    kw = {"to": "lmdb", "shard_size": 5, "workers": 2}
    convert(imagenet, tmp_path / "whole", **kw)
    stage = _interrupted(imagenet, tmp_path / "out", monkeypatch, sync="off", **kw)
    mark = stage / ".gpubatch" / "lmdb" / "unsynced"
    assert mark.read_text() == (_commit.boot_id() or "unknown")
    mark.write_text("another-boot")
    with pytest.raises(GpubatchError, match=r"was not synced \(sync end or off\) and the machine restarted since: "
                                            "pass overwrite=True to start over"):  # (the API's words for the flags)
        convert(imagenet, tmp_path / "out", resume=True, **kw)
    convert(imagenet, tmp_path / "out", overwrite=True, **kw)
    assert digest(tmp_path / "out") == digest(tmp_path / "whole")


def test_a_resume_may_take_another_sync_mode(imagenet, tmp_path, monkeypatch):
    """How a run syncs does not shape its output: a run written under ``off`` resumes under ``shard``."""
    kw = {"to": "lmdb", "shard_size": 5, "workers": 2}
    convert(imagenet, tmp_path / "whole", **kw)
    _interrupted(imagenet, tmp_path / "out", monkeypatch, sync="off", **kw)
    s = convert(imagenet, tmp_path / "out", resume=True, sync="shard", **kw)
    assert [w for w in s.warnings if w.startswith("--resume:")], s.warnings
    assert digest(tmp_path / "out") == digest(tmp_path / "whole")


def test_end_syncs_the_dataset_once_before_it_appears_also_when_finish_makes_it(imagenet, tmp_path, monkeypatch):
    import gpubatch.runner as runner
    from gpubatch.api import finish

    seen: list[tuple[bool, bool]] = []
    real = runner.sync_filesystem

    def sync_filesystem(path):  # (what the dataset's folders hold when the run syncs)
        seen.append(((Path(path) / "gpubatch.json").is_file(), (tmp_path / "out").exists()))
        real(path)

    monkeypatch.setattr(runner, "sync_filesystem", sync_filesystem)
    convert(imagenet, tmp_path / "out", to="webdataset", shard_size=5, workers=2, sync="end")
    assert seen == [(True, False)]  # (once: the manifest written, DST not there yet)
    seen.clear()
    for part in (0, 1):
        convert(imagenet, tmp_path / "parts", to="webdataset", shard_size=5, workers=2, sync="end", num_parts=2,
                part=part)
    assert seen == []  # (the parts' shards: synced by the finish that makes the dataset)
    finish(tmp_path / "parts")
    assert len(seen) == 1 and seen[0][0]
    assert digest(tmp_path / "parts") == digest(tmp_path / "out")


def _reboot(stage: Path) -> None:
    """What the staging folder says after a restart of the machine that wrote it (its boot is another)."""
    for e in _entries(stage):
        e.write_text(json.dumps({**json.loads(e.read_text()), "unsynced": "another-boot"}))
    for note in (stage / ".gpubatch" / "synced").glob("*.json"):
        note.write_text(json.dumps({**json.loads(note.read_text()), "boot": "another-boot"}))


@pytest.mark.parametrize("settled", [True, False])
def test_a_part_synced_at_its_end_is_taken_by_its_sizes_in_another_boot(imagenet, tmp_path, monkeypatch, settled):
    """A part under ``--sync end`` syncs its machine's share at its end and notes it: ``finish`` in another
    boot takes those shards as committed without reading them back; without the note it reads them back."""
    from gpubatch.api import finish
    from gpubatch.engine.execute import journal

    kw = {"to": "webdataset", "shard_size": 5, "workers": 2, "sync": "end", "num_parts": 1, "part": 0}
    convert(imagenet, tmp_path / "out", **kw)
    stage = tmp_path / ".out.gpubatch-partial"
    notes = list((stage / ".gpubatch" / "synced").glob("*.json"))
    assert len(notes) == 1
    assert sorted(json.loads(notes[0].read_text())["shards"]) == list(range(len(_entries(stage))))
    _reboot(stage)
    if not settled:
        notes[0].unlink()
    files = sum(len(json.loads(e.read_text())["files"]) for e in _entries(stage))  # (a .tar and an .idx a shard)
    read: list[Path] = []
    real = journal.file_digest
    monkeypatch.setattr(journal, "file_digest", lambda path: (read.append(path), real(path))[1])
    finish(tmp_path / "out")
    assert len(read) == (0 if settled else files) and files >= 2 * 10
    convert(imagenet, tmp_path / "whole", to="webdataset", shard_size=5)
    assert digest(tmp_path / "out") == digest(tmp_path / "whole")


@pytest.fixture
def ray_here():
    """A local Ray of 2 CPUs for the test, started from the checkout (its workers import gpubatch from there)."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (make test installs it)")
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    finally:
        os.chdir(here)
    yield ray
    ray.shutdown()


def test_ray_actors_sync_their_share_under_end(imagenet, tmp_path, ray_here):
    """Under ``--sync end`` each Ray actor that wrote shards syncs its node's file system once every task is
    done and notes it (a part's driver notes its own as well)."""
    convert(imagenet, tmp_path / "out", to="webdataset", shard_size=5, sync="end", executor="ray", num_parts=1,
            part=0)
    notes = list((tmp_path / ".out.gpubatch-partial" / ".gpubatch" / "synced").glob("*.json"))
    writers = {n.name.split(".json.")[1].split("-")[0] for n in notes}
    assert str(os.getpid()) in writers and len(writers) >= 2, writers  # (the driver, and an actor at least)


def test_a_ray_actor_that_cannot_sync_its_share_is_the_run_s_one_line_error(imagenet, tmp_path, ray_here):
    import shutil

    kw = {"to": "webdataset", "shard_size": 5, "sync": "end", "num_parts": 2}
    convert(imagenet, tmp_path / "out", part=0, **kw)  # (the shared staging folder and its journal)
    synced = tmp_path / ".out.gpubatch-partial" / ".gpubatch" / "synced"
    shutil.rmtree(synced)
    synced.write_text("")  # (a file where the notes go: an actor's settle fails)
    with pytest.raises(GpubatchError, match=r"^sync end: a Ray actor failed to sync its node's shards: ") as e:
        convert(imagenet, tmp_path / "out", part=1, executor="ray", **kw)
    assert "Traceback" not in str(e.value).splitlines()[0]
