"""Fuzz the readers with damaged datasets: random truncations and byte flips over datasets gpubatch
wrote, a fixed seed, 200 cases a format. Whatever the damage, a run keeps the contract: no traceback
(only gpubatch's one-line errors, exit 1 or 3), every record written or listed as skipped where the
container can be parsed, no staging left behind, the source unchanged."""

from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path

import pytest

from gpubatch.api import convert, info
from gpubatch.errors import GpubatchError
from tests.conftest import SAMPLE

FORMATS = ["folder", "lmdb", "tfrecord", "recordio", "coco", "webdataset"]
CASES = 200
TARGETS = ["webdataset", "tfrecord", "folder", "recordio", "lmdb", "coco"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """A dataset of a dozen small images in each format, written by gpubatch (boxes in the COCO one)."""
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for fmt in FORMATS:
        src = SAMPLE / ("coco" if fmt == "coco" else "imagenet")
        out[fmt] = root / fmt
        convert(src, out[fmt], to=fmt, limit=12, shard_size=5, resize_shorter=24, quality=80)
    return out


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _damage(root: Path, rng: random.Random) -> tuple[str, Path]:
    """Truncate one of the dataset's files at a random byte, or flip a few random bits in it: (what was
    done, the file)."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    f = rng.choice(files) if rng.random() < 0.5 else rng.choices(files, [p.stat().st_size + 1 for p in files])[0]
    raw = bytearray(f.read_bytes())
    if not raw:
        return f"{f.name}: empty", f
    if rng.random() < 0.35:
        cut = rng.randrange(len(raw))
        f.write_bytes(bytes(raw[:cut]))
        return f"{f.name}: cut at {cut}", f
    flips = [rng.randrange(len(raw)) for _ in range(rng.randint(1, 3))]
    for at in flips:
        raw[at] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(raw))
    return f"{f.name}: bits flipped at {flips}", f


def _others_intact(fmt: str, damaged: Path) -> bool:
    """Whether the damage leaves records that no damage can reach: one shard of several (the others are
    whole), or one image file of a folder. Then the run must go on, whatever the damage."""
    if fmt in ("tfrecord", "webdataset", "recordio"):
        return damaged.name != "gpubatch.json"
    return fmt == "folder" and damaged.suffix == ".jpg"


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_datasets_keep_the_contract(pristine, tmp_path, fmt):
    rng = random.Random(f"gpubatch-fuzz-{fmt}")
    outcomes = {"ok": 0, "failed": 0}
    for case in range(CASES):
        src = tmp_path / f"src{case}"
        shutil.copytree(pristine[fmt], src)
        what, damaged = _damage(src, rng)
        before = _digest(src)
        dst = tmp_path / "out" / f"o{case}"
        opts = {"to": TARGETS[case % len(TARGETS)]}
        if case % 5 == 0:
            opts["resize_shorter"] = 16  # decoded, transformed and re-encoded on the CPU
        if case % 7 == 0:
            opts["on_error"] = "fail"
        try:
            s = convert(src, dst, **opts)
        except GpubatchError as e:  # the one-line error a user sees (exit 1, or 3 under --on-error fail)
            assert "on_error" in opts or not _others_intact(fmt, damaged), \
                f"case {case} ({what}): the whole run failed though other records were intact: {e}"
            assert e.exit_code in (1, 3), f"case {case} ({what}): exit {e.exit_code}: {e}"
            assert "\n" not in str(e), f"case {case} ({what}): {e}"
            assert not dst.exists(), f"case {case} ({what}): a failed run left {dst}"
            outcomes["failed"] += 1
        else:
            assert s.records_out + len(s.skipped) == s.records_in, f"case {case} ({what}): {s.as_dict()}"
            outcomes["ok"] += 1
        if case % 4 == 0:
            try:
                report = info(src)
            except GpubatchError as e:
                assert "\n" not in str(e)
            else:
                assert report.records >= 0
        assert _digest(src) == before, f"case {case} ({what}): the source changed"
        left = [p.name for p in (tmp_path / "out").iterdir() if ".gpubatch-" in p.name] \
            if (tmp_path / "out").exists() else []
        assert not left, f"case {case} ({what}): left {left}"
        shutil.rmtree(src)
        shutil.rmtree(dst, ignore_errors=True)
    assert outcomes["ok"] > CASES // 3  # most damage leaves records to convert
