"""``gpubatch info PATH --verify`` / ``gpubatch.verify``: a dataset checked against what its run recorded in
``gpubatch.json`` (each shard file's size and CRC-32C, the records written)."""

from __future__ import annotations

import json
import shutil

import pytest

from gpubatch import convert, verify
from gpubatch.errors import ExitCode, FormatError, UsageError
from tests.helpers import run_cli


def one_line(p) -> str:
    lines = p.stderr.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize("to", ["webdataset", "tfrecord", "recordio", "parquet"])
def test_a_dataset_as_written_verifies_and_every_change_to_its_files_is_named(imagenet, tmp_path, to):
    if to == "parquet":
        pytest.importorskip("pyarrow")
    out = tmp_path / "out"
    convert(imagenet, out, to=to, shard_size=16)
    r = verify(out)
    assert r.ok and r.listed and len(r.files) >= 4 and all(f.state == "ok" for f in r.files)
    assert r.records == r.records_found == 60 and r.bytes == sum(f.size for f in r.files)
    names = [f.name for f in r.files]
    shard = next(n for n in names if n.endswith((".tar", ".tfrecord", ".rec", ".parquet")))
    others = [n for n in names if n != shard]
    data = bytearray((out / shard).read_bytes())
    data[len(data) // 2] ^= 0x01  # (one bit)
    (out / shard).write_bytes(bytes(data))
    (out / others[0]).unlink()
    with open(out / others[1], "ab") as f:
        f.write(b"\0")
    r = verify(out, records=False)
    states = {f.name: f.state for f in r.files}
    assert states[shard] == "digest" and states[others[0]] == "missing" and states[others[1]] == "size"
    assert not r.ok and r.records_found is None
    assert r.problem().startswith(f"{out}: 3 of its {len(names)} files differ from what was written (")


def test_the_command_exits_1_with_one_line_naming_what_differs_and_json_holds_the_check(imagenet, tmp_path):
    out = tmp_path / "out"
    convert(imagenet, out, to="webdataset", shard_size=16)
    p = run_cli("info", out, "--verify")
    assert p.returncode == 0 and "verify: 8 of 8 files as written" in " ".join(p.stderr.split()), p.stderr
    assert "verify: 60 records read, as written" in " ".join(p.stderr.split())
    (out / "data-000002.tar").write_bytes((out / "data-000002.tar").read_bytes()[:-1024])
    p = run_cli("info", out, "--verify")
    assert p.returncode == ExitCode.ERROR and "Traceback" not in p.stderr
    assert one_line(p).startswith(f"error: {out}: 1 of its 8 files differ from what was written (data-000002.tar: ")
    p = run_cli("info", out, "--verify", "--json")
    got = json.loads(p.stdout)["verify"]
    assert p.returncode == ExitCode.ERROR and got["ok"] is False
    assert [f["name"] for f in got["files"] if f["state"] != "ok"] == ["data-000002.tar"]


def test_formats_written_whole_at_the_end_are_verified_by_their_records(imagenet, coco, tmp_path):
    convert(imagenet, tmp_path / "lmdb", to="lmdb")
    r = verify(tmp_path / "lmdb")
    assert r.ok and not r.listed and r.files == [] and r.records == r.records_found == 60
    convert(coco, tmp_path / "coco-out", to="coco")
    img = sorted((tmp_path / "coco-out" / "images").iterdir())[0]
    img.write_bytes(img.read_bytes()[:40])  # (cut short: unreadable)
    r = verify(tmp_path / "coco-out")
    assert not r.ok and r.records_found == r.records - 1
    assert r.problem().endswith(f"{r.records - 1:,} records read where {r.records:,} were written")


def test_what_cannot_be_verified_is_one_line(imagenet, tmp_path):
    with pytest.raises(UsageError, match="has no gpubatch.json: --verify checks a dataset gpubatch wrote"):
        verify(imagenet)
    out = tmp_path / "out"
    convert(imagenet, out, to="webdataset", shard_size=16)
    with pytest.raises(UsageError, match="not the file"):
        verify(out / "data-000000.tar")
    p = run_cli("info", imagenet, "--verify")
    assert p.returncode == ExitCode.USAGE and one_line(p).startswith(f"error: {imagenet} has no gpubatch.json")
    with pytest.raises(UsageError, match="a pipe: command cannot be read back"):
        verify("pipe:cat > /dev/null", records=False)


@pytest.mark.parametrize("listed", [{"../../etc/passwd": [1, "crc32c:00000000"]}, {"/etc/passwd": [1, "crc32c:00000000"]},
                                    {"a.tar": [1, "md5:00"]}, {"a.tar": ["1", "crc32c:00000000"]}, ["a.tar"]])
def test_a_manifest_that_lists_files_outside_the_dataset_or_odd_digests_is_refused(imagenet, tmp_path, listed):
    out = tmp_path / "out"
    convert(imagenet, out, to="webdataset", shard_size=16)
    m = json.loads((out / "gpubatch.json").read_text())
    m["run"]["files"] = listed
    (out / "gpubatch.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="gpubatch.json"):
        verify(out, records=False)


def test_a_copy_of_a_dataset_verifies_where_it_lands(imagenet, tmp_path):
    convert(imagenet, tmp_path / "out", to="tfrecord", shard_size=7)
    shutil.copytree(tmp_path / "out", tmp_path / "elsewhere")
    r = verify(tmp_path / "elsewhere", workers=3)
    assert r.ok and len(r.files) == 2 * 9
