"""gpubatch/_prescan.py: a folder source listed by a process forked at the command's start, while the command
imports; the run takes the listed reader, or lists the source itself where it cannot. CPU tests: each begins in a
fresh interpreter (the fork needs a process of one thread), with the host's fewest cores for it lowered to one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubatch import _prescan
from tests.engine.test_shards import digest
from tests.helpers import ROOT, child_env, cli_script


@pytest.mark.parametrize(("args", "src"), [
    (["convert", "S", "d", "--to", "webdataset"], "S"),
    (["--debug", "augment", "S", "d", "--ops", "hflip"], "S"),
    (["convert", "S", "d", "--to", "tfrecord", "--resume"], "S"),
    (["convert", "--to", "webdataset", "S", "d"], None),  # (the source is not right after the command's name)
    (["convert", "S", "d", "--from", "folder"], None),
    (["convert", "S", "d", "--from=folder"], None),
    (["convert", "S", "d", "--path-column", "p"], None),
    (["info", "S"], None),
    (["convert", "missing", "d"], None),
    (["convert"], None),
])
def test_the_source_listed_ahead_is_a_local_folder_right_after_the_commands_name(tmp_path, monkeypatch, args, src):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "S").mkdir()
    assert _prescan.source_of(args) == src


#: a fresh interpreter: begin() on ARGS, then what taken() gives for TAKE (a path, --from, reader options)
_PROBE = """
import json, os, pickle, sys, time
from pathlib import Path
from gpubatch import _prescan
_prescan.MIN_CORES, _prescan.WAIT_S = 1, PATIENCE
began = _prescan.begin(ARGS)
pid = _prescan._PENDING[0][3] if _prescan._PENDING else None
src, fmt, options = TAKE
reader = _prescan.taken(Path(src), fmt, options)
try:
    os.waitpid(pid, 0)
    reaped = False
except (ChildProcessError, TypeError):
    reaped = True
out = {"began": began, "reaped": reaped, "taken": reader is not None}
if reader is not None:
    from gpubatch.formats import open_reader
    with open_reader(Path(src)) as own:
        same = [own.entries() == reader.entries(), own.info() == reader.info(), own.warnings == reader.warnings,
                own.left_out == reader.left_out, own.format_name == reader.format_name, own.path == reader.path]
    out.update(same=same, entries=len(reader.entries()))
print(json.dumps(out))
"""


def _probe(args: list[str], take: tuple, wait: float = 60.0) -> dict:
    script = _PROBE.replace("ARGS", repr(args)).replace("TAKE", repr(take)).replace("PATIENCE", repr(wait))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _untidy(imagenet: Path) -> Path:
    """sample_data's folder with what a scan lists apart: a broken link, notes, an image outside every class."""
    (imagenet / next(p.name for p in imagenet.iterdir() if p.is_dir()) / "gone.jpg").symlink_to(imagenet / "nowhere")
    (imagenet / "README.txt").write_text("notes")
    (imagenet / "stray.jpg").write_bytes(b"x")
    return imagenet


def test_the_run_takes_the_reader_listed_ahead_as_its_own_would_be(imagenet):
    src = str(_untidy(imagenet))
    seen = _probe(["convert", src, "out", "--to", "webdataset"], (src, None, {}))
    assert seen["began"] and seen["taken"] and seen["reaped"]
    assert seen["same"] == [True] * 6 and seen["entries"] == 61  # (60 images and the broken link, named as damaged)


@pytest.mark.parametrize("take", ["another", "from", "options"])
def test_a_run_that_opens_its_source_otherwise_lists_it_itself_and_the_process_ends(imagenet, tmp_path, take):
    src = str(imagenet)
    other = tmp_path / "other"
    other.mkdir()
    wanted = {"another": (str(other), None, {}), "from": (src, "folder", {}),
              "options": (src, None, {"path_column": "p"})}[take]
    seen = _probe(["convert", src, "out", "--to", "webdataset"], wanted)
    assert seen == {"began": True, "reaped": True, "taken": False}


def test_a_run_that_gets_there_before_the_listing_is_done_and_waited_for_lists_the_source_itself(imagenet):
    src = str(imagenet)
    seen = _probe(["convert", src, "out", "--to", "webdataset"], (src, None, {}), wait=0.0)  # (it has just begun)
    assert seen == {"began": True, "reaped": True, "taken": False}


def test_a_source_whose_reader_holds_files_is_listed_by_the_run(tmp_path, imagenet):
    from gpubatch.api import convert

    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=20)
    seen = _probe(["convert", str(tmp_path / "wds"), "out"], (str(tmp_path / "wds"), None, {}))
    assert seen == {"began": True, "reaped": True, "taken": False}  # (its process said no: tar files stay open)


def test_nothing_is_forked_where_the_command_may_not_or_the_host_has_few_cores():
    script = """
import json, threading, time
from gpubatch import _prescan
args = ["convert", "sample_data/imagenet", "out"]
few = _prescan.begin(args)  # (MIN_CORES as it is: this machine's cores decide)
_prescan.MIN_CORES = 1
t = threading.Thread(target=time.sleep, args=(0.5,))
t.start()
threads = _prescan.begin(args)
t.join()
print(json.dumps([few, threads, len(_prescan._PENDING)]))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert done.returncode == 0, done.stderr[-2000:]
    few, threads, pending = json.loads(done.stdout.strip().splitlines()[-1])
    assert few == (len(os.sched_getaffinity(0)) >= _prescan.MIN_CORES) and threads is False
    assert pending == (1 if few else 0)


#: the command as a user runs it, with the fewest cores lowered to one; prints whether its run took the listing
_COMMAND = cli_script("""from gpubatch import _prescan
_prescan.MIN_CORES, _prescan.WAIT_S = 1, 60.0
real, took = _prescan.taken, []
_prescan.taken = lambda *a: took.append(real(*a)) or took[-1]""", "[r is not None for r in took]")


@pytest.mark.parametrize("to", ["webdataset", "folder"])
def test_the_commands_output_is_the_same_whichever_process_listed_its_source(imagenet, tmp_path, to):
    _untidy(imagenet)
    seen = {}
    for name, env in (("ahead", {}), ("itself", {"GPUBATCH_EARLY_START": "0"})):
        args = ["convert", str(imagenet), str(tmp_path / name), "--to", to, "--shard-size", "16", "--workers", "2",
                "--quiet"]
        done = subprocess.run([sys.executable, "-c", _COMMAND.replace("ARGS", repr(args))], cwd=ROOT,
                              capture_output=True, text=True, timeout=120, env=child_env(**env))
        assert done.returncode == 0, done.stderr[-2000:]
        seen[name] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"ahead": [True], "itself": [False]}
    assert digest(tmp_path / "ahead") == digest(tmp_path / "itself")
