"""An image folder in a ZIP (Kaggle's train.zip, COCO's val2017.zip), read as the folder its extraction makes."""

from __future__ import annotations

import zipfile

import pytest

from gpubatch.api import convert, info, open_dataset
from gpubatch.errors import GpubatchError
from tests.helpers import content, jpeg_bytes, photo, run_cli, tree_digest


def _tree(root, classes=("dog", "cat"), per=3):
    for i, c in enumerate(classes):
        (root / c).mkdir(parents=True, exist_ok=True)
        for k in range(per):
            (root / c / f"{c}.{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=10 * i + k)))
    return root


def _zipped(tree, out, prefix="train/", beside="labels.csv"):
    """``tree`` zipped under ``prefix``, its members stored and deflated in turn, with what a Mac's zip adds."""
    with zipfile.ZipFile(out, "w") as z:
        for n, p in enumerate(sorted(p for p in tree.rglob("*") if p.is_file())):
            rel = prefix + p.relative_to(tree).as_posix()
            z.write(p, rel, compress_type=zipfile.ZIP_STORED if n % 2 else zipfile.ZIP_DEFLATED)
            z.writestr(f"__MACOSX/{rel.rsplit('/', 1)[0]}/._{p.name}", b"\0\5\x16\7\0\2\0\0Mac OS X        ")
        z.writestr(prefix + beside, "id,label\n")
    return out


def test_a_zip_of_class_folders_reads_as_its_extraction(tmp_path):
    tree = _tree(tmp_path / "tree")
    src = _zipped(tree, tmp_path / "pets.zip")
    report = info(src)
    assert report.format == "folder" and report.records == 6 and report.classes == ["cat", "dog"]
    assert report.left_out == {"hidden": {"count": 1, "names": ["__MACOSX/"]},
                               "other": {"count": 1, "names": ["train/labels.csv"]}}
    s = convert(src, tmp_path / "wds", to="webdataset")  # (an output beside the ZIP: no overlap)
    assert s.records_out == 6 and not s.skipped
    assert any(w.startswith(f"left out of {src}, as no records: 1 file that is no image (train/labels.csv); 1 hidden")
               for w in s.warnings), s.warnings
    assert content(tmp_path / "wds") == content(tree)
    with open_dataset(src) as r:
        assert sorted(rec.key for rec in r) == sorted(f"{c}/{c}.{k}" for c in ("cat", "dog") for k in range(3))
        for entry in r.entries():  # (info's header reads: a stored member's bytes, a deflated one's inflated)
            rec = r.read(entry)
            assert r.peek(entry, 64) == (rec.data[:64], len(rec.data), rec.label)
    one = convert(src, tmp_path / "one", to="tfrecord", workers=1, shard_size=2)
    two = convert(src, tmp_path / "two", to="tfrecord", workers=2, shard_size=2)
    assert one.records_out == two.records_out == 6
    drop = {"gpubatch.json"}
    assert {k: v for k, v in tree_digest(tmp_path / "one").items() if k not in drop} == \
        {k: v for k, v in tree_digest(tmp_path / "two").items() if k not in drop}


def test_a_flat_zip_is_unlabeled_and_the_command_reads_it(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for k in range(4):
        (flat / f"cat.{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=k)))
    src = _zipped(flat, tmp_path / "train.zip")
    assert info(src).records == 4 and not info(src).classes
    p = run_cli("convert", src, tmp_path / "out", "--to", "folder", "--json")
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in (tmp_path / "out").glob("*.jpg")) == [f"cat.{k}.jpg" for k in range(4)]


@pytest.mark.parametrize("damage", ["stored byte", "deflated byte", "encrypted"])
def test_a_damaged_or_encrypted_member_is_that_records_error(tmp_path, damage):
    tree = _tree(tmp_path / "tree", per=2)
    src = _zipped(tree, tmp_path / "pets.zip")
    raw = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        infos = {i.filename: i for i in z.infolist()}
    target = infos["train/cat/cat.1.jpg" if damage == "stored byte" else "train/cat/cat.0.jpg"]
    assert target.compress_type == (zipfile.ZIP_STORED if damage == "stored byte" else zipfile.ZIP_DEFLATED)
    data_at = target.header_offset + 30 + len(target.filename.encode()) + len(target.extra)
    if damage == "encrypted":
        central = raw.index(b"PK\x01\x02")
        while raw[central + 46 : central + 46 + len(target.filename)] != target.filename.encode():
            central = raw.index(b"PK\x01\x02", central + 4)
        raw[central + 8] |= 1  # (the central directory's flags: what the listing reads)
    else:
        raw[data_at + target.compress_size // 2] ^= 0xFF
    src.write_bytes(bytes(raw))
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 3 and [e["key"] for e in s.skipped] == ["cat/cat.1" if damage == "stored byte" else
                                                                    "cat/cat.0"], s.skipped
    reason = s.skipped[0]["reason"]
    assert ("encrypted member" in reason if damage == "encrypted" else "damaged member" in reason), reason


def test_a_zip_cut_short_is_one_line_naming_the_repair(tmp_path):
    src = _zipped(_tree(tmp_path / "tree"), tmp_path / "pets.zip")
    src.write_bytes(src.read_bytes()[:-200])  # (its central directory's end lost)
    with pytest.raises(GpubatchError, match="is a damaged ZIP .*zip -FF"):
        info(src, "folder")
    # its format not named, the same line: before, it said the ZIP held no image, audio or video file
    p = run_cli("convert", src, tmp_path / "out", "--to", "webdataset")
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1] == (
        f"error: {src} is a damaged ZIP (File is not a zip file: cut short, or its central directory lost); "
        f"'zip -FF {src} --out fixed.zip' rebuilds what it can"), p.stderr


def test_a_zip_whose_central_directory_names_an_unknown_version_is_one_line(tmp_path):
    """A byte of a central directory entry damaged into the version needed to extract (20.0 where 2.0 was):
    Python's zipfile raises NotImplementedError listing it, and the command ended in that traceback."""
    src = _zipped(_tree(tmp_path / "tree"), tmp_path / "pets.zip")
    data = bytearray(src.read_bytes())
    at = data.index(b"PK\x01\x02")  # (the first central directory entry: its version needed at +6)
    data[at + 6] = 200
    src.write_bytes(bytes(data))
    with pytest.raises(GpubatchError, match="is a damaged ZIP, or one Python's zipfile cannot list"):
        info(src, "folder")
    p = run_cli("convert", src, tmp_path / "out", "--to", "webdataset")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: {src} is a damaged ZIP"), p.stderr


def test_a_zip_whose_central_directory_entry_swallows_the_others_is_refused_not_read_short(tmp_path):
    """A byte of the first central directory entry's comment length damaged: Python's zipfile reads that entry's
    comment over the entries after it and lists one file, and a run wrote 1 image of 6 with no word. The end
    record's count of entries tells: the ZIP is refused in one line, naming the repair."""
    src = _zipped(_tree(tmp_path / "tree"), tmp_path / "pets.zip")
    data = bytearray(src.read_bytes())
    at = data.index(b"PK\x01\x02")
    data[at + 33] = 0x40  # (its comment length's high byte: 16 KiB of comment)
    src.write_bytes(bytes(data))
    with pytest.raises(GpubatchError, match=r"damaged ZIP: its end record counts \d+ entries, its central directory "
                                            "lists 1"):
        convert(src, tmp_path / "out", to="webdataset", from_format="folder")


def test_a_zip_of_audio_class_folders_reads_with_from_audio(tmp_path):
    """A ZIP of recordings in word folders: detection names --from audio, which reads it as once extracted
    (``_background_noise_`` left out and said, as the audio folder reader does)."""
    from tests.audio.sounds import tone, write

    tree = tmp_path / "tree"
    for word, hz in (("yes", 440.0), ("no", 660.0), ("_background_noise_", 100.0)):
        write(tree / word / "a.wav", tone(0.25, hz), 16000, "wav")
    src = _zipped(tree, tmp_path / "words.zip", prefix="words/", beside="README.md")
    p = run_cli("info", src)
    assert p.stderr.strip().splitlines()[-1] == f"error: {src} is a ZIP archive of audio files: read it with --from audio"
    with open_dataset(src, "audio") as r:
        assert sorted((rec.key, rec.label, rec.media.value, rec.codec) for rec in r) == [
            ("no/a", 0, "audio", "wav"), ("yes/a", 1, "audio", "wav")]
    s = convert(src, tmp_path / "out", to="audio", from_format="audio")
    assert s.records_out == 2 and any("_background_noise_/a.wav" in w for w in s.warnings), s.warnings
    # ESC-50's ZIP: its labels lie in meta/esc50.csv, which the extracted folder is read by: refused, said how
    (tree / "meta").mkdir()
    (tree / "meta" / "esc50.csv").write_text("filename,fold,target,category\n")
    src = _zipped(tree, tmp_path / "esc50.zip", prefix="ESC-50-master/", beside="README.md")
    with pytest.raises(GpubatchError, match="esc50.zip holds ESC-50-master/meta/esc50.csv, which gives its records or "
                                            "labels once extracted: unpack it and pass the folder"):
        info(src, "audio")


@pytest.mark.parametrize("boxes", ["coco/annotations/instances_val2017.json", "voc/Annotations/000001.xml",
                                   "yolo/labels/000001.txt"])
def test_a_zip_of_a_detection_set_is_refused_naming_its_boxes(tmp_path, boxes):
    """Read as an image folder, a ZIP of a COCO, VOC or YOLO set would lose every box: refused, naming them."""
    with zipfile.ZipFile(tmp_path / "set.zip", "w") as z:
        z.writestr(boxes.split("/")[0] + "/images/000001.jpg", jpeg_bytes(photo(24, 32, seed=1)))
        z.writestr(boxes, "{}")
    p = run_cli("info", tmp_path / "set.zip")
    assert p.stderr.strip() == (f"error: {tmp_path / 'set.zip'} holds {boxes}, which gives its records or labels once "
                                "extracted: unpack it and pass the folder"), p.stderr


@pytest.mark.parametrize("packed", ["zip", "tar"])
def test_a_member_named_outside_the_archive_is_its_records_error_and_in_no_class(tmp_path, packed):
    """``/abs/y.jpg`` or ``a/../../evil.jpg``: neither is written anywhere nor counted as a class (an absolute name
    made a class "" that moved every label); each is its record's error."""
    import io
    import tarfile

    names = ["a/../../evil.jpg", "/abs/y.jpg", "r/a/x.jpg", "r/b/x.jpg"]
    src = tmp_path / f"evil.{packed}"
    if packed == "zip":
        with zipfile.ZipFile(src, "w") as z:
            for n in names:
                z.writestr(n, jpeg_bytes(photo(24, 32, seed=1)))
    else:
        with tarfile.open(src, "w", format=tarfile.GNU_FORMAT) as t:
            for n in names:
                data = jpeg_bytes(photo(24, 32, seed=1))
                member = tarfile.TarInfo(n)
                member.size = len(data)
                t.addfile(member, io.BytesIO(data))
    s = convert(src, tmp_path / "out", to="folder", from_format="folder")
    assert s.records_out == 2 and sorted(e["reason"].split(" ", 1)[0] for e in s.skipped) == ["absolute", "path"]
    assert info(tmp_path / "out").classes == ["a", "b"]
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.jpg")) == [
        "a/x.jpg", "b/x.jpg"]
