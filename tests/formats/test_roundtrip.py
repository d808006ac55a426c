"""Every pair of formats: folder -> X -> Y -> folder keeps every image's bytes and class."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct

import numpy as np
import pytest

from gpubatch import augment, convert
from gpubatch.api import open_dataset
from gpubatch.formats import FORMATS, detect, format_names, get_format
from gpubatch.types import Media
from tests.helpers import content

NAMES = [n for n in format_names() if Media.IMAGE in get_format(n).media]  # the image formats
LABELED = [n for n in NAMES if get_format(n).carries_labels]  # (VOC and YOLO hold boxes, not a class a record)


@pytest.mark.parametrize("fmt", LABELED)
def test_folder_roundtrip(imagenet, tmp_path, fmt):
    mid, back = tmp_path / "mid", tmp_path / "back"
    s = convert(imagenet, mid, to=fmt, shard_size=16)
    assert s.records_out == 60 and not s.skipped and s.passthrough == 60
    assert detect(mid).name == fmt
    convert(mid, back, to="folder")
    assert content(back) == content(imagenet)


@pytest.mark.parametrize("a,b", [p for p in itertools.permutations(LABELED, 2) if "folder" not in p])
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
            names = {c["id"]: c["name"] for c in r.info().categories}
            return {rec.data: (rec.boxes, [names.get(k, k) for k in rec.boxes.labels.tolist()]) for rec in r}

    whole_pixels = fmt in ("voc", "yolo")  # (VOC's corners are whole pixels; YOLO's six decimals of the size)
    src, out = boxes(coco), boxes(tmp_path / "back")
    assert src.keys() == out.keys()
    for data, (b, b_names) in src.items():
        o, o_names = out[data]
        assert o.canvas == b.canvas
        np.testing.assert_allclose(o.xyxy, b.xyxy, atol=1.0 if whole_pixels else 0.02)
        if fmt == "voc":  # (VOC names its classes: the categories are numbered anew, by name)
            assert o_names == b_names
        else:
            assert o.labels.tolist() == b.labels.tolist()
        if fmt not in ("recordio", "voc", "yolo"):  # RecordIO's label array holds class + corners; VOC, YOLO boxes
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
    # an image the list does not name is said (a warning, info's left_out), not left out without a word
    from gpubatch.api import info

    (tmp_path / "mine" / "extra.jpg").write_bytes((tmp_path / "flat" / lines[5].rsplit(" ", 1)[0]).read_bytes())
    s = convert(tmp_path / "mine", tmp_path / "wds", to="webdataset")
    said = f"1 image file under {tmp_path / 'mine'} is not in file_list.txt and left out (extra.jpg)"
    assert s.records_out == 5 and any(w.startswith(said) for w in s.warnings), s.warnings
    assert info(tmp_path / "mine").left_out == {"unlisted": {"count": 1, "names": ["extra.jpg"]}}
    s = convert(tmp_path / "mine" / "file_list.txt", tmp_path / "alone", to="webdataset")  # the list alone
    assert s.records_out == 5 and not any("left out" in w for w in s.warnings), s.warnings


def _labelled_list(root, names, labels, classes):
    """A flat folder with ``file_list.txt`` and a manifest naming ``classes`` (as gpubatch writes one)."""
    from gpubatch.formats.manifest import write_manifest
    from tests.helpers import jpeg_bytes, photo

    root.mkdir()
    for i, name in enumerate(names):
        (root / name).write_bytes(jpeg_bytes(photo(24, 32, seed=i)))
    (root / "file_list.txt").write_text("".join(f"{n} {lab}\n" for n, lab in zip(names, labels)))
    write_manifest(root, {"format": "folder", "classes": list(classes)})


def _sorted_folder_labels(root):
    """Labels as torchvision's ImageFolder gives them: the index of each file's folder among the sorted folders."""
    folders = sorted(d.name for d in root.iterdir() if d.is_dir())
    return {f"{d}/{f.name}": folders.index(d) for d in folders for f in (root / d).iterdir()}


def test_class_folders_never_merge_and_keep_their_labels(tmp_path):
    classes = ["a b", "a_b", "狗", "猫", "Cat", "cat", "x/y"]
    names = [f"{i}.jpg" for i in range(len(classes))]
    _labelled_list(tmp_path / "src", names, range(len(classes)), classes)
    summary = convert(tmp_path / "src", tmp_path / "out", to="folder")
    folders = sorted(d.name for d in (tmp_path / "out").iterdir() if d.is_dir())
    assert len(folders) == len(classes)  # one folder a class, however alike their names
    assert len({f.casefold() for f in folders}) == len(classes)
    assert "狗" in folders and "猫" in folders  # letters of any script are kept
    assert content(tmp_path / "out") == content(tmp_path / "src")  # every record under its own class name
    # these folders do not sort in label order ("Cat" < "a b"), so the summary says so
    assert any("file_list.txt holds the labels" in w for w in summary.warnings)


def test_class_folders_sort_in_label_order_or_a_warning_says_so(imagenet, tmp_path):
    # ImageNet layout in, ImageNet layout out: folders sort as the labels, no warning
    summary = convert(imagenet, tmp_path / "same", to="folder")
    assert not summary.warnings
    out = tmp_path / "same"
    listed = dict(ln.rsplit(" ", 1) for ln in (out / "file_list.txt").read_text().splitlines())
    assert {k: int(v) for k, v in listed.items()} == _sorted_folder_labels(out)
    # classes given in another order than their names sort: the labels stay in file_list.txt, with a warning
    _labelled_list(tmp_path / "zebra", ["z.jpg", "a.jpg"], [0, 1], ["zebra", "apple"])
    summary = convert(tmp_path / "zebra", tmp_path / "z-out", to="folder")
    assert len(summary.warnings) == 1 and "ImageFolder" in summary.warnings[0]
    assert content(tmp_path / "z-out") == content(tmp_path / "zebra")
    # twelve classes known only by number: zero-padded folders sort in label order
    names = [f"{i}.jpg" for i in range(12)]
    _labelled_list(tmp_path / "num", names, range(12), [str(i) for i in range(12)])
    summary = convert(tmp_path / "num", tmp_path / "num-out", to="folder")
    assert not summary.warnings
    assert sorted(d.name for d in (tmp_path / "num-out").iterdir() if d.is_dir())[:3] == ["00", "01", "02"]
    listed = dict(ln.rsplit(" ", 1) for ln in (tmp_path / "num-out" / "file_list.txt").read_text().splitlines())
    assert {k: int(v) for k, v in listed.items()} == _sorted_folder_labels(tmp_path / "num-out")


def test_unlabelled_records_among_classes_survive_a_folder(tmp_path):
    import io
    import tarfile

    from tests.helpers import jpeg_bytes, photo

    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "s-000000.tar", "w") as tf:
        for name, data in [("a.jpg", jpeg_bytes(photo(20, 30, 1))), ("a.cls", b"0"),
                           ("b.jpg", jpeg_bytes(photo(20, 30, 2))), ("b.cls", b"1"),
                           ("0/c.jpg", jpeg_bytes(photo(20, 30, 3))),  # unlabeled, its key's folder named as a class
                           ("d.jpg", jpeg_bytes(photo(20, 30, 4)))]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    summary = convert(tmp_path / "wds", tmp_path / "out", to="folder")
    assert summary.records_out == 4
    assert any("2 of 4 records have no label" in w for w in summary.warnings)
    # every record reads back, with its label or none, and no unlabeled file sits in a class folder
    assert content(tmp_path / "out") == content(tmp_path / "wds")
    assert sorted(p.name for p in (tmp_path / "out" / "0").iterdir()) == ["a.jpg"]
    assert (tmp_path / "out" / "0_c.jpg").is_file() and (tmp_path / "out" / "d.jpg").is_file()


def test_a_link_back_up_the_tree_is_read_once(imagenet, tmp_path):
    import os

    first = sorted(p for p in imagenet.iterdir() if p.is_dir())[0]
    os.symlink("..", first / "up")  # first/up/<first>/up/... : a loop
    os.symlink(str(first), tmp_path / "elsewhere")  # a linked class folder is followed
    (imagenet / "linked").symlink_to(tmp_path / "elsewhere")
    with open_dataset(imagenet) as r:
        keys = [rec.key for rec in r]
    per_class = len(list(first.glob("*.*")))
    assert len(keys) == 60 + per_class and len(set(keys)) == len(keys)


def test_crowd_rle_masks_move_with_the_pixels(coco, tmp_path):
    import json

    from pycocotools.coco import COCO

    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    img = doc["images"][0]
    h, w = img["height"], img["width"]
    mask = np.zeros((h, w), np.uint8)
    mask[40:120, 30:200] = 1
    flat = mask.ravel(order="F")
    edges = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
    doc["annotations"].append({"id": 999, "image_id": img["id"], "category_id": doc["categories"][0]["id"],
                               "bbox": [30, 40, 170, 80], "area": float(mask.sum()), "iscrowd": 1,
                               "segmentation": {"size": [h, w], "counts": np.diff(edges).tolist()}})
    ann_file.write_text(json.dumps(doc))
    augment(coco, tmp_path / "flip", ops="flip(p=1)", device="cpu")
    convert(coco, tmp_path / "half", to="coco", resize_shorter=h // 2, device="cpu")

    def crowd_mask(root):
        api = COCO(str(root / "annotations" / "instances.json"))
        (ann,) = [a for a in api.dataset["annotations"] if a["iscrowd"]]
        return api.annToMask(ann), ann

    flipped, ann = crowd_mask(tmp_path / "flip")
    assert np.array_equal(flipped, mask[:, ::-1]) and ann["area"] == mask.sum()
    half, ann = crowd_mask(tmp_path / "half")
    assert half.shape == (h // 2, round(w * (h // 2) / h))
    assert abs(int(half.sum()) - mask.sum() / 4) < 0.05 * mask.sum() / 4 and ann["area"] == half.sum()


def test_faulty_coco_annotations_are_dropped_or_counted_and_warned(coco, tmp_path):
    import json

    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    before = ann_file.read_bytes()
    good = len(doc["annotations"])
    first, second = doc["images"][0]["id"], doc["images"][1]["id"]
    faults = [
        {"id": 901, "image_id": first, "category_id": 1, "bbox": [10, 10, -5, 20], "iscrowd": 0},  # negative
        {"id": 902, "image_id": first, "category_id": 1, "bbox": [10, 10, 5], "iscrowd": 0},  # 3 numbers
        {"id": 903, "image_id": first, "category_id": 1, "bbox": [10, "a", 5, 5], "iscrowd": 0},  # not a number
        {"id": 904, "image_id": first, "category_id": "cat", "bbox": [1, 1, 5, 5], "iscrowd": 0},
        {"id": 905, "image_id": 777777, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 0},  # no such image
        {"id": 906, "image_id": second, "category_id": 42, "bbox": [2, 2, 6, 6], "iscrowd": 0},  # unknown category
        "not an object",
    ]
    doc["annotations"] += faults
    ann_file.write_text(json.dumps(doc))
    before = ann_file.read_bytes()
    s = convert(coco, tmp_path / "out", to="coco")
    assert ann_file.read_bytes() == before  # the source is never rewritten
    text = "\n".join(s.warnings)
    assert "4 annotations dropped: bbox not four numbers" in text and "(ids 902, 903, 904, ...)" in text
    assert "1 annotation dropped: bbox of negative width or height (ids 901)" in text
    assert "1 annotation with an image_id no image has, not written (ids 905)" in text
    assert "1 annotation with a category_id missing from 'categories' (42)" in text
    out = json.loads((tmp_path / "out" / "annotations" / "instances.json").read_text())
    assert len(out["annotations"]) == good + 1  # the unknown category's box is kept ...
    assert {"id": 42, "name": "42", "supercategory": ""} in out["categories"]  # ... under a category by number
    manifest = json.loads((tmp_path / "out" / "gpubatch.json").read_text())
    assert manifest["warnings"] == s.warnings
    # a pixel op no longer sees the negative box (it used to come out as a mirrored, positive box)
    s = convert(coco, tmp_path / "small", to="webdataset", resize_shorter=64, device="cpu")
    assert s.records_out == 12 and len(s.warnings) == 4


def test_a_coco_annotations_bad_area_or_segmentation_is_left_out_and_no_value_json_lacks_is_written(coco, tmp_path):
    """An annotation's ``area`` that is no number (a string, a list) ended a ``--to coco`` run at its finalize with a
    traceback; a segmentation of no COCO form was written as it came, and NaN or Infinity (which Python's parser
    takes, and some tools write) made an output that pycocotools and browsers refuse. The box is kept, the field left
    out (the box's area written) with a warning; NaN and Infinity a field carries are written as null."""
    import json

    from pycocotools.coco import COCO

    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    anns = doc["annotations"]
    anns[0]["area"], anns[1]["area"], anns[2]["segmentation"] = "000000000001.jpg", [[1, 2, 3]], "x"
    anns[3]["area"] = float("nan")
    doc["categories"][0]["supercategory"] = float("inf")
    ann_file.write_text(json.dumps(doc))  # (Python writes NaN and Infinity, as pandas' to_json may)
    s = convert(coco, tmp_path / "out", to="coco")
    assert s.records_out == 12 and not s.skipped
    text = "\n".join(s.warnings)
    assert "3 annotations with an area that is no number of zero or more: written with their box's area" in text, text
    assert "1 annotation with a segmentation that is neither polygons nor RLE: written without it" in text, text
    out_file = tmp_path / "out" / "annotations" / "instances.json"
    out = json.loads(out_file.read_text(), parse_constant=lambda c: pytest.fail(f"{c} written"))
    assert len(out["annotations"]) == len(anns)
    written = {a["id"]: a for a in out["annotations"]}
    x, y, w, h = anns[0]["bbox"]
    assert written[anns[0]["id"]]["area"] == pytest.approx(w * h, abs=0.01)
    assert written[anns[2]["id"]]["segmentation"] == []
    COCO(str(out_file))  # (strict enough: its json.load would take NaN, the parse above does not)


def test_coco_image_ids_shared_by_two_images_are_warned(coco, tmp_path):
    import json

    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    doc["images"][1]["id"] = doc["images"][0]["id"]
    ann_file.write_text(json.dumps(doc))
    s = convert(coco, tmp_path / "out", to="coco")
    assert s.records_out == 12
    assert any("1 image id used by more than one image" in w for w in s.warnings), s.warnings


KPS = [190, 100, 2, 180, 90, 2, 300, 90, 1]  # nose, left eye, right eye (x, y, visibility)


def _add_person(coco):
    """One person with three keypoints on the first image of the sample COCO set: (height, width)."""
    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    img = doc["images"][0]
    doc["categories"].append({"id": 9, "name": "person", "supercategory": "person",
                              "keypoints": ["nose", "left_eye", "right_eye"], "skeleton": [[1, 2], [1, 3]]})
    doc["annotations"].append({"id": 500, "image_id": img["id"], "category_id": 9, "bbox": [170, 80, 140, 30],
                               "area": 1200.0, "iscrowd": 0, "segmentation": [], "keypoints": KPS, "num_keypoints": 3})
    ann_file.write_text(json.dumps(doc))
    return img["height"], img["width"]


def _person(root):
    out = json.loads((root / "annotations" / "instances.json").read_text())
    (a,) = [a for a in out["annotations"] if a["category_id"] == 9]
    return a


def test_coco_2017_layout_with_one_file_per_split_asks_which_to_read(coco, tmp_path):
    from gpubatch.errors import GpubatchError
    from gpubatch.report.info import describe

    # COCO 2017's layout: annotations/{instances,captions}_{train,val}2017.json, images in train2017/, val2017/
    root = tmp_path / "coco2017"
    (root / "annotations").mkdir(parents=True)
    doc = json.loads((coco / "annotations" / "instances.json").read_text())
    images = sorted(doc["images"], key=lambda im: im["id"])
    for split, part in (("train2017", images[:8]), ("val2017", images[8:])):
        (root / split).mkdir()
        for im in part:
            (root / split / im["file_name"]).write_bytes((coco / "images" / im["file_name"]).read_bytes())
        ids = {im["id"] for im in part}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            dict(doc, images=part, annotations=[a for a in doc["annotations"] if a["image_id"] in ids])))
        (root / "annotations" / f"captions_{split}.json").write_text(json.dumps(
            {"images": part, "annotations": [{"id": i, "image_id": im["id"], "caption": "a photo"}
                                             for i, im in enumerate(part)]}))
    assert detect(root).name == "coco"
    for run in (lambda: convert(root, tmp_path / "out", to="coco"), lambda: describe(root)):
        with pytest.raises(GpubatchError, match=r"holds 2 COCO annotation files \(annotations/instances_train2017.json, "
                                                r"annotations/instances_val2017.json\): pass the one to read as SRC"):
            run()
    assert not (tmp_path / "out").exists()
    s = convert(root / "annotations" / "instances_val2017.json", tmp_path / "val", to="coco")
    assert s.records_out == 4 and not s.warnings
    want = {hashlib.sha256((coco / "images" / im["file_name"]).read_bytes()).hexdigest() for im in images[8:]}
    assert {sha for _, sha in content(tmp_path / "val")} == want  # the val2017 images, found beside the file
    # a captions file read as a detection set says what it is, rather than calling its annotations malformed
    report = describe(root / "annotations" / "captions_val2017.json")
    assert report.records == 4
    assert len(report.warnings) == 1 and "4 annotations with neither bbox nor category_id" in report.warnings[0]


def test_coco_keypoints_move_with_the_pixels_and_mirror_left_and_right(coco, tmp_path):
    h, w = _add_person(coco)
    assert (h, w) == (312, 385)
    augment(coco, tmp_path / "flip", ops="flip(p=1)", device="cpu")
    a = _person(tmp_path / "flip")
    # mirrored: x -> w - x, and the left eye's slot now holds what was the right eye
    mirrored = [w - 190, 100, 2, w - 300, 90, 1, w - 180, 90, 2]
    assert a["keypoints"] == mirrored and a["num_keypoints"] == 3
    convert(coco, tmp_path / "half", to="coco", resize=(h // 2, w // 2), device="cpu")
    a = _person(tmp_path / "half")
    sx, sy = (w // 2) / w, (h // 2) / h
    np.testing.assert_allclose(a["keypoints"], [190 * sx, 100 * sy, 2, 180 * sx, 90 * sy, 2, 300 * sx, 90 * sy, 1],
                               atol=0.01)
    # a crop that leaves the right eye outside: it becomes unlabeled, and is no longer counted
    augment(coco, tmp_path / "crop", ops="center_crop(size=200)", device="cpu")  # columns 92-292, rows 56-256
    a = _person(tmp_path / "crop")
    np.testing.assert_allclose(a["keypoints"][:6], [190 - 92, 100 - 56, 2, 180 - 92, 90 - 56, 2], atol=0.51)
    assert a["keypoints"][6:] == [0, 0, 0] and a["num_keypoints"] == 2
    # through WebDataset (categories in its manifest) the mirror still swaps them
    convert(coco, tmp_path / "wds", to="webdataset")
    augment(tmp_path / "wds", tmp_path / "wflip", ops="flip(p=1)", device="cpu", to="coco")
    assert _person(tmp_path / "wflip")["keypoints"] == mirrored


def test_tfrecord_keypoints_of_the_object_detection_api_are_read_and_written(coco, tmp_path):
    from tfrecord.reader import tfrecord_loader

    h, w = _add_person(coco)
    mirrored = [w - 190, 100, 2, w - 300, 90, 1, w - 180, 90, 2]
    convert(coco, tmp_path / "tfr", to="tfrecord")
    (shard,) = (tmp_path / "tfr").glob("*.tfrecord")
    feats = {"image/object/keypoint/x": "float", "image/object/keypoint/y": "float",
             "image/object/keypoint/visibility": "int", "image/object/keypoint/num": "int",
             "image/object/keypoint/text": "byte", "image/object/class/label": "int"}
    first = next(iter(tfrecord_loader(str(shard), None, feats)))
    person = list(first["image/object/class/label"]).index(9)
    n = len(first["image/object/class/label"])
    # the Object Detection API's layout: normalized, three a box, unlabeled ones for boxes without keypoints
    np.testing.assert_allclose(first["image/object/keypoint/x"][3 * person : 3 * person + 3],
                               [190 / w, 180 / w, 300 / w], rtol=1e-6)
    np.testing.assert_allclose(first["image/object/keypoint/y"][3 * person : 3 * person + 3],
                               [100 / h, 90 / h, 90 / h], rtol=1e-6)
    assert list(first["image/object/keypoint/visibility"]) == [0, 0, 0] * person + [2, 2, 1] + [0, 0, 0] * (
        n - person - 1)
    assert list(first["image/object/keypoint/num"]) == [3 if i == person else 0 for i in range(n)]
    names = [b"nose", b"left_eye", b"right_eye"]
    assert [bytes(t) for t in first["image/object/keypoint/text"]] == [b""] * 3 * person + names + [b""] * 3 * (
        n - person - 1)
    # read back through those features alone (no manifest, no gpubatch/meta): the padded boxes get none
    from tfrecord import example_pb2
    from tfrecord.writer import TFRecordWriter

    bare = tmp_path / "bare"
    bare.mkdir()
    with open(bare / "x.tfrecord", "wb") as f:
        for off, size in (map(int, ln.split()) for ln in shard.with_suffix(".idx").read_text().splitlines()):
            ex = example_pb2.Example.FromString(shard.read_bytes()[off + 12 : off + size - 4])
            del ex.features.feature["gpubatch/meta"]
            data = ex.SerializeToString()
            head = struct.pack("<Q", len(data))
            f.write(head + TFRecordWriter.masked_crc(head) + data + TFRecordWriter.masked_crc(data))
    with open_dataset(bare) as r:
        rec = next(iter(r))
    assert [e.get("keypoints") for e in rec.boxes.extra] == [None] * person + [KPS] + [None] * (n - person - 1)

    # such shards without gpubatch's manifest and metadata, as the Object Detection API's tools write them
    ext = tmp_path / "ext"
    ext.mkdir()
    with open_dataset(tmp_path / "tfr") as r:
        records = list(r)
    writer = TFRecordWriter(str(ext / "coco_train.record-00000-of-00001"))
    for rec in records:
        b = rec.boxes
        nb = b.normalized()
        person = [i for i, c in enumerate(b.labels) if c == 9]
        pts = [[*(np.array(KPS[0::3]) / w), *(np.array(KPS[1::3]) / h)]] if person else []
        writer.write({
            "image/encoded": (rec.data, "byte"), "image/height": (b.canvas[0], "int"), "image/width": (b.canvas[1], "int"),
            "image/object/bbox/xmin": (nb[person, 0].tolist(), "float"), "image/object/bbox/ymin": (nb[person, 1].tolist(), "float"),
            "image/object/bbox/xmax": (nb[person, 2].tolist(), "float"), "image/object/bbox/ymax": (nb[person, 3].tolist(), "float"),
            "image/object/class/label": ([9] * len(person), "int"), "image/object/class/text": ([b"person"] * len(person), "byte"),
            "image/object/keypoint/x": (pts[0][:3] if pts else [], "float"),
            "image/object/keypoint/y": (pts[0][3:] if pts else [], "float"),
            "image/object/keypoint/visibility": (KPS[2::3] if pts else [], "int"),
            "image/object/keypoint/num": ([3] if pts else [], "int"),
            "image/object/keypoint/text": ([b"nose", b"left_eye", b"right_eye"] if pts else [], "byte"),
        })
    writer.close()
    with open_dataset(ext) as r:
        info = r.info()
        assert not r.warnings, r.warnings
    assert [c for c in info.categories if c["id"] == 9][0]["keypoints"] == ["nose", "left_eye", "right_eye"]
    augment(ext, tmp_path / "flip", ops="flip(p=1)", device="cpu", to="coco")
    a = _person(tmp_path / "flip")
    np.testing.assert_allclose(a["keypoints"], mirrored, atol=0.01)  # mirrored, and left and right swapped
    assert a["num_keypoints"] == 3
    out = json.loads((tmp_path / "flip" / "annotations" / "instances.json").read_text())
    assert [c for c in out["categories"] if c["id"] == 9][0]["keypoints"] == ["nose", "left_eye", "right_eye"]


def test_tar_headers_are_tarfiles_own_bytes():
    """gnu_header builds the GNU header tarfile's TarInfo.tobuf makes, for short, long and non-ASCII names,
    any size and time."""
    import tarfile

    from gpubatch.formats.tar_scan import gnu_header

    for name, size, mtime in itertools.product(
            ["a.jpg", "class_7/img_00000001.cls", "x" * 100, "y" * 101, "naïve/ü.jpg", "a b/c-d_e.json"],
            [0, 1, 511, 512, 20_000, 8 << 30], [0, 1_700_000_000]):
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, mtime, 0o644
        info.uname = info.gname = ""
        assert gnu_header(name, size, mtime) == info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"), name


def test_webdataset_keys_made_safe_as_before():
    """safe_key's shortcut for keys that are safe already gives what its rule gives every key."""
    import random

    from gpubatch.formats.webdataset import _KEY_BAD, safe_key

    def rule(key):
        parts = [_KEY_BAD.sub("_", p) for p in key.replace("\\", "/").split("/") if p not in ("", ".", "..")]
        return "/".join(p for p in parts if p) or "sample"

    rng = random.Random(0)
    for _ in range(20_000):
        key = "".join(rng.choice("ab/_-.\\ Ü9") for _ in range(rng.randint(0, 8)))
        assert safe_key(key) == rule(key), key


@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord", "recordio", "folder"])
def test_a_shard_written_many_records_at_once_is_the_shard_written_one_by_one(tmp_path, fmt):
    """write_many (the GPU units' writer hands a batch over) writes the bytes write does record by record,
    and keeps out, with its error, a record that does not fit the format, the others written."""
    from gpubatch.formats.base import WriteOptions
    from gpubatch.formats.sinks import ShardSink
    from gpubatch.formats.webdataset import MEMBERS
    from gpubatch.types import DatasetInfo, Record, ShardTask

    def records():
        out = []
        for i in range(40):
            meta = {"filename": f"img_{i}.jpg"}
            if i % 7 == 3:
                meta[MEMBERS] = {"txt": f"caption {i}"}
            key = f"class_{i % 3}/img_{i:04d}" if i % 5 else f"naïve {i}/" + "k" * (120 if i == 10 else 3)
            out.append(Record(key=key, data=bytes([i]) * (70_000 if i == 9 else 100 + 37 * i), label=i % 3,
                              origin=f"src/{i}", meta=meta))
        out[13] = Record(key="dup", data=b"\xff" * 50, label=1, origin="x", meta={"filename": "dup.jpg"})
        out[14] = Record(key="dup", data=b"\xfe" * 50, label=2, origin="y", meta={"filename": "dup.jpg"})
        # (a member that is not base64: binascii.Error, a ValueError, where the format keeps members)
        out[20] = Record(key="bad", data=b"\x01" * 60, label=0, origin="z",
                         meta={"filename": "bad.jpg", MEMBERS: {"txt": {"base64": "abcde"}}})
        return out

    info = DatasetInfo(classes=("a", "b", "c"))
    name = {"webdataset": "data-00000.tar", "tfrecord": "data-00000.tfrecord", "recordio": "data-00000.rec"}.get(fmt, "p0")
    task = ShardTask(0, 0, 40, name)
    got = {}
    for way in ("one", "many"):
        root = tmp_path / way
        root.mkdir()
        sink = get_format(fmt).sink(root, task, info, WriteOptions())
        recs = records()
        if way == "one":  # (the sinks' base write_many: write, record by record)
            errors = ShardSink.write_many(sink, recs)
        else:
            errors = sink.write_many(recs[:17]) + sink.write_many(recs[17:])
        files, extra = sink.commit()
        got[way] = (files, extra, [type(e).__name__ if e else None for e in errors],
                    {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()})
    assert got["one"] == got["many"]
    assert got["many"][3]  # (files were written)
    if fmt == "webdataset":  # (its members' base64 decoded as written)
        assert got["many"][2][20] == "Error" and got["many"][2].count(None) == 39


def test_parquet_is_told_by_its_first_file_and_nothing_else(tmp_path):
    """A folder is Parquet where a ``.parquet`` file lies anywhere under it, not where only a folder so named
    or gpubatch's own run folder holds one (the detection stops at the first file it finds)."""
    from gpubatch.formats.parquet import ParquetFormat

    root = tmp_path / "d"
    (root / "a" / "b").mkdir(parents=True)
    (root / "x.parquet").mkdir()  # (a folder, not a file)
    (root / ".gpubatch").mkdir()
    (root / ".gpubatch" / "spool.parquet").write_bytes(b"PAR1")
    assert not ParquetFormat.detect(root)
    (root / "a" / "b" / "part-0.parquet").write_bytes(b"PAR1")
    assert ParquetFormat.detect(root) and ParquetFormat.detect(root / "a" / "b" / "part-0.parquet")
    assert not ParquetFormat.detect(root / "missing")


def test_folder_entries_come_in_key_order_with_or_without_the_sort():
    """_in_order skips its sort where the paths' order is the keys' already: on random paths (spaces,
    hyphens, dots in names and folders, names sharing a stem) it gives what the sort by key gives."""
    import random

    from gpubatch.formats.files import _strip_ext
    from gpubatch.formats.folder import _in_order

    rng = random.Random(1)
    for _ in range(3000):
        names = set()
        for _ in range(rng.randint(1, 8)):
            stem = "".join(rng.choice("ab_-. Z/") if rng.random() < 0.3 else rng.choice("abZ_")
                           for _ in range(rng.randint(1, 5))).strip("/").replace("//", "/") or "x"
            names.add(f"{stem}.{rng.choice(['jpg', 'png', 'JPEG'])}")
        entries = [(n, 0) for n in sorted(names)]
        assert _in_order(entries, []) == sorted(entries, key=lambda e: _strip_ext(e[0])), entries


def test_one_lmdb_is_read_by_several_readers_of_one_process(imagenet, tmp_path):
    """The library refuses a second open of one database in a process ("already open in this process"):
    a training and a validation loader, or a loader and open_dataset, share its environment, and the last
    reader to close closes it."""
    import gpubatch
    from gpubatch.formats import lmdb as lmdb_format

    convert(imagenet, tmp_path / "db", to="lmdb")
    train = gpubatch.loader(tmp_path / "db", ops="resize(32, 32)", batch_size=16, device="cpu")
    val = gpubatch.loader(tmp_path / "db", ops="resize(24, 24)", batch_size=16, device="cpu", shuffle=False)
    with open_dataset(tmp_path / "db") as r:
        keys = sorted(rec.key for rec in r)
    assert len(keys) == 60 and len(lmdb_format._ENVS) == 1  # (still open: the two loaders hold it)
    assert sum(len(labels) for _, labels in train) == 60 and sum(len(labels) for _, labels in val) == 60
    train.close()
    assert sum(len(labels) for _, labels in val) == 60
    val.close()
    assert not lmdb_format._ENVS


@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord", "parquet"])
def test_nan_and_infinity_a_coco_source_carries_reach_no_output_as_json_lacks_them(coco, tmp_path, fmt):
    """A field gpubatch carries without reading it (an annotation's or an image's own), NaN or Infinity in the source
    (Python's parser takes them, some tools write them), is written as null: strict JSON readers refused the .json
    member, the TFRecord's ``gpubatch/meta`` and the Parquet columns it had reached."""
    import json

    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    for a in doc["annotations"]:
        a["score"] = float("nan")
    for im in doc["images"]:
        im["exposure"] = float("-inf")
    ann_file.write_text(json.dumps(doc))
    s = convert(coco, tmp_path / "out", to=fmt)
    assert s.records_out == 12 and not s.skipped
    blob = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert b"NaN" not in blob and b"Infinity" not in blob
