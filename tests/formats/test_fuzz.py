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
        convert(src, out[fmt], to=fmt, limit=12, shard_size=5, resize_shorter=24, quality=80, device="cpu")
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


# --- a shard cut on a record boundary reads as whole unless its index, the manifest or the tar's end says --


SHARDED = {"webdataset": ("*.tar", ".idx"), "tfrecord": ("*.tfrecord", ".idx"), "recordio": ("*.rec", ".idx")}


def _boundaries(fmt: str, shard: Path) -> list[int]:
    """The byte offsets where the shard's records begin (from the index gpubatch wrote beside it)."""
    idx = shard.with_suffix(".idx").read_text().splitlines()
    if fmt == "webdataset":
        return [int(ln.split()[1]) - 512 for ln in idx[1:]]  # each sample's first header
    if fmt == "tfrecord":
        return [int(ln.split()[0]) for ln in idx]
    return [int(ln.split("\t")[1]) for ln in idx]


def _tally(path: Path) -> tuple[int, list[str]]:
    """(records read whole, reasons of the entries listed as skipped) of a dataset."""
    from gpubatch.api import open_dataset
    from gpubatch.errors import RecordError

    good, bad = 0, []
    with open_dataset(path) as r:
        for e in r.entries():
            try:
                r.read(e)
                good += 1
            except RecordError as err:
                bad.append(err.reason)
    return good, bad


@pytest.mark.parametrize("fmt", sorted(SHARDED))
def test_a_shard_cut_at_every_record_boundary_lists_every_lost_record(tmp_path, fmt):
    src = tmp_path / "src"
    convert(SAMPLE / "imagenet", src, to=fmt, limit=12, shard_size=12, resize_shorter=16, quality=70)
    (shard,) = sorted(src.glob(SHARDED[fmt][0]))
    cuts = _boundaries(fmt, shard)[1:] + [shard.stat().st_size - (1024 if fmt == "webdataset" else 0)]
    whole = shard.read_bytes()
    for n, cut in enumerate(cuts, 1):  # n records remain before the cut
        for keep in ("index", "manifest", "both", "neither"):
            case = tmp_path / f"{fmt}-{n}-{keep}"
            shutil.copytree(src, case)
            (case / shard.name).write_bytes(whole[:cut])
            if keep in ("manifest", "neither"):
                (case / shard.name).with_suffix(".idx").unlink()
            if keep in ("index", "neither"):
                (case / "gpubatch.json").unlink()
            good, bad = _tally(case)
            assert good == n, (fmt, n, keep, bad)
            if keep != "neither":
                assert good + len(bad) == 12, (fmt, n, keep, bad)  # every lost record listed
                assert all("cut short" in b for b in bad), bad
            elif fmt == "webdataset" and n < 12:  # a tar without its end: one entry of unknown extent
                assert len(bad) == 1 and "end-of-archive" in bad[0], bad
            shutil.rmtree(case)


def test_a_tar_cut_between_members_is_a_skipped_record_in_the_summary_not_exit_0_in_silence(tmp_path):
    from tests.helpers import run_cli

    src = tmp_path / "src"
    convert(SAMPLE / "imagenet", src, to="webdataset", limit=40, shard_size=40)
    (shard,) = src.glob("*.tar")
    cut = _boundaries("webdataset", shard)[28]
    shard.write_bytes(shard.read_bytes()[:cut])
    p = run_cli("convert", src, tmp_path / "out", "--to", "tfrecord", "--json")
    assert p.returncode == 0, p.stderr
    import json

    s = json.loads(p.stdout)
    assert s["records_out"] == 28 and len(s["skipped"]) == 12 and s["records_in"] == 40
    assert {e["key"] for e in s["skipped"]} == {f"{k}" for k in _index_keys(src / shard.with_suffix(".idx").name)[28:]}


def _index_keys(idx: Path) -> list[str]:
    return [ln.split()[3].rsplit(".", 1)[0] for ln in idx.read_text().splitlines()[1:]]
