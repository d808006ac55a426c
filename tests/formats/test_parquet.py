"""Parquet as Hugging Face ``datasets`` writes it: gpubatch's shards read by ``datasets`` with their features
(Image, Audio, ClassLabel, objects), a dataset ``datasets`` saved read as a source, every media, and the
one-line error where pyarrow is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpubatch.api import convert, open_dataset
from gpubatch.errors import FormatError
from tests.helpers import ROOT, content

pytest.importorskip("pyarrow")


def _files(path: Path) -> list[str]:
    return sorted(str(p) for p in path.glob("*.parquet"))


def test_shards_in_row_groups_with_huggingface_features(imagenet, tmp_path):
    import pyarrow.parquet as pq

    s = convert(imagenet, tmp_path / "pq", to="parquet", shard_size=32)
    assert s.records_out == 60 and [Path(f).name for f in _files(tmp_path / "pq")] == [
        "data-00000-of-00002.parquet", "data-00001-of-00002.parquet"]
    f = pq.ParquetFile(_files(tmp_path / "pq")[0])
    assert [f.metadata.row_group(g).num_rows for g in range(f.metadata.num_row_groups)] == [32]
    feats = json.loads(f.schema_arrow.metadata[b"huggingface"])["info"]["features"]
    assert feats["image"] == {"_type": "Image"} and feats["label"]["_type"] == "ClassLabel"
    assert feats["label"]["names"] == ["bird", "car", "flower", "mountain"]
    convert(tmp_path / "pq", tmp_path / "back", to="folder")
    assert content(tmp_path / "back") == content(imagenet)


def test_huggingface_datasets_reads_what_gpubatch_wrote(imagenet, coco, tmp_path):
    datasets = pytest.importorskip("datasets")
    convert(imagenet, tmp_path / "pq", to="parquet", shard_size=25)
    ds = datasets.load_dataset("parquet", data_files=_files(tmp_path / "pq"), split="train")
    assert isinstance(ds.features["image"], datasets.Image) and ds.features["label"].names == [
        "bird", "car", "flower", "mountain"]
    with open_dataset(imagenet) as src:
        truth = {r.key: (r.label, r.data) for r in src}
    assert ds[0]["image"].size[0] > 0  # (decoded by datasets, as PIL images)
    for row in ds.cast_column("image", datasets.Image(decode=False)):
        label, data = truth[row["key"]]
        assert row["label"] == label and row["image"]["bytes"] == data
    convert(coco, tmp_path / "det", to="parquet")
    det = datasets.load_dataset("parquet", data_files=_files(tmp_path / "det"), split="train")
    cats = det.features["objects"]["category"].feature.names
    doc = json.loads(next(coco.rglob("*.json")).read_text())
    assert cats == [c["name"] for c in sorted(doc["categories"], key=lambda c: c["id"])]
    assert sum(len(r["objects"]["bbox"]) for r in det) == len(doc["annotations"])


def test_a_dataset_huggingface_saved_is_a_source(imagenet, tmp_path):
    datasets = pytest.importorskip("datasets")
    files = sorted(imagenet.rglob("*.jpg"))[:10]
    names = ["bird", "car", "flower", "mountain"]
    ds = datasets.Dataset.from_dict(
        {"image": [str(f) for f in files], "label": [names.index(f.parent.name) for f in files]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)}))
    out = tmp_path / "hub" / "data"
    out.mkdir(parents=True)
    ds.to_parquet(str(out / "train-00000-of-00001.parquet"))
    s = convert(tmp_path / "hub", tmp_path / "folder", to="folder")
    assert s.src_format == "parquet" and s.records_out == 10
    got = sorted(p.relative_to(tmp_path / "folder").parts[0] for p in (tmp_path / "folder").rglob("*.jpg"))
    assert got == sorted(f.parent.name for f in files)
    with open_dataset(tmp_path / "hub") as r:
        assert list(r.info().classes) == names
        assert {x.data for x in r} == {f.read_bytes() for f in files}  # (bytes passed through untouched)


def test_audio_and_boxes_round_trip(coco, tmp_path):
    from tests.audio.sounds import speech_commands

    root = speech_commands(tmp_path / "sc")
    convert(root, tmp_path / "apq", to="parquet", device="cpu")
    with open_dataset(tmp_path / "apq") as r:
        assert r.media == "audio" and len(r) == 6 and {x.codec for x in r} == {"wav"}
    convert(tmp_path / "apq", tmp_path / "aback", to="audio", device="cpu")
    assert len(list((tmp_path / "aback").rglob("*.wav"))) == 6
    convert(coco, tmp_path / "bpq", to="parquet")
    convert(tmp_path / "bpq", tmp_path / "bcoco", to="coco")

    def boxes(path):
        with open_dataset(path) as r:
            return {x.data: x.boxes for x in r}

    a, b = boxes(coco), boxes(tmp_path / "bcoco")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k].xyxy, b[k].xyxy, atol=0.02)
        assert a[k].labels.tolist() == b[k].labels.tolist()


def test_audio_features_and_video_clips_round_trip(tmp_path):
    """Every media: audio features (``.npy`` arrays with their rate and kind) and video clips (their bytes)."""
    from tests.helpers import ROOT as root

    convert(root / "sample_data" / "audio", tmp_path / "fpq", to="parquet", sample_rate=16000, mono=True, duration=1,
            features="log-mel(n_mels=80)", device="cpu")
    convert(root / "sample_data" / "audio", tmp_path / "fwds", to="webdataset", sample_rate=16000, mono=True,
            duration=1, features="log-mel(n_mels=80)", device="cpu")
    with open_dataset(tmp_path / "fpq") as a, open_dataset(tmp_path / "fwds") as b:
        got, want = sorted((x.key, x.codec, x.data) for x in a), sorted((x.key, x.codec, x.data) for x in b)
        assert got == want and {x.meta.get("features") for x in a} == {"log_mel"} and a.media == "audio"
    convert(root / "sample_data" / "video", tmp_path / "vpq", to="parquet")
    convert(tmp_path / "vpq", tmp_path / "vback", to="video")
    assert content(tmp_path / "vback") == content(root / "sample_data" / "video")


def test_without_pyarrow_the_error_names_the_extra(imagenet, tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from gpubatch.api import convert\n"
            f"convert({str(imagenet)!r}, {str(tmp_path / 'o')!r}, to='parquet')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "pip install 'gpubatch[parquet]'" in p.stderr
    assert not (tmp_path / "o").exists()


def test_a_parquet_reader_closes_the_files_it_opened(imagenet, tmp_path):
    """The reader opens each file through its own descriptor (a store's file stays the one fetched) and
    closes them with itself: none left open after ``with``."""
    from gpubatch.formats import open_reader

    convert(imagenet, tmp_path / "pq", to="parquet", shard_size=32)
    with open_reader(tmp_path / "pq") as r:
        assert sum(1 for e in r.entries() if r.read(e).data) == 60
        handles = list(r._handles)
    assert len(handles) == 2 and all(f.closed for f in handles)  # (each of the two files opened once)


def test_a_script_that_read_a_parquet_dataset_exits_cleanly(imagenet, tmp_path):
    """pyarrow's thread pool decoding a row group from a Python file object (the reader's own descriptor) aborted the
    process at its exit, "terminate called without an active exception" and SIGABRT (apache/arrow#34314), in about
    half the runs of a script that read a Parquet dataset and ended (pyarrow 21, Python 3.11). The reader decodes
    a row group in one thread: eight such scripts in a row exit 0."""
    convert(imagenet, tmp_path / "pq", to="parquet", shard_size=32)
    script = ("import sys; sys.path.insert(0, sys.argv[2]); import ssl; from gpubatch.api import open_dataset\n"
              "with open_dataset(sys.argv[1]) as r:\n    print(sum(1 for rec in r))\n")
    for _ in range(8):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "pq"), str(ROOT)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "60", (done.returncode, done.stderr[-300:])


@pytest.mark.parametrize("first", [True, False])
def test_a_parquet_file_whose_footer_is_damaged_loses_its_records_alone_and_says_so(imagenet, tmp_path, first):
    """One byte of a file's footer damaged (its metadata no longer reads): the other files' records are written,
    and that file's records are each listed as lost, as many as the dataset's gpubatch.json counts, not the whole
    run ended by the one file (a damaged first file too, which the schema had been read from)."""
    src = tmp_path / "pq"
    convert(imagenet, src, to="parquet", shard_size=16)
    files = sorted(src.glob("*.parquet"))
    bad = files[0 if first else 1]
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0xFF
    bad.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 44 and len(s.skipped) == 16
    assert all(k["reason"].startswith(f"cannot read {bad.name}") for k in s.skipped)
    for f in files:  # every file damaged: the dataset cannot be read, said in one line
        if f != bad:
            f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(FormatError, match="cannot read"):
        convert(src, tmp_path / "out2", to="webdataset")


@pytest.mark.parametrize("first", [True, False])
def test_a_footer_whose_column_name_is_no_utf8_loses_its_files_records_not_a_traceback(imagenet, tmp_path, first):
    """A byte of a column's name in a file's footer damaged into invalid UTF-8: pyarrow raised UnicodeDecodeError
    opening it, a traceback (2026-12-07, `byte_flips.py --media stored --seed 6`). That file's records are lost and
    listed, as for any footer that does not read."""
    src = tmp_path / "pq"
    convert(imagenet, src, to="parquet", shard_size=16)
    files = sorted(src.glob("*.parquet"))
    bad = files[0 if first else 1]
    data = bytearray(bad.read_bytes())
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")  # (its metadata: the schema first)
    at = data.index(b"bytes", footer)  # (the image column's bytes field, as the schema names it)
    data[at + 1] = 0xE1
    bad.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 44 and len(s.skipped) == 16
    assert all(k["reason"].startswith(f"cannot read {bad.name}") for k in s.skipped), s.skipped[0]


def test_a_damaged_text_cell_loses_its_row_alone(imagenet, tmp_path):
    """A byte of one record's key damaged into invalid UTF-8 (Arrow reads the page, Python cannot decode that
    cell): that record is skipped with its reason, the other rows of its row group are written."""
    src = tmp_path / "pq"
    convert(imagenet, src, to="parquet", shard_size=16)
    f = sorted(src.glob("*.parquet"))[-1]
    data = bytearray(f.read_bytes())
    at = data.index(b"mountain/mountain_0")
    data[at + 3] = 0xE7
    f.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 59 and len(s.skipped) == 1
    assert "not valid UTF-8" in s.skipped[0]["reason"] and "Error" not in s.skipped[0]["reason"]
