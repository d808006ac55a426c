"""A media of one's own, added with new code and registrations alone: a toy "points" media (a record
holds 2-D points as text), its codec, one op and a format. ``convert`` and ``augment`` run it through
the same run flow as images, with no edit to the flow: the codec registry, the op's ``out_spec`` and
the format registry are the only places that learn of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpubatch.api import augment, convert
from gpubatch.errors import RecordError, Stage, UsageError
from gpubatch.types import DatasetInfo, Record


@pytest.fixture
def points_media():
    """Register the toy media's codec, op and format for one test, and take them back after."""
    from gpubatch.engine import media, registry
    from gpubatch.engine.ops.base import OPS, Op
    from gpubatch.formats import FORMATS, _load, register_format
    from gpubatch.formats.base import Format, Reader, Writer

    class PointsCodec:
        spec = media.MediaSpec("points", layout="N2", dtype="float32", channels=None)

        def check(self, record: Record, plan: Any) -> Record:
            self.decode(record, plan)
            return record

        def decode(self, record: Record, plan: Any) -> np.ndarray:
            try:
                return np.array([[float(v) for v in ln.split()] for ln in record.data.decode().splitlines()],
                                np.float32).reshape(-1, 2)
            except ValueError as e:
                raise RecordError(record.key, record.origin, Stage.DECODE, f"not points: {e}") from None

        def size(self, decoded: np.ndarray) -> tuple[int, int]:
            return decoded.shape[0], 2

        def encode(self, data: np.ndarray, record: Record, plan: Any) -> Record:
            text = "".join(f"{x:g} {y:g}\n" for x, y in data.tolist())
            return record.with_(data=text.encode(), codec="pts")

    @dataclass(frozen=True)
    class ShiftPoints(Op):
        """Move every point of a record by one offset drawn within [-reach, reach] per axis."""

        reach: float = 1.0
        name = "shift_points"
        media = ("points",)
        random = True
        kind = "custom"

        def make_params(self, h: int, w: int, rng: Any, boxes: Any = None) -> tuple[float, float]:
            return rng.uniform(-self.reach, self.reach), rng.uniform(-self.reach, self.reach)

    def shift_host(op: ShiftPoints, items: list[np.ndarray], params: list) -> list[np.ndarray]:
        return [np.asarray(p, np.float32) + np.asarray(d, np.float32) for p, d in zip(items, params)]

    class PointsReader(Reader):
        media = "points"

        def _scan(self) -> list[str]:
            return sorted(p.name for p in self.path.glob("*.pts"))

        def _read(self, name: str) -> Record:
            return Record(key=name[:-4], data=(self.path / name).read_bytes(), media="points", codec="pts",
                          origin=str(self.path / name))

    class PointsWriter(Writer):
        def write(self, record: Record) -> None:
            (self.root / f"{record.key}.pts").write_bytes(record.data)
            self.count += 1

    class PointsFormat(Format):
        name = "points"
        description = "a folder of .pts files (the media-neutrality test's toy)"
        carries_labels = False

        @classmethod
        def detect(cls, path: Path) -> bool:
            return Path(path).is_dir() and any(Path(path).glob("*.pts"))

        @classmethod
        def reader(cls, path: Path) -> Reader:
            return PointsReader(path)

        @classmethod
        def writer(cls, root: Path, info: DatasetInfo, options: Any) -> Writer:
            return PointsWriter(root, info, options)

    _load()
    media.register_codec("points", "pts", media.HOST, PointsCodec())
    registry.register_kernel("shift_points", registry.HOST)(shift_host)
    register_format(PointsFormat)
    try:
        yield
    finally:
        FORMATS.pop("points", None)
        OPS.pop("shift_points", None)
        media._CODECS.pop(("points", "pts", media.HOST), None)
        registry._KERNELS.pop(("shift_points", registry.HOST), None)


def _points(root: Path, n: int = 4) -> Path:
    root.mkdir()
    rng = np.random.default_rng(0)
    for k in range(n):
        pts = rng.uniform(0, 100, (5 + k, 2)).round(2)
        (root / f"p{k}.pts").write_text("".join(f"{x:g} {y:g}\n" for x, y in pts))
    return root


def _read(path: Path) -> dict[str, np.ndarray]:
    return {p.stem: np.loadtxt(p, ndmin=2) for p in sorted(path.glob("*.pts")) if p.stem != "bad"}


def test_a_toy_media_runs_through_the_run_flow(points_media, tmp_path):
    src = _points(tmp_path / "src")
    (src / "bad.pts").write_text("not a point\n")
    s = augment(src, tmp_path / "aug", ops="shift_points(reach=5.0)", copies=2, seed=7, device="cpu")
    assert s.records_in == 5 and s.records_out == 8 and s.transcoded == 8
    assert [e["stage"] for e in s.skipped] == ["decode"]  # the bad record: one error for its two variants
    before, after = _read(src), _read(tmp_path / "aug")
    for key, pts in before.items():
        shifts = [after[f"{key}_aug{k}"] - pts for k in range(2)]
        for d in shifts:  # every point of a record moved by the one offset drawn for it
            assert np.allclose(d, d[0], atol=1e-3) and np.all(np.abs(d[0]) <= 5.0)
        assert not np.allclose(shifts[0], shifts[1])  # each variant draws its own
    again = augment(src, tmp_path / "again", ops="shift_points(reach=5.0)", copies=2, seed=7, device="cpu")
    assert again.records_out == 8 and _read(tmp_path / "again").keys() == after.keys()
    assert all(np.array_equal(_read(tmp_path / "again")[k], after[k]) for k in after)  # reproducible by seed
    c = convert(src, tmp_path / "copy", to="points")  # no op: the bytes pass through, checked by the codec
    assert c.passthrough == 4 and len(c.skipped) == 1
    assert all((tmp_path / "copy" / f"{k}.pts").read_bytes() == (src / f"{k}.pts").read_bytes() for k in before)


def test_ops_of_another_media_are_refused_before_reading(points_media, tmp_path):
    src = _points(tmp_path / "src")
    with pytest.raises(UsageError, match="flip takes image or video data, not points"):
        augment(src, tmp_path / "out", ops="flip()", device="cpu")
    assert not (tmp_path / "out").exists()
