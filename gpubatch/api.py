"""The public Python API, which the CLI calls too: :func:`convert`, :func:`info`, :func:`open_dataset`.

    >>> from gpubatch import convert
    >>> s = convert("data/train", "out/train-tfr", to="tfrecord", resize_shorter=256, quality=90)
    >>> s.records_out, s.skipped
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import _remote
from ._commit import SYNC_MODES
from ._paths import check_output, require_source, source_paths
from ._remote import is_remote, local_url, redact
from ._remote import local_path as source_path
from .engine.device import Device, DeviceKind, resolve_gpus
from .errors import ErrorPolicy, UsageError, python_messages
from .formats import get_format, open_reader
from .formats.base import Reader
from .runner import PARAMS_FILE, Run, finished


def _given(location: str | Path) -> str | Path:
    """A source as the caller named it: a URL kept as its text (a Path would fold its ``//``)."""
    location = local_url(location)
    return os.fspath(location) if is_remote(location) else Path(location)


def destination_path(location: str | Path, fmt: Any, req: Any) -> Path:
    """The local path a run's staging folder goes beside: for a store's URL (or a ``pipe:`` command), a
    folder of gpubatch's cache (:mod:`gpubatch._publish`), after the checks of what a store takes."""
    location = local_url(location)
    if not is_remote(location):
        return Path(location)
    from ._publish import check, destination

    dest = destination(os.fspath(location))
    check(dest, fmt, req)
    return dest.shadow()


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Who writes a run's shards, where (the fields :class:`ConvertRequest` and :class:`AugmentRequest`
    share past the device's; keyword-only, after each request's own)."""

    gpus: str | None = None  # "all" or "0,1,3": worker processes on each (None: the one of ``gpu``)
    executor: str = "local"  # "local" (this machine's processes) or "ray" (a Ray cluster's actors)
    ray_address: str | None = None  # the Ray cluster to join (None: RAY_ADDRESS, else a local one)
    num_parts: int | None = None  # with ``part``: run only part ``part`` of ``num_parts`` of the shards
    part: int | None = None
    finish: bool = False  # (gpubatch finish: the run's shards are all committed; only the dataset-wide files)
    sync: str = "shard"  # when written files are fsynced: "shard" (each, as committed), "end" (once), "off"


@dataclass(frozen=True)
class ConvertRequest(Placement):
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
    shard_size: int | None = None  # records a shard holds; None: auto (see engine.execute.shards)
    name: str = "data"
    layout: str = "imagenet"
    workers: int | None = None
    limit: int | None = None
    shuffle: bool = False
    seed: int = 0
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False
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
            if f.name == "finish" or v is None and f.name in _VIDEO_OPTIONS:
                continue
            out[f.name] = str(v) if isinstance(v, Path) else redact(v) if f.name in ("src", "dst") and isinstance(v, str) else v
        return out


_VIDEO_OPTIONS = frozenset({"frames", "clip_length", "clip_stride", "frame_step", "clip_positions", "clips_per_video",
                            "clip_format", "video_codec", "fps", "sample_rate", "mono", "duration", "pad",
                            "audio_format", "features", "path_column", "label_column"})


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
    first_frames: int = 0  # images of several frames (animated GIF/WebP/PNG, multi-page TIFF): their first written
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    skipped: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    gpu_memory: dict[str, Any] = field(default_factory=dict)
    library_messages: int = 0  # lines the decoders printed, held back by the command (--verbose lists them)
    shards: int = 0  # the shard tasks the run was cut into
    workers: int = 0  # the worker processes that wrote them
    per_gpu: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU ordinal -> shards, records, records/s
    usage: dict[str, Any] = field(default_factory=dict)  # the CPU's and the GPUs' busy fractions while it ran
    bound: str = ""  # the resource that bound the run ("CPU cores (93% busy)", "GPU 0 SMs (91% busy)", ...)

    @property
    def records_per_second(self) -> float:
        return self.records_in / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["records_per_second"] = round(self.records_per_second, 1)
        return d


def _check_output_options(req: Any) -> None:
    """Refuse, before anything runs and whatever the device, a ``--name`` that is no plain, visible file
    name prefix (shards are ``NAME-00000...``) and a malformed ``--gpu-memory``."""
    name = req.name
    if not name or name.startswith(".") or any(c in name for c in "/\\\0") or len(name) > 100:
        raise UsageError(f"--name {name!r}: give a file name prefix (not empty, no path separator, "
                         "no leading '.', at most 100 characters)")
    executor = getattr(req, "executor", "local")
    if executor not in ("local", "ray"):
        raise UsageError(f"unknown --executor {executor!r}; supported: local, ray")
    if getattr(req, "ray_address", None) and executor != "ray":
        raise UsageError("--ray-address is for --executor ray")
    if executor == "ray":  # (refused before anything is read or staged where the extra is missing)
        from .engine.execute.ray import import_ray

        import_ray()
    if executor == "ray" and getattr(req, "gpus", None):
        raise UsageError("--gpus is for the local executor: Ray places its actors on the cluster's GPUs "
                         "(--gpu-procs a GPU)")
    parts, part = getattr(req, "num_parts", None), getattr(req, "part", None)
    if (parts is None) != (part is None):
        raise UsageError("--num-parts and --part go together: --num-parts P --part I runs part I (0..P-1) of P")
    if parts is not None and not (parts >= 1 and 0 <= part < parts):
        raise UsageError(f"--part {part} of --num-parts {parts}: give 0 <= I < P")
    if getattr(req, "sync", "shard") not in SYNC_MODES:
        raise UsageError(f"unknown --sync {req.sync!r}; supported: {', '.join(SYNC_MODES)}")
    if req.gpu_memory is not None:
        from .engine.gpu.memory import parse_memory

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
        progress: ``progress(total)`` returns a callback advanced by one per output record (``total`` None where
            a video's frames or clips are sampled: how many each source gives is known once it is read).
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
        req = ConvertRequest(src=_given(src), dst=_given(dst), to=to, **options)
    if req.resume and not req.overwrite and (done := finished(req.dst, RunSummary, req.options())) is not None:
        return done
    from .engine.plan import make_plan

    fmt = get_format(req.to)
    dst_path = destination_path(req.dst, fmt, req)
    src_path = source_path(req.src)
    require_source(src_path)
    if req.shard_size is not None and req.shard_size < 1:
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
    check_output(source_paths(src_path), dst_path, req.overwrite or is_remote(req.dst))  # (a store's: its own checks)
    with _ahead(req, plan) as ahead:  # (a GPU image run's workers: their GPU's start beside the device's probe)
        if req.finish:
            device = _finishing_device(dst_path)
        elif plan.touches_pixels or req.device == "gpu":
            device = resolve_gpus(req.device, req.gpu, req.gpus)
        else:
            device = Device(DeviceKind.CPU, reason="no pixel option: encoded bytes pass through untouched")
        if on_device:
            on_device(device)
        run = Run("convert", req.options(), {"options": req.options()}, resume=req.resume, finish=req.finish)
        return _run(req, run, src_path, dst_path, fmt, plan, device, policy, progress, ahead)


@contextlib.contextmanager
def _ahead(req: Any, plan: Any) -> Iterator[Any]:
    """The worker processes :func:`~.engine.execute.early.prestart` starts for a GPU image run before its device
    is probed; those the run did not take (a failure before it, another device or media) end when it does."""
    from .engine.execute.early import prestart

    ahead = prestart(req, plan)
    try:
        yield ahead
    finally:
        if ahead is not None:
            ahead.close()  # (nothing once the run took them)


def _run(req: Any, run: Any, src_path: Path, dst_path: Path, fmt: Any, plan: Any, device: Device, policy: Any,
         progress: Callable[[int, int], Callable[[int], None]] | None, ahead: Any = None) -> RunSummary:
    from .runner import execute

    try:
        summary = execute(req, run, src_path, dst_path, fmt, plan, device, policy, progress,
                          lambda reader: _select(reader, req.limit, getattr(req, "shuffle", False), req.seed),
                          _starts_as, RunSummary, ahead)
    finally:
        if _remote.MIRRORS:  # (a remote source's shards fetched for the run: given back)
            _remote.release_all()
    if _remote.MIRRORS:  # (a remote source: its URLs, not its mirror's paths)
        summary = _remote.shown_in(summary)
        summary.src = redact(os.fspath(req.src))  # (as the caller named it: a pattern, a pipe: command)
    return summary


def audio_ops(sample_rate: int | None = None, mono: bool = False, duration: float | None = None,
              pad: str = "zero", features: str | None = None) -> tuple[Any, ...]:
    """The ops of ``convert``'s audio options: mono, resample, fix the duration, then features."""
    ops: list[Any] = []
    if not (mono or sample_rate or duration or pad != "zero" or features):  # (no op module imported, nor NumPy)
        return ()
    from .engine.ops import OPS
    from .engine.ops.audio import FixDuration, Mono, Resample
    from .engine.ops.spectral import FeatureOp
    from .engine.spec import parse_chain

    if mono:
        ops.append(Mono())
    if sample_rate:
        ops.append(Resample(int(sample_rate)))
    if duration:
        ops.append(FixDuration(float(duration), pad))
    elif pad != "zero":
        raise UsageError("--pad needs --duration")
    if features:
        text = features.replace("log-mel", "log_mel")
        names = sorted(n for n, cls in OPS.items() if issubclass(cls, FeatureOp))  # (log-mel is log_mel in a chain)
        try:
            feats = parse_chain(text)
        except UsageError as e:
            if text.split("(", 1)[0].strip() in names:  # (a feature op's own parameters: the parser's word on them)
                raise UsageError(f"--features: {str(e).replace('log_mel', 'log-mel')}") from None
            feats = ()
        if len(feats) != 1 or not isinstance(feats[0], FeatureOp):
            shown = ", ".join(n.replace("_", "-") for n in names)
            raise UsageError(f"--features takes one of {shown} (e.g. \"log-mel(n_mels=80)\"), got {features!r}")
        ops.extend(feats)
    return tuple(ops)


@dataclass(frozen=True)
class AugmentRequest(Placement):
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
    shard_size: int | None = None
    name: str = "data"
    layout: str = "imagenet"
    workers: int | None = None
    limit: int | None = None
    on_error: str = "skip"
    overwrite: bool = False
    resume: bool = False
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
        req = AugmentRequest(src=_given(src), dst=_given(dst), **options)
    if req.resume and not req.overwrite and (done := finished(req.dst, RunSummary, req.options())) is not None:
        return done
    ops = req.chain()  # refused before any data is read
    if req.copies < 1:
        raise UsageError(f"--copies must be >= 1, got {req.copies}")
    if not 0.0 <= req.min_box_visibility <= 1.0:
        raise UsageError(f"--min-box-visibility must be within [0, 1], got {req.min_box_visibility}")
    policy = ErrorPolicy(req.on_error) if req.on_error in ("skip", "fail") else None
    if policy is None:
        raise UsageError(f"unknown --on-error {req.on_error!r}; supported: skip, fail")
    src_path = source_path(req.src)
    require_source(src_path)
    to = req.to
    if to is None:
        from .formats import detect

        to = req.from_format or detect(src_path).name
    fmt = get_format(to)
    dst_path = destination_path(req.dst, fmt, req)
    plan = Plan(ops=ops, image_format=req.image_format, quality=req.quality,
                max_pixels=DEFAULT_MAX_PIXELS if req.max_pixels is None else int(req.max_pixels),
                min_box_visibility=req.min_box_visibility, seed=req.seed, copies=req.copies,
                keep_original=req.keep_original, verify=req.verify, audio_format=req.audio_format or "keep")
    _check_output_options(req)
    check_output(source_paths(src_path), dst_path, req.overwrite or is_remote(req.dst))  # (a store's: its own checks)
    with _ahead(req, plan) as ahead:  # (as convert's)
        device = _finishing_device(dst_path) if req.finish else resolve_gpus(req.device, req.gpu, req.gpus)
        if on_device:
            on_device(device)
        manifest = {"options": {**req.options(), "to": fmt.name},
                    "augment": {"chain": chain_spec(ops), "seed": req.seed, "copies": req.copies,
                                "keep_original": req.keep_original, "min_box_visibility": req.min_box_visibility,
                                "params_file": PARAMS_FILE}}
        run = Run("augment", {**req.options(), "to": fmt.name}, manifest, resume=req.resume, finish=req.finish)
        return _run(req, run, src_path, dst_path, fmt, plan, device, policy, progress, ahead)


def _finishing_device(dst: Path) -> Device:
    """The device ``gpubatch finish`` names: the one the parts ran on, as their journal says (finish itself
    decodes nothing; it may run where there is no GPU)."""
    from ._paths import staging_folder
    from .engine.execute.journal import Journal

    about = Journal(staging_folder(dst)).run()
    kind = DeviceKind.GPU if about.get("device_kind") == "gpu" else DeviceKind.CPU
    return Device(kind, name=str(about.get("device_name", "cpu")), reason="gpubatch finish: the device the parts ran on")


@python_messages
def finish(dst: str | Path, *, overwrite: bool = False,
           progress: Callable[[int, int], Callable[[int], None]] | None = None) -> RunSummary:
    """Make the dataset at ``dst`` from the shards a run's parts committed (``--num-parts P --part I`` on
    several processes or machines), or an interrupted run left: checks that every shard is committed
    (refused otherwise, naming the parts or shards missing), writes the dataset-wide files and renames
    the whole into place. The run's command and options come from its journal."""
    from ._paths import staging_folder
    from .engine.execute.journal import Journal

    if is_remote(dst):
        raise UsageError(f"gpubatch finish makes a dataset from the shards parts wrote into a local staging folder; a "
                         f"run to {redact(os.fspath(dst))} finishes when its command runs again with --resume")
    dst = Path(dst)
    stage = staging_folder(dst)
    journal = Journal(stage)
    if not journal.exists():
        done = finished(dst, RunSummary)
        if done is not None:
            return done
        raise UsageError(f"{dst}: no run to finish ({stage.name} is not there: run the command with --num-parts "
                         "P --part I first)")
    about = journal.run()
    command, request = about.get("command"), about.get("request")
    if command not in ("convert", "augment") or not isinstance(request, dict):
        raise UsageError(f"{stage} was started by a gpubatch that does not record its command: finish it by running "
                         "that command again with --resume")
    cls = ConvertRequest if command == "convert" else AugmentRequest
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in request.items() if k in names}
    for k in ("src", "dst", "pipeline"):
        if kw.get(k) is not None:
            kw[k] = _given(kw[k])
    if kw.get("resize") is not None:
        kw["resize"] = tuple(kw["resize"])
    kw.update(dst=dst, resume=True, overwrite=overwrite, num_parts=None, part=None, executor="local",
              ray_address=None, finish=True)
    req = cls(**kw)
    return convert(req, progress=progress) if command == "convert" else augment(req, progress=progress)


@python_messages
def open_dataset(path: str | Path, fmt: str | None = None) -> Reader:
    """A reader over the dataset at ``path``: iterate it for :class:`~gpubatch.types.Record` values,
    ``len()`` it, ``.info()`` for classes. Use as a context manager to close its files."""
    return open_reader(source_path(path), fmt)


@python_messages
def info(path: str | Path, fmt: str | None = None, workers: int | None = None,
         progress: Callable[[int, int], Callable[[int], None]] | None = None):
    """Describe the dataset at ``path``: a :class:`~gpubatch.report.info.DatasetReport`."""
    from .report.info import describe

    try:
        report = describe(source_path(path), fmt, workers, progress)
    finally:
        if _remote.MIRRORS:
            _remote.release_all()
    if _remote.MIRRORS:  # (a remote source: its URLs, not its mirror's paths)
        report = _remote.shown_in(report)
    return report


def verify(path: str | Path, workers: int | None = None, records: bool = True,
           progress: Callable[[int], Callable[[int], None]] | None = None):
    """Check the dataset gpubatch wrote at ``path`` (a folder or a store URL) against its ``gpubatch.json``: every
    file its run listed read again, its size and CRC-32C compared with those written, and (``records``) its records
    read and counted: a :class:`~gpubatch.report.verify.VerifyReport`, whose ``ok`` says whether all is as written
    and ``problem()`` what differs. ``gpubatch info PATH --verify`` on the command line."""
    from .report.verify import verify as check

    found = info(path, workers=workers).records if records else None
    return check(path, records_found=found, workers=workers, progress=progress)
