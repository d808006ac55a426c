"""The one record flow of ``convert`` and ``augment``: read -> outputs -> (pass through | transform).

Every work unit (:mod:`.execute.units`, and the GPU's) reads each entry with :func:`read_counted`, asks
:func:`outputs_of` what the record becomes (records that pass through untouched, checked; :class:`Job`
values for the outputs that go through the chain; errors), draws each job's parameters with
:meth:`Job.settle` (the one place a run draws) and writes the results, in dataset order, into its shard
(:class:`~.execute.worker.ShardWriting`). Units differ only in the stage that turns jobs into encoded
outputs: host codecs and kernels, or the GPU engine.

Nothing here names a media: a record's codec (:func:`~.media.get_codec`) checks, decodes and encodes it.
The flow reads through any object with ``read(entry)`` and writes through any with ``write(record)``
(:class:`RecordSource`, :class:`RecordSink`): the engine does not import the formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import RecordError, RunStats, Stage
from ..types import Boxes, Media, Record
from .codecs.headers import frames_held
from .media import HOST, LOST, get_codec
from .plan import Plan


class RecordSource(Protocol):
    """What a run reads from (a format's Reader): one record per entry, RecordError where it is bad."""

    def read(self, entry: Any, into: Any = None) -> Record: ...


class RecordSink(Protocol):
    """What a run writes to (a format's Writer): ValueError where a record does not fit the format."""

    def write(self, record: Record) -> None: ...


@dataclass
class Job:
    """One output that goes through the chain, made from a source record once it is decoded.

    Attributes:
        source: the source's index in its batch (where a batch decodes several sources together).
        template: the output record without its data (key, label, metadata; boxes as read).
        size: the decoded size the parameters below were drawn for (a header's, before decoding), or None.
        params, boxes, dropped: the op parameters drawn for ``size``, the boxes moved through the chain
            with them and how many boxes left the image.
    """

    source: int
    template: Record
    size: tuple[int, int] | None = None
    params: list | None = None
    boxes: Boxes | None = None
    dropped: int = 0

    def settle(self, plan: Plan, h: int, w: int) -> tuple[list, Boxes | None, int]:
        """The parameters, moved boxes and dropped count for the source decoded to (h, w): those drawn
        for its header's size where that was right, else drawn now. Every draw of a run is made here
        (the CPU after its decode, the GPU's feed for the header's size and its worker after decode).

        Raises:
            ValueError: an op would make the image larger than ``--max-pixels`` (ImageTooLarge), or the
                record's boxes are not what the ops take.
        """
        if self.size != (h, w) or self.params is None:
            self.params, self.boxes, self.dropped = plan.draw_and_move(self.template.key, h, w, self.template.boxes)
            self.size = (h, w)
        return self.params, self.boxes, self.dropped


def read_counted(reader: RecordSource, entry: Any, stats: RunStats) -> Record | RecordError:
    """Read one entry, counting it in ``stats``; a bad entry comes back as its RecordError."""
    try:
        record = reader.read(entry)
    except RecordError as e:
        return e
    stats.add(records_in=1, bytes_in=len(record.data))
    return record


def read_row(reader: RecordSource, entry: Any, into: Any = None) -> Record | dict[str, str]:
    """The record of ``entry``, or, where it cannot be read, its (key, origin, reason): a training batch's
    read, where a record that cannot be read is left out (its label with it) and named. ``into``: where a
    reader that can puts an image's bytes (:meth:`~gpubatch.formats.base.Reader.read`)."""
    try:
        return reader.read(entry, into=into) if into is not None else reader.read(entry)
    except RecordError as e:
        return {"key": e.key, "origin": e.origin, "reason": f"read: {e.reason}"}


def read_rows(reader: RecordSource, entries: Any) -> tuple[list[Record], list[dict[str, str]]]:
    """The records of ``entries`` that read, and each other one's (key, origin, reason) (:func:`read_row`)."""
    records, failed = [], []
    for entry in entries:
        got = read_row(reader, entry)
        (records if isinstance(got, Record) else failed).append(got)
    return records, failed


def outputs_of(record: Record, plan: Plan, stats: RunStats, source: int = 0,
               size: tuple[int, int] | None = None) -> list[Record | RecordError | Job]:
    """What ``record`` becomes under ``plan``, in output order: records that pass through untouched
    (checked by the record's codec: a bad one is its error), and a :class:`Job` for each output that
    goes through the chain. With ``size`` (the decoded size its header gives) each job's parameters
    are drawn for it now; an output an op would make too large is then its error at once."""
    out: list[Record | RecordError | Job] = []
    try:
        outputs = plan.outputs(record)
    except RecordError as e:  # a record its codec cannot split into outputs (a video too short for a clip)
        return [e]
    for rec, transform in outputs:
        if LOST in rec.meta:  # an output its source cannot give (frames past the end of a video cut short)
            out.append(RecordError(rec.key, rec.origin, Stage.DECODE, str(rec.meta[LOST])))
            continue
        if not transform:
            try:
                rec = get_codec(rec.media, rec.codec, HOST).check(rec, plan)
            except RecordError as e:
                out.append(e)
                continue
            stats.add(passthrough=1)
            out.append(rec)
            continue
        job = Job(source, rec.with_(data=b""))
        if size is not None:
            try:
                job.settle(plan, *size)
            except Exception as e:  # noqa: BLE001 - the record boundary: an op too large, hostile boxes
                out.append(RecordError(rec.key, rec.origin, Stage.TRANSFORM, str(e)))
                continue
        out.append(job)
    info = getattr(record, "_video_info", None) if record.media == Media.VIDEO else None
    if info is not None and info.skipped and not all(isinstance(o, RecordError) for o in out):  # (frames the file
        # no longer holds: said, as they cannot be listed; a record refused whole says why in its own error)
        n = info.skipped
        stats.warn(f"{record.key}: {n:,} frame{'s' * (n != 1)} lost to damage in the file (timestamps that skip them "
                   f"or are missing, from {info.skip_at:.3f} s); the frames it can place are written")
    if info is not None and info.boxes_cut and not info.missing and any(isinstance(o, Job) for o in out):
        stats.warn(f"{record.key}: {info.cut_short}; its frames are written")
    if record.media in (Media.VIDEO, Media.AUDIO) and bytes(record.data[4:8]) == b"ftyp":  # (MP4, MOV, M4A)
        from .codecs.video_probe import FRAGMENTS_OPEN, mp4_open_end

        if mp4_open_end(record.data):  # (fragments whose end nothing in the file tells: said, not judged)
            stats.warn(f"{record.key}: {FRAGMENTS_OPEN} (what it holds is written)")
    if record.media == Media.AUDIO and (record.data[:3] == b"ID3" or record.data[:1] == b"\xff"):  # (an MP3)
        from .codecs.audio_end import id3_end, lame_tag_damage

        if why := lame_tag_damage(bytes(record.data[: id3_end(bytes(record.data[:10])) + 4096])):
            stats.warn(f"{record.key}: {why}; it is written")
    if info is not None and info.jump:  # (damage that moved the timestamps, or a splice: how many went, unknown)
        stats.warn(f"{record.key}: its timestamps jump {info.jump:.3f} s at {info.jump_at:.3f} s, off its steady "
                   f"rate (damage that moved them, or a splice): frames may be lost there; the frames it holds are "
                   f"written")
    if record.media == Media.IMAGE and any(isinstance(o, Job) for o in out) and frames_held(record.data,
                                                                                            record.codec) > 1:
        stats.add(first_frames=1)  # (once a source, however many outputs: a decoder gives its first picture)
    return out
