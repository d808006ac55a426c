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
        f"windows over {s['seconds']} s{', GPU synchronized before every clock read' if env.get('gpu') else ''}; "
        f"command: {env['command']}",
    ] + ([f"decode ceiling: {c['clips_per_s']:,} clips/s with all {c['cores']} cores decoding the files with "
          f"libsndfile and nothing else ({c['ms_per_clip_one_core']:.2f} ms a clip on one core), the most any "
          "pipeline that decodes them so on this CPU can reach"] if (c := data.get("decode_ceiling") or {}).get("clips_per_s")
         else []) + (
        [f"load: {s['busy_processes']} busy processes (nice 19) ran beside every contender (--busy)"
          + (f", from {s['busy_after_s']:g} s into each contender's run (--busy-after)"
             if s.get("busy_after_s") is not None else "")]
         if s.get("busy_processes") else [])


# the terminal's short headers, and which columns stay in the first table when the terminal is narrow
SHORT = {"images/s": "img/s", "clips/s": "clips/s", "spread": "range", "whole run": "run", "vs CPU": "vs CPU",
         "GPU mem": "GPU mem", "GPU util": "GPU%", "CPU cores": "cores", "batch p50/p99": "p50/p99 ms",
         "HW JPEG": "HW", "NVDEC util": "NVDEC", "decode workers": "workers", "bottleneck": "bound"}
FIRST = (0, 3, 4, 9)  # rate, vs CPU, GPU memory, bottleneck: the verdict's columns


def verdict(result: dict[str, Any], chain: str) -> str | None:
    """One line: who is fastest on ``chain``, by how much over the next, at what GPU memory, bound by what."""
    ran = sorted(((r["images_per_s"], n, r) for n, r, _ in rows(result, chain) if "images_per_s" in r), reverse=True)
    if not ran:
        return None
    unit = next((r["unit"] for _, _, r in ran if "unit" in r), "images")
    rate, name, r = ran[0]
    line = f"{name} is fastest: {rate:,.0f} {unit}/s" if len(ran) > 1 else \
        f"{name}: {rate:,.0f} {unit}/s (the only contender that ran)"
    if len(ran) > 1:
        rate2, name2, r2 = ran[1]
        line += f", {rate / rate2:.2f}x {name2} ({rate2:,.0f})" if rate2 else f", {name2} made none"
        if r.get("gpu_mem_gib") and r2.get("gpu_mem_gib"):
            line += f" at {r['gpu_mem_gib'] / r2['gpu_mem_gib']:.2f}x its GPU memory"
    if r.get("bottleneck"):
        line += f"; bound by {r['bottleneck']}"
    return line


def _fit(console: Any, cols: list[str], cells: list[list[str]], bar: int) -> list[list[int]]:
    """Which columns go in which table so that each fits the console's width: empty columns dropped, the
    rest in one table where it fits, else the verdict's columns first and the others in a second."""
    keep = [i for i in range(len(cols)) if any(c[i] not in ("-", "-/- ms", "") for c in cells)]
    width = [max(len(SHORT.get(cols[i], cols[i])), *(len(c[i]) for c in cells)) + 3 for i in keep]
    name = max((len(c[-1]) for c in cells), default=10) + 3
    if name + 2 + bar + 3 + sum(width) + 2 <= console.width:
        return [keep]
    return [[i for i in keep if i in FIRST], [i for i in keep if i not in FIRST]]


def render_terminal(result: dict[str, Any], console: Any) -> None:
    """The results as tables that fit the terminal: short headers, empty columns left out, and where the
    terminal is narrow (80 or 100 columns) the details in a second table; a verdict line per chain."""
    from rich.markup import escape
    from rich.table import Table

    head = _header(result)
    console.print(f"[bold]{escape(head[0])}[/]")
    for line in head[1:]:
        console.print(f"[dim]{escape(line)}[/]")
    for chain in result["results"]:
        rs = rows(result, chain)
        ran = [(name, r, cells) for name, r, cells in rs if len(cells) > 1]
        best = max((r["images_per_s"] for _, r, _ in ran), default=1.0) or 1.0
        cols = list(columns(result, chain))
        bar = 12 if console.width >= 100 else 8
        parts = _fit(console, cols, [[*cells, name] for name, _, cells in ran], bar) if ran else []
        for k, part in enumerate(parts):
            title = f"{result['model']['name']} / {chain}" + (" (details)" if k else "")
            t = Table(title=title, title_justify="left")
            t.add_column("contender", style="bold", no_wrap=True)
            if k == 0:
                t.add_column("", no_wrap=True)
            for i in part:
                t.add_column(SHORT.get(cols[i], cols[i]), justify="right", no_wrap=True)
            for name, r, cells in ran:
                lead = [f"[green]{'█' * max(1, int(bar * r['images_per_s'] / best))}[/]"] if k == 0 else []
                t.add_row(escape(name), *lead, *(escape(cells[i]) for i in part))
            console.print(t)
        for name, _, cells in rs:
            if len(cells) == 1:
                console.print(f"  [yellow]{escape(name)}: {escape(cells[0])}[/]")
        said = verdict(result, chain)
        if said:
            console.print(f"  [bold]{escape(said)}[/]")
        for n in _notes(result, chain):
            console.print(f"  {escape(n)}")
    sw = result.get("sweep")
    if sw and "points" in sw:
        t = Table(title=f"sweep {sw['param']} ({sw['contender']}, {sw['chain']})", title_justify="left")
        t.add_column(sw["param"], justify="right")
        t.add_column("images/s", justify="right")
        t.add_column("")
        best = max((p["images_per_s"] or 0 for p in sw["points"]), default=1.0) or 1.0
        span = max(10, min(30, console.width - 40))
        for p in sw["points"]:
            v = p["images_per_s"]
            t.add_row(escape(str(p["value"])), _num(v) if v else escape(p.get("error") or "-"),
                      "[green]" + "█" * max(1, int(span * (v or 0) / best)) + "[/]")
        console.print(t)
    elif sw:
        console.print(escape(f"sweep {sw['param']}: skipped: {sw['skipped']}"))


def to_markdown(result: dict[str, Any]) -> str:
    out = [f"# {_header(result)[0]}", "", *[f"- {h}" for h in _header(result)[1:]], ""]
    for chain in result["results"]:
        cols = columns(result, chain)
        said = verdict(result, chain)
        out += [f"## {result['model']['name']} / {chain}", "", *([f"**{said}**", ""] if said else []),
                "| contender | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for name, _, cells in rows(result, chain):
            cells = cells + [""] * (len(COLUMNS) - len(cells))
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out += [""] + [f"- {n}" for n in _notes(result, chain)] + [""]
    sw = result.get("sweep")
    if sw and "points" in sw:
        out += [f"## sweep {sw['param']}", "", f"| {sw['param']} | images/s |", "|---|---|"]
        out += [f"| {p['value']} | {_num(p['images_per_s'])} |" for p in sw["points"]] + [""]
    return "\n".join(out)


def _ticks(top: float, n: int = 5) -> list[float]:
    """Round axis ticks from 0 to at least ``top``."""
    import math

    raw = top / n if top > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [step * k for k in range(int(math.ceil(top / step)) + 1)]


def _bars_svg(items: list[tuple[str, float]], unit: str = "images/s", width: int = 720) -> str:
    """Horizontal bars, one a contender, on a labelled axis of ``unit`` with ticks and grid lines."""
    h, left, right = 26, 180, 70
    ticks = _ticks(max((v for _, v in items), default=1.0) or 1.0)
    top = ticks[-1] or 1.0
    plot = width - left - right
    height = h * len(items) + 50
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(unit)} per contender">']
    for t in ticks:
        x = left + plot * t / top
        parts.append(f'<line x1="{x:.1f}" y1="5" x2="{x:.1f}" y2="{h * len(items) + 8}" stroke="#ddd"/>'
                     f'<text x="{x:.1f}" y="{h * len(items) + 24}" font-size="11" text-anchor="middle">{t:,.0f}</text>')
    parts.append(f'<line x1="{left}" y1="{h * len(items) + 8}" x2="{left + plot}" y2="{h * len(items) + 8}" '
                 f'stroke="#666"/><text x="{left + plot / 2:.1f}" y="{height - 4}" font-size="12" '
                 f'text-anchor="middle">{html.escape(unit)}</text>')
    for i, (label, v) in enumerate(items):
        w = plot * v / top
        y = 5 + i * h
        parts.append(f'<text x="{left - 8}" y="{y + 17}" font-size="13" text-anchor="end">{html.escape(label)}</text>'
                     f'<rect x="{left}" y="{y + 3}" width="{max(w, 1):.1f}" height="{h - 8}" fill="#4a8"/>'
                     f'<text x="{left + w + 6:.1f}" y="{y + 17}" font-size="13">{v:,.0f}</text>')
    return "".join(parts) + "</svg>"


def _line_svg(points: list[tuple[float, float]], xlabel: str, ylabel: str = "images/s", width: int = 640,
              height: int = 260) -> str:
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
    axes = (f'<line x1="50" y1="{py(0):.1f}" x2="{width - 20}" y2="{py(0):.1f}" stroke="#666"/>'
            f'<line x1="50" y1="{py(0):.1f}" x2="50" y2="10" stroke="#666"/>'
            f'<text x="14" y="{height / 2:.1f}" font-size="12" text-anchor="middle" '
            f'transform="rotate(-90 14 {height / 2:.1f})">{html.escape(ylabel)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">{axes}'
            f'<polyline points="{line}" fill="none" stroke="#4a8" stroke-width="2"/>{dots}'
            f'<text x="{width / 2}" y="{height}" font-size="12" text-anchor="middle">{html.escape(xlabel)}</text></svg>')


def _html_row(name: str, r: dict[str, Any], cells: list[str]) -> str:
    """A contender's row of the HTML table; one that did not run gives its reason across the row."""
    e = html.escape
    if "images_per_s" not in r:
        return f"<tr><td>{e(name)}</td><td class='why' colspan='{len(COLUMNS)}'>{e(cells[0])}</td></tr>"
    return f"<tr><td>{e(name)}</td>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>"


def to_html(result: dict[str, Any]) -> str:
    e = html.escape
    body = [f"<h1>{e(_header(result)[0])}</h1><ul>" + "".join(f"<li>{e(h)}</li>" for h in _header(result)[1:]) + "</ul>"]
    for chain in result["results"]:
        rs = rows(result, chain)
        body.append(f"<h2>{e(result['model']['name'])} / {e(chain)}</h2>")
        said = verdict(result, chain)
        if said:
            body.append(f"<p class='verdict'>{e(said)}</p>")
        unit = next((r["unit"] for _, r, _ in rs if "unit" in r), "images")
        body.append(_bars_svg([(n, r["images_per_s"]) for n, r, _ in rs if "images_per_s" in r], f"{unit}/s"))
        head = "".join(f"<th>{e(c)}</th>" for c in ("contender", *columns(result, chain)))
        trs = "".join(_html_row(n, r, cells) for n, r, cells in rs)
        body.append(f"<table><tr>{head}</tr>{trs}</table><ul>"
                    + "".join(f"<li>{e(n)}</li>" for n in _notes(result, chain)) + "</ul>")
    sw = result.get("sweep")
    if sw and "points" in sw:
        body.append(f"<h2>sweep {e(sw['param'])}</h2>")
        body.append(_line_svg([(float(p["value"]), p["images_per_s"] or 0) for p in sw["points"]], sw["param"]))
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,td.why{text-align:left}"
             "td{white-space:nowrap}td.why,td:last-child{white-space:normal}"
             ".verdict{font-weight:bold;font-size:1.1em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>gpubatch bench</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>")
