"""Archives damaged at random (bits flipped, cut short, stretches zeroed), converted: each run ends in one clear error,
or accounts for every record it listed (written or skipped with a reason), and a run that says nothing wrong wrote
every record the archive held."""

from __future__ import annotations

import random
import tarfile
import zipfile

import pytest

from gpubatch.api import convert
from gpubatch.errors import GpubatchError
from tests.helpers import jpeg_bytes, photo

N = 6


def _archive(tmp_path, kind):
    tree = tmp_path / "tree"
    for i, c in enumerate(("cat", "dog")):
        (tree / c).mkdir(parents=True)
        for k in range(N // 2):
            (tree / c / f"{c}.{k}.jpg").write_bytes(jpeg_bytes(photo(24, 32, seed=10 * i + k)))
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
