"""Bench reports: a rich terminal table with bars, Markdown, and a self-contained HTML page (inline SVG)."""

from __future__ import annotations

import html
from typing import Any

COLUMNS = ("images/s", "spread", "whole run", "vs CPU", "GPU mem", "GPU util", "CPU cores", "batch p50/p99", "HW JPEG", "bottleneck")


def columns(result: dict[str, Any], chain: str) -> tuple[str, ...]:
    """The table's columns for ``chain``: a video model counts clips, and its decoder column is NVDEC's; an
    audio model counts clips, and that column its decoding workers (audio decodes on the CPU)."""
    res = result["results"][chain].values()
    unit = next((r["unit"] for r in res if "unit" in r), "images")
    if unit == "images":
        return COLUMNS
    video = any("nvdec_util_pct" in r for r in res) or result.get("model", {}).get("name") == "video-clf"
    return (f"{unit}/s", *COLUMNS[1:8], "NVDEC util" if video else "decode workers", COLUMNS[9])


def _num(v: Any, fmt: str = "{:,.0f}", none: str = "-") -> str:
    return none if v is None else fmt.format(v)


def rows(result: dict[str, Any], chain: str) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(contender, raw result, formatted cells) per contender of ``chain``."""
    out = []
    for name, r in result["results"][chain].items():
        if "images_per_s" not in r:
            out.append((name, r, [f"skipped: {r['skipped']}" if "skipped" in r else f"error: {r.get('error')}"]))
            continue
        cells = [
            _num(r["images_per_s"]),
            f"{_num(r['min'])}-{_num(r['max'])}",
            _num(r.get("whole_run_images_per_s")),
            _num(r.get("speedup_vs_cpu"), "{:.1f}x"),
            _num(r.get("gpu_mem_gib"), "{:.2f} GiB"),
            _num(r.get("gpu_util_pct"), "{:.0f}%"),
            _num(r.get("cpu_cores_used"), "{:.1f}"),
            f"{_num(r.get('batch_ms_p50'), '{:.1f}')}/{_num(r.get('batch_ms_p99'), '{:.1f}')} ms",
            (_num(r.get("hw_decoder_share"), "{:.0%}") if "unit" not in r
             else _num(r.get("nvdec_util_pct"), "{:.0f}%") if "nvdec_util_pct" in r else _num(r.get("workers"))),
            r.get("bottleneck") or "-",
        ]
        out.append((name, r, cells))
    return out


# cores busy elsewhere on the machine (other processes, or taken by the hypervisor) from which a
# contender's row gets a note: eight busy single-threaded processes on 16 cores cost gpubatch's training
# chain 45-55% and DALI's 12-16% (RESULTS.md as of a1d93e1, 2026-11-23)
BUSY_NOTE = 1.0


def _notes(result: dict[str, Any], chain: str) -> list[str]:
    notes = []
    for name, r in result["results"][chain].items():
        f = r.get("fidelity")
        if f and f.get("images"):
            notes.append(f"fidelity ({name} vs gpubatch-cpu, {f['images']} images): max |diff| {f['max_abs_diff']}, "
                         f"mean {f['mean_abs_diff']:.3f} {f['units']}")
        md = r.get("model")
        if md and "skipped" in md:
            notes.append(f"--with-model ({name}): skipped: {md['skipped']}")
        elif md:
            fed, alone = md["model_plus_pipeline_images_per_s"], md["model_alone_images_per_s"]
            verdict = "the model is fed" if not md["starved"] else f"the model runs at {fed / alone:.0%} of its speed alone"
            ceiling = md.get("shared_ceiling_images_per_s")
            if md["starved"] and ceiling:
                verdict += (f"; the pipeline's own kernels take about {md['pipeline_gpu_us_per_image']:.0f} us of GPU "
                            f"time an image, which leaves both at most {ceiling:,.0f} images/s on one GPU "
                            f"({fed / ceiling:.0%} of that reached)")
            notes.append(f"--with-model {md['model']} ({name}): model alone {alone:,.0f} images/s, "
                         f"model + pipeline {fed:,.0f}: {verdict}")
        host = r.get("host_cpu") or {}
        if host.get("others", 0) >= BUSY_NOTE or host.get("steal", 0) >= BUSY_NOTE:
            notes.append(f"busy machine ({name}): {host.get('others', 0):.1f} cores busy in other processes, "
                         f"{host.get('steal', 0):.1f} taken by the hypervisor during the run; figures from a busy "
                         "machine are lower than the tool's own speed")
        route = r.get("decode_route")
        if route:
            free = route.get("free_cores")
            moves = route.get("switches")
            notes.append(f"decode route ({name}): {route['route']}"
                         + (f", chosen with {free:.1f} cores free" if free is not None else "")
                         + ("; followed the load: " + ", ".join(f"{r} at {t:.0f} s ({c:.1f} cores free)" for t, r, c in moves)
                            + " (batches: " + ", ".join(f"{k} {v}" for k, v in route.get("batches", {}).items()) + ")"
                            if moves else ""))
        # what a video or audio contender ran (a peer's reader, torchaudio's version), or the plan under a cap
        if r.get("setting") and ("unit" in r or "gpu_memory_cap_mib" in r):
            notes.append(f"setting ({name}): {r['setting']}")
        if r.get("stages_s"):
            notes.append(f"stages ({name}, seconds): " + ", ".join(f"{k} {v:.2f}" for k, v in r["stages_s"].items()))
    return notes


def _header(result: dict[str, Any]) -> list[str]:
    env, data, s = result["environment"], result["data"], result["settings"]
    return [
        f"gpubatch bench --model {result['model']['name']}: {result['model']['doc']}",
        f"machine: {env.get('gpu') or 'no GPU'}; {env.get('cpu_model') or 'CPU'} ({env.get('cpu_cores')} cores); "
        f"CUDA {env.get('cuda_runtime') or '-'}; {env['date']}",
        f"data: {data['images']} {data.get('what', 'JPEGs')} ({data['kind']}) at {data['path']}; page cache {data['page_cache']}",
        f"method: batch {s['batch_size']}, {s['warmup_batches']} warm-up batches excluded, median of {s['windows']} "
        f"windows over {s['seconds']} s, GPU synchronized before every clock read; command: {env['command']}",
    ] + ([f"decode ceiling: {c['clips_per_s']:,} clips/s with all {c['cores']} cores decoding the files with "
          f"libsndfile and nothing else ({c['ms_per_clip_one_core']:.2f} ms a clip on one core), the most any "
          "pipeline that decodes them so on this CPU can reach"] if (c := data.get("decode_ceiling") or {}).get("clips_per_s")
         else []) + (
        [f"load: {s['busy_processes']} busy processes (nice 19) ran beside every contender (--busy)"
          + (f", from {s['busy_after_s']:g} s into each contender's run (--busy-after)"
             if s.get("busy_after_s") is not None else "")]
         if s.get("busy_processes") else [])


def render_terminal(result: dict[str, Any], console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    head = _header(result)
    console.print(f"[bold]{escape(head[0])}[/]")
    for line in head[1:]:
        console.print(f"[dim]{escape(line)}[/]")
    for chain in result["results"]:
        rs = rows(result, chain)
        best = max((r["images_per_s"] for _, r, _ in rs if "images_per_s" in r), default=1.0)
        t = Table(title=f"{result['model']['name']} / {chain}", title_justify="left")
        t.add_column("contender", style="bold")
        t.add_column("", min_width=12)
        for c in columns(result, chain):
            t.add_column(c, justify="right")
        skipped = []
        for name, r, cells in rs:
            if len(cells) == 1:
                skipped.append(f"{name}: {cells[0]}")
                continue
            bar = "█" * max(1, int(12 * r["images_per_s"] / best))
            t.add_row(escape(name), f"[green]{bar}[/]", *cells)
        console.print(t)
        for line in skipped:
            console.print(f"  [yellow]{escape(line)}[/]")
        for n in _notes(result, chain):
            console.print(f"  {escape(n)}")
    sw = result.get("sweep")
    if sw and "points" in sw:
        t = Table(title=f"sweep {sw['param']} ({sw['contender']}, {sw['chain']})", title_justify="left")
        t.add_column(sw["param"], justify="right")
        t.add_column("images/s", justify="right")
        t.add_column("")
        best = max((p["images_per_s"] or 0 for p in sw["points"]), default=1.0) or 1.0
        for p in sw["points"]:
            v = p["images_per_s"]
            t.add_row(escape(str(p["value"])), _num(v) if v else escape(p.get("error") or "-"),
                      "[green]" + "█" * max(1, int(30 * (v or 0) / best)) + "[/]")
        console.print(t)
    elif sw:
        console.print(escape(f"sweep {sw['param']}: skipped: {sw['skipped']}"))


def to_markdown(result: dict[str, Any]) -> str:
    out = [f"# {_header(result)[0]}", "", *[f"- {h}" for h in _header(result)[1:]], ""]
    for chain in result["results"]:
        cols = columns(result, chain)
        out += [f"## {result['model']['name']} / {chain}", "", "| contender | " + " | ".join(cols) + " |",
                "|---" * (len(cols) + 1) + "|"]
        for name, _, cells in rows(result, chain):
            cells = cells + [""] * (len(COLUMNS) - len(cells))
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += [""] + [f"- {n}" for n in _notes(result, chain)] + [""]
    sw = result.get("sweep")
    if sw and "points" in sw:
        out += [f"## sweep {sw['param']}", "", f"| {sw['param']} | images/s |", "|---|---|"]
        out += [f"| {p['value']} | {_num(p['images_per_s'])} |" for p in sw["points"]] + [""]
    return "\n".join(out)


def _bars_svg(items: list[tuple[str, float]], width: int = 640) -> str:
    h, top = 26, max((v for _, v in items), default=1.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h * len(items) + 10}" role="img">']
    for i, (label, v) in enumerate(items):
        w = int((width - 260) * v / top)
        y = 5 + i * h
        parts.append(f'<text x="0" y="{y + 17}" font-size="13">{html.escape(label)}</text>'
                     f'<rect x="170" y="{y + 3}" width="{max(w, 1)}" height="{h - 8}" fill="#4a8"/>'
                     f'<text x="{176 + w}" y="{y + 17}" font-size="13">{v:,.0f}</text>')
    return "".join(parts) + "</svg>"


def _line_svg(points: list[tuple[float, float]], xlabel: str, width: int = 640, height: int = 260) -> str:
    pts = [(x, y) for x, y in points if y]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y1 = min(xs), max(xs), max(ys) or 1.0

    def px(x: float) -> float:
        return 50 + (width - 70) * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5)

    def py(y: float) -> float:
        return height - 30 - (height - 50) * y / y1

    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
    dots = "".join(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3"/><text x="{px(x):.1f}" y="{py(y) - 8:.1f}" '
                   f'font-size="11" text-anchor="middle">{y:,.0f}</text>'
                   f'<text x="{px(x):.1f}" y="{height - 12}" font-size="11" text-anchor="middle">{x:g}</text>'
                   for x, y in pts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
            f'<polyline points="{line}" fill="none" stroke="#4a8" stroke-width="2"/>{dots}'
            f'<text x="{width / 2}" y="{height}" font-size="12" text-anchor="middle">{html.escape(xlabel)}</text></svg>')


def to_html(result: dict[str, Any]) -> str:
    e = html.escape
    body = [f"<h1>{e(_header(result)[0])}</h1><ul>" + "".join(f"<li>{e(h)}</li>" for h in _header(result)[1:]) + "</ul>"]
    for chain in result["results"]:
        rs = rows(result, chain)
        body.append(f"<h2>{e(result['model']['name'])} / {e(chain)}</h2>")
        body.append(_bars_svg([(n, r["images_per_s"]) for n, r, _ in rs if "images_per_s" in r]))
        head = "".join(f"<th>{e(c)}</th>" for c in ("contender", *columns(result, chain)))
        trs = "".join("<tr><td>" + e(n) + "</td>" + "".join(f"<td>{e(c)}</td>" for c in cells)
                      + "<td></td>" * (len(COLUMNS) - len(cells)) + "</tr>" for n, _, cells in rs)
        body.append(f"<table><tr>{head}</tr>{trs}</table><ul>"
                    + "".join(f"<li>{e(n)}</li>" for n in _notes(result, chain)) + "</ul>")
    sw = result.get("sweep")
    if sw and "points" in sw:
        body.append(f"<h2>sweep {e(sw['param'])}</h2>")
        body.append(_line_svg([(float(p["value"]), p["images_per_s"] or 0) for p in sw["points"]], sw["param"]))
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>gpubatch bench</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>")
