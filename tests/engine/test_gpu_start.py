"""A GPU worker's start in threads (engine/gpu/start.py), in a fresh process each (marked gpu): the instances
it makes are the decoder's, the kernels are loaded, and a decoder built after it decodes as one built
without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.gpu

# one script, booted or not (argv[2]): the engine built, a batch decoded, its pixels saved (argv[1])
_SCRIPT = r"""
import sys
import numpy as np
from gpubatch.engine.gpu import start
from gpubatch.engine.settings import Settings
from gpubatch.engine.device import resolve
from gpubatch.engine.gpu.engine import GpuEngine
from tests.helpers import jpeg_bytes, photo

st = Settings.from_env().with_(decode_route="hardware")
started = sys.argv[2] == "booted"
if started:  # (a worker's boot: the context through the driver, the instances before CuPy)
    start.boot(start.Early(0, st, 3, ("resample", "jpeg")))
    times = start.kernels_ready(0)
    assert {"context", "hardware instances", "nvImageCodec library", "kernels: resample", "kernels: jpeg"} <= set(times)
    held = list(start._STARTS[0].hw)
    assert len(held) == 3, held
eng = GpuEngine(resolve("gpu"), 4, decode_route="hardware", settings=st)
if started:
    assert [id(d) for d in eng.decoder.hw_direct] == [id(d) for d in held]  # the start's instances, taken
    assert start.hardware_instances(0, 3) == []  # (taken once)
eng.warm_up(8, encoder=True)
blobs = [jpeg_bytes(photo(120 + 8 * k, 160, seed=k)) for k in range(6)]
res = eng.decoder.decode(blobs, eng.stream)
got = [np.asarray(a.get()) for a in res.arrays]
eng.close()
np.save(sys.argv[1], np.concatenate([g.ravel() for g in got]))
print("ok")
"""


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_started_worker_decodes_as_an_unstarted_one(tmp_path):
    import numpy as np

    assert "ok" in _run(_SCRIPT, str(tmp_path / "plain.npy"), "plain")
    assert "ok" in _run(_SCRIPT, str(tmp_path / "booted.npy"), "booted")
    assert np.array_equal(np.load(tmp_path / "booted.npy"), np.load(tmp_path / "plain.npy"))

