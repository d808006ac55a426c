"""The public Python API, which the CLI calls too: :func:`convert`, :func:`info`, :func:`open_dataset`.

    >>> from gpubatch import convert
    >>> s = convert("data/train", "out/train-tfr", to="tfrecord", resize_shorter=256, quality=90)
    >>> s.records_out, s.skipped
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ._paths import check_output, refuse_url, require_source, source_root, staged_output
from .engine.device import Device, DeviceKind, resolve
from .engine.registry import HOST
from .errors import ErrorPolicy, ErrorRouter, GpubatchError, RunStats, UsageError, python_messages
from .formats import get_format, open_reader
from .formats.base import JSON_FIELDS, MEMBERS, Reader, WriteOptions, Writer
from .formats.manifest import manifest_classes, write_manifest
from .types import IMAGE_EXTENSIONS, Media, Record


@dataclass(frozen=True)
class ConvertRequest:
    """Everything one ``convert`` run needs; the CLI builds one from its flags.

    Pixel options (``resize_shorter``, ``center_crop``, ``resize``, ``quality``, ``image_format`` other
    than "keep") decode, transform and re-encode images; without them encoded bytes pass through
    untouched. ``device`` is "auto", "cpu" or "gpu".
    """

    src: Path
    dst: Path
    to: str
    from_format: str | None = None
    resize_shorter: int | None = None
    center_crop: int | None = None
    resize: tuple[int, int] | None = None
    quality: int | None = None
    image_format: str = "keep"
    max_pixels: int | None = None
    verify: str = "headers"
    shard_size: int = 10_000
    name: str = "data"
    layout: str = "imagenet"
    workers: int | None = None
    limit: int | None = None
    shuffle: bool = False
    seed: int = 0
    on_error: str = "skip"
    overwrite: bool = False
    device: str = "auto"
    gpu: int = 0
    batch_size: int = 256
    gpu_memory: str | None = None
    gpu_procs: int | None = None
    frames: str | None = None
    clip_length: int | None = None
    clip_stride: int | None = None
    frame_step: int | None = None
    clip_positions: str | None = None
    clips_per_video: int | None = None
    clip_format: str | None = None
    video_codec: str | None = None
    fps: float | None = None
    sample_rate: int | None = None
    mono: bool | None = None
    duration: float | None = None
    pad: str | None = None
    audio_format: str | None = None
    features: str | None = None
    path_column: str | None = None
    label_column: str | None = None

    def options(self) -> dict[str, Any]:
        """The request as JSON-able settings for the manifest (the video and audio options where given)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in _VIDEO_OPTIONS:
                continue
            out[f.name] = str(v) if isinstance(v, Path) else v
        return out


_VIDEO_OPTIONS = frozenset({"frames", "clip_length", "clip_stride", "frame_step", "clip_positions", "clips_per_video",
                            "clip_format", "video_codec", "fps", "sample_rate", "mono", "duration", "pad",
                            "audio_format", "features", "path_column", "label_column"})


def _reader_options(req: Any) -> dict[str, Any]:
    """What the request says about reading its source (an audio CSV's columns)."""
    return {k: getattr(req, k, None) for k in ("path_column", "label_column") if getattr(req, k, None)}


@dataclass
class RunSummary:
    """What a run did, for the end-of-run summary, ``--json`` and the manifest."""

    src: str
    dst: str
    src_format: str
    dst_format: str
    device: str
    device_reason: str
    records_in: int = 0
    records_out: int = 0
    passthrough: int = 0
    transcoded: int = 0
    fallbacks: int = 0
    boxes_dropped: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    skipped: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    gpu_memory: dict[str, Any] = field(default_factory=dict)
    library_messages: int = 0  # lines the decoders printed, held back by the command (--verbose lists them)

    @property
    def records_per_second(self) -> float:
        return self.records_in / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["records_per_second"] = round(self.records_per_second, 1)
        return d


class _LossWarningWriter(Writer):
    """Passes records to a writer; warns once when boxes, label arrays or a sample's other members meet a
    format that cannot hold them, and when members that are images stay as they were while pixel ops
    moved the image's pixels beside them."""

    def __init__(self, inner: Writer, fmt: Any, stats: RunStats, geometric: bool = False):
        self.inner, self.fmt, self.stats, self.geometric = inner, fmt, stats, geometric
        self.audio: dict[str, Any] = {}  # the sample rate and features every array written shares
        self.dropped_audio = 0  # re-encoded videos whose audio track could not go into their container

    def audio_facts(self, record: Record) -> None:
        """Note an audio array's sample rate and features (what a ``.npy`` holds no trace of): the
        manifest keeps them where every array shares them, for formats that hold no metadata of a record
        (LMDB). There a waveform of another rate than the first's is this record's error."""
        if record.media is not Media.AUDIO or record.codec != "npy":
            return
        facts = {"sample_rate": record.meta.get("sample_rate"), "features": record.meta.get("features") or ""}
        if not self.audio:
            self.audio = facts
        elif facts != self.audio:
            if not self.fmt.carries_record_meta:
                raise ValueError(f"{self.fmt.name} holds no sample rate a record: its arrays share one (gpubatch.json "
                                 f"says {self.audio['sample_rate']} Hz), and this one is {facts['sample_rate']} Hz; "
                                 "pass --sample-rate, or write to webdataset or tfrecord")
            self.audio = {"mixed": True}

    def write(self, record: Record) -> None:
        if isinstance(record.media, Media) and record.media not in self.fmt.media:
            raise UsageError(f"{self.fmt.name} holds {' and '.join(m.value for m in self.fmt.media)} records, not "
                             f"{record.media.value} ({record.origin}): {_media_formats(record.media)}")
        held = self.fmt.image_codecs
        if held is not None and record.media is Media.IMAGE and record.codec not in held:
            raise UsageError(f"{self.fmt.name} cannot hold {record.codec} images ({record.origin}): its readers decode "
                             f"{', '.join(sorted(held))}; pass --image-format png (or jpeg) to re-encode them, or "
                             "choose a format that keeps any codec (webdataset, tfrecord, folder)")
        if record.boxes is not None and len(record.boxes) and not self.fmt.carries_boxes:
            self.stats.warn(f"{self.fmt.name} cannot hold detection boxes: boxes were dropped")
        if not self.fmt.carries_label_arrays and len(record.meta.get("labels") or ()) > 1:
            self.stats.warn(f"{self.fmt.name} holds one class a record: RecordIO multi-label arrays were cut to "
                            "their first label")
        members = record.meta.get(MEMBERS) or {}
        if (members or JSON_FIELDS in record.meta) and not self.fmt.carries_members:
            names = ", ".join(f".{e}" for e in sorted([*members, *([JSON_FIELDS] if JSON_FIELDS in record.meta else [])]))
            self.stats.warn(f"{self.fmt.name} cannot hold a sample's other WebDataset members ({names}, "
                            "e.g. captions): they were dropped; webdataset and tfrecord keep them")
        elif self.geometric and "clip" not in record.meta and any(e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS
                                                                  for e in members):  # (a clip's members: its frames)
            names = ", ".join(f".{e}" for e in sorted(members) if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS)
            self.stats.warn(f"the samples' other image members ({names}) were kept as they were: the geometric "
                            "ops moved only the sample's image")
        self.audio_facts(record)
        sound = record.meta.get("audio")
        if isinstance(sound, str) and sound.startswith("dropped"):  # a re-encoded video's track MP4 cannot hold
            self.dropped_audio += 1
            self.stats.warn(f"the audio track of a re-encoded video was {sound} ({record.origin}); the others' "
                            "tracks were copied")
        self.inner.write(record)

    def close(self) -> None:
        self.inner.close()


def _media_formats(media: Media) -> str:
    from .formats import FORMATS, _load

    _load()
    names = sorted(n for n, f in FORMATS.items() if media in f.media)
    return f"{', '.join(names)} hold {media.value}" + (
        "; --frames writes a video's frames as images" if media is Media.VIDEO else "")


def _check_output_options(req: Any) -> None:
    """Refuse, before anything runs and whatever the device, a ``--name`` that is no plain, visible file
    name prefix (shards are ``NAME-00000...``) and a malformed ``--gpu-memory``."""
    name = req.name
    if not name or name.startswith(".") or any(c in name for c in "/\\\0") or len(name) > 100:
        raise UsageError(f"--name {name!r}: give a file name prefix (not empty, no path separator, "
                         "no leading '.', at most 100 characters)")
    if req.gpu_memory is not None:
        from .engine.gpu_memory import parse_memory

        parse_memory(req.gpu_memory, 80 << 30)


def _starts_as(reader: Reader, plan: Any) -> str | None:
    """What a chain starts from where it is not what the media decodes to: arrays of audio features that
    gpubatch wrote (SpecAugment's masks take them), as the first readable record says."""
    if reader.media != "audio" or not plan.ops:
        return None
    from .engine.ops.audio import FEATURES

    for entry in reader.entries()[:8]:
        try:
            record = reader.read(entry)
        except Exception:  # noqa: BLE001 - a bad record is the run's to report
            continue
        return FEATURES if record.codec == "npy" and record.meta.get("features") else None
    return None


def _select(reader: Reader, limit: int | None, shuffle: bool, seed: int) -> list[Any]:
    entries = list(reader.entries())
    if shuffle:
        random.Random(seed).shuffle(entries)
    if limit is not None:
        if limit < 0:
            raise UsageError(f"--limit must be >= 0, got {limit}")
        entries = entries[:limit]
    return entries


@python_messages
def convert(
    src: str | Path | ConvertRequest,
    dst: str | Path | None = None,
    to: str | None = None,
    *,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
    on_device: Callable[[Device], None] | None = None,
    **options: Any,
) -> RunSummary:
    """Convert the dataset at ``src`` into format ``to`` at ``dst``.

    Args:
        src: source dataset (folder, LMDB dir, shard folder, COCO folder or JSON), or a ConvertRequest.
        dst: destination path; it must not exist unless ``overwrite=True``, and must lie outside ``src``.
        to: output format name (see :func:`gpubatch.format_names`).
        progress: ``progress(total)`` returns a callback advanced by one per record.
        on_device: called once with the resolved device, before data moves.
        **options: any other :class:`ConvertRequest` field.

    Returns:
        a :class:`RunSummary`. The output appears at ``dst`` only when complete.

    Raises:
        GpubatchError: bad arguments or an unreadable source (one-line message);
        RecordFailed: a bad record under ``on_error="fail"``.
    """
    if isinstance(src, ConvertRequest):
        req = src
    else:
        if dst is None or to is None:
            raise UsageError("convert needs a source, a destination and a format (to=...)")
        refuse_url(src, "source")
        refuse_url(dst, "destination")
        req = ConvertRequest(src=Path(src), dst=Path(dst), to=to, **options)
    refuse_url(req.src, "source")
    refuse_url(req.dst, "destination")
    from .engine.plan import make_plan

    fmt = get_format(req.to)
    src_path, dst_path = Path(req.src), Path(req.dst)
    require_source(src_path)
    if req.shard_size < 1:
        raise UsageError(f"--shard-size must be >= 1, got {req.shard_size}")
    if req.layout not in ("imagenet", "flat"):
        raise UsageError(f"unknown layout {req.layout!r}; supported: imagenet, flat")
    policy = ErrorPolicy(req.on_error) if req.on_error in ("skip", "fail") else None
    if policy is None:
        raise UsageError(f"unknown --on-error {req.on_error!r}; supported: skip, fail")
    from .engine.ops.temporal import sampler_from_options

    sample = sampler_from_options(req.frames, req.clip_length, req.clip_stride, req.frame_step, req.clip_positions,
                                  req.clips_per_video, req.clip_format, req.video_codec, req.fps, req.image_format)
    if sample is not None and (getattr(sample, "fmt", None) == "mp4" or getattr(sample, "kind", "") == "video"
                               or req.video_codec):
        from .engine.codecs.video import check_video_encoder

        check_video_encoder(req.video_codec or "h264")  # (no NVENC on Hopper: refused before reading)

    plan = make_plan(req.resize_shorter, req.center_crop, req.resize, req.image_format, req.quality, req.max_pixels,
                     req.verify)
    sound = audio_ops(req.sample_rate, bool(req.mono), req.duration, req.pad or "zero", req.features)
    plan = dataclasses.replace(plan, sample=sample, ops=plan.ops + sound, audio_format=req.audio_format or "keep")
    _check_output_options(req)
    check_output(source_root(src_path), dst_path, req.overwrite)
    if plan.touches_pixels or req.device == "gpu":
        device = resolve(req.device, req.gpu)
    else:
        device = Device(DeviceKind.CPU, reason="no pixel option: encoded bytes pass through untouched")
    if on_device:
        on_device(device)
    return _execute(req, src_path, dst_path, fmt, plan, device, policy, progress, {"options": req.options()})


def audio_ops(sample_rate: int | None = None, mono: bool = False, duration: float | None = None,
              pad: str = "zero", features: str | None = None) -> tuple[Any, ...]:
    """The ops of ``convert``'s audio options: mono, resample, fix the duration, then features."""
    from .engine.ops.audio import FeatureOp, FixDuration, Mono, Resample
    from .engine.spec import parse_chain

    ops: list[Any] = []
    if mono:
        ops.append(Mono())
    if sample_rate:
        ops.append(Resample(int(sample_rate)))
    if duration:
        ops.append(FixDuration(float(duration), pad))
    elif pad != "zero":
        raise UsageError("--pad needs --duration")
    if features:
        try:
            feats = parse_chain(features.replace("log-mel", "log_mel"))
        except UsageError:
            feats = ()
        if len(feats) != 1 or not isinstance(feats[0], FeatureOp):
            raise UsageError(f"--features takes one of log-mel, mel, mfcc, spectrogram (e.g. \"log-mel(n_mels=80)\"), "
                             f"got {features!r}")
        ops.extend(feats)
    return tuple(ops)


def _execute(req: Any, src_path: Path, dst_path: Path, fmt: Any, plan: Any, device: Device, policy: ErrorPolicy,
             progress: Callable[[int, int], Callable[[int], None]] | None, manifest: dict[str, Any]) -> RunSummary:
    """Read ``src`` -> run ``plan`` on ``device`` -> write ``fmt`` at ``dst`` (staged), summary and manifest."""
    stats = RunStats()
    router = ErrorRouter(policy, stats)
    start = time.perf_counter()
    with open_reader(src_path, req.from_format, _reader_options(req)) as reader:
        check_output(reader.roots(), dst_path, req.overwrite)  # a COCO JSON's image folder is source too
        plan = dataclasses.replace(plan, media=reader.media, layout=_starts_as(reader, plan))
        from .engine.media import DEVICE as ON_DEVICE
        from .engine.media import has_codec

        plan.validate(ON_DEVICE if device.is_gpu and has_codec(plan.media, ON_DEVICE) else HOST)  # before reading
        src_format = reader.format_name
        if plan.media == "video" and Media.VIDEO not in fmt.media and not getattr(plan.sample, "kind", "") == "frames":
            raise UsageError(f"{fmt.name} holds {' and '.join(m.value for m in fmt.media)} records, not video: "
                             f"{_media_formats(Media.VIDEO)}")
        entries = _select(reader, req.limit, getattr(req, "shuffle", False), req.seed)
        if not entries:
            raise GpubatchError(f"{src_path} ({src_format}) holds no records: nothing written" if req.limit != 0
                                else "--limit 0 converts no record: nothing written")
        info = reader.info()
        for message in reader.warnings:
            stats.warn(message)
        tick = progress(len(entries) * plan.outputs_per_record) if progress else None
        try:
            with staged_output(dst_path, req.overwrite, stats.warn) as stage:
                summary, extra = _write(req, reader, entries, info, stage, fmt, plan, device, router, tick, start)
                write_manifest(stage, {
                    "format": fmt.name,
                    "records": stats.records_out,
                    **extra,
                    "classes": manifest_classes(info.classes),
                    "categories": [dict(c) for c in info.categories],
                    "source": {"path": str(src_path.resolve()), "format": src_format},
                    **manifest,
                    "device": str(device),
                    "errors": summary.skipped,
                    "warnings": summary.warnings,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                })
        except OSError as e:  # disk full, a folder that went away...: the staging folder is gone already
            raise GpubatchError(f"writing {dst_path} failed: {e.strerror or e}"
                                f"{f' ({e.filename})' if getattr(e, 'filename', None) else ''}") from None
    return summary


def _write(req: Any, reader: Reader, entries: list, info: Any, stage: Path, fmt: Any, plan: Any, device: Device,
           router: ErrorRouter, tick: Callable[[int], None] | None, start: float) -> tuple[RunSummary, dict[str, Any]]:
    """Run the records through ``plan`` into ``fmt`` in ``stage``: the summary of what was written, and
    what the manifest says of the output besides (each shard's record count, the audio arrays' rate)."""
    stats = router.stats
    src_path = Path(req.src)
    inner = fmt.writer(stage, info, WriteOptions(shard_size=req.shard_size, name=req.name, source=str(src_path),
                                                 extra={"layout": req.layout}))
    checked = _LossWarningWriter(inner, fmt, stats, any(op.moves_boxes for op in plan.ops))
    writer: Writer = checked
    if plan.augmenting:
        writer = _ParamsLog(writer, stage / PARAMS_FILE, stats)
    with writer:
        _run(device, reader, entries, writer, plan, router, req, tick)
    for message in inner.warnings:
        stats.warn(message)
    if stats.records_in and not stats.records_out:
        (reason, n), *_ = stats.error_reasons().most_common(1) or [("no output", stats.records_in)]
        raise GpubatchError(f"none of the {stats.records_in} records of {src_path} could be converted "
                            f"({n} x {reason}): nothing written")
    extra: dict[str, Any] = {}  # what the manifest says of the output besides the summary
    if checked.audio and not checked.audio.get("mixed"):
        extra["audio"] = checked.audio
    if hasattr(inner, "shard_table"):
        extra["shards"] = inner.shard_table()
    return RunSummary(
        src=str(src_path), dst=str(req.dst), src_format=reader.format_name, dst_format=fmt.name,
        device=str(device), device_reason=device.reason, records_in=stats.records_in,
        records_out=stats.records_out, passthrough=stats.passthrough, transcoded=stats.transcoded,
        fallbacks=stats.fallbacks, boxes_dropped=stats.boxes_dropped, bytes_in=stats.bytes_in,
        bytes_out=stats.bytes_out, seconds=time.perf_counter() - start, skipped=[e.as_dict() for e in stats.errors],
        warnings=list(stats.warnings), timings={k: round(v, 4) for k, v in stats.timings.items()},
        gpu_memory=dict(stats.gpu_memory),
    ), extra


PARAMS_FILE = "augment-params.jsonl"


class _ParamsLog(Writer):
    """Passes records to a writer and logs, per written record, the parameters drawn for it (JSON lines)."""

    def __init__(self, inner: Writer, path: Path, stats: RunStats):
        self.inner, self.stats = inner, stats
        self.fh = open(path, "w")  # noqa: SIM115 - closed in close()

    def write(self, record: Record) -> None:
        params = self.stats.drawn.pop(record.key, None)
        self.inner.write(record)
        entry = {"key": record.key, "params": jsonable(params)} if params is not None else {"key": record.key, "original": True}
        self.fh.write(json.dumps(entry) + "\n")

    def close(self) -> None:
        self.fh.close()
        self.inner.close()


def jsonable(value: Any) -> Any:
    """Drawn parameters as JSON values (tuples -> lists, NumPy scalars -> numbers)."""
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


@dataclass(frozen=True)
class AugmentRequest:
    """Everything one ``augment`` run needs. The chain is ``ops`` (chain text), ``pipeline`` (a YAML/JSON
    file) or ``preset`` (a name from :data:`gpubatch.engine.spec.PRESETS`); exactly one."""

    src: Path
    dst: Path
    to: str | None = None
    ops: str | None = None
    pipeline: Path | None = None
    preset: str | None = None
    copies: int = 1
    keep_original: bool = False
    seed: int = 0
    from_format: str | None = None
    quality: int | None = None
    image_format: str = "keep"
    max_pixels: int | None = None
    verify: str = "headers"
    min_box_visibility: float = 0.25
    shard_size: int = 10_000
    name: str = "data"
    layout: str = "imagenet"
    workers: int | None = None
    limit: int | None = None
    on_error: str = "skip"
    overwrite: bool = False
    device: str = "auto"
    gpu: int = 0
    batch_size: int = 256
    gpu_memory: str | None = None
    gpu_procs: int | None = None
    audio_format: str | None = None

    options = ConvertRequest.options

    def chain(self) -> tuple[Any, ...]:
        from .engine import spec

        given = [x for x in (self.ops, self.pipeline, self.preset) if x]
        if len(given) != 1:
            raise UsageError("augment needs exactly one of --preset, --ops or --pipeline")
        if self.preset:
            ops = spec.preset(self.preset)
        elif self.ops:
            ops = spec.parse_chain(self.ops)
        else:
            ops = spec.load_pipeline(self.pipeline)
        if any(op.kind == "normalize" for op in ops):
            raise UsageError("normalize makes tensors, and augment writes images: leave it out of the chain")
        return ops


@python_messages
def augment(
    src: str | Path | AugmentRequest,
    dst: str | Path | None = None,
    *,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
    on_device: Callable[[Device], None] | None = None,
    **options: Any,
) -> RunSummary:
    """Write ``copies`` augmented variants of every image of ``src`` to ``dst`` (keys ``<key>_aug<k>``).

    Parameters are drawn per output key from ``seed``, so a run is reproducible and any output can be
    regenerated; ``dst`` holds ``augment-params.jsonl`` with every record's drawn parameters, and the
    manifest the chain and the seed. Boxes and polygons move with the pixels.

    Args:
        src: source dataset, or an AugmentRequest.
        dst: destination (written only when complete).
        **options: any other :class:`AugmentRequest` field (``ops=``, ``preset=``, ``copies=``, ``to=``...).
    """
    from .engine.codecs.headers import DEFAULT_MAX_PIXELS
    from .engine.plan import Plan
    from .engine.spec import chain_spec

    if isinstance(src, AugmentRequest):
        req = src
    else:
        if dst is None:
            raise UsageError("augment needs a source and a destination")
        refuse_url(src, "source")
        refuse_url(dst, "destination")
        req = AugmentRequest(src=Path(src), dst=Path(dst), **options)
    refuse_url(req.src, "source")
    refuse_url(req.dst, "destination")
    src_path, dst_path = Path(req.src), Path(req.dst)
    ops = req.chain()  # refused before any data is read
    if req.copies < 1:
        raise UsageError(f"--copies must be >= 1, got {req.copies}")
    if not 0.0 <= req.min_box_visibility <= 1.0:
        raise UsageError(f"--min-box-visibility must be within [0, 1], got {req.min_box_visibility}")
    policy = ErrorPolicy(req.on_error) if req.on_error in ("skip", "fail") else None
    if policy is None:
        raise UsageError(f"unknown --on-error {req.on_error!r}; supported: skip, fail")
    require_source(src_path)
    to = req.to
    if to is None:
        from .formats import detect

        to = req.from_format or detect(src_path).name
    fmt = get_format(to)
    plan = Plan(ops=ops, image_format=req.image_format, quality=req.quality,
                max_pixels=DEFAULT_MAX_PIXELS if req.max_pixels is None else int(req.max_pixels),
                min_box_visibility=req.min_box_visibility, seed=req.seed, copies=req.copies,
                keep_original=req.keep_original, verify=req.verify, audio_format=req.audio_format or "keep")
    _check_output_options(req)
    check_output(source_root(src_path), dst_path, req.overwrite)
    device = resolve(req.device, req.gpu)
    if on_device:
        on_device(device)
    manifest = {"options": {**req.options(), "to": fmt.name},
                "augment": {"chain": chain_spec(ops), "seed": req.seed, "copies": req.copies,
                            "keep_original": req.keep_original, "min_box_visibility": req.min_box_visibility,
                            "params_file": PARAMS_FILE}}
    return _execute(req, src_path, dst_path, fmt, plan, device, policy, progress, manifest)


def _run(device: Device, reader: Reader, entries: list, writer: Writer, plan: Any, router: ErrorRouter,
         req: Any, tick: Callable[[int], None] | None) -> None:
    from .engine.executor import default_workers, run_host
    from .engine.media import DEVICE, has_codec

    workers = req.workers or default_workers()
    if device.is_gpu and plan.touches_pixels and has_codec(plan.media, DEVICE):
        from .engine.gpu_memory import watch
        from .engine.media import get_codec
        from .engine.settings import Settings

        opener = functools.partial(open_reader, Path(req.src), reader.format_name, _reader_options(req))  # each reader process's own
        with watch(device.index, router.stats):  # every process of the run, as the driver counts it
            get_codec(plan.media, "*", DEVICE).run(device, reader, opener, entries, writer, plan, router, req, workers,
                                                   tick, Settings.from_env())
    else:
        run_host(reader, entries, writer, plan, router, workers, tick)


@python_messages
def open_dataset(path: str | Path, fmt: str | None = None) -> Reader:
    """A reader over the dataset at ``path``: iterate it for :class:`~gpubatch.types.Record` values,
    ``len()`` it, ``.info()`` for classes. Use as a context manager to close its files."""
    refuse_url(path, "source")
    return open_reader(Path(path), fmt)


@python_messages
def info(path: str | Path, fmt: str | None = None, workers: int | None = None,
         progress: Callable[[int, int], Callable[[int], None]] | None = None):
    """Describe the dataset at ``path``: a :class:`~gpubatch.report.info.DatasetReport`."""
    from .report.info import describe

    refuse_url(path, "source")
    return describe(Path(path), fmt, workers, progress)
