"""The contract for bad input, one test per class of fault: the source is never modified, every record
is written or listed as skipped with its reason, a bad record never ends the run with a traceback, a
broken container keeps its complete records, and bytes pass through untouched for every codec."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpubatch import _paths
from gpubatch.api import convert, info, open_dataset
from gpubatch.errors import ExitCode, GpubatchError, UsageError
from tests.helpers import ROOT, child_env, content, jpeg_bytes, photo, run_cli, tree_digest


def one_line(proc) -> str:
    """The CLI's error, checked to be one line without a traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def summary_of(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def accounted(s) -> bool:
    """Every record the source holds was written or listed as skipped."""
    return s.records_out + len(s.skipped) == s.records_in


# --- 1. the source is every folder it is read from -------------------------------------------------------


def test_a_coco_jsons_image_folder_is_part_of_the_source(coco, tmp_path):
    ann = coco / "annotations" / "instances.json"
    before = tree_digest(coco)
    with pytest.raises(UsageError, match="delete the source|lies inside"):
        convert(ann, coco / "images", to="tfrecord", overwrite=True)
    with pytest.raises(UsageError, match="inside"):
        convert(ann, coco / "images" / "out", to="tfrecord")
    p = run_cli("convert", ann, coco / "images", "--to", "tfrecord", "--overwrite")
    assert p.returncode == ExitCode.USAGE and "source" in one_line(p)
    assert tree_digest(coco) == before


# --- 2. bytes pass through untouched, for every codec; the bytes name the codec ------------------------


def _encoded(fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    frames = [Image.fromarray(photo(40, 56, seed=k)) for k in range(3)]
    if kw.pop("frames", False):
        frames[0].save(buf, fmt, save_all=True, append_images=frames[1:], **kw)
    else:
        frames[0].save(buf, fmt, **kw)
    return buf.getvalue()


CODECS = {  # file name -> (bytes, the codec they hold)
    "lossless.webp": (lambda: _encoded("WEBP", lossless=True), "webp"),
    "animated.webp": (lambda: _encoded("WEBP", frames=True, duration=100), "webp"),
    "pages.tiff": (lambda: _encoded("TIFF", frames=True), "tiff"),
    "j2k.jp2": (lambda: _encoded("JPEG2000"), "jpeg2000"),
    "plain.bmp": (lambda: _encoded("BMP"), "bmp"),
    "moving.jpg": (lambda: _encoded("GIF", frames=True, duration=100), "gif"),  # GIF bytes named .jpg
    "avif.jpg": (lambda: _encoded("AVIF"), "avif"),
    "photo.jpg": (lambda: jpeg_bytes(photo(40, 56)), "jpeg"),
    "saved.jfif": (lambda: jpeg_bytes(photo(32, 48)), "jpeg"),  # a JPEG as browsers on Windows save it
}


@pytest.fixture
def codecs_folder(tmp_path) -> Path:
    root = tmp_path / "codecs"
    (root / "a").mkdir(parents=True)
    for name, (make, _) in CODECS.items():
        (root / "a" / name).write_bytes(make())
    return root


@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "folder", "coco"])
def test_no_pixel_option_passes_every_codec_through_untouched(codecs_folder, tmp_path, to):
    src = {k: ((codecs_folder / "a" / n).read_bytes(), c) for n, (_, c) in CODECS.items() for k in [Path(n).stem]}
    s = convert(codecs_folder, tmp_path / "out", to=to)
    assert s.records_out == len(CODECS) and s.passthrough == len(CODECS) and not s.transcoded
    with open_dataset(tmp_path / "out") as r:
        got = {rec.key.rsplit("/", 1)[-1]: rec for rec in r}
    for stem, (data, codec) in src.items():
        assert got[stem].data == data, stem  # byte for byte: a lossless WebP stays lossless, frames stay
        assert got[stem].codec == codec, stem
    if to == "tfrecord":
        from tfrecord.reader import tfrecord_loader

        shard = next((tmp_path / "out").glob("*.tfrecord"))
        formats = {bytes(ex["image/source_id"]).decode().rsplit("/", 1)[-1]: bytes(ex["image/format"]).decode()
                   for ex in tfrecord_loader(str(shard), None)}
        assert formats["moving"] == "gif" and formats["avif"] == "avif" and formats["photo"] == "JPEG"
    if to == "webdataset":
        names = tarfile.open(next((tmp_path / "out").glob("*.tar"))).getnames()
        assert "a/moving.gif" in names and "a/avif.avif" in names


def test_quality_alone_re_encodes_jpegs_only(codecs_folder, tmp_path):
    s = convert(codecs_folder, tmp_path / "out", to="webdataset", quality=80)
    jpegs = sum(codec == "jpeg" for _, codec in CODECS.values())
    assert jpegs == 2 and s.transcoded == jpegs and s.passthrough == len(CODECS) - jpegs


@pytest.mark.parametrize("to", ["lmdb", "recordio"])
def test_a_format_whose_readers_cannot_decode_a_codec_refuses_before_writing(codecs_folder, tmp_path, to):
    p = run_cli("convert", codecs_folder, tmp_path / "out", "--to", to)
    assert p.returncode == ExitCode.USAGE
    err = one_line(p)
    assert "cannot hold" in err and ("gif" in err or "avif" in err) and "--image-format" in err
    assert not (tmp_path / "out").exists() and [x.name for x in tmp_path.iterdir()] == ["codecs"]
    s = convert(codecs_folder, tmp_path / "out", to=to, image_format="png")  # the fix the error names
    assert s.records_out == len(CODECS)


# --- 3 and 12. no record dropped without a word; a broken container keeps its complete records --------


def _written(src: Path, dst: Path, to: str, n: int = 40, **kw) -> Path:
    convert(src, dst, to=to, limit=n, **kw)
    return dst


def _tar_of(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members.items():
            info_ = tarfile.TarInfo(name)
            info_.size = len(data)
            t.addfile(info_, io.BytesIO(data))
    return buf.getvalue()


def test_imagenets_training_tar_of_class_tars_reads_as_its_extracted_class_folders(tmp_path):
    """``ILSVRC2012_img_train.tar`` holds one tar a class (``n01440764.tar`` of ``n01440764_10026.JPEG``...). Read
    as shards, every inner tar was a sample without an image ("no image, video or audio member (has: tar)"), so
    the set needed extracting twice over. It reads as the class folders its extraction makes (the same keys,
    labels by the classes' sorted names), its members where they lie; an inner tar cut short is said."""
    images = {c: {f"{c}_{k}.JPEG": jpeg_bytes(photo(24, 32, seed=10 * i + k)) for k in range(3)}
              for i, c in enumerate(["n01443537", "n01440764"])}
    (tmp_path / "train.tar").write_bytes(_tar_of({f"{c}.tar": _tar_of(m) for c, m in images.items()}))
    report = info(tmp_path / "train.tar")
    assert report.records == 6 and report.classes == ["n01440764", "n01443537"]
    convert(tmp_path / "train.tar", tmp_path / "folders", to="folder")
    extracted = tmp_path / "extracted"
    for c, members in images.items():
        for name, data in members.items():
            (extracted / c).mkdir(parents=True, exist_ok=True)
            (extracted / c / name).write_bytes(data)
    convert(extracted, tmp_path / "from-folders", to="folder")
    images_of = {k: v for k, v in tree_digest(tmp_path / "folders").items() if k.endswith(".JPEG")}
    assert len(images_of) == 6 and images_of == {k: v for k, v in tree_digest(tmp_path / "from-folders").items()
                                                 if k.endswith(".JPEG")}
    listed = sorted((tmp_path / "folders" / "file_list.txt").read_text().splitlines())  # (in the tar's order)
    assert listed == sorted((tmp_path / "from-folders" / "file_list.txt").read_text().splitlines())
    assert content(tmp_path / "folders") == content(extracted)
    with open_dataset(tmp_path / "train.tar") as r:
        assert sorted((rec.key, rec.label) for rec in r) == [(f"{c}/{c}_{k}", i) for i, c in
                                                             enumerate(["n01440764", "n01443537"]) for k in range(3)]
    # an inner tar cut short (its end-of-archive blocks and its last member's tail lost when it was made)
    whole = _tar_of(images["n01440764"])
    last = tarfile.open(fileobj=io.BytesIO(whole)).getmembers()[-1]
    cut = whole[: last.offset_data + 100]
    (tmp_path / "cut.tar").write_bytes(_tar_of({"n01440764.tar": cut, "n01443537.tar": _tar_of(images["n01443537"])}))
    s = convert(tmp_path / "cut.tar", tmp_path / "cut-out", to="webdataset")
    assert s.records_in == s.records_out + len(s.skipped) and s.records_out == 5, s.skipped
    assert all("damaged inner tar n01440764.tar: bytes" in e["reason"] for e in s.skipped), s.skipped
    (tmp_path / "ends.tar").write_bytes(_tar_of({"n01440764.tar": whole[: last.offset]}))  # (cut on a member's end)
    s = convert(tmp_path / "ends.tar", tmp_path / "ends-out", to="webdataset")
    assert s.records_out == 2 and [e["reason"] for e in s.skipped] == [
        "the inner tar has no end-of-archive block: it was cut short when it was made, and the members after its "
        "last whole one are lost"], s.skipped


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_tar_of_an_image_folder_says_how_to_read_its_classes_and_does_with_from_folder(tmp_path, suffix):
    """Caltech-256, Food-101 and Stanford Dogs ship as tars of class folders (``food-101/images/<class>/<id>.jpg``,
    beside ``meta/``). Read as shards, their samples carry no label: a warning says so and names --from folder,
    which reads the class folders as classes, keyed as the extracted folder would be, naming what it leaves out."""
    tree = tmp_path / "tree"
    for i, c in enumerate(["ceviche", "apple_pie"]):
        for k in range(2):
            (tree / "food-101" / "images" / c).mkdir(parents=True, exist_ok=True)
            (tree / "food-101" / "images" / c / f"{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=10 * i + k)))
    (tree / "food-101" / "meta").mkdir()
    (tree / "food-101" / "meta" / "train.txt").write_text("apple_pie/0\n")
    (tree / "food-101" / "images" / "ceviche" / "._0.jpg").write_bytes(b"\0\5\x16\7\0\2\0\0Mac OS X        ")
    src = tmp_path / f"food-101{suffix}"
    with tarfile.open(src, "w:gz" if suffix.endswith("gz") else "w") as t:
        t.add(tree / "food-101", "food-101")
    s = convert(src, tmp_path / "as-shards", to="webdataset")
    assert s.records_out == 4 and not info(tmp_path / "as-shards").classes
    assert any(w.startswith(f"the samples of {src} carry no label and their images lie in 2 folders under "
                            "food-101/images/ (apple_pie/, ceviche/): to read those folders as classes") and
               "pass --from folder" in w for w in s.warnings), s.warnings
    s = convert(src, tmp_path / "as-folder", to="folder", from_format="folder")
    assert s.records_out == 4 and not s.skipped
    assert (f"left out of {src}, as no records: 1 file that is no image (food-101/meta/train.txt); 1 hidden file or "
            "folder (food-101/images/ceviche/._0.jpg)") in s.warnings, s.warnings
    convert(tree / "food-101" / "images", tmp_path / "extracted", to="folder")
    assert content(tmp_path / "as-folder") == content(tmp_path / "extracted")
    assert sorted(p.relative_to(tmp_path / "as-folder").as_posix() for p in (tmp_path / "as-folder").rglob("*.jpg")) \
        == ["apple_pie/0.jpg", "apple_pie/1.jpg", "ceviche/0.jpg", "ceviche/1.jpg"]


def test_a_tar_of_class_folders_whose_file_names_hold_dots_gives_a_record_a_file(tmp_path):
    """Kaggle's dogs-vs-cats names its files ``cat.0.jpg``, ``cat.1.jpg``. webdataset's key ends at a name's first
    dot, so read as shards such a folder's files are one sample: with --from folder (and in a tar of class tars) 6
    files had made 2 records, exit 0, their other images members of those samples (dropped by LMDB). Each file is
    now a record, keyed as the extracted folder's; read as shards, the warning says how the files were grouped."""
    tree = tmp_path / "tree"
    for i, c in enumerate(["cat", "dog"]):
        (tree / c).mkdir(parents=True)
        for k in range(3):
            (tree / c / f"{c}.{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=10 * i + k)))
    src = tmp_path / "train.tar"
    with tarfile.open(src, "w") as t:
        for f in sorted(tree.rglob("*.jpg")):
            t.add(f, f.relative_to(tree).as_posix())
    nested = tmp_path / "classes.tar"  # (as ImageNet's training tar: a tar a class)
    with tarfile.open(nested, "w") as t:
        for c in ("cat", "dog"):
            with tarfile.open(tmp_path / f"{c}.tar", "w") as inner:
                for f in sorted((tree / c).glob("*.jpg")):
                    inner.add(f, f.name)
            t.add(tmp_path / f"{c}.tar", f"{c}.tar")
    def items(path):
        import lmdb

        env = lmdb.open(str(path), readonly=True, lock=False)
        with env.begin() as txn:
            out = list(txn.cursor())
        env.close()
        return out

    convert(tree, tmp_path / "extracted", to="lmdb")
    want = items(tmp_path / "extracted")
    assert len(want) == 6
    for source, options in ((src, {"from_format": "folder"}), (nested, {})):
        out = tmp_path / f"from-{source.stem}"
        s = convert(source, out, to="lmdb", **options)
        assert s.records_in == s.records_out == 6 and not s.skipped and not s.warnings, (s.records_out, s.warnings)
        assert items(out) == want
    s = convert(src, tmp_path / "as-shards", to="webdataset")
    assert s.records_out == 2
    assert any(w.endswith("pass --from folder; as shards, 6 of its files make 2 samples (a webdataset key ends at a "
                          "name's first dot)") for w in s.warnings), s.warnings
    captioned = tmp_path / "captioned.tar"  # (a webdataset whose samples hold an image and its caption: no such files)
    with tarfile.open(captioned, "w") as t:
        for f in sorted(tree.rglob("*.jpg")):
            key = f.relative_to(tree).as_posix().replace(".", "_", 1)
            t.add(f, key)
            caption = tarfile.TarInfo(key[: -len(".jpg")] + ".txt")
            caption.size = len(f.parent.name)
            t.addfile(caption, io.BytesIO(f.parent.name.encode()))
    s = convert(captioned, tmp_path / "captioned", to="webdataset")
    assert s.records_out == 6 and not s.warnings, s.warnings


@pytest.mark.parametrize("fmt", ["webdataset", "recordio", "tfrecord", "parquet"])
def test_a_shard_gone_from_a_dataset_gpubatch_wrote_is_named_with_its_records(imagenet, tmp_path, fmt):
    """A folder copied or downloaded in part: webdataset's and RecordIO's shard names count no total, so a lost shard
    had read as a smaller dataset, exit 0 and no word (12 records of 60 gone). The manifest's shard table names it;
    TFRecord's and Parquet's numbered names said so already, and say it once."""
    src = tmp_path / "src"
    convert(imagenet, src, to=fmt, shard_size=12)
    table = json.loads((src / "gpubatch.json").read_text())["shards"]
    lost = sorted(table)[1]
    (src / lost).unlink()
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == sum(table.values()) - table[lost]
    assert [e for e in s.skipped if lost in e["key"]] == [e for e in s.skipped], s.skipped
    assert len(s.skipped) == 1
    if fmt in ("webdataset", "recordio"):  # (TFRecord's and Parquet's -of- names say it, once)
        assert s.skipped[0]["reason"] == (f"the dataset's gpubatch.json lists this shard with {table[lost]:,} records, "
                                          "but the folder does not hold it: its records are lost (a copy or download "
                                          "cut short?)")
    if fmt == "webdataset":  # (its shards gzipped since, each beside the name it had: the same one lost)
        import gzip

        for shard in src.glob("*.tar"):
            shard.with_name(shard.name + ".gz").write_bytes(gzip.compress(shard.read_bytes()))
            shard.unlink()
        again = convert(src, tmp_path / "again", to="webdataset")
        assert again.records_out == s.records_out and [e["key"] for e in again.skipped] == [lost]


def test_a_flipped_byte_in_a_tar_header_mid_shard_skips_that_sample_only(imagenet, tmp_path):
    wds = _written(imagenet, tmp_path / "wds", "webdataset")
    shard = next(wds.glob("*.tar"))
    members = tarfile.open(shard).getmembers()
    victim = members[len(members) // 2]
    raw = bytearray(shard.read_bytes())
    raw[victim.offset + 100] ^= 0x40  # inside the header: its checksum fails
    shard.write_bytes(bytes(raw))
    s = convert(wds, tmp_path / "out", to="tfrecord")
    assert accounted(s) and s.records_out == 39 and len(s.skipped) == 1
    assert "damaged" in s.skipped[0]["reason"]


@pytest.mark.parametrize("index", ["empty", "stale", "negative", "huge"])
def test_an_index_that_does_not_describe_its_tfrecord_shard_is_not_trusted(imagenet, tmp_path, index):
    tfr = _written(imagenet, tmp_path / "tfr", "tfrecord")
    idx = next(tfr.glob("*.idx"))
    rows = idx.read_text().splitlines()
    idx.write_text({"empty": "", "stale": "\n".join(rows[:25]) + "\n", "negative": "-10 4000\n" + "\n".join(rows[1:]),
                    "huge": rows[0].split()[0] + " 1152921504606846976\n" + "\n".join(rows[1:])}[index])
    s = convert(tfr, tmp_path / "out", to="webdataset")
    assert s.records_in == s.records_out == 40 and not s.skipped
    assert any("does not describe" in w for w in s.warnings)
    assert info(tfr).records == 40


def test_an_unreadable_class_folder_is_listed_and_the_classes_after_it_keep_their_labels(imagenet, tmp_path,
                                                                                      monkeypatch):
    from gpubatch.formats import files

    classes = sorted(p.name for p in imagenet.iterdir() if p.is_dir())
    locked = classes[1]
    real = files._list_folder

    def listing(path):  # chmod 000, as the superuser CI runs as would still read it
        if os.path.basename(path) == locked:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(files, "_list_folder", listing)
    s = convert(imagenet, tmp_path / "out", to="webdataset")
    assert accounted(s) and len(s.skipped) == 1 and "cannot list the folder" in s.skipped[0]["reason"]
    with open_dataset(tmp_path / "out") as r:
        assert r.info().classes == tuple(classes)
        last = [rec.label for rec in r if rec.key.startswith(classes[-1] + "/")]
    assert last and set(last) == {len(classes) - 1}


@pytest.mark.parametrize("damage", ["truncated", "bad length crc", "2^60 length"])
def test_a_damaged_tfrecord_shard_without_index_keeps_the_records_around_the_damage(imagenet, tmp_path, damage):
    tfr = _written(imagenet, tmp_path / "tfr", "tfrecord")
    for idx in tfr.glob("*.idx"):
        idx.unlink()
    shard = next(tfr.glob("*.tfrecord"))
    raw = bytearray(shard.read_bytes())
    offsets = []
    pos = 0
    while pos < len(raw):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", raw, pos)[0]
    if damage == "truncated":
        raw = raw[: offsets[-1] + 100]
    elif damage == "bad length crc":
        raw[offsets[10] + 9] ^= 0xFF
    else:
        from gpubatch.formats.tfrecord import _masked_crc

        head = struct.pack("<Q", 1 << 60)
        raw[offsets[10] : offsets[10] + 12] = head + _masked_crc(head)
    shard.write_bytes(bytes(raw))
    s = convert(tfr, tmp_path / "out", to="webdataset")
    assert accounted(s) and s.records_out == 39 and len(s.skipped) == 1
    assert "damaged shard" in s.skipped[0]["reason"]


@pytest.mark.parametrize("damage", ["bad magic", "truncated"])
def test_a_damaged_recordio_file_keeps_the_records_around_the_damage(imagenet, tmp_path, damage):
    rec_dir = _written(imagenet, tmp_path / "rec", "recordio")
    rec = next(rec_dir.glob("*.rec"))
    raw = bytearray(rec.read_bytes())
    offsets = [int(ln.split("\t")[1]) for ln in rec.with_suffix(".idx").read_text().splitlines()]
    if damage == "bad magic":
        raw[offsets[10]] ^= 0xFF
    else:
        raw = raw[: offsets[-1] + 50]
    rec.write_bytes(bytes(raw))
    s = convert(rec_dir, tmp_path / "out", to="webdataset")
    assert accounted(s) and s.records_out == 39 and len(s.skipped) == 1
    # the index names the record a cut lost, by its key
    assert ("damaged file" if damage == "bad magic" else "cut short") in s.skipped[0]["reason"]


def test_a_recordio_index_with_a_negative_offset_is_a_warning_not_a_write_error(imagenet, tmp_path):
    rec_dir = _written(imagenet, tmp_path / "rec", "recordio")
    idx = next(rec_dir.glob("*.idx"))
    lines = idx.read_text().splitlines()
    idx.write_text("\n".join(["0\t-10", *lines[1:]]) + "\n")
    s = convert(rec_dir, tmp_path / "out", to="webdataset")
    assert s.records_out == 40 and any("does not match" in w for w in s.warnings)
    p = run_cli("info", rec_dir)
    assert p.returncode == 0 and "Traceback" not in p.stderr


def test_a_recordio_index_offset_damaged_past_the_end_names_no_record_lost(imagenet, tmp_path):
    """An ``.idx`` row whose offset a damaged digit puts past the file's end, beside a file that holds every record
    whole: every record is read and the index's mismatch said, and no record is called lost (a cut file's index
    lists more records than the file holds: those are, by key)."""
    rec_dir = _written(imagenet, tmp_path / "rec", "recordio")
    idx = next(rec_dir.glob("*.idx"))
    lines = idx.read_text().splitlines()
    k, off = lines[9].split("\t")
    lines[9] = f"{k}\t{int(off) + 10**9}"
    idx.write_text("\n".join(lines) + "\n")
    s = convert(rec_dir, tmp_path / "out", to="webdataset")
    assert s.records_out == 40 and not s.skipped and any("does not match" in w for w in s.warnings)


# --- 4, 10, 11, 14. outputs: atomic swap, the leftovers of killed runs, concurrent runs, the cwd -------


def test_overwrite_swaps_atomically_where_the_file_system_can(imagenet, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert(imagenet, out, to="webdataset", limit=5)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    can = _paths._renameat2(tmp_path / "a", tmp_path / "b", _paths._RENAME_EXCHANGE)
    (tmp_path / "a").rmdir()
    (tmp_path / "b").rmdir()
    flags = []
    real = _paths._renameat2
    monkeypatch.setattr(_paths, "_renameat2", lambda a, b, f: flags.append(f) or real(a, b, f))
    replace = os.replace

    def no_gap(a, b):  # (shards and journal entries are renamed into place inside the staging folder)
        if Path(b) == out or Path(a) == out:
            pytest.fail("a rename that leaves no DST for a moment")
        return replace(a, b)

    monkeypatch.setattr(_paths.os, "replace", no_gap)
    if can:  # one exchange of the two names: there is no moment without a DST
        convert(imagenet, out, to="webdataset", limit=7, overwrite=True)
        assert flags == [_paths._RENAME_EXCHANGE]
        with open_dataset(out) as r:
            assert len(r) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet", "out"]


def test_a_run_killed_mid_swap_gets_its_old_output_restored_by_the_next_run(imagenet, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert(imagenet, out, to="webdataset", limit=5)
    before = tree_digest(out)
    monkeypatch.setattr(_paths, "_renameat2", lambda a, b, f: False)  # a file system without an exchange
    real = os.replace
    calls = []

    def killed(a, b):
        if out in (Path(a), Path(b)):  # (the swap's renames; shards are renamed into place before it)
            calls.append((a, b))
        if len(calls) == 2:  # the old DST moved aside, the new one not yet in: killed here
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(_paths.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        convert(imagenet, out, to="webdataset", limit=7, overwrite=True)
    monkeypatch.setattr(_paths.os, "replace", real)
    assert not out.exists() and any(p.name.startswith(".out.gpubatch-old-") for p in tmp_path.iterdir())
    with pytest.raises(UsageError, match="already exists.*restored"):
        convert(imagenet, out, to="webdataset", limit=7)
    assert tree_digest(out) == before
    s = convert(imagenet, out, to="webdataset", limit=7, overwrite=True)
    assert s.records_out == 7 and sorted(p.name for p in tmp_path.iterdir()) == ["imagenet", "out"]


def test_the_staging_of_a_killed_run_is_removed_by_the_next_run_to_its_output(imagenet, tmp_path):
    stale = tmp_path / ".out.gpubatch-partial-999999-abcdef"
    stale.mkdir()
    (stale / "data-000000.tar").write_bytes(b"\0" * 4096)
    s = convert(imagenet, tmp_path / "out", to="webdataset", limit=5)
    assert not stale.exists() and any("removed 1 unfinished output folder" in w for w in s.warnings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet", "out"]


def test_a_second_run_to_the_same_output_is_refused_while_the_first_holds_it(imagenet, tmp_path):
    import fcntl

    lock = tmp_path / ".out.gpubatch-lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"4242")
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = run_cli("convert", imagenet, tmp_path / "out", "--to", "webdataset")
    finally:
        os.close(fd)
    assert p.returncode == ExitCode.ERROR and "another gpubatch run (pid 4242)" in one_line(p)
    assert not (tmp_path / "out").exists()


def test_an_output_that_appears_while_the_run_goes_is_one_line_and_leaves_no_staging(imagenet, tmp_path,
                                                                                   monkeypatch):
    from gpubatch.formats import webdataset

    real = webdataset.WebDatasetSink._sample  # (a record, whether written alone or in a batch)

    def meanwhile(self, record, parts=None):  # another program makes DST while this run writes
        (tmp_path / "out").mkdir(exist_ok=True)
        return real(self, record, parts)

    monkeypatch.setattr(webdataset.WebDatasetSink, "_sample", meanwhile)
    with pytest.raises(UsageError, match="appeared while the run was going"):
        convert(imagenet, tmp_path / "out", to="webdataset", limit=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet", "out"]
    assert not any((tmp_path / "out").iterdir())


def test_an_output_renamed_in_by_another_program_at_the_last_moment_is_kept(imagenet, tmp_path, monkeypatch):
    real = _paths._renameat2

    def landing(a, b, flags):  # between this run's last check and its rename, another program's output lands
        if not Path(b).exists():
            Path(b).mkdir()
            (Path(b) / "theirs.txt").write_text("theirs")
        return real(a, b, flags)

    monkeypatch.setattr(_paths, "_renameat2", landing)
    with pytest.raises(UsageError, match="appeared while the run was going"):
        convert(imagenet, tmp_path / "out", to="webdataset", limit=3)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet", "out"]


def test_the_current_folder_as_output_is_refused(imagenet, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    (here / "keep.txt").write_text("mine")
    env = child_env()
    p = subprocess.run([sys.executable, "-m", "gpubatch", "convert", str(imagenet), ".", "--to", "webdataset",
                        "--overwrite"], cwd=here, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == ExitCode.USAGE and "current folder" in one_line(p)
    assert [x.name for x in here.iterdir()] == ["keep.txt"]


def test_sigterm_winds_the_run_down_as_ctrl_c(imagenet, tmp_path):
    script = ("import time, sys\nfrom gpubatch.formats import webdataset\n"
              "real = webdataset.WebDatasetSink._sample\n"  # (a record, whether written alone or in a batch)
              "def slow(self, r, parts=None):\n    time.sleep(0.2)\n    return real(self, r, parts)\n"
              "webdataset.WebDatasetSink._sample = slow\n"
              "from gpubatch.cli import main\nmain(sys.argv[1:])\n")
    env = child_env()
    proc = subprocess.Popen([sys.executable, "-c", script, "convert", str(imagenet), str(tmp_path / "out"),
                             "--to", "webdataset", "-q", "--workers", "1"], env=env, stderr=subprocess.PIPE, text=True)
    import time

    time.sleep(2.5)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.TERMINATED, err
    assert "terminated" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet"]


# --- 5. absurd labels --------------------------------------------------------------------------------


def _two_images(root: Path) -> None:
    root.mkdir()
    for k in range(2):
        (root / f"{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=k)))


def test_a_label_of_twenty_million_takes_no_table_of_twenty_million(tmp_path):
    src = tmp_path / "src"
    _two_images(src)
    (src / "file_list.txt").write_text("0.jpg 3\n1.jpg 20000000\n")
    for to in ("webdataset", "folder", "tfrecord", "recordio"):
        s = convert(src, tmp_path / to, to=to)
        assert s.records_out == 2
        assert (tmp_path / to / "gpubatch.json").stat().st_size < 20_000
        with open_dataset(tmp_path / to) as r:
            classes = r.info().classes
            assert len(classes) == 20_000_001 and classes[20_000_000] == "20000000"
            assert sorted(rec.label for rec in r) == [3, 20_000_000]
    assert info(tmp_path / "webdataset").records == 2


def _tfrecord_with(path: Path, features: list[dict]) -> None:
    from tfrecord.writer import TFRecordWriter

    path.mkdir()
    w = TFRecordWriter(str(path / "x.tfrecord"))
    for f in features:
        w.write(f)
    w.close()


def _image_feature(k: int = 0, **more) -> dict:
    return {"image/encoded": (jpeg_bytes(photo(24, 32, seed=k)), "byte"), **more}


def _source_with_label(kind: str, root: Path, label) -> Path:
    """A two-record source whose second record has class ``label``, in a format of each kind."""
    from gpubatch.formats.lmdb import encode_datum
    from gpubatch.formats.recordio import _IR, frame

    if kind == "file_list":
        _two_images(root)
        (root / "file_list.txt").write_text(f"0.jpg 1\n1.jpg {label}\n")
    elif kind == "tfrecord":
        _tfrecord_with(root, [_image_feature(0, **{"image/class/label": (1, "int")}),
                              _image_feature(1, **{"image/class/label": (int(label), "int")})])
    elif kind == "datum":
        import lmdb

        env = lmdb.open(str(root), map_size=1 << 24)
        with env.begin(write=True) as txn:
            txn.put(b"00000000_a", encode_datum(jpeg_bytes(photo(24, 32)), 1))
            txn.put(b"00000001_b", encode_datum(jpeg_bytes(photo(24, 32, seed=1)), int(label)))
        env.close()
    elif kind == "recordio":
        root.mkdir()
        data = b"".join(frame(_IR.pack(0, float(v), i, 0) + jpeg_bytes(photo(24, 32, seed=i)))
                        for i, v in enumerate([1, label]))
        (root / "x.rec").write_bytes(data)
    else:  # a WebDataset .cls
        root.mkdir()
        with tarfile.open(root / "x.tar", "w", format=tarfile.GNU_FORMAT) as tf:
            for k, (key, cls) in enumerate((("a", "1"), ("b", str(label)))):
                for ext, payload in (("jpg", jpeg_bytes(photo(24, 32, seed=k))), ("cls", cls.encode())):
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(payload)
                    tf.addfile(ti, io.BytesIO(payload))
    return root


@pytest.mark.parametrize("kind", ["file_list", "tfrecord", "datum", "recordio", "cls"])
def test_a_label_of_ten_to_the_twelfth_is_that_records_error(tmp_path, kind):
    src = _source_with_label(kind, tmp_path / "src", 10**12)
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_in == 2 and s.records_out == 1 and len(s.skipped) == 1
    assert "outside 0..2,147,483,647" in s.skipped[0]["reason"]
    assert info(src).records == 1


@pytest.mark.parametrize("label", ["nan", "inf"])
def test_a_recordio_label_that_is_no_number_is_that_records_error(tmp_path, label):
    src = _source_with_label("recordio", tmp_path / "src", float(label))
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and "not a finite number" in s.skipped[0]["reason"]
    assert info(src).records == 1


# --- 6. a truncated LMDB ---------------------------------------------------------------------------


def test_a_truncated_lmdb_is_refused_in_one_line_not_a_bus_error(imagenet, tmp_path):
    db = _written(imagenet, tmp_path / "db", "lmdb")
    data = db / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    for args in (("info", db), ("convert", db, tmp_path / "out", "--to", "webdataset")):
        p = run_cli(*args)
        assert p.returncode == ExitCode.ERROR, (p.returncode, p.stderr)
        assert "is cut short: it holds" in one_line(p)
    assert not (tmp_path / "out").exists()


def test_an_lmdb_whose_meta_page_names_a_page_far_past_its_end_is_said_cut_short_or_damaged(imagenet, tmp_path):
    """A byte of the newer meta page's last page number flipped (`byte_flips.py --media stored`, 2026-12-07): the
    file is whole, so "truncated" alone misled; refused in one line that names both."""
    import struct

    db = _written(imagenet, tmp_path / "db", "lmdb")
    data = bytearray((db / "data.mdb").read_bytes())
    psize = struct.unpack_from("<I", data, 40)[0]
    at = max((0, psize), key=lambda a: struct.unpack_from("<Q", data, a + 144)[0])  # (the newer: its txnid)
    data[at + 136 + 3] ^= 0x40  # (its last page number, 2^30 pages further)
    (db / "data.mdb").write_bytes(bytes(data))
    p = run_cli("convert", db, tmp_path / "out", "--to", "webdataset")
    assert p.returncode == ExitCode.ERROR and "is cut short or its meta page damaged" in one_line(p), p.stderr
    assert not (tmp_path / "out").exists()


def test_an_lmdb_cut_short_while_it_is_read_stops_the_run_before_reading_past_its_end(imagenet, tmp_path):
    db = _written(imagenet, tmp_path / "db", "lmdb")
    with open_dataset(db) as r:
        entries = r.entries()
        r.read(entries[0])
        with open(db / "data.mdb", "r+b") as f:
            f.truncate(8192)
        with pytest.raises(GpubatchError, match="shrank"):
            r.read(entries[-1])


# --- 7. special files -------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_and_a_link_to_dev_zero_named_as_images_are_skipped_not_read(imagenet, tmp_path):
    cls = sorted(p for p in imagenet.iterdir() if p.is_dir())[0]
    os.mkfifo(cls / "pipe.jpg")
    os.symlink("/dev/zero", cls / "zero.jpg")
    os.symlink(tmp_path / "nowhere.jpg", cls / "dangling.jpg")
    p = run_cli("info", imagenet, "--json")
    assert p.returncode == 0 and len(json.loads(p.stdout)["unreadable"]) == 3
    p = run_cli("convert", imagenet, tmp_path / "out", "--to", "webdataset", "--json")
    s = summary_of(p)
    assert p.returncode == 0 and s["records_out"] == 60 and s["records_in"] == 63
    reasons = sorted(e["reason"] for e in s["skipped"])
    assert reasons == ["a FIFO, not a regular file", "a broken link, not a regular file",
                       "a character device, not a regular file"]


def test_every_read_is_bounded(tmp_path):
    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff\xd8\xff" + bytes(5000))
    with pytest.raises(ValueError, match="bound"):
        _paths.read_regular(big, limit=4096)


# --- 8. a bad record is that record's error, never a traceback ----------------------------------------


def _tfr_case(meta=None, **more) -> list[dict]:
    good = _image_feature(0)
    bad = _image_feature(1, **more)
    if meta is not None:
        bad["gpubatch/meta"] = (meta, "byte")
    return [good, bad]


def _hostile(kind: str, root: Path) -> Path:
    if kind == "tfrecord meta not an object":
        _tfrecord_with(root, _tfr_case(b"[1, 2, 3]"))
    elif kind == "tfrecord meta not json":
        _tfrecord_with(root, _tfr_case(b"{not json"))
    elif kind == "tfrecord meta nested deep":
        _tfrecord_with(root, _tfr_case(b"[" * 100_000 + b"]" * 100_000))
    elif kind == "tfrecord bbox lists of unequal lengths":
        _tfrecord_with(root, _tfr_case(**{"image/object/bbox/xmin": ([0.1, 0.2], "float"),
                                          "image/object/bbox/ymin": ([0.1], "float"),
                                          "image/object/bbox/xmax": ([0.5, 0.6], "float"),
                                          "image/object/bbox/ymax": ([0.5, 0.6], "float")}))
    elif kind.startswith("coco"):
        shutil.copytree(ROOT / "sample_data" / "coco", root)
        ann = root / "annotations" / "instances.json"
        doc = json.loads(ann.read_text())
        im = doc["images"][0 if kind == "coco file_name 12" else 1]
        if kind == "coco height nan":
            text = json.dumps(doc).replace(f'"height": {im["height"]}', '"height": NaN', 1)
            ann.write_text(text)
            return root
        if kind == "coco height tall":
            im["height"] = "tall"
        elif kind == "coco file_name 12":
            im["file_name"] = 12
        elif kind == "coco category_id 1e30":
            doc["annotations"][0]["category_id"] = 10**30
        elif kind == "coco non-object category":
            doc["categories"].append("person")
        ann.write_text(json.dumps(doc))
    elif kind.startswith("webdataset"):
        root.mkdir()
        bad_json = {"webdataset json huge int": b'{"label": 1' + b"0" * 40 + b"}",
                    "webdataset json nested deep": b'{"meta": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                    "webdataset json digits beyond python": b'{"width": 1' + b"0" * 5000 + b"}"}[kind]
        with tarfile.open(root / "x.tar", "w", format=tarfile.GNU_FORMAT) as tf:
            for k, (key, doc) in enumerate((("a", b'{"label": 1}'), ("b", bad_json))):
                for ext, payload in (("jpg", jpeg_bytes(photo(24, 32, seed=k))), ("json", doc)):
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(payload)
                    tf.addfile(ti, io.BytesIO(payload))
    elif kind.startswith("file_list"):
        _two_images(root)
        text = {"file_list escaping path": b"0.jpg 0\n../../etc/passwd.jpg 1\n",
                "file_list not utf-8": b"0.jpg 0\n\xff\xfe.jpg 1\n"}[kind]
        (root / "file_list.txt").write_bytes(text)
    return root


HOSTILE = ["tfrecord meta not an object", "tfrecord meta not json", "tfrecord meta nested deep",
           "tfrecord bbox lists of unequal lengths", "coco height nan", "coco height tall", "coco file_name 12",
           "coco category_id 1e30", "webdataset json huge int", "webdataset json nested deep",
           "webdataset json digits beyond python", "file_list escaping path", "file_list not utf-8"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_field_skips_its_record_with_a_reason(tmp_path, kind):
    src = _hostile(kind, tmp_path / "src")
    p = run_cli("convert", src, tmp_path / "out", "--to", "webdataset", "--json")
    s = summary_of(p)
    assert p.returncode == 0 and s["records_out"] + len(s["skipped"]) == s["records_in"]
    if kind == "coco category_id 1e30":  # an annotation, not a record: dropped, with a warning
        assert not s["skipped"] and any("1 annotation dropped" in w for w in s["warnings"])
        return
    assert len(s["skipped"]) == 1 and s["skipped"][0]["reason"]
    p = run_cli("info", src, "--json")
    assert p.returncode == 0 and len(summary_of(p)["unreadable"]) == 1


def test_a_non_object_category_is_left_out_with_a_warning(tmp_path):
    src = _hostile("coco non-object category", tmp_path / "src")
    s = convert(src, tmp_path / "out", to="coco")
    assert s.records_out == 12 and any("'categories' left out" in w for w in s.warnings)


def test_a_coco_json_nested_100k_deep_is_one_line(tmp_path):
    (tmp_path / "src" / "annotations").mkdir(parents=True)
    (tmp_path / "src" / "annotations" / "instances.json").write_text(
        '{"images": [], "annotations": ' + "[" * 100_000 + "]" * 100_000 + "}")
    p = run_cli("convert", tmp_path / "src", tmp_path / "out", "--to", "webdataset")
    assert p.returncode == ExitCode.ERROR and "nested too deeply" in one_line(p)


@pytest.mark.parametrize("classes", [5, "cat", {"count": -3}, [1, 2]])
def test_a_hostile_manifest_is_ignored(imagenet, tmp_path, classes):
    wds = _written(imagenet, tmp_path / "wds", "webdataset")
    m = json.loads((wds / "gpubatch.json").read_text())
    m["classes"] = classes
    m["categories"] = ["x", {"id": "y"}]
    (wds / "gpubatch.json").write_text(json.dumps(m))
    s = convert(wds, tmp_path / "out", to="folder")
    assert s.records_out == 40
    assert info(wds).records == 40


# --- 9. disk full ----------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "setpgid"), reason="needs POSIX resource limits")
@pytest.mark.parametrize("how", [("--shard-size", "100000"), ("--shard-size", "10", "--workers", "2")],
                         ids=["one-process", "worker-processes"])
@pytest.mark.parametrize("to", ["lmdb", "tfrecord", "webdataset"])
def test_a_full_disk_is_the_one_line_write_error_with_no_staging_left(imagenet, tmp_path, to, how):
    """A file-size limit (RLIMIT_FSIZE) makes writes fail as a full disk does, with EFBIG: in the command's own
    process, and in worker processes (which inherit the limit), where the error is raised as in one process."""
    script = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (200000, 200000))\n"
              "from gpubatch.cli import main\nmain(sys.argv[1:])\n")
    env = child_env()
    p = subprocess.run([sys.executable, "-c", script, "convert", str(imagenet), str(tmp_path / "out"), "--to", to,
                        *how], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == ExitCode.ERROR, p.stderr
    assert one_line(p).startswith(f"error: writing {tmp_path / 'out'} failed: ") and "Traceback" not in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["imagenet"]


def test_a_full_disk_at_the_manifest_is_the_one_line_write_error(imagenet, tmp_path, monkeypatch):
    from gpubatch import runner

    def full(root, content):
        raise OSError(errno.ENOSPC, "No space left on device", str(root / "gpubatch.json"))

    monkeypatch.setattr(runner, "write_manifest", full)
    with pytest.raises(GpubatchError, match="No space left on device"):
        convert(imagenet, tmp_path / "out", to="webdataset")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["imagenet"]


# --- 15. smaller ones -------------------------------------------------------------------------------


def test_an_image_beyond_jpegs_side_limit_names_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(np.full((1, 65000, 3), 128, np.uint8)).save(src / "strip.jpg")
    (src / "ok.jpg").write_bytes(jpeg_bytes(photo(24, 32)))
    s = convert(src, tmp_path / "out", to="webdataset", resize_shorter=16, max_pixels=0)
    assert s.records_out == 1 and "65,535" in s.skipped[0]["reason"] and "--image-format png" in s.skipped[0]["reason"]
    s = convert(src, tmp_path / "png", to="webdataset", resize_shorter=16, max_pixels=0, image_format="png")
    assert s.records_out == 2


def test_limit_zero_writes_nothing_and_fails(imagenet, tmp_path):
    p = run_cli("convert", imagenet, tmp_path / "out", "--to", "webdataset", "--limit", "0")
    assert p.returncode == ExitCode.ERROR and "nothing written" in one_line(p)
    assert not (tmp_path / "out").exists()


def test_what_is_on_disk_wins_over_the_manifests_format(imagenet, tmp_path):
    (imagenet / "gpubatch.json").write_text(json.dumps({"gpubatch": "0", "format": "lmdb"}))
    s = convert(imagenet, tmp_path / "out", to="webdataset")
    assert s.src_format == "folder" and s.records_out == 60
    assert any("says lmdb" in w for w in s.warnings)


# --- passed-through bytes: PNG CRCs always, every image decoded with --verify full ---------------------


def test_a_flipped_byte_in_a_png_is_caught_by_its_crc(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    buf = io.BytesIO()
    Image.fromarray(photo(64, 64)).save(buf, "PNG")
    raw = bytearray(buf.getvalue())
    raw[len(raw) // 2] ^= 0x01
    (src / "bad.png").write_bytes(bytes(raw))
    (src / "ok.png").write_bytes(buf.getvalue())
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 1 and "CRC" in s.skipped[0]["reason"]


def test_verify_full_decodes_every_passed_through_image(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    good = jpeg_bytes(photo(96, 128))
    bad = bytearray(good)
    bad[len(bad) // 2 : len(bad) // 2 + 200] = b"\xff" * 200  # broken entropy-coded data, the end marker kept
    (src / "hole.jpg").write_bytes(bytes(bad))
    (src / "ok.jpg").write_bytes(good)
    assert convert(src, tmp_path / "fast", to="webdataset").records_out == 2  # the default reads headers only
    p = run_cli("convert", src, tmp_path / "full", "--to", "webdataset", "--verify", "full", "--json")
    s = summary_of(p)
    assert p.returncode == 0 and s["records_out"] == 1, s


def test_a_damaged_lmdb_page_cannot_crash_the_process(tmp_path):
    """A node offset past its page once made the LMDB library read past the end of the file through its
    memory map: the process died of SIGBUS (exit -7). Keys and values are now read within the pages the
    meta page declares; the damaged page's records are one skipped entry, the others convert."""
    src = tmp_path / "l"
    convert(ROOT / "sample_data" / "imagenet", src, to="lmdb", limit=12, resize_shorter=24, quality=80)
    path = src / "data.mdb"
    data = bytearray(path.read_bytes())
    psize = struct.unpack_from("<I", data, 40)[0]
    leaves = [n for n in range(2, len(data) // psize) if struct.unpack_from("<H", data, n * psize + 10)[0] & 0x02]
    struct.pack_into("<H", data, leaves[-1] * psize + 16, 0xFFF0)  # the last leaf's first node: far past the page
    path.write_bytes(bytes(data))
    code = (f"from gpubatch.api import convert; s = convert({str(src)!r}, {str(tmp_path / 'o')!r}, to='webdataset'); "
            "print(s.records_out, s.records_in, *[e['reason'] for e in s.skipped], sep='|')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-500:])
    out, total, reason = p.stdout.strip().split("|")
    assert 0 < int(out) < 12 and int(total) == int(out) + 1
    assert f"page {leaves[-1]}" in reason and "outside its node area" in reason


def test_lmdb_layouts_the_page_reader_leaves_to_the_library(tmp_path):
    import lmdb

    from gpubatch.formats.lmdb_pages import PageFile, Unsupported

    env = lmdb.open(str(tmp_path / "d"), map_size=1 << 24, max_dbs=2)
    db = env.open_db(b"images")  # a named sub-database: the main database holds its name
    with env.begin(write=True, db=db) as txn:
        for k in range(3):
            txn.put(b"%08d_k%d" % (k, k), jpeg_bytes(photo(16, 16, k)))
    env.close()
    pages = PageFile(tmp_path / "d" / "data.mdb")
    with pytest.raises(Unsupported):
        pages.walk()
    pages.close()
    with pytest.raises(GpubatchError, match="neither a Caffe Datum"):  # the library lists the main database:
        convert(tmp_path / "d", tmp_path / "o", to="folder")  # one key, the sub-database's name, as before


def test_a_tar_member_with_a_hidden_name_or_no_extension_is_listed_not_dropped(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with tarfile.open(src / "data-000000.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [("a.jpg", jpeg_bytes(photo(16, 16))), ("a.cls", b"0"), ("..name.jpg", jpeg_bytes(photo(8, 8))),
                           ("README", b"notes"), ("b.jpg", jpeg_bytes(photo(16, 16, 1))), ("b.cls", b"1")]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    s = convert(src, tmp_path / "out", to="folder")
    assert s.records_out == 2 and accounted(s)
    reasons = {e["key"]: e["reason"] for e in s.skipped}
    assert set(reasons) == {"data-000000.tar#..name.jpg", "data-000000.tar#README"}
    assert "hidden" in reasons["data-000000.tar#..name.jpg"] and "no extension" in reasons["data-000000.tar#README"]


@pytest.mark.parametrize("name", ["data.json", "annotations/x.json", "a.tar", "b.rec", "c.tfrecord", "meta.csv",
                                  "file_list.txt", "manifest.json", "gpubatch.json"])
def test_a_fifo_named_like_a_dataset_file_never_hangs_detection(imagenet, tmp_path, name):
    fifo = imagenet / name
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    for args in (("info", imagenet), ("convert", imagenet, tmp_path / "out", "--to", "webdataset")):
        p = subprocess.run([sys.executable, "-m", "gpubatch", *map(str, args)], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)  # a hang fails here
        assert "Traceback" not in p.stderr, p.stderr


def test_a_gpubatch_shards_index_stands_for_its_scan_until_the_tar_changes(imagenet, tmp_path):
    """The DALI index gpubatch writes beside each tar lists what a walk over the tar's headers finds (the
    loader and every reader take it instead of the walk); a tar cut short, a sample's bytes moved, or an
    index older than its tar, and the walk is taken again."""
    import os
    import time

    from gpubatch.formats.tar_scan import _samples, indexed_samples, scan_tar
    from gpubatch.formats.webdataset import WebDatasetReader

    out = tmp_path / "wds"
    convert(imagenet, out, to="webdataset", shard_size=16)
    tars = sorted(out.glob("*.tar"))
    for tar in tars:
        with open(tar, "rb") as f:
            members, damage, _ = scan_tar(f, tar.stat().st_size)
        assert indexed_samples(tar) == _samples(0, tar, members, damage)
    whole = WebDatasetReader(out)
    keys = [e[1] for e in whole.entries()]
    assert len(keys) == 60 and [whole.read(e).key for e in whole.entries()] == keys
    # cut short by two blocks: the index no longer stands for it, and the walk names the loss
    tar = tars[1]
    tar.write_bytes(tar.read_bytes()[:-1024 - 10240 + 512])
    assert indexed_samples(tar) is None
    # an index older than its tar is not taken
    t = time.time()
    os.utime(tars[2].with_suffix(".idx"), (t - 100, t - 100))
    assert indexed_samples(tars[2]) is None


@pytest.mark.parametrize("lie", ["size", "offset", "another-cls"])
def test_a_member_an_index_misplaces_is_read_from_where_the_tar_holds_it(imagenet, tmp_path, lie):
    """A DALI index beside a gpubatch shard stands for the tar where its first and last samples' headers agree;
    a middle row damaged to another number (a size of ``+5934`` for ``25934`` read as 5,934 bytes and the image
    lost, an offset to another ``.cls`` member's and the record written under another's label) is found by the
    header before the member and read from where a walk over the tar finds it: by ``convert`` (a copy and a
    re-encoding), by ``info`` and by the loader's reader, every record whole."""
    from gpubatch.formats.webdataset import WebDatasetReader
    from gpubatch.report.info import describe

    out = tmp_path / "wds"
    convert(imagenet, out, to="webdataset", shard_size=16)
    truth = {e[1]: WebDatasetReader(out).read(e) for e in WebDatasetReader(out).entries()}
    idx = out / "data-000001.idx"
    lines = idx.read_text().splitlines(keepends=True)
    row = lines[5].split()  # (a middle sample: cls OFF SIZE NAME IMG OFF SIZE NAME)
    if lie == "size":
        i = row.index(next(p for p in row if p.endswith((".jpg", ".png")))) - 1
        row[i] = "+" + row[i][1:]
    elif lie == "offset":
        i = row.index(next(p for p in row if p.endswith((".jpg", ".png")))) - 2
        row[i] = str(int(row[i]) + 512)
    else:  # (another class's sample's .cls)
        row[1] = next(x.split() for x in lines[1:] if x.split()[3].split("/")[0] != row[3].split("/")[0])[1]
    lines[5] = " ".join(row) + "\n"
    os.utime(idx.parent / "data-000001.tar", (1, 1))  # (the index newer than its tar still)
    idx.write_text("".join(lines))
    reader = WebDatasetReader(out)
    got = {e[1]: reader.read(e) for e in reader.entries()}
    assert {k: (r.data, r.label) for k, r in got.items()} == {k: (r.data, r.label) for k, r in truth.items()}
    assert describe(out).records == 60
    for i, kw in enumerate(({}, {"resize_shorter": 32})):
        s = convert(out, tmp_path / f"o{i}", to="folder", **kw)
        assert s.records_out == 60 and not s.skipped


# --- more shards than open files -------------------------------------------------------------------


def test_shard_descriptors_stay_under_their_cap_and_every_thread_reads_its_own_shard_s_bytes(tmp_path):
    """A reader's shard descriptors (``formats.base.OpenShards``): at most ``cap`` open, the least recently used
    closed first but never one a read holds, so that eight threads reading 24 shards at random through three
    descriptors each get their own shard's bytes."""
    import random
    import threading

    from gpubatch.formats.base import OpenShards, open_cap

    paths = []
    for i in range(24):
        p = tmp_path / f"s{i:02d}.bin"
        p.write_bytes(bytes([i]) * 4096 + os.urandom(4096))
        paths.append(p)
    files = OpenShards(paths, cap=3)
    wrong, most = [], [0]

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(600):
            s = rng.randrange(24)
            with files.reading(s) as fd:
                most[0] = max(most[0], files.open_now())
                if os.pread(fd, 16, rng.randrange(4080)) != bytes([s]) * 16:
                    wrong.append(s)
            if files.pread(s, 8, 100) != bytes([s]) * 8:
                wrong.append(s)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and files.open_now() <= 3 and most[0] <= 3 + 8  # (past the cap only by the reads held)
    files.close()
    assert files.open_now() == 0 and 32 <= open_cap() <= 1024


@pytest.mark.skipif(not hasattr(os, "setpgid"), reason="needs POSIX resource limits")
@pytest.mark.parametrize("fmt", ["webdataset", "tfrecord", "recordio"])
def test_a_dataset_of_more_shards_than_open_files_is_read_whole(imagenet, tmp_path, fmt):
    """With 96 open files allowed (``ulimit -n``; 1,024 is a common default) and 160 shard files, ``info`` reads
    every record and ``convert`` writes every one: the readers had kept a descriptor a shard (records listed
    unreadable, the run's own writes refused with ``Too many open files``)."""
    import resource

    many = tmp_path / "many"
    convert(imagenet, many, to=fmt, shard_size=2)
    assert len(list(many.iterdir())) >= 60

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (96, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    env = child_env()
    p = subprocess.run([sys.executable, "-m", "gpubatch", "info", str(many), "--json"], env=env, capture_output=True,
                       text=True, timeout=300, preexec_fn=low)
    got = json.loads(p.stdout)
    assert p.returncode == 0 and got["records"] == 60 and not got.get("unreadable"), p.stderr
    p = subprocess.run([sys.executable, "-m", "gpubatch", "convert", str(many), str(tmp_path / "out"), "--to", "tfrecord",
                        "--workers", "2", "--json"], env=env, capture_output=True, text=True, timeout=300,
                       preexec_fn=low)
    assert p.returncode == 0 and json.loads(p.stdout)["records_out"] == 60, p.stderr


# --- names as file systems hold them -----------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="names of bytes that are not UTF-8: Linux file systems hold them")
@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "lmdb", "recordio", "folder", "coco", "parquet"])
def test_file_names_of_any_bytes_length_or_case_are_written_by_every_format(tmp_path, to):
    """A folder of names with a byte that is not UTF-8, a newline, a 250-character stem, two that differ only in
    case, dots: every format writes every record (Parquet, whose string columns hold UTF-8 only, lists the one
    it cannot hold, with its reason in words); LMDB and TFRecord keep the name's bytes, read back as they were.
    Before, LMDB and Parquet failed the run with a traceback and COCO lost the 250-character name's extension."""
    if to == "parquet":
        pytest.importorskip("pyarrow")
    src = tmp_path / "src"
    (src / "cls a").mkdir(parents=True)
    names = [b"with space.jpg", b"new\nline.jpg", b"bad\xffbyte.jpg", "\u00fcn\u00efc\u00f6d\u00e9.jpg".encode(),
             b"x" * 250 + b".jpg", b"UPPER.jpg", b"upper.jpg", b"dots..jpg", b"a.b.c.jpg"]
    for i, n in enumerate(names):
        with open(os.path.join(os.fsencode(src / "cls a"), n), "wb") as f:
            f.write(jpeg_bytes(photo(24 + i, 32, seed=i)))
    s = convert(src, tmp_path / "out", to=to)
    assert s.records_in == len(names)
    if to == "parquet":
        assert s.records_out == len(names) - 1 and len(s.skipped) == 1
        assert "bad\\xffbyte" in s.skipped[0]["reason"] and "not UTF-8" in s.skipped[0]["reason"]
    else:
        assert s.records_out == len(names) and not s.skipped
    back = convert(tmp_path / "out", tmp_path / "back", to="webdataset")
    assert back.records_out == s.records_out and not back.skipped
    if to in ("lmdb", "tfrecord"):
        with open_dataset(tmp_path / "out") as reader:
            keys = {r.key for r in reader}
        assert "cls a/bad\udcffbyte" in keys and "cls a/" + "x" * 250 in keys
    if to == "coco":
        listed = json.loads((tmp_path / "out" / "annotations" / "instances.json").read_text())["images"]
        assert all(im["file_name"].endswith(".jpg") for im in listed) and len(listed) == len(names)


def test_a_safe_file_name_cut_to_200_characters_keeps_its_extension():
    from gpubatch.formats.folder import safe_component

    assert safe_component("x" * 250 + ".jpg") == "x" * 196 + ".jpg"
    assert safe_component("y" * 250) == "y" * 200
    assert safe_component("z" * 220 + "." + "e" * 40) == ("z" * 220 + "." + "e" * 40)[:200]
    assert safe_component("ok name.png") == "ok_name.png"


def test_a_compressed_shard_is_decompressed_once_for_every_process_that_reads_it(tmp_path, monkeypatch):
    """A run's workers each open the source: each decompressed a big ``.tar.gz`` into a copy of its own (17 copies
    for 16 workers and the listing). The copy is now made once, shared, and removed by the last reader that lets it
    go; a copy nobody holds (left by killed processes) is swept when another is made."""
    import tempfile

    from gpubatch.formats import base
    from gpubatch.formats.webdataset import WebDatasetReader

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    made = []
    real = base.decompress_into
    monkeypatch.setattr(base, "decompress_into", lambda *a: made.append(a[0]) or real(*a))
    tree = tmp_path / "tree"
    for c in ("cat", "dog"):
        (tree / c).mkdir(parents=True)
        (tree / c / "0.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=len(c))))
    src = tmp_path / "pets.tar.gz"
    with tarfile.open(src, "w:gz") as t:
        t.add(tree, "pets")
    folder = tmp_path / "tmp" / f"gpubatch-unpacked-{os.getuid()}"
    stale = folder / ("0" * 32 + ".tar-whole")
    folder.mkdir()
    stale.write_bytes(b"left by a killed run")
    first, second = WebDatasetReader(src, folder_classes="image"), WebDatasetReader(src, folder_classes="image")
    assert [first.read(e).key for e in first.entries()] == [second.read(e).key for e in second.entries()] == \
        ["cat/0", "dog/0"]
    assert made == [src] and not stale.exists()  # (one copy made; the stale one swept as it was)
    copies = list(folder.glob("*.tar-*"))
    assert len(copies) == 1
    first.close()
    assert copies[0].exists()  # (the second reader holds it still)
    second.close()
    assert not copies[0].exists()


@pytest.mark.parametrize("to", ["webdataset", "recordio", "lmdb"])
def test_info_reads_a_shards_image_headers_only_and_says_what_a_whole_read_says(imagenet, tmp_path, monkeypatch, to):
    """``info`` on shards read every image whole (140 GB for ImageNet's training tar); a sample of one image and a
    ``.cls`` (a RecordIO record of one part and a scalar label, an LMDB's encoded Datum) is now described from its
    image's first bytes, and the report is the one whole reads give."""
    from gpubatch.formats.lmdb import LmdbReader
    from gpubatch.formats.recordio import RecordIOReader
    from gpubatch.formats.webdataset import WebDatasetReader

    cls = {"webdataset": WebDatasetReader, "recordio": RecordIOReader, "lmdb": LmdbReader}[to]
    convert(imagenet, tmp_path / "out", to=to, shard_size=20)
    (tmp_path / "out" / "gpubatch.json").unlink()  # (a foreign set: nothing but the shards)
    fast = info(tmp_path / "out")
    reads = []
    real = cls._read
    monkeypatch.setattr(cls, "_read", lambda self, e, *a: reads.append(e) or real(self, e, *a))
    assert info(tmp_path / "out").as_dict() == fast.as_dict() and reads == []
    monkeypatch.setattr(cls, "peek", lambda self, e, n: None)
    whole = info(tmp_path / "out")
    assert len(reads) == 60 and whole.as_dict() == fast.as_dict()
    assert fast.classes and fast.records == 60


def test_a_datums_layout_is_read_from_its_first_and_last_bytes_or_left_to_a_whole_read():
    from gpubatch.formats.lmdb_datum import datum_layout, decode_datum, encode_datum

    def layout(value: bytes):
        return datum_layout(lambda at, n: value[at : at + n], len(value))

    image = jpeg_bytes(photo(24, 32, seed=3))
    for value in (encode_datum(image, 7), b"\x08\x03\x10\x18\x18\x20" + encode_datum(image, -1)):  # (Caffe: c, h, w)
        start, size, found = layout(value)
        assert value[start : start + size] == image
        assert found == {k: v for k, v in decode_datum(value).items() if k != "data"}
    assert layout(b"\x08" + b"\x81" * 70 + b"\x01" + encode_datum(image, 1)) is None  # (data past the first 64 bytes)
    assert layout(encode_datum(image, 1)[: len(image) // 2]) is None  # (cut short: the whole read says so)
    assert layout(image) is None  # (an image stored bare)
