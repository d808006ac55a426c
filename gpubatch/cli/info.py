"""``gpubatch info PATH`` and ``gpubatch formats``."""

from __future__ import annotations

import json

import click

from .options import FormatOption, held_back, standard_output


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=str)
@click.option("--from", "from_format", cls=FormatOption, default=None,
              help="Dataset format  [default: detected]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Reader threads.")
@click.option("--verbose", "-v", is_flag=True,
              help="List what the decoders printed (held back and counted in the warnings).")
@click.option("--verify", "verify_files", is_flag=True,
              help="Also check a dataset gpubatch wrote against its gpubatch.json: every shard's size and "
                   "CRC-32C as written, and its record count; exit 1 naming what differs.")
def info(path: str, from_format: str | None, as_json: bool, workers: int | None, verbose: bool,
         verify_files: bool) -> None:
    """Show what the dataset at PATH holds: format, records, classes, image sizes (from headers), bytes.

    PATH may be a quoted pattern of shards ('shards/train-*.tar'). With --verify, PATH is the folder (or
    store URL) of a dataset gpubatch wrote, checked against what its run recorded (after a copy, a sync to a
    bucket, a disk's trouble).
    """
    from ..api import info as describe
    from ..errors import GpubatchError
    from ..report.info import render
    from ..report.progress import progress_bar

    with held_back() as noise, progress_bar("reading headers", enabled=not as_json) as start:
        report = describe(path, from_format, workers, start)
    if noise.summary_line() and not verbose:
        report.warnings.append(noise.summary_line())
    checked = None
    if verify_files:
        from ..report.verify import verify

        with progress_bar("verifying files", enabled=not as_json, unit="bytes") as start:
            checked = verify(path, records_found=report.records, workers=workers, progress=start)
    if as_json:
        with standard_output():
            click.echo(json.dumps({**report.as_dict(), **({"verify": checked.as_dict()} if checked else {})}, indent=2))
    else:
        render(report)
        if checked is not None:
            from ..report.verify import render as render_verify

            render_verify(checked)
    if verbose:
        noise.render()
    if checked is not None and not checked.ok:
        raise GpubatchError(checked.problem())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def formats() -> None:
    """List the dataset formats, what each holds, and whether it carries boxes."""
    from rich.table import Table

    from ..formats import FORMATS, format_names
    from ..report.console import stdout_console

    t = Table("format", "boxes", "description")
    for name in format_names():
        f = FORMATS[name]
        t.add_row(name, "yes" if f.carries_boxes else "no", f.description)
    with standard_output():
        stdout_console().print(t)
