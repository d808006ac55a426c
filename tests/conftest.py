"""Shared fixtures; tests marked ``gpu`` are skipped (with the reason) where no usable GPU is present, and those
marked ``no_gpu`` (of ``--device auto``'s run on the CPU) where one is; the others run on the CPU either way
(:func:`_the_cpu_suite_on_the_cpu`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
#: the device probe's answer where CUDA sees no device (``CUDA_VISIBLE_DEVICES=""``)
NO_DEVICE = "no CUDA device found"


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords or "no_gpu" in item.keywords for item in items):
        return
    from gpubatch.engine.device import gpu_problem

    problem, _ = gpu_problem(0)
    skip = pytest.mark.skip(reason=f"no usable GPU: {problem}" if problem else
                            "a usable GPU here: --device auto would run on it, and the test is of the CPU's run")
    for item in items:
        if ("gpu" if problem else "no_gpu") in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _the_cpu_suite_on_the_cpu(request, monkeypatch):
    """Tests not marked ``gpu`` are of the CPU path (CI has no GPU). Where a GPU is usable, ``--device auto`` still
    runs them on the CPU: in this process (the device probe answers as it would with no device) and in the
    processes a test starts (no CUDA device visible to them). The GPU's runs are the ``gpu`` tests'."""
    if "gpu" in request.keywords:
        return
    from gpubatch.engine import device

    if device.gpu_problem(0)[0] is not None:
        return
    monkeypatch.setattr(device, "_gpu_problem", lambda index=0: (NO_DEVICE, ""))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")



@pytest.fixture(autouse=True)
def _split_decode_route(request, monkeypatch):
    """GPU tests decode on the split route however loaded the host is ("auto" follows the free cores,
    and two pipelines in one test must split their batches alike); tests of the routes name theirs."""
    if "gpu" in request.keywords:
        monkeypatch.setenv("GPUBATCH_DECODE_ROUTE", "split")


@pytest.fixture
def imagenet(tmp_path: Path) -> Path:
    """A private copy of sample_data/imagenet (60 images, 4 classes)."""
    dst = tmp_path / "imagenet"
    shutil.copytree(SAMPLE / "imagenet", dst)
    return dst


@pytest.fixture
def coco(tmp_path: Path) -> Path:
    """A private copy of sample_data/coco (12 images with boxes and polygons)."""
    dst = tmp_path / "coco"
    shutil.copytree(SAMPLE / "coco", dst)
    return dst
