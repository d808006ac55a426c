"""Datasets in object storage and at URLs, against a real S3-compatible server the tests start on 127.0.0.1
(moto's server mode: the store's own client, s3fs, talks HTTP to it) and a real HTTP server
(``http.server``): reads shard by shard, writes shard by shard with the manifest last, ``--resume`` after a
kill, the outputs read back by webdataset and the ``tfrecord`` package through fsspec."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpubatch import convert, info, open_dataset
from gpubatch.errors import DependencyError, UsageError
from tests.helpers import ROOT, child_env, content, kill_group, run_cli, semaphores_now

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3_env():
    """A moto S3 server on 127.0.0.1, and the environment that points the store's client at it."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    yield env
    server.stop()


@pytest.fixture
def s3(s3_env, monkeypatch, tmp_path):
    """A fresh bucket on the server; this test's own gpubatch cache; the store's client set up."""
    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GPUBATCH_CACHE", str(tmp_path / "cache"))
    import boto3
    import fsspec

    bucket = f"b{random.Random().getrandbits(40):x}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    fsspec.filesystem("s3").invalidate_cache()
    return bucket


def objects(bucket: str, prefix: str) -> dict[str, str]:
    """name -> sha256 of every object under ``prefix``."""
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    base = f"{bucket}/{prefix}"
    return {os.path.relpath(k, base): hashlib.sha256(fs.cat_file(k)).hexdigest() for k in sorted(fs.find(base))}


def local_files(path: Path) -> dict[str, str]:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def upload(local: Path, bucket: str, prefix: str) -> None:
    import fsspec

    fs = fsspec.filesystem("s3")
    for p in sorted(local.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{bucket}/{prefix}/{p.relative_to(local).as_posix()}")


def without_manifest(files: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in files.items() if k != "gpubatch.json"}


@pytest.mark.parametrize("shard_size", [16, 60])  # (shards of 0.3 MiB stay in the staging folder until the end,
def test_local_to_s3_writes_the_local_runs_bytes_with_the_manifest_last(s3, imagenet, tmp_path, shard_size):
    local = tmp_path / "local"  # one of 1.4 MiB leaves it once uploaded)
    convert(imagenet, local, to="webdataset", shard_size=shard_size)
    s = convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=shard_size)
    assert s.records_out == 60 and s.dst == f"s3://{s3}/out"
    got = objects(s3, "out")
    assert without_manifest(got) == without_manifest(local_files(local))  # shards, indexes, wids.json
    assert "gpubatch.json" in got and not any(k.startswith(".gpubatch") for k in got)
    m = json.loads(__import__("fsspec").filesystem("s3").cat_file(f"{s3}/out/gpubatch.json"))
    assert m["records"] == 60 and m["format"] == "webdataset"
    assert not list((tmp_path / "cache" / "out").rglob("*.tar"))  # nothing of it left in the cache


def test_s3_to_local_reads_shard_by_shard_and_equals_the_local_read(s3, imagenet, tmp_path):
    wds = tmp_path / "wds"
    convert(imagenet, wds, to="webdataset", shard_size=8)
    upload(wds, s3, "wds")
    s = convert(f"s3://{s3}/wds", tmp_path / "out", to="tfrecord")
    assert s.records_out == 60 and not s.skipped and s.src == f"s3://{s3}/wds"
    assert content(tmp_path / "out") == content(wds)
    # a pattern picks shards; the report names the store
    r = info(f"s3://{s3}/wds/data-{{000000..000002}}.tar")
    assert r.records == 24 and r.path == f"s3://{s3}/wds/data-{{000000..000002}}.tar"
    mirrors = tmp_path / "cache" / "remote"

    def fetched() -> list[Path]:  # the shards on disk, not placeholders
        return [p for p in mirrors.rglob("*.tar") if p.stat().st_mtime_ns % 10**9 != 999_999_937]

    assert fetched() == []  # (the runs gave back what they fetched)
    # a reader streams shard by shard: never more on disk than it keeps and the one read ahead
    most, records = 0, 0
    with open_dataset(f"s3://{s3}/wds") as reader:
        for _ in reader:
            records += 1
            most = max(most, len(fetched()))
    assert records == 60 and 1 <= most <= 4 < len(list(mirrors.rglob("*.tar")))


@pytest.mark.parametrize("layout", ["imagenet", "coco", "audio", "video", "recordio", "parquet", "glob"])
def test_every_layout_reads_from_a_store_as_it_reads_locally(s3, imagenet, tmp_path, layout):
    """Folders, COCO, the audio and video layouts read from object storage too, and the sharded formats
    gpubatch writes there (a glob pattern picks shards as locally)."""
    if layout in ("recordio", "parquet", "glob"):
        if layout == "parquet":
            pytest.importorskip("pyarrow")
        local = tmp_path / layout
        convert(imagenet, local, to="webdataset" if layout == "glob" else layout, shard_size=16)
    else:
        local = ROOT / "sample_data" / layout
    upload(local, s3, layout)
    url = f"s3://{s3}/{layout}" + ("/data-00000[12].tar" if layout == "glob" else "")
    want = content(local / "data-000001.tar") + content(local / "data-000002.tar") if layout == "glob" else content(local)
    assert content(url) == want and sum(want.values()) > 0
    r = info(url)
    assert r.records == sum(want.values()) and not r.unreadable


def test_a_stores_parquet_file_is_read_whole_though_the_cache_gives_it_back_as_it_is_fetched(s3, imagenet, tmp_path,
                                                                                             monkeypatch):
    """The cache of a store's files keeps the last KEEP fetched (the older become placeholders again, some in a
    read-ahead's thread). pyarrow reads the file through the descriptor the fetch checked, not by its path
    again: with no file kept at all, every record is still read (by path, a placeholder was read in between:
    "Parquet magic bytes not found")."""
    pytest.importorskip("pyarrow")
    from gpubatch import _remote

    local = tmp_path / "parquet"
    convert(imagenet, local, to="parquet", shard_size=16)
    upload(local, s3, "pq")
    monkeypatch.setattr(_remote, "KEEP", 0)
    assert content(f"s3://{s3}/pq") == content(local)
    assert info(f"s3://{s3}/pq").records == 60


@pytest.mark.parametrize("to,shard_size", [("recordio", 16), ("recordio", 55), ("parquet", 16), ("tfrecord", 55)])
def test_recordio_parquet_and_tfrecord_written_to_a_store_are_the_local_runs_bytes(s3, imagenet, tmp_path, to,
                                                                                   shard_size):
    """(a shard of 55 images passes 1 MiB: they leave the staging folder once uploaded, before finalize)"""
    if to == "parquet":
        pytest.importorskip("pyarrow")
    convert(imagenet, tmp_path / "local", to=to, shard_size=shard_size)
    convert(imagenet, f"s3://{s3}/out", to=to, shard_size=shard_size)
    assert without_manifest(objects(s3, "out")) == without_manifest(local_files(tmp_path / "local"))


def test_augment_to_a_store_writes_the_local_runs_bytes_and_parameters(s3, imagenet, tmp_path):
    from gpubatch import augment

    chain = {"ops": "random_resized_crop(size=48) | flip(p=0.5)", "copies": 2, "seed": 4, "to": "webdataset",
             "shard_size": 20, "device": "cpu"}
    augment(imagenet, tmp_path / "local", **chain)
    s = augment(imagenet, f"s3://{s3}/aug", **chain)
    assert s.records_out == 120
    got = objects(s3, "aug")
    assert without_manifest(got) == without_manifest(local_files(tmp_path / "local"))
    assert "augment-params.jsonl" in got


def test_an_upload_a_killed_run_made_is_kept_and_another_runs_object_replaced(s3, tmp_path):
    """Exclusive create: an object already there at the size this run writes is the interrupted run's upload
    (its bytes are this run's), one of another size is replaced."""
    import fsspec

    from gpubatch._publish import Destination

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    (tmp_path / "a").write_bytes(b"x" * 100)
    dest = Destination(f"s3://{s3}/d")
    dest.put(tmp_path / "a", "shard.tar")
    dest.put(tmp_path / "a", "shard.tar")  # (refused by the store: the same size, kept)
    assert fs.cat_file(f"{s3}/d/shard.tar") == b"x" * 100
    (tmp_path / "b").write_bytes(b"y" * 7)
    dest.put(tmp_path / "b", "shard.tar")
    assert fs.cat_file(f"{s3}/d/shard.tar") == b"y" * 7


def test_a_store_prefix_a_run_is_still_writing_is_refused_as_a_source(s3, imagenet, tmp_path):
    convert(imagenet, tmp_path / "wds", to="webdataset", shard_size=16)
    upload(tmp_path / "wds", s3, "half")
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.rm(f"{s3}/half/gpubatch.json")
    fs.pipe_file(f"{s3}/half/.gpubatch/run.json", b"{}")
    with pytest.raises(Exception, match="still writing, or whose run was interrupted"):
        info(f"s3://{s3}/half")


def test_a_damaged_record_in_a_remote_shard_is_named_by_its_url(s3, imagenet, tmp_path):
    wds = tmp_path / "wds"
    convert(imagenet, wds, to="webdataset", shard_size=60)
    tar = next(wds.glob("*.tar"))
    raw = bytearray(tar.read_bytes())
    at = raw.find(b"\xff\xd8\xff", 4096)
    raw[at : at + 64] = bytes(64)  # one image's header zeroed
    tar.write_bytes(bytes(raw))
    upload(wds, s3, "wds")
    s = convert(f"s3://{s3}/wds", tmp_path / "out", to="tfrecord", resize_shorter=32, device="cpu")
    assert s.records_out == 59 and len(s.skipped) == 1
    assert s.skipped[0]["origin"].startswith(f"s3://{s3}/wds/data-000000.tar#")


def _command(src: str, dst: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "gpubatch", "convert", src, dst, "--to", "webdataset", "--shard-size", "8",
            "--resize-shorter", "200", "--workers", "2", "--device", "cpu", "-q", *more]


def test_a_run_killed_while_its_dataset_went_up_resumes_to_the_same_objects(s3, imagenet, tmp_path, monkeypatch):
    """Killed after its shards were up and its dataset made, while the rest went up: the dataset's local copy
    left in the cache does not stop --resume, which makes it again from the store's journal."""
    from gpubatch import _publish
    from gpubatch.errors import GpubatchError

    convert(imagenet, tmp_path / "local", to="webdataset", shard_size=16)
    real = _publish.Destination.finish

    def cut(self, root):
        self.put(root / "wids.json", "wids.json")
        shutil.copytree(root, tmp_path / "left")  # (what a kill -9 here leaves: the dataset's copy)
        raise GpubatchError("killed")

    monkeypatch.setattr(_publish.Destination, "finish", cut)
    with pytest.raises(GpubatchError, match="killed"):
        convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=16)
    monkeypatch.setattr(_publish.Destination, "finish", real)
    shadow = _publish.Destination(f"s3://{s3}/out").shadow()
    shutil.copytree(tmp_path / "left", shadow)
    assert "gpubatch.json" not in objects(s3, "out")
    s = convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=16, resume=True)
    assert s.records_out == 60
    got = objects(s3, "out")
    assert without_manifest(got) == without_manifest(local_files(tmp_path / "local")) and "gpubatch.json" in got
    s = convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=16, resume=True)  # (finished: its manifest)
    assert any("complete already" in w for w in s.warnings)
    with pytest.raises(GpubatchError, match=r"finished by another command \(shard_size: 16 then, 8 now\)"):
        convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=8, resume=True)


def test_a_run_stopped_after_its_manifest_went_up_is_tidied_by_resume(s3, imagenet, tmp_path, monkeypatch):
    """Killed after its manifest went up and before its journal went: the dataset is complete, and the store
    also holds the run's ``.gpubatch/`` (its journal, run.json) and the cache its local copy. ``--resume`` says the
    dataset is complete, removes those, and says so (once); the dataset's objects are untouched. (The test of 4
    kill moments below met this moment on the CI machine: the journal left beside a complete dataset.)"""
    from gpubatch import _publish
    from gpubatch.errors import GpubatchError

    convert(imagenet, tmp_path / "local", to="webdataset", shard_size=16)
    real = _publish.Destination.drop_journal
    shadow = _publish.Destination(f"s3://{s3}/out").shadow()

    def killed(self):
        shutil.copytree(shadow, tmp_path / "left")  # (what a kill -9 here leaves in the cache)
        raise GpubatchError("killed")

    monkeypatch.setattr(_publish.Destination, "drop_journal", killed)
    with pytest.raises(GpubatchError, match="killed"):
        convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=16)
    monkeypatch.setattr(_publish.Destination, "drop_journal", real)
    shutil.copytree(tmp_path / "left", shadow)
    left = objects(s3, "out")
    journal = [n for n in left if n.startswith(".gpubatch/")]
    assert "gpubatch.json" in left and ".gpubatch/run.json" in journal and len(journal) == 5  # (run.json, 4 entries)
    s = convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=16, resume=True)
    assert any("complete already" in w for w in s.warnings)
    assert any(w.startswith("--resume: removed the journal (5 objects)") for w in s.warnings), s.warnings
    got = objects(s3, "out")
    assert got == {k: v for k, v in left.items() if not k.startswith(".gpubatch/")}  # (the dataset untouched)
    assert without_manifest(got) == without_manifest(local_files(tmp_path / "local")) and not shadow.exists()
    s = convert(imagenet, f"s3://{s3}/out", to="webdataset", shard_size=16, resume=True)
    assert not any("removed the journal" in w for w in s.warnings) and objects(s3, "out") == got


def test_s3_to_s3_killed_at_4_moments_resumes_to_the_same_objects(s3, s3_env, tmp_path):
    from tests.helpers import jpeg_bytes, photo

    src = tmp_path / "photos"  # 160 photo-like JPEGs: a run of a few seconds
    base = [jpeg_bytes(photo(480, 640, seed=k), 92) for k in range(8)]
    for i in range(160):
        (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 4}" / f"{i:04d}.jpg").write_bytes(base[i % 8])
    upload(src, s3, "photos")
    env = child_env()
    t0 = time.perf_counter()
    subprocess.run(_command(f"s3://{s3}/photos", f"s3://{s3}/whole"), env=env, check=True, timeout=300)
    took = time.perf_counter() - t0
    want = objects(s3, "whole")
    rng = random.Random(54)
    resumed = 0
    for k in range(4):
        dst = f"s3://{s3}/k{k}"
        sems = semaphores_now()
        proc = subprocess.Popen(_command(f"s3://{s3}/photos", dst), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0.3, 0.9) * took)
        kill_group(proc, sems)
        p = subprocess.run(_command(f"s3://{s3}/photos", dst, "--resume", "--json"), env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        s = json.loads(p.stdout)
        resumed += any(w.startswith("--resume:") and " of " in w for w in s["warnings"])
        got = objects(s3, f"k{k}")
        assert without_manifest(got) == without_manifest(want), f"kill {k}"
        assert "gpubatch.json" in got and not any(n.startswith(".gpubatch") for n in got)
    assert resumed >= 1


def test_the_outputs_read_back_by_webdataset_and_the_tfrecord_package_through_fsspec(s3, imagenet, tmp_path):
    import fsspec

    wds = pytest.importorskip("webdataset")
    tfrecord_reader = pytest.importorskip("tfrecord.reader")
    convert(imagenet, f"s3://{s3}/wds", to="webdataset", shard_size=16)
    convert(imagenet, f"s3://{s3}/tfr", to="tfrecord", shard_size=32)
    import importlib

    gopen = importlib.import_module("webdataset.gopen")  # (the module: the package exports its function too)
    gopen.gopen_schemes["s3"] = lambda url, mode="rb", bufsize=8192, **kw: fsspec.open(url, mode).open()
    try:
        samples = list(wds.WebDataset(f"s3://{s3}/wds/data-{{000000..000003}}.tar", shardshuffle=False))
    finally:
        gopen.gopen_schemes.pop("s3", None)
    assert len(samples) == 60 and all("cls" in x for x in samples)
    n = 0
    for name in sorted(fsspec.filesystem("s3").glob(f"{s3}/tfr/*.tfrecord")):
        path = fsspec.open_local(f"simplecache::s3://{name}", simplecache={"cache_storage": str(tmp_path / "fc")})
        for rec in tfrecord_reader.tfrecord_loader(path, None, {"image/encoded": "byte", "image/class/label": "int"}):
            assert len(rec["image/encoded"]) > 100
            n += 1
    assert n == 60


def test_a_dataset_in_a_store_verifies_and_an_object_changed_there_is_named(s3, imagenet, tmp_path):
    """``gpubatch.verify`` on a store URL: each listed object's size from the listing, its CRC-32C from a streamed
    read; an object replaced by other bytes of the same size is named, in one line on the command line."""
    import fsspec

    from gpubatch import verify

    url = f"s3://{s3}/wds"
    convert(imagenet, url, to="webdataset", shard_size=16)
    r = verify(url)
    assert r.ok and r.listed and len(r.files) == 8 and r.records == r.records_found == 60
    fs = fsspec.filesystem("s3")
    key = f"{s3}/wds/data-000001.tar"
    data = bytearray(fs.cat_file(key))
    data[700] ^= 0x20
    fs.pipe_file(key, bytes(data))
    fs.invalidate_cache()
    r = verify(url, records=False)
    assert [(f.name, f.state) for f in r.bad] == [("data-000001.tar", "digest")]
    p = run_cli("info", url, "--verify", env={**os.environ})
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith(
        f"error: {url}: 1 of its 8 files differ from what was written (data-000001.tar: other bytes: crc32c:")


def test_https_sources_from_a_local_http_server(imagenet, tmp_path, monkeypatch):
    pytest.importorskip("aiohttp")
    monkeypatch.setenv("GPUBATCH_CACHE", str(tmp_path / "cache"))
    served = tmp_path / "served"
    convert(imagenet, served, to="webdataset", shard_size=16)
    handler = functools.partial(_QuietHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/data-{{000000..000003}}.tar"
        r = info(url)
        assert r.records == 60 and r.format == "webdataset" and r.class_counts["bird"] == 15
        s = convert(url, tmp_path / "out", to="folder")
        assert s.records_out == 60 and content(tmp_path / "out") == content(served)
        with pytest.raises(UsageError, match="is an HTTP URL, which gpubatch reads but cannot write"):
            convert(imagenet, f"http://127.0.0.1:{httpd.server_address[1]}/new", to="webdataset")
    finally:
        httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # (no line a request)
        pass


def test_pipe_sources_and_destinations(imagenet, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBATCH_CACHE", str(tmp_path / "cache"))
    wds = tmp_path / "wds"
    convert(imagenet, wds, to="webdataset", shard_size=16)
    s = convert(f"pipe:cat {wds}/data-{{000000..000003}}.tar", tmp_path / "a", to="tfrecord")
    assert s.records_out == 60 and s.src.startswith("pipe:cat ")  # (the shards alone: no manifest, no class names)
    with open_dataset(tmp_path / "a") as a, open_dataset(wds) as w:
        assert [(r.key, r.label, r.data) for r in a] == [(r.key, r.label, r.data) for r in w]
    out = tmp_path / "piped"
    out.mkdir()
    s = convert(imagenet, f"pipe:cat > {out}/{{name}}", to="webdataset", shard_size=16)
    assert s.records_out == 60
    assert without_manifest(local_files(out)) == without_manifest(local_files(wds))
    assert json.loads((out / "gpubatch.json").read_text())["records"] == 60
    with pytest.raises(UsageError, match="names no {name}"):
        convert(imagenet, f"pipe:cat > {out}/x", to="webdataset")


def test_what_a_store_cannot_take_is_refused_before_anything_moves(s3, imagenet, tmp_path):
    with pytest.raises(UsageError, match="lmdb cannot be written to s3://.*takes the formats written as shard files"):
        convert(imagenet, f"s3://{s3}/db", to="lmdb")
    with pytest.raises(UsageError, match="--num-parts and --executor ray|num_parts"):
        convert(imagenet, f"s3://{s3}/p", to="webdataset", num_parts=2, part=0)
    upload(imagenet, s3, "other")  # a prefix of objects that are no gpubatch run's
    with pytest.raises(UsageError, match="not a gpubatch run's"):
        convert(imagenet, f"s3://{s3}/other", to="webdataset")
    assert objects(s3, "other") == local_files(imagenet)  # untouched
    with pytest.raises(Exception, match="not found|no file"):
        convert(f"s3://{s3}/nothing-here", tmp_path / "o", to="folder")
    assert not (tmp_path / "o").exists()


def test_a_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBATCH_CACHE", str(tmp_path / "cache"))
    import importlib

    registry = importlib.import_module("fsspec.registry")  # (the module: fsspec exports a mapping of that name)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # (as where the [s3] extra is not installed)
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    with pytest.raises(DependencyError, match=r"s3:// URLs need s3fs: pip install 'gpubatch\[s3\]'"):
        info("s3://bucket/x-{000000..000001}.tar")
    try:
        import adlfs  # noqa: F401
    except ImportError:  # (the [azure] extra is not installed here: the command's own line)
        p = run_cli("info", "az://container/x")
        assert p.returncode != 0
        assert p.stderr.strip().splitlines() == ["error: az:// URLs need adlfs: pip install 'gpubatch[azure]'"]


def test_credentials_in_a_url_are_never_printed(s3, imagenet, tmp_path):
    p = run_cli("convert", imagenet, f"s3://AKIDSECRET:verysecret@{s3}/out", "--to", "folder",
                env={**os.environ})
    assert "verysecret" not in p.stderr + p.stdout and "AKIDSECRET" not in p.stderr + p.stdout
