"""Video inputs that lost frames without a word or took the run down: a file cut after its index, an
MKV claiming a 35-year duration, an image named as a video, and PyAV's changing ``open``."""

from __future__ import annotations

import io
import json
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest

from gpubatch.api import convert, info, open_dataset
from gpubatch.errors import GpubatchError
from tests.helpers import jpeg_bytes, photo, run_cli
from tests.video.clips import make_clip


@pytest.fixture
def cut(tmp_path):
    """A folder with one whole clip and one 48-frame MP4 (index in front) cut at 80% of its bytes."""
    src = tmp_path / "src"
    make_clip(src / "whole.mp4", 24)
    clip = make_clip(src / "cut.mp4", 48, faststart=True, bframes=0)
    data = clip.read_bytes()
    clip.write_bytes(data[: int(len(data) * 0.8)])
    return src


def _present(clip) -> int:
    from gpubatch.engine.codecs.video_probe import probe

    return probe(clip.read_bytes()).frames


def test_a_video_cut_after_its_index_is_refused_in_pass_through_and_re_encoding(cut, tmp_path):
    for k, opts in enumerate([{}, {"resize_shorter": 32, "to": "video"}]):
        s = convert(cut, tmp_path / f"o{k}", **{"to": "webdataset", **opts})
        assert s.records_out == 1 and len(s.skipped) == 1, s.as_dict()
        assert s.skipped[0]["key"] == "cut" and "cut short" in s.skipped[0]["reason"]
        assert "48 frames" in s.skipped[0]["reason"]
    rep = info(cut)
    assert rep.records == 1 and len(rep.unreadable) == 1 and "cut short" in rep.unreadable[0]["reason"]


def test_the_frames_of_a_video_cut_short_are_written_up_to_the_cut_and_the_rest_listed(cut, tmp_path):
    n = _present(cut / "cut.mp4")
    assert 0 < n < 48
    s = convert(cut, tmp_path / "frames", to="folder", frames="every:1", resize_shorter=16)
    lost = sorted(e["key"] for e in s.skipped)
    assert lost == [f"cut/{i:06d}" for i in range(n, 48)]
    assert all("past the end of the file" in e["reason"] for e in s.skipped)
    assert s.records_out == 24 + n


def test_clips_of_a_video_cut_short_are_kept_where_whole_and_listed_where_not(cut, tmp_path):
    n = _present(cut / "cut.mp4")
    s = convert(cut, tmp_path / "clips", to="webdataset", clip_length=8, resize_shorter=16)
    made = {e["key"] for e in s.skipped}
    assert made == {f"cut/{k:04d}" for k in range(6) if (k + 1) * 8 > n}
    assert s.records_out == 3 + n // 8


def test_an_mp4_index_with_no_media_data_is_no_one_frame_video(tmp_path):
    src = tmp_path / "src"
    clip = make_clip(src / "a.mp4", 24, faststart=True)
    data = clip.read_bytes()
    clip.write_bytes(data[: data.find(b"mdat") + 4])
    make_clip(src / "b.mp4", 12)
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and s.skipped[0]["key"] == "a"


def _huge_mkv(path):
    import av

    with av.open(str(path), "w", format="matroska") as c:
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        packets = []
        for i in range(6):
            f = av.VideoFrame.from_ndarray(photo(48, 64, i), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 24)
            packets += list(s.encode(f))
        packets += list(s.encode())
        packets[-1].pts = packets[-1].dts = int(2**40 / 1000 * 24)  # the last frame stamped 2^40 ms
        for p in packets:
            c.mux(p)
    return path


def test_an_mkv_claiming_a_huge_duration_samples_by_its_frames_in_bounded_memory(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _huge_mkv(src / "huge.mkv")
    assert (src / "huge.mkv").stat().st_size < 20_000
    tracemalloc.start()
    s = convert(src, tmp_path / "out", to="folder", frames="fps:2")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert s.records_out + len(s.skipped) <= 6 and s.records_out >= 1
    assert peak < 200 << 20
    p = run_cli("convert", src, tmp_path / "cli", "--to", "folder", "--frames", "fps:30")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_an_image_named_as_a_video_is_listed_not_written_as_a_member_nothing_reads(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "clip.mp4", 12)
    (src / "photo.mp4").write_bytes(jpeg_bytes(photo(32, 32)))
    s = convert(src, tmp_path / "wds", to="webdataset")
    assert s.records_out == 1 and s.skipped[0]["key"] == "photo"
    assert "an image (jpeg)" in s.skipped[0]["reason"]
    with open_dataset(tmp_path / "wds") as r:
        assert [rec.key for rec in r] == ["clip"]


def test_video_reads_with_a_pyav_whose_open_no_longer_takes_metadata_errors(tmp_path, monkeypatch):
    """PyAV 19 removed ``metadata_errors``: gpubatch asks the installed PyAV what it takes."""
    import av

    from gpubatch.engine.codecs import video_probe

    real = av.open

    def open19(file, mode=None, format=None, options=None, container_options=None, buffer_size=32768,
               timeout=None, io_open=None, **unexpected):
        if unexpected:
            raise TypeError(f"open() got an unexpected keyword argument {next(iter(unexpected))!r}")
        return real(file, mode=mode, format=format, options=options or {}, container_options=container_options or {},
                    buffer_size=buffer_size, timeout=timeout, io_open=io_open)

    monkeypatch.setattr(av, "open", open19)
    video_probe.open_options.cache_clear()
    try:
        assert video_probe.open_options() == ()
        src = tmp_path / "src"
        make_clip(src / "a.mp4", 12)
        s = convert(src, tmp_path / "out", to="folder", frames="every:4", resize_shorter=16)
        assert s.records_out == 3 and not s.skipped
    finally:
        video_probe.open_options.cache_clear()


def test_every_argument_gpubatch_gives_av_open_is_one_the_installed_pyav_takes(tmp_path):
    import av

    from gpubatch.engine.codecs.video_probe import open_input, open_options

    clip = make_clip(tmp_path / "a.mp4", 6)
    with av.open(str(clip), mode="r", **dict(open_options())) as c:  # a TypeError here: the call is wrong
        assert c.streams.video
    with open_input(io.BytesIO(clip.read_bytes())) as c:
        assert c.streams.video
    if tuple(int(x) for x in av.__version__.split(".")[:2]) >= (19, 0):
        assert open_options() == ()


@pytest.mark.parametrize("opts", [
    {"clip_length": 4, "resize_shorter": 16},                               # .npy clips
    {"clip_length": 4, "resize_shorter": 16, "clip_format": "jpeg"},        # image members
    {"clip_length": 4, "resize_shorter": 16, "clip_format": "mp4"},
    {"frames": "every:6", "resize_shorter": 16},
    {},
])
@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "lmdb"])
def test_every_video_output_reads_back(tmp_path, to, opts):
    src = tmp_path / "src"
    make_clip(src / "a.mp4", 12)
    make_clip(src / "b.mp4", 12)
    try:
        s = convert(src, tmp_path / "out", to=to, **opts)
    except Exception as e:  # a format that does not hold this output says so before writing
        assert "holds" in str(e) or "cannot hold" in str(e), e
        return
    assert s.records_out and not s.skipped
    again = convert(tmp_path / "out", tmp_path / "again", to="webdataset")
    assert again.records_out == s.records_out and not again.skipped, again.skipped[:3]
    rep = info(tmp_path / "out")
    assert rep.records == s.records_out and not rep.unreadable, rep.unreadable[:3]
    json.dumps(rep.as_dict(), default=str)


def _members(root) -> dict:
    import hashlib
    import tarfile

    out = {}
    for t in sorted(root.glob("*.tar")):
        with tarfile.open(t) as tf:
            for m in tf.getmembers():
                out[m.name] = hashlib.sha1(tf.extractfile(m).read()).hexdigest()
    return out


def test_mp4_clips_and_re_encoded_videos_are_the_same_bytes_on_every_run(tmp_path):
    src = tmp_path / "src"
    for k in range(4):
        make_clip(src / f"c{k}.mp4", 72, 320, 240)
    runs = []
    for r in range(3):
        convert(src, tmp_path / f"clips{r}", to="webdataset", clip_length=8, clip_format="mp4", resize_shorter=96)
        convert(src, tmp_path / f"video{r}", to="video", resize_shorter=96)
        runs.append((_members(tmp_path / f"clips{r}"),
                     {p.name: p.read_bytes() for p in sorted((tmp_path / f"video{r}").rglob("*.mp4"))}))
    assert len(runs[0][0]) == 4 * 9 * 2 and len(runs[0][1]) == 4
    assert runs[0] == runs[1] == runs[2]


def _with_sound(path, seconds: float = 2.0, codec: str = "aac", fmt: str = "mov", offset: float = 0.0,
                drop: int | None = None, vcodec: str = "libx264"):
    """An H.264 clip with an audio track (a tone), muxed as a camera or phone writes it; ``offset``: seconds
    added to every time (a broadcast's MPEG-TS begins where its clock stood); ``drop``: a sound packet left
    out (as damage that a demuxer passes over loses it)."""
    import av

    rate, fps = 48000, 24
    with av.open(str(path), "w", format=fmt, options={"output_ts_offset": str(offset)} if offset else None) as c:
        v = c.add_stream(vcodec, rate=fps)
        v.width, v.height, v.pix_fmt = 160, 120, "yuv420p"
        a = c.add_stream(codec, rate=rate)
        a.layout = "stereo"
        for i in range(int(seconds * fps)):
            f = av.VideoFrame.from_ndarray(photo(120, 160, i), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, fps)
            for p in v.encode(f):
                c.mux(p)
        t = np.arange(int(seconds * rate)) / rate
        tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(np.stack([tone, tone]), format="fltp", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for i, p in enumerate([*a.encode(frame), *a.encode(None)]):
            if i != drop:
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
    return path


def test_re_encoding_a_video_keeps_its_audio_track(tmp_path):
    import av

    src = tmp_path / "src"
    src.mkdir()
    _with_sound(src / "talk.mov")
    make_clip(src / "silent.mp4", 24)
    s = convert(src, tmp_path / "out", to="video", resize_shorter=64)
    assert s.records_out == 2 and not s.skipped and not any("audio" in w for w in s.warnings)
    out = next((tmp_path / "out").rglob("talk*.mp4"))
    with av.open(str(out)) as c:
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1
        a = c.streams.audio[0]
        assert a.codec_context.name == "aac" and a.codec_context.sample_rate == 48000
        assert abs(float(a.duration * a.time_base) - 2.0) < 0.1 and c.streams.video[0].codec_context.height == 64
    with av.open(str(next((tmp_path / "out").rglob("silent*.mp4")))) as c:
        assert not c.streams.audio


def test_a_re_encoded_video_whose_sound_tables_were_cut_says_its_sound_was_copied_in_part(tmp_path):
    """An MP4's tables are per track: a chunk offset of the sound track's moved past the file's end stopped its
    demuxer at 0.92 s of 2.00 s while every frame was read, and the re-encoded video kept 0.92 s of sound with no
    word (a byte flip, 2026-12-07)."""
    import struct

    import av

    src = tmp_path / "src"
    src.mkdir()
    path = _with_sound(src / "talk.mov")
    data = bytearray(path.read_bytes())
    at = data.find(b"stco", data.find(b"stco") + 1)  # (the sound track's chunk offsets, after the video's)
    assert at > 0 and struct.unpack(">I", data[at + 8:at + 12])[0] > 24
    data[at + 12 + 4 * 23 + 1] = 0xC4  # (its 24th chunk now 12 MB into a file of 56 kB)
    path.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="video", resize_shorter=64)
    assert s.records_out == 1 and not s.skipped
    said = [w for w in s.warnings if "audio track" in w]
    assert len(said) == 1 and "copied in part" in said[0] and "0.92 s of its 2.00 s read (the rest lost to damage)" in said[0], s.warnings
    with av.open(str(next((tmp_path / "out").rglob("talk*.mp4")))) as c:
        assert c.streams.video[0].frames == 48 and len(c.streams.audio) == 1


@pytest.mark.parametrize("start,end", [(0.0, 0.0), (0.5, 1.5)])
def test_a_re_encoded_mpeg_ts_keeps_its_sound_with_its_frames_whatever_time_the_file_begins_at(tmp_path, start, end):
    """An MPEG-TS whose times began at 10 s (as a broadcast's do) was re-encoded with its sound 10 s after its
    frames, past the video's end; a stretch of it (a file list's start and end) got none of its sound."""
    import av

    src = tmp_path / "src"
    src.mkdir()
    _with_sound(src / "news.ts", codec="mp2", fmt="mpegts", offset=10.0)
    (src / "list.txt").write_text(f"news.ts 0 {start} {end}\n" if end else "news.ts 0\n")
    s = convert(src / "list.txt", tmp_path / "out", to="video", resize_shorter=64)
    assert s.records_out == 1 and not s.skipped and not any("audio" in w for w in s.warnings), s.warnings
    with av.open(str(next((tmp_path / "out").rglob("*.mp4")))) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        first = next(p for p in c.demux(a) if p.size)
        lasts = (end - start) if end else 2.0
        assert abs(float(first.pts * a.time_base)) < 0.05, float(first.pts * a.time_base)
        assert abs(float(v.duration * v.time_base) - lasts) < 0.1 and abs(float(a.duration * a.time_base) - lasts) < 0.1


def test_a_re_encoded_avi_whose_sound_chunk_was_damaged_counts_the_sound_packets_its_index_lists(tmp_path):
    """A sound chunk's tag damaged in an AVI: its demuxer left the chunk out and the re-encoded video kept 42 of
    its 43 MP3 packets with no word; its header counts 43."""
    from tests.video.clips import make_clip_with_sound

    src = tmp_path / "src"
    path = make_clip_with_sound(src / "a.avi", "avi", "mpeg4", "libmp3lame")
    data = bytearray(path.read_bytes())
    chunks = [i for i in range(data.rfind(b"idx1")) if data[i:i + 4] == b"01wb"]
    data[chunks[-2]] = 0x3D
    path.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="video", resize_shorter=32)
    assert s.records_out == 1 and not s.skipped
    assert [w for w in s.warnings if "audio track" in w and "42 of its 43 packets read" in w], s.warnings


def test_a_re_encoded_webm_whose_sound_track_header_was_damaged_says_its_sound_was_not_copied(tmp_path):
    """The TrackType of a WebM's Opus track damaged: its demuxer made no stream of it and the re-encoded video had
    no sound, with no word (a byte flip, 2026-12-07). The Tracks element lists two tracks."""
    import av

    from tests.video.clips import make_clip_with_sound

    src = tmp_path / "src"
    path = make_clip_with_sound(src / "a.webm", "webm", "libvpx-vp9", "libopus")
    data = bytearray(path.read_bytes())
    at = data.find(bytes.fromhex("838102"))  # (TrackType 2, the sound's)
    assert at > 0
    data[at + 2] = 0xC0
    path.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="video", resize_shorter=32)
    assert s.records_out == 1 and not s.skipped
    said = [w for w in s.warnings if "audio track" in w]
    assert len(said) == 1 and "not copied: the file lists 2 tracks and its demuxer read 1" in said[0], s.warnings
    with av.open(str(next((tmp_path / "out").rglob("*.mp4")))) as c:
        assert not c.streams.audio and c.streams.video[0].frames == 24


def _flv_tags(data: bytes) -> list[tuple[int, int]]:
    """(where, kind) of each tag of an FLV file."""
    at, tags = int.from_bytes(data[5:9], "big") + 4, []
    while at + 11 <= len(data):
        tags.append((at, data[at] & 0x1F))
        at += 15 + int.from_bytes(data[at + 1:at + 4], "big")
    return tags


@pytest.mark.parametrize("damage", ["mkv track number", "flv sound format", "flv tag kind"])
def test_a_re_encoded_video_counts_the_sound_packets_its_container_holds(tmp_path, damage):
    """Matroska and FLV count no packets in a header: a sound block whose track number the damage changed, a sound
    tag whose format or kind it changed, was passed over by the demuxer, and the re-encoded video lost that sound
    with no word (byte flips, 2026-12-07). The blocks and tags, walked, count 48."""
    from gpubatch.engine.codecs.container_end import _block
    from tests.video.clips import make_clip_with_sound

    src = tmp_path / "src"
    ext = damage.split()[0]
    path = make_clip_with_sound(src / f"a.{ext}", "matroska" if ext == "mkv" else "flv", "libx264", "aac")
    data = bytearray(path.read_bytes())
    if ext == "mkv":
        blocks = [i for i in range(len(data)) if data[i] == 0xA3 and _block(bytes(data), i, len(data), strict=True)]
        sound = [i + _block(bytes(data), i, len(data))[1] for i in blocks
                 if data[i + _block(bytes(data), i, len(data))[1]] == 0x82]
        data[sound[-2]] = 0x85  # (a track the file has not; after the last frame, where the demuxer stops)
    else:
        at = [a for a, kind in _flv_tags(bytes(data)) if kind == 8][20]
        data[at + (11 if damage.endswith("format") else 0)] = 0x2F if damage.endswith("format") else 0x0A
    path.write_bytes(bytes(data))
    s = convert(src, tmp_path / "out", to="video", resize_shorter=32)
    said = [w for w in s.warnings if "audio track" in w]
    assert s.records_out == 1 and len(said) == 1 and "of its 48 packets read" in said[0], s.warnings


def test_sound_packets_of_no_duration_are_given_the_step_between_packets(tmp_path):
    """A Matroska file whose sound packets came with no duration (damage in its first Cluster, a byte flip of
    2026-12-07): the MP4 written beside the re-encoded frames read back 46 of its 47 packets (seed 1 of
    `byte_flips.py --media reencode`, run 31). They now take the step between packets."""
    import av

    from gpubatch.engine.codecs.video_sound import _audio_stream, _fill_durations, _mux_audio, audio_packets
    from tests.video.clips import make_clip_with_sound

    data = make_clip_with_sound(tmp_path / "a.mkv", "matroska", "libx264", "aac").read_bytes()
    source, kept, _ = audio_packets(data)
    steps = [p.duration for p in kept]
    for p in kept:
        p.duration = 0
    _fill_durations(kept)
    assert [p.duration for p in kept] == [21] * len(kept) and sorted(steps)[len(steps) // 2] == 21
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream, _ = _audio_stream(out, source)
        assert _mux_audio(out, stream, kept) == 0
    buf.seek(0)
    with av.open(buf) as c:
        assert sum(1 for p in c.demux(c.streams.audio[0]) if p.size) == len(kept) == 47


@pytest.mark.parametrize("drop", [30, 1])
@pytest.mark.parametrize("fmt,ext", [("mpegts", "ts"), ("mpeg", "mpg")])
def test_a_sound_packet_lost_in_a_stream_format_is_found_by_the_hole_in_its_times(tmp_path, fmt, ext, drop):
    """MPEG-TS and MPEG-PS count no packets: damage that made the demuxer pass over a sound packet or two lost them
    from the re-encoded video with no word (byte flips, 2026-12-07). Their times keep the hole. The second packet
    lost (``drop=1``; seed 21 of `byte_flips.py --media reencode`, 2026-12-07) leaves its hole after the first,
    which begins before the video's first frame and is not copied: the hole is counted over every packet read."""
    src = tmp_path / "src"
    src.mkdir()
    vcodec = "mpeg2video" if ext == "mpg" else "libx264"
    _with_sound(src / f"a.{ext}", codec="mp2", fmt=fmt, drop=drop, vcodec=vcodec)
    s = convert(src, tmp_path / "out", to="video", resize_shorter=32)
    said = [w for w in s.warnings if "audio track" in w]
    assert s.records_out == 1 and len(said) == 1 and "its times skip 1 packet's worth" in said[0], s.warnings
    _with_sound(src / f"a.{ext}", codec="mp2", fmt=fmt, vcodec=vcodec)
    assert not convert(src, tmp_path / "whole", to="video", resize_shorter=32).warnings


def test_a_sound_packet_whose_time_jumped_ahead_is_left_out_alone():
    """A damaged time far ahead, kept, would have shut out every packet after it (each behind it)."""
    from types import SimpleNamespace

    from gpubatch.engine.codecs.video_sound import _holes, _in_order

    def packet(t):
        return SimpleNamespace(pts=t, dts=t, duration=10)

    kept, left = _in_order([packet(t) for t in (0, 10, 20, 99_999, 40, 50, 50, 60)])
    assert [p.dts for p in kept] == [0, 10, 20, 40, 50, 60] and len(left) == 2
    assert _holes(kept) == 1 and _holes([packet(t) for t in (0, 10, 20)]) == 0


def test_a_laced_matroska_block_counts_each_of_its_frames():
    """mkvmerge laces sound (several frames a block), which FFmpeg's muxer does not: a SimpleBlock and a BlockGroup's
    Block of four laced frames count four, an unlaced one one."""
    from gpubatch.engine.codecs.container_end import _block_frames

    laced = bytes([0xA3, 0x88, 0x82, 0, 0, 0x86, 3, 1, 2, 3])  # (track 2, timecode 0, EBML lacing, 4 frames)
    plain = bytes([0xA3, 0x86, 0x82, 0, 0, 0x80, 1, 2])
    group = bytes([0xA0, 0x8A, 0xA1, 0x88, 0x82, 0, 0, 0x02, 3, 1, 2, 3])  # (a BlockGroup's Block, Xiph lacing)
    assert [_block_frames(b, 0, 2, len(b)) for b in (laced, plain, group)] == [4, 1, 4]


def test_an_mp4_cut_inside_its_index_after_the_video_track_is_refused_whole_and_its_frames_written(tmp_path):
    """An MP4 whose index (moov) comes last, cut 3% short: the cut took the sound track's tables, not the video's.
    Every frame read, the file passed through as whole and its re-encode had no sound, with no word (2026-12-07).
    Trailing bytes that are no box are not taken for a cut."""
    from gpubatch.engine.codecs.video_probe import mp4_boxes_cut
    from tests.video.clips import make_clip_with_sound

    whole = make_clip_with_sound(tmp_path / "whole.mp4", "mp4", "libx264", "aac", frames=48).read_bytes()
    assert whole.rfind(b"moov") > whole.rfind(b"mdat") and not mp4_boxes_cut(whole)
    assert not mp4_boxes_cut(whole + bytes(64)) and not mp4_boxes_cut(whole + b"written by a camera's tool\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.mp4").write_bytes(whole[: int(len(whole) * 0.97)])
    for out, opts in (("pass", {}), ("video", {"to": "video", "resize_shorter": 32})):
        with pytest.raises(GpubatchError, match="cut short: its last box runs past its end"):
            convert(src, tmp_path / out, **({"to": "webdataset", "from_format": "video"} | opts))
    s = convert(src, tmp_path / "frames", to="webdataset", from_format="video", frames="every:1")
    assert s.records_out == 48 and not s.skipped
    assert len(s.warnings) == 1 and "cut short: its last box runs past its end" in s.warnings[0]
    rep = info(src)
    assert len(rep.unreadable) == 1 and "cut short: its last box runs past its end" in rep.unreadable[0]["reason"]


def test_sound_packets_out_of_order_are_left_out_of_a_re_encoded_video_and_counted(tmp_path):
    """A damaged MPEG-TS repeated a sound packet's time; the muxer refused it and the whole video was lost to an
    `ArgumentError` (a byte flip, 2026-12-07). Such packets are now left out, and counted."""
    import av

    from gpubatch.engine.codecs.video_sound import _audio_stream, _mux_audio, audio_packets

    data = _with_sound(tmp_path / "talk.mov").read_bytes()
    source, kept, short = audio_packets(data)
    _, again, _ = audio_packets(data)
    assert not short and len(kept) > 60
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream, name = _audio_stream(out, source)
        assert name == "aac"
        assert _mux_audio(out, stream, kept[:50] + [again[20]] + kept[50:]) == 1
    buf.seek(0)
    with av.open(buf) as c:
        assert sum(1 for p in c.demux(c.streams.audio[0]) if p.size) == len(kept)


@pytest.mark.parametrize("ext,codec", [("mkv", "libx264"), ("webm", "libvpx-vp9")])
def test_a_matroska_file_cut_short_is_refused_whole_and_its_frames_past_the_cut_listed(tmp_path, ext, codec):
    """Matroska counts no frames, so a cut one had passed through as if whole, exit 0 and no word: its Segment's
    size tells the cut, its duration how many frames the whole held."""
    src = tmp_path / "src"
    make_clip(src / "whole.mp4", 12)
    clip = make_clip(src / f"cut.{ext}", 36, codec=codec)
    data = clip.read_bytes()
    clip.write_bytes(data[: int(len(data) * 0.6)])
    s = convert(src, tmp_path / "pass", to="webdataset")
    assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["cut"], s.as_dict()
    assert "cut short" in s.skipped[0]["reason"] and "36 frames" in s.skipped[0]["reason"], s.skipped
    n = _present(clip)
    assert 0 < n < 36
    s = convert(src, tmp_path / "frames", to="folder", frames="every:1", resize_shorter=16)
    assert sorted(e["key"] for e in s.skipped) == [f"cut/{i:06d}" for i in range(n, 36)]
    assert s.records_out == 12 + n
    whole = make_clip(tmp_path / f"whole.{ext}", 36, codec=codec).read_bytes()
    assert _present_bytes(whole) == 36  # (a whole file is not taken for a cut one)


def test_a_cut_matroska_file_claiming_a_huge_duration_lists_a_bounded_loss(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "whole.mp4", 12)
    data = _huge_mkv(src / "huge.mkv").read_bytes()
    for cut in (0.7, 0.9):
        (src / "huge.mkv").write_bytes(data[: int(len(data) * cut)])
        tracemalloc.start()
        s = convert(src, tmp_path / f"out{cut}", to="folder", frames="fps:2")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert s.records_out >= 1 and s.skipped, s.as_dict()
        assert all(e["key"].startswith("huge") and "cut short" in e["reason"] for e in s.skipped), s.skipped
        assert peak < 200 << 20


def test_an_mp4_cut_before_its_index_at_its_end_says_so(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "whole.mp4", 12)
    clip = make_clip(src / "cut.mov", 24)  # (the index written last, as a camera does)
    clip.write_bytes(clip.read_bytes()[: int(clip.stat().st_size * 0.6)])
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["cut"], s.as_dict()
    assert "cut short: its index (the moov box" in s.skipped[0]["reason"], s.skipped


def test_a_video_track_without_its_sample_description_is_that_records_error_not_a_traceback(tmp_path):
    """Bits flipped in an MP4's box names left its track with no codec (PyAV's ``codec_context`` None): the run
    had ended in a traceback."""
    src = tmp_path / "src"
    make_clip(src / "whole.mp4", 12)
    clip = make_clip(src / "bad.mp4", 12)
    clip.write_bytes(clip.read_bytes().replace(b"stsd", b"stse", 1))
    for opts in ({}, {"frames": "every:4", "resize_shorter": 16, "to": "folder"}):
        s = convert(src, tmp_path / f"out{len(opts)}", **{"to": "webdataset", **opts})
        assert [e["key"].split("/")[0] for e in s.skipped] == ["bad"], s.as_dict()
        assert "names no codec" in s.skipped[0]["reason"], s.skipped
    p = run_cli("convert", src, tmp_path / "cli", "--to", "webdataset")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def _present_bytes(data: bytes) -> int:
    from gpubatch.engine.codecs.video_probe import probe

    return probe(data).frames


_STREAMED = [("flv", "libx264", {}), ("ts", "libx264", {}), ("mpg", "mpeg2video", {"bframes": 0}),
             ("wmv", "wmv2", {"bframes": 0}), ("mxf", "mpeg2video", {"bframes": 0})]


@pytest.mark.parametrize("ext,codec,opts", _STREAMED, ids=[e for e, _, _ in _STREAMED])
def test_a_file_of_a_container_that_counts_no_frames_cut_short_is_told_by_its_sizes(tmp_path, ext, codec, opts):
    """FLV, MPEG-TS, MPEG-PS, ASF (WMV) and MXF count no frames: a cut one passed through as whole, exit 0 and no word,
    its last frame cut in two. Their header's file size (ASF's file properties) or the packet the
    file ends inside (each tag, TS packet, PES packet, KLV packet) tells it (container_end.py): refused whole, its
    frames before the cut written and the rest listed."""
    src = tmp_path / "src"
    make_clip(src / "whole.mp4", 12)
    clip = make_clip(src / f"cut.{ext}", 36, codec=codec, **opts)
    data = clip.read_bytes()
    assert _present_bytes(data) == 36  # (the whole file is not taken for a cut one)
    for i, at in enumerate((0.35, 0.6, 0.85)):
        clip.write_bytes(data[: int(len(data) * at) | 1])  # (odd: never a whole number of TS packets)
        s = convert(src, tmp_path / f"pass{i}", to="webdataset")
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["cut"], s.as_dict()
        assert "cut short" in s.skipped[0]["reason"], s.skipped
        n = _present(clip)
        assert 0 < n < 36
        s = convert(src, tmp_path / f"frames{i}", to="folder", frames="every:1", resize_shorter=16)
        assert s.records_out == 12 + n and s.skipped, s.as_dict()
        assert all(e["key"].startswith("cut/") and "past the end of the file" in e["reason"] for e in s.skipped)
        assert min(int(e["key"].split("/")[1]) for e in s.skipped) == n


@pytest.mark.parametrize("fmt", ["flv", "mpegts"])
def test_a_whole_file_with_sound_in_a_container_that_counts_no_frames_passes_through(tmp_path, fmt):
    src = tmp_path / "src"
    src.mkdir()
    _with_sound(src / f"talk.{'ts' if fmt == 'mpegts' else fmt}", fmt=fmt)
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and not s.skipped, s.as_dict()


def test_an_flv_file_cut_inside_a_tag_s_size_after_it_is_cut_short(tmp_path):
    """An FLV file ends with its last tag's size (4 bytes). One cut after a tag's data, inside or before those 4 bytes,
    had been passed through as whole, its frames after the cut lost with no word (found by the random cut of
    test_damaged_archives on PyAV 19's FFmpeg: 19 of 24 frames); only a cut just after those 4 bytes looks whole."""
    from gpubatch.engine.codecs.container_end import PACKET, declared_end

    data = make_clip(tmp_path / "c.flv", 24).read_bytes()
    ends, at = [], int.from_bytes(data[5:9], "big") + 4
    while at < len(data):
        at += 11 + int.from_bytes(data[at + 1 : at + 4], "big") + 4
        ends.append(at)
    assert ends[-1] == len(data) and len(ends) > 20
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "ok.flv").write_bytes(data)
    for i, end in enumerate(ends[len(ends) // 2 : len(ends) // 2 + 2]):
        for short in (1, 3, 4):
            assert declared_end(data[: end - short], "flv") == (end, PACKET), (end, short)
        assert declared_end(data[:end], "flv") == (0, "")  # (a cut between tags looks like a shorter file)
        (src / "a" / "x.flv").write_bytes(data[: end - 4])
        s = convert(src, tmp_path / f"out{i}", to="webdataset")
        assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a/x"], s.as_dict()
        assert "cut short" in s.skipped[0]["reason"], s.skipped


def test_an_flv_file_cut_between_two_tags_says_the_frames_its_duration_declares(tmp_path):
    """An FLV file cut exactly between two tags reads as a shorter whole one: ``--frames every:1`` wrote 23 of 48
    frames, and a warning counted 2 lost (the B-frames whose reference the cut took). The duration its onMetaData
    declares (FFmpeg's muxer writes it at the end) tells the rest: each frame after the cut is listed, and a copy of
    the file is its record's error. A file with no duration declared (live-written) is not judged."""
    import struct

    from gpubatch.engine.codecs.container_end import flv_told
    from gpubatch.engine.codecs.video_probe import probe

    data = make_clip(tmp_path / "c.flv", 48, w=64, h=48).read_bytes()
    assert flv_told(data) == (pytest.approx(2.083, abs=0.002), 0.0)
    ends, at = [], int.from_bytes(data[5:9], "big") + 4
    while at < len(data):
        at += 11 + int.from_bytes(data[at + 1 : at + 4], "big") + 4
        ends.append(at)
    cut = data[: ends[len(ends) // 2]]
    whole = probe(data)
    assert whole.frames == 48 and whole.missing == 0 and whole.cut_short == ""
    got = probe(cut)
    assert got.frames + got.skipped + got.missing == 48 and got.missing > 20, (got.frames, got.skipped, got.missing)
    assert got.cut_short.startswith("the file is damaged: its frames end at") and "2.000 s its header" in got.cut_short
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "ok.flv").write_bytes(data)
    (src / "a" / "x.flv").write_bytes(cut)
    s = convert(src, tmp_path / "frames", to="webdataset", frames="every:1", resize_shorter=32)
    lost = [e for e in s.skipped if e["key"].startswith("a/x/")]
    assert s.records_out == 48 + got.frames and len(lost) == got.missing, s.as_dict()
    assert all("its frames end at" in e["reason"] for e in lost)
    s = convert(src, tmp_path / "copy", to="webdataset")
    assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a/x"], s.as_dict()
    assert not s.warnings, s.warnings  # (no "frames it can place are written" for a file refused whole)
    at = cut.index(b"\x00\x08duration\x00") + 11
    live = cut[:at] + struct.pack(">d", 0.0) + cut[at + 8 :]  # (no duration declared: no judgement)
    assert flv_told(live)[0] == 0 and probe(live).missing == 0


def test_a_kinetics_or_clip_csv_row_of_no_time_is_that_rows_error(tmp_path):
    """A Kinetics CSV row whose time_end is inf ended the run in an OverflowError (the clip's name is made of its
    times), a row short of its youtube_id in an AttributeError, and a clip CSV's start of 1e308 reached the reader.
    Each is its row's error now; the other rows convert."""
    kin = tmp_path / "kinetics"
    make_clip(kin / "abseiling" / "abc_000010_000020.mp4", 12)
    make_clip(kin / "zumba" / "xyz_000001_000011.mp4", 12)
    (kin / "train.csv").write_text("label,youtube_id,time_start,time_end,split\nabseiling,abc,10,20,train\n"
                                   "zumba,xyz,1,inf,train\nzumba\nzumba,xyz,-5,11,train\n")
    s = convert(kin / "train.csv", tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and sorted(e["key"] for e in s.skipped) == ["row 3", "row 4", "row 5"], s.as_dict()
    assert all(e["reason"].startswith("bad row: ") for e in s.skipped), s.skipped
    clips = tmp_path / "clips"
    make_clip(clips / "x.mp4", 12)
    (clips / "meta.csv").write_text("path,label,start,end\nx.mp4,dog,0,0\nx.mp4,cat,1e308,0\nx.mp4,cat,0,nan\n")
    s = convert(clips / "meta.csv", tmp_path / "out2", to="webdataset")
    assert s.records_out == 1 and sorted(e["key"] for e in s.skipped) == ["row 3", "row 4"], s.as_dict()
    assert "is no time in seconds" in s.skipped[0]["reason"], s.skipped


def _ebml_blocks(data: bytes) -> list[int]:
    """Where each SimpleBlock's size field lies in a Matroska file (a walk into its Segment and Clusters)."""
    def vint(i: int, marker: bool) -> tuple[int, int]:
        n = 9 - data[i].bit_length()
        v = int.from_bytes(data[i : i + n], "big")
        return (v if marker else v & ~(1 << (7 * n))), i + n

    out, i = [], 0
    while i < len(data) - 2:
        eid, j = vint(i, True)
        size, k = vint(j, False)
        if eid == 0xA3:
            out.append(j)
        if eid in (0x18538067, 0x1F43B675):  # (Segment, Cluster: their children)
            i = k
        else:
            i = k + size
    return out


@pytest.mark.parametrize("ext,codec", [("webm", "libvpx-vp9"), ("mkv", "libx264")])
def test_a_matroska_file_whose_frames_end_at_a_damaged_block_says_the_frames_after_it_are_lost(tmp_path, ext, codec):
    """A block's size field damaged in a Matroska file: FFmpeg's demuxer ends there without an error, and the
    frames after it had been lost without a word (``--frames every:1`` wrote 15 of 24, no record listed). The
    Segment's Duration tells: the frames missing are each listed, and a copy of the file is its record's error."""
    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    clip = make_clip(src / f"a.{ext}", 24, w=64, h=48, codec=codec)
    data = bytearray(clip.read_bytes())
    blocks = _ebml_blocks(bytes(data))
    assert len(blocks) == 24
    data[blocks[12]] = 0  # (no valid size: the demuxer stops there)
    clip.write_bytes(bytes(data))
    got = probe(bytes(data))
    assert got.missing and got.frames + got.missing in (23, 24, 25) and "damaged" in got.cut_short
    s = convert(src, tmp_path / "frames", to="webdataset", frames="every:1", resize_shorter=32)
    assert s.records_out == got.frames and len(s.skipped) == got.missing
    assert all("the file is damaged: its frames end at" in e["reason"] for e in s.skipped)
    whole = tmp_path / "src2"
    make_clip(whole / f"b.{ext}", 24, w=64, h=48, codec=codec)
    (whole / f"a.{ext}").write_bytes(bytes(data))
    s = convert(whole, tmp_path / "copy", to="webdataset")
    assert s.records_out == 1 and [e["key"] for e in s.skipped] == ["a"]
    assert probe((whole / f"b.{ext}").read_bytes()).missing == 0  # (a whole file is not taken for a damaged one)


@pytest.mark.parametrize("damage", ["lacing", "id", "track"])
@pytest.mark.parametrize("ext,codec", [("webm", "libvpx-vp9"), ("mkv", "libx264")])
def test_a_matroska_file_stopped_at_a_damaged_block_with_no_duration_lists_the_blocks_after_it(tmp_path, ext, codec,
                                                                                               damage):
    """Byte flips in WebM files, their Segment's Duration gone, frames lost with no word:
    - a block's lacing flags damaged: FFmpeg's demuxer stops there ("Error parsing frame sizes"), 6 of 24 written;
    - a block's element ID damaged: it stops there too ("exceeds containing master element"), 19 of 24;
    - a block's track number damaged: FFmpeg passes over a block of no track, 22 of 24.
    The Clusters' blocks after the last one read (of its track, or of none) are counted from their sizes, past a
    damaged element to the next whole block: each frame missing is listed."""
    from gpubatch.engine.codecs.container_end import matroska_blocks_after
    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    clip = make_clip(src / f"a.{ext}", 24, w=64, h=48, codec=codec)
    data = bytearray(clip.read_bytes())
    first = _ebml_blocks(bytes(data))[0]
    first += 9 - data[first].bit_length()  # (the first block's data: its track number)
    assert matroska_blocks_after(bytes(data), first) == 23 and probe(bytes(data)).missing == 0
    at = data.index(bytes.fromhex("4489"))  # (the Info's Duration, a float of 8 bytes, made a Void element)
    assert data[at + 2] == 0x88
    data[at : at + 2] = bytes.fromhex("ec89")  # (a Void of 9 bytes: the size byte and the float)
    block = _ebml_blocks(bytes(data))[{"lacing": 6, "id": 18, "track": 22}[damage]]
    size = 9 - data[block].bit_length()
    if damage == "lacing":  # (EBML lacing, 4 frames, and no valid size for the first)
        data[block + size + 3] |= 0x06
        data[block + size + 4 : block + size + 6] = b"\x03\x00"
    elif damage == "id":
        data[block - 1] = 0x3A
    else:
        data[block + size] = 0x88
    clip.write_bytes(bytes(data))
    got = probe(bytes(data))
    assert got.frames < 24 and got.frames + got.missing == 24 and got.stopped and not got.declared
    assert f"its demuxer stops at a damaged block after {got.frames} frames ({got.missing} blocks after it unread)" \
        in got.cut_short
    s = convert(src, tmp_path / "frames", to="webdataset", frames="every:1", resize_shorter=32)
    assert s.records_out == got.frames and len(s.skipped) == got.missing


def test_a_matroska_file_with_sound_and_a_damaged_info_lists_the_video_blocks_after_the_damaged_one(tmp_path):
    """Byte flips in a WebM file of video and sound: its Info element's size damaged (no Duration, and the
    Segment's children no longer walk by their sizes) and a video block's lacing, where FFmpeg's demuxer stopped: 6
    of 24 frames written with no word. The walk goes on at the next Cluster, and from a damaged block to the next
    whole one (checked against the blocks after it, as bytes of a block's data may look like one); the video
    track's blocks after the last one read are counted, the sound's are not."""
    from gpubatch.engine.codecs.container_end import _segment, _vint
    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    src.mkdir()
    path = _with_sound(src / "a.mkv", seconds=1.0, fmt="matroska")
    data = bytearray(path.read_bytes())

    def children(at: int, end: int):  # (id, where its size field begins, where its data begins, its size)
        while at < end:
            ident, n, _ = _vint(bytes(data), at, True)
            size, m, _ = _vint(bytes(data), at + n, False)
            yield ident, at + n, at + n + m, size
            at += n + m + size

    top = list(children(_segment(bytes(data))[0], len(data)))
    video = [inner for ident, _, at, size in top if ident == 0x1F43B675
             for kid, _, inner, _ in children(at, at + size) if kid == 0xA3 and data[inner] == 0x81]
    assert len(video) == 24
    _, field, inner, _ = next(k for k in top if k[0] == 0x1549A966)  # (the Info: its size made another)
    data[field:inner] = bytes([0xFF >> (inner - field - 1)] + [0xFF] * (inner - field - 1))[:-1] + b"\xf0"
    data[video[5] + 3] |= 0x06  # (EBML lacing, 4 frames, no valid size for the first: the demuxer stops)
    data[video[5] + 4 : video[5] + 6] = b"\x03\x00"
    path.write_bytes(bytes(data))
    got = probe(bytes(data))
    assert got.frames < 24 and got.frames + got.missing == 24 and got.stopped, (got.frames, got.missing)
    s = convert(src, tmp_path / "frames", to="webdataset", frames="every:1", resize_shorter=32)
    assert s.records_out == got.frames and len(s.skipped) == got.missing


def test_an_avi_with_an_empty_index_entry_is_a_whole_file(tmp_path):
    """FFmpeg's AVI muxer (and VirtualDub, for each dropped frame) writes an empty chunk where timestamps skip, so
    that the stream keeps its rate: the stream's length counts it, no demuxer gives a packet for it. Such a whole
    file had been taken for one cut short (2 frames listed missing, refused in a pass-through) and its skip for
    damage. Its index's empty entries are counted as frames repeated."""
    import av

    from gpubatch.engine.codecs.container_end import avi_null_frames
    from gpubatch.engine.codecs.video_probe import probe
    from tests.video.clips import frame

    src = tmp_path / "src"
    src.mkdir()
    path = src / "a.avi"
    with av.open(str(path), "w") as c:
        v = c.add_stream("mpeg4", rate=24)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        for i in [0, *range(2, 25)]:  # (the frame at 1/24 s never given: the muxer writes an empty chunk there)
            f = av.VideoFrame.from_ndarray(frame(i, 48, 64), format="rgb24")
            f.pts, f.time_base = i, Fraction(1, 24)
            for p in v.encode(f):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
    data = path.read_bytes()
    assert avi_null_frames(data, 0) == 1
    got = probe(data)
    assert got.frames == 24 and got.missing == 0 and got.skipped == 0 and not got.cut_short
    s = convert(src, tmp_path / "copy", to="webdataset")
    assert s.records_out == 1 and not s.skipped
    s = convert(src, tmp_path / "frames", to="webdataset", frames="every:1", resize_shorter=32)
    assert s.records_out == 24 and not s.skipped and not s.warnings


def test_an_index_counting_billions_of_frames_is_planned_in_bounded_memory(tmp_path):
    """An MP4 whose sample-time table counts 2,751,463,424 frames (a damaged byte): the frames it lacks had each
    been planned, 22 GB of arrays, and the run's worker was killed by the out-of-memory killer. At most
    ``MAX_MISSING`` are taken as missing, and the header's own count is said."""
    import struct

    from gpubatch.engine.codecs.video_probe import MAX_MISSING, probe

    src = tmp_path / "src"
    clip = make_clip(src / "a.mp4", 24, w=64, h=48)
    data = bytearray(clip.read_bytes())
    at = data.index(b"stts") + 12  # (its first entry's sample count)
    data[at : at + 4] = struct.pack(">I", 0xA4000000)
    clip.write_bytes(bytes(data))
    got = probe(bytes(data))
    assert got.missing == MAX_MISSING and "2,751,463,424 frames" in got.cut_short
    tracemalloc.start()
    try:
        make_clip(src / "b.mp4", 24, w=64, h=48)
        s = convert(src, tmp_path / "out", to="webdataset", frames="every:1", resize_shorter=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert s.records_out >= 24 + got.frames - 1 and len(s.skipped) >= MAX_MISSING
    assert peak < 1 << 30


def _flv_video_tags(data: bytes) -> list[int]:
    """Where each video tag's data begins in an FLV file (its first byte: frame type and codec)."""
    out, i = [], 9 + 4
    while i + 11 <= len(data):
        size = int.from_bytes(data[i + 1 : i + 4], "big")
        if data[i] == 9:
            out.append(i + 11)
        i += 11 + size + 4
    return out


def test_frames_a_damaged_flv_tag_takes_out_of_the_stream_are_said(tmp_path):
    """One byte of an FLV video tag damaged (its codec nibble): FFmpeg takes the tag for a new stream, and the
    video had 23 frames of 24 with no word. The frames' timestamps skip one interval of a steady rate: a warning
    says how many frames the damage took and from when; a steady video says nothing, nor does a variable rate."""
    import numpy as np

    from gpubatch.engine.codecs.video_probe import _skips, probe

    src = tmp_path / "src"
    clip = make_clip(src / "a.flv", 24, w=64, h=48)
    data = bytearray(clip.read_bytes())
    assert probe(bytes(data)).skipped == 0
    tags = _flv_video_tags(bytes(data))
    assert len(tags) >= 24
    data[tags[-6]] = 0xA4
    clip.write_bytes(bytes(data))
    got = probe(bytes(data))
    assert got.frames == 23 and got.skipped == 1
    s = convert(src, tmp_path / "out", to="webdataset", frames="every:1", resize_shorter=32)
    if s.skipped:  # (frames that referred to the lost one: the source's one error says how many outputs it cost)
        assert s.skipped[0]["key"] == "a" and s.skipped[0]["reason"].endswith(f"({23 - s.records_out} of its outputs "
                                                                              "not written)")
    assert any(w.startswith("a: 1 frame lost to damage in the file") for w in s.warnings), s.warnings
    assert "1 video lost 1 frame to damage" in " ".join(info(src).warnings)
    times = np.cumsum(np.r_[0, np.full(30, 1 / 30)])
    assert _skips(times, np.diff(times)) == (0, 0.0, 0.0, 0.0)
    vfr = np.cumsum(np.r_[0, np.random.default_rng(0).uniform(0.01, 0.05, 30)])
    assert _skips(vfr, np.diff(vfr)) == (0, 0.0, 0.0, 0.0)
    holed = np.delete(times, [7, 20])
    assert _skips(holed, np.diff(holed)) == (2, pytest.approx(7 / 30), 0.0, 0.0)


def _ts_frames(data: bytes) -> list[tuple[int, list[int]]]:
    """Each video PES of an MPEG-TS file (PID 0x100, as FFmpeg's muxer numbers it): its PTS and the offsets of its
    188-byte TS packets."""
    out: list[tuple[int, list[int]]] = []
    for i in range(0, len(data), 188):
        if ((data[i + 1] & 0x1F) << 8 | data[i + 2]) != 0x100:
            continue
        if data[i + 1] & 0x40:  # (a PES begins here: its PTS after the adaptation field, if any)
            h = i + 4 + (1 + data[i + 4] if data[i + 3] & 0x20 else 0) + 9
            b = data[h : h + 5]
            out.append(((b[0] >> 1 & 7) << 30 | b[1] << 22 | (b[2] >> 1) << 15 | b[3] << 7 | b[4] >> 1, []))
        out[-1][1].append(i)
    return out


def test_a_frame_an_mpeg_ts_file_lost_in_presentation_order_last_is_said(tmp_path):
    """Byte flips took one TS packet's PES out of an MPEG-TS file: the frame presented last, so the presentation
    timestamps ran steady to their end and 23 frames of 24 were written with no word. The decoding timestamps,
    steady with B-frames too, keep a hole where it was: a warning says a frame was lost."""
    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    clip = make_clip(src / "a.ts", 24, w=64, h=48)
    data = bytearray(clip.read_bytes())
    assert probe(bytes(data)).skipped == 0
    frames = _ts_frames(bytes(data))
    assert len(frames) == 24
    for i in max(frames)[1]:  # (the last frame presented, not the last decoded: its TS packets made null ones)
        data[i + 1 : i + 3] = b"\x1f\xff"
    clip.write_bytes(bytes(data))
    got = probe(bytes(data))
    assert got.frames == 23 and got.skipped == 1
    s = convert(src, tmp_path / "out", to="webdataset", frames="every:1", resize_shorter=32)
    assert s.records_out == 23 and any(w.startswith("a: 1 frame lost to damage in the file") for w in s.warnings)
    from gpubatch.engine.codecs.video_probe import _lost_in_decoding_order

    dts = np.arange(24, dtype=np.int64) * 3750
    assert _lost_in_decoding_order(dts, 1 / 90000) == (0, 0.0)
    damaged = np.delete(dts, 22)
    damaged[11] = 2147524898  # (a packet's own decoding timestamp damaged as well: it fills its own hole)
    assert _lost_in_decoding_order(damaged, 1 / 90000)[0] == 1
    damaged[11] = damaged[10]  # (or made another's)
    assert _lost_in_decoding_order(damaged, 1 / 90000)[0] == 1


@pytest.mark.parametrize("ext", ["mkv", "mp4"])
def test_timestamps_that_jump_off_a_steady_rate_are_said(tmp_path, ext):
    """Damage that moves an MPEG program stream's timestamps (found by byte flips: 23 frames of 24 written, the
    timestamps after the damage 0.517 s on, no word) leaves a steady rate whose timestamps jump by no whole number
    of frames; how many frames went cannot be counted. Such a jump is said in a warning, by `convert` and `info`,
    here made with timestamps written so; a steady clip says nothing."""
    from gpubatch.engine.codecs.video_probe import _skips, probe

    times = [i / 24 + (0.517 if i >= 12 else 0.0) for i in range(24)]
    src = tmp_path / "src"
    clip = make_clip(src / f"a.{ext}", 24, w=64, h=48, bframes=0, times=times)
    got = probe(clip.read_bytes())
    assert got.frames == 24 and got.skipped == 0
    assert got.jump == pytest.approx(0.517 + 1 / 24, abs=2e-3) and got.jump_at == pytest.approx(11 / 24, abs=2e-3)
    s = convert(src, tmp_path / "out", to="webdataset", frames="every:1", resize_shorter=32)
    assert s.records_out == 24 and not s.skipped
    assert any(w.startswith("a: its timestamps jump 0.559 s at 0.458 s") for w in s.warnings), s.warnings
    assert "1 video's timestamps jump off a steady rate" in " ".join(info(src).warnings)
    steady = make_clip(tmp_path / "steady" / f"b.{ext}", 24, w=64, h=48, bframes=0)
    assert probe(steady.read_bytes()).jump == 0.0
    assert not convert(steady.parent, tmp_path / "out2", to="webdataset", frames="every:1").warnings
    spliced = np.r_[times[:12], np.asarray(times[12:]) + 0.01]  # (a gap of 1.3 intervals: jitter, not judged)
    assert _skips(spliced - 0.517 * (np.arange(24) >= 12), np.diff(spliced - 0.517 * (np.arange(24) >= 12)))[2] == 0


@pytest.mark.parametrize("ext,sound_codec,sample", [("mkv", "flac", "s16"), ("flv", "aac", "fltp")])
def test_a_file_whose_sound_outlasts_its_video_is_whole(tmp_path, ext, sound_codec, sample):
    """A Matroska Segment's duration, and an FLV onMetaData's, is the longest track's: a 1-s video beside 3 s of
    sound is a whole file, not one whose frames end at a damaged block or a cut (Matroska: only a file of one video
    stream is judged by it; FLV: its sound's last tag is its end too)."""
    import av

    from gpubatch.engine.codecs.video_probe import probe

    path = tmp_path / "src" / f"a.{ext}"
    path.parent.mkdir()
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=24)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        a = c.add_stream(sound_codec, rate=16000)
        a.layout = "mono"
        for i in range(24):
            img = np.full((48, 64, 3), i * 10, np.uint8)
            for p in v.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in v.encode():
            c.mux(p)
        n = a.codec_context.frame_size or 1024
        for t in range(0, 3 * 16000, n):  # (3 s of silence, a frame of the encoder's size at a time)
            sound = av.AudioFrame.from_ndarray(np.zeros((1, n), np.dtype(np.int16 if sample == "s16" else np.float32)),
                                               format=sample, layout="mono")
            sound.sample_rate, sound.pts = 16000, t
            for p in a.encode(sound):
                c.mux(p)
        for p in a.encode():
            c.mux(p)
    got = probe(path.read_bytes())
    assert got.frames == 24 and got.missing == 0 and got.cut_short == ""
    if ext == "flv":  # (the last sound tag, read back from the file's end)
        from gpubatch.engine.codecs.container_end import flv_told

        told, sound = flv_told(path.read_bytes())
        assert told > 2.9 and 2.9 < sound <= told, (told, sound)
    s = convert(path.parent, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and not s.skipped


@pytest.mark.parametrize("opts", [{"frames": "every:1"}, {}])
def test_a_fragmented_mp4_with_no_index_of_its_fragments_at_its_end_is_said(tmp_path, opts):
    """A fragmented MP4 (as live recorders write: ``moof`` boxes, each with its frames' tables) cut exactly between
    two fragments, or left by a writer that stopped, read as a shorter whole file: 24 of 48 frames written, or passed
    through, with no word (2026-12-07). FFmpeg's muxer writes an index of the fragments last (``mfra``): whole, no
    warning; without it, its end is said to be unknown, and what it holds is written."""
    from tests.helpers import mp4_boxes

    path = make_clip(tmp_path / "src" / "a" / "f.mp4", 48, movflags="frag_keyframe+empty_moov")
    data = path.read_bytes()
    boxes = mp4_boxes(data)
    assert [k for k, _ in boxes].count(b"moof") == 4 and boxes[-1][0] == b"mfra"
    s = convert(tmp_path / "src", tmp_path / "whole", to="webdataset", device="cpu", **opts)
    assert s.records_out == (48 if opts else 1) and not s.warnings and not s.skipped
    path.write_bytes(data[: [a for k, a in boxes if k == b"moof"][2]])  # (two whole fragments of four)
    s = convert(tmp_path / "src", tmp_path / "cut", to="webdataset", device="cpu", **opts)
    assert s.records_out == (24 if opts else 1) and not s.skipped
    assert len(s.warnings) == 1 and "fragmented MP4 with no index of its fragments" in s.warnings[0], s.warnings
    assert "(what it holds is written)" in s.warnings[0]
    path.write_bytes(data[: [a for k, a in boxes if k == b"moof"][2] + 99])  # (cut inside the third fragment's moof)
    lost = "the file is cut short: its last box runs past its end: a fragment (moof, mdat) of it, and what came after"
    if opts:  # (the frames before the cut written, the loss said; never "every video frame is in it")
        s = convert(tmp_path / "src", tmp_path / "inside", to="webdataset", device="cpu", **opts)
        assert s.records_out == 24 and len(s.warnings) == 1 and lost in s.warnings[0], s.warnings
    else:  # (a copy refused: the one record's error)
        with pytest.raises(GpubatchError, match=r"\(1 x decode: the file is cut short: .* a fragment \(moof, mdat\)"):
            convert(tmp_path / "src", tmp_path / "inside", to="webdataset", device="cpu", **opts)
