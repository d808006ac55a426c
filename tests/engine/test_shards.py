"""The run as shards: the same bytes whatever the workers, resume after any kill, refusals that name why."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubatch.api import augment, convert
from gpubatch.errors import GpubatchError, UsageError
from gpubatch.formats.base import WriteOptions
from tests.helpers import child_env, kill_group, semaphores_now

FORMATS = ["webdataset", "tfrecord", "recordio", "folder", "coco", "lmdb"]


def digest(root: Path) -> dict[str, str]:
    """Every file of a dataset but its manifest (which says when and where it was made), by content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "gpubatch.json"}


def manifest(root: Path) -> dict:
    m = json.loads((root / "gpubatch.json").read_text())
    for k in ("created", "run"):
        m.pop(k)
    m["options"].pop("workers", None)
    m["options"].pop("dst", None)
    m["options"].pop("resume", None)
    return m


@pytest.mark.parametrize("to", FORMATS)
def test_the_output_is_the_same_bytes_for_1_2_and_4_workers(imagenet, coco, tmp_path, to):
    src = coco if to == "coco" else imagenet
    runs = []
    for workers in (1, 2, 4):
        out = tmp_path / f"w{workers}"
        s = convert(src, out, to=to, shard_size=3 if to == "coco" else 7, resize_shorter=48, quality=80,
                    workers=workers)
        assert s.workers == min(workers, s.shards) and s.shards >= 4
        runs.append((digest(out), manifest(out)))
    assert runs[0] == runs[1] == runs[2]


def test_augment_writes_the_same_bytes_and_parameters_for_any_workers(coco, tmp_path):
    outs = []
    for workers in (1, 3):
        out = tmp_path / f"a{workers}"
        augment(coco, out, preset="ssd", copies=2, shard_size=5, workers=workers, to="webdataset")
        outs.append((digest(out), (out / "augment-params.jsonl").read_text()))
    assert outs[0] == outs[1] and outs[0][1].count("\n") == 24


def _command(src: Path, dst: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "gpubatch", "convert", str(src), str(dst), "--to", "webdataset", "--shard-size",
            "8", "--resize-shorter", "200", "--workers", "2", "-q", *more]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """160 photo-like 480x640 JPEGs in 4 classes: enough work that a run spends a few seconds writing."""
    from tests.helpers import jpeg_bytes, photo

    root = tmp_path_factory.mktemp("photos")
    base = [jpeg_bytes(photo(480, 640, seed=k), 92) for k in range(8)]
    for i in range(160):
        folder = root / f"c{i % 4}"
        folder.mkdir(exist_ok=True)
        (folder / f"{i:04d}.jpg").write_bytes(base[i % 8][:-2] + bytes([i % 251]) * 0 + base[i % 8][-2:])
    return root


def uninterrupted(command, src: Path, dst: Path, env: dict) -> tuple[dict, float]:
    """Run ``command(src, dst)`` to its end: the dataset's digest, and the seconds it took."""
    t0 = time.perf_counter()
    subprocess.run(command(src, dst), env=env, check=True, timeout=300)
    return digest(dst), time.perf_counter() - t0


def killed_and_resumed(command, src: Path, dst: Path, after: float, env: dict) -> tuple[dict, int | None, int, int]:
    """Run ``command(src, dst)``, kill it and its workers (as a lost machine loses them) ``after`` seconds
    in, then run it again with ``--resume``: (its summary, the shards it said the killed run committed or
    None, the shards in all, the shards on disk written before the resume)."""
    sems = semaphores_now()
    proc = subprocess.Popen(command(src, dst), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(after)
    kill_group(proc, sems)
    before = time.time_ns()
    p = subprocess.run(command(src, dst, "--resume", "--json"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    said = [w for w in s["warnings"] if w.startswith("--resume:") and " of " in w]
    if not said:
        return s, None, 0, 0
    done, total = (int(x) for x in said[0].split(":")[1].split(" shards")[0].split(" of "))
    kept = [t for t in dst.glob("*.tar") if t.stat().st_mtime_ns < before]  # written by the killed run
    return s, done, total, len(kept)


def kills(command, src: Path, tmp_path: Path, env: dict, n: int, seed: int,
          span: tuple[float, float] = (0.1, 1.1)) -> Iterator[tuple[int, dict, int | None, int, int]]:
    """``command`` killed at ``n`` moments of an uninterrupted run's time (``span`` of it: starting, mid-shard,
    finalizing, done) and resumed each time, the dataset checked against the uninterrupted run's: (k, and
    what :func:`killed_and_resumed` says) a kill."""
    want, took = uninterrupted(command, src, tmp_path / "whole", env)
    rng = random.Random(seed)
    for k in range(n):
        dst = tmp_path / f"k{k}"
        s, done, total, kept = killed_and_resumed(command, src, dst, rng.uniform(*span) * took, env)
        assert digest(dst) == want, f"kill {k}"
        yield k, s, done, total, kept


def test_a_run_killed_at_20_moments_resumes_to_the_same_bytes_writing_only_what_is_missing(photos, tmp_path):
    env = child_env()
    resumed_some = 0
    for k, s, done, total, kept in kills(_command, photos, tmp_path, env, 20, 51):
        if done is not None:  # the shards the killed run committed were not written again
            resumed_some += 1
            assert 0 < done <= total == 20 and kept == done and s["records_in"] == 160
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(f".k{k}.")]  # nothing left beside
    assert resumed_some >= 2  # (kills fell after some shards were committed, and before the end)


def test_an_lmdb_run_killed_at_8_moments_resumes_to_the_same_database(photos, tmp_path):
    """LMDB's workers put their shards into the database in turn: a kill between a shard's transaction and
    its note, or while shards wait in their spools, resumes to the same file."""
    env = child_env()

    def command(src: Path, dst: Path, *more: str) -> list[str]:
        return [*_command(src, dst, *more)[:6], "--to", "lmdb", *_command(src, dst, *more)[8:]]

    for _, s, *_ in kills(command, photos, tmp_path, env, 8, 52):
        assert s["records_out"] == 160


def test_a_folder_run_killed_at_8_moments_resumes_to_the_same_files(photos, tmp_path):
    """A folder run moves each committed shard's files to their names while its workers write the next
    (``FolderFinalize``): a kill mid-move, between shards or in the finalize resumes to the same files."""
    env = child_env()

    def command(src: Path, dst: Path, *more: str) -> list[str]:
        return [*_command(src, dst, *more)[:6], "--to", "folder", *_command(src, dst, *more)[8:]]

    for _, s, *_ in kills(command, photos, tmp_path, env, 8, 53):
        assert s["records_out"] == 160


def _parts(stage: Path, shards: int, per: int = 3) -> list:
    """``shards`` committed folder shards of ``per`` records each (two of them named alike, in other shards) in
    the staging folder ``stage``: their results."""
    from gpubatch.formats.sinks import PartsSink
    from gpubatch.types import Record, ShardResult, ShardTask

    out = []
    for k in range(shards):
        sink = PartsSink(stage, ShardTask(k, per * k, per * k + per, f"part-{k:05d}"), None, None)
        for i in range(per):
            n = per * k + i
            name = "same" if n in (1, 2 * per + 1) else str(n)  # (shards 0 and 2, both of class 1)
            sink.write(Record(key=f"c{n % 2}/{n}", data=bytes([n]) * 4, codec="jpeg", label=n % 2,
                              meta={"filename": f"{name}.jpg"}))
        files, extra = sink.commit()
        out.append(ShardResult(index=k, name=f"part-{k:05d}", start=per * k, stop=per * k + per, files=files,
                               extra=extra))
    return out


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".gpubatch" not in p.parts}


def _finalized_and_staged(tmp_path: Path, shards: int) -> tuple:
    """A folder finalized whole from ``shards`` committed shards (:func:`_parts`), and a staging folder holding the
    same shards committed: (the dataset's info, the whole folder, the staging folder, its shards' results)."""
    from gpubatch.formats.folder import FolderFormat
    from gpubatch.types import DatasetInfo

    info = DatasetInfo(classes=("c0", "c1"))
    whole, stage = tmp_path / "whole", tmp_path / "stage"
    for folder in (whole, stage):
        folder.mkdir()
    FolderFormat.finalize(whole, _parts(whole, shards), info, WriteOptions())
    return info, whole, stage, _parts(stage, shards)


def test_the_folder_finalize_begun_as_shards_commit_names_them_as_one_at_the_end(tmp_path):
    """Shards committed in any order are moved in plan order, so the names (two records named alike) and the file
    list are those of one finalize over every shard at the end."""
    from gpubatch.formats.folder import FolderFormat

    info, whole, early, results = _finalized_and_staged(tmp_path, 4)
    ending = FolderFormat.begin_finalize(early, info, WriteOptions(), [0, 1, 2, 3])
    for r in (results[2], results[1]):  # (shard 0 not yet committed: nothing moves)
        ending.committed(r)
    assert _files(early) == {}
    ending.committed(results[0])  # (0, 1 and 2 move; 3 waits)
    assert len(_files(early)) == 9
    assert ending.finish(results) == [] and _files(early) == _files(whole)
    assert "c1/same_1.jpg" in _files(whole) and (whole / "file_list.txt").is_file()


def test_a_folder_finalize_interrupted_part_way_is_done_again_to_the_same_files(tmp_path):
    """A run killed while its shards' files were being moved left some at their names and others in their parts:
    the resumed finalize finds the moved ones where they are, moves the rest, and removes what is not the
    dataset's."""
    import os

    from gpubatch.formats.folder import FolderFormat

    info, whole, stage, results = _finalized_and_staged(tmp_path, 3)
    first = FolderFormat.begin_finalize(stage, info, WriteOptions(), [0, 1, 2])
    first.committed(results[0])
    moved = dict(_files(stage))
    part = "0000000.jpg"  # (record 3, of class 1)
    os.makedirs(stage / "c1", exist_ok=True)
    os.replace(stage / ".gpubatch" / "parts" / "part-00001" / part, stage / "c1" / "3.jpg")  # (one of shard 1's)
    (stage / "c9").mkdir()
    (stage / "c9" / "stray.jpg").write_bytes(b"x")  # (not this dataset's)
    assert len(moved) == 3
    again = FolderFormat.begin_finalize(stage, info, WriteOptions(), [0, 1, 2])
    assert again.finish(results) == [] and _files(stage) == _files(whole)
    assert not (stage / "c9").exists()


def _lmdb_shards(stage, records, per=3):
    """LMDB sinks of ``records`` in shards of ``per`` (their tasks, and a function that makes shard k's sink)."""
    from gpubatch.formats import lmdb_sink
    from gpubatch.types import DatasetInfo, ShardTask

    tasks = [ShardTask(k, per * k, per * k + per, f"part-{k:05d}") for k in range(-(-len(records) // per))]

    def shard(index: int) -> lmdb_sink.LmdbSink:
        sink = lmdb_sink.LmdbSink(stage, tasks[index], DatasetInfo(), None)
        for r in records[tasks[index].start : tasks[index].stop]:
            sink.write(r)
        return sink

    return tasks, shard


def _lmdb_records(n: int, size: int):
    from gpubatch.types import Record

    return [Record(key=f"r{i}", data=b"\xff\xd8" + bytes([i % 251]) * size + b"\xff\xd9", label=i % 2) for i in range(n)]


def _lmdb_two(tmp_path, records):
    """The LMDB a run never stopped makes of ``records`` (shards of 3, committed in order, finalized: its folder),
    and a fresh stage beside it (its folder, its shards' tasks and the function that makes shard k's sink)."""
    from gpubatch.formats import lmdb_sink

    whole = tmp_path / "whole"
    whole.mkdir()
    tasks, shard = _lmdb_shards(whole, records)
    for k in range(len(tasks)):
        shard(k).commit()
    lmdb_sink.finalize(whole, tasks)
    stage = tmp_path / "stage"
    stage.mkdir()
    return whole, stage, *_lmdb_shards(stage, records)


def _read_lmdb(path):
    from gpubatch.formats.lmdb import LmdbReader

    with LmdbReader(path) as reader:
        return [(r.key, r.data, r.label) for r in (reader.read(e) for e in reader.entries())]


@pytest.mark.parametrize("noted", [True, False])
def test_an_lmdb_shard_run_again_after_a_kill_writes_the_same_pages_where_they_lie(tmp_path, noted):
    """A worker killed after its shard's pages went in, before its journal entry (``noted``: after the log of turns
    placed the shard; else before, the log's note cut short): the shard run again writes the same pages at the same
    place, and the file is the one a run never stopped makes."""
    from gpubatch.formats import lmdb_sink

    records = _lmdb_records(9, 3000)
    whole, stage, tasks, shard = _lmdb_two(tmp_path, records)
    shard(0).commit()
    log = stage / ".gpubatch" / "lmdb" / "turns"
    before = log.read_bytes()
    shard(1).commit()
    if not noted:  # (killed while the log noted it: a part of its note written)
        log.write_bytes(log.read_bytes()[: len(before) + 7])
    with lmdb_sink.turn(stage) as t:
        assert (t.next, t.count) == ((2, 6) if noted else (1, 3))
    shard(1).commit()  # the shard run again
    shard(2).commit()
    lmdb_sink.finalize(stage, tasks)
    assert (stage / "data.mdb").read_bytes() == (whole / "data.mdb").read_bytes()
    assert _read_lmdb(stage) == [(r.key, r.data, r.label) for r in records]


def test_a_full_disk_under_an_lmdb_is_a_write_error_and_the_shard_goes_in_once_there_is_room(tmp_path, monkeypatch):
    """Its pages are written with plain writes, not in a map: a full disk is the write's ENOSPC (the run's one-line
    write error), never a bus error; the shard stays unplaced, and once there is room it goes in where it would have:
    the file is the one a run that never failed makes."""
    import errno

    from gpubatch.formats import lmdb_sink

    records = _lmdb_records(6, 70_000)
    whole, stage, tasks, shard = _lmdb_two(tmp_path, records)
    shard(0).commit()

    def full(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lmdb_sink.os, "pwritev", full)
    with pytest.raises(OSError) as e:
        shard(1).commit()
    assert e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    with lmdb_sink.turn(stage) as t:
        assert (t.next, t.count) == (1, 3) and t.placed(1) is None
    shard(1).commit()
    lmdb_sink.finalize(stage, tasks)
    assert _read_lmdb(stage) == [(r.key, r.data, r.label) for r in records]
    assert (stage / "data.mdb").read_bytes() == (whole / "data.mdb").read_bytes()


def test_an_lmdb_that_lost_its_last_pages_with_the_machine_writes_them_again(tmp_path, monkeypatch):
    """The file is synced after its lock is released: a machine lost between a turn's writes and its sync leaves the
    file without them. Here the turn wrote shard 1 and the spool of shard 2, which had come early (journaled when
    spooled), and the machine went before the sync: the spool is removed only after it (its turn's process holding
    a lock on it until then), so it is still there, and the next turn writes its pages again where they lie; shard 1
    (never journaled) is run again. The file is the one a run never stopped makes."""
    from gpubatch.formats import lmdb_sink

    records = _lmdb_records(12, 5000)
    whole, stage, tasks, shard = _lmdb_two(tmp_path, records)
    shard(0).commit()
    data = stage / ".gpubatch" / "lmdb" / "db" / "data.mdb"
    synced = data.read_bytes()  # (the file as the disk held it when the machine went)
    monkeypatch.setattr(lmdb_sink, "TURN_WAIT_S", (0.01, 0.01))
    shard(2).commit()  # (early: it waits in its spool)
    assert lmdb_sink.spool_of(stage, 2).is_file()
    monkeypatch.setattr(lmdb_sink.Turn, "sync", lambda self: self.close())  # (the machine goes before the sync)
    shard(1).commit()  # (shard 1 and the spool of shard 2 written)
    monkeypatch.undo()
    assert lmdb_sink.spool_of(stage, 2).is_file()
    with open(data, "r+b") as f:  # (what was not synced is lost)
        f.truncate(len(synced))
    import fcntl

    held = os.open(lmdb_sink.spool_of(stage, 2), os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # (as a turn that wrote it holds it until it is synced)
    with lmdb_sink.turn(stage) as t:
        assert (t.next, t.count) == (3, 9) and not t.drained  # (held: not written again)
    os.close(held)
    assert lmdb_sink.spool_of(stage, 2).is_file()
    with lmdb_sink.turn(stage) as t:
        assert (t.next, t.count) == (3, 9) and t.drained  # (the state noted both: placed, its pages written again)
    assert not lmdb_sink.spool_of(stage, 2).exists()
    shard(1).commit()
    shard(3).commit()
    lmdb_sink.finalize(stage, tasks)
    assert (stage / "data.mdb").read_bytes() == (whole / "data.mdb").read_bytes()
    assert _read_lmdb(stage) == [(r.key, r.data, r.label) for r in records]


@pytest.mark.parametrize("turn_comes", [True, False])
def test_an_lmdb_shard_that_comes_early_waits_for_its_turn_before_it_spools(tmp_path, monkeypatch, turn_comes):
    """Shard 1 done before shard 0: it waits for its turn (its worker's commit thread, outside the lock), and
    goes in from memory once shard 0 is in; where its turn does not come in time it is spooled, as before. The
    database is the same either way."""
    import threading

    from gpubatch.formats import lmdb_sink
    from gpubatch.formats.lmdb import LmdbReader
    from gpubatch.types import DatasetInfo, Record, ShardTask

    stage = tmp_path / "stage"
    stage.mkdir()
    records = [Record(key=f"r{i}", data=b"\xff\xd8" + bytes([i]) * 3000 + b"\xff\xd9", label=i % 3) for i in range(6)]
    tasks = [ShardTask(k, 3 * k, 3 * k + 3, f"part-{k:05d}") for k in range(2)]
    kept: list[int] = []
    real_keep = lmdb_sink.LmdbSink._keep
    monkeypatch.setattr(lmdb_sink.LmdbSink, "_keep", lambda self: (kept.append(self.task.index), real_keep(self))[1])
    monkeypatch.setattr(lmdb_sink, "TURN_WAIT_S", (5.0, 5.0) if turn_comes else (0.05, 0.05))

    def shard(index: int) -> lmdb_sink.LmdbSink:
        sink = lmdb_sink.LmdbSink(stage, tasks[index], DatasetInfo(), None)
        for r in records[3 * index : 3 * index + 3]:
            sink.write(r)
        return sink

    early = shard(1)
    later = threading.Thread(target=early.commit)
    later.start()
    time.sleep(0.3)
    shard(0).commit()
    later.join(10)
    assert kept == ([] if turn_comes else [1])
    waited = early.timings["lmdb: waiting for its turn"]
    assert (0.2 < waited < 5.0) if turn_comes else waited < 0.3
    lmdb_sink.finalize(stage, tasks)
    with LmdbReader(stage) as reader:
        got = [reader.read(e) for e in reader.entries()]
    assert [(r.key, r.data, r.label) for r in got] == [(r.key, r.data, r.label) for r in records]


def test_lmdb_shards_held_in_memory_or_spooled_make_the_same_file(imagenet, tmp_path, monkeypatch):
    from gpubatch.formats import lmdb_sink

    convert(imagenet, tmp_path / "held", to="lmdb", shard_size=7, workers=2)
    convert(imagenet, tmp_path / "held-1", to="lmdb", shard_size=7, workers=1)
    monkeypatch.setattr(lmdb_sink, "HOLD", 1000)  # (a record or two held, then the shard spooled)
    convert(imagenet, tmp_path / "spooled", to="lmdb", shard_size=7, workers=1)
    assert digest(tmp_path / "held") == digest(tmp_path / "held-1") == digest(tmp_path / "spooled")


def test_a_worker_that_fails_with_many_tasks_left_ends_the_run_with_its_error(tmp_path):
    """The tasks no worker took (more than a pipe holds) do not keep the command from exiting once a worker
    failed: it printed the error and then waited forever to send them."""
    from tests.helpers import jpeg_bytes, photo

    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    (src / "0000.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    one = src / "0001.jpg"
    one.write_bytes(jpeg_bytes(photo(16, 16), 80))
    for i in range(2, 1500):
        os.link(one, src / f"{i:04d}.jpg")
    p = subprocess.run([sys.executable, "-m", "gpubatch", "convert", str(tmp_path / "src"), str(tmp_path / "out"),
                        "--to", "lmdb", "--shard-size", "2", "--workers", "2", "--on-error", "fail"],
                       env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "0000.jpg" in p.stderr and not (tmp_path / "out").exists()

def test_resume_with_other_options_is_refused_naming_the_difference(imagenet, tmp_path, monkeypatch):
    from gpubatch.formats import webdataset

    real = webdataset.WebDatasetSink._sample  # (a record, whether written alone or in a batch)
    calls = {"n": 0}

    def stop(self, record, parts=None):
        calls["n"] += 1
        if calls["n"] == 25:
            raise KeyboardInterrupt
        return real(self, record, parts)

    monkeypatch.setattr(webdataset.WebDatasetSink, "_sample", stop)
    with pytest.raises(KeyboardInterrupt):
        convert(imagenet, tmp_path / "out", to="webdataset", shard_size=10, resize_shorter=40, workers=1)
    monkeypatch.setattr(webdataset.WebDatasetSink, "_sample", real)
    with pytest.raises(UsageError, match=r"options\.resize_shorter: 40 then, 48 now"):
        convert(imagenet, tmp_path / "out", to="webdataset", shard_size=10, resize_shorter=48, resume=True)
    stage = tmp_path / ".out.gpubatch-partial"
    assert stage.is_dir()  # a refusal removes nothing
    s = convert(imagenet, tmp_path / "out", to="webdataset", shard_size=10, resize_shorter=48, workers=1)
    assert s.records_out == 60 and any("the unfinished output of another command (options.resize_shorter" in w
                                       for w in s.warnings)


def test_resume_of_a_finished_run_with_other_options_is_refused_naming_the_difference(imagenet, tmp_path,
                                                                                     monkeypatch):
    out = tmp_path / "out"
    convert(imagenet, out, to="webdataset", resize_shorter=40, device="cpu", workers=1)
    before = digest(out)
    s = convert(imagenet, out, to="webdataset", resize_shorter=40, device="cpu", workers=2, resume=True)
    assert s.records_out == 60 and any("complete already" in w for w in s.warnings)  # (workers shape nothing)
    monkeypatch.chdir(imagenet.parent)  # the same source by another path
    s = convert(imagenet.name, out, to="webdataset", resize_shorter=40, resume=True)
    assert any("complete already" in w for w in s.warnings)
    for change, said in (({"resize_shorter": 48}, r"resize_shorter: 40 then, 48 now"),
                         ({"quality": 80}, r"quality: None then, 80 now"),
                         ({"device": "gpu"}, r"device: 'cpu' then, 'gpu' now")):
        with pytest.raises(UsageError, match=rf"finished by another command \({said}\); pass "):
            convert(imagenet, out, to="webdataset", **{"resize_shorter": 40, **change}, resume=True)
    with pytest.raises(UsageError, match=r"source: .* then, .* now"):
        convert(imagenet.parent, out, to="webdataset", resize_shorter=40, resume=True)
    assert digest(out) == before  # a refusal writes nothing
    m = json.loads((out / "gpubatch.json").read_text())
    del m["options"]["image_format"]  # (a manifest an earlier gpubatch wrote, before that option)
    (out / "gpubatch.json").write_text(json.dumps(m))
    s = convert(imagenet, out, to="webdataset", resize_shorter=40, resume=True)
    assert any("complete already" in w for w in s.warnings)


def test_resume_of_a_finished_augment_compares_its_options(coco, tmp_path):
    out = tmp_path / "aug"
    augment(coco, out, preset="ssd", copies=2, workers=1, device="cpu")  # (its format: the source's)
    s = augment(coco, out, preset="ssd", copies=2, resume=True)
    assert any("complete already" in w for w in s.warnings)
    with pytest.raises(UsageError, match=r"finished by another command \(copies: 2 then, 3 now\)"):
        augment(coco, out, preset="ssd", copies=3, resume=True)
    with pytest.raises(UsageError, match=r"finished by another command \(seed: 0 then, 1 now\)"):
        augment(coco, out, preset="ssd", copies=2, seed=1, resume=True)


@pytest.mark.parametrize("damage", ["garbage", "foreign"])
def test_a_damaged_or_foreign_journal_is_refused_clearly(imagenet, tmp_path, damage):
    stage = tmp_path / ".out.gpubatch-partial"
    (stage / ".gpubatch").mkdir(parents=True)
    (stage / ".gpubatch" / "run.json").write_text("{not json" if damage == "garbage" else '{"schema": 99}')
    with pytest.raises(GpubatchError, match="journal") as e:
        convert(imagenet, tmp_path / "out", to="webdataset", resume=True)
    assert "\n" not in str(e.value) and "overwrite" in str(e.value)
    assert convert(imagenet, tmp_path / "out", to="webdataset", overwrite=True).records_out == 60


def test_shards_are_named_before_any_data_moves_and_auto_sizes_them(imagenet, tmp_path):
    from gpubatch.engine.execute.shards import inputs_per_shard, plan_shards

    assert inputs_per_shard(16_384, None) == 256 and inputs_per_shard(1_280_000, None) == 10_000
    assert inputs_per_shard(60, None) == 256 and inputs_per_shard(100, 10, 4.0) == 2
    # a video or a recording is more work a record: shards of fewer (every core of a host has one)
    assert inputs_per_shard(8, None, media="video") == 2 and inputs_per_shard(2048, None, media="audio") == 32
    # an output whose tasks are units of work only (a folder, on the host): about 256 tasks of 64 or more
    assert inputs_per_shard(16_384, None, units=256) == 64 and inputs_per_shard(1_000, None, units=256) == 64
    assert inputs_per_shard(16_384, 100, units=256) == 100 and inputs_per_shard(8, None, media="video", units=256) == 2
    tasks = plan_shards(list(range(21)), 10, lambda n: [f"s{i}-of-{n}" for i in range(n)])
    assert [(t.start, t.stop, t.name) for t in tasks] == [(0, 10, "s0-of-2"), (10, 21, "s1-of-2")]  # no 1-record shard
    s = convert(imagenet, tmp_path / "o", to="tfrecord", shard_size=25)
    assert s.shards == 3 and sorted(p.name for p in (tmp_path / "o").glob("*.tfrecord")) == [
        f"data-0000{i}-of-00003.tfrecord" for i in range(3)]
    from gpubatch.formats import get_format

    assert get_format("folder").auto_units == 256 and get_format("webdataset").auto_units is None


def test_the_runs_end_takes_its_own_shards_as_reported_and_reads_the_journal_for_the_rest(tmp_path):
    """A run's finalize gets the shards its workers committed as they reported them (no second read of
    every entry and every file), in the form their journal entries read back, and reads the rest."""
    from gpubatch.engine.execute.journal import Journal
    from gpubatch.types import ShardResult, ShardTask

    tasks = [ShardTask(i, 2 * i, 2 * i + 2, f"s{i}.tar", ()) for i in range(3)]
    for i in (0, 1):
        (tmp_path / f"s{i}.tar").write_bytes(b"x" * 5)
    journal = Journal(tmp_path)
    journal.begin({"run": 1})
    journal.record(ShardResult(0, "s0.tar", 0, 2, files={"s0.tar": [5, "d"]}, extra={"parts": [("a", 1)]}))
    # what a worker reports of its shard: its entry as it reads back (a sink's tuple a list, as after a resume)
    made = ShardResult(1, "s1.tar", 2, 4, files={"s1.tar": [5, "e"]}, extra={"parts": [("b", 2)]})
    reported = journal.record(made)
    assert reported.extra == {"parts": [["b", 2]]} and made.extra == {"parts": [("b", 2)]}
    assert reported == journal.committed(tasks)[1]
    (journal.entries / "000001.json").unlink()  # (what the run's end takes of shard 1 is the report alone)
    with pytest.raises(GpubatchError, match="1 shard is not committed .s2.tar"):
        journal.results(tasks, {1: reported})
    got = journal.results(tasks[:2], {1: reported})
    assert [r.index for r in got] == [0, 1] and got[1] is reported
    assert got[0].extra == {"parts": [["a", 1]]}  # (read back)
    # without what the workers reported (Ray's), the journal decides: shard 1 has no entry now
    with pytest.raises(GpubatchError, match="1 shard is not committed .s1.tar"):
        journal.results(tasks[:2])


@pytest.mark.parametrize("to", ["folder", "lmdb", "coco"])
def test_a_run_stopped_in_its_finalize_resumes_to_the_same_bytes(imagenet, coco, tmp_path, monkeypatch, to):
    """The formats without shards make the dataset in finalize (files moved into place, the LMDB written):
    stopped part way, the resumed run makes it again whole, the same bytes as a run never stopped."""
    from gpubatch.formats import folder, lmdb_sink, sinks

    src = coco if to == "coco" else imagenet
    whole = tmp_path / "whole"
    convert(src, whole, to=to, shard_size=5, resize_shorter=40, workers=2)
    calls = {"n": 0}
    real_place, real_spooled, real_tree = folder.FolderWriter.place, sinks.spooled, lmdb_sink.tree_pages

    def count() -> None:
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt

    def place(self, *a, **kw):
        count()
        return real_place(self, *a, **kw)

    def spooled(*a, **kw):
        for record in real_spooled(*a, **kw):
            count()
            yield record

    def tree(*a, **kw):  # (LMDB's finalize: the branch and meta pages over the pages its workers wrote)
        raise KeyboardInterrupt

    monkeypatch.setattr(folder.FolderWriter, "place", place)
    monkeypatch.setattr(sinks, "spooled", spooled)
    monkeypatch.setattr(lmdb_sink, "tree_pages", tree)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "out", to=to, shard_size=5, resize_shorter=40, workers=2)
    monkeypatch.setattr(folder.FolderWriter, "place", real_place)
    monkeypatch.setattr(sinks, "spooled", real_spooled)
    monkeypatch.setattr(lmdb_sink, "tree_pages", real_tree)
    assert (tmp_path / ".out.gpubatch-partial").is_dir() and not (tmp_path / "out").exists()
    s = convert(src, tmp_path / "out", to=to, shard_size=5, resize_shorter=40, workers=2, resume=True)
    assert any(w.startswith("--resume:") for w in s.warnings), s.warnings
    assert digest(tmp_path / "out") == digest(whole)


KILLED_IN_THE_JOURNALS_REMOVAL = """
import os, shutil, sys
from pathlib import Path
real = shutil.rmtree
def rmtree(path, *a, **kw):  # the run's folder: half its journal's entries removed, then the process killed
    if Path(path).name.startswith(".gpubatch"):
        entries = sorted((Path(path) / "journal").iterdir())
        for e in entries[: len(entries) // 2]:
            e.unlink()
        os._exit(9)
    return real(path, *a, **kw)
shutil.rmtree = rmtree
from gpubatch.api import convert
convert(sys.argv[1], sys.argv[2], to="lmdb", shard_size=5, resize_shorter=40, workers=2)
"""


def test_a_run_killed_while_removing_its_journal_resumes_to_the_same_database(imagenet, tmp_path):
    """The journal goes as one step once the dataset is finalized: a kill while its files are deleted leaves no
    journal of some shards (whose resume would write them again into a new, incomplete database)."""
    env = child_env()
    convert(imagenet, tmp_path / "whole", to="lmdb", shard_size=5, resize_shorter=40, workers=2)
    p = subprocess.run([sys.executable, "-c", KILLED_IN_THE_JOURNALS_REMOVAL, str(imagenet), str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 9 and (tmp_path / ".out.gpubatch-partial" / "data.mdb").is_file(), p.stderr
    s = convert(imagenet, tmp_path / "out", to="lmdb", shard_size=5, resize_shorter=40, workers=2, resume=True)
    assert s.records_out == 60 and digest(tmp_path / "out") == digest(tmp_path / "whole")

@pytest.mark.parametrize("dealt", [True, False])
def test_workers_dealt_their_tasks_or_taking_them_as_they_free_up_write_the_same_bytes(imagenet, tmp_path,
                                                                                     monkeypatch, dealt):
    from gpubatch.engine.execute import strategies

    convert(imagenet, tmp_path / "one", to="tfrecord", shard_size=5, resize_shorter=40, workers=1)
    # the host unit under a GPU strategy's worker layout (two processes "a GPU"), dealt or from one queue
    probe = strategies.Strategy("probe", "gpubatch.engine.execute.units:HostUnit", gpu=True, dealt=dealt)
    monkeypatch.setattr(strategies, "unit_for", lambda ctx: probe)
    s = convert(imagenet, tmp_path / "two", to="tfrecord", shard_size=5, resize_shorter=40, gpu_procs=2)
    assert s.workers == 2 and s.shards == 12
    assert digest(tmp_path / "two") == digest(tmp_path / "one")


def test_tasks_are_worked_across_their_boundaries_in_order():
    """ordered_across (the GPU audio unit's): entries worked ``chunk`` at a time on a pool, several
    tasks' at once, come back in the tasks' order with their task's shard, made in order (an empty task's
    too) and marked at each task's last entry; what a process counted is added to its shard's stats; work
    still queued when the consumer stops is cancelled."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from gpubatch.engine.execute.worker import ordered_across, stats_part
    from gpubatch.errors import RunStats
    from gpubatch.types import ShardTask

    spans = [(0, 5), (5, 5), (5, 7), (7, 12)]
    tasks = [ShardTask(k, a, b, f"s{k}", tuple(range(a, b))) for k, (a, b) in enumerate(spans)]
    made, started = [], []
    lock = threading.Lock()

    def make(task):
        made.append(SimpleNamespace(task=task, stats=RunStats()))
        return made[-1]

    def work(entries):
        with lock:
            started.extend(entries)
        time.sleep(0.01 * (len(entries) % 2))  # (chunks finish out of order)
        out = []
        for e in entries:
            st = RunStats()
            st.add(records_in=1, bytes_in=e)
            out.append(([f"r{e}"], stats_part(st)))
        return out

    with ThreadPoolExecutor(3) as pool:
        got = list(ordered_across(tasks, make, lambda es, shard: pool.submit(work, es), window=3, chunk=2))
    assert [(s.task.index, outs, last) for s, outs, last in got] == \
        [(0, [f"r{e}"], e == 4) for e in range(5)] + [(1, [], True)] + \
        [(2, [f"r{e}"], e == 6) for e in range(5, 7)] + [(3, [f"r{e}"], e == 11) for e in range(7, 12)]
    assert [s.task.index for s in made] == [0, 1, 2, 3]
    assert [(s.stats.records_in, s.stats.bytes_in) for s in made] == [(5, 10), (0, 0), (2, 11), (5, 45)]
    # a consumer that stops after the first entry: what was not started is cancelled
    started.clear()
    with ThreadPoolExecutor(1) as pool:
        gen = ordered_across(tasks, make, lambda es, shard: pool.submit(work, es), window=2, chunk=1)
        next(gen)
        gen.close()
    assert len(started) <= 3


def test_write_across_commits_each_shard_in_order_while_the_next_tasks_are_worked(tmp_path):
    """write_across (the GPU video unit's): the entries of several tasks worked at once on a pool, each
    shard written in order and committed (journaled, handed to ``done``) once its last entry is in, a
    task of no entries too, whatever order the work finishes in; the work reaches into a later task
    before an earlier one is committed. Where an entry's work raises, the shards committed are kept,
    those made and not committed are removed, and the error goes on."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from gpubatch.engine.execute.journal import Journal
    from gpubatch.engine.execute.worker import ShardWriting, write_across
    from gpubatch.errors import GpubatchError
    from gpubatch.types import Media, Record, ShardTask

    spans = [(0, 2), (2, 2), (2, 4), (4, 7)]
    tasks = [ShardTask(k, a, b, f"data-{k:05d}-of-00004.tar", tuple(range(a, b))) for k, (a, b) in enumerate(spans)]

    context = _writer_context

    lock = threading.Lock()
    seen: list[int] = []  # entries whose work began, in order
    committed_when: dict[int, int] = {}  # shard -> entries begun when it was committed

    def work(entries, stats, fail=None):
        with lock:
            seen.extend(entries)
        time.sleep(0.02 * (entries[0] % 2))  # (odd entries finish after the even ones behind them)
        if fail is not None and entries[0] == fail:
            raise GpubatchError(f"entry {fail} failed")
        stats.add(records_in=len(entries))
        return [([Record(key=f"r{e}", data=bytes([e]) * 10, media=Media.IMAGE, codec="jpeg")], None) for e in entries]

    stage = tmp_path / "stage"
    ctx = context(stage)
    done = []

    def got(result):
        committed_when[result.index] = len(seen)
        done.append(result)

    with ThreadPoolExecutor(3) as pool:
        write_across(iter(tasks), lambda t: ShardWriting(t, ctx), got,
                     lambda es, w: pool.submit(work, es, w.stats), window=3)
    assert [r.index for r in done] == [0, 1, 2, 3]
    assert [r.counts["records_out"] for r in done] == [2, 0, 2, 3]
    assert committed_when[0] > 2  # (the work of task 2 had begun before task 0 was committed)
    assert set(Journal(stage).committed(tasks)) == {0, 1, 2, 3}
    import tarfile
    for r, (a, b) in zip(done, spans):
        with tarfile.open(stage / r.name) as tar:
            assert [m.name for m in tar.getmembers()] == [f"r{e}.jpg" for e in range(a, b)]
    # entry 4 (task 3's first) fails: tasks 0-2 committed and kept, task 3's partial files removed
    stage2 = tmp_path / "stage2"
    ctx2 = context(stage2)
    done.clear()
    seen.clear()
    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(GpubatchError, match="entry 4 failed"):
            write_across(iter(tasks), lambda t: ShardWriting(t, ctx2), got,
                         lambda es, w: pool.submit(work, es, w.stats, 4), window=2)
    assert [r.index for r in done] == [0, 1, 2]
    left = {p.relative_to(stage2).as_posix() for p in stage2.rglob("*") if p.is_file() and ".gpubatch" not in p.parts}
    assert {name.split(".")[0] for name in left} == {t.name[:-4] for t in tasks[:3]}  # (their .tar and .idx)
    assert set(Journal(stage2).committed(tasks)) == {0, 1, 2}


def _writer_records(k, stats):
    """Shard ``k``'s last two records, made where the writer writes (a function of the shard's stats)."""
    from gpubatch.types import Media, Record

    stats.add(transcoded=2)
    return [Record(key=f"r{3 * k + i}", data=bytes([k, i]) * 50, media=Media.IMAGE, codec="jpeg") for i in (1, 2)]


def _writer_context(stage):
    """A run's context writing webdataset shards into ``stage`` (made here), for the shard writers' tests."""
    import functools

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.execute.worker import RunContext
    from gpubatch.engine.plan import Plan
    from gpubatch.formats import get_format
    from gpubatch.formats.base import WriteOptions
    from gpubatch.runner import _sink
    from gpubatch.types import DatasetInfo

    stage.mkdir()
    return RunContext(opener=None, sink=functools.partial(_sink, get_format("webdataset"), stage, DatasetInfo(),
                                                          WriteOptions(), False),
                      plan=Plan(), device=Device(DeviceKind.CPU), stage=stage)


def _writer_fails(stats):
    from gpubatch.errors import GpubatchError

    raise GpubatchError("the encoder failed")


@pytest.mark.parametrize("kind", ["thread", "lanes", "process"])
def test_the_gpu_units_shard_writer_commits_in_order_and_removes_what_it_did_not(tmp_path, kind):
    """The GPU image and audio units' shard writer, in a thread (ShardWriter; with "lanes", three shards
    written at once in threads of their own, as the audio unit's) or a process of its own
    (ShardWriterProcess): records handed over, or a function of the shard's stats that makes them there,
    are written into their shards in order, each shard committed (fsynced and renamed by the committer's
    thread) with a journal entry and handed to ``done`` in order, with what the loop counted in the
    shard's stats and its progress; a run that stops removes the partial files of every shard it did
    not commit, and keeps those it did; an error where the records are made is raised in the loop."""
    import functools

    from gpubatch.engine.execute.journal import Journal
    from gpubatch.engine.execute.worker import ShardWriter, ShardWriting
    from gpubatch.engine.execute.writer import ShardWriterProcess
    from gpubatch.errors import GpubatchError
    from gpubatch.types import Media, Record, ShardTask

    tasks = [ShardTask(k, 3 * k, 3 * k + 3, f"data-{k:05d}-of-00004.tar") for k in range(4)]
    context = _writer_context

    def writer(ctx, done):
        if kind == "process":
            return ShardWriterProcess(ctx, done)
        return ShardWriter(done, lanes=3 if kind == "lanes" else 1)

    def rec(k):
        return Record(key=f"r{3 * k}", data=bytes([k, 0]) * 50, media=Media.IMAGE, codec="jpeg")

    stage = tmp_path / "stage"
    ctx = context(stage)
    done, ticks = [], []
    w = writer(ctx, done.append)
    shards = [ShardWriting(t, ctx, ticks.append) for t in tasks]
    if kind == "process":  # (Ctrl-C reaches every process of the terminal's group: the worker handles it)
        os.kill(w.proc.pid, signal.SIGINT)
    for k, sh in enumerate(shards):
        sh.stats.add(records_in=3)  # (what the loop counts goes with the shard's commit)
        w.put(sh, [rec(k)])
        w.put(sh, functools.partial(_writer_records, k))
        w.commit(sh, {"chain": 0.5}, None)
    w.close()
    assert [r.index for r in done] == [0, 1, 2, 3]
    assert all(r.counts["records_out"] == 3 and r.counts["records_in"] == 3 and r.counts["transcoded"] == 2
               and r.timings["chain"] == 0.5 for r in done)
    assert sum(ticks) == 12
    assert sorted(p.name for p in stage.glob("*.tar")) == [t.name for t in tasks]
    assert set(Journal(stage).committed(tasks)) == {0, 1, 2, 3}
    # a run that stops: shard 0 committed and kept, 1 (written to) and 2 (handed over only) removed
    stage2 = tmp_path / "stage2"
    ctx2 = context(stage2)
    done.clear()
    w = writer(ctx2, done.append)
    a, b, c = (ShardWriting(t, ctx2) for t in tasks[:3])
    w.put(a, [rec(0)])
    w.commit(a, {}, None)
    w.put(b, [rec(1)])
    w.close(abort=c)
    assert [r.index for r in done] == [0]
    left = sorted(p.relative_to(stage2).as_posix() for p in stage2.rglob("*") if p.is_file() and ".gpubatch" not in p.parts)
    assert left and {name.rsplit(".", 1)[0] for name in left} == {tasks[0].name[:-4]}  # (its .tar and .idx)
    # an error where the records are made: raised in the loop, the shard's partial files removed
    stage3 = tmp_path / "stage3"
    ctx3 = context(stage3)
    w = writer(ctx3, done.append)
    a = ShardWriting(tasks[0], ctx3)
    w.put(a, [rec(0)])
    w.put(a, _writer_fails)
    with pytest.raises(GpubatchError, match="the encoder failed"):
        w.close()
    assert not [p for p in stage3.rglob("*") if p.is_file() and ".gpubatch" not in p.parts]
    if kind == "process":  # a payload that cannot travel to the process: its error, raised in the loop
        stage4 = tmp_path / "stage4"
        ctx4 = context(stage4)
        w = writer(ctx4, done.append)
        a = ShardWriting(tasks[0], ctx4)
        w.put(a, [rec(0)])
        w.put(a, lambda stats: [rec(0)])
        with pytest.raises(Exception, match="pickle"):
            w.close()
        assert not [p for p in stage4.rglob("*") if p.is_file() and ".gpubatch" not in p.parts]


def test_the_shard_writer_s_lanes_write_shards_at_once_and_commit_them_in_order(tmp_path):
    """ShardWriter(lanes=3) (the GPU audio unit's): three shards' records made and written at once, each
    in a thread of its own (their payloads meet at a barrier of three, which one writer thread never
    passes), each shard's records in the order handed over, the commits and ``done`` in the shards' order,
    and a write's error raised in the loop with no shard left half written."""
    import functools
    import tarfile
    import threading

    from gpubatch.engine.execute.worker import ShardWriter, ShardWriting
    from gpubatch.errors import GpubatchError
    from gpubatch.types import Media, Record, ShardTask

    tasks = [ShardTask(k, 4 * k, 4 * k + 4, f"data-{k:05d}-of-00006.tar") for k in range(6)]
    context = _writer_context

    meet = threading.Barrier(3, timeout=20)

    def made(k, first, stats):
        if first and k < 3:
            meet.wait()  # (shards 0-2 are written at once, or this raises BrokenBarrierError)
        return [Record(key=f"r{4 * k + i}", data=bytes([k, i]) * 999, media=Media.IMAGE, codec="jpeg")
                for i in ((0, 1) if first else (2, 3))]

    stage = tmp_path / "stage"
    ctx = context(stage)
    done = []
    w = ShardWriter(done.append, lanes=3)
    for k, t in enumerate(tasks):
        sh = ShardWriting(t, ctx)
        w.put(sh, functools.partial(made, k, True))
        w.put(sh, functools.partial(made, k, False))
        w.commit(sh, {}, None)
    w.close()
    assert [r.index for r in done] == list(range(6))
    for k, t in enumerate(tasks):
        with tarfile.open(stage / t.name) as tar:
            assert [m.name.split(".")[0] for m in tar.getmembers()] == [f"r{4 * k + i}" for i in range(4)]
    # an error in a lane: raised in the loop; the shard before it, whole, is committed unless the error came first
    # (the lanes run at once: either is safe), and kept where it was; the failing shard is removed
    stage2 = tmp_path / "stage2"
    ctx2 = context(stage2)
    done.clear()
    w = ShardWriter(done.append, lanes=3)
    a, b = ShardWriting(tasks[0], ctx2), ShardWriting(tasks[1], ctx2)
    w.put(a, functools.partial(made, 4, False))
    w.commit(a, {}, None)
    w.put(b, functools.partial(made, 5, False))
    w.put(b, _writer_fails)
    w.commit(b, {}, None)
    with pytest.raises(GpubatchError, match="the encoder failed"):
        w.close()
    committed = [r.index for r in done]
    assert committed in ([], [0])
    left = {p.name.split(".")[0] for p in stage2.rglob("*") if p.is_file() and ".gpubatch" not in p.parts}
    assert left == {tasks[k].name.split(".")[0] for k in committed}
    # a write that fails before others of its shard succeed: neither that shard nor any after it is committed,
    # however the lanes' threads and the commits interleave
    stage3 = tmp_path / "stage3"
    ctx3 = context(stage3)
    done.clear()
    w = ShardWriter(done.append, lanes=3)
    a, b = ShardWriting(tasks[0], ctx3), ShardWriting(tasks[1], ctx3)
    w.put(a, _writer_fails)
    w.put(a, functools.partial(made, 4, False))
    w.put(b, functools.partial(made, 5, False))
    w.commit(a, {}, None)
    w.commit(b, {}, None)
    with pytest.raises(GpubatchError, match="the encoder failed"):
        w.close()
    assert done == []  # (nothing committed once a write failed, as with one writer thread)
    assert not [p for p in stage3.rglob("*") if p.is_file() and ".gpubatch" not in p.parts]


def test_timed_next_counts_the_wait_for_each_item_and_ends_with_none():
    """timed_next (the GPU loops' wait for their next batch): each item in order, the time waited for it
    added to its stage, None at the end."""
    import time

    from gpubatch.engine.executor import prefetched, timed_next

    def slow():
        for i in range(3):
            time.sleep(0.05)
            yield i

    waits = {"decode_wait": 0.0}
    it = prefetched(slow(), 1)
    got = []
    while (x := timed_next(it, waits, "decode_wait")) is not None:
        got.append(x)
    assert got == [0, 1, 2] and waits["decode_wait"] >= 0.1


def test_put_many_gives_the_shard_and_counts_of_put_one_by_one(tmp_path):
    """ShardWriting.put_many (what the GPU units' writer calls a batch) writes the shard put writes record
    by record: the same files, counts and skipped records, errors routed where they come."""
    import functools

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.execute.worker import RunContext, ShardWriting
    from gpubatch.engine.plan import Plan
    from gpubatch.errors import RecordError, Stage
    from gpubatch.formats import get_format
    from gpubatch.formats.base import WriteOptions
    from gpubatch.formats.webdataset import MEMBERS
    from gpubatch.runner import _sink
    from gpubatch.types import DatasetInfo, Media, Record, ShardTask

    def results():
        out = [Record(key=f"r{i}", data=bytes([i]) * (30 + i), media=Media.IMAGE, codec="jpeg", label=i % 2)
               for i in range(12)]
        out[4] = RecordError("r4", "src/r4", Stage.READ, "unreadable")
        out[7] = RecordError("r7", "src/r7", Stage.DECODE, "corrupt")
        out[9] = Record(key="r9", data=b"x", media=Media.IMAGE, codec="jpeg",
                        meta={MEMBERS: {"txt": {"base64": "abcde"}}})  # (does not fit: its member's base64)
        return out

    got = []
    for way in ("one", "many"):
        stage = tmp_path / way
        stage.mkdir()
        ctx = RunContext(opener=None, sink=functools.partial(_sink, get_format("webdataset"), stage, DatasetInfo(),
                                                             WriteOptions(), False),
                         plan=Plan(), device=Device(DeviceKind.CPU), stage=stage)
        w = ShardWriting(ShardTask(0, 0, 12, "data-00000-of-00001.tar"), ctx)
        if way == "one":
            for r in results():
                w.put(r)
        else:
            rs = results()
            w.put_many(rs[:5])
            w.put_many(rs[5:])
        r = w.commit()
        got.append((r.counts, r.skipped, r.files, (stage / "data-00000-of-00001.tar").read_bytes()))
    assert got[0] == got[1]
    counts, skipped, _, _ = got[1]
    assert counts["records_out"] == 9 and [s["key"] for s in skipped] == ["r4", "r7", "r9"]


class SlowToClose:
    """A work unit that reports its tasks done (no records), says that it holds nothing of the run any more,
    then takes a minute to close its parts, as a GPU worker's decoders take a while."""

    @classmethod
    def make(cls, ctx, slot):
        return cls()

    def run(self, reader, tasks, writing, done):
        from gpubatch.engine.execute.worker import released
        from gpubatch.types import ShardResult

        for task in tasks:
            done(ShardResult(task.index, task.name, task.start, task.stop))
        released()
        time.sleep(60)

    def close(self):
        pass


def test_the_executor_does_not_wait_for_a_worker_closing_after_it_released_the_run(tmp_path):
    """Once a worker said it holds nothing of the run (every shard it made committed, its readers closed), the
    run goes on without waiting for the rest of its teardown; the worker is ended."""
    import functools

    from gpubatch.engine.device import Device, DeviceKind
    from gpubatch.engine.execute.local import run_tasks
    from gpubatch.engine.execute.strategies import Strategy
    from gpubatch.engine.execute.worker import RunContext
    from gpubatch.engine.plan import Plan
    from gpubatch.formats import open_reader
    from gpubatch.types import ShardTask

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(b"\xff\xd8\xff\xd9")
    ctx = RunContext(opener=functools.partial(open_reader, tmp_path / "src"), sink=None, plan=Plan(),
                     device=Device(DeviceKind.CPU))
    tasks = [ShardTask(k, k, k + 1, f"s{k}", ()) for k in range(6)]
    got = []
    t0 = time.perf_counter()
    run_tasks(ctx, Strategy("slow", f"{__name__}:SlowToClose"), tasks, 2, got.append)
    assert sorted(r.index for r in got) == list(range(6))
    assert time.perf_counter() - t0 < 30


def test_the_gpu_units_shard_writer_is_the_units_choice_unless_the_setting_names_one(monkeypatch):
    """``GPUBATCH_SHARD_WRITER`` "auto" (the default) leaves the writer to the unit (a process for images, a
    thread for audio); "process" or "thread" is taken by every unit; anything else is refused."""
    from types import SimpleNamespace

    from gpubatch.engine.execute import writer
    from gpubatch.engine.execute.worker import ShardWriter
    from gpubatch.engine.settings import Settings
    from gpubatch.errors import UsageError

    monkeypatch.setattr(writer, "ShardWriterProcess", lambda ctx, done: "a process")

    def made(setting: str, auto: str):
        w = writer.shard_writer(SimpleNamespace(settings=Settings(shard_writer=setting)), print, auto=auto)
        if isinstance(w, ShardWriter):
            w.close()
            return "a thread"
        return w

    assert Settings().shard_writer == "auto"
    assert [made("auto", "process"), made("auto", "thread")] == ["a process", "a thread"]
    assert [made("process", "thread"), made("thread", "process")] == ["a process", "a thread"]
    with pytest.raises(UsageError, match="shard writer"):
        Settings(shard_writer="pipe")


def test_a_shards_timings_say_its_commit_and_the_wait_for_the_commit_before_it(tmp_path):
    """A worker's committer makes its shards' commits in order in a thread of its own, one waiting at most: a
    submission holds until the commit before it is made, and that wait is in the shard's timings as
    ``commit_wait`` (the fsyncs and renames as ``commit``; the GPU units' writer adds its idle time)."""
    import threading

    from gpubatch.engine.execute.journal import Journal
    from gpubatch.engine.execute.worker import Committer, ShardWriter, ShardWriting
    from gpubatch.types import Media, Record, ShardTask

    tasks = [ShardTask(k, k, k + 1, f"data-{k:05d}-of-00003.tar") for k in range(3)]

    context = _writer_context

    stage = tmp_path / "stage"
    ctx = context(stage)

    def record(k):
        return Record(key=f"r{k}", data=bytes([k]) * 99, media=Media.IMAGE, codec="jpeg")

    made = [ShardWriting(t, ctx) for t in tasks]
    for k, w in enumerate(made):
        w.put_many([record(k)])
    gate, order = threading.Event(), []

    def done(r):
        assert gate.wait(10)
        order.append(r)

    c = Committer()
    c.submit(made[0], done)  # (its commit holds in `done` until the gate opens)
    second = threading.Thread(target=c.submit, args=(made[1], done))
    second.start()
    second.join(0.3)
    assert second.is_alive() and not order  # the second holds until the first is made
    gate.set()
    second.join(10)
    c.submit(made[2], done)
    c.close()
    assert [r.index for r in order] == [0, 1, 2]
    assert all(r.timings["commit"] >= 0 for r in order)
    assert order[1].timings["commit_wait"] > 0.2 and order[0].timings["commit_wait"] < 0.2
    assert set(Journal(stage).committed(tasks)) == {0, 1, 2}
    # the GPU units' writer thread: its idle time (waiting for the loop) goes with each shard it commits
    ctx2 = context(tmp_path / "stage2")
    results = []
    w = ShardWriter(results.append)
    a = ShardWriting(tasks[0], ctx2)
    w.put(a, [record(0)])
    threading.Event().wait(0.3)  # (the loop is busy: the writer waits)
    w.commit(a, {"chain": 0.1}, None)
    w.close()
    assert results[0].timings["writer_idle"] > 0.2 and results[0].timings["chain"] == 0.1


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_s_wall_timings_say_when_its_last_shard_was_committed(imagenet, tmp_path, workers):
    """``wall: last shard committed`` lies between the first shard's commit and the shards' end (what follows
    it is the workers' end), in this process and in worker processes alike; with worker processes, ``wall:
    workers released`` (the last one's word) lies between the last commit and the shards' end."""
    s = convert(imagenet, tmp_path / "out", to="webdataset", shard_size=4, workers=workers, device="cpu")
    t = s.timings
    assert s.shards > 2
    assert 0 < t["wall: workers start (to the first shard committed)"] <= t["wall: last shard committed"]
    assert t["wall: last shard committed"] <= t["wall: shards"]
    if workers > 1:  # (worker processes: the last one's word that it holds nothing of the run)
        assert t["wall: last shard committed"] <= t["wall: workers released"] <= t["wall: shards"]
    else:
        assert "wall: workers released" not in t


def test_an_lmdb_whose_log_of_turns_is_damaged_or_from_an_older_gpubatch_is_refused_in_one_line(tmp_path):
    """The log of turns says where each shard's pages lie: a note that names another shard is refused (never
    written over), and so is the JSON state an older gpubatch kept; ``--overwrite`` starts over."""
    from gpubatch.formats import lmdb_sink

    records = _lmdb_records(6, 3000)
    stage = tmp_path / "stage"
    stage.mkdir()
    tasks, shard = _lmdb_shards(stage, records)
    shard(0).commit()
    log = stage / ".gpubatch" / "lmdb" / "turns"
    log.write_bytes(lmdb_sink._TURN.pack(5, 0, 2, 3, 4))
    with pytest.raises(GpubatchError, match=r"turns is damaged \(its note 0 names shard 5\): pass --overwrite"):
        shard(1).commit()
    log.unlink()
    (stage / ".gpubatch" / "lmdb" / "state.json").write_text('{"next": 1, "count": 3, "page": 2}')
    with pytest.raises(GpubatchError, match="was begun by an older gpubatch: pass --overwrite to start over"):
        shard(1).commit()
