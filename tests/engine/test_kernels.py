"""The CUDA sources' kernels compiled one at a time (engine/kernels): each kernel behind a guard of its own,
the kernels a chain launches named up front, and a kernel compiled once however many threads ask."""

from __future__ import annotations

import re
import threading
import time

import pytest

from gpubatch.engine import kernels
from gpubatch.engine.gpu.chain import kernels_needed
from gpubatch.engine.spec import parse_chain

MODULES = sorted(p.stem for p in kernels._DIR.glob("*.cu"))


@pytest.mark.parametrize("name", MODULES)
def test_each_kernel_sits_behind_a_guard_of_its_own(name):
    """With ``KEEP_<kernel>`` defined, the file holds that kernel and no other: every definition (a
    ``__global__`` function or a ``*_KERNEL(...)`` instantiation) lies inside its own guard, none nested."""
    guard: str | None = None
    defined: list[str] = []
    for line in (kernels._DIR / f"{name}.cu").read_text().splitlines():
        m = re.match(r"#ifdef KEEP_(\w+)\s*$", line)
        if m:
            assert guard is None, f"{name}.cu: KEEP_{m.group(1)} inside KEEP_{guard}"
            guard = m.group(1)
            continue
        if line.startswith("#endif") and guard is not None:
            guard = None
            continue
        kernel = re.match(r'extern "C" __global__ void (\w+)\(', line) or re.match(r"\w+_KERNEL\((\w+),", line)
        if kernel:
            assert kernel.group(1) == guard, f"{name}.cu: {kernel.group(1)} is not behind KEEP_{kernel.group(1)}"
            defined.append(kernel.group(1))
    assert guard is None, f"{name}.cu: KEEP_{guard} not closed"
    assert defined and defined == list(kernels.kernels_of(name))


def test_a_kernel_that_is_not_there_is_named_with_those_that_are():
    with pytest.raises(KeyError, match=r"kernels/jpeg.cu has no kernel 'jpeg_dtc' \(it has jpeg_dct, jpeg_bits"):
        kernels.kernel("jpeg", "jpeg_dtc")


def _ops(text: str):
    return parse_chain(text)


@pytest.mark.parametrize("chain, expect", [
    ("resize_shorter(256) | center_crop(224)", ["resample_u8_hwc", "resample_u8_hwc_planes"]),
    ("random_resized_crop(224) | flip(p=0.5) | normalize(layout='CHW', dtype='float16')",
     ["resample_f16_chw", "resample_f16_chw_planes"]),
    ("resize(64, 64) | color_jitter(brightness=0.4) | resize(32, 32)",
     ["resample_u8_hwc", "resample_u8_hwc_planes", "step_u8", "stats_u8", "equalize_lut"]),
    ("", ["resample_u8_hwc", "resample_u8_hwc_planes"]),
])
def test_the_kernels_a_chain_launches_are_named_up_front(chain, expect):
    """What a GPU worker's start compiles beside its decoders: the resample variant of the chain's output
    (with and without the decoder's planes), the step kernels where the chain has a step, the JPEG encoder's
    where the run encodes; each one a kernel of its file."""
    ops = _ops(chain) if chain else ()
    got = kernels_needed(ops)
    assert [k for _, k in got] == expect
    jpeg = ("jpeg_dct", "jpeg_bits", "jpeg_pack", "scan_tile", "scan_tiles", "jpeg_layout", "jpeg_stuff")
    assert kernels_needed(ops, encode=True) == (*got, *(("jpeg", k) for k in jpeg))
    for module, name in kernels_needed(ops, encode=True):
        assert name in kernels.kernels_of(module)


def test_a_kernel_is_compiled_once_however_many_threads_ask(monkeypatch):
    """Threads asking at once for one kernel wait for its one compile (a worker's start compiles while the
    warm-up may ask); :func:`load` compiles distinct kernels side by side and times each."""
    monkeypatch.setattr(kernels, "_LOADED", {})
    calls: list[tuple[str, str]] = []
    running: list[int] = [0]
    most: list[int] = [0]
    lock = threading.Lock()

    def slow(module: str, function: str) -> str:
        with lock:
            calls.append((module, function))
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return f"{module}.{function}"

    monkeypatch.setattr(kernels, "_compile", slow)
    pairs = [("jpeg", "jpeg_dct"), ("jpeg", "jpeg_bits"), ("resample", "resample_u8_hwc")]
    got: list[str] = []
    asker = threading.Thread(target=lambda: got.append(kernels.kernel("jpeg", "jpeg_dct")))
    asker.start()
    times = kernels.load(pairs + [("jpeg", "jpeg_dct")])
    asker.join()
    assert sorted(calls) == sorted(pairs)  # (each once, the repeated one and the other thread's included)
    assert most[0] == 3  # (side by side)
    assert got == ["jpeg.jpeg_dct"] and set(times) == {"kernels: jpeg_dct", "kernels: jpeg_bits",
                                                      "kernels: resample_u8_hwc"}
    assert kernels.kernel("resample", "resample_u8_hwc") == "resample.resample_u8_hwc" and len(calls) == 3


@pytest.mark.gpu
def test_no_kernel_of_a_transcode_needs_a_stack():
    """The kernels a GPU transcode launches keep their values in registers and shared memory: a kernel that
    needs a stack makes the driver hold that much local memory for every thread the GPU can run at once
    (576 bytes a thread, about 150 MiB on an H200, broke the --gpu-memory caps' plans)."""
    ops = parse_chain("resize_shorter(256) | center_crop(224) | flip(p=0.5)")
    stacks = {name: kernels.kernel(module, name).attributes["local_size_bytes"]
              for module, name in kernels_needed(ops, encode=True)}
    assert set(stacks.values()) == {0}, stacks
