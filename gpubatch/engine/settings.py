"""Every tunable of the engine in one frozen object, built once and passed down.

A run builds its :class:`Settings` once, from the API's or the command's arguments over the
environment (:meth:`Settings.from_env`, the one place in the engine that reads ``GPUBATCH_*``
variables), and hands it to the GPU engine, its decoders, the feed and the worker processes (which get
it pickled). Studies and tests build their own (``Settings(hw_chunk=96)``,
``settings.with_(cuda_share=0.35)``) instead of patching module globals.

The defaults are what was measured best; docs/engine.md gives the figures behind each.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import UsageError

ROUTES = ("auto", "split", "hardware")
#: the JPEG kinds (``headers.jpeg_kind``) the hardware engine decodes, those it decodes fastest first
HW_KINDS = ("baseline/4:2:0", "baseline/4:2:2", "baseline/4:4:0", "baseline/gray", "baseline/4:4:4")
PLANES = ("chunked", "always", "never")
SYNC_POLICIES = ("auto", "spin", "yield", "blocking")
VIDEO_LOOPS = ("native", "python")
SHARD_WRITERS = ("auto", "process", "thread")


@dataclass(frozen=True)
class Settings:
    """The engine's knobs. Those that an environment variable can set name it.

    Decode routing (how each batch is split between the hardware JPEG engine and the CUDA decoder):

    Attributes:
        decode_route: "auto" (by the free cores), "split" or "hardware" (``GPUBATCH_DECODE_ROUTE``).
        split_min_cores: free cores at which "auto" takes the split route.
        cuda_share: the CUDA decoder's share of each batch on the split route (``GPUBATCH_CUDA_SHARE``).
        hw_instances: hardware-engine instances; 0 chooses by the route (2 split, ``hw_only_instances``
            hardware) (``GPUBATCH_HW_DECODERS``).
        hw_only_instances: instances on the hardware route (one per common kind).
        hw_per_kind: on the split route, an instance more (up to ``hw_only_instances``) the first time a
            batch gives the hardware engine more kinds than it has instances, where no ``--gpu-memory`` cap
            holds the engine (``GPUBATCH_HW_PER_KIND``; off by default: at the default share it made the loader
            no faster, 2026-12-02).
        hw_rest_early: a GPU worker's start makes its hardware-decoder instances after the first right after it,
            not once the decoders' warm-up is done (``GPUBATCH_HW_REST_EARLY``).
        cuda_takes: which kinds the split route's CUDA decoder takes first: "slowest" (those the
            hardware engine is slowest on) or "cheapest" (those cheapest for its host threads).
        cuda_kinds: JPEG kinds (as ``headers.jpeg_kind`` names them, "baseline/4:4:4") the CUDA decoder
            takes on every route, by the image's header: the route stays independent of load and batch
            (``GPUBATCH_CUDA_KINDS``, comma-separated; none by default).
        hw_mixed: the hardware engine's part in one call whatever the kinds (True), or a call a kind.
        hw_direct: drive the hardware engine through nvJPEG directly where it loads
            (``GPUBATCH_HW_DIRECT``; else nvImageCodec's hardware decoder).
        hw_native: on that direct path, the engine's calls made by a native thread outside the GIL
            (``codecs/hw_native.py``, built with the system C compiler on first use; ``GPUBATCH_HW_NATIVE=1``;
            off by default: no gain told apart (the transcode's medians 1-5% higher, runs overlapping); its form
            since 77f9965 passed the memory-cap tests on an H200, 2026-12-04).
        hw_stream_wait: (a measurement) on that direct path, from Python, wait for the decoder's stream before each
            call, outside nvJPEG, timed as ``hw_stream_wait`` (``GPUBATCH_HW_STREAM_WAIT``): what of the calls'
            time is other GPU work their stream waits for; the calls that find work pending on their stream are
            counted as ``hw_calls_behind``. Run on an H200 (2026-12-04): not what stretches the calls.
        cache_dir: gpubatch's cache folder (the native driver's build; ``GPUBATCH_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/gpubatch``; empty: ``~/.cache/gpubatch``).
        c_compiler: the C compiler that builds it (``CC``; empty: ``cc``, else ``gcc``, on the PATH).
        decode_api: "c" (nvImageCodec's C API) or "python" (its binding) (``GPUBATCH_DECODE_API``).
        cuda_decoder_options: nvImageCodec options of the CUDA decoder (``GPUBATCH_CUDA_DECODER_OPTIONS``).
        high_priority: the decoders' streams ("hw", "cuda") made at the device's greatest priority
            (``GPUBATCH_HIGH_PRIORITY``, comma-separated).
        follow: an "auto" route follows the host's load while a run goes (``GPUBATCH_FOLLOW``).
        follow_check_s, follow_confirm, follow_margin, follow_hold_s: seconds between checks of the
            load, checks in a row that must want the other route, free cores below
            ``split_min_cores`` before the split route is left, seconds a route is kept at least.
        decoder_threads_max: CPU threads of the CUDA decoder at most (``GPUBATCH_DECODER_THREADS``).
        readers_hw: on the hardware route the feed takes half the cores for its readers (else a quarter).
        reserve_core: a CPU core of its own for the hardware decoder's thread (``GPUBATCH_RESERVE_CORE``).
        early_start: a GPU image run's worker processes started before its device is probed and its source
            opened (``execute.early.prestart``), and an image, audio or video run's, or a host run's (the CPU's, a
            pass-through), by the ``gpubatch`` command at its start, from its arguments alone, its device probe
            begun beside its imports (``execute.early.sniff``) (``GPUBATCH_EARLY_START``).
        early_fork: the command's own start forks those processes (it has one thread and no CUDA then) instead of
            spawning fresh interpreters (``GPUBATCH_EARLY_FORK``).
        reserve_min_cpus: the fewest usable cores with which a core is reserved.

    Decode buffers:

    Attributes:
        pool_keep: bytes of freed memory the driver's default pool keeps (``GPUBATCH_POOL_KEEP_MIB``, in MiB);
            above it, freed memory goes back to the driver at each synchronization.
        slab_round: a part's buffer is rounded up to at least this many bytes (a quarter of its size's
            leading power of two); ``slab_fit``: and taken at the size of the largest part before it
            where that is at most a third more.
        decode_chunk: ImagePipeline's calls of at most this many images, each into a ring slot the same
            call of the next batch reuses (0: a buffer per part from the driver's pool).
        hw_chunk: the hardware engine's calls at most this many images; ``min_calls``: a chunked part
            is split into at least this many calls.
        call_bytes: a chunked call's decoded images at most this many bytes (0: by count alone); an image
            larger is a call alone. ``ImagePipeline(gpu_memory=...)`` sets it to the bytes its plan holds for a call.
        cuda_ring, hw_ring: the CUDA decoder's (hardware engine's) calls take this many slots in turn
            instead of one per call (0) (``GPUBATCH_CUDA_RING``, ``GPUBATCH_HW_RING``; a capped
            ``ImagePipeline`` sets both from its plan).
        ring_banks: where calls take one slot a call (no ``cuda_ring`` / ``hw_ring``), a decoder's parts take
            this many banks of slots in turn (``GPUBATCH_RING_BANKS``): with 2, a batch is decoded into one bank
            while the one before is still read from the other, for one more batch of decoded images in memory.
            0 (the default): the training loader's ``LOADER_BANKS``, one bank for the pipelines.
        region_decode: decode only the part of each upright JPEG the chain's leading crop reads
            (``GPUBATCH_REGION_DECODE``; ``ImagePipeline(region_decode=...)`` over it). None (the default): the
            training loader does, the pipelines do not.
        ring_wait: seconds a call waits for its slot before taking a buffer of its own.
        ring_slack: a slot grows to the call's size and 1/``ring_slack`` more.
        free_before_grow: a growing slot gives its old buffer back before taking the new one, waiting
            at most ``grow_wait`` seconds for its readers.
        size_by_most: a slot for a whole kind is sized for the most pixels of that kind a batch has had.
        hw_planes: "chunked" (decode 4:2:0 and 4:2:2 into their planes with calls split below
            ``hw_chunk``), "always" or "never" (``GPUBATCH_HW_PLANES``). ``convert``'s GPU image unit decodes to
            RGB under any of them: decoding into planes there made its calls 7-9% slower (benchmarks/RESULTS.md
            2026-12-04 "13:25 to 13:27").
        regions_for: the decoders that decode only the regions asked for ("hw", "cuda").

    The CUDA context and the pipeline:

    Attributes:
        sync: how host threads wait for the GPU, set where gpubatch makes the context: "auto", "spin",
            "yield", "blocking" (``GPUBATCH_SYNC``).
        switch_interval: the interpreter's thread switch interval at most, seconds
            (``GPUBATCH_SWITCH_INTERVAL``).
        stack_bytes: the context's stack per GPU thread (None: the driver's default).
        pin_feed: page-lock the feed's shared-memory ring for the GPU (``GPUBATCH_PIN_FEED``).
        held_slots: batches whose feed slot waits for the GPU before the oldest is waited for.
        feed_slots: the file feed's ring (besides the held ones; ``GPUBATCH_FEED_SLOTS``).
        feed_slot_bytes: one batch's encoded bytes in a feed slot (more travels pickled).
        fence_readers: the writers of an output buffer wait for the streams its last batch was read on.
        loader_readers: the training loader's reader processes on the GPU (0: by the cores;
            ``GPUBATCH_LOADER_READERS``; gpubatch.training).

    The GPU worker processes of ``convert`` and ``augment``:

    Attributes:
        queue_depth: finished batches a worker may have waiting for the writer.
        out_slot_bytes: a batch's encoded data in an output slot (more travels pickled).
        feed_depth: batches a worker's reader processes prepare ahead.
        decode_ahead: batches a worker decodes ahead of the one its loop runs through the chain and the
            encoder, without ``--gpu-memory`` (whose plan sets it) (``GPUBATCH_DECODE_AHEAD``).
        hw_preallocate: height and width the hardware decoder's buffers are reserved for.
        shard_writer: where a GPU worker's shards are written and committed: "process" (a process of its
            own, the worker's GIL left to the loop that feeds the GPU), "thread" (a thread of the worker),
            or "auto": the unit's own choice, a process for images (many small records), a thread for
            audio (few large ones, which the pipe to a process carries slowly)
            (``GPUBATCH_SHARD_WRITER``; engine/execute/writer.py).
        write_lanes: shards a GPU worker's writer thread writes at once, each in a thread of its own (its
            records in order; the commits still in order): 0 for the unit's choice, 4 for audio (large records,
            copied into the page cache at about 1 GB/s a thread), 1 for images (``GPUBATCH_WRITE_LANES``).

    Audio and video:

    Attributes:
        flac_gpu: the GPU audio unit (``convert``/``augment``) decodes FLAC on the GPU, its decoding processes only
            reading each record and finding its frames (``codecs/flac_gpu.py``; ``GPUBATCH_FLAC_GPU``); records that
            path does not take are decoded on the CPU as before. 8,192 ten-second clips to Whisper features: 1,826
            against 1,400 clips/s on an H100 host (2026-12-06, in turn, the kernel as it is; benchmarks/RESULTS.md).
            ``AudioPipeline`` takes it too, unless given its own ``flac_gpu=``.
        video_decoders: NVDEC decoder sessions (threads) working at once (``GPUBATCH_VIDEO_DECODERS``);
            one session is about one NVDEC engine's work and Hopper has seven (docs/engine.md).
        video_loop: "native" (PyNvVideoCodec's ThreadedDecoder demuxes and decodes on a native thread) or
            "python" (PyAV demuxes, each packet goes to the decoder from Python) (``GPUBATCH_VIDEO_LOOP``;
            engine/gpu/nvdec_loop.py).
    """

    decode_route: str = "auto"
    split_min_cores: float = 15.0
    cuda_share: float = 0.3
    hw_instances: int = 0
    hw_only_instances: int = 3
    hw_per_kind: bool = False
    hw_rest_early: bool = True
    cuda_takes: str = "slowest"
    cuda_kinds: tuple[str, ...] = ()
    hw_mixed: bool = False
    hw_direct: bool = True
    hw_native: bool = False
    hw_stream_wait: bool = False
    cache_dir: str = ""
    c_compiler: str = ""
    decode_api: str = "c"
    cuda_decoder_options: str = "nvjpeg_cuda_decoder:hybrid_huffman_threshold=0"
    high_priority: tuple[str, ...] = ()
    follow: bool = True
    follow_check_s: float = 1.0
    follow_confirm: int = 2
    follow_margin: float = 0.5
    follow_hold_s: float = 10.0
    decoder_threads_max: int = 11
    readers_hw: bool = True
    reserve_core: bool = True
    early_start: bool = True
    early_fork: bool = True
    reserve_min_cpus: int = 8

    pool_keep: int = 512 << 20
    slab_round: int = 2 << 20
    slab_fit: bool = True
    decode_chunk: int = 256
    hw_chunk: int = 256
    min_calls: int = 1
    call_bytes: int = 0
    cuda_ring: int = 0
    hw_ring: int = 0
    ring_banks: int = 0
    region_decode: bool | None = None
    ring_wait: float = 1.0
    ring_slack: int = 4
    free_before_grow: bool = True
    grow_wait: float = 0.25
    size_by_most: bool = True
    hw_planes: str = "chunked"
    regions_for: tuple[str, ...] = ("hw", "cuda")

    sync: str = "auto"
    switch_interval: float = 0.001
    stack_bytes: int | None = 16
    pin_feed: bool = True
    held_slots: int = 2
    feed_slots: int = 6
    feed_slot_bytes: int = 64 << 20
    fence_readers: bool = True
    loader_readers: int = 0

    queue_depth: int = 3
    out_slot_bytes: int = 32 << 20
    feed_depth: int = 4
    decode_ahead: int = 2
    hw_preallocate: int = 640
    shard_writer: str = "auto"
    write_lanes: int = 0
    flac_gpu: bool = True
    video_decoders: int = 8
    video_loop: str = "native"

    def __post_init__(self) -> None:
        for name, value, allowed in (("decode route", self.decode_route, ROUTES), ("hw_planes", self.hw_planes, PLANES),
                                     ("GPU sync policy", self.sync, SYNC_POLICIES),
                                     ("decode API", self.decode_api, ("c", "python")),
                                     ("video loop", self.video_loop, VIDEO_LOOPS),
                                     ("shard writer", self.shard_writer, SHARD_WRITERS),
                                     ("cuda_takes", self.cuda_takes, ("slowest", "cheapest"))):
            if value not in allowed:
                raise UsageError(f"unknown {name} {value!r}: one of {', '.join(allowed)}")
        if not 0.0 <= self.cuda_share <= 1.0:
            raise UsageError(f"the CUDA decoder's share {self.cuda_share!r} (GPUBATCH_CUDA_SHARE): a fraction from 0 to 1")

    @property
    def out_slots(self) -> int:
        """A worker's output slots: the queued batches, the one being written, the one being made."""
        return self.queue_depth + 2

    def with_(self, **changes: Any) -> Settings:
        """A copy with some knobs changed (None values are left as they are)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> Settings:
        """The settings of a run: ``given`` (the API's or the command's arguments; None values are not
        given) over the ``GPUBATCH_*`` environment variables over the defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var, name, kind in _ENV:
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                values[name] = kind(raw)
            except ValueError:
                raise UsageError(f"{var}={raw!r}: not a {kind.__name__}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise UsageError(f"unknown engine setting {unknown[0]!r}")
        values.update({k: v for k, v in given.items() if v is not None})
        return cls(**values)


def _flag(raw: str) -> bool:
    return raw not in ("0", "false", "no", "off")


_flag.__name__ = "flag (0 or 1)"


def _names(allowed: tuple[str, ...], what: str):
    """A parser of a comma-separated list of names out of ``allowed`` (``what`` names them in errors)."""

    def parse(raw: str) -> tuple[str, ...]:
        names = tuple(k.strip() for k in raw.split(",") if k.strip())
        for k in names:
            if k not in allowed:
                raise ValueError(k)
        return names

    parse.__name__ = f"list of {what} ({', '.join(allowed)})"
    return parse


STREAMS = ("hw", "cuda")  # the decoders' streams high_priority may name
_kinds = _names(HW_KINDS, "JPEG kinds")
_streams = _names(STREAMS, "the decoders' streams")


def _mib(raw: str) -> int:
    mib = int(raw)
    if mib < 0:
        raise ValueError(raw)
    return mib << 20


_mib.__name__ = "whole number of MiB"


def _at_least(least: int) -> Callable[[str], int]:
    """A parser of whole numbers of ``least`` or more (named as its error message says)."""

    def whole(raw: str) -> int:
        n = int(raw)
        if n < least:
            raise ValueError(raw)
        return n

    whole.__name__ = f"whole number ({least} or more)"
    return whole


_count, _positive = _at_least(0), _at_least(1)


def _xdg_cache(raw: str) -> str:
    return os.path.join(raw, "gpubatch")


_xdg_cache.__name__ = "folder"

# (variable, setting, parser): the environment the engine reads, here and nowhere else
_ENV = (
    ("GPUBATCH_DECODE_ROUTE", "decode_route", str),
    ("GPUBATCH_HW_DECODERS", "hw_instances", int),
    ("GPUBATCH_HW_DIRECT", "hw_direct", _flag),
    ("GPUBATCH_HW_NATIVE", "hw_native", _flag),
    ("GPUBATCH_HW_STREAM_WAIT", "hw_stream_wait", _flag),
    ("XDG_CACHE_HOME", "cache_dir", _xdg_cache),
    ("GPUBATCH_CACHE_DIR", "cache_dir", str),  # (after XDG_CACHE_HOME: over it)
    ("CC", "c_compiler", str),
    ("GPUBATCH_DECODE_API", "decode_api", str),
    ("GPUBATCH_FOLLOW", "follow", _flag),
    ("GPUBATCH_RESERVE_CORE", "reserve_core", _flag),
    ("GPUBATCH_EARLY_START", "early_start", _flag),
    ("GPUBATCH_EARLY_FORK", "early_fork", _flag),
    ("GPUBATCH_HW_PLANES", "hw_planes", str),
    ("GPUBATCH_SYNC", "sync", str),
    ("GPUBATCH_SWITCH_INTERVAL", "switch_interval", float),
    ("GPUBATCH_PIN_FEED", "pin_feed", _flag),
    ("GPUBATCH_LOADER_READERS", "loader_readers", int),
    ("GPUBATCH_FEED_SLOTS", "feed_slots", _positive),
    ("GPUBATCH_FLAC_GPU", "flac_gpu", _flag),
    ("GPUBATCH_VIDEO_DECODERS", "video_decoders", int),
    ("GPUBATCH_VIDEO_LOOP", "video_loop", str),
    ("GPUBATCH_SHARD_WRITER", "shard_writer", str),
    ("GPUBATCH_WRITE_LANES", "write_lanes", int),
    ("GPUBATCH_DECODE_AHEAD", "decode_ahead", int),
    ("GPUBATCH_CUDA_KINDS", "cuda_kinds", _kinds),
    ("GPUBATCH_CUDA_SHARE", "cuda_share", float),
    ("GPUBATCH_HW_PER_KIND", "hw_per_kind", _flag),
    ("GPUBATCH_HW_REST_EARLY", "hw_rest_early", _flag),
    ("GPUBATCH_DECODER_THREADS", "decoder_threads_max", int),
    ("GPUBATCH_HIGH_PRIORITY", "high_priority", _streams),
    ("GPUBATCH_CUDA_DECODER_OPTIONS", "cuda_decoder_options", str),
    ("GPUBATCH_POOL_KEEP_MIB", "pool_keep", _mib),
    ("GPUBATCH_HW_RING", "hw_ring", _count),
    ("GPUBATCH_CUDA_RING", "cuda_ring", _count),
    ("GPUBATCH_RING_BANKS", "ring_banks", _count),
    ("GPUBATCH_REGION_DECODE", "region_decode", _flag),
)
