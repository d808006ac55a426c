"""``gpubatch finish DST``: the dataset from the shards a run's parts committed (a thin adapter over
:func:`gpubatch.api.finish`)."""

from __future__ import annotations

import json

import click

from .options import held_back, standard_output


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dst", type=str)
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No summary table.")
def finish(dst: str, overwrite: bool, as_json: bool, quiet: bool) -> None:
    """Make the dataset DST from the shards that the parts of a run committed.

    A run split with --num-parts P --part I (a Slurm array, Kubernetes jobs, several machines that see
    the same file system) writes its shards into DST's staging folder; once every part is done, this
    checks that every shard is committed (refused otherwise, naming the parts missing), writes the
    dataset-wide files (indexes, file lists, the COCO JSON, the LMDB, the manifest) and renames the
    whole into place. It reads the source's entry list again; it decodes nothing.
    """
    from ..api import finish as run
    from ..report.summary import render_summary

    with held_back():
        summary = run(dst, overwrite=overwrite)
    if not quiet:
        render_summary(summary, title="finish")
    if as_json:
        with standard_output(f"; {summary.dst} was written"):
            click.echo(json.dumps(summary.as_dict(), indent=2))
