"""Worker processes' end: :func:`gpubatch.engine.processes.leave_dying`."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from tests.helpers import child_env


def _slow_to_die(seconds: float) -> None:
    """Sleep until ended; then take ``seconds`` to die (as a GPU worker's teardown does)."""
    import signal
    import sys

    def ending(signum: int, frame: object) -> None:
        time.sleep(seconds)
        sys.exit(7)

    signal.signal(signal.SIGTERM, ending)
    time.sleep(60)


def test_processes_left_dying_are_ended_and_reaped_without_the_caller_waiting_for_their_death():
    """The caller goes on at once (the process takes 3 s to die once ended); the process is no longer one of
    multiprocessing's children, so the interpreter's exit would not join it; a thread reaps it when it dies."""
    from gpubatch.engine.processes import leave_dying

    spawn = mp.get_context("spawn")
    slow, quick = spawn.Process(target=_slow_to_die, args=(3.0,)), spawn.Process(target=time.sleep, args=(0,))
    slow.start()
    quick.start()
    while quick.is_alive():  # (dead before the call: nothing to end)
        time.sleep(0.01)
    time.sleep(1.0)  # (the slow one's handler in place)
    t0 = time.perf_counter()
    leave_dying([slow, quick])
    assert time.perf_counter() - t0 < 1.0 and slow.exitcode is None
    assert slow not in mp.active_children() and quick not in mp.active_children()
    deadline = time.time() + 30
    while slow.exitcode is None and time.time() < deadline:
        time.sleep(0.05)
    assert slow.exitcode == 7 and quick.exitcode == 0
    leave_dying([])  # (nothing left: nothing to do)


def test_processes_left_dying_at_the_interpreter_s_exit_are_ended_without_a_thread(monkeypatch):
    """In an ``atexit`` callback Python 3.12 starts no thread (``RuntimeError: can't create new thread at
    interpreter shutdown``): every user error of a run whose workers were started at the command's start ended
    with that traceback under its one line. The processes are ended all the same and left to the system's init."""
    import threading

    from gpubatch.engine.processes import leave_dying

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refused)  # (as at exit on Python 3.12)
    proc = mp.get_context("spawn").Process(target=time.sleep, args=(60,))
    proc.start()
    try:
        leave_dying([proc])
        assert proc not in mp.active_children()
        proc.join(30)
        assert proc.exitcode == -15  # (ended by SIGTERM)
    finally:
        proc.kill()


_FEED_ENDED_UNWAITED = """
import functools, os, signal, sys
from pathlib import Path
from gpubatch.engine import processes
from gpubatch.engine.gpu.feed import RecordFeed
from gpubatch.engine.plan import make_plan
from gpubatch.formats import open_reader

if sys.argv[1] == "keep":  # (the names left to this process's finalizers, as before unlink_semaphores)
    processes.unlink_semaphores = lambda *objects: 0
    import gpubatch.engine.gpu.feed as feed_module
    feed_module.unlink_semaphores = processes.unlink_semaphores
src = Path(sys.argv[2])
reader = open_reader(src, "folder")
feed = RecordFeed(functools.partial(open_reader, src, "folder"), reader.entries(), make_plan(64), batch_size=8,
                  workers=2, depth=2)
feed.start()
n = 0
for fed in feed:
    n += len(fed.blobs)
    fed.done()
print("records", n, flush=True)
feed.close(wait=False)
os.kill(os.getpid(), signal.SIGTERM)  # (as a GPU worker is ended once it said it holds nothing of the run)
"""


def test_a_feed_ended_without_waiting_leaves_no_semaphore_for_the_resource_tracker_to_warn_of(imagenet):
    """A GPU worker's feed (its reader pool and their barrier) in a process ended by SIGTERM right after
    the feed closed without waiting, as ``leave_dying`` ends a finished GPU worker: its semaphores were
    unlinked once the readers had started, so the resource tracker has none to clean up and says nothing;
    left to the process's finalizers (which a killed process never runs), the tracker warns of them."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    runs = {}
    for mode in ("unlink", "keep"):
        done = subprocess.run([sys.executable, "-c", _FEED_ENDED_UNWAITED, mode, str(imagenet)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert "records 60" in done.stdout, (mode, done.stdout, done.stderr[-2000:])
        time.sleep(0.5)  # (the tracker reports once the last process holding it has ended)
        runs[mode] = done.stderr
    assert "leaked semaphore" in runs["keep"], runs["keep"][-2000:]  # (the test can tell)
    assert "leaked" not in runs["unlink"], runs["unlink"][-2000:]


def test_unlinked_semaphores_keep_working_in_the_processes_that_hold_them():
    """Unlinked once every process has them, a queue, a barrier and a pool's queues go on working; their names
    are gone, and nothing is left to unlink at this process's end."""
    from concurrent.futures import ProcessPoolExecutor

    from gpubatch.engine.processes import started_pool, unlink_semaphores

    spawn = mp.get_context("spawn")
    q, barrier = spawn.Queue(), spawn.Barrier(1)
    pool = started_pool(2, "spawn")
    try:
        names = [q._rlock._semlock.name, barrier._cond._lock._semlock.name]
        assert all(Path("/dev/shm", "sem." + n.lstrip("/")).exists() for n in names)
        assert unlink_semaphores(q, barrier, pool) == 3 + 4 + 5  # (a Queue, a Barrier, a pool's two queues)
        assert not any(Path("/dev/shm", "sem." + n.lstrip("/")).exists() for n in names)
        assert unlink_semaphores(q, barrier, pool) == 0
        q.put("still")
        assert q.get(timeout=5) == "still"
        assert barrier.wait(timeout=5) == 0
        assert sorted(pool.map(abs, [-1, -2, 3])) == [1, 2, 3] and isinstance(pool, ProcessPoolExecutor)
    finally:
        pool.shutdown()


def test_a_child_s_death_is_named_by_its_signal_with_its_likely_cause():
    from gpubatch.engine.processes import died

    assert died(3) == "exit code 3" and died(None) == "exit code None"
    assert died(-9).startswith("killed by SIGKILL: ") and "out-of-memory" in died(-9)
    assert died(-7).startswith("killed by SIGBUS: ") and "a full /dev/shm" in died(-7)
    assert died(-15) == "killed by SIGTERM"
    assert died(-1000) == "killed by signal 1000"


def test_a_worker_killed_by_a_signal_fails_the_run_with_the_signal_named(imagenet, tmp_path):
    """A worker that dies of a signal (here SIGBUS, as a write into a full disk's LMDB map ends one) fails the
    run in one line that names the signal and what it most often means; the destination is not made."""
    import subprocess
    import sys

    hook = tmp_path / "hook"  # (every process of the run imports it at its start, the spawned workers too)
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal\n"
        "from gpubatch.formats import webdataset\n"
        "real = webdataset.WebDatasetSink.write_many\n"
        "def write_many(self, records):\n"
        "    if self.task.index == 3:\n"
        "        os.kill(os.getpid(), signal.SIGBUS)\n"
        "    return real(self, records)\n"
        "webdataset.WebDatasetSink.write_many = write_many\n")
    env = child_env(hook)
    script = "import sys\nfrom gpubatch.cli import main\nmain(sys.argv[1:])\n"
    p = subprocess.run([sys.executable, "-c", script, "convert", str(imagenet), str(tmp_path / "out"), "--to",
                        "webdataset", "--shard-size", "5", "--workers", "2"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("error: worker process ") and "killed by SIGBUS: " in lines[-1], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out").exists()


def test_a_worker_out_of_memory_fails_the_run_in_one_line(imagenet, tmp_path):
    import subprocess
    import sys

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "from gpubatch.formats import webdataset\n"
        "real = webdataset.WebDatasetSink.write_many\n"
        "def write_many(self, records):\n"
        "    if self.task.index == 3:\n"
        "        raise MemoryError()\n"
        "    return real(self, records)\n"
        "webdataset.WebDatasetSink.write_many = write_many\n")
    env = child_env(hook)
    p = subprocess.run([sys.executable, "-m", "gpubatch", "convert", str(imagenet), str(tmp_path / "out"), "--to",
                        "webdataset", "--shard-size", "5", "--workers", "2"], env=env, capture_output=True, text=True,
                       timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[-1].startswith("error: worker process ") and "ran out of memory" in lines[-1] and "--workers" in lines[-1]
    assert not (tmp_path / "out").exists()


def test_a_process_that_initialised_the_cuda_driver_forks_no_workers():
    """``fork_safe``: a child forked after this process's ``cuInit`` (the device probe's) could not use CUDA, so such a
    process spawns its workers; before the probe, with one thread and no CuPy, it may fork them."""
    import subprocess
    import sys

    code = ("from gpubatch.engine import device, processes\n"
            "before = processes.fork_safe()\n"
            "device.driver_asked = True  # (as _driver sets it before its cuInit)\n"
            "print(before, processes.fork_safe())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert p.stdout.split() == ["True", "False"], p.stdout + p.stderr


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or not Path("/proc/self/maps").exists(),
                    reason="named semaphores in /dev/shm and /proc: Linux")
def test_a_killed_groups_semaphores_are_removed_and_no_others_made_meanwhile():
    """``tests.helpers.kill_group`` removes the named semaphores the killed group held, and keeps one this
    process made while the group ran: a test suite run in several processes at once (``pytest -n``) lost its
    other tests' worker pools to it (``FileNotFoundError`` in ``SemLock._rebuild``, on a 16-core GPU machine)."""
    import subprocess
    import sys

    from tests.helpers import kill_group, semaphores_now

    before = semaphores_now()
    code = ("import multiprocessing as mp, sys, time\n"
            "lock = mp.get_context('spawn').Lock()\n"
            "print('sem.' + lock._semlock.name.lstrip('/'), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env=child_env())
    try:
        theirs = proc.stdout.readline().strip()
        ours = mp.get_context("spawn").Lock()
        mine = "sem." + ours._semlock.name.lstrip("/")
        assert theirs.startswith("sem.mp-") and {theirs, mine} <= semaphores_now() - before
    finally:
        kill_group(proc, before)
    assert theirs not in semaphores_now() and mine in semaphores_now()
    with ours:  # (still usable: its name was kept)
        pass
