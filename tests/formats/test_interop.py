"""What gpubatch writes, read back by independent readers: the tfrecord package, pycocotools,
the webdataset package, plain lmdb with a hand parse of Caffe Datum, and MXNet's RecordIO rules."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import tarfile

import numpy as np
import pytest
from PIL import Image

from gpubatch import convert
from gpubatch.api import open_dataset
from gpubatch.formats import detect
from gpubatch.formats.manifest import MANIFEST_NAME
from gpubatch.report.info import describe
from tests.helpers import content


def _refused(src, out, match):
    """``convert`` and ``describe`` both refuse ``src`` with a one-line error matching ``match``, and
    nothing is written."""
    from gpubatch.errors import GpubatchError

    for run in (lambda: convert(src, out, to="folder"), lambda: describe(src)):
        with pytest.raises(GpubatchError, match=match):
            run()
    assert not out.exists()


def _source(imagenet):
    with open_dataset(imagenet) as r:
        classes = r.info().classes
        return {hashlib.sha256(x.data).hexdigest(): classes[x.label] for x in r}, classes


def test_tfrecord_package_reads_shards_and_index(imagenet, tmp_path):
    from tfrecord.reader import tfrecord_loader

    convert(imagenet, tmp_path / "t", to="tfrecord", shard_size=16)
    src, classes = _source(imagenet)
    seen = {}
    shards = sorted((tmp_path / "t").glob("*.tfrecord"))
    assert len(shards) == 4
    for shard in shards:
        idx = shard.with_suffix(".idx")
        rows = [tuple(map(int, ln.split())) for ln in idx.read_text().splitlines()]
        assert rows[0][0] == 0 and rows[-1][0] + rows[-1][1] == shard.stat().st_size
        for ex in tfrecord_loader(str(shard), str(idx), {"image/encoded": "byte", "image/class/label": "int",
                                                          "image/height": "int", "image/width": "int",
                                                          "image/object/bbox/xmin": "float"}):
            seen[hashlib.sha256(ex["image/encoded"]).hexdigest()] = classes[int(ex["image/class/label"][0])]
            assert ex["image/height"][0] > 0 and ex["image/width"][0] > 0
            assert len(ex["image/object/bbox/xmin"]) == 0
    assert seen == src


def test_tfrecord_crc_is_tensorflows(imagenet, tmp_path):
    import crc32c

    def masked(b):
        c = crc32c.crc32c(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    assert masked(b"\x00" * 8) == 0x07980329  # FORMATS.md test vector for length 0
    convert(imagenet, tmp_path / "t", to="tfrecord", limit=3)
    buf = next((tmp_path / "t").glob("*.tfrecord")).read_bytes()
    pos = 0
    while pos < len(buf):
        (n,) = struct.unpack_from("<Q", buf, pos)
        assert struct.unpack_from("<I", buf, pos + 8)[0] == masked(buf[pos : pos + 8])
        assert struct.unpack_from("<I", buf, pos + 12 + n)[0] == masked(buf[pos + 12 : pos + 12 + n])
        pos += 16 + n
    assert pos == len(buf)


def test_pycocotools_reads_coco(coco, tmp_path):
    from pycocotools.coco import COCO

    convert(coco, tmp_path / "c", to="coco")
    api = COCO(str(tmp_path / "c" / "annotations" / "instances.json"))
    orig = COCO(str(coco / "annotations" / "instances.json"))
    assert sorted(api.getImgIds()) == sorted(orig.getImgIds())
    assert api.getCatIds() == orig.getCatIds()
    for img_id in orig.getImgIds():
        a = sorted((x["category_id"], tuple(x["bbox"])) for x in orig.loadAnns(orig.getAnnIds(imgIds=img_id)))
        b = sorted((x["category_id"], tuple(x["bbox"])) for x in api.loadAnns(api.getAnnIds(imgIds=img_id)))
        assert [x[0] for x in a] == [x[0] for x in b]
        np.testing.assert_allclose([x[1] for x in a], [x[1] for x in b], atol=1e-3)
        info = api.loadImgs(img_id)[0]
        assert (tmp_path / "c" / "images" / info["file_name"]).is_file()
        # masks decode: the polygons are valid for pycocotools
        for ann in api.loadAnns(api.getAnnIds(imgIds=img_id)):
            assert api.annToMask(ann).sum() > 0
            assert isinstance(ann["iscrowd"], int) and isinstance(ann["id"], int)


def test_webdataset_package_reads_shards(imagenet, tmp_path):
    import webdataset as wds

    convert(imagenet, tmp_path / "w", to="webdataset", shard_size=16)
    src, classes = _source(imagenet)
    shards = sorted(str(p) for p in (tmp_path / "w").glob("*.tar"))
    seen = {}
    for sample in wds.WebDataset(shards, shardshuffle=False, empty_check=False):
        img = next(v for k, v in sample.items() if k in ("jpg", "png"))
        seen[hashlib.sha256(img).hexdigest()] = classes[int(sample["cls"])]
    assert seen == src
    for shard in shards:
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                assert m.pax_headers == {} and m.type == tarfile.REGTYPE and m.name.isascii()
                assert "." not in m.name.split(".", 1)[0]


def test_webdataset_dali_index_points_at_member_data(imagenet, tmp_path):
    convert(imagenet, tmp_path / "w", to="webdataset", shard_size=30)
    for idx in (tmp_path / "w").glob("*.idx"):
        lines = idx.read_text().splitlines()
        version, count = lines[0].split()
        assert version == "v1.2" and int(count) == len(lines) - 1 == 30
        raw = idx.with_suffix(".tar").read_bytes()
        with tarfile.open(idx.with_suffix(".tar")) as tf:
            members = {m.name: m for m in tf.getmembers()}
            payloads = {m.name: tf.extractfile(m).read() for m in members.values()}
        for line in lines[1:]:
            f = line.split()
            for i in range(0, len(f), 4):
                ext, off, size, name = f[i], int(f[i + 1]), int(f[i + 2]), f[i + 3]
                assert off % 512 == 0 and name.endswith("." + ext)
                assert raw[off : off + size] == payloads[name]
                assert members[name].offset_data == off and members[name].size == size


def _datum_fields(buf: bytes) -> dict:
    """A minimal, separate protobuf walk of a Datum (tags 0x22 data, 0x28 label, 0x38 encoded)."""

    def varint(i):
        r = s = 0
        while True:
            b = buf[i]
            r |= (b & 0x7F) << s
            i += 1
            if b < 0x80:
                return r, i
            s += 7

    out, i = {}, 0
    while i < len(buf):
        tag = buf[i]
        i += 1
        if tag == 0x22:
            n, i = varint(i)
            out["data"], i = buf[i : i + n], i + n
        else:
            out[tag], i = varint(i)
    return out


def test_lmdb_is_caffe_datum(imagenet, tmp_path):
    import lmdb

    convert(imagenet, tmp_path / "l", to="lmdb")
    src, classes = _source(imagenet)
    env = lmdb.open(str(tmp_path / "l"), readonly=True, lock=False)
    seen, keys = {}, []
    with env.begin() as txn:
        for k, v in txn.cursor():
            keys.append(k)
            d = _datum_fields(v)
            assert d[0x38] == 1  # encoded=true always on the wire
            assert 0x28 in d  # label always on the wire, 0 included
            seen[hashlib.sha256(d["data"]).hexdigest()] = classes[d[0x28]]
    assert seen == src
    assert keys == sorted(keys) and all(k[:9].decode()[:8].isdigit() and k[8:9] == b"_" for k in keys)
    assert int(keys[0][:8]) == 0 and int(keys[-1][:8]) == 59


def test_lmdb_of_plain_image_bytes_reads_and_pickles_are_refused(imagenet, tmp_path):
    import pickle

    import lmdb

    with open_dataset(imagenet) as r:
        images = [rec.data for rec in r][:3]
    env = lmdb.open(str(tmp_path / "raw"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, data in enumerate(images):
            txn.put(f"img{i}".encode(), data)  # the value is the JPEG itself, no Datum
        txn.put(b"__len__", b"3")  # metadata beside the samples, as PyTorch-style LMDBs keep it
        txn.put(b"img9", pickle.dumps((images[0], 1)))
    env.close()
    summary = convert(tmp_path / "raw", tmp_path / "out", to="webdataset")
    assert summary.records_in == 4 and summary.records_out == 3
    assert [e["reason"] for e in summary.skipped] == ["a pickled value: gpubatch does not unpickle (it can run code)"]
    with open_dataset(tmp_path / "out") as r:
        assert sorted(rec.data for rec in r) == sorted(images)


def test_datum_bytes_match_the_spec():
    from gpubatch.formats.lmdb import decode_datum, encode_datum

    assert encode_datum(b"JPEGDATA", 7).hex() == "22084a5045474441544128073801"
    assert encode_datum(b"JPEGDATA", 0).hex().endswith("28003801")
    assert decode_datum(encode_datum(b"x", -1))["label"] == -1


def test_recordio_matches_mxnet_layout(imagenet, tmp_path):
    convert(imagenet, tmp_path / "r", to="recordio")
    rec, idx = tmp_path / "r" / "data.rec", tmp_path / "r" / "data.idx"
    src, classes = _source(imagenet)
    raw = rec.read_bytes()
    seen = {}
    for line in idx.read_text().splitlines():
        key, off = line.split("\t")  # MXNet's Python reader splits on TAB
        off = int(off)
        magic, lrec = struct.unpack_from("<II", raw, off)
        assert magic == 0xCED7230A and off % 4 == 0
        cflag, n = lrec >> 29, lrec & ((1 << 29) - 1)
        assert cflag == 0
        flag, label, id1, id2 = struct.unpack_from("<IfQQ", raw, off + 8)
        assert flag == 0 and id1 == int(key) and id2 == 0
        seen[hashlib.sha256(raw[off + 32 : off + 8 + n]).hexdigest()] = classes[int(label)]
    assert seen == src


def test_recordio_splits_payloads_holding_the_magic():
    from gpubatch.formats.recordio import MAGIC, frame

    payload = b"abcd" + struct.pack("<I", MAGIC) + b"efgh" + struct.pack("<I", MAGIC) + b"ij"
    out = frame(payload)
    parts, pos = [], 0
    while pos < len(out):
        magic, lrec = struct.unpack_from("<II", out, pos)
        assert magic == MAGIC
        n = lrec & ((1 << 29) - 1)
        parts.append((lrec >> 29, out[pos + 8 : pos + 8 + n]))
        pos += 8 + n + (-n % 4)
    assert [c for c, _ in parts] == [1, 2, 3]
    assert struct.pack("<I", MAGIC).join(p for _, p in parts) == payload
    unaligned = b"ab" + struct.pack("<I", MAGIC) + b"cdefg"  # (only a 4-aligned magic splits a record)
    out = frame(unaligned)
    assert struct.unpack_from("<II", out) == (MAGIC, len(unaligned)) and out[8:8 + len(unaligned)] == unaligned
    assert len(out) == 8 + 12 and out.endswith(b"g\x00")  # (11 bytes, padded to 12)


def test_recordio_reads_split_records(tmp_path):
    from gpubatch.formats import get_format
    from gpubatch.formats.base import WriteOptions
    from gpubatch.formats.recordio import MAGIC
    from gpubatch.types import DatasetInfo, Record

    data = b"\xff\xd8\xff\xe0" + struct.pack("<I", MAGIC) * 3 + b"\x00" * 5 + b"\xff\xd9"
    root = tmp_path / "r"
    root.mkdir()
    fmt = get_format("recordio")
    with fmt.writer(root, DatasetInfo(classes=("a", "b")), WriteOptions()) as w:
        w.write(Record(key="x", data=data, label=1))
        w.write(Record(key="y", data=b"plain", label=0))
    recs = list(fmt.reader(root))
    assert [r.data for r in recs] == [data, b"plain"] and [r.label for r in recs] == [1, 0]


@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset", "recordio", "coco", "lmdb", "folder"])
def test_manifest(imagenet, tmp_path, fmt):
    convert(imagenet, tmp_path / "o", to=fmt)
    m = json.loads((tmp_path / "o" / "gpubatch.json").read_text())
    assert m["format"] == fmt and m["records"] == 60
    assert m["classes"] == ["bird", "car", "flower", "mountain"] and m["errors"] == []
    assert m["source"]["format"] == "folder"


@pytest.mark.parametrize("name", ["train.tfrecords", "train00-60.tfrec", "train-00000-of-00001"])
def test_tfrecord_shards_under_tensorflow_and_kaggle_names(imagenet, tmp_path, name):
    convert(imagenet, tmp_path / "t", to="tfrecord")
    (tmp_path / "named").mkdir()
    shutil.copy(tmp_path / "t" / "data-00000-of-00001.tfrecord", tmp_path / "named" / name)
    assert detect(tmp_path / "named").name == "tfrecord"
    assert content(tmp_path / "named") == content(imagenet, "folder")


def test_gzipped_tfrecord_is_refused_with_the_remedy(imagenet, tmp_path):
    import gzip

    from gpubatch.errors import FormatError

    convert(imagenet, tmp_path / "t", to="tfrecord")
    (tmp_path / "gz").mkdir()
    raw = (tmp_path / "t" / "data-00000-of-00001.tfrecord").read_bytes()
    (tmp_path / "gz" / "train.tfrecord.gz").write_bytes(gzip.compress(raw))
    assert detect(tmp_path / "gz").name == "tfrecord"
    with pytest.raises(FormatError, match="gzip-compressed.*unpack the shards first"):
        convert(tmp_path / "gz", tmp_path / "out", to="folder")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["gz", "tgz", "bz2", "xz", "named-tar"])
def test_compressed_webdataset_shards_are_read_as_webdataset_reads_them(imagenet, tmp_path, kind):
    import bz2
    import gzip
    import lzma

    import webdataset as wds

    convert(imagenet, tmp_path / "w", to="webdataset", shard_size=30)
    shards = sorted((tmp_path / "w").glob("*.tar"))
    pack = {"gz": (gzip.compress, "tar.gz"), "tgz": (gzip.compress, "tgz"), "bz2": (bz2.compress, "tar.bz2"),
            "xz": (lzma.compress, "tar.xz"), "named-tar": (gzip.compress, "tar")}[kind]
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(tmp_path / "w" / MANIFEST_NAME, src)  # (the class names)
    for k, shard in enumerate(shards):
        (src / f"train-{k:06d}.{pack[1]}").write_bytes(pack[0](shard.read_bytes()))
    assert detect(src).name == "webdataset"
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 60 and not s.skipped
    assert content(tmp_path / "out") == content(tmp_path / "w")  # every sample, bytes and labels as they were
    shards = [str(p) for p in sorted(src.iterdir()) if p.name != MANIFEST_NAME]
    theirs = [d["__key__"] for d in wds.WebDataset(shards, shardshuffle=False)]
    with open_dataset(src) as r:
        assert [rec.key for rec in r] == theirs  # the samples webdataset itself reads, in its order
    one = convert(shards[0], tmp_path / "one", to="folder")  # a shard as the source
    assert one.records_out == 30


def test_a_damaged_compressed_shard_keeps_what_decompressed_and_lists_the_rest(imagenet, tmp_path):
    import gzip

    convert(imagenet, tmp_path / "w", to="webdataset", shard_size=60)
    (shard,) = (tmp_path / "w").glob("*.tar")
    packed = gzip.compress(shard.read_bytes())
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.tar.gz").write_bytes(packed[: len(packed) * 2 // 3])  # a download cut short
    s = convert(src, tmp_path / "out", to="folder")
    assert 0 < s.records_out < 60 and s.skipped and s.records_out + len(s.skipped) == s.records_in


def test_webdataset_class_names_in_cls_are_named_as_such(imagenet, tmp_path):
    import io

    from gpubatch.errors import GpubatchError

    (tmp_path / "w").mkdir()
    data = next(p for p in imagenet.rglob("*.jpg")).read_bytes()
    with tarfile.open(tmp_path / "w" / "s-000000.tar", "w") as tf:
        for i, (ext, payload) in enumerate([("jpg", data), ("cls", b"dog")] * 2):
            ti = tarfile.TarInfo(f"{i // 2:04d}.{ext}")
            ti.size = len(payload)
            tf.addfile(ti, io.BytesIO(payload))
    with pytest.raises(GpubatchError, match=r"2 x read: .*the \.cls member holds 'dog', not a class index"):
        convert(tmp_path / "w", tmp_path / "out", to="folder")


def test_recordio_multi_label_arrays_survive_or_are_warned(imagenet, tmp_path):
    from gpubatch.formats.recordio import frame

    images = [p.read_bytes() for p in sorted(imagenet.rglob("*.jpg"))[:3]]
    arrays = [[1.0, 3.0], [0.0, 2.0, 5.0], [4.0, 1.0]]  # im2rec --pack-label: flag = count, then the labels
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src" / "multi.rec", "wb") as f:
        for i, (data, labels) in enumerate(zip(images, arrays)):
            f.write(frame(struct.pack("<IfQQ", len(labels), 0.0, i, 0) + struct.pack(f"<{len(labels)}f", *labels) + data))

    def arrays_in(path):
        out = {}
        raw = path.read_bytes()
        pos = 0
        while pos < len(raw):
            _, lrec = struct.unpack_from("<II", raw, pos)
            n = lrec & ((1 << 29) - 1)
            flag = struct.unpack_from("<I", raw, pos + 8)[0]
            labels = list(struct.unpack_from(f"<{flag}f", raw, pos + 32))
            out[hashlib.sha256(raw[pos + 32 + 4 * flag : pos + 8 + n]).hexdigest()] = labels
            pos += 8 + n + (-n % 4)
        return out

    want = arrays_in(tmp_path / "src" / "multi.rec")
    for mid in ("tfrecord", "webdataset"):  # through a format that keeps them in the record's metadata
        s = convert(tmp_path / "src", tmp_path / mid, to=mid)
        assert not s.warnings
        convert(tmp_path / mid, tmp_path / f"{mid}-back", to="recordio")
        assert arrays_in(tmp_path / f"{mid}-back" / "data.rec") == want
    s = convert(tmp_path / "src", tmp_path / "folder", to="folder")
    assert any("multi-label arrays were cut to their first label" in w for w in s.warnings), s.warnings


def test_tensorflow_datasets_tfrecords_read_with_their_class_names(imagenet, tmp_path):
    from tfrecord.writer import TFRecordWriter

    src, classes = _source(imagenet)
    folder = tmp_path / "imagenette" / "1.0.0"  # TensorFlow Datasets' folder and shard names
    folder.mkdir(parents=True)
    (folder / "label.labels.txt").write_text("\n".join(classes) + "\n")
    (folder / "dataset_info.json").write_text('{"name": "imagenette"}')
    with open_dataset(imagenet) as r:
        records = list(r)
    for shard in range(2):
        w = TFRecordWriter(str(folder / f"imagenette-train.tfrecord-{shard:05d}-of-00002"))
        for rec in records[shard::2]:
            w.write({"image": (rec.data, "byte"), "label": (rec.label, "int"), "file_name": (rec.filename.encode(), "byte")})
        w.close()
    (tmp_path / "custom").mkdir()  # no known key: the one bytes feature that is an image
    w = TFRecordWriter(str(tmp_path / "custom" / "x.tfrecord"))
    for rec in records[:3]:
        w.write({"raw_jpeg": (rec.data, "byte"), "caption": (b"a photo", "byte")})
    w.close()

    assert detect(folder).name == "tfrecord"
    with open_dataset(folder) as r:
        assert r.info().classes == classes
        got = {hashlib.sha256(x.data).hexdigest(): classes[x.label] for x in r}
    assert got == src
    with open_dataset(tmp_path / "custom") as r:
        assert [x.data for x in r] == [rec.data for rec in records[:3]]


def test_tfrecord_features_gpubatch_does_not_carry_are_named_in_a_warning(imagenet, tmp_path):
    from tfrecord.writer import TFRecordWriter

    with open_dataset(imagenet) as r:
        records = list(r)[:4]
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(buf, "PNG")
    mask = buf.getvalue()
    src = tmp_path / "seg"
    src.mkdir()
    w = TFRecordWriter(str(src / "seg-train.tfrecord-00000-of-00001"))
    for i, rec in enumerate(records):  # a TFDS segmentation set: a mask beside the image, a caption on some
        feats = {"image": (rec.data, "byte"), "label": (rec.label, "int"), "segmentation_mask": (mask, "byte"),
                 "image/key/sha256": (hashlib.sha256(rec.data).hexdigest().encode(), "byte")}
        if i % 2:
            feats["caption"] = (b"a photo", "byte")
        w.write(feats)
    w.close()

    want = "segmentation_mask (4 records)"
    with open_dataset(src) as r:
        r.info()
        assert len(r.warnings) == 1 and "caption (2 records)" in r.warnings[0] and want in r.warnings[0], r.warnings
        assert "sha256" not in r.warnings[0]
        assert [x.data for x in r] == [rec.data for rec in records]  # the image, not the mask
    assert any(want in m for m in describe(src).warnings)
    s = convert(src, tmp_path / "out", to="folder")
    assert s.records_out == 4 and any(want in m for m in s.warnings), s.warnings
    # every feature of gpubatch's own shards is read, even without their manifest: no warning
    s = convert(src, tmp_path / "back", to="tfrecord")
    (tmp_path / "back" / MANIFEST_NAME).unlink()
    with open_dataset(tmp_path / "back") as r:
        r.info()
        assert not r.warnings


def test_pascal_voc_and_yolo_layouts_are_read_as_such_never_as_class_folders(imagenet, tmp_path):

    jpegs = sorted(imagenet.rglob("*.jpg"))[:3]
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    yolo = tmp_path / "yolo"
    for images, boxes, suffix in ((voc / "JPEGImages", voc / "Annotations", ".xml"),
                                  (yolo / "images" / "train", yolo / "labels" / "train", ".txt")):
        images.mkdir(parents=True)
        boxes.mkdir(parents=True)
        for i, jpg in enumerate(jpegs):
            shutil.copy(jpg, images / f"{i:06d}.jpg")
            (boxes / f"{i:06d}{suffix}").write_text("0 0.5 0.5 0.2 0.2\n" if suffix == ".txt" else "<annotation/>")
    (voc / "SegmentationClass").mkdir()
    shutil.copy(jpegs[0], voc / "SegmentationClass" / "000000.png")
    # above the set: refused as class folders, naming the format that reads it
    _refused(tmp_path / "VOCdevkit", tmp_path / "out", f"laid out as Pascal VOC .*(--from|from_format) voc {voc}, or pass "
             f"{voc / 'JPEGImages'} to take those images alone")
    assert convert(voc / "JPEGImages", tmp_path / "images", to="webdataset", overwrite=True).records_out == 3
    # the set itself: read as VOC and YOLO, boxes and all
    s = convert(voc, tmp_path / "voc-coco", to="coco")
    assert s.src_format == "voc" and s.records_out == 3
    s = convert(yolo, tmp_path / "yolo-coco", to="coco")
    assert s.src_format == "yolo" and s.records_out == 3
    doc = json.loads((tmp_path / "yolo-coco" / "annotations" / "instances.json").read_text())
    assert len(doc["annotations"]) == 3 and [c["id"] for c in doc["categories"]] == [1]
    # class folders that merely share those names are still class folders
    plain = tmp_path / "plain"
    for cls in ("images", "labels"):
        (plain / cls).mkdir(parents=True)
        for jpg in jpegs:
            shutil.copy(jpg, plain / cls / jpg.name)
    with open_dataset(plain) as r:
        assert r.info().classes == ("images", "labels") and len(r) == 6


@pytest.mark.parametrize("fmt,names", [
    ("webdataset", ("train-{:06d}.tar", "val-{:06d}.tar")),
    ("tfrecord", ("imagenette-train.tfrecord-{:05d}-of-00002", "imagenette-validation.tfrecord-{:05d}-of-00002")),
    ("recordio", ("mydata_train{}.rec", "mydata_val{}.rec")),
])
def test_shards_of_two_splits_in_one_folder_are_refused_and_a_pattern_picks_one(imagenet, tmp_path, fmt, names):

    ext = {"webdataset": ".tar", "tfrecord": ".tfrecord", "recordio": ".rec"}[fmt]
    both = tmp_path / "both"
    both.mkdir()
    for split, name in zip(("a", "b"), names):
        convert(imagenet, tmp_path / split, to=fmt, shard_size=20 if split == "a" else 30)
        for i, shard in enumerate(sorted((tmp_path / split).glob(f"*{ext}"))):
            shard.rename(both / name.format(i if fmt != "recordio" else f"-{i}" if i else ""))
            if fmt == "webdataset":  # its index beside it, as DALI wants
                (tmp_path / split / shard.with_suffix(".idx").name).rename(both / name.format(i).replace(".tar", ".idx"))
    shutil.copy(tmp_path / "a" / MANIFEST_NAME, both)  # the class names, for formats that hold none
    _refused(both, tmp_path / "out", r"holds the shards of 2 splits \(.*train \(3 shards\), .*val.* \(2 shards\)\)"
                                     r".*pass one set as a quoted pattern")

    train = {"webdataset": "train-*.tar", "tfrecord": "imagenette-train.tfrecord-*", "recordio": "mydata_train*.rec"}[fmt]
    s = convert(both / train, tmp_path / "train", to="folder")
    assert s.records_out == 60 and content(tmp_path / "train") == content(imagenet)
    assert describe(both / train).records == 60
    braces = {"webdataset": "val-{000000..000001}.tar", "tfrecord": "imagenette-validation.tfrecord-{00000,00001}-of-00002",
              "recordio": "mydata_val{,-1}.rec"}[fmt]
    assert convert(both / braces, tmp_path / "val", to="webdataset").records_out == 60


def test_source_patterns_say_what_is_wrong(imagenet, tmp_path):
    from gpubatch.errors import GpubatchError

    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=20)
    with pytest.raises(GpubatchError, match="no file matches the source pattern .*/nothing-\\*.tar"):
        convert(tmp_path / "wds" / "nothing-*.tar", tmp_path / "out", to="folder")
    with pytest.raises(GpubatchError, match="is no webdataset, tfrecord or recordio shard"):
        convert(imagenet / "bird" / "*.jpg", tmp_path / "out", to="folder")
    with pytest.raises(GpubatchError, match="a source pattern picks shards of webdataset, tfrecord or recordio"):
        convert(tmp_path / "wds" / "*.tar", tmp_path / "out", to="folder", from_format="folder")
    # a pattern's shards, or a shard given alone, are the source: an output beside them is no overlap (a folder of
    # shards is: its next run would read the output's too)
    assert convert(tmp_path / "wds" / "*.tar", tmp_path / "wds" / "out", to="folder").records_out == 60
    assert convert(tmp_path / "wds" / "data-000000.tar", tmp_path / "wds" / "one", to="folder").records_out == 20
    assert content(tmp_path / "wds" / "out") == content(imagenet)
    with pytest.raises(GpubatchError, match="is the source or lies inside it"):
        convert(tmp_path / "wds", tmp_path / "wds" / "again", to="folder")
    with pytest.raises(GpubatchError, match="is the source or lies inside it"):
        convert(tmp_path / "wds" / "*.tar", tmp_path / "wds" / "data-000001.tar", to="folder", overwrite=True)
    shutil.rmtree(tmp_path / "wds" / "out")
    shutil.rmtree(tmp_path / "wds" / "one")
    # a brace pattern's shards that do not exist are skipped entries with their reason, never a silent loss
    s = convert(tmp_path / "wds" / "data-{000000..000004}.tar", tmp_path / "some", to="folder")
    assert s.records_out == 60 and [e["key"] for e in s.skipped] == ["data-000003.tar", "data-000004.tar"]
    assert all("the source pattern names this shard, but there is no such file" in e["reason"] for e in s.skipped)
    with pytest.raises(GpubatchError, match="data-000003.tar.*the source pattern names this shard"):
        convert(tmp_path / "wds" / "data-{000000..000004}.tar", tmp_path / "failed", to="folder", on_error="fail")
    # a folder of numbered shards (-of-NNNNN) that lacks one says so: the shard a skipped entry
    convert(imagenet, tmp_path / "tfr", to="tfrecord", shard_size=20)
    (tmp_path / "tfr" / "data-00001-of-00003.tfrecord").unlink()
    s = convert(tmp_path / "tfr", tmp_path / "tfr-out", to="folder")
    assert s.records_out == 40 and [e["key"] for e in s.skipped] == ["data-00001-of-00003.tfrecord"]
    assert "the set's names count 3 shards (-of-00003), but this one is not in the folder" in s.skipped[0]["reason"]
    # shards whose names differ by no split word are one dataset, read together as before
    for i, shard in enumerate(sorted((tmp_path / "wds").glob("*.tar"))):
        shard.rename(tmp_path / "wds" / f"{['cats', 'dogs', 'birds'][i]}.tar")
    assert convert(tmp_path / "wds", tmp_path / "out", to="folder").records_out == 60


def test_numbered_gaps_name_each_set_s_missing_shards():
    from pathlib import Path

    from gpubatch.formats.base import numbered_gaps

    got = numbered_gaps([Path("d/train-00000-of-00003-6f8a.parquet"), Path("d/train-00002-of-00003-9b2c.parquet"),
                         Path("d/test-00000-of-00001.parquet"), Path("d/imagenette.tfrecord-00001-of-00002"),
                         Path("e/train-00000-of-00002.parquet"), Path("d/data-000000.tar")])
    assert [p for p, _ in got] == ["d/imagenette.tfrecord-00000-of-00002",
                                   "d/train-00001-of-00003*.parquet",  # (each shard's own hash: no name to give)
                                   "e/train-00001-of-00002.parquet"]
    assert "the set's names count 3 shards (-of-00003)" in got[1][1]


def test_split_folders_holding_class_folders_are_refused_not_read_as_two_classes(imagenet, tmp_path):

    root = tmp_path / "ilsvrc"
    for split in ("train", "val"):
        shutil.copytree(imagenet, root / split)
    _refused(root, tmp_path / "out", r"holds split folders \(train/, val/\) with class folders inside.*"
                                     f"pass one split, e.g. {root / 'train'}")
    s = convert(root / "val", tmp_path / "out", to="folder")
    assert s.records_out == 60 and content(tmp_path / "out") == content(imagenet)
    # a class that is named like a split, with its images in it, is a class
    flat = tmp_path / "flat"
    for cls in ("test", "other"):
        (flat / cls).mkdir(parents=True)
        shutil.copy(next(imagenet.rglob("*.jpg")), flat / cls / "a.jpg")
    with open_dataset(flat) as r:
        assert r.info().classes == ("other", "test")


def test_source_patterns_without_braceexpand_or_a_loadable_tfrecord_package(imagenet, tmp_path, monkeypatch):
    import sys

    import gpubatch.formats.tfrecord as tfr
    from gpubatch.errors import DependencyError, GpubatchError

    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=20)
    (tmp_path / "wds" / MANIFEST_NAME).unlink()  # the format told by the shards themselves

    def broken():
        raise DependencyError("the tfrecord package cannot load")

    monkeypatch.setattr(tfr, "example_pb2", broken)  # as on a machine whose protobuf the package does not fit
    monkeypatch.setitem(sys.modules, "braceexpand", None)  # not installed
    s = convert(tmp_path / "wds" / "data-00000[01].tar", tmp_path / "out", to="folder")
    assert s.src_format == "webdataset" and s.records_out == 40
    with pytest.raises(GpubatchError, match="brace patterns need braceexpand: pip install braceexpand"):
        convert(tmp_path / "wds" / "data-{000000..000001}.tar", tmp_path / "out2", to="folder")


def test_webdataset_captions_json_fields_and_other_members_are_kept(imagenet, tmp_path):
    """Image-text shards (jpg + txt + another tool's json, as img2dataset writes them) lose nothing."""
    jpegs = sorted(imagenet.rglob("*.jpg"))[:4]
    src = tmp_path / "cc"
    src.mkdir()
    npy = b"\x93NUMPY\x01\x00" + bytes(range(256))  # bytes that are no UTF-8
    mask = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(mask, "PNG")
    want = {}
    with tarfile.open(src / "00000.tar", "w") as tar:
        for i, jpg in enumerate(jpegs):
            w, h = Image.open(jpg).size
            members = {"jpg": jpg.read_bytes(), "txt": f"a photo, number {i} ünïcode".encode(),
                       "json": json.dumps({"url": f"http://x/{i}.jpg", "width": w, "height": h, "key": f"{i:09d}"}).encode(),
                       "npy": npy, "seg.png": mask.getvalue()}
            members = {"depth.png": mask.getvalue(), **members}  # before the image in the shard
            if i == 3:
                members["json"] = b"[1, 2, 3]"  # a .json that holds no object
            want[f"{i:09d}"] = members
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{i:09d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    def members_of(root):
        out = {}
        for shard in sorted(root.glob("*.tar")):
            with tarfile.open(shard) as tar:
                for m in tar:
                    key, ext = m.name.split(".", 1)
                    out.setdefault(key, {})[ext] = tar.extractfile(m).read()
        return out

    assert describe(src).members == {"depth.png": 4, "json": 4, "npy": 4, "seg.png": 4, "txt": 4}
    s = convert(src, tmp_path / "wds", to="webdataset")
    assert not s.warnings
    assert members_of(tmp_path / "wds") == {k: {**v, "json": json.dumps(json.loads(v["json"]), sort_keys=True).encode()}
                                            for k, v in want.items()}
    # through TFRecord (kept in gpubatch/meta) and back
    convert(src, tmp_path / "tfr", to="tfrecord")
    convert(tmp_path / "tfr", tmp_path / "back", to="webdataset")
    back = members_of(tmp_path / "back")
    for key, members in want.items():
        kept = ("txt", "npy", "seg.png", "depth.png")
        assert {e: back[key][e] for e in kept} == {e: members[e] for e in kept}
        assert json.loads(back[key]["json"]) == json.loads(members["json"])
    # resized: the captions stay, the json's width/height follow the image, a mask member is named in a warning
    s = convert(src, tmp_path / "small", to="webdataset", resize_shorter=32)
    assert any("other image members (.depth.png, .seg.png) were kept as they were" in w for w in s.warnings), s.warnings
    small = members_of(tmp_path / "small")
    for key, members in want.items():
        assert small[key]["txt"] == members["txt"]
        doc = json.loads(small[key]["json"])
        if isinstance(doc, dict):
            w, h = Image.open(io.BytesIO(small[key]["jpg"])).size
            assert (doc["width"], doc["height"]) == (w, h) and min(w, h) == 32 and doc["url"].endswith(".jpg")
    # formats that cannot hold them say so
    s = convert(src, tmp_path / "folder", to="folder")
    assert any("folder cannot hold a sample's other WebDataset members (.depth.png, .json, .npy, .seg.png, .txt" in w
               for w in s.warnings), s.warnings


def test_tfrecord_support_loads_the_example_protobuf_without_the_tfrecord_package_init():
    """The ``tfrecord`` package's ``__init__`` imports ``tfrecord.torch``, so PyTorch where it is installed
    (1.3 s of every worker process on the 2-core CI machine with torch 2.13 CPU): gpubatch loads only its
    protobuf module, and a later ``import tfrecord`` reuses it."""
    import subprocess
    import sys

    code = """
import sys
from gpubatch.formats.tfrecord_example import example_pb2, serialize_example
mod = example_pb2()
assert serialize_example({"label": (3, "int")}) == mod.Example.FromString(serialize_example({"label": (3, "int")})).SerializeToString(deterministic=True)
assert "tfrecord" not in sys.modules and "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m or m.startswith("tfrecord"))
import tfrecord
assert tfrecord.example_pb2 is mod
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_threads_that_ask_for_the_example_protobuf_at_once_all_get_it_whole():
    """``info`` reads TFRecord in threads: each gets the module once loaded whole (a half-made one lost
    28 of 60 records)."""
    import subprocess
    import sys

    code = """
import threading
from gpubatch.formats.tfrecord_example import example_pb2
gate, got = threading.Barrier(16), []
def ask():
    gate.wait()
    try:
        got.append(example_pb2().Example is not None)
    except AttributeError:
        got.append(False)
threads = [threading.Thread(target=ask) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(sum(got), len(got))
"""
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.split() == ["16", "16"], (p.stdout, p.stderr[-1500:])
