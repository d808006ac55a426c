"""``gpubatch bench --model NAME``: preprocessing throughput here, GPU vs CPU vs peers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .options import standard_output


def _list_models(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from rich.table import Table

    from ..bench.runner import list_models
    from ..report.console import stdout_console

    t = Table(title="bench models (--model NAME)", title_justify="left")
    t.add_column("model", style="bold")
    t.add_column("chains", overflow="fold")
    t.add_column("what it is")
    for name, doc, chains in list_models():
        t.add_row(name, "\n".join(f"{k}: {v or '(decode only)'}" for k, v in chains.items()), doc)
    with standard_output():
        stdout_console().print(t)
    ctx.exit(0)


def _check_writable(path: Path, flag: str) -> None:
    """Refuse, before the bench runs (minutes), a result file that could not be written after it."""
    from ..errors import UsageError

    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder: give a file name")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None
    if not existed:
        path.unlink()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default=None, metavar="NAME", help="Preprocessing chain to measure (see --list-models).")
@click.option("--data", type=click.Path(path_type=Path), default=None, help="A folder of JPEGs (searched recursively), or a dataset gpubatch wrote: its loader against the "
              "format's DALI reader and a webdataset DataLoader.")
@click.option("--synthetic", type=click.IntRange(min=1), default=None, metavar="N",
              help="Generate N ImageNet-like JPEGs (mixed subsampling, 75-97 quality) in a cache folder.")
@click.option("--images", type=click.IntRange(min=1), default=None, metavar="N", help="Use the first N files of --data.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Items a batch  [default: 256 images; 8 clips for video-clf]")
@click.option("--seconds", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Timed seconds per contender (after warm-up), split into 5 windows.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True)
@click.option("--gpu", type=int, default=0, show_default=True, help="CUDA device ordinal.")
@click.option("--baselines", default=None, metavar="LIST",
              help="Comma-separated contenders  [default: gpubatch-gpu,gpubatch-cpu,torch-dataloader,dali,dali-defaults]")
@click.option("--sweep", default=None, metavar="PARAM=v1,v2",
              help="Re-run the GPU contender for each value of batch_size, threads, cuda_share, warm_up (tiny "
                   "images the decoders are warmed with; 0: none), region_decode (0/1) or decode_chunk "
                   "(images per decode call at most, each call resampled as it comes and its buffer reused; default "
                   "256; 0: whole batch parts, two batches of memory), sync "
                   "(how threads wait for the GPU: auto, spin, yield, blocking), reserve_core (1: a CPU core of "
                   "its own for the hardware decoder's thread, the default on 8 cores or more; 0: none) or "
                   "decode_route (split, hardware, auto).")
@click.option("--busy", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Run N busy single-threaded processes (nice 19) beside every contender: the machine as it is "
                   "when other jobs share it.")
@click.option("--busy-after", type=click.FloatRange(min=0), default=None, metavar="S",
              help="Start the --busy processes S seconds into each contender's run instead of before it: load "
                   "that arrives while a run goes (gpubatch's decode route, chosen at the start, follows it; the "
                   "report says when it switched).")
@click.option("--decode-route", type=click.Choice(["auto", "split", "hardware"]), default=None,
              help="How gpubatch's GPU path splits each batch between the GPU's JPEG decoders: split (about 30% to "
                   "the CUDA decoder, which costs about 1 ms of CPU an image: fastest on a machine with 15 or more "
                   "free cores), hardware (all the hardware JPEG engine takes: far less CPU) or auto (by the cores "
                   "free when it starts; the default, or GPUBATCH_DECODE_ROUTE).")
@click.option("--gpu-memory", default=None, metavar="SIZE",
              help="Cap on the device memory of gpubatch's GPU contender (every part of it, as the driver counts "
                   "it), e.g. 1GiB: its memory figure beside a peer's at an equal cap. Image models.")
@click.option("--with-model", is_flag=True, help="Also time a real training step fed by the pipeline (torch).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Write the result as JSON.")
@click.option("--report", type=click.Path(path_type=Path), default=None, metavar="FILE.html|FILE.md",
              help="Write a self-contained HTML page (inline SVG charts) or Markdown.")
@click.option("--list-models", is_flag=True, expose_value=False, is_eager=True, callback=_list_models,
              help="List the models and exit.")
def bench(model: str | None, baselines: str | None, json_path: Path | None, report: Path | None, **opts) -> None:
    """Measure a model's preprocessing: images/s on the GPU and the CPU and against peers, GPU memory and
    utilisation, CPU cores, batch latency, the hardware decoder's share, where the time goes, and
    whether GPU pixels agree with the CPU path's."""
    from ..bench.report import render_terminal, to_html, to_markdown
    from ..bench.runner import run_bench
    from ..errors import UsageError
    from ..report.console import console, esc

    if not model:
        raise UsageError("bench needs --model NAME (see --list-models)")
    if report is not None and report.suffix.lower() not in (".html", ".htm", ".md"):
        raise UsageError(f"--report {report}: give a .html or .md file name")
    for flag, path in (("--json", json_path), ("--report", report)):
        if path is not None:
            _check_writable(path, flag)
    con = console()
    result = run_bench(model, baselines=baselines.split(",") if baselines else None, argv=["gpubatch", *sys.argv[1:]],
                       say=lambda s: con.print(f"[dim]{esc(s)}[/]"), **opts)
    render_terminal(result, con)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
    if report:
        report.write_text(to_markdown(result) if report.suffix.lower() == ".md" else to_html(result))
        con.print(f"report: {esc(report)}")
