"""The command's output where stderr is no terminal (rich imported once its run's workers work, the device's line
still first) and its process's end (``os._exit`` with its status once its exit handlers ran). CPU tests."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from gpubatch.errors import ExitCode
from gpubatch.report import console as console_mod
from tests.helpers import ROOT, child_env, run_cli


class _Stream:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("env", [{}, {"TTY_COMPATIBLE": "0"}, {"TTY_COMPATIBLE": "1"}, {"FORCE_COLOR": ""},
                                 {"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "", "FORCE_COLOR": "1"}])
def test_no_terminal_is_said_only_where_rich_finds_none(monkeypatch, tty, env):
    from rich.console import Console

    for name in ("TTY_COMPATIBLE", "FORCE_COLOR", "JUPYTER_COLUMNS", "JUPYTER_LINES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "stderr", _Stream(tty))
    rich_says = Console(stderr=True).is_terminal
    assert console_mod.no_terminal() == (not rich_says)


def test_what_is_said_before_the_console_is_made_is_printed_first_when_it_is(monkeypatch):
    printed: list[str] = []

    class Made:
        def print(self, text: str) -> None:
            printed.append(text)

    made = []

    def make():
        made.append(True)
        for markup in console_mod._said:
            Made().print(markup())
        console_mod._said.clear()
        return Made()

    monkeypatch.setattr(console_mod, "_said", [])
    monkeypatch.setattr(console_mod, "no_terminal", lambda: True)
    fake = type("Cached", (), {"cache_info": staticmethod(lambda: type("I", (), {"currsize": len(made)})()),
                               "__call__": staticmethod(make)})()
    monkeypatch.setattr(console_mod, "console", fake)
    console_mod.say(lambda: "first")
    console_mod.say(lambda: "second")
    assert printed == [] and not made  # (held: no console made, rich not needed yet)
    console_mod.said_out()
    assert printed == ["first", "second"] and made == [True]
    console_mod.say(lambda: "third")  # (the console made: printed at once)
    assert printed == ["first", "second", "third"]


#: a fresh interpreter running the command on ARGS, with whether rich was imported when its run began
_PROBE = """
import json, sys
sys.argv = ["gpubatch", *ARGS]
from gpubatch import runner
seen = {}
real = runner.execute

def execute(*a, **k):
    seen["rich at the run's start"] = any(m == "rich" or m.startswith("rich.") for m in sys.modules)
    return real(*a, **k)

runner.execute = execute
try:
    from gpubatch.cli import main
    main()
finally:
    print("SEEN " + json.dumps(seen), file=sys.__stderr__, flush=True)
"""


def _probe(args: list[str], **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROBE.replace("ARGS", repr(args))], cwd=ROOT, env=child_env(),
                          timeout=300, **popen)


def _seen(stderr: str) -> dict:
    return json.loads(next(ln for ln in stderr.splitlines() if ln.startswith("SEEN "))[5:])


def test_without_a_terminal_rich_comes_once_the_run_began_and_the_device_line_still_comes_first(imagenet, tmp_path):
    p = _probe(["convert", str(imagenet), str(tmp_path / "o"), "--to", "webdataset", "--workers", "2"],
               capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert _seen(p.stderr) == {"rich at the run's start": False}
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("device: cpu  (no pixel option")
    assert any(ln.startswith("convert: ") for ln in lines[1:]) and "records out" in p.stderr


def test_on_a_terminal_the_console_is_made_before_the_run(imagenet, tmp_path):
    primary, secondary = pty.openpty()
    try:
        p = _probe(["convert", str(imagenet), str(tmp_path / "o"), "--to", "webdataset"], stdout=subprocess.PIPE,
                   stderr=secondary, text=True)
        os.close(secondary)
        secondary = -1
        out = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # (the other end closed)
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(primary)
        if secondary != -1:
            os.close(secondary)
    text = out.decode("utf-8", "replace")
    assert p.returncode == 0, text
    assert _seen(text) == {"rich at the run's start": True}
    assert "device:" in text and "records out" in text


def test_a_run_that_fails_prints_the_device_line_before_its_error(imagenet, tmp_path):
    (imagenet / "bird" / "text.jpg").write_bytes(b"this is not an image at all")
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "webdataset", "--on-error", "fail")
    assert p.returncode == ExitCode.BAD_RECORD
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("device: ") and lines[-1].startswith("error: ")


@pytest.mark.parametrize(("args", "code"), [
    (["convert", "SRC", "OUT", "--to", "webdataset", "--json"], ExitCode.OK),
    (["convert", "SRC", "OUT", "--to", "no-such-format"], ExitCode.USAGE),
    (["convert", "MISSING", "OUT", "--to", "webdataset"], None),
])
def test_the_command_ends_with_its_status_and_all_of_its_output(imagenet, tmp_path, args, code):
    given = [str(imagenet) if a == "SRC" else str(tmp_path / "o") if a == "OUT" else str(tmp_path / "m")
             if a == "MISSING" else a for a in args]
    p = subprocess.run([sys.executable, "-m", "gpubatch", *given], cwd=ROOT, env=child_env(), capture_output=True,
                       text=True, timeout=300)
    if code is None:  # (the source's own error, one line)
        assert p.returncode not in (0, 1) and p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    else:
        assert p.returncode == code, p.stderr
    if "--json" in args:
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
