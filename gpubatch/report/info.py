"""``gpubatch info``: what a dataset holds, from record headers (no pixel is decoded)."""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RecordError
from ..types import ClassNames, Media


@dataclass
class DatasetReport:
    """Facts about one dataset.

    Attributes:
        path, format: where and what.
        records: readable records; ``unreadable`` lists the others with reasons.
        classes: class names (empty where labels run far beyond the classes named: see ``class_count``);
            ``class_counts`` maps each class in use to its record count (plus "(unlabeled)").
        class_count: how many classes the labels span.
        width, height: min / median / mean / max over records, in pixels (EXIF orientation applied).
        codecs, subsampling, modes: counts per JPEG/PNG..., per chroma subsampling, per pixel mode.
        boxes: total detection boxes; categories: detection categories; ``category_counts`` maps each
            category with boxes (its name where the dataset names it, else its id) to its boxes and the
            images holding one.
        payload_bytes: sum of encoded record sizes; disk_bytes: size of the dataset's files.
        warnings: faults the reader found in the source that it worked around (COCO annotations...).
        members: per extension, how many records hold that WebDataset member besides their image and
            class (``txt`` captions, ``json`` fields of another tool, masks...), which gpubatch keeps.
        extensions: a WebDataset's member extensions (``jpg``, ``cls``, ``json``...), per extension how
            many samples hold one: the names a webdataset pipeline asks for.
        left_out: files of the source that are no records (video, audio, other files among a folder's
            images; ``unlisted``: media files beside a list, manifest or annotation file found in the folder
            that it does not name, YOLO's label files without their image; ``hidden``: hidden folders and hidden
            files of the records' kind, as macOS's ``._photo.jpg``), per kind how many, with some of their names.
        video: for video records: codecs with profiles, containers, resolutions, fps and duration
            (min / median / mean / max), total hours, frame counts, bit rates, audio tracks, rotated and
            variable-frame-rate files, and how many this machine's NVDEC decodes (None: no GPU here).
        audio: for audio records: codecs and sample codings, sample rates, channels, bit depths, durations
            (min / median / mean / max), total hours, and how many carry a transcript; for arrays of
            features (``features``), their kinds, shapes and dtypes.
    """

    path: str
    format: str
    records: int = 0
    classes: list[str] = field(default_factory=list)
    class_count: int = 0
    class_counts: dict[str, int] = field(default_factory=dict)
    width: dict[str, float] = field(default_factory=dict)
    height: dict[str, float] = field(default_factory=dict)
    codecs: dict[str, int] = field(default_factory=dict)
    subsampling: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    boxes: int = 0
    images_with_boxes: int = 0
    categories: list[dict] = field(default_factory=list)
    category_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    payload_bytes: int = 0
    disk_bytes: int = 0
    unreadable: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    members: dict[str, int] = field(default_factory=dict)
    extensions: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, Any] = field(default_factory=dict)
    video: dict[str, Any] = field(default_factory=dict)
    audio: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values)
    return {"min": int(a.min()), "median": float(np.median(a)), "mean": round(float(a.mean()), 1),
            "max": int(a.max())}


def _disk_bytes(path: Path, reader: Any = None, entries: list | None = None) -> int:
    """The size of the dataset's files: those a source pattern matches, the source file, or a folder's files;
    for a list given as the source (a CSV, a manifest), the list and each file it names that is there."""
    from .._paths import source_files
    from ..formats.base import Damaged

    listing = reader.list_given() if reader is not None else None
    if listing is not None:
        named = {reader.where(e)[1] for e in entries or () if not isinstance(e, Damaged)}
        return listing.stat().st_size + sum(os.stat(f).st_size for f in named if os.path.isfile(f))
    matched = source_files(path)
    if matched is not None:
        return sum(p.stat().st_size for p in matched)
    if path.is_file():
        return path.stat().st_size
    total, stack = 0, [str(path)]
    while stack:  # (os.scandir: no Path object and no second stat a file)
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    return total


def _fetch(reader: Any, entry: Any, peek: bool = True) -> tuple:
    """What ``info`` reads of one record (its file's I/O, no parsing): ``(record, bytes)``; or, where
    ``peek`` and the reader has one, what its ``peek`` gives of an image file, ``(its first HEAD_BYTES
    bytes, its size, the record's label)``; or the record's RecordError."""
    peek = getattr(reader, "peek", None) if peek else None
    peeked = peek(entry, HEAD_BYTES) if peek is not None else None
    if peeked is not None:  # an image file's (first bytes, size, label)
        return peeked
    try:
        rec = reader.read(entry)
    except RecordError as e:
        return (e,)
    return rec, len(rec.data)


def _described(reader: Any, entry: Any, fetched: tuple) -> tuple:
    """What ``info`` keeps of one record, from what :func:`_fetch` read of it, light enough to send between
    processes: (header or RecordError, label, payload bytes, media, each box's category id, members, has text,
    features)."""
    from ..engine.codecs.headers import probe
    from ..formats.base import JSON_FIELDS, MEMBERS

    if len(fetched) == 1:
        return (fetched[0], None, 0, None, (), (), False, None)
    if len(fetched) == 3:  # an image file's first bytes: its header, unless it lies further in
        head, size, label = fetched
        try:
            return (probe(head), label, size, Media.IMAGE, (), (), False, None)
        except ValueError:
            more = reader.peek(entry, HEAD_MORE) if len(head) < min(size, HEAD_MORE) else None
            if more is not None:  # (past a long EXIF or ICC block: the file's first 64 KiB)
                return _described(reader, entry, more)
            # (read whole: the reader's own checks, and the probe's error on every byte)
            return _described(reader, entry, _fetch(reader, entry, peek=False))
    rec, size = fetched
    try:
        if rec.media is Media.VIDEO:
            from ..engine.codecs.video_probe import probe as probe_video

            hdr: Any = probe_video(rec.data)
            if hdr.cut_short:  # a file cut short after its index, or inside it: damaged, not a shorter video
                raise ValueError(hdr.cut_short)
        elif rec.media is Media.AUDIO:
            from ..engine.codecs.audio_io import npy_header, probe_audio

            hdr = npy_header(rec.data) if rec.codec == "npy" else probe_audio(rec.data)
        else:
            hdr = probe(rec.data)
    except ValueError as e:
        hdr = RecordError(rec.key, rec.origin, "decode", str(e))
    members = tuple(rec.meta.get(MEMBERS) or ()) + ((JSON_FIELDS,) if JSON_FIELDS in rec.meta else ())
    boxes = tuple(int(c) for c in rec.boxes.labels) if rec.boxes is not None else ()  # (each box's category)
    return (hdr, rec.label, size, rec.media, boxes, members, bool(rec.meta.get("text")), rec.meta.get("features"))


def _summary(reader: Any, entry: Any) -> tuple:
    return _described(reader, entry, _fetch(reader, entry))


_READER: Any = None


def _open_in_worker(path: str, fmt: str | None, listed: bool) -> None:
    global _READER
    from ..formats import open_reader

    _READER = open_reader(Path(path), fmt)
    if listed:
        _READER.entries()


def _summaries(chunk: list) -> list[tuple]:
    return [_summary(_READER, e) for e in chunk]


#: ``info`` reads the rest of a dataset in a process a core (on 4 cores or more) where its first records say that
#: reading every record in this process would take longer than this many seconds: about what a pool's start costs
#: (16 processes, each importing gpubatch and opening the reader). The whole command on an H200 host of 16 cores
#: (2026-12-03, benchmarks/info_paths.py): 16,384 JPEGs 0.99 s in one process against 1.54 s in 16; 65,536 of
#: them 2.80 s against 2.26 (benchmarks/RESULTS.md)
PROCESSES_FROM_S = 1.0
#: reads of a record's first bytes that wait less than this (their time less the thread's CPU time in them) come
#: from the page cache: this thread reads them itself. On a warm cache, reader threads beside it were slower than
#: none (16,384 JPEGs on the 2-core CI machine, 2026-12-03: 0.61 s with this thread alone, 0.92-0.95 s with 4 or 8
#: readers), each handing the GIL to the others at every read; with the files just evicted, 4 readers were 23%
#: faster than none (4,096 JPEGs: 0.34 s against 0.44). ``benchmarks/info_paths.py SRC --readers 1,4,8 [--cold]``.
#: The reads' whole time against 40 us had decided it until 2026-12-04: a webdataset's whole members from the page
#: cache take 25-40 us of Python and copying, and a few microseconds more sent a warm read to the threads (1.6-1.7 s
#: against 1.1 s for 16,384 records, the 2-core CI machine)
CACHED_WAIT_S = 20e-6
#: what ``info`` reads of an image file first: its header is there, unless a long EXIF or ICC block comes
#: first (16,384 ImageNet-like JPEGs on the 2-core CI machine, the whole command: 1.66 s with 64 KiB read
#: first, 1.20 s with 4 KiB; benchmarks/RESULTS.md, 2026-12-02); then the first :data:`HEAD_MORE` bytes, and
#: where its header is not there either, the file
HEAD_BYTES = 1 << 12
HEAD_MORE = 1 << 16
#: records read at a time: the first chunk, timed, decides how the rest are read; a thread's task after it
CHUNK = 32


def _summarized(path: Path, fmt: str | None, reader: Any, entries: list, workers: int) -> Any:
    """Every entry's :func:`_summary`, in order. The first :data:`CHUNK` records are read and parsed here,
    timed; they decide the rest: a process a core where this process alone would take longer than
    :data:`PROCESSES_FROM_S` (the per-record Python holds the GIL), else this thread, with reader threads
    beside it where the reads wait on the disk (more than :data:`CACHED_WAIT_S` a record)."""
    from ..engine.executor import ordered_map

    first, rest = entries[:CHUNK], entries[CHUNK:]
    reads, costs, described = [], [], []
    for e in first:  # (each record timed: the median leaves out the first one's imports)
        t0, c0 = time.perf_counter(), time.thread_time()
        f = _fetch(reader, e)
        t1 = time.perf_counter()
        reads.append(t1 - t0 - (time.thread_time() - c0))  # (the read's wait: its time less this thread's CPU)
        described.append(_described(reader, e, f))
        costs.append(time.perf_counter() - t0)
    yield from described
    if not rest:
        return
    if workers >= 4 and statistics.median(costs) * len(rest) > PROCESSES_FROM_S:
        yield from _in_processes(path, fmt, reader, rest, workers)
        return
    chunks = [rest[i : i + CHUNK] for i in range(0, len(rest), CHUNK)]
    # threads read the files where their waits on the disk overlap; this one parses what they read (the
    # parsing holds the GIL, and threads that parsed too slowed each other)
    threads = 1 if statistics.median(reads) < CACHED_WAIT_S else min(8, 2 * workers)
    fetches = ordered_map(lambda chunk: [_fetch(reader, e) for e in chunk], chunks, threads, window=2 * threads)
    for chunk, fetched in zip(chunks, fetches):
        for e, f in zip(chunk, fetched):
            yield _described(reader, e, f)


def _in_processes(path: Path, fmt: str | None, reader: Any, entries: list, workers: int) -> Any:
    """:func:`_summary` of ``entries``, in order, by a pool of processes that open the dataset themselves."""
    from ..engine.processes import started_pool

    size = max(256, -(-len(entries) // (workers * 4)))
    chunks = [entries[i : i + size] for i in range(0, len(entries), size)]
    listed = not getattr(reader, "reads_without_scan", True)
    pool = started_pool(min(workers, len(chunks)), initializer=_open_in_worker,
                        initargs=(str(path), reader.format_name if fmt is None else fmt, listed))
    try:
        for part in pool.map(_summaries, chunks):
            yield from part
    finally:
        pool.shutdown(cancel_futures=True)


def describe(path: Path, fmt: str | None = None, workers: int | None = None,
             progress: Callable[[int], Callable[[int], None]] | None = None) -> DatasetReport:
    """Read every record's header (not its pixels) and summarize the dataset."""
    from ..engine.processes import default_workers
    from ..formats import open_reader

    with open_reader(path, fmt) as reader:
        info = reader.info()
        entries = reader.entries()
        table = info.classes
        report = DatasetReport(path=str(path), format=reader.format_name, class_count=len(table),
                               classes=[] if isinstance(table, ClassNames) else list(table),
                               categories=[dict(c) for c in info.categories], warnings=list(reader.warnings))
        tick = progress(len(entries)) if progress else None

        widths, heights = [], []
        labels: Counter = Counter()
        codecs: Counter = Counter()
        subs: Counter = Counter()
        modes: Counter = Counter()
        members: Counter = Counter()
        videos: list = []
        sounds: list = []
        arrays: Counter = Counter()
        box_counts: Counter = Counter()  # (boxes by category id)
        box_images: Counter = Counter()  # (images with a box of the category)
        texts = 0
        summaries = _summarized(Path(path), fmt, reader, entries, workers or default_workers())
        for hdr, label, nbytes, media, boxes, members_, text, features in summaries:
            if tick:
                tick(1)
            if isinstance(hdr, RecordError):
                report.unreadable.append(hdr.as_dict())
                continue
            report.records += 1
            report.payload_bytes += nbytes
            labels[label] += 1
            if media is Media.AUDIO and isinstance(hdr, tuple):  # features: (shape, dtype)
                arrays[f"{features or 'array'} {'x'.join(map(str, hdr[0]))} {hdr[1]}"] += 1
                codecs["npy"] += 1
                continue
            if media is Media.AUDIO:
                sounds.append(hdr)
                codecs[hdr.codec] += 1
                texts += text
                members.update(list(members_))
                continue
            if media is Media.VIDEO:
                videos.append(hdr)
                widths.append(hdr.width)
                heights.append(hdr.height)
                codecs[hdr.codec] += 1
                continue
            widths.append(hdr.width)
            heights.append(hdr.height)
            codecs[hdr.codec] += 1
            modes[hdr.mode] += 1
            if hdr.subsampling:
                subs[hdr.subsampling] += 1
            if boxes:
                report.boxes += len(boxes)
                report.images_with_boxes += 1
                box_counts.update(boxes)
                box_images.update(set(boxes))
            members.update(list(members_))
    for label, n in sorted(labels.items(), key=lambda kv: (kv[0] is None, kv[0] if kv[0] is not None else 0)):
        name = "(unlabeled)" if label is None else (table[label] if label < len(table) else str(label))
        report.class_counts[name] = n
    names = {c.get("id"): str(c.get("name", c.get("id"))) for c in report.categories}
    shared = {n for n, k in Counter(names.values()).items() if k > 1}  # (a name two ids bear: with its id)
    report.category_counts = {(f"{names[c]} ({c})" if names.get(c) in shared else names.get(c, str(c))):
                              {"boxes": n, "images": box_images[c]} for c, n in sorted(box_counts.items())}
    report.width, report.height = _stats(widths), _stats(heights)
    report.codecs, report.subsampling, report.modes = dict(codecs), dict(subs), dict(modes)
    report.members = dict(sorted(members.items()))
    if hasattr(reader, "member_extensions"):
        report.extensions = reader.member_extensions()
        from ..formats.webdataset import read_hint

        hint = read_hint(report.extensions)
        if hint:
            report.warnings.append(hint)
    report.left_out = dict(getattr(reader, "left_out", None) or {})
    if videos:
        report.video = video_facts(videos)
        damaged = [v.skipped for v in videos if getattr(v, "skipped", 0)]
        if damaged:  # (frames the files no longer hold where they should: convert names each video)
            n = sum(damaged)
            report.warnings.append(f"{len(damaged):,} video{'s' * (len(damaged) != 1)} lost {n:,} frame{'s' * (n != 1)} "
                                   "to damage (timestamps that skip them or are missing); convert names each")
        jumps = sum(1 for v in videos if getattr(v, "jump", 0))
        if jumps:  # (timestamps moved by damage, or a splice: how many frames went is not known)
            whose = "videos'" if jumps != 1 else "video's"
            report.warnings.append(f"{jumps:,} {whose} timestamps jump off a steady rate (damage "
                                   "or a splice: frames may be lost there); convert names each")
    if sounds:
        report.audio = audio_facts(sounds, texts)
    if arrays:
        report.audio["features"] = dict(arrays.most_common(10))
    report.disk_bytes = _disk_bytes(Path(path), reader, entries)
    return report


def _fstats(values: list[float], digits: int = 2) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, np.float64)
    return {"min": round(float(a.min()), digits), "median": round(float(np.median(a)), digits),
            "mean": round(float(a.mean()), digits), "max": round(float(a.max()), digits)}


def video_facts(videos: list) -> dict[str, Any]:
    """The video section of a report, from the :class:`~gpubatch.engine.codecs.video_probe.VideoInfo` of
    each video."""
    from ..engine.gpu.nvdec_loop import nvdec_takes
    from ..engine.settings import Settings

    decodable = nvdec_takes(videos, 0, Settings.from_env().video_loop)  # (what the GPU path sends to NVDEC)
    return {
        "codecs": dict(Counter(f"{v.codec} {v.profile}" if v.profile else v.codec for v in videos).most_common()),
        "containers": dict(Counter(v.container for v in videos).most_common()),
        "resolutions": dict(Counter(f"{v.width}x{v.height}" for v in videos).most_common(10)),
        "bit_depths": dict(Counter(v.bit_depth for v in videos).most_common()),
        "fps": _fstats([v.fps for v in videos]),
        "duration_s": _fstats([v.duration for v in videos]),
        "total_hours": round(sum(v.duration for v in videos) / 3600.0, 4),
        "total_s": round(sum(v.duration for v in videos), 2),
        "frames": _fstats([v.frames for v in videos], 0),
        "total_frames": int(sum(v.frames for v in videos)),
        "bit_rate_kbps": _fstats([v.bit_rate / 1000.0 for v in videos], 1),
        "with_audio": sum(1 for v in videos if v.audio_tracks),
        "rotated": sum(1 for v in videos if v.rotation),
        "variable_frame_rate": sum(1 for v in videos if v.vfr),
        "nvdec_decodable": decodable,
    }


def audio_facts(sounds: list, with_text: int = 0) -> dict[str, Any]:
    """The audio section of a report, from the :class:`~gpubatch.engine.codecs.audio_io.AudioInfo` of each file."""
    return {
        "codings": dict(Counter(f"{a.codec} {a.subtype}" for a in sounds).most_common()),
        "sample_rates": dict(Counter(a.rate for a in sounds).most_common()),
        "channels": dict(Counter(a.channels for a in sounds).most_common()),
        "bit_depths": dict(Counter(a.bits for a in sounds if a.bits).most_common()),
        "duration_s": _fstats([a.duration for a in sounds], 3),
        "total_hours": round(sum(a.duration for a in sounds) / 3600.0, 4),
        "total_s": round(sum(a.duration for a in sounds), 2),
        "with_transcript": with_text,
    }


def span(seconds: float) -> str:
    """A length of time as a person reads it: seconds under a minute, minutes under an hour, else hours."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:,.1f} h" if seconds >= 36000 else f"{seconds / 3600:.3g} h"


def _duration(facts: dict[str, Any]) -> str:
    """The duration row of a video or audio section: the whole, then the files' range and mean."""
    d = facts["duration_s"]
    return f"{span(facts['total_s'])} in all; {d['min']:g}..{d['max']:g} s a file (mean {d['mean']:g})"


def _counts(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]], most: int = 50) -> Any:
    """A table of names and their counts (the first ``most`` rows, then how many more)."""
    from rich.table import Table

    from .console import esc

    t = Table(title=title, title_justify="left")
    for k, name in enumerate(columns):
        t.add_column(name, justify="right" if k else "left")
    for name, *counts in rows[:most]:
        t.add_row(esc(str(name)), *(f"{n:,}" for n in counts))
    if len(rows) > most:
        t.add_row(f"... {len(rows) - most} more", *[""] * (len(columns) - 1))
    return t


def render(report: DatasetReport) -> None:
    """Print the report as rich tables on the stderr console."""
    from .console import console, esc, titled
    from .summary import human_bytes

    con = console()
    t = titled(f"{esc(report.path)}  [dim]({report.format})[/]", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("records", f"{report.records:,}")
    if report.unreadable:
        t.add_row("unreadable", f"[red]{len(report.unreadable):,}[/]")
    if report.class_count or not report.category_counts:
        t.add_row("classes", f"{report.class_count:,}")
    else:  # (a detection set: its images have no class, its boxes have categories)
        t.add_row("classes", "none at the image level (its boxes' categories below)")
    if report.width:
        w, h = report.width, report.height
        t.add_row("width", f"{w['min']}..{w['max']} (median {w['median']:g}, mean {w['mean']:g})")
        t.add_row("height", f"{h['min']}..{h['max']} (median {h['median']:g}, mean {h['mean']:g})")
    t.add_row("codecs", esc(", ".join(f"{k} {v:,}" for k, v in sorted(report.codecs.items()))))
    v = report.video
    if v:
        t.add_row("profiles", esc(", ".join(f"{k} {n:,}" for k, n in v["codecs"].items())))
        t.add_row("containers", esc(", ".join(f"{k} {n:,}" for k, n in v["containers"].items())))
        t.add_row("resolutions", ", ".join(f"{k} {n:,}" for k, n in v["resolutions"].items()))
        t.add_row("fps", f"{v['fps']['min']:g}..{v['fps']['max']:g} (median {v['fps']['median']:g})")
        t.add_row("duration", _duration(v))
        t.add_row("frames", f"{v['total_frames']:,} ({v['frames']['min']:g}..{v['frames']['max']:g} a video)")
        t.add_row("bit rate", f"{v['bit_rate_kbps']['median']:g} kb/s median")
        t.add_row("audio, rotated, VFR", f"{v['with_audio']:,}, {v['rotated']:,}, {v['variable_frame_rate']:,}")
        nv = v["nvdec_decodable"]
        t.add_row("NVDEC here", "no GPU here" if nv is None else f"{nv:,} of {report.records:,} decodable")
    a = report.audio
    if a.get("features"):
        t.add_row("features", esc(", ".join(f"{k} ({n:,})" for k, n in a["features"].items())))
    if a.get("codings"):
        t.add_row("codings", esc(", ".join(f"{k} {n:,}" for k, n in a["codings"].items())))
        t.add_row("sample rates", ", ".join(f"{k:,} Hz {n:,}" for k, n in a["sample_rates"].items()))
        t.add_row("channels", ", ".join(f"{k} ch {n:,}" for k, n in a["channels"].items()))
        if a["bit_depths"]:
            t.add_row("bit depths", ", ".join(f"{k} bit {n:,}" for k, n in a["bit_depths"].items()))
        t.add_row("duration", _duration(a))
        if a["with_transcript"]:
            t.add_row("transcripts", f"{a['with_transcript']:,}")
    if report.subsampling:
        t.add_row("JPEG subsampling", ", ".join(f"{k} {v:,}" for k, v in sorted(report.subsampling.items())))
    if report.modes:
        t.add_row("pixel modes", ", ".join(f"{k} {v:,}" for k, v in sorted(report.modes.items())))
    if report.boxes or report.categories:
        t.add_row("boxes", f"{report.boxes:,} on {report.images_with_boxes:,} images, "
                           f"{len(report.categories)} categories")
    if report.extensions:
        t.add_row("member extensions", esc(", ".join(f"{k} {v:,}" for k, v in report.extensions.items())))
    if report.members:
        t.add_row("other members", esc(", ".join(f"{k} {v:,}" for k, v in report.members.items())))
    t.add_row("payload", human_bytes(report.payload_bytes))
    t.add_row("on disk", human_bytes(report.disk_bytes))
    con.print(t)
    if report.category_counts:
        con.print(_counts("boxes per category", ("category", "boxes", "images"),
                          [(name, n["boxes"], n["images"]) for name, n in report.category_counts.items()]))
    if report.class_counts and not (report.category_counts and list(report.class_counts) == ["(unlabeled)"]):
        con.print(_counts("records per class", ("class", "records"), list(report.class_counts.items())))
    for e in report.unreadable[:10]:
        con.print(f"[red]unreadable[/] {esc(e['origin'] or e['key'])}: {esc(e['reason'])}")
    for w in report.warnings:
        con.print(f"[yellow]warning:[/] {esc(w)}")
