"""A GPU worker's start in threads (engine/gpu/start.py), in a fresh process each (marked gpu): the instances
it makes are the decoder's, the kernels are loaded, and a decoder built after it decodes as one built
without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.gpu

# one script, booted or not (argv[2]: plain; booted, its instances after the first made once asked for; early, made
# right after the first, the default; capped): the engine built, a batch decoded twice, the pixels saved (argv[1])
_SCRIPT = r"""
import sys
import numpy as np
from gpubatch.engine.gpu import start
from gpubatch.engine.settings import Settings
from gpubatch.engine.device import resolve
from gpubatch.engine.gpu.engine import GpuEngine
from tests.helpers import jpeg_bytes, photo

how = sys.argv[2]
st = Settings.from_env().with_(decode_route="hardware", hw_rest_early=how != "booted")
if how != "plain":  # (a worker's boot: the context through the driver, the instances before CuPy)
    start.boot(start.Early(0, st, 3, (("resample", "resample_u8_hwc"), ("jpeg", "jpeg_dct"))))
    times = start.kernels_ready(0)  # (the kernels, the first instance and the library)
    assert {"context", "hardware instance 1", "nvImageCodec library", "kernels", "kernels: resample_u8_hwc",
            "kernels: jpeg_dct"} <= set(times)
    from gpubatch.engine import kernels
    assert {("resample", "resample_u8_hwc"), ("jpeg", "jpeg_dct")} <= set(kernels._LOADED)
    if how == "booted":
        assert "hardware instances after the first" not in times  # (asked for by the decoder: after its warm-up)
eng = GpuEngine(resolve("gpu"), 4, gpu_memory="8GiB" if how == "capped" else None, decode_route="hardware",
                settings=st)
dec = eng.decoder
if how == "capped":  # a capped engine takes every instance at its start (its plan counts them): the start's
    assert len(dec.hw_direct) == 3 and not dec._hw_coming and start._STARTS[0].hw_done.is_set()
    assert "hardware instances after the first" in start._STARTS[0].times and not start._STARTS[0].hw
elif how == "booted":  # the first; the rest are made after the warm-up and taken as they come
    assert len(dec.hw_direct) == 1 and dec._hw_coming == 2, (len(dec.hw_direct), dec._hw_coming)
elif how == "early":  # the first and those made so far; the rest taken as they come
    assert len(dec.hw_direct) >= 1 and len(dec.hw_direct) + dec._hw_coming == 3, (len(dec.hw_direct), dec._hw_coming)
eng.warm_up(8, encoder=True)
blobs = [jpeg_bytes(photo(120 + 8 * k, 160, seed=k)) for k in range(6)]
got = [np.asarray(a.get()) for a in dec.decode(blobs, eng.stream).arrays]
if how != "plain":
    start._STARTS[0].hw_done.wait()
got += [np.asarray(a.get()) for a in dec.decode(blobs, eng.stream).arrays]  # (the start's last instances taken)
assert len(dec.hw_direct) == 3 and not dec._hw_coming, (len(dec.hw_direct), dec._hw_coming)
if how != "plain":
    assert start.hardware_instances(0, 3) == []  # (taken once)
    assert "hardware instances after the first" in start._STARTS[0].times
eng.close()
np.save(sys.argv[1], np.concatenate([g.ravel() for g in got]))
print("ok")
"""


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          errors="replace", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_started_worker_decodes_as_an_unstarted_one(tmp_path):
    """A decoder that takes the start's instances as they come (and one capped, which takes them all at its
    start) decodes as one made without a start."""
    import numpy as np

    for how in ("plain", "booted", "early", "capped"):
        assert "ok" in _run(_SCRIPT, str(tmp_path / f"{how}.npy"), how)
    for how in ("booted", "early", "capped"):
        assert np.array_equal(np.load(tmp_path / f"{how}.npy"), np.load(tmp_path / "plain.npy")), how
