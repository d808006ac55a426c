"""A run split into parts (--num-parts P --part I, as a Slurm array or Kubernetes jobs run it) and made
whole by ``gpubatch finish``: the same bytes as one run; refusals that name what is missing or different."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpubatch.api import augment, convert, finish
from gpubatch.errors import GpubatchError, UsageError
from tests.engine.test_shards import FORMATS, digest, manifest
from tests.helpers import child_env


def _part(src: Path, dst: Path, to: str, parts: int, part: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpubatch", "convert", str(src), str(dst), "--to", to,
                             "--shard-size", "3" if to == "coco" else "7", "--resize-shorter", "48", "--quality", "80",
                             "--num-parts", str(parts), "--part", str(part), "--workers", "1", "-q"],
                            env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("to", FORMATS)
def test_parts_run_as_separate_processes_then_finish_equal_the_one_process_run(imagenet, coco, tmp_path, to):
    src = coco if to == "coco" else imagenet
    one = tmp_path / "one"
    convert(src, one, to=to, shard_size=3 if to == "coco" else 7, resize_shorter=48, quality=80)
    dst = tmp_path / "parts"
    procs = [_part(src, dst, to, 3, i) for i in range(3)]  # side by side, as an array job's tasks run
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert not dst.exists()  # (no dataset before finish)
    s = finish(dst)
    assert s.records_out == (12 if to == "coco" else 60) and not s.skipped
    assert digest(dst) == digest(one)
    assert manifest(dst) == manifest(one) | {"options": manifest(dst)["options"]}
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".parts.")]  # staging renamed in


def test_finish_with_a_part_missing_refuses_naming_it_and_keeps_the_shards(imagenet, tmp_path):
    dst = tmp_path / "out"
    opts = dict(to="tfrecord", shard_size=5, resize_shorter=40, num_parts=4)
    for part in (0, 2, 3):
        s = convert(imagenet, dst, part=part, **opts)
        assert s.records_in == 15 and any(w.startswith(f"part {part} of 4") for w in s.warnings)
    with pytest.raises(GpubatchError, match=r"3 of 12 shards are not committed: part 1 of 4 \(data-00003"):
        finish(dst)
    stage = tmp_path / ".out.gpubatch-partial"
    assert len(list(stage.glob("*.tfrecord"))) == 9  # kept for the missing part
    said = convert(imagenet, dst, part=1, **opts).warnings
    assert f"part 1 of 4: 3 shards committed in {stage}; every part's shards are committed: run 'gpubatch finish " \
           f"{dst}'" in said, said
    assert finish(dst).records_out == 60
    one = tmp_path / "one"
    convert(imagenet, one, to="tfrecord", shard_size=5, resize_shorter=40)
    assert digest(dst) == digest(one)


def test_a_part_of_another_cut_or_command_is_refused_and_a_rerun_part_writes_only_what_is_missing(imagenet,
                                                                                                   tmp_path):
    dst = tmp_path / "out"
    opts = dict(to="webdataset", shard_size=5, resize_shorter=40)
    convert(imagenet, dst, num_parts=2, part=0, **opts)
    with pytest.raises(UsageError, match="was cut into 2 parts; run every part with num_parts=2"):
        convert(imagenet, dst, num_parts=3, part=1, **opts)
    with pytest.raises(UsageError, match=r"another command's shards \(options.resize_shorter: 40 then, 41 now\)"):
        convert(imagenet, dst, num_parts=2, part=1, **{**opts, "resize_shorter": 41})
    stage = tmp_path / ".out.gpubatch-partial"
    before = {p.name: p.stat().st_mtime_ns for p in stage.glob("*.tar")}
    s = convert(imagenet, dst, num_parts=2, part=0, **opts)  # a part run again: its shards are committed
    assert s.records_in == 30 and len(before) == 6
    assert {p.name: p.stat().st_mtime_ns for p in stage.glob("*.tar")} == before  # (not written again)
    convert(imagenet, dst, num_parts=2, part=1, **opts)
    assert finish(dst).records_out == 60
    with pytest.raises(UsageError, match="already exists"):
        convert(imagenet, dst, num_parts=2, part=1, **opts)


def test_augment_in_parts_equals_one_run_with_its_parameter_log(coco, tmp_path):
    one, dst = tmp_path / "one", tmp_path / "parts"
    augment(coco, one, preset="ssd", copies=2, shard_size=5, to="webdataset")
    for part in range(2):
        augment(coco, dst, preset="ssd", copies=2, shard_size=5, to="webdataset", num_parts=2, part=part)
    finish(dst)
    assert digest(dst) == digest(one)


def test_the_finish_command_says_what_is_missing_in_one_line(imagenet, tmp_path):
    from tests.helpers import run_cli

    p = run_cli("finish", tmp_path / "nothing")
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and "no run to finish" in p.stderr
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "tfrecord", "--shard-size", "10", "--num-parts", "2", "--part", "1", "-q")
    assert p.returncode == 0, p.stderr
    p = run_cli("finish", tmp_path / "o")
    assert p.returncode != 0 and "part 0 of 2" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("convert", imagenet, tmp_path / "o", "--to", "tfrecord", "--part", "1")
    assert p.returncode == 2 and "--num-parts and --part go together" in p.stderr


def test_finish_runs_where_there_is_no_gpu_for_parts_that_ran_on_gpus(imagenet, tmp_path):
    """finish decodes nothing: parts that ran on GPU machines are finished on a machine without one (here,
    a CPU run's journal made to say the parts ran on a GPU, as a GPU part's says)."""
    import json

    dst = tmp_path / "out"
    opts = dict(to="webdataset", shard_size=10, resize_shorter=40, num_parts=2)
    for part in range(2):
        convert(imagenet, dst, part=part, **opts)
    run_file = tmp_path / ".out.gpubatch-partial" / ".gpubatch" / "run.json"
    doc = json.loads(run_file.read_text())
    doc["fingerprint"]["device"] = "gpu"
    doc["run"].update(device_name="NVIDIA H200", device_kind="gpu")
    run_file.write_text(json.dumps(doc))
    s = finish(dst)
    assert s.records_out == 60 and s.device == "gpu:0 (NVIDIA H200)" and "finish" in s.device_reason
    assert json.loads((dst / "gpubatch.json").read_text())["device"] == "gpu:0 (NVIDIA H200)"
