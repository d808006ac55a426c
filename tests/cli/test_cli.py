"""The command line: exit codes, one-line errors, safe output, summaries, --json, info."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpubatch import convert
from gpubatch.errors import ExitCode, RecordFailed, UsageError
from tests.helpers import ROOT, content, jpeg_bytes, photo, run_cli, tree_digest


def one_line_error(proc):
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith(("error:", "Error:"))]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    return errors[0]


def test_help_and_version():
    p = run_cli("--help")
    assert p.returncode == 0 and "convert" in p.stdout and "info" in p.stdout
    p = run_cli("--version")
    assert p.returncode == 0 and "gpubatch" in p.stdout


def test_convert_and_json_summary(imagenet, tmp_path):
    before = tree_digest(imagenet)
    p = run_cli("convert", imagenet, tmp_path / "out", "--to", "webdataset", "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["records_in"] == 60 and s["records_out"] == 60 and s["skipped"] == []
    assert s["device"] == "cpu" and "pass through" in s["device_reason"]
    assert "records out" in p.stderr  # the summary table goes to stderr
    assert tree_digest(imagenet) == before


def test_missing_source(tmp_path):
    p = run_cli("convert", tmp_path / "nope", tmp_path / "out", "--to", "lmdb")
    assert p.returncode == ExitCode.USAGE
    assert "does not exist" in one_line_error(p)
    p = run_cli("info", tmp_path / "nope")
    assert p.returncode == ExitCode.USAGE and "does not exist" in one_line_error(p)


def test_unknown_format(imagenet, tmp_path):
    p = run_cli("convert", imagenet, tmp_path / "out", "--to", "feather")
    assert p.returncode == ExitCode.USAGE and "feather" in p.stderr and "Traceback" not in p.stderr


def test_undetectable_source(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    p = run_cli("info", tmp_path / "junk")
    assert p.returncode == ExitCode.ERROR and "--from" in one_line_error(p)


def test_missing_folders_above_the_output_are_made_and_taken_back_on_failure(imagenet, tmp_path):
    p = run_cli("convert", imagenet, tmp_path / "build" / "sets" / "train", "--to", "tfrecord", "-q")
    assert p.returncode == 0, p.stderr
    assert content(tmp_path / "build" / "sets" / "train") == content(imagenet)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jpg").write_text("not an image")
    p = run_cli("convert", tmp_path / "bad", tmp_path / "made" / "for" / "it", "--to", "tfrecord")
    assert p.returncode == ExitCode.ERROR and not (tmp_path / "made").exists()
    (tmp_path / "file").write_text("")
    p = run_cli("convert", imagenet, tmp_path / "file" / "out", "--to", "tfrecord")
    assert p.returncode == ExitCode.USAGE and "is not a folder" in one_line_error(p)


def test_existing_destination_needs_overwrite(imagenet, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    p = run_cli("convert", imagenet, out, "--to", "tfrecord")
    assert p.returncode == ExitCode.USAGE and "--overwrite" in one_line_error(p)
    assert (out / "keep.txt").read_text() == "precious"
    p = run_cli("convert", imagenet, out, "--to", "tfrecord", "--overwrite", "-q")
    assert p.returncode == 0 and not (out / "keep.txt").exists()
    assert len(list(out.glob("*.tfrecord"))) == 1


@pytest.mark.parametrize("where", ["same", "inside"])
def test_destination_in_source_refused(imagenet, where):
    dst = imagenet if where == "same" else imagenet / "bird" / "out"
    before = tree_digest(imagenet)
    p = run_cli("convert", imagenet, dst, "--to", "lmdb", "--overwrite")
    assert p.returncode == ExitCode.USAGE and "inside" in one_line_error(p)
    assert tree_digest(imagenet) == before


def test_overwrite_cannot_delete_the_source(tmp_path, imagenet):
    parent = tmp_path / "parent"
    parent.mkdir()
    shutil.move(str(imagenet), parent / "src")
    p = run_cli("convert", parent / "src", parent, "--to", "lmdb", "--overwrite")
    assert p.returncode == ExitCode.USAGE and "delete the source" in one_line_error(p)
    assert (parent / "src" / "bird").is_dir()


def _add_bad_files(root):
    (root / "bird" / "truncated.jpg").write_bytes(jpeg_bytes(photo(64, 80))[:900])
    (root / "bird" / "text.jpg").write_bytes(b"this is not an image at all")
    (root / "car" / "empty.png").write_bytes(b"")


def test_bad_records_are_skipped_and_listed(imagenet, tmp_path):
    _add_bad_files(imagenet)
    for pixels in ([], ["--resize-shorter", "64"]):
        out = tmp_path / f"out{len(pixels)}"
        p = run_cli("convert", imagenet, out, "--to", "tfrecord", "--json", *pixels)
        assert p.returncode == 0, p.stderr
        s = json.loads(p.stdout)
        assert s["records_in"] == 63 and s["records_out"] == 60
        assert sorted(os.path.basename(e["origin"]) for e in s["skipped"]) == ["empty.png", "text.jpg", "truncated.jpg"]
        assert all(e["stage"] == "decode" and e["reason"] for e in s["skipped"])
        manifest = json.loads((out / "gpubatch.json").read_text())
        assert len(manifest["errors"]) == 3 and manifest["records"] == 60
        assert "skipped records" in p.stderr


def test_on_error_fail_stops_and_writes_nothing(imagenet, tmp_path):
    _add_bad_files(imagenet)
    out = tmp_path / "out"
    p = run_cli("convert", imagenet, out, "--to", "webdataset", "--on-error", "fail")
    assert p.returncode == ExitCode.BAD_RECORD
    assert "bad record" in one_line_error(p)
    assert not out.exists()
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".out")]  # no staging left behind


def test_a_run_that_converts_nothing_fails_and_writes_nothing(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jpg").write_text("not an image")
    (tmp_path / "bad" / "b.jpg").write_bytes(b"")
    p = run_cli("convert", tmp_path / "bad", tmp_path / "out", "--to", "tfrecord")
    assert p.returncode == ExitCode.ERROR
    assert "none of the 2 records" in one_line_error(p) and "nothing written" in p.stderr
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "file_list.txt").write_text("")
    p = run_cli("augment", tmp_path / "none", tmp_path / "out", "--preset", "resnet50-val", "--device", "cpu")
    assert p.returncode == ExitCode.ERROR and "holds no records" in one_line_error(p)
    assert not (tmp_path / "out").exists()
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".out")]


@pytest.mark.parametrize("at", [5, 30])
def test_an_interrupted_run_keeps_only_what_resume_needs(imagenet, tmp_path, monkeypatch, at):
    """Ctrl-C before any shard is committed leaves nothing; after some, the staging folder stays (its
    committed shards and journal) for --resume, which writes only the rest."""
    from gpubatch.formats import webdataset

    calls = {"n": 0}
    real = webdataset.WebDatasetSink._sample  # (a record, whether written alone or in a batch)

    def boom(self, record, parts=None):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real(self, record, parts)

    monkeypatch.setattr(webdataset.WebDatasetSink, "_sample", boom)
    with pytest.raises(KeyboardInterrupt) as e:
        convert(imagenet, tmp_path / "out", to="webdataset", shard_size=10, workers=1)
    left = sorted(p.name for p in tmp_path.iterdir())
    if at == 5:
        assert left == ["imagenet"]
        return
    assert left == [".out.gpubatch-partial", "imagenet"]
    assert "2 of 6 shards are committed" in e.value.gpubatch_kept and "--resume" in e.value.gpubatch_kept
    monkeypatch.setattr(webdataset.WebDatasetSink, "_sample", real)
    with pytest.raises(UsageError, match="pass resume to finish it, or overwrite=True to start over"):
        convert(imagenet, tmp_path / "out", to="webdataset", shard_size=10, workers=1)
    s = convert(imagenet, tmp_path / "out", to="webdataset", shard_size=10, workers=1, resume=True)
    assert s.records_out == 60 and any("2 of 6 shards were committed" in w for w in s.warnings)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imagenet", "out"]


def test_fail_policy_from_python(imagenet, tmp_path):
    (imagenet / "car" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0garbage")
    with pytest.raises(RecordFailed):
        convert(imagenet, tmp_path / "out", to="lmdb", on_error="fail")
    assert not (tmp_path / "out").exists()


def test_max_pixels_refuses_before_decoding(imagenet, tmp_path):
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "folder", "--max-pixels", "40000", "--json", "-q")
    s = json.loads(p.stdout)
    assert p.returncode == 0 and s["records_out"] < 60
    assert all("exceeds --max-pixels 40000" in e["reason"] for e in s["skipped"])


def test_device_gpu_without_gpu_is_one_line(imagenet, tmp_path):
    from gpubatch.engine.device import gpu_problem

    if gpu_problem(0)[0] is None:
        pytest.skip("this machine has a usable GPU")
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "lmdb", "--resize-shorter", "64", "--device", "gpu")
    assert p.returncode == ExitCode.USAGE and "--device gpu" in one_line_error(p)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args", [
    ("convert", "--to", "lmdb"),  # bytes passed through: no GPU in the run, the size still checked
    ("convert", "--to", "lmdb", "--resize-shorter", "64", "--device", "cpu"),
    ("augment", "--preset", "resnet50-val", "--device", "cpu"),
])
@pytest.mark.parametrize("cap", ["12XB", "0", "0MiB", "1.2.3"])  # malformed, or no memory at all
def test_malformed_gpu_memory_is_refused_whatever_the_device(imagenet, tmp_path, args, cap):
    p = run_cli(args[0], imagenet, tmp_path / "o", *args[1:], "--gpu-memory", cap)
    assert p.returncode == ExitCode.USAGE and f"--gpu-memory '{cap}'" in one_line_error(p)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["a/b", "", ".hidden"])
def test_a_shard_name_that_is_no_file_name_is_refused(imagenet, tmp_path, name):
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "tfrecord", "--name", name)
    assert p.returncode == ExitCode.USAGE and "--name" in one_line_error(p)
    assert not (tmp_path / "o").exists()


def test_auto_device_says_what_it_chose(imagenet, tmp_path):
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "lmdb", "--resize-shorter", "64", "--json")
    s = json.loads(p.stdout)
    assert p.returncode == 0 and s["device_reason"].startswith("auto:")
    assert "device:" in p.stderr


@pytest.mark.parametrize("fmt", ["folder", "lmdb", "tfrecord", "recordio", "coco", "webdataset"])
def test_info_on_every_format(imagenet, tmp_path, fmt):
    if fmt == "folder":
        path = imagenet
    else:
        path = tmp_path / fmt
        convert(imagenet, path, to=fmt)
    p = run_cli("info", path, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["format"] == fmt and r["records"] == 60
    assert r["class_counts"] == {"bird": 15, "car": 15, "flower": 15, "mountain": 15}
    assert r["codecs"] == {"jpeg": 58, "png": 2}
    assert r["width"]["min"] >= 100 and r["height"]["max"] < 400
    assert r["payload_bytes"] > 1_000_000 and r["disk_bytes"] >= r["payload_bytes"] * 0.9
    p = run_cli("info", path)
    assert p.returncode == 0 and "records per class" in p.stderr


@pytest.mark.parametrize("fmt", ["folder", "lmdb", "webdataset"])
def test_info_reads_the_same_in_its_reader_processes_and_ends_them(imagenet, tmp_path, fmt, monkeypatch):
    """On 4 cores or more ``info`` reads a large dataset's headers (PROCESSES_FROM_S, lowered here) in a process
    a core: the same report as its threads', no process left (LMDB's readers list the dataset first: their
    reads go through its page walk)."""
    import multiprocessing as mp

    from gpubatch.report import info as info_module

    path = imagenet if fmt == "folder" else tmp_path / fmt
    if fmt != "folder":
        convert(imagenet, path, to=fmt)
    from gpubatch.engine import processes

    threads = info_module.describe(path, workers=2).as_dict()
    pools = []
    real = processes.started_pool
    monkeypatch.setattr(processes, "started_pool", lambda n, **kw: pools.append(n) or real(n, **kw))
    monkeypatch.setattr(info_module, "PROCESSES_FROM_S", 1e9)  # (this process reads it all: a set this small)
    assert info_module.describe(path, workers=4).as_dict() == threads and not pools
    monkeypatch.setattr(info_module, "PROCESSES_FROM_S", 0.0)
    assert info_module.describe(path, workers=4).as_dict() == threads
    assert pools and not mp.active_children()


@pytest.mark.parametrize("cached", [True, False])
def test_info_reads_with_threads_beside_it_only_where_its_first_reads_wait_on_the_disk(imagenet, monkeypatch, cached):
    """``info`` times its first records' reads: from the page cache (waiting less than CACHED_WAIT_S) this thread reads
    the rest itself, threads reading beside it having taken it twice as long; reads that wait on the disk get
    reader threads. The same report either way."""
    from gpubatch.engine import executor
    from gpubatch.report import info as info_module

    whole = info_module.describe(imagenet, workers=2).as_dict()
    threads: list[int] = []
    real = executor.ordered_map
    monkeypatch.setattr(executor, "ordered_map", lambda fn, items, n, **kw: threads.append(n) or real(fn, items, n, **kw))
    monkeypatch.setattr(info_module, "CACHED_WAIT_S", 1.0 if cached else -1.0)
    monkeypatch.setattr(info_module, "PROCESSES_FROM_S", 1e9)
    assert info_module.describe(imagenet, workers=2).as_dict() == whole
    assert threads == ([1] if cached else [4])


def test_info_reads_an_image_folder_by_its_headers_with_the_report_of_whole_reads(tmp_path):
    """``info`` on a folder reads each image file's first bytes (4 KiB, then 64 KiB where its header lies
    further): the report equals the one whole reads make, also for JPEGs whose header lies past the first
    4 KiB and past the first 64 KiB (EXIF blocks), a damaged file and a Git LFS pointer named like an image."""
    from gpubatch.report import info as info_module

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    for i in range(5):
        (src / "a" / f"{i}.jpg").write_bytes(jpeg_bytes(photo(40 + i, 60, seed=i)))
    plain = jpeg_bytes(photo(48, 64, seed=9))
    block = b"\xff\xe1\xff\xff" + b"Exif\x00\x00" + bytes(65_527)  # an APP1 block (65,535 bytes at most: two)
    (src / "b" / "long-exif.jpg").write_bytes(plain[:2] + block + block + plain[2:])
    some = b"\xff\xe1\x4e\x22" + b"Exif\x00\x00" + bytes(20_000 - 6)  # (20,000 bytes: past 4 KiB, within 64)
    (src / "b" / "exif.jpg").write_bytes(plain[:2] + some + plain[2:])
    (src / "b" / "cut.jpg").write_bytes(plain[:300])
    (src / "b" / "lfs.jpg").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 123\n")
    from gpubatch.formats.folder import FolderReader

    real = FolderReader.peek
    asked: dict[str, list[int]] = {}

    def counted(self, entry, n):
        asked.setdefault(entry[0].rsplit("/", 1)[-1], []).append(n)
        return real(self, entry, n)

    FolderReader.peek = counted
    try:
        peeked = info_module.describe(src, workers=2).as_dict()
    finally:
        FolderReader.peek = real
    assert asked["0.jpg"] == [4096] and asked["exif.jpg"] == asked["long-exif.jpg"] == [4096, 65536]
    try:
        del FolderReader.peek  # every record read whole, as before readers could peek
        whole = info_module.describe(src, workers=2).as_dict()
    finally:
        FolderReader.peek = real
    assert peeked == whole
    assert peeked["records"] == 8 and len(peeked["unreadable"]) == 1  # (a header read says nothing of a cut end)
    assert "Git LFS pointer" in peeked["unreadable"][0]["reason"]
    assert peeked["height"] == {"min": 40, "median": 43.5, "mean": 44.2, "max": 48}  # (the EXIF ones': 48)
    assert peeked["payload_bytes"] == sum(f.stat().st_size for f in src.rglob("*.jpg") if f.name != "lfs.jpg")


def test_info_on_coco(coco):
    p = run_cli("info", coco, "--json")
    r = json.loads(p.stdout)
    assert r["format"] == "coco" and r["records"] == 12 and r["boxes"] == 31
    assert [c["name"] for c in r["categories"]] == ["square", "disc", "triangle"]
    # boxes per category, as pycocotools counts them; the table shows them, not "records per class" of images
    # that have no class ("(unlabeled)" for all 12)
    from pycocotools.coco import COCO

    api = COCO(str(next(coco.glob("annotations/*.json"))))
    want = {c["name"]: {"boxes": len(api.getAnnIds(catIds=[c["id"]])), "images": len(api.getImgIds(catIds=[c["id"]]))}
            for c in api.loadCats(api.getCatIds())}
    assert r["category_counts"] == want and sum(n["boxes"] for n in want.values()) == 31
    p = run_cli("info", coco)
    table = p.stdout + p.stderr
    assert "boxes per category" in table and "records per class" not in table and "none at the image level" in table
    doc = json.loads((coco / "annotations" / "instances.json").read_text())
    doc["categories"][1]["name"] = doc["categories"][0]["name"]  # (two ids, one name: each keeps its count)
    (coco / "annotations" / "instances.json").write_text(json.dumps(doc))
    shared = json.loads(run_cli("info", coco, "--json").stdout)["category_counts"]
    assert shared == {"square (1)": want["square"], "square (2)": want["disc"], "triangle": want["triangle"]}


def test_formats_command():
    p = run_cli("formats")
    assert p.returncode == 0 and "webdataset" in p.stdout and "recordio" in p.stdout


def test_heavy_imports_stay_lazy(imagenet):
    code = (
        "import sys, gpubatch; from gpubatch.cli import main\n"
        "try:\n    main(['info', sys.argv[1], '--json'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('cupy', 'nvidia.nvimgcodec', 'PyNvVideoCodec', 'av', 'torch', 'fsspec', 's3fs', 'aiohttp') "
        "if m in sys.modules]\n"
        "print('HEAVY', bad)"
    )
    p = subprocess.run([sys.executable, "-c", code, str(imagenet)], capture_output=True, text=True, cwd=ROOT)
    assert "HEAVY []" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-c", "import sys, gpubatch; gpubatch.__version__; "
                        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('PIL','numpy','lmdb','tfrecord')))"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.stdout.strip() == "[]", p.stdout


def test_the_command_leaves_its_objects_to_the_process_end_uncollected():
    """Run as the process's command, the CLI freezes the collector at its end (what it made is freed with
    the process, not collected first); called with arguments, as a program or a test calls it, it does not."""
    code = ("import gc, sys; from gpubatch.cli import main\n"  # (counted before and after: an interpreter's own
            "before = gc.get_freeze_count()\n"  # start may freeze objects, as a site's hooks can)
            "try:\n    main(None if sys.argv[1] == 'process' else ['--version'])\nexcept SystemExit:\n    pass\n"
            "print('FROZEN', gc.get_freeze_count() > before)")
    for how, frozen in (("process", True), ("call", False)):
        p = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, cwd=ROOT)
        assert f"FROZEN {frozen}" in p.stdout, p.stdout + p.stderr


def test_the_cli_called_with_arguments_gives_back_the_sigterm_handler_and_wording_it_found():
    """``main(argv)`` in a caller's process (a program's, a test's) installs its SIGTERM handler and the flags'
    wording for the command, and gives the caller's back after it: left installed, the handler made workers the
    caller forked later raise ``Terminated`` on SIGTERM instead of ending (the sniff's tests, run after the CLI's),
    and the library's later errors named flags, not keywords."""
    import signal

    from gpubatch.cli import main
    from gpubatch.errors import FROM_CLI

    def mine(signum, frame):  # pragma: no cover - never called
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(SystemExit):
            main(["--version"])
        assert signal.getsignal(signal.SIGTERM) is mine and FROM_CLI.get() is False
    finally:
        signal.signal(signal.SIGTERM, before)


def test_path_escape_in_coco_is_rejected(coco, tmp_path):
    doc = json.loads((coco / "annotations" / "instances.json").read_text())
    (tmp_path / "secret.jpg").write_bytes((coco / "images" / doc["images"][0]["file_name"]).read_bytes())
    doc["images"][1]["file_name"] = "../../secret.jpg"
    doc["images"][2]["file_name"] = "/etc/passwd"
    (coco / "annotations" / "instances.json").write_text(json.dumps(doc))
    s = convert(coco, tmp_path / "out", to="webdataset")
    assert s.records_out == 10 and len(s.skipped) == 2
    assert all("escapes" in e["reason"] or "absolute" in e["reason"] for e in s.skipped)


def test_path_escape_in_tar_is_rejected(imagenet, tmp_path):
    convert(imagenet, tmp_path / "w", to="webdataset", limit=4)
    tar = next((tmp_path / "w").glob("*.tar"))
    data = jpeg_bytes(photo(32, 32))
    with tarfile.open(tar, "a", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("../evil.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    s = convert(tmp_path / "w", tmp_path / "out", to="folder")
    assert s.records_out == 4 and len(s.skipped) == 1 and "escapes" in s.skipped[0]["reason"]
    assert not (tmp_path / "evil.jpg").exists()


def test_corrupt_tfrecord_record_is_reported(imagenet, tmp_path):
    convert(imagenet, tmp_path / "t", to="tfrecord", limit=5)
    shard = next((tmp_path / "t").glob("*.tfrecord"))
    raw = bytearray(shard.read_bytes())
    raw[200] ^= 0xFF  # inside the first record's data
    shard.write_bytes(bytes(raw))
    s = convert(tmp_path / "t", tmp_path / "out", to="folder")
    assert s.records_out == 4 and "CRC" in s.skipped[0]["reason"]


def test_content_is_what_the_api_says(imagenet, tmp_path):
    convert(imagenet, tmp_path / "o", to="recordio")
    assert sum(content(tmp_path / "o").values()) == 60


def test_audio_and_video_sample_datasets_read(tmp_path):
    p = run_cli("info", ROOT / "sample_data" / "audio", "--json")
    assert p.returncode == 0, p.stderr
    audio = json.loads(p.stdout)["audio"]
    assert audio["codings"] == {"wav PCM_16": 1, "flac PCM_16": 1, "ogg VORBIS": 1} and audio["with_transcript"] == 3
    p = run_cli("info", ROOT / "sample_data" / "video", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["video"]["total_frames"] > 0
    p = run_cli("convert", ROOT / "sample_data" / "audio", tmp_path / "o", "--to", "tfrecord")
    assert p.returncode == 0, p.stderr
    from gpubatch import open_dataset

    with open_dataset(tmp_path / "o") as ds:
        recs = sorted(ds, key=lambda r: r.key)
    assert [r.meta.get("text") for r in recs] == ["a rising tone", "a falling tone", "two tones"]
    assert [r.data for r in recs] == [(ROOT / "sample_data" / "audio" / f).read_bytes()
                                      for f in ("clip_0.wav", "clip_1.flac", "clip_2.ogg")]


def test_info_on_coco_names_faulty_annotations(coco):
    ann_file = coco / "annotations" / "instances.json"
    doc = json.loads(ann_file.read_text())
    doc["annotations"][0]["bbox"][2] = -3
    ann_file.write_text(json.dumps(doc))
    p = run_cli("info", coco, "--json")
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["boxes"] == 30
    assert r["warnings"] == ["instances.json: 1 annotation dropped: bbox of negative width or height (ids 1)"]
    p = run_cli("info", coco)
    assert "warning: instances.json: 1 annotation dropped" in " ".join(p.stderr.split())


def _three_small_jpegs(root):
    root.mkdir()
    for i, (h, w) in enumerate([(48, 64), (60, 60), (64, 48)]):
        (root / f"{i}.jpg").write_bytes(jpeg_bytes(photo(h, w, i)))
    return root


def test_ops_that_make_images_above_max_pixels_are_refused(tmp_path):
    src = _three_small_jpegs(tmp_path / "src")
    p = run_cli("augment", src, tmp_path / "o", "--ops", "center_crop(size=100000)", "--device", "cpu")
    assert p.returncode == 2 and "center_crop makes images of 100000x100000" in one_line_error(p)
    assert not (tmp_path / "o").exists()
    # sizes that depend on the image: the records that would grow too large are skipped, with the reason
    s = convert(src, tmp_path / "out", to="folder", resize_shorter=64, max_pixels=5000, device="cpu")
    assert s.records_out == 1 and len(s.skipped) == 2
    assert all("resize_shorter would make a" in e["reason"] for e in s.skipped), s.skipped


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no folder can be made")
def test_an_output_that_cannot_be_made_is_one_line(imagenet):
    p = run_cli("convert", imagenet, "/proc/gpubatch-nowhere/out", "--to", "lmdb")
    assert p.returncode == 2
    assert one_line_error(p) == "error: cannot create the output /proc/gpubatch-nowhere/out: No such file or directory"


@pytest.mark.parametrize("args", [("convert", "sample_data/imagenet", "/tmp/gpubatch-nowhere"), ("convert",),
                                  ("convrt",), ("convert", "a", "b", "--to", "webdataset", "--resize-shorter", "x"),
                                  ("augment", "a", "b", "--copies"), ("info", "--bogus")])
def test_every_usage_error_is_one_line_with_where_to_look(args):
    p = run_cli(*args)
    assert p.returncode == ExitCode.USAGE, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help'" in lines[0], p.stderr
    if args[-1] == "/tmp/gpubatch-nowhere":
        assert "missing option '--to' (one of: audio, coco, folder" in lines[0]


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.05, 0.1])
def test_ctrl_c_while_the_command_starts_is_one_line_and_exit_130(delay):
    """A Ctrl-C ``delay`` seconds after gpubatch's own code began to load (the interpreter's start before that,
    site and its .pth files, is CPython's, which prints a fatal error of its own there)."""
    import signal
    import time

    exe = Path(sys.executable).parent / "gpubatch"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpubatch"]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}  # each import said on stderr as it ends
    p = subprocess.Popen([*cmd, "info", str(ROOT / "sample_data" / "imagenet")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        name = line.rsplit("|", 1)[-1].strip()
        if line.startswith("import time:") and (name == "gpubatch" or name.startswith("gpubatch.")):
            break  # (site's own imports come first: the editable install's finder is named for gpubatch too)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    err = "".join(ln for ln in [*lines, *err.splitlines(keepends=True)] if not ln.startswith("import time:"))
    assert "Traceback" not in err, err
    assert p.returncode in (130, 0), (p.returncode, err)  # (0: it had finished already)
    if p.returncode == 130:
        assert err.strip().splitlines()[-1].startswith("interrupted")


def test_an_interrupt_python_would_swallow_is_sent_again_and_any_other_raised(monkeypatch):
    """The running command's Ctrl-C handler raises KeyboardInterrupt, except inside importlib's module-lock callback
    or a ``__del__``, where Python prints "Exception ignored" and runs on: there it sends the signal again, to be
    raised a moment later in the command's own code."""
    import signal
    import threading
    from types import SimpleNamespace

    from gpubatch.cli import _interrupt

    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))

    def frame(name: str, where: str) -> SimpleNamespace:
        return SimpleNamespace(f_code=SimpleNamespace(co_name=name, co_filename=where))

    for swallowed in (frame("cb", "<frozen importlib._bootstrap>"), frame("__del__", "/x/y.py")):
        before = {t for t in threading.enumerate()}
        assert _interrupt(signal.SIGINT, swallowed) is None
        for t in set(threading.enumerate()) - before:
            t.join(5)
    assert sent == [(os.getpid(), signal.SIGINT)] * 2
    for plain in (frame("cb", "/home/user/mine.py"), frame("run", "/x/api.py"), None):
        with pytest.raises(KeyboardInterrupt):
            _interrupt(signal.SIGINT, plain)
    assert len(sent) == 2


def test_an_interrupt_an_extension_prints_and_replaces_is_still_one_line_and_exit_130(imagenet, tmp_path, monkeypatch,
                                                                                    capsys):
    """NumPy's extension modules start with ``import_array``: an exception raised under it (a Ctrl-C landing in
    importlib while numpy.linalg loads, seen in CI) is printed with ``PyErr_Print``, through ``sys.excepthook``, and
    replaced by "ImportError: numpy._core.multiarray failed to import". The command says "interrupted" for it, exit
    130, without a traceback; an ImportError with no Ctrl-C before it is still raised."""
    import contextvars
    import signal

    from gpubatch import api
    from gpubatch.cli import _interrupted_while_starting, main

    def numpy_start(*a, **kw):  # what import_array does (numpy/_core/include/numpy/__multiarray_api.h)
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            sys.excepthook(*sys.exc_info())  # (PyErr_Print)
        raise ImportError("numpy._core.multiarray failed to import")

    monkeypatch.setattr(api, "convert", numpy_start)
    run = contextvars.copy_context().run
    hook = sys.excepthook
    signal.signal(signal.SIGINT, _interrupted_while_starting)  # (as the command's process starts)
    try:
        with pytest.raises(SystemExit) as e:
            run(main, ["convert", str(imagenet), str(tmp_path / "out"), "--to", "webdataset"])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    err = capsys.readouterr().err
    assert e.value.code == ExitCode.INTERRUPTED and "Traceback" not in err, err
    assert err.strip().splitlines() == ["interrupted: nothing was written to the destination"], err
    assert sys.excepthook is hook

    def plain(*a, **kw):
        raise ImportError("no module named x")

    monkeypatch.setattr(api, "convert", plain)
    with pytest.raises(ImportError):
        run(main, ["convert", str(imagenet), str(tmp_path / "out"), "--to", "webdataset"])


@pytest.mark.parametrize("raised, said", [
    (MemoryError(), "error: out of memory: a limit on this process's memory or threads"),
    (RuntimeError("can't start new thread"), "error: the system refused this process a new thread: a limit on"),
])
def test_running_out_of_memory_or_threads_is_one_line(imagenet, tmp_path, monkeypatch, capsys, raised, said):
    """A limit on the process's memory or threads (``ulimit -v 400000`` refused a thread at a run's start) is one
    line naming the limit and what helps, exit 1, never a traceback; ``--debug`` still shows one."""
    import contextvars

    from gpubatch import api
    from gpubatch.cli import main

    def refused(*a, **kw):
        raise raised

    monkeypatch.setattr(api, "convert", refused)
    run = contextvars.copy_context().run  # (the command marks its context as the CLI's: this test's stays as it was)
    with pytest.raises(SystemExit) as e:
        run(main, ["convert", str(imagenet), str(tmp_path / "out"), "--to", "webdataset"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and err[-1].startswith(said) and "--workers" in err[-1]
    with pytest.raises(type(raised)):
        run(main, ["--debug", "convert", str(imagenet), str(tmp_path / "out"), "--to", "webdataset"])


@pytest.mark.parametrize("command", ["convert", "augment", "info", "bench", "finish"])
def test_each_commands_help_fits_an_80_column_terminal_and_names_every_format(command):
    """The format options show ``FORMAT`` and name the formats in their help: click's one ``[audio|coco|...]`` ran
    past 80 columns, cut inside a name."""
    from gpubatch.formats import format_names

    r = run_cli(command, "--help", env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if len(ln) > 80] == []
    if command in ("convert", "augment", "info"):
        flat = " ".join(r.stdout.split())
        option = "--from FORMAT" if command == "info" else "--to FORMAT"
        assert option in flat
        assert ", ".join(format_names()) in flat


@pytest.mark.parametrize("media", ["image", "audio", "video"])
def test_info_on_a_list_given_as_the_source_counts_the_files_it_names(imagenet, tmp_path, media):
    """``info LIST`` (a ``file_list.txt``, a NeMo manifest, a video list): "on disk" is the list and the files it
    names, once each, not the list's few bytes; the folder's files it does not name are not counted."""
    from gpubatch.report.info import describe

    if media == "image":
        src = tmp_path / "imgs"
        shutil.copytree(imagenet, src)
        names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))[:5]
        listing = src / "file_list.txt"
        listing.write_text("".join(f"{n} 0\n" for n in names + names[:1]))  # (one file named twice)
    else:
        src = tmp_path / media
        shutil.copytree(ROOT / "sample_data" / media, src)
        listing = src / ("manifest.json" if media == "audio" else "file_list.txt")
        names = [json.loads(line)["audio_filepath"] if media == "audio" else line.split()[0]
                 for line in listing.read_text().splitlines()]
        (src / "unlisted").mkdir()
        shutil.copy(src / names[0], src / "unlisted" / "extra")
    expected = listing.stat().st_size + sum((src / n).stat().st_size for n in set(names))
    report = describe(listing)
    assert report.records == len(set(names)) + (media == "image")
    assert report.disk_bytes == expected
    assert describe(src).disk_bytes > expected  # (the folder given: every file in it)
