"""Shared fixtures; tests marked ``gpu`` are skipped (with the reason) where no usable GPU is present, and those
marked ``no_gpu`` (of ``--device auto``'s run on the CPU) where one is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"


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
