"""Core value types: records, boxes, media kinds and batch specs.

Only the standard library and NumPy are imported here, so these types are cheap to use from the CLI,
the format modules and the engine alike.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (NumPy imported where boxes are used: a pass-through's command never loads it)
    import numpy as np


class Media(str, enum.Enum):
    """What a record's payload holds."""

    IMAGE = "image"
    VIDEO = "video"
    AUDIO = "audio"


class Layout(str, enum.Enum):
    """Memory layout of decoded pixels or samples."""

    HWC = "HWC"
    CHW = "CHW"
    FHWC = "FHWC"
    T = "T"


# File extension (lower case, no dot) -> codec name, for the image codecs gpubatch reads. The bytes name
# the codec in the end (sniff_image_codec); an image Pillow cannot read (HEIF, JPEG XL without their
# plugins) is a record that fails with its reason, never a file left out without a word.
IMAGE_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {
        "jpg": "jpeg",
        "jpeg": "jpeg",
        "jpe": "jpeg",
        "jfif": "jpeg",  # (what browsers on Windows save a JPEG as)
        "png": "png",
        "jp2": "jpeg2000",
        "j2k": "jpeg2000",
        "bmp": "bmp",
        "webp": "webp",
        "tif": "tiff",
        "tiff": "tiff",
        "gif": "gif",
        "avif": "avif",
        "heic": "heif",
        "heif": "heif",
        "jxl": "jxl",
        "pnm": "pnm",
        "ppm": "pnm",
        "pgm": "pnm",
        "pbm": "pnm",
        "qoi": "qoi",
    }
)

# Video files: extension -> the container gpubatch names their bytes by (the bytes decide where they can).
VIDEO_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {"mp4": "mp4", "m4v": "mp4", "f4v": "mp4", "mov": "mov", "mkv": "mkv", "webm": "webm", "avi": "avi",
     "divx": "avi", "ts": "ts", "mts": "m2ts", "m2ts": "m2ts", "mpg": "mpg", "mpeg": "mpg", "vob": "mpg",
     "flv": "flv", "3gp": "3gp", "3g2": "3gp", "wmv": "wmv", "asf": "wmv", "ogv": "ogv", "mxf": "mxf"}
)

# Audio files: extension -> the codec gpubatch names their bytes by (the bytes decide where they can).
AUDIO_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {"wav": "wav", "wave": "wav", "flac": "flac", "ogg": "ogg", "oga": "ogg", "opus": "opus", "mp3": "mp3",
     "m4a": "m4a", "aac": "aac", "aiff": "aiff", "aif": "aiff", "aifc": "aiff", "mka": "mka", "weba": "weba",
     "wma": "wma", "au": "au", "snd": "au", "caf": "caf", "w64": "w64"}
)

# Video and audio files, which an image dataset leaves out (named in its warnings).
OTHER_MEDIA_EXTENSIONS: Mapping[str, str] = MappingProxyType(
    {**dict.fromkeys(VIDEO_EXTENSIONS, "video"),
     **dict.fromkeys(AUDIO_EXTENSIONS, "audio")}
)


def other_media_message(path: object, names: list[str]) -> str | None:
    """The error for a dataset of video or audio files, from some of its file names; None for others."""
    kinds: dict[str, int] = {}
    for name in names:
        kind = OTHER_MEDIA_EXTENSIONS.get(name.rsplit(".", 1)[-1].lower()) if "." in name else None
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return None
    if "audio" not in kinds:
        return None
    return (f"{path} holds audio files ({kinds['audio']}) among other files: read it as an audio dataset with "
            "--from audio")


# Codec name -> the extension gpubatch writes for it.
CODEC_EXTENSION: Mapping[str, str] = MappingProxyType(
    {"jpeg": "jpg", "png": "png", "jpeg2000": "jp2", "bmp": "bmp", "webp": "webp", "tiff": "tiff", "gif": "gif",
     "avif": "avif", "heif": "heic", "jxl": "jxl", "pnm": "pnm", "qoi": "qoi", "npy": "npy",
     **{c: c for c in ("mp4", "mov", "mkv", "webm", "avi", "ts", "m2ts", "mpg", "flv", "3gp", "wmv", "ogv", "mxf")},
     **{c: c for c in ("wav", "flac", "ogg", "opus", "mp3", "aac", "m4a", "mka", "weba", "wma", "au", "caf", "w64")}}
)

_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1"}


def sniff_image_codec(data: bytes) -> str | None:
    """Codec of an encoded image from its magic bytes, or None when it is not a known image.

    The bytes decide, never a file's extension: GIF bytes in a file named ``.jpg`` are GIF.
    """
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"\x00\x00\x00\x0c" and data[4:8] == b"jP  " or data[:4] == b"\xff\x4f\xff\x51":
        return "jpeg2000"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[4:8] == b"ftyp":  # ISO base media: AVIF or HEIF by the major brand, else by a compatible one
        size = int.from_bytes(data[:4], "big")
        brands = [data[8:12]] + [data[i : i + 4] for i in range(16, min(size, len(data), 64), 4)]
        if any(b in (b"avif", b"avis") for b in brands):
            return "avif"
        if any(b in _HEIF_BRANDS for b in brands):
            return "heif"
    if data[:2] == b"\xff\x0a" or data[:12] == b"\x00\x00\x00\x0cJXL \r\n\x87\n":
        return "jxl"
    if data[:4] == b"qoif":
        return "qoi"
    if len(data) > 2 and data[:1] == b"P" and data[1:2] in b"1234567" and data[2:3] in b" \t\r\n#":
        return "pnm"
    return None


#: a pixel coordinate (or side) no image reaches (JPEG's side is 65,535; TIFF's 2^32): an annotation's size, corner or
#: point beyond it (1e308, infinity) is refused where it is read (infinity in float32 had ended runs in OverflowErrors)
MAX_COORD = float(1 << 31)


@dataclass(frozen=True, eq=False)
class Boxes:
    """Detection annotations of one image.

    Attributes:
        xyxy: float32 array (N, 4), corners (x0, y0, x1, y1) in pixels of the image as stored
            (COCO's [x, y, w, h] becomes [x, y, x + w, y + h]).
        labels: int64 array (N,), the category id of each box (COCO ids, not remapped).
        canvas: (height, width) in pixels of the image the boxes refer to.
        iscrowd: int64 array (N,) of 0/1.
        extra: per box, a dict of other annotation fields carried through untouched except for
            ``segmentation`` (polygons and RLE masks) and COCO ``keypoints``, which move with the pixels.
        keypoint_flip: per category id, the keypoint order of a mirror image (``left_*`` and
            ``right_*`` swapped; :func:`keypoint_flips`), applied when a map reverses orientation.
    """

    xyxy: np.ndarray
    labels: np.ndarray
    canvas: tuple[int, int]
    iscrowd: np.ndarray | None = None
    extra: tuple[Mapping[str, Any], ...] = ()
    keypoint_flip: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import numpy as np

        with np.errstate(over="ignore", invalid="ignore"):  # (a corner beyond float32: said below, not warned)
            xyxy = np.asarray(self.xyxy, dtype=np.float32).reshape(-1, 4)
        if not np.isfinite(xyxy).all():  # (every writer rounds or scales corners: infinity ended a --to voc finalize)
            raise ValueError("a box corner is no finite number of float32's range (NaN, infinity or beyond 3.4e38)")
        labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        if len(labels) != len(xyxy):
            raise ValueError(f"{len(xyxy)} boxes but {len(labels)} labels")
        iscrowd = (
            np.zeros(len(xyxy), np.int64)
            if self.iscrowd is None
            else np.asarray(self.iscrowd, dtype=np.int64).reshape(-1)
        )
        extra = tuple(self.extra) if self.extra else tuple({} for _ in range(len(xyxy)))
        if len(iscrowd) != len(xyxy) or len(extra) != len(xyxy):
            raise ValueError("iscrowd and extra must have one entry per box")
        object.__setattr__(self, "xyxy", xyxy)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "iscrowd", iscrowd)
        object.__setattr__(self, "extra", extra)
        object.__setattr__(self, "canvas", (int(self.canvas[0]), int(self.canvas[1])))

    def __len__(self) -> int:
        return len(self.xyxy)

    def __eq__(self, other: object) -> bool:
        import numpy as np

        if not isinstance(other, Boxes):
            return NotImplemented
        return (
            self.canvas == other.canvas
            and np.array_equal(self.xyxy, other.xyxy)
            and np.array_equal(self.labels, other.labels)
            and np.array_equal(self.iscrowd, other.iscrowd)
        )

    def normalized(self) -> np.ndarray:
        """Corners divided by the canvas width and height: float32 (N, 4) in [0, 1]."""
        import numpy as np

        h, w = self.canvas
        scale = np.array([w, h, w, h], np.float32)
        return self.xyxy / np.maximum(scale, 1)

    def affine(
        self, sx: float, sy: float, tx: float, ty: float, canvas: tuple[int, int], min_visible: float = 0.0
    ) -> tuple[Boxes, int]:
        """Scale then translate every box (x' = sx * x + tx): :meth:`warp` with a diagonal matrix."""
        import numpy as np

        return self.warp(np.array([[sx, 0.0, tx], [0.0, sy, ty], [0.0, 0.0, 1.0]]), canvas, min_visible)

    def warp(self, matrix: np.ndarray, canvas: tuple[int, int], min_visible: float = 0.0) -> tuple[Boxes, int]:
        """Move every box by a 3x3 projective map of pixel coordinates, then clip to the new canvas.

        A box becomes the box enclosing its four moved corners (a mirror swaps them, a rotation grows
        it). Boxes whose clipped area falls to ``min_visible`` of their moved area or below (and empty
        boxes) are dropped; polygon segmentations move point by point and are clipped. COCO keypoints
        move point by point; one that leaves the canvas becomes unlabeled (0, 0, 0), and under a map
        that mirrors, left and right keypoints trade places (``keypoint_flip``). Returns the new boxes
        and how many were dropped.
        """
        import numpy as np

        m = np.asarray(matrix, np.float64).reshape(3, 3)
        h, w = canvas
        x0, y0, x1, y1 = (self.xyxy[:, i].astype(np.float64) for i in range(4))
        corners = np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x0, y1], 1),
                            np.stack([x1, y1], 1)], 1)  # (N, 4, 2)
        moved_pts = _project(m, corners.reshape(-1, 2)).reshape(-1, 4, 2)
        moved = np.concatenate([moved_pts.min(1), moved_pts.max(1)], 1) if len(self) else np.zeros((0, 4))
        clipped = np.clip(moved, 0, np.array([w, h, w, h], np.float64))
        area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
        vis = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
        keep = (vis > 0) & (vis > min_visible * np.maximum(area, 1e-12))
        det = float(np.linalg.det(m[:2, :2]))
        scale = abs(det) / max(abs(float(m[2, 2])), 1e-12) ** 2
        mirrors = det * float(m[2, 2]) < 0
        extra = []
        for i in np.flatnonzero(keep):
            e = dict(self.extra[i])
            seg = e.get("segmentation")
            area = float(e.get("area", 0.0)) * scale
            if isinstance(seg, list):
                e["segmentation"] = [
                    np.clip(_project(m, np.asarray(poly, np.float64).reshape(-1, 2)), 0, [w, h]).reshape(-1).tolist()
                    for poly in seg
                ]
            elif isinstance(seg, dict) and "counts" in seg:  # an RLE mask (COCO's crowd regions): its own area
                e["segmentation"], area = warp_rle(seg, m, canvas)
            if isinstance(e.get("keypoints"), list) and len(e["keypoints"]) % 3 == 0:
                flip = self.keypoint_flip.get(int(self.labels[i])) if mirrors else None
                e["keypoints"], shown = warp_keypoints(e["keypoints"], m, canvas, flip)
                if "num_keypoints" in e:
                    e["num_keypoints"] = shown
            if "area" in e:
                e["area"] = float(area)
            extra.append(e)
        out = Boxes(clipped[keep], self.labels[keep], canvas, self.iscrowd[keep], tuple(extra), self.keypoint_flip)
        return out, int((~keep).sum())


def keypoint_flips(categories: Any) -> dict[int, tuple[int, ...]]:
    """Per category id with named ``keypoints`` (COCO's categories), the keypoint order of a mirror
    image: each ``left...`` name takes its ``right...`` twin's place and back (``l_``/``r_`` prefixes
    too), as pose-estimation training flips them. Categories without a left/right pair are left out."""
    out: dict[int, tuple[int, ...]] = {}
    for c in categories or ():
        names = c.get("keypoints") if isinstance(c, Mapping) else None
        if not isinstance(names, list) or not isinstance(c.get("id"), int):
            continue
        where = {str(n): i for i, n in enumerate(names)}
        perm = tuple(where.get(_mirror_name(str(n)), i) for i, n in enumerate(names))
        if perm != tuple(range(len(names))):
            out[c["id"]] = perm
    return out


def _mirror_name(name: str) -> str:
    for a, b in (("left", "right"), ("right", "left"), ("Left", "Right"), ("Right", "Left"), ("LEFT", "RIGHT"),
                 ("RIGHT", "LEFT")):
        if a in name:
            return name.replace(a, b)
    for a, b in (("l_", "r_"), ("r_", "l_"), ("L", "R"), ("R", "L")):
        if name.startswith(a) and len(name) > len(a) and (a.endswith("_") or name[len(a)].isupper()):
            return b + name[len(a):]
    return name


def warp_keypoints(flat: list, matrix: np.ndarray, canvas: tuple[int, int],
                   flip: tuple[int, ...] | None = None) -> tuple[list, int]:
    """COCO keypoints ``[x1, y1, v1, ...]`` moved by a 3x3 map onto ``canvas``: (the list, how many are
    labeled). Unlabeled ones (v = 0) stay (0, 0, 0), as do those the map takes off the canvas; ``flip``
    reorders them (a mirror's left and right)."""
    import numpy as np

    pts = np.asarray(flat, np.float64).reshape(-1, 3)
    h, w = canvas
    moved = _project(np.asarray(matrix, np.float64).reshape(3, 3), pts[:, :2]) if len(pts) else pts[:, :2]
    inside = (pts[:, 2] > 0) & (moved[:, 0] >= 0) & (moved[:, 0] <= w) & (moved[:, 1] >= 0) & (moved[:, 1] <= h)
    out = np.zeros_like(pts)
    out[inside, :2] = np.round(moved[inside], 2)
    out[inside, 2] = pts[inside, 2]
    if flip is not None and len(flip) == len(out):
        out = out[list(flip)]
    values = [v for row in out.tolist() for v in (row[0], row[1], int(row[2]))]
    return [int(v) if float(v).is_integer() else v for v in values], int(inside.sum())


def warp_rle(rle: dict, matrix: np.ndarray, canvas: tuple[int, int]) -> tuple[dict, int]:
    """A COCO RLE mask moved by a 3x3 map of pixel coordinates onto ``canvas``: (the RLE, its area).

    Each new pixel takes the mask value under its centre's source point (nearest neighbour), so a flip
    or a 90-degree turn is exact. The counts keep their form: a list stays a list (uncompressed, as in
    COCO's instance files), a string stays COCO's compressed string. pycocotools does the coding.
    """
    import numpy as np

    try:
        from pycocotools import mask as mask_api
    except ImportError:  # pragma: no cover - a core dependency
        from .errors import DependencyError

        raise DependencyError("COCO RLE masks need pycocotools: pip install pycocotools") from None
    sh, sw = (int(v) for v in rle["size"])
    counts = rle["counts"]
    coded = (mask_api.frPyObjects({"size": [sh, sw], "counts": list(counts)}, sh, sw) if isinstance(counts, list)
             else {"size": [sh, sw], "counts": counts.encode("ascii") if isinstance(counts, str) else counts})
    src = mask_api.decode(coded)
    h, w = canvas
    inv = np.linalg.inv(np.asarray(matrix, np.float64).reshape(3, 3))
    out = np.zeros((h, w), np.uint8)
    xs = np.arange(w, dtype=np.float64) + 0.5
    for y0 in range(0, h, 256):  # rows in blocks: a few MiB of coordinates at a time
        ys = np.arange(y0, min(y0 + 256, h), dtype=np.float64) + 0.5
        pts = np.stack(np.broadcast_arrays(xs[None, :], ys[:, None]), -1).reshape(-1, 2)
        at = np.floor(_project(inv, pts)).astype(np.int64)
        ok = (at[:, 0] >= 0) & (at[:, 0] < sw) & (at[:, 1] >= 0) & (at[:, 1] < sh)
        block = np.zeros(len(pts), np.uint8)
        block[ok] = src[at[ok, 1], at[ok, 0]]
        out[y0 : y0 + len(ys)] = block.reshape(len(ys), w)
    area = int(out.sum())
    if isinstance(counts, list):
        flat = out.ravel(order="F")
        edges = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
        runs = np.diff(edges).tolist()
        return {"size": [h, w], "counts": ([0] if flat.size and flat[0] else []) + runs}, area
    encoded = mask_api.encode(np.asfortranarray(out))["counts"]
    return {"size": [h, w], "counts": encoded.decode("ascii") if isinstance(counts, str) else encoded}, area


def _project(m: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """(N, 2) points through a 3x3 projective map."""
    z = pts @ m[:2, :2].T + m[:2, 2]
    d = pts @ m[2, :2] + m[2, 2]
    return z / d[:, None]


@dataclass(frozen=True)
class Record:
    """One sample of a dataset, as it travels from a reader to a writer.

    Attributes:
        key: stable, unique name of the sample within its dataset (``class/file`` without extension
            for a folder, the member key for WebDataset, ...).
        data: the encoded payload (JPEG/PNG/... bytes), passed through untouched unless a pixel op runs.
        media: what ``data`` holds.
        codec: codec of ``data`` ("jpeg", "png", ...).
        label: class index into the dataset's class list, or None when unlabeled.
        boxes: detection annotations, or None.
        meta: other per-record fields carried through (file name, COCO image fields, ...).
        origin: where the record came from ("shard.tar#member"), used in every error message.
        size: (height, width) of the image ``data`` holds, where the run read its header or encoded it
            (writers take it instead of reading the header again); None where not known.
    """

    key: str
    data: bytes
    media: Media = Media.IMAGE
    codec: str = "jpeg"
    label: int | None = None
    boxes: Boxes | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""
    size: tuple[int, int] | None = None

    def with_(self, **changes: Any) -> Record:
        """A copy with some fields replaced (new ``data`` without a ``size`` forgets the old size)."""
        if "data" in changes and "size" not in changes:
            changes["size"] = None
        if not changes.keys() <= _RECORD_FIELDS:
            raise TypeError(f"Record has no field {sorted(changes.keys() - _RECORD_FIELDS)[0]!r}")
        # (dataclasses.replace runs the frozen __init__, a field at a time: 2-4x the time, on every output)
        out = object.__new__(type(self))
        d = out.__dict__
        d.update(self.__dict__)
        d.update(changes)
        return out

    @property
    def filename(self) -> str:
        """A file name for this record: the source file name when known, else key + codec extension."""
        name = self.meta.get("filename")
        ext = CODEC_EXTENSION.get(self.codec, self.codec)
        if name:
            stem = name.rsplit("/", 1)[-1]
            if "." in stem and IMAGE_EXTENSIONS.get(stem.rsplit(".", 1)[1].lower()) == self.codec:
                return stem
            return stem.rsplit(".", 1)[0] + "." + ext
        return self.key.rsplit("/", 1)[-1] + "." + ext


_RECORD_FIELDS = frozenset(f.name for f in fields(Record))


class ClassNames(Sequence):
    """Class names by label where labels run far beyond the classes a dataset names or uses (a label
    of 20,000,000 among a handful): the names known, ``str(label)`` for every other label below
    ``count``. It holds no memory per unnamed class, so an absurd label cannot exhaust memory; a
    table that small labels fill stays a plain tuple (:func:`class_table`).

    Attributes:
        named: label -> name, for the labels that have a name of their own.
        count: one more than the largest label.
    """

    __slots__ = ("named", "count")

    def __init__(self, named: Mapping[int, str], count: int):
        self.named = MappingProxyType(dict(named))
        self.count = int(count)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, label):  # type: ignore[override]
        if isinstance(label, slice):
            raise TypeError("ClassNames takes one label at a time")
        label = int(label)
        if label < 0:
            label += self.count
        if not 0 <= label < self.count:
            raise IndexError(f"label {label} beyond the {self.count:,} classes")
        return self.named.get(label, str(label))

    def __iter__(self):
        raise TypeError(f"a table of {self.count:,} mostly unnamed classes is not listed one by one; "
                        "use .named and len()")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClassNames):
            return self.count == other.count and dict(self.named) == dict(other.named)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.count, tuple(sorted(self.named.items()))))

    def __repr__(self) -> str:
        return f"ClassNames({len(self.named)} named, count={self.count:,})"


#: Labels up to this many classes always get a plain tuple of names.
DENSE_CLASSES = 1 << 16


#: The largest class index gpubatch accepts: int32, what Caffe's Datum, DALI's label outputs and MXNet's
#: float32 labels (exact to 2^24) can all carry at most.
MAX_LABEL = 2**31 - 1


def class_table(named: Mapping[int, str] | Sequence[str], labels: Any = ()) -> tuple[str, ...] | ClassNames:
    """Class names for a dataset: ``named`` (names by label, or a list) extended with ``str(i)`` up to its
    largest label, as a tuple where that is small (at most :data:`DENSE_CLASSES` classes, or no more
    than four times the labels in use), else a :class:`ClassNames` that holds only the names. Labels and
    names beyond :data:`MAX_LABEL` are left out (their records are refused where they are read): a table
    sized by one had no length (``OverflowError``) and ended the run."""
    if isinstance(named, ClassNames):
        names, least = dict(named.named), named.count
    else:
        names, least = dict(enumerate(named)) if not isinstance(named, Mapping) else dict(named), 0
    names = {k: v for k, v in names.items() if 0 <= int(k) <= MAX_LABEL}
    used = {int(x) for x in labels if x is not None and 0 <= int(x) <= MAX_LABEL}
    count = max(max([*used, *names], default=-1) + 1, least)
    if count <= DENSE_CLASSES or count <= 4 * (len(used) + len(names)):
        return tuple(names.get(i, str(i)) for i in range(count))
    return ClassNames({k: v for k, v in names.items() if v != str(k)}, count)


@dataclass(frozen=True)
class DatasetInfo:
    """What a reader knows about its dataset as a whole.

    Attributes:
        classes: class names, indexed by ``Record.label``: a tuple, or a :class:`ClassNames` where
            labels run far beyond the names (see :func:`class_table`).
        categories: COCO-style detection categories (``{"id", "name", "supercategory"}``), or empty.
        extra: other dataset-level fields (COCO ``info``/``licenses``...).
    """

    classes: tuple[str, ...] | ClassNames = ()
    categories: tuple[Mapping[str, Any], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchSpec:
    """Shape and type of decoded data flowing between ops.

    Attributes:
        layout: memory layout of each item.
        dtype: NumPy dtype name ("uint8", "float16", "float32").
        channels: channels per pixel.
        shape: spatial shape (H, W) when every item has it, None when ragged.
    """

    layout: Layout = Layout.HWC
    dtype: str = "uint8"
    channels: int = 3
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ShardTask:
    """One unit of work, of commit and of resume: the input entries ``start:stop`` of a run's entry list,
    written as the output shard (or, for formats without shards, the part) named ``name``.

    A run plans all its tasks from the entry list before any data moves (:mod:`gpubatch.engine.execute`),
    so the shards, their names and their bytes do not depend on how many workers or GPUs write them.
    """

    index: int
    start: int
    stop: int
    name: str
    entries: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class ShardResult:
    """What writing one shard did: its counts (``records_in``, ``records_out``, ``passthrough``,
    ``transcoded``, ``fallbacks``, ``boxes_dropped``, ``bytes_in``, ``bytes_out``), its skipped records
    with their reasons, warnings, the files it committed (name -> [bytes, CRC-32C digest]), seconds per
    stage, and what its format keeps for the dataset-wide files (``extra``). A journal entry holds one."""

    index: int
    name: str
    start: int
    stop: int
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: dict[str, list] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("index", "name", "start", "stop", "counts", "skipped", "warnings",
                                               "files", "timings", "extra")}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardResult:
        return cls(**{k: d[k] for k in ("index", "name", "start", "stop", "counts", "skipped", "warnings", "files",
                                        "timings", "extra")})
