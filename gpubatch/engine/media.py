"""Media and their codecs, as the run flow meets them: a registry keyed by (media, codec, backend),
and the media-neutral spec of decoded data that ops declare what they take and make by.

The run flow (:mod:`.run`) never names a media: a record's codec object checks the bytes that pass
through untouched, decodes, says the size parameters are drawn for, and encodes. Images register
theirs (:mod:`.codecs.image`); a new media (video, audio) adds a codecs module and registers its own,
with its ops declaring the media they take (:meth:`~.ops.base.Op.out_spec`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..errors import UsageError, register_once
from ..types import Record
from .registry import DEVICE, HOST

__all__ = ["DEVICE", "HOST", "Codec", "MediaSpec", "RunPlan", "get_codec", "has_codec", "media_name", "media_spec",
           "register_codec"]



#: the metadata key of an output template its source cannot give, with the reason (a video cut short:
#: the frames past its end); the run lists it as skipped. Set by codecs, never written.
LOST = "gpubatch:lost"

@dataclass(frozen=True)
class MediaSpec:
    """What decoded data is, whatever the media: the spec an op takes and the one it makes.

    Attributes:
        media: "image", "video", "audio" (or a media of one's own).
        layout: memory layout of an item ("HWC", "CHW", "FHWC", "T").
        dtype: NumPy dtype name of its elements.
        channels: channels per element, where the media has them.
    """

    media: str
    layout: str = "HWC"
    dtype: str = "uint8"
    channels: int | None = 3

    def with_(self, **changes: Any) -> MediaSpec:
        return replace(self, **changes)


class RunPlan(Protocol):
    """What a codec reads of the run's plan (:class:`~.plan.Plan` is one): the options that shape its
    checks and output; a codec of a media reads the attributes that media's options add."""

    media: str
    max_pixels: int


class Codec(Protocol):
    """One media's codec on one backend, as the run flow uses it (see :class:`~.codecs.image.ImageHostCodec`).

    ``spec`` is what :meth:`decode` gives; ``size`` is the (height, width)-like pair parameters are
    drawn for; :meth:`encode` gives the output record (data, codec) from the data the chain made.
    """

    spec: MediaSpec

    def check(self, record: Record, plan: RunPlan) -> Record:
        """``record`` as it passes through untouched, its codec named by its bytes; RecordError where bad."""

    def decode(self, record: Record, plan: RunPlan) -> Any:
        """The decoded data; RecordError (stage decode) where it cannot be decoded."""

    def size(self, decoded: Any) -> tuple[int, int]:
        """The size of decoded data that the chain's parameters are drawn for."""

    def encode(self, data: Any, record: Record, plan: RunPlan) -> Record:
        """``record`` (the output's template) with ``data`` encoded; RecordError (stage encode) where not."""


_CODECS: dict[tuple[str, str, str], Codec] = {}
# modules that register the codecs gpubatch ships, imported on first lookup
_MODULES = (".codecs.image", ".codecs.image_device", ".codecs.video", ".codecs.video_device", ".codecs.audio",
            ".codecs.audio_device")
_loaded = False


def register_codec(media: str, codec: str, backend: str, impl: Codec) -> Codec:
    """Make ``impl`` the codec of ``media`` records of ``codec`` (``"*"``: any) on ``backend``."""
    return register_once(_CODECS, (media, codec, backend), impl, f"the {backend} codec of {media}", codec)


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(mod, __package__)
        _loaded = True


def media_name(media: Any) -> str:
    """A record's media as the registry keys it (a :class:`~gpubatch.types.Media` or a plain name)."""
    return str(getattr(media, "value", media))


def get_codec(media: Any, codec: str, backend: str = HOST) -> Codec:
    """The codec for ``media`` records of ``codec`` on ``backend`` (an exact entry, else the media's
    ``"*"``); a UsageError naming what exists where there is none."""
    _load()
    name = media_name(media)
    found = _CODECS.get((name, codec, backend)) or _CODECS.get((name, "*", backend))
    if found is None:
        known = sorted({m for m, _, b in _CODECS if b == backend})
        raise UsageError(f"no {backend} codec for {name} records ({codec}); {backend} codecs exist for "
                         f"{', '.join(known) or 'no media'}")
    return found


def media_spec(media: Any, backend: str = HOST) -> MediaSpec:
    """What ``media`` decodes to on ``backend`` (its codecs there agree on it); a UsageError where no
    codec of that media runs there."""
    _load()
    name = media_name(media)
    found = next((c for (m, _, b), c in _CODECS.items() if m == name and b == backend), None)
    if found is None:
        return get_codec(name, "*", backend).spec  # (raises the one-line error naming what exists)
    return found.spec


def has_codec(media: Any, backend: str) -> bool:
    """Whether some codec of ``media`` runs on ``backend``."""
    _load()
    name = media_name(media)
    return any(m == name and b == backend for m, _, b in _CODECS)
