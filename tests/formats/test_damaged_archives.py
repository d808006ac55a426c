"""Archives damaged at random (bits flipped, cut short, stretches zeroed), converted: each run ends in one clear error,
or accounts for every record it listed (written or skipped with a reason), and a run that says nothing wrong wrote
every record the archive held."""

from __future__ import annotations

import random
import shutil
import tarfile
import zipfile

import pytest

from gpubatch.api import convert, open_dataset
from gpubatch.errors import GpubatchError
from tests.helpers import jpeg_bytes, photo

N = 6


def _tree(root, per, dot=""):
    """Two class folders of ``per`` small JPEGs each (``cat<dot><k>.jpg``)."""
    for i, c in enumerate(("cat", "dog")):
        (root / c).mkdir(parents=True)
        for k in range(per):
            (root / c / f"{c}{dot}{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=10 * i + k)))
    return root


def _archive(tmp_path, kind):
    tree = _tree(tmp_path / "tree", N // 2, dot=".")
    files = sorted(p for p in tree.rglob("*.jpg"))
    if kind == "zip":
        out = tmp_path / "src.zip"
        with zipfile.ZipFile(out, "w") as z:
            for n, p in enumerate(files):
                z.write(p, p.relative_to(tree).as_posix(), compress_type=zipfile.ZIP_STORED if n % 2 else zipfile.ZIP_DEFLATED)
        return out, None
    if kind == "tar":
        out = tmp_path / "src.tar"
        with tarfile.open(out, "w") as t:
            for p in files:
                t.add(p, p.relative_to(tree).as_posix())
        return out, "folder"
    out = tmp_path / "train.tar"  # ImageNet's: a tar of class tars
    with tarfile.open(out, "w") as t:
        for c in ("cat", "dog"):
            inner = tmp_path / f"n0{c}.tar"
            with tarfile.open(inner, "w") as ti:
                for p in files:
                    if p.parent.name == c:
                        ti.add(p, p.name)
            t.add(inner, inner.name)
    return out, None


@pytest.mark.parametrize("kind", ["zip", "tar", "tar-of-tars"])
def test_a_damaged_archive_ends_in_an_error_or_accounts_for_every_record(tmp_path, kind):
    src, from_ = _archive(tmp_path, kind)
    data = src.read_bytes()
    rng = random.Random(kind)
    for i in range(12):
        b = bytearray(data)
        how = ("flip", "cut", "zero")[i % 3]
        if how == "flip":
            for _ in range(rng.randint(1, 12)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif how == "cut":
            b = b[: rng.randrange(1, len(b))]
        else:
            at = rng.randrange(len(b))
            b[at : at + 512] = bytes(len(b[at : at + 512]))
        bad = tmp_path / f"m{i}{src.suffix}"
        bad.write_bytes(bytes(b))
        try:
            s = convert(bad, tmp_path / f"o{i}", to="webdataset", workers=1, **({"from_format": from_} if from_ else {}))
        except GpubatchError as e:  # (the command's one line)
            assert "\n" not in str(e).strip() and str(e).strip(), (how, e)
            continue
        assert s.records_in == s.records_out + len(s.skipped), (how, s)
        if not s.skipped and not s.warnings:
            assert s.records_out == N, (how, s.records_out)


@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord", "recordio", "parquet", "lmdb", "coco"])
def test_a_dataset_gpubatch_wrote_damaged_at_random_loses_no_record_without_a_word(tmp_path, fmt):
    """One of its files (a shard, an index, the manifest, a COCO JSON...) has bits flipped, is cut short, has a stretch
    zeroed or is gone: the run ends in one clear error or accounts for every record, and one that says nothing wrong
    wrote them all. A webdataset or RecordIO shard gone had read as a smaller dataset, exit 0 and no word."""
    tree = _tree(tmp_path / "tree", 6)
    src = tree if fmt != "coco" else _coco(tmp_path / "coco", tree)
    ds = tmp_path / "ds"
    convert(src, ds, to=fmt, workers=1, shard_size=4)
    files = sorted(p for p in ds.rglob("*") if p.is_file())
    rng = random.Random(fmt)
    for i in range(8):
        bad = tmp_path / f"m{i}"
        shutil.copytree(ds, bad)
        target = bad / rng.choice(files).relative_to(ds)
        how = ("flip", "cut", "zero", "delete")[i % 4]
        b = bytearray(target.read_bytes())
        if how == "delete":
            target.unlink()
        elif how == "flip":
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif how == "cut":
            b = b[: rng.randrange(len(b))]
        else:
            at = rng.randrange(len(b))
            b[at : at + 512] = bytes(len(b[at : at + 512]))
        if how != "delete":
            target.write_bytes(bytes(b))
        try:
            s = convert(bad, tmp_path / f"o{i}", to="webdataset", workers=1)
        except GpubatchError as e:
            assert "\n" not in str(e).strip() and str(e).strip(), (how, target.name, e)
            continue
        assert s.records_in == s.records_out + len(s.skipped), (how, target.name, s)
        if not s.skipped and not s.warnings:
            assert s.records_out == 12, (how, target.name, s.records_out)


def _coco(root, tree):
    """A COCO set of ``tree``'s images, one box each."""
    import json

    (root / "images").mkdir(parents=True)
    images, anns = [], []
    for n, f in enumerate(sorted(tree.rglob("*.jpg"))):
        shutil.copy(f, root / "images" / f.name)
        images.append({"id": n + 1, "file_name": f.name, "height": 24, "width": 32})
        anns.append({"id": n + 1, "image_id": n + 1, "category_id": 1 + (f.parent.name == "dog"), "bbox": [2, 2, 10, 10],
                     "area": 100, "iscrowd": 0})
    (root / "annotations.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": [
        {"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}))
    return root


def _frames_and_samples(data: bytes) -> tuple[int, int]:
    import io

    import av

    with av.open(io.BytesIO(data)) as c:
        if c.streams.video:
            return sum(1 for _ in c.decode(video=0)), 0
        return 0, sum(f.samples for f in c.decode(audio=0))


def test_a_media_file_cut_at_random_is_listed_or_written_whole(tmp_path):
    """Video (MP4 with its index in front or at its end, MOV, Matroska, WebM, AVI, FLV, MPEG-TS, MPEG-PS, WMV, MXF) and
    sound (WAV, FLAC, Ogg Vorbis and Opus, MP3, M4A, AAC, WMA, AIFF, AU, CAF, W64) cut at random and passed through:
    each is listed with its reason, or what was written decodes to every frame or sample of the whole file (a cut that
    took only an index after them). A cut Matroska, FLV, MPEG-TS, MPEG-PS, WMV or MXF file, MP3, AIFF, M4A (its index
    in front), Opus, AAC and WMA file had been written as whole, with no word."""
    pytest.importorskip("av")
    import io

    import soundfile as sf

    from gpubatch.engine.codecs.container_end import declared_end
    from tests.audio.sounds import encoded, tone
    from tests.video.clips import make_clip

    media = []
    for ext, codec, opts in (("mp4", "libx264", {}), ("mp4", "libx264", {"faststart": True}), ("mov", "libx264", {}),
                             ("mkv", "libx264", {}), ("webm", "libvpx-vp9", {}), ("avi", "mpeg4", {"bframes": 0}),
                             ("flv", "libx264", {}), ("ts", "libx264", {}), ("mpg", "mpeg2video", {"bframes": 0}),
                             ("wmv", "wmv2", {"bframes": 0}), ("mxf", "mpeg2video", {"bframes": 0})):
        media.append(("video", ext, make_clip(tmp_path / "clips" / f"{len(media)}.{ext}", 24, codec=codec, **opts).read_bytes()))
    for fmt in ("wav", "flac", "ogg", "mp3", "m4a", "aac", "wma", "au", "caf", "w64"):
        media.append(("audio", fmt, encoded(tone(1.0, 16000, channels=2), 16000, fmt)))
    media.append(("audio", "opus", encoded(tone(1.0, 48000, channels=2), 48000, "ogg", "OPUS")))
    aiff = io.BytesIO()
    sf.write(aiff, tone(1.0, 16000, channels=2), 16000, format="AIFF", subtype="PCM_16")
    media.append(("audio", "aiff", aiff.getvalue()))
    rng = random.Random(1)
    for n, (kind, ext, data) in enumerate(media):
        whole = _frames_and_samples(data)
        for i in range(5):
            cut = rng.randrange(len(data) // 10, len(data))
            if ext in ("flv", "ts", "mpg") and declared_end(data[:cut], ext) == (0, ""):
                continue  # (a stream cut exactly between two packets reads as a shorter file: told by no byte)
            src, out = tmp_path / f"src-{n}-{i}", tmp_path / f"out-{n}-{i}"
            (src / "a").mkdir(parents=True)
            (src / "a" / f"x.{ext}").write_bytes(data[:cut])
            (src / "a" / f"ok.{ext}").write_bytes(data)
            s = convert(src, out, to="webdataset", from_format=kind, workers=1)
            assert s.records_in == s.records_out + len(s.skipped), (ext, cut, s.as_dict())
            if any(e["key"] == "a/x" for e in s.skipped):
                continue
            with open_dataset(out) as r:
                got = next(rec.data for rec in r if rec.key == "a/x")
            assert _frames_and_samples(got) == whole, (ext, cut, len(data), "written, not whole, with no word")


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz"])
def test_a_compressed_tar_cut_before_its_first_whole_block_says_so(tmp_path, kind):
    """bzip2 compresses in blocks of 900 kB: a .tar.bz2 cut inside its first block decompresses to nothing, which the
    tar scan took for an empty tar ("holds no records: nothing written", as if the file were empty). It is now the
    shard's error: its compressed data breaks off. A cut later in the file keeps what came out whole and lists the
    rest."""
    import bz2
    import gzip
    import io
    import lzma

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for i in range(12):
            data = jpeg_bytes(photo(40, 50, seed=i))
            member = tarfile.TarInfo(f"{('cat', 'dog')[i % 2]}/{i}.jpg")
            member.size = len(data)
            t.addfile(member, io.BytesIO(data))
    packed = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[kind](raw.getvalue())
    src = tmp_path / f"set.tar.{kind}"
    src.write_bytes(packed[: len(packed) * 2 // 3])
    try:
        s = convert(src, tmp_path / "out", to="webdataset")
    except GpubatchError as e:
        assert kind == "bz2" and "its compressed data breaks off" in str(e), e
        return
    assert kind != "bz2" and 0 < s.records_out < 12 and s.skipped, s.as_dict()
    assert s.records_in == s.records_out + len(s.skipped)
