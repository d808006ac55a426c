"""A validated op chain plus the encode settings: checked before any data moves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import RecordCondition, UsageError
from ..types import Boxes, Record
from .codecs.headers import DEFAULT_MAX_PIXELS
from .media import HOST, MediaSpec, get_codec
from .ops.base import Op
from .registry import DEVICE, get_kernel

IMAGE_FORMATS = ("keep", "jpeg", "png")
AUDIO_FORMATS = ("keep", "flac", "wav", "npy")
VERIFY = ("headers", "full")
JPEG_MAX_SIDE = 65_535
_LOSSLESS = {"png", "bmp", "tiff"}


@dataclass(frozen=True)
class Plan:
    """What happens to each record's pixels.

    Attributes:
        ops: the op chain, applied in order to decoded uint8 RGB HWC pixels.
        image_format: "keep" (JPEG stays JPEG, PNG stays PNG), "jpeg" or "png".
        quality: JPEG quality 1-100; given explicitly, it re-encodes JPEGs even with no op.
        max_pixels: images above this many pixels are refused before decoding, and so is a record that
            an op would make larger than that (0: no limit).
        min_box_visibility: boxes keeping this fraction of their area or less after a crop are dropped.
        seed: seed of the per-record random parameters (random crops, flips).
        copies: 0 for convert (each record goes out once, under its own key); K >= 1 for augment: K
            variants ``<key>_aug<k>`` per record, each drawing its own parameters.
        keep_original: with ``copies``, also write each record untouched under its own key.
        verify: how the bytes that pass through untouched are checked: "headers" (the header read, a
            PNG's chunk CRCs, a JPEG without its end marker decoded) or "full" (every image decoded).
        media: what the records hold ("image"; the codec registry's key, :mod:`.media`).
        sample: how a record of a timed media becomes its outputs (video: frames, clips or the whole
            video re-encoded; :mod:`.ops.temporal`), or None (one output per record). A chain's leading
            temporal op (``clip``, ``random_clip``) becomes it.
        audio_format: what audio outputs are written as: "keep" (FLAC and WAV stay, lossy codecs become
            FLAC), "flac", "wav" or "npy" (float32 samples); features are always float16 ``.npy``.
    """

    ops: tuple[Op, ...] = ()
    image_format: str = "keep"
    quality: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    min_box_visibility: float = 0.0
    seed: int = 0
    copies: int = 0
    keep_original: bool = False
    verify: str = "headers"
    media: str = "image"
    sample: Any = None
    audio_format: str = "keep"
    layout: str | None = None  # what the records decode to where not the media's own (audio features: "CFT")

    def __post_init__(self) -> None:
        temporal = [op for op in self.ops if op.kind == "temporal"]
        if temporal:
            if len(temporal) > 1 or self.ops[0] is not temporal[0]:
                raise UsageError(f"{temporal[0].name} picks a video's frames: it leads the chain, once")
            if self.sample is not None:
                raise UsageError(f"the chain's {temporal[0].name} and the clip options both pick frames: give one")
            object.__setattr__(self, "sample", temporal[0].sampler())
            object.__setattr__(self, "ops", self.ops[1:])
        if self.verify not in VERIFY:
            raise UsageError(f"unknown --verify {self.verify!r}; supported: {', '.join(VERIFY)}")
        if self.image_format not in IMAGE_FORMATS:
            raise UsageError(f"unknown image format {self.image_format!r}; supported: {', '.join(IMAGE_FORMATS)}")
        if self.quality is not None and not 1 <= int(self.quality) <= 100:
            raise UsageError(f"--quality must be between 1 and 100, got {self.quality}")
        if self.max_pixels is not None and self.max_pixels < 0:
            raise UsageError(f"--max-pixels must be >= 0, got {self.max_pixels}")
        if self.ops and self.max_pixels and all(_pixels(op) for op in self.ops):
            self._check_growth()
        if self.audio_format not in AUDIO_FORMATS:
            raise UsageError(f"unknown --audio-format {self.audio_format!r}; supported: {', '.join(AUDIO_FORMATS)}")

    _PROBES = ((1, 1), (480, 640), (640, 480), (37, 1500), (1500, 37))

    def _check_growth(self) -> None:
        """Refuse a chain that makes every image larger than ``max_pixels`` (tried on a few input sizes):
        each record would fail at run time, after all the reading, for want of memory."""
        worst = []
        for k, (h, w) in enumerate(self._PROBES):
            try:
                self.move_boxes(None, h, w, self.draw(f"size probe {k}", h, w))
            except ImageTooLarge as e:
                worst.append(e)
                continue
            except Exception:  # noqa: BLE001 - an op that cannot take this probe size: no verdict
                return
            return  # some image size fits
        e = min(worst, key=lambda e: e.height * e.width)
        raise UsageError(f"{e.op} makes images of {e.width}x{e.height} = {e.height * e.width:,} pixels, above "
                         f"--max-pixels {self.max_pixels:,}: every record would fail (raise --max-pixels to allow it)")

    @property
    def augmenting(self) -> bool:
        return self.copies > 0

    @property
    def outputs_per_record(self) -> int:
        return self.copies + int(self.keep_original) if self.copies else 1

    def outputs(self, record: Record) -> list[tuple[Record, bool]]:
        """The records ``record`` becomes, each with whether its pixels go through the chain. A media
        whose records become several outputs (a video's frames or clips) has its codec say which
        (``outputs``; a RecordError where the record cannot be split)."""
        split = getattr(get_codec(record.media, record.codec, HOST), "outputs", None)
        if split is not None:
            if not self.copies:
                if self.sample is None and not self.ops:
                    return [(record, False)]
                return [(r, True) for r in split(record, self)]
            out = [(record, False)] if self.keep_original else []
            return out + [(r, True) for k in range(self.copies) for r in split(variant(record, f"_aug{k}"), self)]
        if not self.copies:
            return [(record, self.needs_decode(record.codec))]
        out = [(record, False)] if self.keep_original else []
        return out + [(variant(record, f"_aug{k}"), True) for k in range(self.copies)]

    @property
    def jpeg_quality(self) -> int:
        return 95 if self.quality is None else int(self.quality)

    @property
    def touches_pixels(self) -> bool:
        """True when any record may need decoding (an op, a format change or an explicit quality)."""
        return (bool(self.ops) or self.image_format != "keep" or self.quality is not None or self.sample is not None
                or self.audio_format != "keep")

    def out_codec(self, codec: str) -> str:
        if self.image_format != "keep":
            return self.image_format
        return "png" if codec in _LOSSLESS else "jpeg"

    def needs_decode(self, codec: str) -> bool:
        """Whether a record of ``codec`` must be decoded and re-encoded under this plan: always with ops;
        with ``--image-format`` where the codec differs; with ``--quality`` alone for JPEGs only. Without
        any of them, every codec's bytes pass through untouched (a lossless WebP stays lossless, an
        animated one keeps its frames)."""
        if self.ops:
            return True
        if self.media == "audio":
            return self.audio_format not in ("keep", codec)
        if self.image_format != "keep":
            return self.image_format != codec or (self.quality is not None and codec == "jpeg")
        return self.quality is not None and codec == "jpeg"

    def check_encodable(self, codec: str, height: int, width: int) -> None:
        """Raise a ValueError where ``codec`` cannot hold an image of this size (JPEG's 65,535-pixel side)."""
        if codec == "jpeg" and max(height, width) > JPEG_MAX_SIDE:
            raise ValueError(f"the {width}x{height} result is beyond JPEG's limit of {JPEG_MAX_SIDE:,} pixels a side: "
                             "pass --image-format png to write such images")

    def out_hw(self, h: int, w: int, params: list | None) -> tuple[int, int]:
        """The size the chain makes of an (h, w) image with these drawn parameters."""
        for op, p in zip(self.ops, params or [None] * len(self.ops)):
            h, w = op.out_hw(h, w, p)
        return h, w

    def validate(self, backend: str) -> MediaSpec:
        """Check that every op takes what the op before makes (:meth:`~.ops.base.Op.out_spec`, from what
        the media's codec decodes to) and can run on ``backend``; returns the spec of the chain's output.

        Raises:
            UsageError: naming the op and what it takes, or the kernels that exist.
        """
        from .media import media_spec

        if self.sample is not None and self.media != "video":
            raise UsageError(f"{self.sample.describe()} takes video data, not {self.media}")
        spec = media_spec(self.media, backend)
        if self.layout:  # (arrays of audio features gpubatch wrote: the chain starts from features)
            spec = spec.with_(layout=self.layout)
        for i, op in enumerate(self.ops):
            spec = op.out_spec(spec)
            if backend != DEVICE or op.kind == "custom":
                get_kernel(op.name, backend)
            if op.name == "normalize" and i != len(self.ops) - 1:
                raise UsageError("normalize must be the last op of a chain")
        return spec

    def draw(self, key: str, h: int, w: int, boxes: Boxes | None = None, epoch: int = 0) -> list:
        """Per-op parameters of the record ``key`` with an (h, w) decoded image (same on CPU and GPU).

        ``boxes`` (on the decoded canvas) are followed through the chain for ops that look at them.
        ``epoch`` picks the random stream: a training loop's epochs draw new crops and flips, each as
        reproducible as the first (epoch 0 is what ``convert`` and ``augment`` draw).
        """
        from .rng import record_rng

        rng = record_rng(self.seed, key, epoch) if any(op.random for op in self.ops) else None
        track = boxes is not None and any(op.needs_boxes for op in self.ops)
        params = []
        for op in self.ops:
            p = op.make_params(h, w, rng, boxes) if op.random else None
            params.append(p)
            if track:
                boxes, _ = op.move_boxes(boxes, h, w, p, self.min_box_visibility)
            h, w = op.out_hw(h, w, p)
        return params

    def draw_and_move(self, key: str, h: int, w: int, boxes: Boxes | None) -> tuple[list, Boxes | None, int]:
        """Parameters, the boxes after the chain and how many were dropped, for a record decoded to (h, w).

        Boxes annotated on another canvas (a resized source) are first scaled to the decoded size.
        Raises ImageTooLarge (a ValueError) where an op would make the image larger than ``max_pixels``.
        """
        if boxes is not None and boxes.canvas != (h, w):
            ch, cw = boxes.canvas
            boxes, _ = boxes.affine(w / max(cw, 1), h / max(ch, 1), 0.0, 0.0, (h, w))
        params = self.draw(key, h, w, boxes)
        boxes, dropped = self.move_boxes(boxes, h, w, params)
        return params, boxes, dropped

    def move_boxes(self, boxes: Boxes | None, h: int, w: int, params: list | None = None) -> tuple[Boxes | None, int]:
        """Boxes after the whole chain on an (h, w) image, and how many were dropped on the way.

        Raises ImageTooLarge at the first op whose output would exceed ``max_pixels`` (the same walk
        through the ops' output sizes).
        """
        dropped = 0
        for op, p in zip(self.ops, params or [None] * len(self.ops)):
            boxes, d = op.move_boxes(boxes, h, w, p, self.min_box_visibility)
            dropped += d
            h, w = op.out_hw(h, w, p)
            if self.max_pixels and h * w > self.max_pixels and _pixels(op):
                raise ImageTooLarge(op.name, h, w, self.max_pixels)
        return boxes, dropped


def _pixels(op: Op) -> bool:
    """Whether ``op`` makes pixels, which ``--max-pixels`` bounds (an audio op's (h, w) are a sample rate
    and a length, or bins and frames)."""
    return "image" in op.media


class ImageTooLarge(RecordCondition):
    """An op would make an image larger than ``--max-pixels`` (a ValueError: the record's error)."""

    def __init__(self, op: str, height: int, width: int, limit: int):
        super().__init__(f"{op} would make a {width}x{height} image, above --max-pixels {limit}")
        self.op, self.height, self.width = op, height, width


def variant(record: Record, suffix: str) -> Record:
    """``record`` under the key ``<key><suffix>``, its file names renamed the same way (new COCO ids)."""
    meta = dict(record.meta)
    for f in ("filename", "file_name"):
        name = meta.get(f)
        if isinstance(name, str) and name:
            head, dot, ext = name.rpartition(".")
            meta[f] = f"{head}{suffix}.{ext}" if dot and "/" not in ext else name + suffix
    meta.pop("coco_id", None)
    return record.with_(key=record.key + suffix, meta=meta)


def make_plan(
    resize_shorter: int | None = None,
    center_crop: int | None = None,
    resize: Sequence[int] | None = None,
    image_format: str = "keep",
    quality: int | None = None,
    max_pixels: int | None = None,
    verify: str = "headers",
) -> Plan:
    """The plan of ``convert``'s pixel options: resize (h, w), then resize-shorter, then center crop."""
    ops: list[Op] = []
    if resize or resize_shorter or center_crop:  # (a pass-through's command never imports the ops, nor NumPy)
        from .ops.geometry import CenterCrop, Resize, ResizeShorter
    if resize:
        ops.append(Resize(int(resize[0]), int(resize[1])))
    if resize_shorter:
        ops.append(ResizeShorter(int(resize_shorter)))
    if center_crop:
        ops.append(CenterCrop(int(center_crop)))
    return Plan(
        ops=tuple(ops),
        image_format=image_format,
        quality=quality,
        max_pixels=DEFAULT_MAX_PIXELS if max_pixels is None else int(max_pixels),
        verify=verify,
    )
