"""benchmarks/trace_convert.py: the hook that wraps the GPU image unit's run in the profiler (in the worker's
interpreter, only where asked), and the summary of the trace kept in benchmarks/results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trace_convert  # noqa: E402

from tests.helpers import child_env  # noqa: E402

PROBE = ("import gpubatch.engine.gpu.images as m, gpubatch.engine.execute.worker as w; "
         "print(m.GpuImageUnit.run.__name__, m.released is w.released)")


def _probe(tmp_path: Path, trace: str | None) -> str:
    (tmp_path / "sitecustomize.py").write_text(trace_convert.SITECUSTOMIZE)
    env = child_env(tmp_path)
    env.pop("GPUBATCH_TRACE", None)
    if trace:
        env["GPUBATCH_TRACE"] = trace
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_hook_wraps_the_units_run_only_where_a_trace_is_asked_for(tmp_path):
    assert _probe(tmp_path, None) == "run True"
    assert _probe(tmp_path, str(tmp_path / "t.json")) == "traced False"  # (and the worker's release is held back)


def test_the_summary_of_the_kept_trace_gives_the_figures_results_md_quotes():
    got = trace_convert.summarize(ROOT / "benchmarks/results/2026-12-04-convert-worker-trace-4096-036fdd6-h200.json.gz")
    hw = got["hardware thread"]
    assert (hw["copies"], hw["kernels"], hw["event syncs"], hw["runtime calls"]) == (4096, 4096, 3424, 16430)
    assert hw["kernel launch to start us (median, p90)"] == [298.0, 613.0]
    assert hw["event sync us (median, p95, max)"] == [1.9, 108.6, 820.0]
    assert hw["kernels by name"] == {"void nvjpeg::ycbcr_to_format_kernel_roi<": 3078,
                                     "void nvjpeg::rgba2rgb<(nvjpegOutputForma": 1018}
    # the streams, and whether the colour-conversion kernels wait behind the chain's kernels (RESULTS "14:11 to 14:15")
    assert (hw["streams with GPU work"], hw["streams of its kernels"]) == (70, 42)
    assert hw["its kernels launched while a chain kernel ran: count, launch to start us (median)"] == [181, 379.8]
    assert hw["the others: count, launch to start us (median)"] == [3915, 294.8]
    assert hw["its kernels starting within 3 us of a chain kernel's end"] == 26
    assert hw["its streams' median launch to start us (least, most)"] == [227.7, 539.1]
    assert hw["CUDA decoder kernels: count, streams, span ms"] == [2816, 11, 11.8]
