"""Worker processes' end: :func:`gpubatch.engine.processes.leave_dying`."""

from __future__ import annotations

import multiprocessing as mp
import time


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
