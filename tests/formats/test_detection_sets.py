"""Pascal VOC and YOLO: read with their boxes, flags and splits; written; round trips VOC -> COCO -> YOLO ->
COCO keep every box within 1 px (read back by pycocotools), and category ids survive COCO -> YOLO -> COCO."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpubatch.api import convert, open_dataset
from gpubatch.errors import GpubatchError
from tests.helpers import jpeg_bytes, photo

# (id, (height, width), [(class, xmin, ymin, xmax, ymax, difficult, truncated)])
VOC_SET = [
    ("000005", (240, 320), [("chair", 10, 20, 110, 200, 0, 1), ("person", 150, 30, 300, 235, 1, 0)]),
    ("000007", (200, 300), [("car", 1, 1, 300, 200, 0, 0)]),
    ("000009", (260, 280), [("horse", 40, 50, 200, 250, 0, 1), ("person", 60, 10, 120, 150, 0, 0),
                            ("person", 200, 100, 270, 255, 1, 1)]),
    ("000012", (180, 240), []),
]


def make_voc(root: Path, doctype: str | None = None) -> Path:
    for d in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for k, (i, (h, w), objs) in enumerate(VOC_SET):
        (root / "JPEGImages" / f"{i}.jpg").write_bytes(jpeg_bytes(photo(h, w, seed=k)))
        xml = [f"<annotation><folder>VOC2007</folder><filename>{i}.jpg</filename>",
               f"<size><width>{w}</width><height>{h}</height><depth>3</depth></size>"]
        for name, x0, y0, x1, y1, diff, trunc in objs:
            xml.append(f"<object><name>{name}</name><pose>Left</pose><truncated>{trunc}</truncated>"
                       f"<difficult>{diff}</difficult><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
                       f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>")
        (root / "Annotations" / f"{i}.xml").write_text((doctype or "") + "".join(xml) + "</annotation>")
    (root / "ImageSets" / "Main" / "train.txt").write_text("000005\n000009\n")
    (root / "ImageSets" / "Main" / "person_train.txt").write_text("000005  1\n000007 -1\n000009  1\n")
    return root


def _coco_boxes(path: Path) -> dict[str, list[tuple[str, list[float]]]]:
    """Per image file stem: (category name, [x, y, w, h]) of each box, through pycocotools."""
    from pycocotools.coco import COCO

    coco = COCO(str(path / "annotations" / "instances.json"))
    names = {c["id"]: c["name"] for c in coco.loadCats(coco.getCatIds())}
    out = {}
    for img in coco.loadImgs(coco.getImgIds()):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[img["id"]]))
        out[Path(img["file_name"]).stem] = sorted((names[a["category_id"]], a["bbox"]) for a in anns)
    return out


def test_voc_is_read_with_its_boxes_flags_categories_and_splits(tmp_path):
    voc = make_voc(tmp_path / "VOC2007")
    with open_dataset(voc) as ds:
        assert ds.format_name == "voc"
        cats = [c["name"] for c in ds.info().categories]
        assert cats == ["car", "chair", "horse", "person"]
        records = {r.key: r for r in ds}
    assert sorted(records) == [i for i, _, _ in VOC_SET]
    b = records["000005"].boxes
    assert b.canvas == (240, 320) and b.xyxy.tolist() == [[9, 19, 110, 200], [149, 29, 300, 235]]
    assert b.labels.tolist() == [2, 4] and [dict(e) for e in b.extra] == [
        {"difficult": 0, "truncated": 1, "pose": "Left"}, {"difficult": 1, "truncated": 0, "pose": "Left"}]
    assert len(records["000012"].boxes) == 0
    # a split file: its ids alone, the whole set's categories; a class file leaves its -1 lines out
    with open_dataset(voc / "ImageSets" / "Main" / "train.txt") as ds:
        assert [r.key for r in ds] == ["000005", "000009"] and len(ds.info().categories) == 4
    with open_dataset(voc / "ImageSets" / "Main" / "person_train.txt") as ds:
        assert [r.key for r in ds] == ["000005", "000009"]
    # the flags reach COCO as the annotations' own fields
    convert(voc, tmp_path / "coco", to="coco")
    doc = json.loads((tmp_path / "coco" / "annotations" / "instances.json").read_text())
    assert sorted((a["difficult"], a["truncated"]) for a in doc["annotations"]) == [
        (0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 1)]


def test_voc_to_coco_to_yolo_to_coco_keeps_every_box_within_a_pixel(tmp_path):
    voc = make_voc(tmp_path / "VOC2007")
    convert(voc, tmp_path / "coco1", to="coco")
    convert(tmp_path / "coco1", tmp_path / "yolo", to="yolo")
    assert (tmp_path / "yolo" / "data.yaml").is_file() and len(list((tmp_path / "yolo" / "labels").rglob("*.txt"))) == 4
    convert(tmp_path / "yolo", tmp_path / "coco2", to="coco")
    a, b = _coco_boxes(tmp_path / "coco1"), _coco_boxes(tmp_path / "coco2")
    assert sorted(a) == sorted(b) == sorted(i for i, _, _ in VOC_SET)
    for stem in a:
        assert [n for n, _ in a[stem]] == [n for n, _ in b[stem]], stem
        for (_, x), (_, y) in zip(a[stem], b[stem]):
            assert np.abs(np.array(x) - np.array(y)).max() <= 1.0, (stem, x, y)
    # VOC's own corners: (xmin - 1, ymin - 1) to (xmax, ymax)
    assert a["000007"] == [("car", [0.0, 0.0, 300.0, 200.0])]
    # and back to VOC: the same corners and flags where they were kept (YOLO keeps none)
    convert(tmp_path / "coco1", tmp_path / "voc2", to="voc")
    with open_dataset(tmp_path / "voc2") as ds:
        back = {r.key: r.boxes for r in ds}
    with open_dataset(voc) as ds:
        for r in ds:
            assert back[r.key].xyxy.tolist() == r.boxes.xyxy.tolist()
            assert [dict(e) for e in back[r.key].extra] == [{**e, "occluded": 0} for e in r.boxes.extra]


def test_category_ids_survive_coco_to_yolo_to_coco(coco, tmp_path):
    """COCO's ids need not be 1..N: YOLO's classes are 0..N-1, and data.yaml keeps the ids they stand for."""
    ann = next(coco.rglob("*.json"))
    doc = json.loads(ann.read_text())
    remap = {c["id"]: 3 + 4 * k for k, c in enumerate(sorted(doc["categories"], key=lambda c: c["id"]))}
    for c in doc["categories"]:
        c["id"] = remap[c["id"]]
    for a in doc["annotations"]:
        a["category_id"] = remap[a["category_id"]]
    ann.write_text(json.dumps(doc))
    convert(coco, tmp_path / "coco1", to="coco")
    convert(coco, tmp_path / "yolo", to="yolo")
    import yaml

    data = yaml.safe_load((tmp_path / "yolo" / "data.yaml").read_text())
    assert data["nc"] == len(remap) and list(data["names"]) == list(range(len(remap)))
    assert data["gpubatch_category_ids"] == sorted(remap.values())
    convert(tmp_path / "yolo", tmp_path / "back", to="coco")
    after = json.loads((tmp_path / "back" / "annotations" / "instances.json").read_text())
    assert {(c["id"], c["name"]) for c in after["categories"]} == {(c["id"], c["name"]) for c in doc["categories"]}
    a, b = _coco_boxes(tmp_path / "coco1"), _coco_boxes(tmp_path / "back")
    assert sum(map(len, b.values())) == len(doc["annotations"]) and sorted(a) == sorted(b)
    for stem in a:
        assert [n for n, _ in a[stem]] == [n for n, _ in b[stem]]
        assert all(np.abs(np.array(x) - np.array(y)).max() <= 1.0 for (_, x), (_, y) in zip(a[stem], b[stem]))


def test_yolo_polygons_missing_labels_and_bad_lines(tmp_path):
    root = tmp_path / "yolo"
    for d in ("images/train", "labels/train"):
        (root / d).mkdir(parents=True)
    for k in range(4):
        (root / "images" / "train" / f"im{k}.jpg").write_bytes(jpeg_bytes(photo(100, 200, seed=k)))
    (root / "labels" / "train" / "im0.txt").write_text("1 0.5 0.5 0.5 0.2\n")
    (root / "labels" / "train" / "im1.txt").write_text("0 0.1 0.1 0.6 0.1 0.6 0.9 0.1 0.9\n")  # a polygon
    (root / "labels" / "train" / "im2.txt").write_text("0 0.5 0.5 banana 0.1\n")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/train\nnames:\n  0: cat\n  1: dog\n")
    s = convert(root, tmp_path / "coco", to="coco", on_error="skip")
    assert s.records_out == 3 and len(s.skipped) == 1
    assert s.skipped[0]["key"] == "train/im2" and "line 1" in s.skipped[0]["reason"]
    doc = json.loads((tmp_path / "coco" / "annotations" / "instances.json").read_text())
    cats = {c["id"]: c["name"] for c in doc["categories"]}
    assert cats == {1: "cat", 2: "dog"}
    by_file = {im["id"]: im["file_name"] for im in doc["images"]}
    anns = {by_file[a["image_id"]]: a for a in doc["annotations"]}
    assert anns["train/im0.jpg"]["bbox"] == [50.0, 40.0, 100.0, 20.0] and anns["train/im0.jpg"]["category_id"] == 2
    poly = anns["train/im1.jpg"]
    assert poly["bbox"] == [20.0, 10.0, 100.0, 80.0] and poly["segmentation"] == [[20, 10, 120, 10, 120, 90, 20, 90]]
    assert "train/im3.jpg" in by_file.values()  # (no label file: an image without objects)


def test_boxes_move_with_a_resize_into_yolo_and_voc(tmp_path):
    voc = make_voc(tmp_path / "VOC2007")
    convert(voc, tmp_path / "yolo", to="yolo", resize_shorter=120, device="cpu")
    convert(voc, tmp_path / "yolo-plain", to="yolo")
    for a, b in zip(sorted((tmp_path / "yolo" / "labels").rglob("*.txt")),
                    sorted((tmp_path / "yolo-plain" / "labels").rglob("*.txt"))):
        x = np.loadtxt(a, ndmin=2) if a.read_text() else np.zeros((0, 5))
        y = np.loadtxt(b, ndmin=2) if b.read_text() else np.zeros((0, 5))
        assert x.shape == y.shape and np.abs(x - y).max(initial=0) < 0.01  # normalised: the same after a resize
    convert(voc, tmp_path / "voc-small", to="voc", resize_shorter=120, device="cpu")
    with open_dataset(tmp_path / "voc-small") as ds:
        small = {r.key: r.boxes for r in ds}
    assert small["000005"].canvas == (120, 160)
    assert np.abs(small["000005"].xyxy - np.array([[9, 19, 110, 200], [149, 29, 300, 235]]) / 2).max() <= 1.0


def test_hostile_and_broken_annotations_are_listed_not_read(tmp_path):
    voc = make_voc(tmp_path / "VOC2007")
    (voc / "Annotations" / "000007.xml").write_text(
        '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "xx">]><annotation><filename>&x;</filename></annotation>')
    (voc / "Annotations" / "000012.xml").write_text("<annotation><object><name>cat</name>")
    s = convert(voc, tmp_path / "out", to="coco", on_error="skip")
    reasons = {e["key"]: e["reason"] for e in s.skipped}
    assert s.records_out == 2 and set(reasons) == {"000007", "000012"}
    assert "document type" in reasons["000007"] and "well-formed" in reasons["000012"]
    with pytest.raises(GpubatchError):
        convert(voc, tmp_path / "out2", to="coco", on_error="fail")  # (the first damaged record stops the run)
    shutil.rmtree(voc / "JPEGImages")
    with pytest.raises(GpubatchError):
        convert(voc, tmp_path / "out3", to="coco")


@pytest.mark.parametrize("where,value", [("width", "inf"), ("height", "1e308"), ("width", "-5"), ("height", "nan"),
                                         ("xmax", "inf"), ("ymax", "1e308"), ("xmin", "-inf")])
def test_a_voc_size_or_corner_beyond_any_image_is_its_records_error(tmp_path, where, value):
    """A <size> of infinity ended every run over the set in an OverflowError (the reader parses each XML at its start),
    and a corner of 1e308 overflowed float32 into infinity on the way; both are that record's error now."""
    voc = make_voc(tmp_path / "VOC2007")
    xml = voc / "Annotations" / "000009.xml"
    xml.write_text(re.sub(f"<{where}>[^<]*</{where}>", f"<{where}>{value}</{where}>", xml.read_text(), count=1))
    for to in ("coco", "yolo"):
        s = convert(voc, tmp_path / to, to=to)
        assert s.records_out == 3 and [e["key"] for e in s.skipped] == ["000009"], s.as_dict()
        assert ("<size>" if where in ("width", "height") else "box") in s.skipped[0]["reason"], s.skipped


def test_a_class_a_record_dropped_into_voc_or_yolo_is_said(imagenet, tmp_path):
    for fmt in ("voc", "yolo"):
        s = convert(imagenet, tmp_path / fmt, to=fmt)
        assert s.records_out == 60 and any("classes were dropped" in w for w in s.warnings), s.warnings


def test_images_no_annotation_names_are_said_for_voc_and_coco(tmp_path):
    """A VOC set read whole (every XML) and a COCO folder (its JSON found there) are the images their
    annotations name: an image beside them that none names is said (a warning, ``info``'s ``left_out``),
    not left out without a word; a VOC split or the COCO JSON given as the source reads its list alone."""
    from gpubatch.api import info

    voc = make_voc(tmp_path / "VOC2007")
    (voc / "JPEGImages" / "000099.jpg").write_bytes(jpeg_bytes(photo(60, 80, seed=9)))  # no XML names it
    said = f"1 image file under {voc / 'JPEGImages'} is not in Annotations/ and left out (000099.jpg)"
    s = convert(voc, tmp_path / "coco", to="coco")
    assert s.records_out == len(VOC_SET) and any(w.startswith(said) for w in s.warnings), s.warnings
    assert info(voc).left_out == {"unlisted": {"count": 1, "names": ["000099.jpg"]}}
    s = convert(voc / "ImageSets" / "Main" / "train.txt", tmp_path / "split", to="coco")
    assert s.records_out == 2 and not any("left out" in w for w in s.warnings), s.warnings
    coco = tmp_path / "coco"
    shutil.copy(voc / "JPEGImages" / "000099.jpg", coco / "images" / "extra.jpg")
    said = f"1 image file under {coco / 'images'} is not in instances.json and left out (extra.jpg)"
    s = convert(coco, tmp_path / "wds", to="webdataset")
    assert s.records_out == len(VOC_SET) and any(w.startswith(said) for w in s.warnings), s.warnings
    assert info(coco).left_out == {"unlisted": {"count": 1, "names": ["extra.jpg"]}}
    s = convert(coco / "annotations" / "instances.json", tmp_path / "alone", to="webdataset")
    assert s.records_out == len(VOC_SET) and not any("left out" in w for w in s.warnings), s.warnings


def test_yolo_labels_without_an_image_are_said_and_a_broken_image_link_is_listed(tmp_path):
    from gpubatch.api import info

    voc = make_voc(tmp_path / "VOC2007")
    yolo = tmp_path / "yolo"
    convert(voc, yolo, to="yolo")
    (yolo / "labels" / "gone.txt").write_text("0 0.5 0.5 0.2 0.2\n")  # boxes whose image is not there
    (yolo / "images" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    said = f"1 label file under {yolo / 'labels'} is not in images/ and left out (gone.txt): no image has its name"
    s = convert(yolo, tmp_path / "coco", to="coco")
    assert s.records_out == len(VOC_SET) and any(w.startswith(said) for w in s.warnings), s.warnings
    assert [(k["key"], k["reason"]) for k in s.skipped] == [("dangling", "a broken link, not a regular file")]
    assert info(yolo).left_out == {"unlisted": {"count": 1, "names": ["gone.txt"]}}


def test_a_box_beyond_float32_is_its_records_error_and_a_coco_box_beyond_any_image_is_dropped(tmp_path):
    """A box of 1e300 pixels (finite in JSON, infinite in float32) in a webdataset sample's .json had ended a --to voc
    run at its finalize in an OverflowError and been written to COCO as a null bbox; now the sample is listed with its
    reason. In a COCO file such a bbox (or a polygon's point) is dropped with the warning its kind of fault has."""
    import io
    import tarfile

    src = tmp_path / "wds"
    src.mkdir()
    with tarfile.open(src / "d-000000.tar", "w") as tf:
        for i, bbox in enumerate([[1, 2, 3, 4], [1, 2, 1e300, 4], [1e39, 2, 3, 4]]):
            for name, data in ((f"s{i}.jpg", jpeg_bytes(photo(60, 80, seed=i))),
                               (f"s{i}.json", json.dumps({"annotations": [{"bbox": bbox, "category_id": 1}]}).encode())):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    for to in ("voc", "coco", "yolo"):
        s = convert(src, tmp_path / to, to=to)
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["s1", "s2"], s.as_dict()
        assert all("no finite number of float32's range" in e["reason"] for e in s.skipped), s.skipped
    coco = tmp_path / "coco-src"
    (coco / "images").mkdir(parents=True)
    (coco / "annotations").mkdir()
    for i in range(2):
        (coco / "images" / f"{i}.jpg").write_bytes(jpeg_bytes(photo(60, 80, seed=i)))
    doc = {"images": [{"id": i, "file_name": f"{i}.jpg", "width": 80, "height": 60} for i in range(2)],
           "annotations": [{"id": 1, "image_id": 0, "category_id": 1, "bbox": [1, 2, 3, 4]},
                           {"id": 2, "image_id": 1, "category_id": 1, "bbox": [1, 2, 1e308, 4]},
                           {"id": 3, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4],
                            "segmentation": [[1, 2, 3e300, 4, 5, 6]]}],
           "categories": [{"id": 1, "name": "a"}]}
    (coco / "annotations" / "instances.json").write_text(json.dumps(doc))
    s = convert(coco, tmp_path / "voc2", to="voc")
    assert s.records_out == 2 and not s.skipped, s.as_dict()
    assert any("1 annotation dropped: bbox not four numbers (within 2^31 pixels)" in w and "(ids 2)" in w
               for w in s.warnings), s.warnings
    assert any("segmentation that is neither polygons nor RLE" in w and "(ids 3)" in w for w in s.warnings), s.warnings


def test_coco_keypoints_that_are_no_triples_of_numbers_are_left_out_with_a_warning(tmp_path):
    """Keypoints holding a string ended the record in a re-encoding run ("could not convert string to float") and
    passed through as they were in a copy; a point of 1e308 went on to infinity. Like a bad area or segmentation, they
    are left out of their annotation (num_keypoints with them), with one warning; the box stays."""
    coco = tmp_path / "coco"
    (coco / "images").mkdir(parents=True)
    (coco / "annotations").mkdir()
    for i in range(4):
        (coco / "images" / f"{i}.jpg").write_bytes(jpeg_bytes(photo(60, 80, seed=i)))
    kps = [[10, 12, 2, 30, 12, 1], [1e308, 2, 2, 5, 5, 2], [1, 2, "x", None, 5, 2], [1, 2]]
    doc = {"images": [{"id": i, "file_name": f"{i}.jpg", "width": 80, "height": 60} for i in range(4)],
           "annotations": [{"id": i + 1, "image_id": i, "category_id": 1, "bbox": [1, 2, 30, 40], "keypoints": k,
                            "num_keypoints": 2} for i, k in enumerate(kps)],
           "categories": [{"id": 1, "name": "person", "keypoints": ["left_eye", "right_eye"], "skeleton": [[1, 2]]}]}
    (coco / "annotations" / "person_keypoints.json").write_text(json.dumps(doc))
    for opts in ({}, {"resize_shorter": 30}):
        out = tmp_path / f"out{len(opts)}"
        s = convert(coco, out, to="coco", **opts)
        assert s.records_out == 4 and not s.skipped, s.as_dict()
        assert any("3 annotations with keypoints that are not (x, y, v) triples" in w and "(ids 2, 3, 4)" in w
                   for w in s.warnings), s.warnings
        got = json.loads(next((out / "annotations").glob("*.json")).read_text())
        anns = sorted(got["annotations"], key=lambda a: a["image_id"])
        assert len(anns) == 4 and "keypoints" in anns[0] and not any("keypoints" in a for a in anns[1:]), anns
        assert all(len(a["bbox"]) == 4 for a in anns)
