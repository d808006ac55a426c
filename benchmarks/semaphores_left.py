#!/usr/bin/env python3
"""Which of multiprocessing's named semaphores a command leaves to the resource tracker (the tracker unlinks them
at its end and warns "There appear to be N leaked semaphore objects"), and where each was made.

    python3 benchmarks/semaphores_left.py -- python3 -m gpubatch convert SRC DST --to webdataset --device gpu

Every process of the command (its spawned workers too: they inherit ``PYTHONPATH``) logs each semaphore it
registers with the tracker and each it unregisters, through a ``sitecustomize`` module put first on the path;
printed: how many were registered, unregistered and left, and the left ones grouped by process and by the stack
that made them. Found (H200, 2026-12-04, benchmarks/RESULTS.md "16:56 to 17:29"): a GPU image run left nine, its
feed's reader pool and barrier, in the GPU worker, which the run ends without waiting for it; none since
``processes.unlink_semaphores``.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = '''
import os
import traceback

_log = os.environ.get("SEMAPHORES_LOG")
if _log:
    from multiprocessing import resource_tracker as rt

    _reg, _unreg = rt.register, rt.unregister

    def register(name, rtype):
        stack = " | ".join(line.strip().replace("\\n", " ") for line in traceback.format_stack(limit=9)[:-1])
        with open(_log, "a") as f:
            f.write(f"R {os.getpid()} {name} {rtype} {stack}\\n")
        return _reg(name, rtype)

    def unregister(name, rtype):
        with open(_log, "a") as f:
            f.write(f"U {os.getpid()} {name} {rtype}\\n")
        return _unreg(name, rtype)

    rt.register, rt.unregister = register, unregister
'''


def left(log: Path) -> tuple[int, int, dict[str, tuple[str, str]]]:
    """(registered, unregistered, {name: (pid, stack)} of those left) from the hook's log."""
    reg: dict[str, tuple[str, str]] = {}
    unreg: set[str] = set()
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split(" ", 4)
        if parts[0] == "R":
            reg[parts[2]] = (parts[1], parts[4] if len(parts) > 4 else "")
        elif parts[0] == "U":
            unreg.add(parts[2])
    return len(reg), len(unreg), {n: v for n, v in reg.items() if n not in unreg}


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(HOOK)
        log = Path(tmp) / "semaphores.log"
        env = {**os.environ, "SEMAPHORES_LOG": str(log),
               "PYTHONPATH": os.pathsep.join([tmp, *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run(args, env=env)
        registered, unregistered, rest = left(log)
    print(f"exit {done.returncode}: registered {registered}, unregistered {unregistered}, left {len(rest)}")
    for (pid, stack), n in collections.Counter(rest.values()).most_common():
        print(f"  {n} in process {pid}: ...{stack[-600:]}")
    sys.exit(1 if rest else 0)


if __name__ == "__main__":
    main()
