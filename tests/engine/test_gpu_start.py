"""A GPU worker's start in threads (engine/gpu/start.py), in a fresh process each (marked gpu): the instances
it makes are the decoder's, the kernels are loaded, and a decoder built after it decodes as one built
without it; nvImageCodec's library made with only the modules asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.gpu

_STARTED = r"""
import numpy as np
from gpubatch.engine.gpu import start
from gpubatch.engine.settings import Settings
from gpubatch.engine.device import resolve
from gpubatch.engine.gpu.engine import GpuEngine
from tests.helpers import jpeg_bytes, photo

st = Settings.from_env().with_(decode_route="hardware")
start.begin(0, st, 3, modules=("resample", "jpeg"))
times = start.kernels_ready(0)
assert {"context", "hardware instances", "nvImageCodec library", "kernels: resample", "kernels: jpeg"} <= set(times), times
held = list(start._STARTS[0].hw)
assert len(held) == 3, held
eng = GpuEngine(resolve("gpu"), 4, decode_route="hardware", settings=st)
assert [id(d) for d in eng.decoder.hw_direct] == [id(d) for d in held]  # the start's instances, taken
assert start.hardware_instances(0, 3) == []  # (taken once)
eng.warm_up(8, encoder=True)
blobs = [jpeg_bytes(photo(120 + 8 * k, 160, seed=k)) for k in range(6)]
res = eng.decoder.decode(blobs, eng.stream)
got = [np.asarray(a.get()) for a in res.arrays]
eng.close()
np.save(__import__("sys").argv[1], np.concatenate([g.ravel() for g in got]))
print("ok", times)
"""

_PLAIN = r"""
import numpy as np
from gpubatch.engine.settings import Settings
from gpubatch.engine.device import resolve
from gpubatch.engine.gpu.engine import GpuEngine
from tests.helpers import jpeg_bytes, photo

st = Settings.from_env().with_(decode_route="hardware")
eng = GpuEngine(resolve("gpu"), 4, decode_route="hardware", settings=st)
eng.warm_up(8, encoder=True)
blobs = [jpeg_bytes(photo(120 + 8 * k, 160, seed=k)) for k in range(6)]
res = eng.decoder.decode(blobs, eng.stream)
got = [np.asarray(a.get()) for a in res.arrays]
eng.close()
np.save(__import__("sys").argv[1], np.concatenate([g.ravel() for g in got]))
print("ok")
"""

_EXTENSIONS = r"""
import ctypes, io, os, sys, tempfile
from PIL import Image
from gpubatch.engine.codecs import nvimgcodec_c as capi
from tests.helpers import jpeg_bytes, photo

def links():
    return {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("gpubatch-nvimgcodec-")}

before = links()
lib = capi.Library(extensions=tuple(sys.argv[1].split(",")) if sys.argv[1] != "all" else None)
assert links() == before  # (its links are gone once the modules are loaded)

def parsed(blob):
    try:
        return lib.header(lib.code_stream(ctypes.cast(blob, ctypes.c_void_p).value, len(blob))).width
    except Exception:
        return None

buf = io.BytesIO(); Image.new("RGB", (8, 6)).save(buf, "BMP")
print("jpeg", parsed(jpeg_bytes(photo(40, 60, seed=1))), "bmp", parsed(buf.getvalue()))
"""


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_started_worker_decodes_as_an_unstarted_one(tmp_path):
    import numpy as np

    assert "ok" in _run(_STARTED, str(tmp_path / "started.npy"))
    assert "ok" in _run(_PLAIN, str(tmp_path / "plain.npy"))
    assert np.array_equal(np.load(tmp_path / "started.npy"), np.load(tmp_path / "plain.npy"))


def test_the_library_loads_only_the_modules_asked_for():
    assert "jpeg 60 bmp 8" in _run(_EXTENSIONS, "all")
    assert "jpeg 60 bmp None" in _run(_EXTENSIONS, "nvjpeg")
