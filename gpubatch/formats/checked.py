"""The checks every run makes of what it writes, behind each shard's sink (:class:`CheckedSink`): a record of a
media or codec its format cannot hold stops the run before more is written, in one line; what the format cannot
hold of a record that it can (boxes, class labels, label arrays, a sample's other members, a record's text) is
dropped with a warning."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..types import IMAGE_EXTENSIONS, Media, Record
from .base import JSON_FIELDS, MEMBERS


class CheckedSink:
    """A format's shard sink behind the checks every run makes of what it writes: a record of a media or
    codec the format cannot hold stops the run before it writes more (one line); boxes, label arrays and
    a sample's other members the format cannot hold are dropped with a warning; an audio array's sample
    rate and features are noted (the manifest keeps them where all arrays share them)."""

    def __init__(self, inner: Any, fmt: Any, geometric: bool):
        self.inner, self.fmt, self.geometric = inner, fmt, geometric
        self.warnings: list[str] = []
        self.audio: list[dict[str, Any]] = []

    @property
    def timings(self) -> dict[str, float]:
        return self.inner.timings

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def write(self, record: Record) -> None:
        self.check(record)
        self.inner.write(record)

    def write_many(self, records: list[Record]) -> list[BaseException | None]:
        for record in records:
            self.check(record)
        return self.inner.write_many(records)

    def check(self, record: Record) -> None:
        """The checks of one record before it is written (UsageError: the run stops; else warnings)."""
        fmt = self.fmt
        if isinstance(record.media, Media) and record.media not in fmt.media:
            raise UsageError(f"{fmt.name} holds {' and '.join(m.value for m in fmt.media)} records, not "
                             f"{record.media.value} ({record.origin}): {media_formats(record.media)}")
        held = fmt.image_codecs
        if held is not None and record.media is Media.IMAGE and record.codec not in held:
            raise UsageError(f"{fmt.name} cannot hold {record.codec} images ({record.origin}): its readers decode "
                             f"{', '.join(sorted(held))}; pass --image-format png (or jpeg) to re-encode them, or "
                             "choose a format that keeps any codec (webdataset, tfrecord, folder)")
        if record.boxes is not None and len(record.boxes) and not fmt.carries_boxes:
            self.warn(f"{fmt.name} cannot hold detection boxes: boxes were dropped")
        if record.label is not None and not fmt.carries_labels:
            self.warn(f"{fmt.name} holds boxes, not a class a record: the records' classes were dropped "
                      "(coco, tfrecord and webdataset keep both)")
        if not fmt.carries_label_arrays and len(record.meta.get("labels") or ()) > 1:
            self.warn(f"{fmt.name} holds one class a record: RecordIO multi-label arrays were cut to their first label")
        members = record.meta.get(MEMBERS) or {}
        if (members or JSON_FIELDS in record.meta) and not fmt.carries_members:
            names = ", ".join(f".{e}" for e in sorted([*members, *([JSON_FIELDS] if JSON_FIELDS in record.meta else [])]))
            self.warn(f"{fmt.name} cannot hold a sample's other WebDataset members ({names}, e.g. captions): they "
                      "were dropped; webdataset and tfrecord keep them")
        elif self.geometric and "clip" not in record.meta and any(e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS
                                                                  for e in members):  # (a clip's members: its frames)
            names = ", ".join(f".{e}" for e in sorted(members) if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS)
            self.warn(f"the samples' other image members ({names}) were kept as they were: the geometric ops moved "
                      "only the sample's image")
        if record.meta.get("text") and not fmt.carries_text:  # (LMDB had dropped every transcript with no word)
            self.warn(f"{fmt.name} cannot hold a record's text (a transcript, a caption): it was dropped; webdataset, "
                      "tfrecord, parquet and the audio layout keep it")
        if record.media is Media.AUDIO and record.codec == "npy":
            facts = {"sample_rate": record.meta.get("sample_rate"), "features": record.meta.get("features") or ""}
            if facts not in self.audio:
                self.audio.append(facts)
        sound = record.meta.get("audio")
        if isinstance(sound, str) and sound.startswith(("dropped", "damaged")):  # MP4 cannot hold it, or cut
            self.warn(f"the audio track of a re-encoded video was {sound} ({record.origin}); the others' tracks "
                      "were copied")

    def commit(self) -> tuple[dict, dict]:
        files, extra = self.inner.commit()
        self.warnings += [w for w in getattr(self.inner, "warnings", []) if w not in self.warnings]
        return files, {**extra, **({"audio": self.audio} if self.audio else {})}

    def abort(self) -> None:
        self.inner.abort()


def media_formats(media: Media) -> str:
    from . import FORMATS, _load

    _load()
    names = sorted(n for n, f in FORMATS.items() if media in f.media)
    return f"{', '.join(names)} hold {media.value}" + (
        "; --frames writes a video's frames as images" if media is Media.VIDEO else "")
