#!/usr/bin/env python3
"""How many one-bit errors in a JPEG's entropy-coded data a decoder notices (README, "Errors and safety").

    python3 benchmarks/jpeg_bitflips.py [--trials 300] [--seed 0] [--data sample_data/imagenet]

Each trial flips one random bit between the end of a JPEG's start-of-scan header and its end marker
(the only bytes JPEG's own structure does not check), then decodes the result with gpubatch's CPU
decoder (Pillow, as ``--verify full`` does). It prints how many flips raised an error, and how far the
pictures that decoded without one moved (mean absolute difference in levels). CPU only.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np


def scan_span(data: bytes) -> tuple[int, int] | None:
    """(first byte after the SOS header, index of the EOI marker) of a baseline or progressive JPEG."""
    sos = data.find(b"\xff\xda")
    eoi = data.rfind(b"\xff\xd9")
    if sos < 0 or eoi <= sos:
        return None
    start = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    return (start, eoi) if start < eoi else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="sample_data/imagenet")
    args = ap.parse_args()

    from gpubatch.engine.codecs import image as host

    files = sorted(p for p in Path(args.data).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    blobs = [(p, p.read_bytes()) for p in files]
    blobs = [(p, b, scan_span(b)) for p, b in blobs]
    blobs = [(p, b, s) for p, b, s in blobs if s is not None]
    if not blobs:
        raise SystemExit(f"no JPEGs under {args.data}")
    rng = random.Random(args.seed)
    caught, moved = 0, []
    for _ in range(args.trials):
        _, data, (a, b) = rng.choice(blobs)
        pos, bit = rng.randrange(a, b), rng.randrange(8)
        bad = bytearray(data)
        bad[pos] ^= 1 << bit
        try:
            got = host.decode(bytes(bad))
        except Exception:  # noqa: BLE001 - any refusal counts as noticed
            caught += 1
            continue
        ref = host.decode(data).astype(np.float64)  # (the same decoder: EXIF orientation, CMYK alike)
        moved.append(float(np.abs(got.astype(np.float64) - ref).mean()))
    print(f"{len(blobs)} JPEGs, {args.trials} one-bit flips in the entropy-coded data (seed {args.seed})")
    print(f"noticed by the decoder: {caught} ({100 * caught / args.trials:.1f}%)")
    if moved:
        q = np.percentile(moved, [50, 90, 100])
        print(f"decoded without an error: {len(moved)}; mean abs difference from the original, levels: "
              f"median {q[0]:.2f}, p90 {q[1]:.2f}, max {q[2]:.2f}")


if __name__ == "__main__":
    main()
