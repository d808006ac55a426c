"""What a new user met on a first day with every command, each fixed with its test: bracketed text
taken for markup, WebDataset member extensions, files left out without a word, a flat layout that was
not flat, mistyped names without a suggestion, raw docstring marks, a build warning."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from gpubatch.api import convert, info, open_dataset
from gpubatch.errors import ExitCode, UsageError
from tests.helpers import ROOT, child_env, jpeg_bytes, photo, run_cli


def test_bracketed_text_is_printed_as_it_is(imagenet, tmp_path):
    """rich took ``[cu13]`` in the install hint, and brackets in file names, for markup."""
    bad = imagenet / "bird" / "shot[1].jpg"
    bad.write_bytes(b"not [bold]an[/] image")
    p = run_cli("convert", imagenet, tmp_path / "out", "--to", "webdataset", "--resize-shorter", "32",
                "--device", "auto", env={**os.environ, "COLUMNS": "400"})
    assert p.returncode == 0, p.stderr
    err = " ".join(p.stderr.split())
    probe = subprocess.run([sys.executable, "-c", "from gpubatch.engine.device import gpu_problem; "
                            "print(gpu_problem(0)[0])"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert " ".join(probe.stdout.split()) in err  # the CPU fallback's reason as the command's process finds it, whole
    assert "shot[1].jpg" in err


def test_render_keeps_brackets_in_reasons_and_warnings(monkeypatch):
    from rich.console import Console

    from gpubatch.api import RunSummary
    from gpubatch.report import console as console_mod
    from gpubatch.report.summary import render_summary

    out = io.StringIO()
    monkeypatch.setattr(console_mod, "console", lambda: Console(file=out, width=300, highlight=False))
    s = RunSummary(src="in[1]", dst="out[2]", src_format="folder", dst_format="webdataset", device="cpu",
                   device_reason="auto: pip install 'gpubatch[cu13]'", records_in=1, records_out=0,
                   skipped=[{"key": "k", "origin": "a/[x].jpg", "stage": "decode", "reason": "bad [red]data[/]"}],
                   warnings=["see [bold]this[/bold]"])
    render_summary(s)
    text = out.getvalue()
    for literal in ("in[1]", "out[2]", "gpubatch[cu13]", "a/[x].jpg", "bad [red]data[/]", "see [bold]this[/bold]"):
        assert literal in text, literal


def test_a_short_summary_keeps_its_title_on_one_line(monkeypatch):
    """A summary whose cells are narrower than its title (a finished run resumed) wrapped the title to the
    cells' width on a 100-column terminal; the table is now as wide as its title where the terminal is."""
    from rich.console import Console

    from gpubatch.api import RunSummary
    from gpubatch.report import console as console_mod
    from gpubatch.report.summary import render_summary

    title = "convert: /data/sets/imagenet-train-subset (folder) -> /data/out/imagenet-tfrecord (tfrecord)"
    for width, lines in ((100, 1), (60, 2)):
        out = io.StringIO()
        con = Console(file=out, width=width, highlight=False)
        monkeypatch.setattr(console_mod, "console", lambda con=con: con)
        render_summary(RunSummary(src="/data/sets/imagenet-train-subset", dst="/data/out/imagenet-tfrecord",
                                  src_format="folder", dst_format="tfrecord", device="cpu",
                                  device_reason="--resume: the run had finished", records_in=60, records_out=60))
        head = out.getvalue().splitlines()[:lines]
        assert " ".join(x.strip() for x in head) == title
        assert max(len(x) for x in out.getvalue().splitlines()) <= width


def test_webdataset_members_take_the_codecs_own_extension(tmp_path):
    wds = pytest.importorskip("webdataset")
    src = tmp_path / "src"
    for cls in ("cat", "dog"):
        (src / cls).mkdir(parents=True)
        for k in range(3):
            (src / cls / f"{k}.jpeg").write_bytes(jpeg_bytes(photo(24, 32, seed=k)))
    convert(src, tmp_path / "out", to="webdataset")
    shard = next((tmp_path / "out").glob("*.tar"))
    exts = {n.rsplit(".", 1)[1] for n in tarfile.open(shard).getnames()}
    assert exts == {"jpg", "cls"}
    pairs = list(wds.WebDataset(str(shard), shardshuffle=False).decode("pil").to_tuple("jpg", "cls"))
    assert len(pairs) == 6 and sorted(c for _, c in pairs) == [0, 0, 0, 1, 1, 1]
    assert info(tmp_path / "out").extensions == {"cls": 6, "jpg": 6}


def test_files_that_are_no_records_are_counted_and_named(tmp_path):
    src = tmp_path / "src"
    for cls in ("cat", "dog"):
        (src / cls).mkdir(parents=True)
        for k in range(3):
            (src / cls / f"{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=k)))
    (src / "cat" / "clip.mp4").write_bytes(b"\0\0\0\x18ftypmp42")
    (src / "dog" / "bark.wav").write_bytes(b"RIFF\0\0\0\0WAVE")
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 6
    warning = next(w for w in s.warnings if w.startswith("left out"))
    assert "1 video file (cat/clip.mp4)" in warning and "1 audio file (dog/bark.wav)" in warning
    manifest = json.loads((tmp_path / "out" / "gpubatch.json").read_text())
    assert warning in manifest["warnings"]
    report = info(src)
    assert report.left_out == {"video": {"count": 1, "names": ["cat/clip.mp4"]},
                               "audio": {"count": 1, "names": ["dog/bark.wav"]}}


@pytest.mark.parametrize("classes", [True, False])
def test_hidden_folders_and_hidden_images_are_named_as_left_out(tmp_path, classes):
    """Hidden files and folders are not read (a notebook's ``.ipynb_checkpoints/``, macOS's ``._photo.jpg`` beside
    each photo copied from a Mac), but those that could hold images are named in the warning and ``info``'s
    ``left_out``, never left out without a word; a ``.DS_Store`` is no image and not named."""
    src = tmp_path / "src"
    folder = src / "cat" if classes else src
    folder.mkdir(parents=True)
    for k in range(2):
        (folder / f"{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=k)))
    (folder / "._0.jpg").write_bytes(b"\0\5\x16\7\0\2\0\0Mac OS X        ")
    (folder / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (src / ".ipynb_checkpoints").mkdir()
    (src / ".ipynb_checkpoints" / "0.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=0)))
    s = convert(src, tmp_path / "out", to="webdataset")
    assert s.records_out == 2
    hidden = ".ipynb_checkpoints/, cat/._0.jpg" if classes else "._0.jpg, .ipynb_checkpoints/"
    warning = next(w for w in s.warnings if w.startswith("left out"))
    assert warning == f"left out of {src}, as no records: 2 hidden files and folders ({hidden})"
    assert info(src).left_out == {"hidden": {"count": 2, "names": hidden.split(", ")}}


def test_an_archive_a_binary_listing_or_one_image_is_one_line_saying_what_it_is(tmp_path):
    """A ZIP was "cannot tell the format" (and --from audio ended in a csv traceback, --from folder read its bytes as
    814 file-list lines); a single image said the same. Each is now one line that says what the
    file is and what to pass instead; a UTF-16 listing (Excel's "Unicode text") is read as text."""
    import zipfile

    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "0.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=0)))
    with zipfile.ZipFile(tmp_path / "notes.zip", "w") as z:  # (a ZIP of images is read: test_zip_folder.py)
        z.writestr("readme.txt", "no images here")
    (tmp_path / "notes.7z").write_bytes(b"7z\xbc\xaf\x27\x1c" + bytes(26))
    said = (f"{tmp_path / 'notes.zip'} is a ZIP archive that holds no image, audio or video file: unpack it (unzip "
            f"{tmp_path / 'notes.zip'} -d notes) and pass the folder")
    for path, args, line in [
            ("notes.zip", (), said),
            ("notes.7z", (), f"{tmp_path / 'notes.7z'} is a 7-Zip archive, which gpubatch does not read: unpack it (7z "
                             f"x {tmp_path / 'notes.7z'} -onotes) and pass the folder"),
            ("notes.7z", ("--from", "audio"), f"{tmp_path / 'notes.7z'} is not a CSV: it is a 7-Zip archive: unpack it"),
            ("notes.7z", ("--from", "video"), f"{tmp_path / 'notes.7z'} is not a file list ('path label [start end]' "
                                              "lines): it is a 7-Zip archive: unpack it")]:
        p = run_cli("info", tmp_path / path, *args)
        err = p.stderr.strip().splitlines()
        assert p.returncode != 0 and len(err) == 1 and err[0].startswith(f"error: {line}"), p.stderr
    p = run_cli("convert", src / "cat" / "0.jpg", tmp_path / "out", "--to", "webdataset")
    assert p.stderr.strip().splitlines()[-1] == (f"error: {src / 'cat' / '0.jpg'} is one image: gpubatch reads datasets; pass the "
                                f"folder that holds it ({src / 'cat'})"), p.stderr
    listed = src / "list.txt"
    listed.write_bytes("cat/0.jpg 3\n".encode("utf-16"))
    with open_dataset(listed, "folder") as r:
        assert [(rec.key, rec.label) for rec in r] == [("cat/0", 3)]


def test_layout_flat_is_one_folder_with_the_labels_in_the_file_list(tmp_path):
    src = tmp_path / "src"
    for cls in ("cat", "dog", "dog/sub"):
        (src / cls).mkdir(parents=True)
        (src / cls / "0001.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=len(cls))))
    convert(src, tmp_path / "flat", to="folder", layout="flat")
    files = sorted(p.name for p in (tmp_path / "flat").iterdir())
    assert all((tmp_path / "flat" / f).is_file() for f in files)  # no folder at all
    lines = dict(ln.rsplit(" ", 1) for ln in (tmp_path / "flat" / "file_list.txt").read_text().splitlines())
    assert lines == {"cat_0001.jpg": "0", "dog_0001.jpg": "1", "dog_sub_0001.jpg": "1"}
    with open_dataset(tmp_path / "flat") as r:
        assert sorted(rec.label for rec in r) == [0, 1, 1]


@pytest.mark.parametrize("args,hint", [
    (["--to", "webdatset"], "did you mean 'webdataset'"),
    (["--to", "wds"], "did you mean 'webdataset'"),
    (["--to", "tfrecords"], "did you mean 'tfrecord'"),
    (["--to", "webdataset", "--image-format", "jpg"], "did you mean 'jpeg'"),
])
def test_mistyped_names_get_a_suggestion(imagenet, tmp_path, args, hint):
    p = run_cli("convert", imagenet, tmp_path / "out", *args)
    assert p.returncode == ExitCode.USAGE and hint in p.stderr


@pytest.mark.parametrize("args,hint", [
    (["--preset", "resnet50"], "did you mean 'resnet50-train' or 'resnet50-val'"),
    (["--ops", "randomresizedcrop(224)"], "did you mean 'random_resized_crop'"),
    (["--ops", "random_resized_crop(siz=224)"], "did you mean 'size'"),
])
def test_mistyped_presets_and_ops_get_a_suggestion(imagenet, tmp_path, args, hint):
    p = run_cli("augment", imagenet, tmp_path / "out", *args)
    assert p.returncode == ExitCode.USAGE and hint in p.stderr


def test_a_from_that_names_another_format_says_what_the_source_is(imagenet):
    p = run_cli("info", imagenet, "--from", "lmdb")
    assert p.returncode == ExitCode.USAGE
    assert "looks like a dataset of the folder format" in p.stderr and "No such file" not in p.stderr


def test_python_callers_are_told_keywords_not_flags(imagenet, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(UsageError, match=r"pass overwrite=True to replace it") as e:
        convert(imagenet, tmp_path / "out", to="webdataset")
    assert "--" not in str(e.value)
    p = run_cli("convert", imagenet, tmp_path / "out", "--to", "webdataset")
    assert "pass --overwrite to replace it" in p.stderr


def test_list_ops_shows_no_docstring_marks():
    p = run_cli("augment", "--list-ops")
    assert p.returncode == 0 and "``" not in p.stdout and ":func:" not in p.stdout
    assert "parameters [default]" in " ".join(p.stdout.split())


def test_the_package_metadata_uses_an_spdx_license_string():
    """setuptools deprecates the ``{text = ...}`` table: ``make demo`` printed its warning."""
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert any(r.startswith("setuptools>=77") for r in meta["build-system"]["requires"])


# --- URLs: a store's package missing, or no credentials: one line, and no local folder named after them ---


@pytest.mark.parametrize("args", [
    ("convert", "sample_data/imagenet", "s3://bucket/out", "--to", "webdataset"),
    ("convert", "sample_data/imagenet", "gs://bucket/out", "--to", "tfrecord"),
    ("info", "s3://bucket/x-{000000..000001}.tar"),
    ("augment", "sample_data/coco", "az://container/out", "--preset", "ssd", "--to", "tfrecord"),
])
def test_a_url_the_machine_cannot_reach_is_one_line_and_no_local_folder_is_made(tmp_path, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", GPUBATCH_CACHE=str(tmp_path / "cache"))
    before = set(os.listdir(ROOT))
    p = run_cli(*args, env=env)
    assert p.returncode != 0, p.stderr
    (line,) = p.stderr.strip().splitlines()
    url = next(a for a in args if "://" in a)
    scheme = url.split(":")[0]
    assert line.startswith("error: ") and "Traceback" not in p.stderr
    assert (f"{scheme}:// URLs need " in line and "pip install 'gpubatch[" in line) or (
        "credentials" in line and url.split("{")[0].rstrip("/x-") in line), line
    assert set(os.listdir(ROOT)) == before and not (tmp_path / "out").exists()


def test_a_url_a_path_folded_is_taken_as_the_url(tmp_path, monkeypatch):
    from pathlib import Path

    from gpubatch.api import _given

    assert _given(Path("s3://bucket/out")) == "s3://bucket/out" and _given("file:///tmp/x") == Path("/tmp/x")


# --- the README's Python examples, as a user saves them: a script without a __main__ guard -------------


UNGUARDED = """
import sys
import numpy as np
import gpubatch
from gpubatch import ImagePipeline
from gpubatch.engine.ops import RandomResizedCrop, Flip, Normalize

paths = sorted(str(p) for p in __import__("pathlib").Path(sys.argv[1]).rglob("*.jpg"))[:8]
with ImagePipeline([RandomResizedCrop(64), Flip(p=0.5), Normalize(layout="CHW", dtype="float16")], device="cpu",
                   cpu_threads=2) as pipe:
    for batch in pipe.iterate_files(paths, batch_size=4):
        x = np.from_dlpack(batch)
        print("batch", x.shape, x.dtype, len(batch.keys))
s = gpubatch.convert(sys.argv[1], sys.argv[2], to="webdataset", resize_shorter=48, device="cpu", limit=8)
print("converted", s.records_out)
"""


def test_the_readme_examples_run_as_a_plain_script_without_a_main_guard(imagenet, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED)
    p = subprocess.run([sys.executable, str(script), str(imagenet), str(tmp_path / "out")], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "another gpubatch run" not in p.stderr, p.stderr
    assert p.stdout.splitlines() == ["batch (4, 3, 64, 64) float16 4"] * 2 + ["converted 8"]  # once, not per worker


def test_a_cpu_batch_is_one_array_and_a_failed_image_leaves_no_row(imagenet):
    import numpy as np

    from gpubatch.engine.batch import HostBatch
    from gpubatch.engine.ops import Normalize, Resize
    from gpubatch.pipelines.image import ImagePipeline

    files = sorted(imagenet.rglob("*.jpg"))[:8]
    blobs = [f.read_bytes() for f in files]
    blobs[3] = b"\xff\xd8 not a jpeg"
    keys = [f.stem for f in files]
    with ImagePipeline([Resize(32, 40), Normalize(dtype="float32")], device="cpu", cpu_threads=2) as pipe:
        batch = pipe(blobs, keys)
        alone = pipe([blobs[5]], [keys[5]])
    assert isinstance(batch, HostBatch) and len(batch) == 7
    assert batch.shape == (7, 3, 32, 40) and batch.dtype == np.float32  # (as a tensor says what it holds)
    x = np.from_dlpack(batch)
    assert x.shape == (7, 3, 32, 40) and x.dtype == np.float32
    assert batch.keys == keys[:3] + keys[4:] and batch.failed[0][0] == keys[3]
    assert np.array_equal(x[batch.keys.index(keys[5])], np.asarray(alone)[0])  # rows keep their records


def test_an_empty_source_folder_says_so_rather_than_asking_for_its_format(tmp_path):
    from gpubatch.errors import FormatError

    (tmp_path / "src" / "a" / "b").mkdir(parents=True)
    for call in (lambda: convert(tmp_path / "src", tmp_path / "out", to="webdataset"),
                 lambda: info(tmp_path / "src")):
        with pytest.raises(FormatError, match="holds no files: nothing to read"):
            call()
    assert not (tmp_path / "out").exists()


def test_a_batch_says_its_shape_and_dtype_where_its_items_share_a_shape():
    import numpy as np

    from gpubatch.engine.batch import DeviceBatch, HostBatch

    ragged = HostBatch([np.zeros((4, 5, 3), np.uint8), np.zeros((6, 5, 3), np.uint8)])
    assert ragged.shape is None and ragged.dtype == np.uint8 and HostBatch([]).dtype is None
    buf = np.zeros(2 * 4 * 5 * 3, np.float16)  # (the properties read shapes and the buffer's dtype alone)
    same = DeviceBatch(buf, np.array([0, 60]), [(4, 5, 3), (4, 5, 3)])
    assert same.shape == (2, 4, 5, 3) and same.dtype == np.float16
    assert DeviceBatch(buf, np.array([0, 60]), [(4, 5, 3), (5, 4, 3)]).shape is None


# --- what decoders print is held back, counted, and listed under --verbose -------------------------------


def _noisy_tiff() -> bytes:
    """A CCITT group 4 TIFF with damaged strip data: libtiff prints 'Fax4Decode: Bad code word' from C."""
    import numpy as np
    from PIL import Image

    im = Image.fromarray(np.random.default_rng(0).random((64, 64)) > 0.5).convert("1")
    buf = io.BytesIO()
    im.save(buf, "TIFF", compression="group4")
    data = bytearray(buf.getvalue())
    for i in range(10, 60, 3):
        data[i] ^= 0x5A
    return bytes(data)


def _noisy_png() -> bytes:
    """A PNG whose acTL chunk says it animates with no frames: Pillow warns 'Invalid APNG' (Python)."""
    import struct
    import zlib

    raw = io.BytesIO()
    from PIL import Image

    Image.fromarray(photo(16, 16)).save(raw, "PNG")
    data = raw.getvalue()
    body = struct.pack(">II", 0, 0)
    chunk = struct.pack(">I", len(body)) + b"acTL" + body + struct.pack(">I", zlib.crc32(b"acTL" + body))
    return data[:33] + chunk + data[33:]


def test_decoder_noise_is_counted_in_the_summary_and_listed_under_verbose(imagenet, tmp_path):
    for k in range(3):
        (imagenet / "bird" / f"fax{k}.tif").write_bytes(_noisy_tiff())
        (imagenet / "bird" / f"anim{k}.png").write_bytes(_noisy_png())
    p = run_cli("convert", imagenet, tmp_path / "a", "--to", "webdataset", "--resize-shorter", "32", "--json",
                env={**os.environ, "COLUMNS": "400"})
    assert p.returncode == 0, p.stderr
    assert "Fax4Decode" not in p.stderr and "APNG" not in p.stderr and "warnings.warn" not in p.stderr
    summary = json.loads(p.stdout)
    assert summary["library_messages"] >= 6
    assert any("messages from the decoders" in w and "--verbose lists them" in w for w in summary["warnings"])
    v = run_cli("convert", imagenet, tmp_path / "b", "--to", "webdataset", "--resize-shorter", "32", "--verbose",
                env={**os.environ, "COLUMNS": "400"})
    listed = [ln for ln in v.stderr.splitlines() if ln.startswith("library:")]
    assert any("Fax4Decode: Bad code word" in ln for ln in listed)  # written from C, caught on descriptor 2
    assert sum("anim" in ln and "Invalid APNG" in ln for ln in listed) == 3  # a Python warning, by record


_EARLY_SCRIPT = """
import multiprocessing as mp, os, sys, time
from gpubatch.engine.execute import early_stderr
from gpubatch.report.noise import LibraryMessages

with early_stderr.early_descriptor():  # (as the sniff starts its workers, at the command's first line)
    p = mp.get_context("fork").Process(target=os.write, args=(2, b"Fax4Decode: a line from C\\n"))
    p.start()
early_stderr.read_early()
p.join()
time.sleep(0.3)
if sys.argv[1] == "held":
    with LibraryMessages() as m:
        os.write(2, b"TIFFReadDirectory: a line of the command's own\\n")
    print(m.total, sorted(m.messages))
"""


@pytest.mark.parametrize("held", [True, False])
def test_what_workers_started_at_the_commands_first_line_print_is_held_back_or_shown_at_its_end(held):
    """Workers the sniff starts before the command holds back what libraries print (``early_stderr``) print into a
    pipe of their own: its lines go to the command's ``LibraryMessages`` once it begins, counted as its own workers'
    are; where none begins (a usage error), they are written to the terminal at the end, not lost."""
    p = subprocess.run([sys.executable, "-c", _EARLY_SCRIPT, "held" if held else "shown"], capture_output=True,
                       text=True, env=child_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    if held:
        assert p.stdout.split(" ", 1) == ["2", "['Fax4Decode: a line from C', "
                                               "\"TIFFReadDirectory: a line of the command's own\"]\n"]
        assert "Fax4Decode" not in p.stderr
    else:
        assert p.stderr == "Fax4Decode: a line from C\n"


def test_the_gpu_install_hint_is_one_that_works_from_a_checkout(monkeypatch):
    """gpubatch is on no package index: the hint names the checkout, and the extra of the driver's CUDA."""
    from gpubatch.engine import install as device

    monkeypatch.chdir(ROOT)
    assert device.install_hint(13000) == "pip install -e '.[cu13]'"
    assert device.install_hint(12080) == "pip install -e '.[cu12]'"
    monkeypatch.chdir(ROOT / "sample_data")
    assert device.install_hint(12080) == f"pip install -e '{ROOT}[cu12]'"
    monkeypatch.setattr(device, "driver_cuda", lambda: None)
    assert device._no_cupy().startswith("no NVIDIA GPU driver here")
    monkeypatch.setattr(device, "driver_cuda", lambda: 13000)
    monkeypatch.chdir(ROOT)
    assert device._no_cupy() == "CuPy is not installed: pip install -e '.[cu13]'"


def test_make_demo_installs_the_gpu_extra_where_nvidia_smi_shows_a_gpu(tmp_path):
    """The Makefile asks nvidia-smi for the driver's CUDA and installs the matching extra with the project."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for version, extra in (("13.0", "cu13"), ("12.8", "cu12")):
        (fake / "nvidia-smi").write_text(f"#!/bin/sh\necho '| NVIDIA-SMI 580.1   Driver Version: 580.1   CUDA Version: "
                                        f"{version} |'\n")
        (fake / "nvidia-smi").chmod(0o755)
        p = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), ".venv/.installed-stamp"], capture_output=True,
                           text=True, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
        assert f"-e '.[dev,ray,s3,http,{extra}]'" in p.stdout, p.stdout
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")  # (no GPU, or
    p = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), ".venv/.installed-stamp"], capture_output=True,  # none
                       text=True, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})  # its driver broke)
    assert "-e '.[dev,ray,s3,http]'" in p.stdout, p.stdout
    bare = tmp_path / "bare"  # (no nvidia-smi at all: the tools the Makefile's shell calls use, and no more)
    bare.mkdir()
    for tool in ("sh", "sed", "head"):
        (bare / tool).symlink_to(shutil.which(tool))
    p = subprocess.run([shutil.which("make"), "-n", "-B", "-C", str(ROOT), ".venv/.installed-stamp"],
                       capture_output=True, text=True, env={**os.environ, "PATH": str(bare)})
    assert "-e '.[dev,ray,s3,http]'" in p.stdout, p.stdout


def test_a_webdataset_of_jpg_and_png_members_says_how_to_read_them_all(imagenet, tmp_path):
    import webdataset as wds
    from PIL import Image

    for jpg in sorted(imagenet.rglob("*.jpg"))[:4]:
        Image.open(jpg).save(jpg.with_suffix(".png"))
        jpg.unlink()
    s = convert(imagenet, tmp_path / "w", to="webdataset")
    hint = next(w for w in s.warnings if "to_tuple(" in w)
    assert "to_tuple('jpg;png', 'cls')" in hint and ".jpg (54) and .png (6)" in hint and "--image-format jpeg" in hint
    assert any("to_tuple('jpg;png', 'cls')" in w for w in info(tmp_path / "w").warnings)
    urls = [str(p) for p in sorted((tmp_path / "w").glob("*.tar"))]
    got = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).to_tuple("jpg;png", "cls"))
    assert len(got) == 60  # every sample, where to_tuple("jpg", "cls") stops at the first .png
    one = convert(imagenet, tmp_path / "j", to="webdataset", image_format="jpeg")
    assert not any("to_tuple(" in w for w in one.warnings)


LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"4d" * 32 + b"\nsize 12345\n"


def test_git_lfs_pointer_files_are_named_as_such(imagenet, tmp_path):
    """A clone of a test-data repository made without git-lfs holds pointer files where the data should be."""
    (imagenet / "bird" / "pointer.jpg").write_bytes(LFS)
    s = convert(imagenet, tmp_path / "o", to="webdataset")
    (bad,) = [e for e in s.skipped if e["key"].endswith("pointer")]
    assert "a Git LFS pointer of a 12,345-byte file" in bad["reason"] and "git lfs pull" in bad["reason"]
    lmdb = tmp_path / "lmdb"
    lmdb.mkdir()
    (lmdb / "data.mdb").write_bytes(LFS)
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(2):
        (shards / f"train-{k:06d}.tar").write_bytes(LFS)
    for src in (lmdb, shards):
        p = run_cli("info", src)
        assert p.returncode == ExitCode.ERROR and "Git LFS pointer" in p.stderr and "git lfs pull" in p.stderr, p.stderr
        assert "not an LMDB data file" not in p.stderr and "cannot tell the format" not in p.stderr


# --- small ones ---------------------------------------------------------------------------------------------


def test_clips_of_image_members_raise_no_warning_that_their_frames_were_not_resized(tmp_path):
    from tests.video.clips import make_clip

    make_clip(tmp_path / "src" / "a.mp4", 24)
    s = convert(tmp_path / "src", tmp_path / "out", to="webdataset", clip_length=4, clip_format="jpeg",
                resize_shorter=32)
    assert s.records_out == 6 and not any("kept as they were" in w for w in s.warnings), s.warnings


def test_a_video_too_short_for_a_clip_is_counted_once(tmp_path):
    from tests.video.clips import make_clip

    make_clip(tmp_path / "src" / "long.mp4", 24)
    make_clip(tmp_path / "src" / "short.mp4", 6)
    s = convert(tmp_path / "src", tmp_path / "out", to="webdataset", clip_length=16)
    assert s.records_in == 2 and s.records_out == 1 and len(s.skipped) == 1  # (was records_in 3)


def test_two_runs_of_one_command_write_the_same_shard_bytes(imagenet, tmp_path):
    import time

    for to in ("webdataset", "tfrecord", "recordio"):
        convert(imagenet, tmp_path / f"{to}1", to=to, shard_size=25)
        time.sleep(1.1)  # (a member's time of writing would differ)
        convert(imagenet, tmp_path / f"{to}2", to=to, shard_size=25)
        files = sorted(p.name for p in (tmp_path / f"{to}1").iterdir() if p.name != "gpubatch.json")
        assert files and all((tmp_path / f"{to}1" / f).read_bytes() == (tmp_path / f"{to}2" / f).read_bytes()
                             for f in files), to


def test_files_left_out_are_counted_in_plain_words(imagenet):
    from gpubatch.formats.files import left_out_warning

    said = left_out_warning(imagenet, {"other": [f"n{i}.txt" for i in range(7)], "video": ["a.mp4"]})
    assert "7 files that are no images (n0.txt, n1.txt, n2.txt, ...)" in said and "1 video file (a.mp4)" in said


def _several_frames(root) -> None:
    """An animated GIF, WebP and PNG and a TIFF of three pages, each beside a still of its codec, and a JPEG."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    frames = [Image.fromarray((rng.random((48, 64, 3)) * 255).astype(np.uint8)) for _ in range(3)]
    root.mkdir(parents=True)
    for ext, fmt in (("gif", "GIF"), ("png", "PNG"), ("webp", "WEBP"), ("tiff", "TIFF")):
        frames[0].save(root / f"anim.{ext}", fmt, save_all=True, append_images=frames[1:])
        frames[0].save(root / f"still.{ext}", fmt)
    frames[0].save(root / "photo.jpg")


def test_images_of_several_frames_re_encoded_from_their_first_are_counted(tmp_path):
    """A re-encoding run writes an image's first picture (what every decoder gives), so an animated GIF, WebP or PNG
    or a TIFF of pages lost its other frames with no word. They are counted (``first_frames``, a summary row); a copy
    keeps them whole and counts none. The count comes from each file's structure (``headers.frames_held``)."""
    from gpubatch.engine.codecs.headers import frames_held

    _several_frames(tmp_path / "src" / "a")
    for p in sorted((tmp_path / "src" / "a").iterdir()):
        codec = {"jpg": "jpeg", "tiff": "tiff"}.get(p.suffix[1:], p.suffix[1:])
        assert frames_held(p.read_bytes(), codec) == (2 if p.stem == "anim" else 1), p.name
        assert frames_held(p.read_bytes()[:40], codec) >= 1
    s = convert(tmp_path / "src", tmp_path / "copy", to="webdataset")
    assert s.records_out == 9 and s.passthrough == 9 and s.first_frames == 0, s.as_dict()
    s = convert(tmp_path / "src", tmp_path / "small", to="webdataset", resize_shorter=32)
    assert s.records_out == 9 and s.first_frames == 4 and s.as_dict()["first_frames"] == 4, s.as_dict()
    s = convert(tmp_path / "src", tmp_path / "small4", to="folder", resize_shorter=32, workers=2, shard_size=2)
    assert s.first_frames == 4, s.as_dict()
    done = run_cli("convert", str(tmp_path / "src"), str(tmp_path / "cli"), "--to", "webdataset", "--resize-shorter",
                   "32", "--image-format", "jpeg", env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0 and "4 images of several frames" in done.stderr, done.stderr
