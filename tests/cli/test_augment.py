"""``gpubatch augment`` on the CPU: presets, the ops DSL, reproducibility, the drawn-parameter log, boxes,
errors. (tests/engine/test_gpu_augment.py runs the same on the GPU.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import gpubatch
from gpubatch.api import open_dataset
from gpubatch.engine.codecs import image as host
from gpubatch.engine.ops import OPS
from gpubatch.engine.plan import Plan
from gpubatch.engine.registry import HOST, get_kernel
from gpubatch.engine.spec import PRESETS, chain_spec, load_pipeline, parse_chain
from gpubatch.errors import UsageError
from tests.helpers import run_cli, tree_digest


def _records(path: Path) -> dict[str, object]:
    with open_dataset(path) as r:
        return {rec.key: rec for rec in r}


def _digests(path: Path) -> dict[str, str]:
    return {k: hashlib.sha256(r.data).hexdigest() for k, r in _records(path).items()}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs(preset, imagenet, coco, tmp_path):
    src = coco if preset == "ssd" else imagenet
    s = gpubatch.augment(src, tmp_path / "out", preset=preset, copies=2, limit=6, device="cpu")
    assert s.records_in == 6 and s.records_out == 12 and not s.skipped
    recs = _records(tmp_path / "out")
    assert sorted(recs) == sorted(f"{k}_aug{c}" for k in {k.rsplit('_aug', 1)[0] for k in recs} for c in (0, 1))
    for r in recs.values():
        img = host.decode(r.data)
        if preset in ("resnet50-train", "resnet50-val"):
            assert img.shape == (224, 224, 3)
        if preset == "ssd":
            assert img.shape == (300, 300, 3)
            if r.boxes is not None and len(r.boxes):
                assert r.boxes.canvas == (300, 300)
                assert (r.boxes.xyxy >= 0).all() and (r.boxes.xyxy <= 300).all()


def test_same_seed_same_bytes_and_params_reproduce_outputs(imagenet, tmp_path):
    chain = "random_resized_crop(size=96) | color_jitter(brightness=0.4, hue=0.1) | rotate(degrees=15) | gaussian_noise(sigma=5)"
    a = gpubatch.augment(imagenet, tmp_path / "a", ops=chain, copies=2, seed=7, limit=10, device="cpu", quality=90)
    gpubatch.augment(imagenet, tmp_path / "b", ops=chain, copies=2, seed=7, limit=10, device="cpu", quality=90)
    gpubatch.augment(imagenet, tmp_path / "c", ops=chain, copies=2, seed=8, limit=10, device="cpu", quality=90)
    assert a.records_out == 20
    da, db, dc = _digests(tmp_path / "a"), _digests(tmp_path / "b"), _digests(tmp_path / "c")
    assert da == db
    assert all(da[k] != dc[k] for k in da)
    manifest = json.loads((tmp_path / "a" / "gpubatch.json").read_text())
    ops = parse_chain(manifest["augment"]["chain"])
    assert manifest["augment"]["seed"] == 7 and ops == parse_chain(chain)
    log = [json.loads(line) for line in (tmp_path / "a" / "augment-params.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in log) == sorted(da)
    src = _records(imagenet)
    out = _records(tmp_path / "a")
    plan = Plan(ops=ops, seed=7)
    for e in log[:6]:  # regenerate outputs from the source and the logged parameters alone
        pixels = host.decode(src[e["key"].rsplit("_aug", 1)[0]].data)
        params = plan.draw(e["key"], *pixels.shape[:2])
        assert json.loads(json.dumps(params, default=list)) == e["params"]
        for op, p in zip(ops, params):
            pixels = get_kernel(op.name, HOST)(op, [pixels], [p])[0]
        assert host.encode(pixels, "jpeg", 90) == out[e["key"]].data


def test_keep_original_and_other_format(imagenet, tmp_path):
    before = tree_digest(imagenet)
    s = gpubatch.augment(imagenet, tmp_path / "wds", ops="flip(p=1.0)", copies=1, keep_original=True,
                         to="webdataset", limit=5, device="cpu")
    assert s.records_out == 10 and s.passthrough == 5
    recs = _records(tmp_path / "wds")
    src = _records(imagenet)
    originals = [k for k in recs if "_aug" not in k]
    assert len(originals) == 5 and all(recs[k].data == src[k].data for k in originals)
    for k in originals:
        flipped = host.decode(recs[f"{k}_aug0"].data).astype(int)
        assert np.abs(flipped - host.decode(src[k].data)[:, ::-1]).mean() < 3
    assert tree_digest(imagenet) == before


def test_boxes_follow_a_rotation(coco, tmp_path):
    gpubatch.augment(coco, tmp_path / "out", ops="rotate90(k=1)", copies=1, device="cpu")
    src, out = _records(coco), _records(tmp_path / "out")
    for k, r in src.items():
        o = out[f"{k}_aug0"]
        h, w = r.boxes.canvas
        assert o.boxes.canvas == (w, h) and len(o.boxes) == len(r.boxes)
        x0, y0, x1, y1 = r.boxes.xyxy.T
        np.testing.assert_allclose(o.boxes.xyxy, np.stack([y0, w - x1, y1, w - x0], 1), atol=1e-3)


def test_one_error_per_bad_source_record(imagenet, tmp_path):
    bad = next(imagenet.rglob("*.jpg"))
    bad.write_bytes(bad.read_bytes()[:200])
    s = gpubatch.augment(imagenet, tmp_path / "out", preset="resnet50-val", copies=3, device="cpu")
    assert len(s.skipped) == 1 and s.records_out == 3 * (s.records_in - 1)


def test_pipeline_files(tmp_path):
    (tmp_path / "p.yaml").write_text("- random_resized_crop(size=128)\n- op: flip\n  p: 0.3\n- color_jitter: {brightness: 0.2}\n")
    (tmp_path / "p.json").write_text(json.dumps([{"op": "rotate", "degrees": [-5, 5]}, "grayscale(p=0.2)"]))
    ops = load_pipeline(tmp_path / "p.yaml")
    assert [o.name for o in ops] == ["random_resized_crop", "flip", "color_jitter"] and ops[1].p == 0.3
    assert [o.name for o in load_pipeline(tmp_path / "p.json")] == ["rotate", "grayscale"]
    (tmp_path / "bad.yaml").write_text("- [unclosed\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_pipeline(tmp_path / "bad.yaml")
    for item in ("- {p: 0.5}\n", "- flip: 3\n", "- 7\n"):  # no op name, or parameters that are no mapping
        (tmp_path / "odd.yaml").write_text(item)
        with pytest.raises(UsageError, match="cannot read item"):
            load_pipeline(tmp_path / "odd.yaml")
    for name in PRESETS:  # every preset's text round-trips through the manifest's chain text
        ops = parse_chain(PRESETS[name][0])
        assert parse_chain(chain_spec(ops)) == ops


@pytest.mark.parametrize("args,message", [
    (["--ops", "rotate(degree=3)"], "unknown parameter 'degree' (did you mean 'degrees'?); valid: degrees"),
    (["--ops", "sharpen()"], "unknown op 'sharpen' (did you mean 'sharpness'?); valid ops:"),
    (["--ops", "flip() | normalize()"], "normalize makes tensors"),
    (["--ops", "resize(height=3)"], "resize: missing parameter width"),
    (["--ops", "flip(p=__import__('os'))"], "parameters must be literals"),
    (["--preset", "ssd", "--ops", "flip()"], "exactly one of --preset, --ops or --pipeline"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--ops", "flip()", "--copies", "0"], "--copies"),
])
def test_bad_chains_are_refused_before_reading(imagenet, tmp_path, args, message):
    r = run_cli("augment", imagenet, tmp_path / "out", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_cli_lists_and_runs(imagenet, tmp_path):
    r = run_cli("augment", "--list-ops")
    assert r.returncode == 0 and all(name in r.stdout for name in OPS)
    r = run_cli("augment", "--list-presets")
    assert r.returncode == 0 and all(name in r.stdout for name in PRESETS)
    import os

    narrow = run_cli("augment", "--list-presets", env={**os.environ, "COLUMNS": "80"})
    cells = "".join(line.split("│")[2].strip() for line in narrow.stdout.splitlines() if line.count("│") == 4)
    assert all(chain.replace(" ", "") in cells.replace(" ", "") for chain, _ in PRESETS.values())  # never cut short
    r = run_cli("augment", imagenet, tmp_path / "out", "--preset", "randaugment", "--copies", "2", "--limit", "4",
                "--device", "cpu", "--json", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records_out"] == 8


@pytest.mark.parametrize("text,column", [("flip()|", 7), ("flip||flip", 6), ("flip(p=0.5", 5)])
def test_a_chain_that_does_not_parse_names_the_column(text, column):
    with pytest.raises(UsageError, match=f"cannot parse op chain at column {column}:"):
        parse_chain(text)
