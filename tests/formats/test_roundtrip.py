"""Every pair of formats: folder -> X -> Y -> folder keeps every image's bytes and class."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpubatch import convert
from gpubatch.api import open_dataset
from gpubatch.formats import FORMATS, detect, format_names
from tests.helpers import content

NAMES = format_names()


@pytest.mark.parametrize("fmt", NAMES)
def test_folder_roundtrip(imagenet, tmp_path, fmt):
    mid, back = tmp_path / "mid", tmp_path / "back"
    s = convert(imagenet, mid, to=fmt, shard_size=16)
    assert s.records_out == 60 and not s.skipped and s.passthrough == 60
    assert detect(mid).name == fmt
    convert(mid, back, to="folder")
    assert content(back) == content(imagenet)


@pytest.mark.parametrize("a,b", [p for p in itertools.permutations(NAMES, 2) if "folder" not in p])
def test_pairs(imagenet, tmp_path, a, b):
    convert(imagenet, tmp_path / "a", to=a, shard_size=25)
    convert(tmp_path / "a", tmp_path / "b", to=b, shard_size=7)
    convert(tmp_path / "b", tmp_path / "back", to="folder")
    assert content(tmp_path / "back") == content(imagenet)


@pytest.mark.parametrize("fmt", [n for n in NAMES if FORMATS[n].carries_boxes])
def test_boxes_survive(coco, tmp_path, fmt):
    convert(coco, tmp_path / "mid", to=fmt, shard_size=5)
    convert(tmp_path / "mid", tmp_path / "back", to="coco")

    def boxes(path):
        with open_dataset(path) as r:
            return {rec.data: rec.boxes for rec in r}

    src, out = boxes(coco), boxes(tmp_path / "back")
    assert src.keys() == out.keys()
    for data, b in src.items():
        o = out[data]
        assert o.canvas == b.canvas
        np.testing.assert_allclose(o.xyxy, b.xyxy, atol=0.02)
        assert o.labels.tolist() == b.labels.tolist()
        if fmt != "recordio":  # RecordIO's label array holds class + corners only
            assert [e.get("segmentation") for e in o.extra] == [e.get("segmentation") for e in b.extra]


@pytest.mark.parametrize("fmt", [n for n in NAMES if not FORMATS[n].carries_boxes])
def test_box_loss_is_warned(coco, tmp_path, fmt):
    s = convert(coco, tmp_path / "out", to=fmt)
    assert any("boxes were dropped" in w for w in s.warnings)


def test_shards_never_hold_one_record(imagenet, tmp_path):
    from gpubatch.formats.tfrecord import shard_files

    convert(imagenet, tmp_path / "t", to="tfrecord", shard_size=59)  # 60 = 59 + 1 -> one shard of 60
    shards = shard_files(tmp_path / "t")
    assert [p.name for p in shards] == ["data-00000-of-00001.tfrecord"]
    convert(imagenet, tmp_path / "t2", to="tfrecord", shard_size=20, name="train")
    names = sorted(p.name for p in (tmp_path / "t2").iterdir())
    assert "train-00002-of-00003.tfrecord" in names and "train-00002-of-00003.idx" in names


def test_shuffle_and_limit(imagenet, tmp_path):
    convert(imagenet, tmp_path / "a", to="webdataset", shuffle=True, seed=3, limit=10)
    convert(imagenet, tmp_path / "b", to="webdataset", shuffle=True, seed=3, limit=10)
    convert(imagenet, tmp_path / "c", to="webdataset", shuffle=True, seed=4, limit=10)
    keys = [[r.key for r in open_dataset(tmp_path / x)] for x in "abc"]
    assert len(keys[0]) == 10 and keys[0] == keys[1] and keys[0] != keys[2]


def test_flat_folder_with_file_list(imagenet, tmp_path):
    convert(imagenet, tmp_path / "flat", to="folder", layout="flat")
    lines = (tmp_path / "flat" / "file_list.txt").read_text().splitlines()
    assert len(lines) == 60 and all(len(ln.rsplit(" ", 1)) == 2 for ln in lines)
    assert content(tmp_path / "flat") == content(imagenet)
    # a DALI-style list written by hand, without a manifest: labels are the integers given
    (tmp_path / "mine").mkdir()
    for ln in lines[:5]:
        rel = ln.rsplit(" ", 1)[0]
        (tmp_path / "mine" / rel.replace("/", "_")).write_bytes((tmp_path / "flat" / rel).read_bytes())
    (tmp_path / "mine" / "file_list.txt").write_text(
        "".join(f"{ln.rsplit(' ', 1)[0].replace('/', '_')} {i % 2}\n" for i, ln in enumerate(lines[:5])))
    recs = list(open_dataset(tmp_path / "mine"))
    assert [r.label for r in recs] == [0, 1, 0, 1, 0]
