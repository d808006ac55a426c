"""``--gpu-memory`` as a cap on everything a run takes on the device: the plan's arithmetic, the sample
of headers it sizes images by, the sampler without NVML, the summary line (CPU tests; the GPU tests
that run convert under caps are in test_gpu_memory_gpu.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from gpubatch.engine.gpu.memory import (
    DEFAULT_IMAGE,
    MARGIN,
    CapTooSmall,
    ImageNeed,
    ProcessMemory,
    descendants,
    held,
    image_need,
    plan_memory,
    sample_need,
)

MiB = 1 << 20
PARTS = {"context": 270, "decoders": 60, "kernels and encoder": 40}
FIXED = 370 * MiB


def test_a_roomy_cap_keeps_the_batch_and_decoding_ahead():
    need = image_need(375, 500, 224, 224)
    plan = plan_memory(8 << 30, FIXED, PARTS, need, batch=256, ahead=2)
    assert (plan.batch, plan.ahead) == (256, 2)
    assert plan.decode == 256 * held(2) * need.decoded
    # everything the plan hands out fits the cap
    assert plan.fixed + plan.pool_limit + MARGIN == plan.cap and plan.decode <= plan.pool_limit


@pytest.mark.parametrize("cap_mib", [1024, 768, 640, 624])
def test_a_tight_cap_decodes_less_far_ahead_then_shrinks_batches(cap_mib):
    need = image_need(375, 500, 224, 224)
    cap = cap_mib * MiB
    plan = plan_memory(cap, FIXED, PARTS, need, batch=512, ahead=2)
    per_image = held(plan.ahead) * need.decoded + need.work
    assert plan.batch * per_image <= cap - FIXED - MARGIN  # the batches fit what the cap leaves
    assert plan.batch == 512 or (plan.batch + 1) * per_image > cap - FIXED - MARGIN  # and are as large as fit
    assert plan.ahead >= 1
    assert plan.pool_limit >= plan.decode + plan.batch * need.work  # the pools hold the batches and their work
    assert plan.fixed + plan.pool_limit + MARGIN <= cap


def test_the_batch_shrinks_as_the_cap_does():
    need = image_need(375, 500, 224, 224)
    batches = [plan_memory(c * MiB, FIXED, PARTS, need, batch=512).batch for c in (2048, 1024, 768, 614)]
    assert batches == sorted(batches, reverse=True) and batches[0] == 512 and batches[-1] < 64


def test_below_one_image_the_cap_is_refused_naming_the_minimum_and_its_parts():
    need = image_need(375, 500, 224, 224)
    with pytest.raises(CapTooSmall) as e:
        plan_memory(256 * MiB, FIXED, PARTS, need, batch=256, spec="256MiB")
    text = str(e.value)
    least = -(-(FIXED + MARGIN + held(1) * need.decoded + need.work) // MiB)
    assert text.startswith(f"--gpu-memory 256MiB is below the {least} MiB this run needs at least: ")
    assert "context 270, decoders 60, kernels and encoder 40, one image 3" in text
    assert "\n" not in text
    # the minimum itself is accepted, with batches of one
    assert plan_memory(least * MiB, FIXED, PARTS, need, batch=256).batch == 1


def test_image_need_counts_the_decode_and_four_outputs():
    need = image_need(480, 640, 224, 224)
    assert need == ImageNeed(480 * 640 * 3, 4 * 224 * 224 * 3, (480, 640))
    assert image_need(100, 200).work == 4 * 100 * 200 * 3


class _Reader:
    def __init__(self, blobs):
        self.blobs = blobs

    def read(self, i):
        from gpubatch.types import Record

        if isinstance(self.blobs[i], Exception):
            raise self.blobs[i]
        return Record(key=f"k{i}", data=self.blobs[i], codec="jpeg")


def _jpeg(w: int, h: int, fmt: str = "JPEG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, fmt)
    return buf.getvalue()


def test_the_sample_of_headers_finds_the_largest_image_and_passes_over_bad_records():
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    plan = Plan(ops=parse_chain("resize_shorter(64)"), max_pixels=0)
    blobs = [_jpeg(64, 48), b"not an image", _jpeg(320, 200), _jpeg(90, 700, "PNG"), ValueError("unreadable")]
    need = sample_need(_Reader(blobs).read, list(range(len(blobs))), plan)
    assert need.size == (700, 90)  # the PNG, read through Pillow
    assert need.decoded == 700 * 90 * 3
    oh, ow = plan.out_hw(700, 90, plan.draw("k3", 700, 90))
    assert need.work == 4 * oh * ow * 3
    assert sample_need(_Reader([b"x"]).read, [0], plan) == image_need(*DEFAULT_IMAGE)


def test_the_sampler_reads_nothing_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no bindings
    mem = ProcessMemory()
    assert not mem.ok and mem.now() == 0 and mem.method == "none"
    assert mem.start().stop() == 0


def test_a_context_starting_is_kept_apart_from_the_runs_peak(monkeypatch):
    """The peak a run reports leaves out each process's first CONTEXT_START_S on the GPU (a context at
    the driver's default stack); the summary names that moment where it went higher."""
    from gpubatch.engine.gpu.memory import CONTEXT_START_S, watch
    from gpubatch.errors import RunStats
    from gpubatch.report.summary import gpu_memory_text

    monkeypatch.setitem(sys.modules, "pynvml", None)
    mem = ProcessMemory(trace=True)
    for t, used, pids in [(0.0, 0, set()), (0.01, 518, {7}), (0.05, 258, {7}), (0.5, 442, {7}),
                          (0.6, 518, {7, 8}), (0.6 + CONTEXT_START_S + 0.01, 300, {7, 8})]:
        mem.on_gpu = pids
        mem.record(t, used * MiB)
    assert mem.peak == 518 * MiB and mem.peak_started == 442 * MiB and len(mem.trace) == 6
    assert mem.first_seen == {7: 0.01, 8: 0.6}
    text = gpu_memory_text({"peak_mib": 442, "cap_mib": 512, "context_start_mib": 518})
    assert text == "peak 442 MiB of 512 MiB cap; 518 MiB while a CUDA context started (its first milliseconds)"
    stats = RunStats()
    with watch(0, stats):  # no NVML: nothing to report
        pass
    assert "peak_mib" not in stats.gpu_memory


def test_the_bench_samplers_are_the_caps_measure_and_read_none_without_nvml(monkeypatch):
    from gpubatch.bench.measure import GpuSampler
    from gpubatch.bench.video import DecoderSampler

    monkeypatch.setitem(sys.modules, "pynvml", None)
    for cls in (GpuSampler, DecoderSampler):
        s = cls(0)
        assert isinstance(s, ProcessMemory) and s.children and s.pids == [os.getpid()]
        s.measuring = True
        out = s.summary()
        assert out["gpu_mem_gib"] is None and out["gpu_util_pct"] is None


def test_the_sampler_finds_the_processes_a_run_starts():
    import os

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert p.pid in descendants(os.getpid())
    finally:
        p.kill()
        p.wait()


def test_the_summary_names_the_peak_and_the_cap():
    from gpubatch.report.summary import gpu_memory_text

    assert gpu_memory_text({"peak_mib": 612, "cap_mib": 768, "processes": 1, "method": "nvml per process"}) == \
        "peak 612 MiB of 768 MiB cap"
    assert gpu_memory_text({"peak_mib": 1730, "method": "nvml per process"}) == "peak 1,730 MiB"
    assert "(2 processes)" in gpu_memory_text({"peak_mib": 900, "cap_mib": 1024, "processes": 2, "method": "x"})


def test_outputs_held_whatever_the_plan_come_off_the_room_and_are_named():
    """An in-memory pipeline's output batch is the caller's size: the decodes get what is left."""
    need = ImageNeed(640 * 640 * 3, 0, (640, 640))
    outputs = 256 * 4 * 224 * 224 * 3
    plan = plan_memory(1024 * MiB, FIXED, PARTS, need, batch=256, ahead=1, least_batch=256, outputs=outputs)
    assert plan.batch == (1024 * MiB - FIXED - MARGIN - outputs) // (held(1) * need.decoded)
    assert plan.pool_limit == 1024 * MiB - FIXED - MARGIN  # CuPy's pool holds the outputs and the decodes
    with pytest.raises(CapTooSmall, match=r"context 270, decoders 60, kernels and encoder 40, outputs 147, one image 4"):
        plan_memory(640 * MiB, FIXED, PARTS, need, batch=256, ahead=1, outputs=outputs)


def test_an_audio_record_needs_its_largest_op():
    """Whisper's chain on a 10 s clip: the log-mel's frames, spectrum, FFT work area and power of the
    30 s it is padded to take the most; speed perturbation counts its slowest factor."""
    from gpubatch.engine.gpu.memory import audio_need
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain

    whisper = Plan(ops=tuple(parse_chain("resample(rate=16000) | fix_duration(seconds=30) | log_mel(n_mels=80)")),
                   media="audio", max_pixels=0)
    frames, bins = 3000, 201
    want = 4 * 480000 + frames * (4 * 400 + 16 * bins + 4 * bins) + 8 * 80 * frames
    assert audio_need(whisper, 16000, 160000, 1) == want
    assert audio_need(whisper, 16000, 160000, 2) == 2 * want  # channels count
    slow = Plan(ops=tuple(parse_chain("speed(factors=(0.5, 2.0))")), media="audio", max_pixels=0)
    assert audio_need(slow, 16000, 16000, 1) == 4 * (2 * 16000 + 2 * 32000)  # the slowest factor's output


def test_an_audio_refusal_names_one_record():
    with pytest.raises(CapTooSmall, match=r"context 300, kernels 20, one record 5$"):
        plan_memory(400 * MiB, 320 * MiB, {"context": 300, "kernels": 20}, ImageNeed(0, 5 * MiB), 64, 1,
                    least_batch=1, unit="record")


def test_only_a_context_starting_may_pass_the_cap():
    from gpubatch.engine.gpu.memory import CONTEXT_START_S, over_cap

    cap = 500 * MiB
    trace = [(0.00, 0, frozenset()), (0.01, 518 * MiB, frozenset({7})), (0.02, 258 * MiB, frozenset({7})),
             (1.00, 480 * MiB, frozenset({7})), (1.01, 740 * MiB, frozenset({7, 8})),  # a second process starts
             (1.02 + CONTEXT_START_S, 501 * MiB, frozenset({7, 8}))]  # later: over
    assert over_cap(trace, cap) == [(1.02 + CONTEXT_START_S, 501 * MiB)]


def test_a_settled_reading_waits_for_the_figure_to_hold_still(monkeypatch):
    """NVML's figure of a process trails its allocations: a plan reads it once it stops moving."""
    mem = ProcessMemory.__new__(ProcessMemory)
    mem.ok = True
    readings = iter([100, 100, 400, 700, 700, 700, 700, 700, 700, 700, 700, 700])
    monkeypatch.setattr(ProcessMemory, "now", lambda self: next(readings))
    assert mem.settled(quiet=0.03, most=1.0) == 700
    mem.ok = False
    monkeypatch.setattr(ProcessMemory, "now", lambda self: 0)
    assert mem.settled() == 0  # without NVML: at once


def test_a_plans_sample_is_spread_over_the_dataset():
    from gpubatch.engine.gpu.memory import spread

    assert spread(list(range(100)), 4) == [0, 25, 50, 75]
    assert spread(list(range(3)), 48) == [0, 1, 2]
