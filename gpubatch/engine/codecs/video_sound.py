"""A video's sound track, copied packet for packet beside its re-encoded frames (``--to video``), and what damage
cost it on the way: packets a demuxer passed over or stopped before, packets out of order, a track it could not
read. The video's own checks (:mod:`.video_probe`) never see these, since the frames are whole; each becomes a
warning of the run (:class:`gpubatch.formats.checked.Checked`), and the video is written with what was read.

How many packets a track should hold comes from the file: its header's count (an MP4's tables, an AVI's index),
its structure (a Matroska file's blocks, an FLV file's tags: :func:`.container_end.sound_packets`), its duration,
and, in a stream format that counts nothing (MPEG-TS, MPEG-PS), the packets' own times: a packet lost leaves a hole
of its duration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .video_probe import av, open_container, packets, sniff_container


def audio_packets(data: bytes, start: float = 0.0, end: float = 0.0) -> tuple[Any, list[Any], str]:
    """The first audio stream of video ``data`` and its packets from ``start`` to ``end`` seconds (0: the
    end) of the video, to copy beside its re-encoded frames; (None, [], "") where there is none to copy.

    Times count from the video's first frame, as the frames' do (:attr:`VideoInfo.times`): the packets'
    are moved by the video's start and ``start``, so that the sound stays with the frames it went with in
    a file whose times do not begin at 0 (an MPEG-TS's). The third item says what damage cost the track
    ("" where nothing): packets short of what the file declares, holes in the packets' times, packets out
    of order (left out), a track the demuxer could not read."""
    c = open_container(data)
    if not c.streams.audio:
        streams = len(c.streams)
        c.close()
        from .container_end import matroska_tracks

        listed = matroska_tracks(data) if sniff_container(data) in ("mkv", "webm") else 0
        return None, [], (f"the file lists {listed} tracks and its demuxer read {streams} (a track's header is "
                          "damaged, or of a kind FFmpeg does not read)" if listed > streams else "")
    s = c.streams.audio[0]
    tb = float(s.time_base) if s.time_base else 0.0
    first = s.start_time or 0
    v = c.streams.video[0] if c.streams.video else None
    origin = (float(v.start_time * v.time_base) if v is not None and v.start_time is not None and v.time_base
              else float(first) * tb)
    shift = int(round((origin + start) / tb)) if tb else 0
    read, reach, steps, got = [], 0.0, [], 0
    for p in packets(c, s):  # (up to a damaged stretch)
        got += p.size > 0 or p.pts is not None  # (not the demuxer's last, empty packet)
        if p.size == 0 or p.pts is None:
            continue
        if p.duration:
            steps.append(float(p.duration) * tb)
        reach = max(reach, float(p.pts - first + (p.duration or 0)) * tb)
        read.append(p)

    def wanted(pts: float) -> bool:  # (a time of the stretch wanted)
        t = pts * tb - origin
        return not (t + 1e-6 < start or (end and t >= end))

    # (in order, durations and holes over every packet read: a packet lost just inside the stretch leaves its hole
    # after one outside it, before the video's first frame, say)
    ordered, left = _in_order(read)
    _fill_durations(ordered)
    holes = _holes(ordered, wanted)
    disordered = sum(wanted(p.pts) for p in left)
    kept = [p for p in ordered if wanted(p.pts)]
    for p in kept:
        p.pts = p.pts - shift
        p.dts = p.dts - shift if p.dts is not None else None
    lost = []
    declared = float(s.duration) * tb if s.duration and tb else 0.0
    if short := _cut_short(reach, declared, end, steps):
        lost.append(short)
    elif not start and not end:  # (the packets its header counts: an AVI's, an MP4's; its structure's)
        from .container_end import sound_packets

        listed = s.frames or sound_packets(data, sniff_container(data))
        if got < listed:
            lost.append(f"{got} of its {listed} packets read (the others lost to damage)")
    if not lost and holes:
        worth = "1 packet's" if holes == 1 else f"{holes} packets'"
        lost.append(f"its times skip {worth} worth (lost to damage, or a gap in the recording)")
    if disordered:
        lost.append(f"{disordered} of its {len(kept) + disordered} packets left out (damaged: their times out of "
                    "order)")
    return (c, s), kept, "; ".join(lost)


def _in_order(kept: list[Any]) -> tuple[list[Any], list[Any]]:
    """The packets whose decoding times rise, and those that did not: one that repeats or goes back from the last
    kept, or one that jumps past the next (a damaged time, which would have shut out every packet after it)."""
    out: list[Any] = []
    left: list[Any] = []
    for i, p in enumerate(kept):
        if p.dts is not None:
            last = out[-1].dts if out and out[-1].dts is not None else None
            after = kept[i + 1].dts if i + 1 < len(kept) else None
            if (last is not None and p.dts <= last) or (
                    after is not None and p.dts >= after and (last is None or after > last)):
                left.append(p)
                continue
        out.append(p)
    return out, left


def _holes(kept: list[Any], wanted: Callable[[float], bool] = lambda pts: True) -> int:
    """How many packets' worth the packets' times skip: a gap of more than half a packet between one's end and the
    next one's start, counted in packets of the one before; of those, the ones whose times are ``wanted``."""
    n = 0
    for a, b in zip(kept, kept[1:]):
        if a.pts is not None and b.pts is not None and a.duration and b.pts - (a.pts + a.duration) > a.duration / 2:
            n += sum(wanted(a.pts + k * a.duration) for k in range(1, round((b.pts - a.pts) / a.duration)))
    return n


def _fill_durations(kept: list[Any]) -> None:
    """Give packets of no duration the step between packets (the median): an MP4 ends its last sample where the
    next begins, and a last packet of no duration is not read back, a packet of sound lost (a Matroska block's
    whose codec header the damage made unreadable, 2026-12-07)."""
    if not any(not p.duration for p in kept):
        return
    steps = sorted(b.dts - a.dts for a, b in zip(kept, kept[1:])
                   if a.dts is not None and b.dts is not None and b.dts > a.dts)
    if steps:
        for p in kept:
            if not p.duration:
                p.duration = steps[len(steps) // 2]


def _cut_short(reach: float, declared: float, end: float, steps: list[float]) -> str:
    """Where the packets read (reaching ``reach`` seconds) stop short of the ``declared`` length of their
    stream (0: not declared) within the stretch wanted (to ``end``, 0: the end): what was read, else ""."""
    want = min(declared, end) if end else declared
    slack = max(0.1, 3 * sorted(steps)[len(steps) // 2]) if steps else 0.1
    if not want or reach + slack >= want:
        return ""
    return f"{reach:.2f} s of its {declared:.2f} s read (the rest lost to damage)"


def _audio_stream(out: Any, source: tuple[Any, Any]) -> tuple[Any, str]:
    """A stream of ``out`` like the audio stream of ``source`` (container, stream), to copy its packets
    into unchanged (no re-encode): (stream, codec name), or (None, "dropped: why") where MP4 takes none."""
    _, template = source
    name = template.codec_context.name
    try:
        add = getattr(out, "add_stream_from_template", None)
        return (add(template) if add is not None else out.add_stream(template=template)), name
    except Exception as e:  # noqa: BLE001 - the container takes no such stream
        return None, f"dropped: {name} audio cannot go into MP4 ({str(e).splitlines()[0][:80]})"


def _mux_audio(out: Any, stream: Any, packets: list[Any]) -> int:
    """Mux ``packets`` into ``stream`` of ``out``; how many the muxer refused (a damaged packet: one whose decoding
    time does not follow the one before, which :func:`audio_packets` has left out already, or another)."""
    failed = av().FFmpegError
    left = 0
    for p in packets:
        p.stream = stream
        try:
            out.mux(p)
        except failed:
            left += 1
    return left
