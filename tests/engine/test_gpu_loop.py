"""The host part of a GPU worker's loop (``engine/gpu/images``), on the CPU: a fed batch's jobs settled against
their decoded sources (stand-in arrays), the outputs' size checks, one error per failed source, the records
made from the encoder's results."""

from __future__ import annotations

import numpy as np
import pytest

from gpubatch.engine.gpu.feed import RecordReads
from gpubatch.engine.gpu.images import Settled, transform_fed
from gpubatch.engine.ops import Posterize, ResizeShorter
from gpubatch.engine.plan import Plan
from gpubatch.engine.run import Job, outputs_of
from gpubatch.engine.windows import leading_windows
from gpubatch.errors import RecordError, RunStats, Stage
from gpubatch.types import Record


def _fed(plan: Plan, sizes: list[tuple[int, int]]) -> RecordReads:
    """What a RecordFeed reader makes of one record per header size (as ``feed._read_records`` does)."""
    stats = RunStats()
    jobs: list[Job] = []
    results: list = []
    for i, size in enumerate(sizes):
        rec = Record(key=f"c/{i}", data=b"\xff\xd8", origin=f"src/{i}.jpg", label=i)
        for o in outputs_of(rec, plan, stats, source=i, size=size):
            if isinstance(o, Job):
                jobs.append(o)
                o = len(jobs) - 1
            results.append(o)
    windows = leading_windows(plan.ops, [j.params for j in jobs], [sizes[j.source] for j in jobs])
    keys = [(f"c/{i}", f"src/{i}.jpg") for i in range(len(sizes))]
    return RecordReads(list(sizes), [("baseline/4:2:0",) + s for s in sizes], keys, jobs, results, windows, {}, 0.0)


def _arrays(sizes: list[tuple[int, int] | None]) -> list:
    return [None if s is None else np.empty((*s, 3), np.uint8) for s in sizes]


@pytest.mark.parametrize("ops", [(ResizeShorter(16),), (ResizeShorter(16), Posterize(bits=4))],
                         ids=["one window segment", "a step after it"])
def test_settled_checks_sizes_and_names_each_failure_once(ops):
    """An output beyond JPEG's side limit is its record's error, whether the size comes from the folded
    windows (one window segment) or op by op; a source that failed to decode is one error however many
    variants it has; the rows, arrays, parameters and windows of the rest stay aligned."""
    plan = Plan(ops=ops, copies=2, seed=3)
    headers = [(48, 64), (1, 65000), (60, 60), (40, 30)]
    fed = _fed(plan, headers)
    decoded = [(48, 64), (1, 65000), None, (44, 30)]  # the last decodes to another size than its header's
    errors = [None, None, "broken stream", None]
    s = Settled(plan, fed, _arrays(decoded), errors, RunStats())
    assert len(s.arrays) == len(s.params) == len(s.codecs) == len(s.jobs) == len(s.rows) == 4
    if s.first is not None:
        assert s.first[1].tolist() == [list(plan.out_hw(*a.shape[:2], p)) for a, p in zip(s.arrays, s.params)]
        assert s.first[1][-1].tolist() == [16 * 44 // 30, 16]  # redrawn for the decoded size
    s.encoded([b"jpeg"] * len(s.rows))
    out = s.outputs()
    made = [r for r in out if isinstance(r, Record)]
    failed = [r for r in out if isinstance(r, RecordError)]
    assert [r.key for r in made] == ["c/0_aug0", "c/0_aug1", "c/3_aug0", "c/3_aug1"]
    assert all(r.data == b"jpeg" and r.codec == "jpeg" and r.size is None for r in made)
    assert [(e.key, e.stage) for e in failed] == [("c/1_aug0", Stage.ENCODE), ("c/1_aug1", Stage.ENCODE),
                                                 ("c/2", Stage.DECODE)]
    assert "65,535" in failed[0].reason and failed[2].reason == "broken stream"


def test_transform_fed_keeps_the_order_and_the_encoder_failures(monkeypatch):
    """transform_fed's outputs in the batch's order; an encoder failure (a reason in place of bytes) is that
    output's error."""
    from gpubatch.engine.gpu import images

    plan = Plan(ops=(ResizeShorter(8),))
    fed = _fed(plan, [(20, 30), (30, 20), (25, 25)])
    seen = {}

    def encode(engine, plan, codecs, arrays, params, first, sink, clock):
        seen["first"] = first
        return [b"a", "the GPU jpeg encoder failed", b"c"]

    class Res:
        arrays, errors, fallbacks = _arrays([(20, 30), (30, 20), (25, 25)]), [None] * 3, 0

        def order(self, stream):
            pass

    monkeypatch.setattr(images, "_resample_encode", encode)
    stats = RunStats()
    out = transform_fed(type("E", (), {"stream": None})(), plan, fed, Res(), stats)
    assert [r.key for r in out] == ["c/0", "c/1", "c/2"]
    assert isinstance(out[1], RecordError) and out[1].stage == Stage.ENCODE
    assert stats.transcoded == 2 and seen["first"][1].tolist() == [[8, 12], [12, 8], [8, 8]]


def test_record_with_replaces_fields_and_refuses_unknown_ones():
    r = Record(key="a/b", data=b"x", size=(3, 4), meta={"filename": "b.jpg"})
    r2 = r.with_(data=b"y", codec="png")
    assert r2 == Record(key="a/b", data=b"y", codec="png", meta={"filename": "b.jpg"}) and r2.size is None
    assert r.with_(label=5, size=(1, 2)).size == (1, 2) and r.data == b"x" and r.label is None
    with pytest.raises(TypeError, match="no field 'nope'"):
        r.with_(nope=1)
    with pytest.raises(AttributeError):
        r2.key = "c"  # still frozen


def test_assembled_makes_each_span_its_jpeg_and_leaves_the_rest():
    """A GPU worker's batch travels to the shards' writer as spans of one buffer; the writer makes each
    span into its file: the headers of its quality and size around its slice of the buffer."""
    import functools
    import pickle

    from gpubatch.engine.codecs.jpeg_gpu import EncodedSpan, assembled, tables

    buf = np.frombuffer(b"abcdefghij", np.uint8)
    err = RecordError("c/1", "src/1", Stage.ENCODE, "the GPU jpeg encoder failed")
    records = [Record(key="c/0", data=EncodedSpan(2, 5, 3, 4, 90)), err, Record(key="c/2", data=b"raw", codec="png")]
    out = pickle.loads(pickle.dumps(functools.partial(assembled, records, buf)))(None)
    tab = tables(90)
    assert out[0].data == tab.prefix + b"\x00\x03\x00\x04" + tab.suffix + b"cde" + b"\xff\xd9"
    assert out[0].key == "c/0" and out[2] == records[2]
    assert isinstance(out[1], RecordError) and (out[1].key, out[1].reason) == (err.key, err.reason)
