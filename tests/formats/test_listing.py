"""formats/listing.py: one walk of a source folder for every format's check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpubatch.formats import detect, listing


def _tree(root: Path) -> Path:
    for rel in ("a/x.jpg", "a/.hidden.mp4", "a/b/y.PNG", "a/b/c/z.wav", "d/notes", "d/.e/f.flac", "top.parquet.txt",
                "g.h/i.JPEG"):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    (root / "link").symlink_to(root / "a", target_is_directory=True)  # (a link to a folder: listed, not walked)
    (root / "broken").symlink_to(root / "nowhere")
    return root


def _as_os_walk(top: Path) -> list:
    return sorted((d, sorted(ds), sorted(fs)) for d, ds, fs in os.walk(top))


def test_walk_visits_what_os_walk_does(tmp_path):
    root = _tree(tmp_path / "t")
    got = [(f.path, sorted(f.dirs), sorted(f.files)) for f in listing.walk(root)]
    assert sorted(got) == _as_os_walk(root)
    assert got[0][0] == str(root)  # top-down


def test_extensions_lowercased_and_hidden_files_apart(tmp_path):
    root = _tree(tmp_path / "t")
    folders = {Path(f.path).relative_to(root).as_posix(): f for f in listing.walk(root)}
    assert folders["a"].exts == {"jpg", "mp4"} and folders["a"].shown_exts == {"jpg"}
    assert folders["a/b"].exts == {"png"}
    assert folders["."].exts == {"txt"}  # ("broken", a name without a dot, has none)
    assert "link" in folders["."].dirs and "broken" in folders["."].files


def test_pruned_and_sorted_as_the_caller_leaves_dirs(tmp_path):
    root = _tree(tmp_path / "t")
    seen = []
    for f in listing.walk(root):
        f.dirs[:] = sorted(d for d in f.dirs if d != "a")
        seen.append(Path(f.path).relative_to(root).as_posix())
    assert seen == [".", "d", "d/.e", "g.h"]
    # the caller's pruning is its own: the next walk, inside one shared scope, sees every folder again
    with listing.shared_walk():
        first = []
        for f in listing.walk(root):
            f.dirs.clear()
            first.append(f.path)
        again = [f.path for f in listing.walk(root)]
    assert first == [str(root)] and len(again) == len(_as_os_walk(root))


@pytest.fixture
def listed(monkeypatch) -> list[str]:
    """The folders the walk lists (``os.scandir`` called from listing.py, not pathlib's globs), in order."""
    calls: list[str] = []
    real = os.scandir

    def counted(path):
        if sys._getframe(1).f_code.co_filename == listing.__file__:
            calls.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(listing.os, "scandir", counted)
    return calls


def test_each_folder_listed_once_inside_the_scope(tmp_path, listed):
    root = _tree(tmp_path / "t")
    calls = listed
    with listing.shared_walk():
        for _ in range(3):
            list(listing.walk(root))
    assert sorted(calls) == sorted(set(calls)) and len(calls) == len(_as_os_walk(root))
    calls.clear()
    list(listing.walk(root))
    list(listing.walk(root))
    assert len(calls) == 2 * len(_as_os_walk(root))  # (outside the scope each walk lists afresh)


def test_an_unlistable_folder_is_left_out(tmp_path, monkeypatch):
    root = _tree(tmp_path / "t")
    real = os.scandir

    def refusing(path):
        if os.fspath(path).endswith("/a/b"):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(listing.os, "scandir", refusing)
    paths = [Path(f.path).relative_to(root).as_posix() for f in listing.walk(root)]
    assert "a" in paths and "a/b" not in paths and "a/b/c" not in paths


@pytest.mark.parametrize(("files", "expected"), [
    (["c1/a.mp4", "c2/b.mp4"], "video"),
    (["c1/a.jpg", "c2/b.jpg"], "folder"),
    (["c1/a.wav", "c2/b.flac"], "audio"),
    (["c1/.a.mp4", "c1/b.jpg"], "folder"),  # (a hidden clip tells nothing)
    (["data/train-00000.parquet"], "parquet"),
])
def test_detection_through_one_walk(tmp_path, listed, files, expected):
    for rel in files:
        p = tmp_path / "d" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    assert detect(tmp_path / "d").name == expected
    assert listed and len(listed) == len(set(listed))  # (every check after the first took the same listings)


def test_the_image_folders_of_the_class_folders_are_those_their_files_lie_in():
    from gpubatch.formats.folder import _folders_of

    per_class = {"a": ["x.jpg", "y.jpg"], "b": ["s/x.jpg", "s/t/y.jpg"], "c": ["x.jpg", "JPEGImages/y.jpg"], "d": []}
    classes = sorted(per_class)
    want = {f"{c}/{f}".rsplit("/", 1)[0] for c in classes for f in per_class[c]}  # (each file's own folder)
    assert _folders_of(classes, per_class) == want == {"a", "b/s", "b/s/t", "c", "c/JPEGImages"}


def test_the_folder_scan_takes_the_names_its_image_test_takes(tmp_path):
    from gpubatch.formats.files import _is_image_name, _walk_images

    names = ["a.jpg", "b.JPEG", "c.png.txt", "d", "e.", ".f.jpg", "g.tar.gz", "h.webp", "i.Jpg", "j.jpg.bak"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    others: list[str] = []
    got = _walk_images(tmp_path, [], "", others)
    assert got == sorted(n for n in names if _is_image_name(n) and not n.startswith("."))
    assert sorted(others) == sorted(n for n in names if not _is_image_name(n) and not n.startswith("."))
