"""``gpubatch augment SRC DST``: a thin adapter over :func:`gpubatch.api.augment`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import FormatOption, device_options, held_back, pipeline_options, run_options, standard_output


def _list_ops(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from rich.table import Table

    from ..engine.spec import describe_ops
    from ..report.console import esc, stdout_console

    t = Table(title="augment ops (chain: op(param=value) | op2 | ...)", title_justify="left")
    t.add_column("op", style="bold")
    t.add_column(esc("parameters [default]"), overflow="fold")
    t.add_column("boxes", justify="center")
    t.add_column("what it does")
    for d in describe_ops():
        params = ", ".join(f"{n}={v}" if v is not None else f"{n} (required)" for n, v in d["params"])
        t.add_row(d["name"], esc(params), "moves" if d["moves_boxes"] else "", esc(d["doc"]))
    with standard_output():
        stdout_console().print(t)
    ctx.exit(0)


def _list_presets(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from rich.table import Table

    from ..engine.spec import PRESETS
    from ..report.console import esc, stdout_console

    t = Table(title="augment presets (--preset NAME)", title_justify="left")
    t.add_column("preset", style="bold")
    t.add_column("chain", overflow="fold")  # (what --ops takes: never cut short)
    t.add_column("what it is")
    for name, (chain, doc) in PRESETS.items():
        t.add_row(name, esc(chain), esc(doc))
    with standard_output():
        stdout_console().print(t)
    ctx.exit(0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src", type=str)
@click.argument("dst", type=str)
@click.option("--preset", default=None, metavar="NAME", help="A named chain (see --list-presets).")
@click.option("--ops", default=None, metavar="SPEC",
              help='Op chain, e.g. "random_resized_crop(size=224) | flip(p=0.5)" (see --list-ops).')
@click.option("--pipeline", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Op chain from a YAML or JSON file: a list of {op: NAME, param: value}.")
@click.option("--copies", type=click.IntRange(min=1), default=1, show_default=True, metavar="K",
              help="Augmented variants per image, written as <key>_aug<k>.")
@click.option("--keep-original", is_flag=True, help="Also write every image untouched under its own key.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the drawn parameters.")
@click.option("--to", "to", cls=FormatOption, default=None, help="Output format  [default: the source's]")
@click.option("--audio-format", type=click.Choice(["keep", "flac", "wav", "npy"]), default=None,
              help="Audio outputs as FLAC, WAV or float32 .npy  [default: keep; lossy codecs become FLAC]")
@click.option("--quality", type=click.IntRange(1, 100), default=None, metavar="Q",
              help="JPEG quality of written images  [default: 95]")
@click.option("--min-box-visibility", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Drop a box that keeps this fraction of its area or less after a crop or warp.")
@click.option("--limit", type=click.IntRange(min=0), default=None, metavar="N", help="Augment the first N records only.")
@click.option("--list-ops", is_flag=True, expose_value=False, is_eager=True, callback=_list_ops,
              help="List every op with its parameters and exit.")
@click.option("--list-presets", is_flag=True, expose_value=False, is_eager=True, callback=_list_presets,
              help="List the presets and exit.")
@pipeline_options
@device_options
@run_options
def augment(src: str, dst: str, as_json: bool, quiet: bool, verbose: bool, **opts) -> None:
    """Write K augmented variants of every image of SRC to DST.

    The chain comes from --preset, --ops or --pipeline and is checked before any data is read. Every
    variant draws its parameters from (--seed, its key), so a run is reproducible and each output can
    be regenerated; DST holds augment-params.jsonl with the parameters drawn per record. Boxes and
    polygons (COCO, TFRecord) move with the pixels. DST appears only when the run completes. SRC may
    be a quoted pattern of shards ('shards/train-*.tar').
    """
    from ..api import AugmentRequest
    from ..api import augment as run
    from ..report.console import console, esc
    from ..report.progress import progress_bar
    from ..report.summary import render_summary

    req = AugmentRequest(src=src, dst=dst, **opts)
    con = console()

    def said(device) -> None:
        if not quiet:
            con.print(f"[dim]device:[/] {esc(device)}  [dim]({esc(device.reason)})[/]")

    with held_back() as noise, progress_bar("augment", enabled=not quiet) as start:
        summary = run(req, progress=start, on_device=said)
    summary.library_messages = noise.total
    if noise.summary_line() and not verbose:
        summary.warnings.append(noise.summary_line())
    if not quiet:
        render_summary(summary, title="augment")
    if verbose:
        noise.render()
    if as_json:
        with standard_output(f"; {summary.dst} was written"):
            click.echo(json.dumps(summary.as_dict(), indent=2))
