"""YOLO detection sets in the Ultralytics layout: ``images/`` (any depth: ``images/train/...``), beside it
``labels/`` with one ``.txt`` per image at the same relative path (a line per object: ``class cx cy w h``,
normalised to the image's size; a longer line is a polygon, ``class x1 y1 x2 y2 ...``, whose extent is the
box and which is kept as the box's segmentation), and ``data.yaml`` naming the classes (``names`` as a list
or a mapping; ``classes.txt`` where there is no YAML). An image without a label file holds no objects.

Class k is category ``k + 1`` (as COCO numbers from 1), unless the YAML's ``gpubatch_category_ids`` lists
the category of each class, which gpubatch writes where the categories are not 1..N: a COCO set written
as YOLO and read back keeps its ids. Written with every image under ``images/`` and ``data.yaml``'s
``train`` and ``val`` both naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._paths import read_regular
from ..errors import FormatError
from ..types import Boxes, DatasetInfo, Record, sniff_image_codec
from . import register_format
from .base import Damaged, Format, Reader, WriteOptions, Writer, image_size
from .files import _strip_ext, _walk_images, unlisted_files
from .folder import free_name, safe_component

#: the largest label file or YAML read
MAX_TEXT_BYTES = 8 << 20
YAML_NAMES = ("data.yaml", "dataset.yaml", "data.yml")


def yolo_root(path: Path) -> tuple[Path, Path | None] | None:
    """(the set's folder, its YAML or None) of a YOLO set at ``path`` (the folder or its YAML), or None."""
    path = Path(path)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        return (path.parent, path) if (path.parent / "images").is_dir() else None
    if path.is_dir() and (path / "images").is_dir() and (path / "labels").is_dir():
        return path, next((path / n for n in YAML_NAMES if (path / n).is_file()), None)
    return None


def class_names(root: Path, yaml_path: Path | None) -> tuple[list[str], list[int] | None]:
    """(the class names by index, the category id of each where the YAML gives them) of a YOLO set."""
    if yaml_path is None:
        listed = root / "classes.txt"
        if listed.is_file():
            return [ln.strip() for ln in read_regular(listed, MAX_TEXT_BYTES).decode("utf-8", "replace").splitlines()
                    if ln.strip()], None
        return [], None
    import yaml

    try:
        doc = yaml.safe_load(read_regular(yaml_path, MAX_TEXT_BYTES).decode("utf-8", "replace"))
    except (OSError, yaml.YAMLError) as e:
        raise FormatError(f"cannot read {yaml_path}: {getattr(e, 'strerror', None) or str(e).splitlines()[0]}") from None
    names = doc.get("names") if isinstance(doc, dict) else None
    if isinstance(names, dict):
        try:
            by = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError):
            raise FormatError(f"{yaml_path}: 'names' maps {list(names)[:3]}..., not class numbers") from None
        names = [by.get(k, str(k)) for k in range(max(by) + 1)] if by else []
    elif isinstance(names, list):
        names = [str(n) for n in names]
    else:
        raise FormatError(f"{yaml_path} names no classes ('names': a list, or class numbers to names)")
    ids = doc.get("gpubatch_category_ids")
    if not (isinstance(ids, list) and len(ids) == len(names) and all(isinstance(i, int) for i in ids)):
        ids = None
    return names, ids


def parse_labels(text: str, h: int, w: int) -> tuple[list[list[float]], list[int], list[dict[str, Any]]]:
    """(corners in pixels, class numbers, fields) of a label file's lines; ValueError naming a bad line."""
    xyxy, classes, fields = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            cls, nums = int(parts[0]), [float(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"line {n}: {line[:60]!r} is not 'class cx cy w h'") from None
        if cls < 0 or not all(v == v and abs(v) < 1e6 for v in nums):
            raise ValueError(f"line {n}: {line[:60]!r} holds a negative class or a number that is none")
        if len(nums) == 4:
            cx, cy, bw, bh = nums
            xyxy.append([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h])
            fields.append({})
        elif len(nums) >= 6 and len(nums) % 2 == 0:
            xs, ys = [v * w for v in nums[0::2]], [v * h for v in nums[1::2]]
            xyxy.append([min(xs), min(ys), max(xs), max(ys)])
            fields.append({"segmentation": [[round(c, 2) for xy in zip(xs, ys) for c in xy]]})
        else:
            raise ValueError(f"line {n}: {len(nums)} numbers after the class: 4 (a box) or an even 6 or more (a polygon)")
        classes.append(cls)
    return xyxy, classes, fields


class YoloReader(Reader):
    def __init__(self, path: Path):
        found = yolo_root(path)
        if found is None:
            raise FormatError(f"{path} is no YOLO set (images/ beside labels/, or its data.yaml)")
        root, self.yaml = found
        super().__init__(root)
        self.names, ids = class_names(root, self.yaml)
        self.ids = ids or [k + 1 for k in range(len(self.names))]

    def _scan(self) -> list[Any]:
        damaged: list[Damaged] = []  # a broken link, a FIFO named as an image: listed, not dropped
        images = _walk_images(self.path / "images", damaged)
        # label files whose image is not there: said, never left out without a word (labelImg's class lists aside)
        self.left_out = unlisted_files(self, self.path / "labels", [], "images/", ("label file", "label files"),
                                       "no image has its name, so its boxes go nowhere",
                                       accept=lambda n: n.endswith(".txt"),
                                       stems={_strip_ext(f) for f in images} | {"classes", "predefined_classes"})
        return sorted([*images, *damaged], key=lambda e: e.key if isinstance(e, Damaged) else _strip_ext(e))

    def where(self, entry: Any) -> tuple[str, str]:
        return entry.rsplit(".", 1)[0], str(self.path / "images" / entry)

    def info(self) -> DatasetInfo:
        return DatasetInfo(categories=tuple({"id": i, "name": n, "supercategory": ""} for i, n in zip(self.ids, self.names)))

    def roots(self) -> list[Path]:
        return [self.path]

    def _read(self, rel: str) -> Record:
        key, origin = self.where(rel)
        path = self.path / "images" / rel
        try:
            data = read_regular(path)
        except (OSError, ValueError) as e:
            raise self.record_error(key, origin, getattr(e, "strerror", None) or e) from None
        from ..engine.codecs.headers import probe

        try:
            hdr = probe(data)
        except ValueError as e:
            raise self.record_error(key, origin, e) from None
        h, w = hdr.height, hdr.width
        label = self.path / "labels" / f"{key}.txt"
        xyxy: list = []
        classes: list[int] = []
        fields: list = []
        if label.is_file():
            try:
                xyxy, classes, fields = parse_labels(read_regular(label, MAX_TEXT_BYTES).decode("utf-8", "replace"), h, w)
            except (OSError, ValueError) as e:
                raise self.record_error(key, str(label), getattr(e, "strerror", None) or e) from None
            unknown = [c for c in classes if self.names and c >= len(self.ids)]
            if unknown:
                raise self.record_error(key, str(label), f"class {unknown[0]} beyond the {len(self.ids)} the YAML names")
        labels = [self.ids[c] if c < len(self.ids) else c + 1 for c in classes]
        boxes = Boxes(xyxy, labels, (h, w), None, tuple(fields))
        return Record(key=key, data=data, codec=sniff_image_codec(data) or "unknown", boxes=boxes,
                      meta={"filename": rel.rsplit("/", 1)[-1], "file_name": rel}, origin=origin)


class YoloWriter(Writer):
    def __init__(self, root: Path, info: DatasetInfo, options: WriteOptions):
        super().__init__(root, info, options)
        (root / "images").mkdir()
        (root / "labels").mkdir()
        self.cats = sorted(int(c["id"]) for c in info.categories)
        self.names = {int(c["id"]): str(c["name"]) for c in info.categories}
        self._taken: set[str] = set()
        self.clipped = 0

    def _class(self, cat: int) -> int:
        if cat not in self.names:  # (a box of a category the source did not name)
            self.cats = sorted({*self.cats, cat})
            self.names[cat] = str(cat)
        return self.cats.index(cat)

    def write(self, record: Record) -> None:
        # (an image's labels are <rel>.txt whatever its extension: the paths are made unique)
        rel = free_name("/".join(safe_component(p) for p in record.key.split("/")) + ".txt", self._taken, ())[:-4]
        ext = record.filename.rsplit(".", 1)[-1] if "." in record.filename else "jpg"
        img = self.root / "images" / f"{rel}.{ext}"
        img.parent.mkdir(parents=True, exist_ok=True)
        img.write_bytes(record.data)
        h, w = image_size(record)
        lines = []
        b = record.boxes
        for i in range(len(b) if b is not None and h and w else 0):
            x0, y0, x1, y1 = (float(v) for v in b.xyxy[i])
            c0, d0, c1, d1 = max(0.0, x0), max(0.0, y0), min(float(w), x1), min(float(h), y1)
            if (c0, d0, c1, d1) != (x0, y0, x1, y1):
                self.clipped += 1
            if c1 <= c0 or d1 <= d0:
                continue
            lines.append(f"{self._class(int(b.labels[i]))} {(c0 + c1) / 2 / w:.6f} {(d0 + d1) / 2 / h:.6f} "
                         f"{(c1 - c0) / w:.6f} {(d1 - d0) / h:.6f}\n")
        label = self.root / "labels" / f"{rel}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(lines))
        self.count += 1
        self.bytes += len(record.data)

    def close(self) -> None:
        import yaml

        doc: dict[str, Any] = {"path": ".", "train": "images", "val": "images", "nc": len(self.cats),
                               "names": {k: self.names[c] for k, c in enumerate(self.cats)}}
        if self.cats != list(range(1, len(self.cats) + 1)):  # (categories other than 1..N: kept for a reader)
            doc["gpubatch_category_ids"] = list(self.cats)
        (self.root / "data.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        if self.clipped:
            self.warnings.append(f"yolo: {self.clipped} boxes reached past their image and were cut to it")


@register_format
class YoloFormat(Format):
    name = "yolo"
    description = "YOLO detection (Ultralytics): images/ + labels/*.txt (class cx cy w h) + data.yaml"
    carries_labels = False
    carries_boxes = True
    carries_record_meta = False
    detect_priority = 44

    @classmethod
    def detect(cls, path: Path) -> bool:
        found = yolo_root(Path(path))
        return found is not None and (found[1] is not None or any((found[0] / "labels").rglob("*.txt")))

    @classmethod
    def reader(cls, path: Path) -> Reader:
        return YoloReader(path)

    @classmethod
    def writer(cls, root: Path, info: DatasetInfo, options: WriteOptions) -> Writer:
        return YoloWriter(root, info, options)

