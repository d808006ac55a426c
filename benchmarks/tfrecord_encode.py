#!/usr/bin/env python3
"""A TFRecord image record's ``tf.train.Example``: gpubatch's wire encoder (``example_parts``, the parts a
shard writes) against the same Example made through protobuf's objects and serialized deterministically, µs a
record, the best of ``--repeats`` passes over ``--records`` records (an image of ``--image-bytes`` random bytes,
the 17 features a pass-through of a labelled folder writes). The two are checked to be the same bytes first.

    python3 benchmarks/tfrecord_encode.py [--records 2000] [--image-bytes 90000] [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from gpubatch.formats import tfrecord_example as te  # noqa: E402

LISTS = {"byte": "bytes_list", "float": "float_list", "int": "int64_list"}


def through_protobuf(datum: dict) -> bytes:
    ex = te.example_pb2().Example()
    feats = ex.features.feature
    for key, (value, kind) in datum.items():
        if not isinstance(value, (list, tuple, np.ndarray)):
            value = [value]
        getattr(feats[key], LISTS[kind]).value.extend(value)
    return ex.SerializeToString(deterministic=True)


def same_example(ours: bytes, datum: dict) -> bool:
    """Whether ``ours`` is ``datum``'s Example as protobuf writes it: the very bytes under protobuf's default
    runtime (upb), whose map order the encoder follows; under another runtime (older protobufs, whose
    deterministic map order differs), the same message, read back and written again by that runtime."""
    from google.protobuf.internal import api_implementation

    ref = through_protobuf(datum)
    if api_implementation.Type() == "upb":
        return ours == ref
    return te.example_pb2().Example.FromString(ours).SerializeToString(deterministic=True) == ref


def record(i: int, image: bytes) -> dict:
    return {
        "image/encoded": (image, "byte"), "image/format": (b"JPEG", "byte"),
        "image/filename": (f"class_{i % 16:02d}/img_{i:06d}.jpg".encode(), "byte"),
        "image/source_id": (f"class_{i % 16:02d}/img_{i:06d}".encode(), "byte"),
        "image/height": (300 + i % 200, "int"), "image/width": (400 + i % 160, "int"),
        "image/class/label": (i % 16, "int"), "image/class/text": (f"class_{i % 16:02d}".encode(), "byte"),
        **{f"image/object/bbox/{k}": ([], "float") for k in ("xmin", "ymin", "xmax", "ymax")},
        "image/object/class/label": ([], "int"), "image/object/class/text": ([], "byte"),
        "image/object/is_crowd": ([], "int"), "image/object/area": ([], "float"),
        "gpubatch/meta": (json.dumps({"source": f"img_{i:06d}.jpg"}, sort_keys=True).encode(), "byte"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--image-bytes", type=int, default=90_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    image = os.urandom(args.image_bytes)
    data = [record(i, image) for i in range(args.records)]
    assert all(same_example(b"".join(te.example_parts(d)[0]), d) for d in data), "not protobuf's Example"
    out = {"records": args.records, "image_bytes": args.image_bytes}
    for name, fn in (("protobuf_us", through_protobuf), ("wire_us", te.example_parts)):
        best = min(timeit.repeat(lambda fn=fn: [fn(d) for d in data], number=1, repeat=args.repeats))
        out[name] = round(best / args.records * 1e6, 2)
    out["speedup"] = round(out["protobuf_us"] / out["wire_us"], 2)
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
