"""The command's process's end: ``os._exit`` with its status once its exit handlers ran and its output is flushed,
Python's own end otherwise (``gpubatch.cli._ending``). CPU tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpubatch.errors import ExitCode
from tests.helpers import ROOT, child_env, run_cli

#: the command as a user runs it, with each os._exit of its own process said on stderr before it is made
_ENDED = """
import os, sys
sys.argv = ["gpubatch", *ARGS]
_exit, pid = os._exit, os.getpid()

def said(code):
    if os.getpid() == pid:
        print(f"OS_EXIT {code}", file=sys.__stderr__, flush=True)
    _exit(code)

os._exit = said
from gpubatch.cli import main
main()
"""


@pytest.mark.parametrize(("args", "code"), [
    (["convert", "SRC", "OUT", "--to", "webdataset", "--json"], ExitCode.OK),
    (["convert", "SRC", "OUT", "--to", "no-such-format"], ExitCode.USAGE),
    (["convert", "MISSING", "OUT", "--to", "webdataset"], ExitCode.USAGE),
])
def test_the_command_ends_with_os_exit_its_status_and_all_of_its_output(imagenet, tmp_path, args, code):
    names = {"SRC": str(imagenet), "OUT": str(tmp_path / "o"), "MISSING": str(tmp_path / "m")}
    given = [names.get(a, a) for a in args]
    p = subprocess.run([sys.executable, "-c", _ENDED.replace("ARGS", repr(given))], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == code, p.stderr
    assert p.stderr.splitlines()[-1] == f"OS_EXIT {int(code)}"  # (the interpreter not torn down: ended at once)
    if code:
        assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    else:
        assert json.loads(p.stdout)["records_out"] == 60  # (the whole of it, flushed before the process ended)


def test_the_end_is_python_s_own_where_an_exit_handler_was_there_before_or_the_command_raised(imagenet, tmp_path):
    before = """
import atexit, sys
atexit.register(lambda: print("EARLIER HANDLER RAN", file=sys.__stderr__, flush=True))
sys.argv = ["gpubatch", *ARGS]
from gpubatch.cli import main
main()
"""
    args = ["convert", str(imagenet), str(tmp_path / "o"), "--to", "webdataset", "-q"]
    p = subprocess.run([sys.executable, "-c", before.replace("ARGS", repr(args))], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "EARLIER HANDLER RAN" in p.stderr
    p = run_cli("--debug", "convert", tmp_path / "missing", tmp_path / "o2", "--to", "webdataset")
    assert p.returncode == 1 and "Traceback" in p.stderr  # (escaped the command: Python's end and status)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("command", ["convert", "info", "formats"])
def test_output_that_cannot_be_written_ends_the_command_with_one_line(imagenet, tmp_path, command):
    dst = tmp_path / "o"
    args = {"convert": ["convert", str(imagenet), str(dst), "--to", "webdataset", "--json", "-q"],
            "info": ["info", str(imagenet), "--json"], "formats": ["formats"]}[command]
    with open("/dev/full", "w") as full:  # (every write fails: No space left on device)
        p = subprocess.run([sys.executable, "-m", "gpubatch", *args], cwd=ROOT, env=child_env(), stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == ExitCode.ERROR and "Traceback" not in p.stderr and "Exception ignored" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the command's output could not be written")
    if command == "convert":  # (the dataset itself is whole, and the line says so)
        assert f"{dst} was written" in lines[0] and json.loads((dst / "gpubatch.json").read_text())["records"] == 60
