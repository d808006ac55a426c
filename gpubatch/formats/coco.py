"""COCO detection datasets: an image folder plus an instances JSON.

Written as ``DST/images/<file_name>`` and ``DST/annotations/instances.json`` with what pycocotools
and DALI's ``readers.coco`` both need: integer ids, ``width``/``height`` on every image, annotations
with ``bbox`` [x, y, w, h] in pixels, ``area``, ``iscrowd`` (0/1 int) and ``segmentation`` (kept as
given, polygons moved with the pixels), categories in ascending id order. An image-level class index,
when records carry one, goes in the image entry's ``label`` field (other readers ignore it).

Reading takes the dataset folder (the JSON found under ``annotations/`` or at the root) or the JSON
file itself; the image folder is found beside it (``images/``, the split name, or the JSON's folder).
The annotations are checked as they load (:func:`check_annotations`): those no trainer could use (a
``bbox`` that is not four finite numbers, or of negative width or height) are dropped, and those that
name no image, a category the file does not list, or an image id two images share are counted; each
kind becomes one warning in the run's summary and manifest, and in ``gpubatch info``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._paths import read_head, read_regular, safe_join, safe_relpath
from ..errors import FormatError
from ..types import MAX_COORD, Boxes, DatasetInfo, Record, keypoint_flips, sniff_image_codec
from . import fields, register_format
from .base import Damaged, Format, Reader, WriteOptions, Writer, image_size
from .files import unlisted_files
from .folder import safe_component
from .manifest import read_manifest

ANNOTATIONS = "annotations/instances.json"
MAX_JSON_BYTES = 1 << 36  # a bound against a device named like a JSON, not on real files (LVIS's is 1.1 GB)
_BOX_FIELDS = {"bbox", "category_id", "image_id", "iscrowd"}
_IMAGE_FIELDS = {"id", "file_name", "width", "height", "label"}


def _is_coco_json(path: Path) -> bool:
    head = read_head(path, 1 << 16)  # (b"" for a FIFO or device named *.json: never blocks)
    return head.lstrip().startswith(b"{") and (b'"images"' in head or b'"annotations"' in head)


def annotation_files(path: Path) -> list[Path]:
    """The COCO JSONs a dataset path names: the file itself, or those under ``annotations/`` and at
    the folder's root. Where some are ``instances*`` files, only those (COCO 2017's folder also holds
    ``captions_*`` and ``person_keypoints_*``)."""
    path = Path(path)
    if path.is_file():
        return [path] if path.suffix == ".json" and _is_coco_json(path) else []
    if not path.is_dir():
        return []
    candidates = sorted((path / "annotations").glob("*.json")) if (path / "annotations").is_dir() else []
    candidates += sorted(p for p in path.glob("*.json") if p.name != "gpubatch.json")
    found = [p for p in candidates if _is_coco_json(p)]
    return [p for p in found if p.name.startswith("instances")] or found


def find_annotations(path: Path) -> Path | None:
    """The one COCO JSON of a dataset path; None where there is none. Several: a FormatError that
    names them, as reading one of them would leave the others' images out without a word."""
    found = annotation_files(path)
    if len(found) > 1:
        names = ", ".join(str(p.relative_to(path)) for p in found[:4]) + (", ..." if len(found) > 4 else "")
        raise FormatError(f"{path} holds {len(found)} COCO annotation files ({names}): pass the one to read as "
                          f"SRC, e.g. {found[0]}")
    return found[0] if found else None


def _number(value: Any) -> float | None:
    """A finite JSON number (bools are not), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _coord(value: Any) -> float | None:
    """A JSON number a pixel coordinate may be (:data:`MAX_COORD` either side of 0), or None."""
    v = _number(value)
    return v if v is not None and abs(v) < MAX_COORD else None


def _keypoints(kps: Any) -> bool:
    """COCO keypoints: a list of (x, y, visibility) triples of numbers (x and y within :data:`MAX_COORD`)."""
    return isinstance(kps, list) and len(kps) % 3 == 0 and all(_coord(v) is not None for v in kps)


def _segmentation(seg: Any) -> bool:
    """A COCO segmentation: a list of polygons (lists of numbers; an empty list), or RLE (an object with ``counts``
    and ``size``)."""
    if isinstance(seg, dict):
        return "counts" in seg and "size" in seg
    return isinstance(seg, list) and all(isinstance(p, list) and all(_coord(v) is not None for v in p) for p in seg)


def _category(c: Any) -> bool:
    """An entry of 'categories' gpubatch can use: an object with a whole-number id."""
    if not isinstance(c, dict):
        return False
    try:
        fields.ident(c.get("id"), "id")
    except ValueError:
        return False
    return True


def _ids(ids: Iterable[Any]) -> str:
    ids = list(ids)
    shown = ", ".join(str(i) for i in ids[:3])
    return f"ids {shown}{', ...' if len(ids) > 3 else ''}"


def _id_key(value: Any) -> Any:
    """An id as a dict key: JSON numbers and strings as they are, anything else (a list...) by its text."""
    return value if value is None or isinstance(value, (int, float, str)) else json.dumps(value)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def check_annotations(doc: dict, name: str) -> tuple[dict[Any, list[dict]], list[str]]:
    """A COCO document's usable annotations by image id, and one warning per kind of fault found.

    Dropped: annotations with neither ``bbox`` nor ``category_id`` (captions), and those that are not
    objects or have a ``bbox`` other than four finite numbers (within :data:`MAX_COORD`), a
    ``category_id`` or ``iscrowd`` that is not a whole number, or a negative width or height (torchvision's
    detection models refuse such boxes; a zero size is kept, as COCO itself has some). Kept but counted:
    annotations of an image id no image has (they cannot be written anywhere), category ids missing from
    ``categories`` (written with a category named by its number), and image ids shared by two images
    (their annotations go to each). Kept without the field: an ``area`` that is no number of zero or more (the
    box's area is written), a ``segmentation`` that is neither polygons nor RLE, ``keypoints`` that are not triples
    of numbers.
    """
    image_ids: dict[Any, int] = {}
    for im in doc["images"]:
        if not isinstance(im, dict):
            continue
        key = _id_key(im.get("id"))
        image_ids[key] = image_ids.get(key, 0) + 1
    cats = doc.get("categories")
    known = {_id_key(c.get("id")) for c in cats if isinstance(c, dict)} if isinstance(cats, list) else set()
    malformed, negative, orphans, unknown, boxless, no_area, no_seg, no_kps = [], [], [], {}, [], [], [], []
    anns: dict[Any, list[dict]] = {}
    raw = doc.get("annotations")
    for i, a in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(a, dict):
            malformed.append(f"#{i}")
            continue
        aid = a.get("id", f"#{i}")
        if "bbox" not in a and "category_id" not in a:
            boxless.append(aid)
            continue
        bbox = a.get("bbox")
        box = [_coord(v) for v in bbox] if isinstance(bbox, list) and len(bbox) == 4 else [None]
        try:
            cat = fields.ident(a.get("category_id"), "category_id")
            fields.whole(a.get("iscrowd", 0), "iscrowd", 0, 1)
        except ValueError:
            cat = None
        if None in box or cat is None or max(abs(box[0] + box[2]), abs(box[1] + box[3])) >= MAX_COORD:
            malformed.append(aid)
            continue
        if box[2] < 0 or box[3] < 0:
            negative.append(aid)
            continue
        image_id = _id_key(a.get("image_id"))
        if image_id not in image_ids:
            orphans.append(aid)
            continue
        if cat not in known:
            unknown[cat] = unknown.get(cat, 0) + 1
        if "area" in a and (_number(a["area"]) is None or a["area"] < 0):
            a = {k: v for k, v in a.items() if k != "area"}
            no_area.append(aid)
        if "segmentation" in a and not _segmentation(a["segmentation"]):
            a = {k: v for k, v in a.items() if k != "segmentation"}
            no_seg.append(aid)
        if "keypoints" in a and not _keypoints(a["keypoints"]):
            a = {k: v for k, v in a.items() if k not in ("keypoints", "num_keypoints")}
            no_kps.append(aid)
        anns.setdefault(image_id, []).append(a)
    warnings = [f"{name}: {_count(len(found), 'annotation')} {what} ({_ids(found)})" for found, what in (
        (boxless, "with neither bbox nor category_id left out: not object annotations (COCO's captions?); gpubatch "
                  "reads instance and keypoint files"),
        (malformed, "dropped: bbox not four numbers (within 2^31 pixels), category_id not a whole number, iscrowd "
                    "not 0 or 1, or not an object"),
        (negative, "dropped: bbox of negative width or height"),
        (orphans, "with an image_id no image has, not written"),
        (no_area, "with an area that is no number of zero or more: written with their box's area"),
        (no_seg, "with a segmentation that is neither polygons nor RLE: written without it"),
        (no_kps, "with keypoints that are not (x, y, v) triples of numbers: written without them"),
    ) if found]
    if unknown:
        warnings.append(f"{name}: {_count(sum(unknown.values()), 'annotation')} with a category_id missing from "
                        f"'categories' ({', '.join(str(c) for c in sorted(unknown)[:5])}"
                        f"{', ...' if len(unknown) > 5 else ''}); written with a category named by its number")
    shared = [k for k, n in image_ids.items() if n > 1]
    if shared:
        warnings.append(f"{name}: {_count(len(shared), 'image id')} used by more than one image; each such "
                        f"image gets all of the id's annotations ({_ids(shared)})")
    return anns, warnings


class CocoReader(Reader):
    def __init__(self, path: Path):
        path = Path(path)
        ann = find_annotations(path)
        if ann is None:
            raise FormatError(f"no COCO instances JSON at {path}")
        super().__init__(path if path.is_dir() else ann.parent)
        self.ann_file, self._found = ann, path.is_dir()  # (found in the folder, or given as the source)
        try:
            doc = fields.json_value(read_regular(ann, MAX_JSON_BYTES), ann.name, "surrogateescape")
        except OSError as e:
            raise FormatError(f"cannot read {ann}: {e.strerror or e}") from None
        except ValueError as e:
            raise FormatError(f"cannot read {ann}: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
            raise FormatError(f"{ann} is not a COCO instances file (no 'images' list)")
        cats = doc.get("categories")
        kept = [c for c in cats if _category(c)] if isinstance(cats, list) else []
        self.doc = {**doc, "categories": kept}
        self.anns, self.warnings = check_annotations(self.doc, ann.name)
        if isinstance(cats, list) and len(kept) < len(cats):
            n = len(cats) - len(kept)
            self.warnings.append(f"{ann.name}: {n} {'entry' if n == 1 else 'entries'} of 'categories' left out: "
                                 "not an object with a whole-number id")
        elif cats is not None and not isinstance(cats, list):
            self.warnings.append(f"{ann.name}: 'categories' is a JSON {type(cats).__name__}, not a list: left out")
        self.keypoint_flip = keypoint_flips(kept)
        self.image_root = self._find_image_root()

    def _find_image_root(self) -> Path:
        ann_dir = self.ann_file.parent
        split = self.ann_file.stem.split("_", 1)[-1]
        roots = [self.path / "images", ann_dir.parent / "images", self.path / split, ann_dir.parent / split,
                 ann_dir, self.path]
        first = next((im["file_name"] for im in self.doc["images"]
                      if isinstance(im, dict) and isinstance(im.get("file_name"), str) and im["file_name"]), None)
        if first:
            for r in roots:
                try:
                    if safe_join(r, first).is_file():
                        return r
                except ValueError:
                    break
        return roots[0] if roots[0].is_dir() else self.path

    def roots(self) -> list[Path]:
        """The dataset folder, the JSON's folder and the image folder the JSON refers to."""
        return [self.path, self.ann_file.parent, self.image_root]

    def _scan(self) -> list[dict | Damaged]:
        images = [im for im in self.doc["images"] if isinstance(im, dict)]
        bad = [Damaged(f"images[{i}]", f"{self.ann_file}#images[{i}]", f"an entry of 'images' that is a JSON "
                       f"{type(im).__name__}, not an object") for i, im in enumerate(self.doc["images"])
               if not isinstance(im, dict)]
        if self._found:  # the JSON found in the folder: images it does not name are said
            named = [(im["file_name"],) for im in images if isinstance(im.get("file_name"), str)]
            self.left_out = unlisted_files(self, self.image_root, named, self.ann_file.name,
                                           ("image file", "image files"),
                                           f"Pass {self.ann_file} to read the images it names alone")
        return sorted(images, key=lambda im: (str(type(im.get("id"))), _id_key(im.get("id")) or 0)) + bad

    def where(self, image: dict) -> tuple[str, str]:
        return str(image.get("file_name") or image.get("id"))[:200], f"{self.ann_file}#{str(image.get('id'))[:40]}"

    def info(self) -> DatasetInfo:
        manifest = read_manifest(self.path) or {}
        cats = sorted(self.doc.get("categories") or [], key=lambda c: c.get("id", 0))
        extra = {k: self.doc[k] for k in ("info", "licenses") if k in self.doc}
        return DatasetInfo(classes=tuple(manifest.get("classes") or ()), categories=tuple(cats), extra=extra)

    def _read(self, image: dict) -> Record:
        where = f"{self.ann_file}#{str(image.get('id'))[:40]}"
        try:
            name = fields.name(image.get("file_name"), "file_name")
            key = name.rsplit(".", 1)[0]
            rel = safe_relpath(name)
            path = safe_join(self.image_root, rel)
        except ValueError as e:
            raise self.record_error(str(image.get("id"))[:200], where, e) from None
        origin = str(path)
        try:
            data = read_regular(path)
        except OSError as e:
            raise self.record_error(key, origin, e.strerror or e) from None
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        try:
            h, w = fields.side(image.get("height"), "height"), fields.side(image.get("width"), "width")
        except ValueError as e:
            raise self.record_error(key, where, e) from None
        anns = self.anns.get(_id_key(image.get("id")), [])
        if not h or not w:
            from ..engine.codecs.headers import probe

            try:
                hdr = probe(data)
            except ValueError as e:
                raise self.record_error(key, origin, e) from None
            h, w = hdr.height, hdr.width
        xyxy, labels, crowd, extra = [], [], [], []
        for a in anns:  # checked by check_annotations: numbers where numbers are due
            x, y, bw, bh = (float(v) for v in a["bbox"])
            xyxy.append([x, y, x + bw, y + bh])
            labels.append(int(a["category_id"]))
            crowd.append(int(a.get("iscrowd", 0)))
            extra.append({k: v for k, v in a.items() if k not in _BOX_FIELDS})
        boxes = Boxes(xyxy, labels, (h, w), crowd, tuple(extra), self.keypoint_flip)
        meta = {"filename": rel.rsplit("/", 1)[-1], "file_name": rel, "coco_id": image.get("id")}
        other = {k: v for k, v in image.items() if k not in _IMAGE_FIELDS}
        if other:
            meta["coco_image"] = other
        label = image.get("label")
        return Record(key=key, data=data, codec=sniff_image_codec(data) or "unknown",
                      label=int(label) if isinstance(label, int) and label >= 0 else None,
                      boxes=boxes, meta=meta, origin=origin)


class CocoWriter(Writer):
    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, info, options)
        self.images: list[dict] = []
        self.annotations: list[dict] = []
        self._names: set[str] = set()
        self._image_ids: set[int] = set()
        self._ann_ids: set[int] = set()
        self._labels: set[int] = set()
        (root / "images").mkdir()

    def _unique_name(self, record: Record) -> str:
        rel = record.meta.get("file_name")
        name = record.filename
        if rel and rel.rsplit("/", 1)[-1].rsplit(".", 1)[0] == name.rsplit(".", 1)[0]:
            parts = rel.split("/")[:-1]
            candidate = "/".join([*(safe_component(p) for p in parts), safe_component(name)])
        else:
            candidate = safe_component(name)
        stem, dot, ext = candidate.rpartition(".")
        stem, ext = (stem, dot + ext) if dot else (ext, "")
        n = 1
        while candidate in self._names:
            candidate = f"{stem}_{n}{ext}"
            n += 1
        self._names.add(candidate)
        return candidate

    def write(self, record: Record) -> None:
        name = self._unique_name(record)
        path = self.root / "images" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(record.data)
        h, w = image_size(record)
        cid = record.meta.get("coco_id")
        image_id = cid if isinstance(cid, int) and cid not in self._image_ids else len(self.images) + 1
        while image_id in self._image_ids:
            image_id += 1
        self._image_ids.add(image_id)
        entry: dict[str, Any] = {"id": image_id, "file_name": name, "width": int(w), "height": int(h)}
        entry.update(record.meta.get("coco_image") or {})
        if record.label is not None:
            entry["label"] = int(record.label)
        self.images.append(entry)
        b = record.boxes
        for i in range(len(b) if b is not None else 0):
            x0, y0, x1, y1 = (float(v) for v in b.xyxy[i])
            extra = dict(b.extra[i])
            aid = extra.pop("id", None)
            if not isinstance(aid, int) or aid in self._ann_ids:
                aid = len(self.annotations) + 1
                while aid in self._ann_ids:
                    aid += 1
            self._ann_ids.add(aid)
            seg = extra.pop("segmentation", [])
            if isinstance(seg, list):
                seg = [p for p in seg if isinstance(p, list) and len(p) >= 6]
            self.annotations.append({
                "id": aid, "image_id": image_id, "category_id": int(b.labels[i]),
                "bbox": [round(x0, 3), round(y0, 3), round(x1 - x0, 3), round(y1 - y0, 3)],
                "area": float(extra.pop("area", (x1 - x0) * (y1 - y0))),
                "iscrowd": int(b.iscrowd[i]), "segmentation": seg, **extra,
            })
            self._labels.add(int(b.labels[i]))
        self.count += 1
        self.bytes += len(record.data)

    def close(self) -> None:
        cats = {int(c["id"]): dict(c) for c in self.info.categories}
        for lab in self._labels - set(cats):
            cats[lab] = {"id": lab, "name": str(lab), "supercategory": ""}
        doc: dict[str, Any] = dict(self.info.extra)
        doc.update({
            "images": sorted(self.images, key=lambda im: im["id"]),
            "annotations": sorted(self.annotations, key=lambda a: a["id"]),
            "categories": [cats[k] for k in sorted(cats)],
        })
        out = self.root / ANNOTATIONS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fields.json_text(doc), encoding="utf-8")


@register_format
class CocoFormat(Format):
    name = "coco"
    description = "COCO detection: images/ + annotations/instances.json (boxes, segmentation kept)"
    carries_boxes = True
    detect_priority = 40

    @classmethod
    def detect(cls, path: Path) -> bool:
        return bool(annotation_files(Path(path)))

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return CocoReader(path)

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        return CocoWriter(root, info, options)
