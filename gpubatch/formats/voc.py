"""Pascal VOC detection sets: ``Annotations/<id>.xml`` (an image's file name, size and objects: a class name
and a box in VOC's 1-based, inclusive pixel corners, with its ``difficult``, ``truncated`` and ``occluded``
flags and ``pose``), ``JPEGImages/`` and ``ImageSets/Main/<split>.txt``.

Read from the set's folder (every annotation) or from a split file (the ids it lists; a class file's ``-1``
lines left out). Categories are the class names of every annotation of the set, sorted, numbered from 1
(VOC's twenty classes come out in their usual order). A box (xmin, ymin, xmax, ymax) becomes corners
(xmin - 1, ymin - 1, xmax, ymax) in pixels and back; the flags and pose ride along as the box's fields
(COCO keeps them). Written in the same layout, every image listed in ``ImageSets/Main/<name>.txt``.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .._paths import read_regular, safe_join, safe_relpath
from ..errors import FormatError
from ..types import MAX_COORD, Boxes, DatasetInfo, Record, sniff_image_codec
from . import register_format
from .base import Damaged, Format, Reader, WriteOptions, Writer, image_size
from .files import unlisted_files
from .folder import free_name, safe_component

#: the largest annotation read (a VOC XML is a few kilobytes)
MAX_XML_BYTES = 1 << 20
#: the per-object fields carried as a box's own (besides its class and box)
FLAGS = ("difficult", "truncated", "occluded")


def voc_root(path: Path) -> tuple[Path, Path | None] | None:
    """(the set's folder, the split file read or None) of a VOC set at ``path``, or None where it is not one."""
    path = Path(path)
    if path.is_file() and path.suffix == ".txt" and path.parent.name == "Main" and path.parent.parent.name == "ImageSets":
        root = path.parent.parent.parent
        return (root, path) if (root / "Annotations").is_dir() else None
    if path.is_dir() and (path / "Annotations").is_dir() and (path / "JPEGImages").is_dir():
        return path, None
    return None


def _text(node: ET.Element | None, tag: str) -> str | None:
    found = node.find(tag) if node is not None else None
    return found.text.strip() if found is not None and found.text is not None else None


def parse_annotation(data: bytes, where: str) -> dict[str, Any]:
    """A VOC annotation's file name, size and objects; ValueError where it is not one."""
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise ValueError("an XML with a document type or entities: not a VOC annotation")
    try:
        doc = ET.fromstring(data)
    except ET.ParseError as e:
        raise ValueError(f"not well-formed XML ({e})") from None
    if doc.tag != "annotation":
        raise ValueError(f"the XML's root is <{doc.tag[:40]}>, not <annotation>")
    size = doc.find("size")
    try:
        hf, wf = float(_text(size, "height") or 0), float(_text(size, "width") or 0)
    except ValueError:
        raise ValueError("its <size> holds no numbers") from None
    if not all(math.isfinite(v) and 0 <= v < MAX_COORD for v in (hf, wf)):  # (inf ended the run in an OverflowError)
        raise ValueError(f"its <size> is {wf:g}x{hf:g}: no image's size")
    h, w = int(hf), int(wf)
    objects = []
    for k, obj in enumerate(doc.findall("object")):
        name = _text(obj, "name")
        box = obj.find("bndbox")
        if not name or box is None:
            raise ValueError(f"object {k} has no <name> or no <bndbox>")
        try:
            corners = [float(_text(box, t) or "nan") for t in ("xmin", "ymin", "xmax", "ymax")]
        except ValueError:
            raise ValueError(f"object {k} ({name[:40]}): its <bndbox> holds no numbers") from None
        if not all(abs(c) < MAX_COORD for c in corners) or corners[2] < corners[0] or corners[3] < corners[1]:
            raise ValueError(f"object {k} ({name[:40]}): box {corners} is not xmin <= xmax, ymin <= ymax")
        fields: dict[str, Any] = {}
        for flag in FLAGS:
            v = _text(obj, flag)
            if v is not None:
                fields[flag] = int(v in ("1", "true", "True"))
        pose = _text(obj, "pose")
        if pose:
            fields["pose"] = pose
        objects.append((name, corners, fields))
    return {"filename": _text(doc, "filename"), "height": h, "width": w, "objects": objects, "where": where}


class VocReader(Reader):
    def __init__(self, path: Path):
        found = voc_root(path)
        if found is None:
            raise FormatError(f"{path} is no Pascal VOC set (Annotations/ beside JPEGImages/, or a split file "
                              "in ImageSets/Main/)")
        root, self.split = found
        super().__init__(root)
        self.notes = root / "Annotations"
        self._parsed: dict[str, dict[str, Any] | str] = {}
        for xml in sorted(self.notes.glob("*.xml")):  # every annotation: the categories of the whole set
            try:
                self._parsed[xml.stem] = parse_annotation(read_regular(xml, MAX_XML_BYTES), str(xml))
            except (OSError, ValueError) as e:
                self._parsed[xml.stem] = str(getattr(e, "strerror", None) or e)
        names = {n for p in self._parsed.values() if isinstance(p, dict) for n, _, _ in p["objects"]}
        self.categories = tuple({"id": i + 1, "name": n, "supercategory": ""} for i, n in enumerate(sorted(names)))
        self._ids = {c["name"]: c["id"] for c in self.categories}

    def _listed(self) -> list[str]:
        if self.split is None:
            return sorted(self._parsed)
        try:
            lines = read_regular(self.split).decode("utf-8", "replace").splitlines()
        except OSError as e:
            raise FormatError(f"cannot read {self.split}: {e.strerror or e}") from None
        ids = []
        for ln in lines:
            parts = ln.split()
            if parts and (len(parts) == 1 or parts[-1] != "-1"):  # (a class file: -1 is "not in this image")
                ids.append(parts[0])
        return ids

    def _scan(self) -> list[Any]:
        out: list[Any] = []
        for i in self._listed():
            parsed = self._parsed.get(i)
            where = str(self.notes / f"{i}.xml")
            if parsed is None:
                out.append(Damaged(i, where, "the split lists it, but Annotations/ holds no such XML"))
            elif isinstance(parsed, str):
                out.append(Damaged(i, where, parsed))
            else:
                out.append((i, parsed))
        if self.split is None:  # every XML: images in JPEGImages/ that none names are said
            named = [(p["filename"],) for p in self._parsed.values() if isinstance(p, dict) and p["filename"]]
            self.left_out = unlisted_files(self, self.path / "JPEGImages", named, "Annotations/",
                                           ("image file", "image files"),
                                           "no XML annotation names them (a set's test images?)", stems=self._parsed)
        return out

    def where(self, entry: Any) -> tuple[str, str]:
        return entry[0], entry[1]["where"]

    def info(self) -> DatasetInfo:
        return DatasetInfo(categories=self.categories)

    def roots(self) -> list[Path]:
        return [self.path]

    def _read(self, entry: Any) -> Record:
        key, note = entry
        name = note["filename"] or f"{key}.jpg"
        try:
            rel = safe_relpath(name)
            path = safe_join(self.path / "JPEGImages", rel)
            data = read_regular(path)
        except (OSError, ValueError) as e:
            raise self.record_error(key, note["where"], getattr(e, "strerror", None) or e) from None
        h, w = note["height"], note["width"]
        if not h or not w:
            from ..engine.codecs.headers import probe

            try:
                hdr = probe(data)
            except ValueError as e:
                raise self.record_error(key, str(path), e) from None
            h, w = hdr.height, hdr.width
        xyxy = [[x0 - 1, y0 - 1, x1, y1] for _, (x0, y0, x1, y1), _ in note["objects"]]
        boxes = Boxes(xyxy, [self._ids[n] for n, _, _ in note["objects"]], (h, w), None,
                      tuple(dict(f) for _, _, f in note["objects"]))
        return Record(key=key, data=data, codec=sniff_image_codec(data) or "unknown", boxes=boxes,
                      meta={"filename": rel.rsplit("/", 1)[-1], "file_name": rel}, origin=str(path))


class VocWriter(Writer):
    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, info, options)
        for d in ("JPEGImages", "Annotations", "ImageSets/Main"):
            (root / d).mkdir(parents=True)
        self.names = {int(c["id"]): str(c["name"]) for c in info.categories}
        self.ids: list[str] = []
        self._taken: set[str] = set()

    def write(self, record: Record) -> None:
        # (an image's annotation is <stem>.xml whatever its extension: the stems are made unique)
        stem = free_name(f"{safe_component(record.key.replace('/', '_'))}.xml", self._taken, ())[:-4]
        ext = record.filename.rsplit(".", 1)[-1] if "." in record.filename else "jpg"
        name = f"{stem}.{ext}"
        (self.root / "JPEGImages" / name).write_bytes(record.data)
        h, w = image_size(record)
        doc = ET.Element("annotation")
        ET.SubElement(doc, "folder").text = "JPEGImages"
        ET.SubElement(doc, "filename").text = name
        size = ET.SubElement(doc, "size")
        for tag, v in (("width", w), ("height", h), ("depth", 3)):
            ET.SubElement(size, tag).text = str(int(v))
        ET.SubElement(doc, "segmented").text = "0"
        b = record.boxes
        for i in range(len(b) if b is not None else 0):
            x0, y0, x1, y1 = (float(v) for v in b.xyxy[i])
            extra = b.extra[i] if i < len(b.extra) else {}
            obj = ET.SubElement(doc, "object")
            ET.SubElement(obj, "name").text = self.names.get(int(b.labels[i]), str(int(b.labels[i])))
            ET.SubElement(obj, "pose").text = str(extra.get("pose", "Unspecified"))
            for flag in FLAGS:
                ET.SubElement(obj, flag).text = str(int(bool(extra.get(flag, 0))))
            box = ET.SubElement(obj, "bndbox")
            for tag, v in (("xmin", round(x0) + 1), ("ymin", round(y0) + 1), ("xmax", round(x1)), ("ymax", round(y1))):
                ET.SubElement(box, tag).text = str(int(v))
        ET.indent(doc)
        (self.root / "Annotations" / f"{stem}.xml").write_bytes(ET.tostring(doc, encoding="utf-8"))
        self.ids.append(stem)
        self.count += 1
        self.bytes += len(record.data)

    def close(self) -> None:
        split = self.root / "ImageSets" / "Main" / f"{self.options.name}.txt"
        split.write_text("".join(f"{i}\n" for i in self.ids))


@register_format
class VocFormat(Format):
    name = "voc"
    description = "Pascal VOC detection: JPEGImages/ + Annotations/*.xml + ImageSets/Main/<split>.txt"
    carries_labels = False
    carries_boxes = True
    carries_record_meta = False
    detect_priority = 42

    @classmethod
    def detect(cls, path: Path) -> bool:
        found = voc_root(Path(path))
        return found is not None and any((found[0] / "Annotations").glob("*.xml"))

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return VocReader(path)

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        return VocWriter(root, info, options)
