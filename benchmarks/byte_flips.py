#!/usr/bin/env python3
"""Random byte flips (or, with ``--cut``, cuts) in the datasets gpubatch writes and in sound and video files, each copy
converted: every record is written or listed as skipped, or a warning or a one-line error says what the damage cost;
never a traceback, never fewer records (or, for sound, fewer samples; for video, fewer frames) without a word.

    python3 benchmarks/byte_flips.py --media datasets|video|video-sound|reencode|audio|stored|images [--seed 1]
        [--runs 60] [--keep DIR] [--device auto|cpu|gpu] [--cut] [--exact] [--augment | --loader]

``datasets``: ``sample_data/imagenet`` written as webdataset, TFRecord, RecordIO, LMDB, COCO, Parquet and a folder,
and zipped (an image folder in a ZIP), then 1-64 bytes of one copy's files flipped (index files and manifests among them), read back to webdataset.
``video``: eight 24-frame clips (H.264 in MP4, MKV, MPEG-TS and FLV, VP9 in WebM, MPEG-4 in AVI, MPEG-2 in MPEG-PS,
HEVC in MP4), 1-32 bytes of one flipped, every frame written (``--frames every:1``); ``video-sound``: the same of
eight clips with a sound track beside the video (AAC, Opus, MP2, MP3, AC-3 in MP4, MKV, WebM, MPEG-TS, FLV, AVI,
MPEG-PS and MOV). ``reencode``: those clips with sound re-encoded whole (``--to video``), each output's sound
track's packets counted against the undamaged run's. ``audio``: a 3-s recording as
FLAC, WAV, Ogg Vorbis, Opus, MP3 (also after an ID3 tag), AIFF, Wave64, CAF, AU and AAC in MP4 (also fragmented), and
a chained Ogg file of two rates, 1-16 bytes of one flipped, resampled. Prints one line a copy
that lost something, with what was said, and ends with the count of silent losses and tracebacks (``bad``).
``stored``: four sound files (FLAC, WAV, Ogg, MP3) and three videos (MP4, MKV, WebM) passed through into
webdataset, TFRecord, LMDB (sound) and Parquet, 1-64 bytes of one copy's files flipped, read back decoded (resampled;
every frame; with ``--loader``, the sound alone, read by the training loader). ``images``: twelve photos as PNG, WebP, GIF, BMP, TIFF and JPEG 2000 folders, 1-16 bytes of one file
flipped, passed through (PNG's CRCs checked, the others decoded) or resized (GIF, TIFF, JPEG 2000). ``--loader`` reads
each copy of ``datasets`` or ``stored`` through the training loader (``gpubatch.loader``). ``--augment`` runs each copy through ``augment`` (two copies of each record, the media's random chain).
``--cut`` cuts one file short instead (a copy stopped part way). ``--exact`` counts a recording short by any
sample (a re-encoded video's sound by any packet), where the default allows 2% (a decoder's priming). ``--device gpu`` takes the GPU path: nvJPEG (the
datasets' images resized, so that they are decoded), NVDEC, the GPU audio unit.
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gpubatch.api import augment, convert, open_dataset  # noqa: E402
from gpubatch.errors import GpubatchError  # noqa: E402


def _datasets(t: Path, decode: bool = False) -> tuple[dict[str, Path], dict, int]:
    bases = {}
    for f in ("webdataset", "tfrecord", "recordio", "lmdb", "coco", "parquet", "folder"):
        bases[f] = t / f"base-{f}"
        sharded = f in ("webdataset", "tfrecord", "recordio", "parquet")
        convert(ROOT / "sample_data" / "imagenet", bases[f], to=f, shard_size=16 if sharded else None)
    import zipfile

    bases["zip"] = t / "train.zip"  # (an image folder in a ZIP, read where it lies)
    with zipfile.ZipFile(bases["zip"], "w") as z:
        for p in sorted((ROOT / "sample_data" / "imagenet").rglob("*.*")):
            z.write(p, "train/" + p.relative_to(ROOT / "sample_data" / "imagenet").as_posix())
    return bases, {"to": "webdataset", **({"resize_shorter": 32} if decode else {})}, 60


def _videos(t: Path) -> tuple[dict[str, Path], dict, int]:
    from tests.video.clips import make_clip

    base = t / "base" / "a"
    kinds = {"h264.mp4": {}, "h264.mkv": {}, "vp9.webm": {"codec": "libvpx-vp9"}, "mpeg4.avi": {"codec": "mpeg4"},
             "h264.ts": {}, "h264.flv": {}, "mpeg2.mpg": {"codec": "mpeg2video"}, "hevc.mp4": {"codec": "libx265"}}
    for name, kw in kinds.items():
        make_clip(base / name, 24, w=64, h=48, **kw)
    opts = {"to": "webdataset", "from_format": "video", "frames": "every:1", "resize_shorter": 32}
    return {"video": t / "base"}, opts, convert(t / "base", t / "ref", **opts).records_out


def _sounded_videos(t: Path, whole: bool = False) -> tuple[dict[str, Path], dict, int]:
    from tests.video.clips import make_clip_with_sound

    base = t / "base" / "a"
    for name, fmt, vcodec, acodec in (("h264-aac.mp4", "mp4", "libx264", "aac"),
                                      ("h264-aac.mkv", "matroska", "libx264", "aac"),
                                      ("vp9-opus.webm", "webm", "libvpx-vp9", "libopus"),
                                      ("h264-mp2.ts", "mpegts", "libx264", "mp2"),
                                      ("h264-aac.flv", "flv", "libx264", "aac"),
                                      ("mpeg4-mp3.avi", "avi", "mpeg4", "libmp3lame"),
                                      ("mpeg2-mp2.mpg", "mpeg", "mpeg2video", "mp2"),
                                      ("h264-ac3.mov", "mov", "libx264", "ac3")):
        make_clip_with_sound(base / name, fmt, vcodec, acodec)
    opts = ({"to": "video", "resize_shorter": 32} if whole else
            {"to": "webdataset", "from_format": "video", "frames": "every:1", "resize_shorter": 32})
    return {"video": t / "base"}, opts, convert(t / "base", t / "ref", **opts).records_out


def _sounds(t: Path) -> tuple[dict[str, Path], dict, int]:
    import soundfile as sf

    from tests.audio.sounds import fragmented_m4a, write

    base = t / "base" / "a"
    base.mkdir(parents=True)
    x = (0.3 * np.sin(np.arange(48000) * 2 * np.pi * 440 / 16000)
         + 0.05 * np.random.default_rng(0).standard_normal(48000)).astype(np.float32)
    for ext, fmt, kw in (("flac", "FLAC", {}), ("wav", "WAV", {}), ("ogg", "OGG", {}), ("mp3", "MP3", {}),
                         ("aiff", "AIFF", {}), ("opus", "OGG", {"subtype": "OPUS"})):
        sf.write(base / f"c.{ext}", x, 48000 if ext == "opus" else 16000, format=fmt, **kw)
    write(base / "c.m4a", x[:, None], 16000)  # (AAC in MP4, through PyAV)
    parts = []  # (a chained Ogg file whose second stream is of another rate: each stream read on its own)
    for rate, n in ((16000, 24000), (44100, 66150)):
        buf = io.BytesIO()
        sf.write(buf, np.interp(np.arange(n) * 16000 / rate, np.arange(48000), x).astype(np.float32), rate,
                 format="OGG")
        parts.append(buf.getvalue())
    (base / "chain.ogg").write_bytes(b"".join(parts))
    for ext, fmt in (("w64", "W64"), ("caf", "CAF"), ("au", "AU")):  # (the sizes of their headers tell a cut)
        sf.write(base / f"c.{ext}", x, 16000, format=fmt)
    fragmented_m4a(base / "f.m4a", x)  # (as live recorders write, with FFmpeg's index of its fragments at its end)
    mp3 = io.BytesIO()
    sf.write(mp3, x, 16000, format="MP3")
    title = b"\x03" + b"a title" * 40  # (an ID3v2.3 tag before the frames: a title frame of 281 bytes)
    frame = b"TIT2" + len(title).to_bytes(4, "big") + b"\x00\x00" + title
    syncsafe = bytes((len(frame) >> shift) & 0x7F for shift in (21, 14, 7, 0))
    (base / "id3.mp3").write_bytes(b"ID3\x03\x00\x00" + syncsafe + frame + mp3.getvalue())
    return {"audio": t / "base"}, {"to": "webdataset", "sample_rate": 16000}, 13


def _images(t: Path) -> tuple[dict[str, Path], dict, dict]:
    """``sample_data/imagenet``'s first 12 photos as a folder of each other codec gpubatch reads (PNG, WebP, GIF, BMP,
    TIFF, JPEG 2000), passed through (each checked: PNG's CRCs, the others decoded) or resized."""
    from PIL import Image

    photos = sorted((ROOT / "sample_data" / "imagenet").rglob("*.jpg"))[:12]
    bases, opts, whole = {}, {}, {}
    for ext, fmt in (("png", "PNG"), ("webp", "WEBP"), ("gif", "GIF"), ("bmp", "BMP"), ("tif", "TIFF"),
                     ("jp2", "JPEG2000")):
        for p in photos:
            out = t / f"base-{ext}" / p.parent.name / f"{p.stem}.{ext}"
            out.parent.mkdir(parents=True, exist_ok=True)
            Image.open(p).convert("RGB").save(out, fmt)
        bases[ext] = t / f"base-{ext}"
        opts[ext] = {"to": "webdataset", **({"resize_shorter": 32} if ext in ("gif", "tif", "jp2") else {})}
        whole[ext] = len(photos)
    return bases, opts, whole


def _stored(t: Path) -> tuple[dict[str, Path], dict, dict]:
    """Sound and video records stored in each dataset format (passed through), to be read back decoded: the
    readers' framing and the decoders behind them, damaged together."""
    import soundfile as sf

    from tests.video.clips import make_clip

    x = (0.3 * np.sin(np.arange(32000) * 2 * np.pi * 440 / 16000)).astype(np.float32)
    for i, (ext, fmt) in enumerate((("flac", "FLAC"), ("wav", "WAV"), ("ogg", "OGG"), ("mp3", "MP3"))):
        (t / "sa" / "a").mkdir(parents=True, exist_ok=True)
        sf.write(t / "sa" / "a" / f"c{i}.{ext}", x, 16000, format=fmt)
    for i, (name, kw) in enumerate((("mp4", {}), ("mkv", {}), ("webm", {"codec": "libvpx-vp9"}))):
        make_clip(t / "sv" / "a" / f"v{i}.{name}", 12, w=64, h=48, **kw)
    bases, opts, whole = {}, {}, {}
    for f in ("webdataset", "tfrecord", "lmdb", "parquet"):
        for media, src, read in (("audio", t / "sa", {"sample_rate": 16000}),
                                 ("video", t / "sv", {"frames": "every:1", "resize_shorter": 32})):
            if f == "lmdb" and media == "video":  # (LMDB holds images and sound; RecordIO images alone)
                continue
            kind = f"{media}-{f}"
            bases[kind] = t / f"base-{kind}"
            convert(src, bases[kind], to=f, shard_size=2 if f != "lmdb" else None)
            opts[kind] = {"to": "webdataset", "from_format": f, **read}
            whole[kind] = convert(bases[kind], t / f"ref-{kind}", **opts[kind]).records_out
    return bases, opts, whole


#: each media's chain of random ops, for ``--augment``
AUGMENT_OPS = {"image": "random_resized_crop(size=32) | flip() | color_jitter(brightness=0.3)",
               "audio": "gain(db=(-6, 6)) | add_noise(snr=(10, 20)) | time_shift(seconds=0.05)",
               "video": "random_clip(length=4, step=2) | flip(p=0.5)"}


def _augmented(opts: dict, kind: str) -> dict:
    """``convert``'s options for a copy as ``augment`` takes them: the media's random chain, two copies a
    record (a video's clip drawn once per copy; sound's samples not resampled)."""
    media = next((m for m in ("audio", "video") if m in kind), "image")
    keep = {k: v for k, v in opts.items() if k in ("to", "from_format", "device")}
    return {**keep, "ops": AUGMENT_OPS[media], "copies": 2, "seed": 3}


def _loaded(src: Path, kind: str, device: str) -> Any:
    """A damaged copy read through the training loader (``gpubatch.loader``, in order, batches of 8): its rows and
    the records it left out, as a run's summary gives them (``records_out``, ``skipped``)."""
    import gpubatch

    media = "audio" if kind.startswith("audio") else "image"
    loader = gpubatch.loader(src, ops="resize(height=32, width=32)" if media == "image" else None, batch_size=8,
                             device=device, shuffle=False, keys=(media, "label"))
    rows = sum(len(batch[1]) for batch in loader)
    return SimpleNamespace(records_out=rows, skipped=loader.skipped, warnings=[])


def _samples(path: Path) -> dict[str, int]:
    import soundfile as sf

    return {r.key: sf.info(io.BytesIO(r.data)).frames for r in open_dataset(path)}


def _sound_packets(path: Path) -> dict[str, int]:
    """Each re-encoded video's packets of sound (0: no sound track)."""
    import av

    out = {}
    for f in sorted(path.rglob("*.mp4")):
        with av.open(str(f)) as c:
            out[f.name] = sum(1 for p in c.demux(c.streams.audio[0]) if p.size) if c.streams.audio else 0
    return out


def _keep(where: Path | None, src: Path, it: int) -> None:
    if where is not None:
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, where / f"s{it}{src.suffix}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--media", choices=("datasets", "video", "video-sound", "reencode", "audio", "stored", "images"),
                    required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--keep", type=Path, help="copy each bad copy's damaged source here, to study")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--augment", action="store_true", help="run each copy through `augment` (two copies of each "
                    "record, a chain of the media's random ops) instead of `convert`")
    ap.add_argument("--loader", action="store_true", help="read each copy through the training loader instead of "
                    "`convert` (datasets and stored sound only)")
    ap.add_argument("--exact", action="store_true", help="count a recording (or a video's sound) short by any sample "
                    "or packet, not only by more than 2%%")
    ap.add_argument("--cut", action="store_true", help="cut one file short (30-99.99%% of it kept, half the cuts in "
                    "its last 5%%) instead of flipping bytes: a copy or download stopped part way")
    args = ap.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    t = Path(tempfile.mkdtemp(prefix="gpubatch-flips-"))
    try:
        make = {"datasets": lambda t: _datasets(t, args.device == "gpu"), "video": _videos,
                "video-sound": _sounded_videos, "reencode": lambda t: _sounded_videos(t, True), "audio": _sounds, "stored": _stored,
                "images": _images}
        bases, opts, whole = make[args.media](t)
        if args.loader:  # (what the loader reads: the datasets gpubatch writes; sound, not 12-frame videos)
            if args.media not in ("datasets", "stored"):
                ap.error("--loader takes --media datasets or stored")
            bases = {k: v for k, v in bases.items() if k != "zip" and not k.startswith("video")}
        if args.media in ("stored", "images"):  # (options and record counts by kind)
            for o in opts.values():
                o["device"] = args.device
        else:
            opts["device"] = args.device
        ref = {}
        measure = {"audio": _samples, "reencode": _sound_packets}.get(args.media)
        if measure is not None:  # (each recording's samples, or each video's packets of sound, undamaged)
            if not (t / "ref").exists():
                convert(bases["audio" if args.media == "audio" else "video"], t / "ref", **opts)
            ref = measure(t / "ref")
        whole_aug = {}
        if args.augment:  # (what each undamaged source gives under augment; sound's samples not counted)
            measure = None
            for kind, base in bases.items():
                o = dict(opts[kind] if args.media in ("stored", "images") else opts)
                whole_aug[kind] = augment(base, t / f"ref-aug-{kind}", **_augmented(o, kind if args.media == "stored"
                                                                                  else args.media)).records_out
        rng = random.Random(args.seed)
        bad = said = 0
        for it in range(args.runs):
            kind = rng.choice(sorted(bases))
            src = t / f"s{it}{bases[kind].suffix}"
            if bases[kind].is_dir():
                shutil.copytree(bases[kind], src)
            else:
                shutil.copy2(bases[kind], src)
            files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]
            if args.media not in ("datasets", "stored"):
                files = [rng.choice(files)]
            flips = []
            if args.cut:
                f = rng.choice(files)
                data = f.read_bytes()
                n = int(len(data) * rng.choice((rng.uniform(0.3, 0.95), rng.uniform(0.95, 0.9999))))  # (half in
                # the last 5%, where an index or a sound track written last lies)
                f.write_bytes(data[:n])
                flips.append(f"{f.relative_to(src) if src.is_dir() else f.name} cut at {n} of {len(data)}")
            counts = {"datasets": (1, 4, 16, 64), "audio": (1, 4, 16), "stored": (1, 4, 16, 64), "images": (1, 4, 16)}.get(args.media, (1, 2, 8, 32))
            for _ in range(0 if args.cut else rng.choice(counts)):
                f = rng.choice(files)
                data = bytearray(f.read_bytes())
                if data:
                    i = rng.randrange(len(data))
                    data[i] = rng.randrange(256)
                    f.write_bytes(bytes(data))
                    flips.append(f"{f.relative_to(src) if src.is_dir() else f.name}@{i}")
            try:
                if args.loader:  # (the training loader's batches, counted as a run's summary counts records)
                    s = _loaded(src, kind, args.device)
                    measure = None
                elif args.media == "stored" and not args.augment:
                    ref = {}
                    if kind.startswith("audio"):  # (each recording's samples, read back undamaged)
                        ref = _samples(t / f"ref-{kind}")
                    measure = _samples if ref else None
                o = dict(opts[kind] if args.media in ("stored", "images") else opts)
                if args.loader:
                    pass
                elif args.augment:
                    s = augment(src, t / f"o{it}", **_augmented(o, kind if args.media == "stored" else args.media))
                else:
                    s = convert(src, t / f"o{it}", **o)
                short = {k: (v, ref[k]) for k, v in measure(t / f"o{it}").items()
                         if k in ref and v < (1 if args.exact else 0.98) * ref[k]} if measure is not None and s.records_out else {}
                want = whole_aug[kind] if args.augment else whole[kind] if isinstance(whole, dict) else whole
                lost = s.records_out + len(s.skipped) * (2 if args.augment else 1) < want or short
                if lost and not s.skipped and not s.warnings:
                    bad += 1
                    _keep(args.keep, src, it)
                    print(f"SILENT {it} {kind}: {s.records_out} written {short or ''} after {flips[:4]}")
                elif lost or s.skipped:
                    said += 1
                    print(f"said {it} {kind}: {s.records_out} written, {len(s.skipped)} listed: "
                          f"{(s.skipped[0]['reason'] if s.skipped else s.warnings[0])[:100]}")
            except GpubatchError as e:
                said += 1
                print(f"error {it} {kind}: {str(e)[:120]}")
            except Exception as e:  # noqa: BLE001 - what this script looks for
                bad += 1
                _keep(args.keep, src, it)
                print(f"TRACEBACK {it} {kind}: {type(e).__name__}: {str(e)[:160]} after {flips[:4]}")
            shutil.rmtree(src) if src.is_dir() else src.unlink()
            shutil.rmtree(t / f"o{it}", ignore_errors=True)
        print(f"{args.media}, seed {args.seed}: {args.runs} damaged copies, {said} with a loss said, bad {bad}")
    finally:
        shutil.rmtree(t, ignore_errors=True)


if __name__ == "__main__":
    main()
