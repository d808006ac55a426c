"""The one-screen end-of-run summary of ``convert`` and ``augment``."""

from __future__ import annotations

from collections import Counter
from typing import Any


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def gpu_memory_text(mem: dict) -> str:
    """"peak 612 MiB of 768 MiB cap (2 processes)": a run's device memory as the driver counted it."""
    text = f"peak {mem['peak_mib']:,} MiB" if mem.get("peak_mib") is not None else "peak not measured (no NVML)"
    if mem.get("cap_mib"):
        text += f" of {mem['cap_mib']:,} MiB cap"
    if mem.get("processes", 1) > 1:
        text += f" ({mem['processes']} processes)"
    if mem.get("context_start_mib"):
        text += f"; {mem['context_start_mib']:,} MiB while a CUDA context started (its first milliseconds)"
    if mem.get("method", "").startswith("device"):
        text += " (the device's memory in use: NVML does not list this run's processes here)"
    return text


def render_summary(summary: Any, title: str = "convert") -> None:
    """Print a RunSummary on the stderr console: counts, bytes, time, skipped records with reasons."""
    from rich.table import Table

    from .console import console, esc, titled

    con = console()
    t = titled(esc(f"{title}: {summary.src} ({summary.src_format}) -> {summary.dst} ({summary.dst_format})"),
               show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("device", f"{esc(summary.device)}  [dim]{esc(summary.device_reason)}[/]")
    t.add_row("records in", f"{summary.records_in:,}")
    t.add_row("records out", f"{summary.records_out:,}")
    work = f"{summary.passthrough:,} passed through, {summary.transcoded:,} re-encoded"
    if summary.fallbacks:
        work += f", {summary.fallbacks:,} decoded on the CPU after the GPU refused them"
    t.add_row("work", work)
    if summary.boxes_dropped:
        t.add_row("boxes dropped", f"{summary.boxes_dropped:,} (left the image, or kept too little of their area)")
    if getattr(summary, "first_frames", 0):
        t.add_row("first frames", f"{summary.first_frames:,} image{'s' * (summary.first_frames != 1)} of several frames "
                  "(animated GIF, WebP or PNG; a TIFF of pages): the first written")
    style = "red" if summary.skipped else "green"
    t.add_row("skipped", f"[{style}]{len(summary.skipped):,}[/]")
    t.add_row("bytes", f"{human_bytes(summary.bytes_in)} in, {human_bytes(summary.bytes_out)} out")
    rate = f"{summary.records_per_second:,.0f} records/s"
    if summary.records_out != summary.records_in and summary.seconds > 0:
        rate += f" in, {summary.records_out / summary.seconds:,.0f} out"
    t.add_row("time", f"{summary.seconds:.2f} s ({rate})")
    mem = getattr(summary, "gpu_memory", None)
    if mem:
        t.add_row("gpu memory", gpu_memory_text(mem))
    per_gpu = getattr(summary, "per_gpu", None) or {}
    if len(per_gpu) > 1:
        t.add_row("per GPU", ", ".join(f"gpu:{g} {v['records']:,} ({v['records_per_s']:,.0f}/s)"
                                       for g, v in sorted(per_gpu.items(), key=lambda kv: (len(kv[0]), kv[0]))))
    if getattr(summary, "bound", ""):
        t.add_row("bound by", esc(summary.bound))
    con.print(t)
    if summary.skipped:
        reasons = Counter(f"{e['stage']}: {e['reason']}" for e in summary.skipped)
        rt = Table(title="skipped records", title_justify="left")
        rt.add_column("record")
        rt.add_column("reason")
        for e in summary.skipped[:20]:
            rt.add_row(esc(e["origin"] or e["key"]), esc(f"{e['stage']}: {e['reason']}"))
        if len(summary.skipped) > 20:
            rt.add_row(f"... {len(summary.skipped) - 20} more", f"{len(reasons)} distinct reasons")
        con.print(rt)
    for w in summary.warnings:
        con.print(f"[yellow]warning:[/] {esc(w)}")
