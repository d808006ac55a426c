"""TFRecord's ``tf.train.Example`` written by gpubatch's own wire encoder (``example_parts``): the bytes
protobuf's deterministic serialization writes (upb, its default runtime), whatever the features, their
keys' order and values; an image's bytes a part of their own; the framing over parts as over the whole."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

from gpubatch.formats import tfrecord_example as te

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from tfrecord_encode import same_example  # noqa: E402  (the reference: protobuf's objects)
from tfrecord_encode import through_protobuf as protobuf_bytes  # noqa: E402

KEYS = ["a", "ab", "abc", "b", "image", "image/encoded", "image/format", "image/object/bbox/xmin",
        "image/object/bbox/xmax", "label", "Label", "z", "é", "éa", "日本", "a/b", "a.b", "", "x" * 200]


def random_value(rng: random.Random, kind: str):
    n = rng.choice([0, 0, 1, 1, 1, 2, 5])
    if kind == "byte":
        make = lambda: bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 3, 127, 128, 255, 256, 257, 300])))  # noqa: E731
        return make() if n == 1 and rng.random() < 0.5 else [make() for _ in range(n)]
    if kind == "int":
        pick = lambda: rng.choice([0, 1, -1, 127, 128, 300, -(1 << 63), (1 << 63) - 1, rng.getrandbits(40)])  # noqa: E731
        return pick() if n == 1 and rng.random() < 0.5 else [pick() for _ in range(n)]
    pick = lambda: rng.choice([0.0, -0.0, 1.5, -2.25, 1e-45, 3.4e38, 1e39, -1e39, math.inf, -math.inf, math.nan, 0.1, rng.random()])  # noqa: E731
    return pick() if n == 1 and rng.random() < 0.5 else [pick() for _ in range(n)]


def test_random_examples_are_protobufs_bytes():
    rng = random.Random(7)
    for _ in range(400):
        keys = rng.sample(KEYS, rng.randint(1, len(KEYS)))
        datum = {}
        for k in keys:
            kind = rng.choice(["byte", "int", "float"])
            datum[k] = (random_value(rng, kind), kind)
        got, size = te.example_parts(datum)
        assert same_example(b"".join(got), datum) and b"".join(got) == te.serialize_example(datum)
        assert size == sum(len(p) for p in got)


def test_an_image_record_is_protobufs_bytes_with_the_image_a_part_of_its_own():
    image = bytes(random.Random(1).getrandbits(8) for _ in range(200_000))
    for size in (0, 1, 255, 256, 257, 16_383, 16_384, 200_000):
        datum = {
            "image/encoded": (image[:size], "byte"), "image/format": (b"JPEG", "byte"), "image/height": (375, "int"),
            "image/width": (500, "int"), "image/class/label": (-1, "int"), "image/class/text": (b"", "byte"),
            **{f"image/object/bbox/{k}": ([], "float") for k in ("xmin", "ymin", "xmax", "ymax")},
            "image/object/class/text": ([], "byte"), "image/object/is_crowd": ([], "int"),
            "gpubatch/meta": (json.dumps({"k": size}).encode(), "byte"),
        }
        for _ in range(2):  # (the second time its small entries come from the memo)
            parts, n = te.example_parts(datum)
            assert same_example(b"".join(parts), datum) and n == sum(len(p) for p in parts)
            if size > 256:
                assert any(p is datum["image/encoded"][0] for p in parts)  # written as it is, not copied
    # a large value given as a memoryview: its bytes
    datum = {"image/encoded": (memoryview(image), "byte"), "image/format": (b"JPEG", "byte")}
    assert same_example(te.serialize_example(datum), {"image/encoded": (image, "byte"), "image/format": (b"JPEG", "byte")})


def test_framing_over_parts_is_the_framing_of_their_bytes():
    datum = {"image/encoded": (bytes(range(256)) * 40, "byte"), "label": (3, "int")}
    parts, n = te.example_parts(datum)
    assert te.frame_parts(parts, n) == te.frame_parts(b"".join(parts)) == te.frame_parts(parts)


def test_bad_values_fail_as_protobuf_fails():
    with pytest.raises(ValueError, match="out of range"):
        te.example_parts({"n": (1 << 63, "int")})
    with pytest.raises(ValueError):
        protobuf_bytes({"n": (1 << 63, "int")})
    for datum in ({"n": (2.5, "int")}, {"s": ("text", "byte")}, {"s": (["text"], "byte")}, {"n": (5, "byte")}):
        with pytest.raises(TypeError):
            te.example_parts(datum)
        with pytest.raises(TypeError):
            protobuf_bytes(datum)
    assert te.example_parts({}) == ([b""], 0) and protobuf_bytes({}) == b""


def test_the_memo_of_repeated_entries_stays_bounded():
    te._ENTRIES.clear()
    for i in range(te._MEMO_MAX + 10):
        te.example_parts({"image/height": (i, "int")})
    assert len(te._ENTRIES) <= te._MEMO_MAX
    assert same_example(te.serialize_example({"image/height": (5, "int")}), {"image/height": (5, "int")})


def test_the_encoder_benchmark_checks_and_times_both(tmp_path):
    """benchmarks/tfrecord_encode.py: both ways give the same bytes, and each gets its time a record."""
    import subprocess

    script = ROOT / "benchmarks" / "tfrecord_encode.py"
    r = subprocess.run([sys.executable, str(script), "--records", "40", "--image-bytes", "3000", "--repeats", "1",
                        "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["records"] == 40 and got["protobuf_us"] > 0 and got["wire_us"] > 0
