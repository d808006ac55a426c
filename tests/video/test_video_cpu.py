"""Video on the CPU: sampling math, every source layout, frames and clips outputs read back by the
webdataset library and the tfrecord package, augment with one set of parameters per clip, re-encode,
``info``, and bad input (a per-file skip with its reason, the rest converts)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gpubatch.api import augment, convert, info, open_dataset
from gpubatch.errors import GpubatchError, RecordError, UsageError

from .clips import class_folders, frame, make_clip

av = pytest.importorskip("av")


def _info(n: int, fps: float = 24.0, keyframes=(0,), times=None):
    t = np.arange(n) / fps if times is None else np.asarray(times, float)
    return SimpleNamespace(frames=n, times=t, keyframes=tuple(keyframes), fps=fps,
                           duration=float(t[-1] + (t[-1] - t[-2] if n > 1 else 1 / fps)))


# --- sampling ----------------------------------------------------------------------------------------------

def test_frame_samplers():
    from gpubatch.engine.ops.temporal import FrameSampler

    inf = _info(100, 25.0, keyframes=(0, 25, 50, 75))
    assert FrameSampler.parse("every:30").indices(inf) == [0, 30, 60, 90]
    assert FrameSampler.parse("keyframes").indices(inf) == [0, 25, 50, 75]
    assert FrameSampler.parse("uniform:4").indices(inf) == [12, 37, 62, 87]
    assert FrameSampler.parse("uniform:500").indices(inf) == list(range(100))
    assert FrameSampler.parse("fps:5").indices(inf) == list(range(0, 100, 5))
    # a variable frame rate is sampled by time, not by index: 10 frames in the first second, 2 after
    vfr = _info(14, times=[k / 10 for k in range(10)] + [1.0, 1.5, 2.0, 2.5])
    assert FrameSampler.parse("fps:2").indices(vfr) == [0, 5, 10, 11, 12, 13]
    for bad in ("every:0", "every:1.5", "fps:-1", "uniform:x", "sometimes:3", "keyframes:2"):
        with pytest.raises(UsageError):
            FrameSampler.parse(bad)


def test_clip_samplers_and_their_draws():
    from gpubatch.engine.ops.temporal import ClipSampler

    inf = _info(40)
    assert ClipSampler(8, 2).clips(inf, "k", 0) == [list(range(0, 15, 2)), list(range(16, 31, 2))]
    assert ClipSampler(8, 1, stride=10).clips(inf, "k", 0)[:2] == [list(range(0, 8)), list(range(10, 18))]
    assert ClipSampler(4, 1, positions="uniform", count=3).clips(inf, "k", 0) == [[0, 1, 2, 3], [18, 19, 20, 21],
                                                                                 [36, 37, 38, 39]]
    rnd = ClipSampler(4, 3, positions="random", count=5, step_jitter=1)
    a, b = rnd.clips(inf, "k", 7), rnd.clips(inf, "k", 7)
    assert a == b and a != rnd.clips(inf, "k", 8) and a != rnd.clips(inf, "other", 7)  # by seed and key
    for clip in a:
        steps = set(np.diff(clip))
        assert len(clip) == 4 and len(steps) == 1 and steps.pop() in (2, 3, 4) and clip[-1] < 40
    assert ClipSampler(16, 4).clips(_info(40), "k", 0) == []  # 61 frames a clip: too short
    with pytest.raises(UsageError, match="--clip-length"):
        ClipSampler(0)


def test_options_that_do_not_go_together_are_refused(tmp_path):
    src = class_folders(tmp_path / "src")
    for opts, match in (({"frames": "every:2", "clip_length": 4}, "give one"),
                        ({"clip_stride": 3}, "give clip_length too"),
                        ({"video_codec": "h264_nvenc", "resize_shorter": 32}, "NVENC"),
                        ({"frames": "every:2", "fps": 5.0}, "writes images")):
        with pytest.raises(UsageError, match=match):
            convert(src, tmp_path / "out", to="webdataset", device="cpu", **opts)
        assert not (tmp_path / "out").exists()


# --- layouts -----------------------------------------------------------------------------------------------

def _keys(path: Path, **kw) -> dict[str, int | None]:
    from gpubatch.api import open_dataset

    with open_dataset(path, **kw) as r:
        return {rec.key: rec.label for rec in r}


def test_every_source_layout(tmp_path):
    root = class_folders(tmp_path / "ucf")
    assert _keys(root) == {"jump/j1": 0, "jump/j2": 0, "walk/w1": 1, "walk/w2": 1}
    flat = tmp_path / "flat"
    make_clip(flat / "a.mp4", 10)
    make_clip(flat / "b.webm", 10, codec="libvpx-vp9", bframes=0)
    assert _keys(flat) == {"a": None, "b": None}
    # DALI's file list: path label [start end], relative or absolute paths
    (flat / "file_list.txt").write_text(f"a.mp4 3 0.1 0.3\n{flat / 'b.webm'} 1\nc.mp4 x\n\n")
    from gpubatch.api import open_dataset

    with open_dataset(flat) as r:
        recs, errs = [], []
        for e in r.entries():
            try:
                recs.append(r.read(e))
            except RecordError as err:
                errs.append(err)
    assert [(x.key, x.label, x.meta.get("start"), x.meta.get("end")) for x in recs] == [("a", 3, 0.1, 0.3),
                                                                                        ("b", 1, None, None)]
    assert len(errs) == 1 and "line 3" in errs[0].key
    # a CSV of path,label,start,end with class names
    (tmp_path / "csvset").mkdir()
    make_clip(tmp_path / "csvset" / "x.mp4", 10)
    make_clip(tmp_path / "csvset" / "sub" / "y.mp4", 10)
    (tmp_path / "csvset" / "meta.csv").write_text("path,label,start,end\nx.mp4,dog,0,0\nsub/y.mp4,cat,0.1,0.3\n")
    assert _keys(tmp_path / "csvset") == {"x": 1, "sub/y": 0}
    # Kinetics' CSV: label,youtube_id,time_start,time_end,split -> <label>/<id>_<start>_<end>.mp4
    kin = tmp_path / "kinetics"
    make_clip(kin / "abseiling" / "abc_000010_000020.mp4", 10)
    make_clip(kin / "zumba" / "xyz_000001_000011.mp4", 10)
    (kin / "train.csv").write_text("label,youtube_id,time_start,time_end,split\nabseiling,abc,10,20,train\n"
                                   "zumba,xyz,1,11,train\n")
    assert _keys(kin) == {"abseiling/abc_000010_000020": 0, "zumba/xyz_000001_000011": 1}


def test_one_video_file_is_a_dataset_of_one_clip(tmp_path):
    """``gpubatch convert talk.mp4 frames --frames every:8``: one video file given alone is the source (it was
    "cannot tell the format", and with --from video read as a file list of binary lines); an output beside it is
    no overlap."""
    clip = make_clip(tmp_path / "talk.mp4", 24)
    assert info(clip).records == 1 and info(clip).format == "video"
    s = convert(clip, tmp_path / "frames", to="folder", frames="every:8")
    assert s.records_in == 1 and s.records_out == 3 and not s.skipped
    assert sorted(p.name for p in (tmp_path / "frames").rglob("*.jpg")) == [
        "talk_000000.jpg", "talk_000008.jpg", "talk_000016.jpg"]
    assert convert(clip, tmp_path / "wds", to="webdataset").records_out == 1
    # a DALI video list read as an image folder's file list: one line, not a record "not found" a line
    (tmp_path / "file_list.txt").write_text("talk.mp4 0 0.0 0.5\n")
    with pytest.raises(GpubatchError, match="file_list.txt lists video files \\(1 of 1 lines\\), not images: read it "
                                            "with from_format video"):
        info(tmp_path, "folder")


def test_a_tar_of_class_folders_of_clips_reads_with_from_video(tmp_path):
    """A tar of a video folder's tree (``ucf/<action>/<clip>.mp4``) reads with --from video as once extracted."""
    import tarfile

    root = class_folders(tmp_path / "ucf")
    src = tmp_path / "ucf.tar"
    with tarfile.open(src, "w") as t:
        t.add(root, "ucf")
    assert any("pass --from video" in w for w in convert(src, tmp_path / "shards", to="webdataset").warnings)
    with open_dataset(src, "video") as r:
        assert {rec.key: rec.label for rec in r} == {"jump/j1": 0, "jump/j2": 0, "walk/w1": 1, "walk/w2": 1}


def test_start_and_end_restrict_the_frames(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "a.mp4", 48)  # 2 s at 24 fps
    (src / "file_list.txt").write_text("a.mp4 0 1.0 1.5\n")
    s = convert(src, tmp_path / "out", to="folder", frames="every:1", device="cpu", layout="flat")
    idx = sorted(int(p.stem.rsplit("_", 1)[1]) for p in (tmp_path / "out").glob("*.jpg"))
    assert idx == list(range(24, 37)) and s.records_out == 13


# --- outputs -----------------------------------------------------------------------------------------------

def test_passthrough_to_webdataset_keeps_the_bytes_and_the_webdataset_library_reads_it(tmp_path):
    wds = pytest.importorskip("webdataset")
    src = class_folders(tmp_path / "src")
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.passthrough == 4 and s.transcoded == 0 and s.device == "cpu"
    shards = [str(p) for p in sorted((tmp_path / "out").glob("*.tar"))]
    got = {d["__key__"]: d for d in wds.WebDataset(shards, shardshuffle=False)}
    assert got["jump/j1"]["mp4"] == (src / "jump" / "j1.mp4").read_bytes()
    assert got["walk/w2"]["mkv"] == (src / "walk" / "w2.mkv").read_bytes()
    assert int(got["walk/w1"]["cls"]) == 1
    again = convert(tmp_path / "out", tmp_path / "back", to="video")  # and back to a folder of clips
    assert again.passthrough == 4 and (tmp_path / "back" / "walk" / "w2.mkv").read_bytes() == (
        src / "walk" / "w2.mkv").read_bytes()
    assert "walk/w1.mp4 1" in (tmp_path / "back" / "file_list.txt").read_text()


def _closest(img: np.ndarray, n: int) -> int:
    h, w = img.shape[:2]
    return int(np.argmin([np.abs(img.astype(int) - frame(i, h, w)).mean() for i in range(n)]))


@pytest.mark.parametrize("frames", ["every:1", "every:5"])
def test_an_mpeg_program_stream_that_times_one_frame_in_four_gives_every_frame_in_its_place(tmp_path, frames):
    """FFmpeg's MPEG-PS muxer times one H.264 frame in four (MPEG streams need a time every 0.7 s at most): the frames
    with none were taken for damaged ones, 11 of 48 written with a warning that 37 were lost (2026-12-07). Each is
    placed on the grid of the timed ones, in turn; a stride seeks to keyframes between them."""
    from PIL import Image

    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    path = make_clip(src / "cls" / "v.mpg", 48, 96, 64, gop=12)
    info = probe(path.read_bytes())
    assert info.frames == 48 and info.placed > 30 and not info.skipped and abs(info.fps - 24) < 0.01
    s = convert(src, tmp_path / "out", to="folder", frames=frames, device="cpu")
    want = list(range(0, 48, int(frames.split(":")[1])))
    assert s.records_out == len(want) and not s.skipped and not s.warnings, s.warnings
    files = sorted((tmp_path / "out" / "cls").glob("*.jpg"))
    assert [_closest(np.asarray(Image.open(f).convert("RGB")), 48) for f in files] == want


def test_frames_are_the_right_frames_with_their_metadata(tmp_path):
    from PIL import Image

    src = tmp_path / "src"
    make_clip(src / "cls" / "v.mp4", 36, 96, 64, gop=8)
    s = convert(src, tmp_path / "out", to="folder", frames="every:7", device="cpu")
    assert s.records_out == 6 and not s.skipped
    files = sorted((tmp_path / "out" / "cls").glob("*.jpg"))
    assert [f.name for f in files] == [f"v_{i:06d}.jpg" for i in range(0, 36, 7)]
    for f in files:
        i = int(f.stem.rsplit("_", 1)[1])
        assert _closest(np.asarray(Image.open(f).convert("RGB")), 36) == i
    s = convert(src, tmp_path / "wds", to="webdataset", frames="keyframes", device="cpu")
    with tarfile.open(next((tmp_path / "wds").glob("*.tar"))) as t:
        names = t.getnames()
        doc = json.loads(t.extractfile("cls/v/000008.json").read())
    assert "cls/v/000000.jpg" in names and "cls/v/000032.jpg" in names
    assert doc["meta"]["frame"] == 8 and doc["meta"]["clip"] == "cls/v" and abs(doc["meta"]["time"] - 8 / 24) < 1e-3


_CONTAINERS = [("ts", "libx264", {}), ("mpg", "mpeg2video", {"bframes": 0}), ("flv", "libx264", {}),
               ("wmv", "wmv2", {"bframes": 0}), ("mxf", "mpeg2video", {"bframes": 0}), ("mkv", "libx264", {}),
               ("avi", "mpeg4", {"bframes": 0}), ("mp4", "libx264", {})]


@pytest.mark.parametrize("ext,codec,opts", _CONTAINERS, ids=[e for e, _, _ in _CONTAINERS])
def test_frames_sampled_past_the_first_keyframe_are_the_right_frames_in_every_container(tmp_path, ext, codec, opts):
    """MPEG-TS and MPEG-PS seek by byte position and the timestamps read there: a seek to an H.264 TS file's first
    keyframe landed on its second, so every frame before it was listed "not decoded" (every:1 wrote none of a TS
    file), and seeks to later keyframes landed a group late. The cursor aims at a keyframe's decoding time, then at
    keyframes before it, then reads from the start."""
    import av
    from PIL import Image

    src = tmp_path / "src"
    clip = make_clip(src / "cls" / f"v.{ext}", 72, 96, 64, codec=codec, gop=12, **opts)
    with av.open(str(clip)) as c:  # (the file's frames decoded in turn: a lossy codec's, not the ramps themselves)
        decoded = np.stack([f.to_ndarray(format="rgb24").astype(np.int16) for f in c.decode(video=0)])
    assert len(decoded) == 72

    def closest(path) -> int:
        img = np.asarray(Image.open(path).convert("RGB"), np.int16)
        return int(np.argmin(np.abs(decoded - img).mean(axis=(1, 2, 3))))

    for mode, want in (("every:1", list(range(72))), ("every:5", list(range(0, 72, 5))), ("uniform:4", None)):
        out = tmp_path / mode.replace(":", "")
        s = convert(src, out, to="folder", frames=mode, device="cpu", image_format="png")
        assert not s.skipped, (mode, s.skipped)
        files = sorted((out / "cls").glob("*.png"))
        got = [int(f.stem.rsplit("_", 1)[1]) for f in files]
        assert got == want if want is not None else len(got) == 4, (mode, got)
        for f in files[::7] if mode == "every:1" else files:
            assert closest(f) == int(f.stem.rsplit("_", 1)[1]), (mode, f.name)


def test_a_seek_the_demuxer_refuses_reads_the_frames_from_the_start(tmp_path, monkeypatch):
    """A demuxer that refuses a seek (FLV's, asked for a timestamp before its first: EPERM) no longer fails the
    record: its frames are read from the file's start."""
    from gpubatch.engine.codecs import video as video_codec
    from gpubatch.engine.codecs.video_probe import probe

    real = video_codec.open_container

    class Refusing:
        def __init__(self, c):
            self._c = c

        def __getattr__(self, name):
            return getattr(self._c, name)

        def seek(self, *args, **kwargs):
            raise PermissionError(1, "Operation not permitted")

        def close(self):
            self._c.close()

    clip = make_clip(tmp_path / "v.flv", 48, gop=12)
    data = clip.read_bytes()
    info = probe(data)
    monkeypatch.setattr(video_codec, "open_container", lambda b: Refusing(real(b)))
    cursor = video_codec.FrameCursor(data, info, [[30], [40], [5]])
    got = [cursor.frames([i])[0].astype(np.int16) for i in (30, 40, 5)]
    monkeypatch.setattr(video_codec, "open_container", real)
    want = video_codec.FrameCursor(data, info, [[30, 40, 5]]).frames([30, 40, 5]).astype(np.int16)
    assert all(np.abs(g - w).mean() < 1.0 for g, w in zip(got, want))


def test_clips_as_npy_in_webdataset_and_tfrecord(tmp_path):
    wds = pytest.importorskip("webdataset")
    tfr = pytest.importorskip("tfrecord.reader")
    src = class_folders(tmp_path / "src")
    s = convert(src, tmp_path / "wds", to="webdataset", clip_length=8, frame_step=2, resize_shorter=32,
                center_crop=32, device="cpu")
    assert not s.skipped and s.records_out == 3 + 1 + 3 + 2  # 48, 30, 60, 36 frames; 15 a clip side by side
    shards = [str(p) for p in sorted((tmp_path / "wds").glob("*.tar"))]
    got = {d["__key__"]: d for d in wds.WebDataset(shards, shardshuffle=False)}
    clip = np.load(io.BytesIO(got["jump/j1/0001"]["npy"]))
    assert clip.shape == (8, 32, 32, 3) and clip.dtype == np.uint8
    assert json.loads(got["jump/j1/0001"]["json"])["meta"]["frames"] == list(range(16, 31, 2))
    s = convert(src, tmp_path / "tfr", to="tfrecord", clip_length=4, clips_per_video=1, clip_positions="uniform",
                device="cpu")
    rows = [r for shard in sorted((tmp_path / "tfr").glob("*.tfrecord"))
            for r in tfr.tfrecord_loader(str(shard), str(shard.with_suffix(".idx")),
                                         {"video/encoded": "byte", "video/class/label": "int",
                                          "video/source_id": "byte"})]
    assert len(rows) == 4 and s.records_out == 4
    arr = np.load(io.BytesIO(bytes(rows[0]["video/encoded"])))
    assert arr.shape == (4, 64, 96, 3)
    assert sorted(int(r["video/class/label"][0]) for r in rows) == [0, 0, 1, 1]
    again = info(tmp_path / "tfr")
    assert again.records == 4 and again.video["total_frames"] == 16


def test_augment_draws_one_set_of_parameters_per_clip(tmp_path):
    src = tmp_path / "src"
    make_clip(src / "v.mp4", 40, 96, 64)
    chain = "random_clip(length=5, step=2, step_jitter=1) | flip(p=1.0)"
    s = augment(src, tmp_path / "aug", ops=chain, copies=3, seed=11, to="webdataset", device="cpu")
    assert s.records_out == 3 and not s.skipped
    with tarfile.open(next((tmp_path / "aug").glob("*.tar"))) as t:
        for k in range(3):
            clip = np.load(io.BytesIO(t.extractfile(f"v_aug{k}.npy").read()))
            frames = json.loads(t.extractfile(f"v_aug{k}.json").read())["meta"]["frames"]
            assert clip.shape == (5, 64, 96, 3) and len(set(np.diff(frames))) == 1
            for f, i in zip(clip, frames):  # every frame mirrored, and the frame the metadata names
                assert _closest(f[:, ::-1], 40) == i
    again = augment(src, tmp_path / "aug2", ops=chain, copies=3, seed=11, to="webdataset", device="cpu")
    assert again.records_out == 3
    one = [ln for ln in (tmp_path / "aug" / "augment-params.jsonl").read_text().splitlines()]
    assert one == (tmp_path / "aug2" / "augment-params.jsonl").read_text().splitlines()


def test_reencode_resizes_every_frame(tmp_path):
    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    make_clip(src / "v.mp4", 20, 96, 64)
    s = convert(src, tmp_path / "out", to="video", resize_shorter=32, device="cpu")
    assert s.records_out == 1 and not s.skipped
    out = probe((tmp_path / "out" / "v.mp4").read_bytes())
    assert (out.width, out.height, out.frames, out.codec) == (48, 32, 20, "h264")
    s = convert(src, tmp_path / "fps", to="video", fps=12.0, device="cpu")
    assert probe((tmp_path / "fps" / "v.mp4").read_bytes()).frames == 10


def test_info_describes_videos(tmp_path):
    src = class_folders(tmp_path / "src")
    r = info(src)
    v = r.as_dict()["video"]
    assert r.records == 4 and v["total_frames"] == 48 + 30 + 60 + 36
    assert v["codecs"] == {"h264 High": 3, "hevc Main": 1} and v["containers"] == {"mp4": 3, "mkv": 1}
    assert v["fps"]["median"] == 24 and v["resolutions"] == {"96x64": 4}
    assert v["total_hours"] == pytest.approx(174 / 24 / 3600, abs=1e-4)
    assert v["total_s"] == pytest.approx(174 / 24, abs=0.01)


def test_info_says_a_duration_in_the_unit_a_person_reads():
    """The video and audio sections' whole duration: 3 s of sample clips read "0.0008 h in all"."""
    from gpubatch.report.info import _duration, span

    assert [span(s) for s in (3, 59.4, 90, 600, 3600, 20480, 360000)] == \
        ["3 s", "59.4 s", "1.5 min", "10 min", "1 h", "5.69 h", "100.0 h"]
    facts = {"duration_s": {"min": 1.0, "max": 1.0, "mean": 1.0}, "total_hours": 0.0008, "total_s": 3.0}
    assert _duration(facts) == "3 s in all; 1..1 s a file (mean 1)"


# --- bad input ---------------------------------------------------------------------------------------------

def test_bad_files_are_skipped_with_their_reason_and_the_rest_converts(tmp_path):
    src = tmp_path / "src"
    good = make_clip(src / "good.mp4", 24).read_bytes()
    (src / "empty.mp4").write_bytes(b"")
    (src / "cut.mp4").write_bytes(good[: len(good) // 3])  # no moov atom left
    (src / "photo.mp4").write_bytes(b"\xff\xd8\xff\xe0" + bytes(200))  # a JPEG-ish file named .mp4
    with av.open(str(src / "sound.mp4"), "w") as c:  # audio only
        s = c.add_stream("aac", rate=16000)
        f = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        f.sample_rate = 16000
        for p in [*s.encode(f), *s.encode()]:
            c.mux(p)
    make_clip(src / "huge.mp4", 4, 640, 480)
    s = convert(src, tmp_path / "out", to="webdataset", frames="every:6", max_pixels=100_000, device="cpu")
    reasons = {e["key"]: e["reason"] for e in s.skipped}
    assert s.records_out == 4 and set(reasons) == {"empty", "cut", "photo", "sound", "huge"}
    assert "empty" in reasons["empty"] and "no video stream" in reasons["sound"]
    assert "--max-pixels" in reasons["huge"]
    assert "cut short: its index (the moov box" in reasons["cut"], reasons["cut"]
    assert "an image (jpeg), not a video" in reasons["photo"]


def test_damage_mid_stream_keeps_the_frames_before_it(tmp_path):
    from gpubatch.engine.codecs.video import FrameCursor
    from gpubatch.engine.codecs.video_probe import probe

    data = bytearray(make_clip(tmp_path / "v.mp4", 48, 96, 64, gop=48, bframes=0).read_bytes())
    info0 = probe(bytes(data))
    mdat = data.find(b"mdat")
    cut = mdat + int((len(data) - mdat) * 0.6)
    data[cut: cut + 400] = bytes(400)  # zeros over the packets of the last third
    cur = FrameCursor(bytes(data), info0, [[0, 5, 10], [47]])
    assert cur.frames([0, 5, 10]).shape == (3, 64, 96, 3)
    try:
        last = cur.frames([47])
    except RecordError as e:  # decoding stopped at the damage: the later output is its own error
        assert e.stage.value == "decode"
    else:  # FFmpeg concealed the damage: the frame comes back, damaged but whole
        assert last.shape == (1, 64, 96, 3)


# --- stream kinds --------------------------------------------------------------------------------------------

def _rotate_track(data: bytes, degrees_clockwise: int) -> bytes:
    """An MP4 whose video track's matrix turns the picture (as phones write portrait video)."""
    import struct

    d = bytearray(data)
    i = d.find(b"tkhd")
    off = i + 4 + 4 + (20 if d[i + 4] == 0 else 32) + 8 + 8  # past version/flags, times, ids, layer...
    one, minus = 0x00010000, 0xFFFF0000
    a, b, c, dd = {90: (0, one, minus, 0), 180: (minus, 0, 0, minus), 270: (0, minus, one, 0)}[degrees_clockwise]
    struct.pack_into(">9I", d, off, a, b, 0, c, dd, 0, 0, 0, 0x40000000)
    return bytes(d)


def test_rotated_video_is_turned_upright(tmp_path):
    from gpubatch.engine.codecs.video_probe import probe

    src = tmp_path / "src"
    src.mkdir()
    (src / "phone.mp4").write_bytes(_rotate_track(make_clip(tmp_path / "v.mp4", 12, 96, 64).read_bytes(), 90))
    info = probe((src / "phone.mp4").read_bytes())
    assert info.rotation == 270 and (info.width, info.height) == (64, 96)  # 90 clockwise = 270 counter-clockwise
    s = convert(src, tmp_path / "out", to="webdataset", frames="every:4", device="cpu")
    assert s.records_out == 3 and not s.skipped
    from PIL import Image

    with tarfile.open(next((tmp_path / "out").glob("*.tar"))) as t:
        img = np.asarray(Image.open(io.BytesIO(t.extractfile("phone/000004.jpg").read())).convert("RGB"), np.int16)
    assert img.shape == (96, 64, 3)
    upright = np.rot90(frame(4, 64, 96), -1).astype(np.int16)  # the stored frame turned 90 degrees clockwise
    assert np.abs(img - upright).mean() < 8 < np.abs(img - np.rot90(frame(4, 64, 96), 1)).mean()


@pytest.mark.parametrize("faststart", [False, True])
def test_a_tracks_rotation_read_from_its_boxes_is_the_one_its_decoded_frames_carry(tmp_path, faststart):
    """An MP4's rotation is read from its video track's matrix (no frame decoded), as FFmpeg gives it on the
    frames it decodes; where the boxes do not say (no moov, a movie matrix that turns), None: a frame is decoded."""
    import struct

    from gpubatch.engine.codecs import video_probe as vp

    plain = make_clip(tmp_path / "v.mp4", 12, 96, 64, faststart=faststart).read_bytes()
    for clockwise in (0, 90, 180, 270):
        data = _rotate_track(plain, clockwise) if clockwise else plain
        with vp.open_container(data) as c:
            s = c.streams.video[0]
            decoded = vp._first_frame_rotation(c, s, 0)
        assert vp._track_rotation(data) == decoded == (360 - clockwise) % 360
        info = vp.probe(data)
        assert info.rotation == decoded and (info.width, info.height) == ((64, 96) if clockwise % 180 else (96, 64))
    assert vp._track_rotation(b"\x00\x00\x00\x08free") is None and vp._track_rotation(plain[:40]) is None
    turned = bytearray(plain)
    i = turned.find(b"mvhd")
    at = i + 4 + 4 + (16 if turned[i + 4] == 0 else 28) + 16
    struct.pack_into(">9I", turned, at, 0, 0x00010000, 0, 0xFFFF0000, 0, 0, 0, 0, 0x40000000)
    assert vp._track_rotation(bytes(turned)) is None  # (FFmpeg multiplies the movie's matrix in: a frame decides)


def test_ten_bit_hevc_becomes_8_bit_rgb(tmp_path):
    from gpubatch.engine.codecs.video import FrameCursor
    from gpubatch.engine.codecs.video_probe import probe

    data = make_clip(tmp_path / "v10.mp4", 8, 96, 64, codec="libx265", pix_fmt="yuv420p10le").read_bytes()
    info = probe(data)
    assert info.bit_depth == 10 and info.codec == "hevc"
    got = FrameCursor(data, info, [[5]]).frames([5])
    assert got.dtype == np.uint8 and got.shape == (1, 64, 96, 3)
    assert _closest(got[0], 8) == 5 and np.abs(got[0].astype(int) - frame(5, 64, 96)).mean() < 8


def test_variable_frame_rate_is_sampled_by_time(tmp_path):
    from gpubatch.engine.codecs.video_probe import probe

    times = [k / 10 for k in range(10)] + [1.0, 1.5, 2.0, 2.5]  # 10 fps for a second, then 2 fps
    src = tmp_path / "src"
    make_clip(src / "vfr.mp4", len(times), times=times, bframes=0)
    info = probe((src / "vfr.mp4").read_bytes())
    assert info.vfr and info.frames == 14 and info.times[11] == pytest.approx(1.5, abs=1e-3)
    s = convert(src, tmp_path / "out", to="webdataset", frames="fps:2", device="cpu")
    with tarfile.open(next((tmp_path / "out").glob("*.tar"))) as t:
        frames = sorted(json.loads(t.extractfile(m).read())["meta"]["frame"] for m in t.getmembers()
                        if m.name.endswith(".json"))
    assert frames == [0, 5, 10, 11, 12, 13] and s.records_out == 6


@pytest.mark.parametrize("listing", ["file_list.txt", "clips.csv"])
def test_clips_a_found_list_leaves_out_are_said(tmp_path, listing):
    """A file list or a CSV found in the folder is the dataset: clips it does not name are said, in a
    warning and ``info``'s ``left_out``; the list given as the source reads its lines alone."""
    src = tmp_path / "src"
    for name in ("a.mp4", "b.mp4", "sub/c.webm"):
        make_clip(src / name, 6, **({"codec": "libvpx-vp9", "bframes": 0} if name.endswith("webm") else {}))
    (src / listing).write_text("a.mp4 0\n" if listing == "file_list.txt" else "path,label\na.mp4,0\n")
    said = f"2 video files under {src} are not in {listing} and left out (b.mp4, sub/c.webm)"
    report = info(src)
    assert report.left_out == {"unlisted": {"count": 2, "names": ["b.mp4", "sub/c.webm"]}}
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and any(w.startswith(said) for w in s.warnings), s.warnings
    s = convert(src / listing, tmp_path / "alone", to="webdataset")
    assert s.records_out == 1 and not any("left out" in w for w in s.warnings), s.warnings


def test_the_containers_of_cameras_phones_and_older_tools_are_clips(tmp_path):
    """A camcorder's .MTS and .m2ts, a phone's .3gp, Windows' .wmv, a DVD's .vob, broadcast .mxf and Flash's .f4v
    are clips: passed through byte for byte under the extension of what their bytes are (PyAV writes an .m2ts with
    192-byte packets, an .MTS with a plain transport stream's 188), and decoded to frames."""
    wds = pytest.importorskip("webdataset")
    from gpubatch.engine.codecs.video_probe import sniff_container

    src = tmp_path / "src"
    made = {"a.3gp": ("libx264", "3gp"), "b.m2ts": ("libx264", "m2ts"), "c.MTS": ("libx264", "ts"),
            "d.wmv": ("wmv2", "wmv"), "e.vob": ("mpeg2video", "mpg"), "f.mxf": ("mpeg2video", "mxf"),
            "g.f4v": ("libx264", "mp4")}
    for name, (codec, _) in made.items():
        make_clip(src / "cls" / name, 24, 64, 48, codec=codec, bframes=0)
    for name, (_, ext) in made.items():
        assert sniff_container((src / "cls" / name).read_bytes()) == ext, name
    s = convert(src, tmp_path / "wds", to="webdataset")
    assert s.passthrough == len(made) and not s.skipped and not s.warnings, (s.skipped, s.warnings)
    got = {d["__key__"]: d for d in wds.WebDataset([str(p) for p in sorted((tmp_path / "wds").glob("*.tar"))],
                                                    shardshuffle=False)}
    for name, (_, ext) in made.items():
        assert got[f"cls/{name.rsplit('.', 1)[0]}"][ext] == (src / "cls" / name).read_bytes(), name
    s = convert(src, tmp_path / "frames", to="folder", frames="every:8", resize_shorter=32, device="cpu")
    assert s.records_out == 3 * len(made) and not s.skipped, s.skipped
    for name in made:
        assert len(list((tmp_path / "frames" / "cls").glob(f"{name.rsplit('.', 1)[0]}_*.jpg"))) == 3, name


def test_the_progress_counts_outputs_and_gives_no_total_where_frames_are_sampled(tmp_path, imagenet):
    """A run's progress is advanced by one per output; its total is the outputs where they are known up front
    (images: one a record) and None where a video's frames are sampled (each source's count is known once it is
    read): the terminal's bar had shown "48/2" for two 24-frame clips."""
    def recorder(seen):
        def start(total):
            seen.append(total)
            return lambda n: seen.append(n)
        return start

    src = tmp_path / "clips"
    for name in ("a", "b"):
        make_clip(src / f"{name}.mp4", 24, w=64, h=48)
    seen: list = []
    s = convert(src, tmp_path / "frames", to="webdataset", frames="every:1", resize_shorter=32, progress=recorder(seen))
    assert seen[0] is None and sum(seen[1:]) == s.records_out == 48
    seen = []
    s = convert(imagenet, tmp_path / "images", to="webdataset", progress=recorder(seen))
    assert seen[0] == 60 and sum(seen[1:]) == s.records_out == 60
