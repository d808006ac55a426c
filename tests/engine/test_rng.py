"""Per-record randomness: deterministic by (seed, key), independent across keys, well spread."""

from __future__ import annotations

import numpy as np

from gpubatch.engine.ops import Flip, RandomResizedCrop
from gpubatch.engine.plan import Plan
from gpubatch.engine.rng import record_rng


def test_same_seed_and_key_same_stream():
    a, b = record_rng(1, "x"), record_rng(1, "x")
    assert [a.random() for _ in range(20)] == [b.random() for _ in range(20)]
    assert record_rng(1, "x").random() != record_rng(2, "x").random()
    assert record_rng(1, "x").random() != record_rng(1, "y").random()


def test_distributions():
    r = record_rng(0, "stats")
    u = np.array([r.random() for _ in range(20000)])
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    ints = np.array([r.integers(3, 7) for _ in range(20000)])
    assert set(ints.tolist()) == {3, 4, 5, 6} and abs(ints.mean() - 4.5) < 0.03
    assert all(2.0 <= r.uniform(2.0, 3.0) < 3.0 for _ in range(1000))


def test_random_resized_crop_params_are_valid_and_reproducible():
    plan = Plan(ops=(RandomResizedCrop(224, scale=(0.08, 1.0)), Flip()), seed=5)
    areas, flips = [], 0
    for i in range(2000):
        (top, left, ch, cw), (hf, vf) = plan.draw(f"img{i}", 375, 500)
        assert 0 <= top and 0 <= left and top + ch <= 375 and left + cw <= 500
        assert (top, left, ch, cw) == plan.draw(f"img{i}", 375, 500)[0]
        areas.append(ch * cw / (375 * 500))
        flips += hf
        assert not vf
    assert 0.08 <= min(areas) * 1.05 and max(areas) <= 1.0
    assert 900 < flips < 1100
