"""Options shared by several commands, declared once."""

from __future__ import annotations

import click

FORMAT_NAMES = ["folder", "lmdb", "tfrecord", "recordio", "coco", "webdataset"]


def device_options(f):
    f = click.option("--gpu", "gpu", type=int, default=0, show_default=True, help="CUDA device ordinal.")(f)
    f = click.option(
        "--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True,
        help="Where pixels are processed: auto uses the GPU when CuPy, nvImageCodec and a CUDA device are usable.",
    )(f)
    return f


def run_options(f):
    for opt in reversed([
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="CPU threads for reading, decoding and encoding  [default: all cores]"),
        click.option("--on-error", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
                     help="skip: skip bad records and list them in the summary; fail: stop at the first."),
        click.option("--overwrite", is_flag=True, help="Replace DST if it exists."),
        click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary table."),
    ]):
        f = opt(f)
    return f
