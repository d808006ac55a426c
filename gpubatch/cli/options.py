"""Options shared by several commands, declared once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import click


class Choice(click.Choice):
    """click's Choice that says which choice a mistyped value was meant to be (``--to webdatset``,
    ``--to wds``)."""

    def __init__(self, choices, aliases: dict[str, str] | None = None, **kw):
        super().__init__(choices, **kw)
        self.aliases = aliases or {}

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            from ..errors import did_you_mean

            hint = did_you_mean(value, list(self.choices), self.aliases)
            self.fail(f"{value!r} is not one of {', '.join(map(repr, self.choices))}{hint}", param, ctx)


class _FormatChoice(Choice):
    """The registered formats' names (the format registry is the one list), read when first needed: the
    format modules are imported only by a command that takes a format, not by every start of the CLI."""

    def __init__(self) -> None:
        self._names: tuple[str, ...] | None = None
        super().__init__((), None)

    @property
    def choices(self):  # type: ignore[override]
        if self._names is None:
            from ..formats import format_names

            self._names = tuple(format_names())
        return self._names

    @choices.setter
    def choices(self, value) -> None:  # (click's __init__ sets it; the registry decides)
        pass

    @property
    def aliases(self) -> dict[str, str]:  # type: ignore[override]
        from ..formats import FORMAT_ALIASES

        return FORMAT_ALIASES

    @aliases.setter
    def aliases(self, value) -> None:
        pass


class FormatOption(click.Option):
    """An option that takes a format's name (``--to``, ``--from``; the names people also use for them suggested):
    ``FORMAT`` in the options' column and the names in its help, where they wrap (as click's one ``[audio|coco|...]``
    they ran past an 80-column terminal, cut inside a name)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("type", _FormatChoice())
        kw.setdefault("metavar", "FORMAT")
        super().__init__(*args, **kw)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        base = self.help or ""
        head, sep, tail = base.partition("  [")
        self.help = f"{head.rstrip('.')}: {', '.join(self.type.choices)}.{'  [' if sep else ''}{tail}"
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = base


def device_options(f):
    f = click.option("--gpus", default=None, metavar="all|0,1,..",
                     help="Spread the run over these GPUs (worker processes on each; the output is the same as on "
                          "one)  [default: the one of --gpu]")(f)
    f = click.option("--gpu", "gpu", type=int, default=0, show_default=True, help="CUDA device ordinal.")(f)
    f = click.option(
        "--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True,
        help="Where pixels are processed: auto uses the GPU when CuPy, nvImageCodec and a CUDA device are usable.",
    )(f)
    return f


def run_options(f):
    for opt in reversed([
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="CPU worker processes (each reads, decodes, encodes and writes whole shards)  [default: one a core]"),
        click.option("--on-error", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
                     help="skip: skip bad records and list them in the summary; fail: stop at the first."),
        click.option("--overwrite", is_flag=True, help="Replace DST if it exists (and start over a run interrupted "
                     "before it was written)."),
        click.option("--resume", is_flag=True, help="Finish a run of the same command that was interrupted (killed, "
                     "Ctrl-C, a lost machine): only its shards not yet committed are written."),
        click.option("--sync", type=click.Choice(["shard", "end", "off"]), default="shard", show_default=True,
                     help="When the output is made durable: shard: each shard fsynced as it is committed (a power "
                          "loss loses no committed shard); end: once, before DST appears; off: never, as cp and "
                          "tar (fastest; after a crash, check with 'gpubatch info DST --verify')."),
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="Who runs the shards: this machine's worker processes, or a Ray cluster's actors "
                          "(pip install 'gpubatch[ray]'; DST on a file system every node sees)."),
        click.option("--ray-address", default=None, metavar="ADDR",
                     help="The Ray cluster to join (ray://host:10001, host:6379 or auto)  [default: RAY_ADDRESS, "
                          "else a Ray started on this machine]"),
        click.option("--num-parts", type=click.IntRange(min=1), default=None, metavar="P",
                     help="With --part: run one part of P of the shards (Slurm arrays, Kubernetes jobs); "
                          "'gpubatch finish DST' makes the dataset once every part is committed."),
        click.option("--part", type=click.IntRange(min=0), default=None, metavar="I",
                     help="The part (0..P-1) this process runs (see --num-parts)."),
        click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar or summary table."),
        click.option("--verbose", "-v", is_flag=True,
                     help="List what the decoders printed (held back and counted in the summary)."),
    ]):
        f = opt(f)
    return f


def pipeline_options(f):
    """Options of commands that read a dataset, transform it and write another (convert, augment)."""
    for opt in reversed([
        click.option("--from", "from_format", cls=FormatOption, default=None,
                     help="Source format  [default: detected]"),
        click.option("--image-format", type=Choice(["keep", "jpeg", "png"], {"jpg": "jpeg"}), default="keep", show_default=True,
                     help="Codec of re-encoded images; keep leaves JPEG as JPEG and PNG as PNG."),
        click.option("--max-pixels", type=click.IntRange(min=0), default=None, metavar="N",
                     help="Refuse images above N pixels, before decoding  [default: 89478485, Pillow's limit; 0 = none]"),
        click.option("--verify", type=click.Choice(["headers", "full"]), default="headers", show_default=True,
                     help="Check of the files that pass through untouched: headers (PNG CRCs, a JPEG's end marker, "
                          "a WAV's length, a FLAC's last frame, a video's index and sizes), or full: decode every one."),
        click.option("--shard-size", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Records per shard (tfrecord, webdataset, recordio), also the unit of work and of "
                          "--resume  [default: auto: about 64 shards of at least 256 images, 16 recordings or 2 videos, at most 10,000 "
                          "records; a folder written on the CPU: about 256 tasks of at least 64]"),
        click.option("--name", default="data", show_default=True, help="Shard file name prefix."),
        click.option("--layout", type=click.Choice(["imagenet", "flat"]), default="imagenet", show_default=True,
                     help="folder output: class sub-folders, or one flat folder with file_list.txt."),
        click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Images per GPU batch."),
        click.option("--gpu-memory", default=None, metavar="SIZE",
                     help="Cap on the GPU memory the run takes, e.g. 2GiB or 0.5 (fraction)  [default: 1 GiB of buffers]"),
        click.option("--gpu-procs", type=click.IntRange(min=1), default=None, metavar="N",
                     help="GPU worker processes a GPU, each with its own decoders and CUDA context (2: about a "
                          "tenth faster on long image runs, at twice the GPU memory)  "
                          "[default: 1; 2 for an image run of 32,768 records or more without --gpu-memory, and "
                          "for audio on a host of 8 cores a GPU or more; audio and video take 1 under --gpu-memory]"),
    ]):
        f = opt(f)
    return f


@contextlib.contextmanager
def held_back() -> Iterator[Any]:
    """What libraries print while the command runs, held back (:class:`~gpubatch.report.noise.LibraryMessages`);
    listed where the command failed (it may say why); the command lists them after its summary with
    ``--verbose``."""
    from ..report.noise import LibraryMessages

    noise = LibraryMessages()
    try:
        with noise:
            yield noise
    except BaseException:
        if noise.messages:
            noise.render()
        raise


@contextlib.contextmanager
def standard_output(done: str = "") -> Iterator[None]:
    """The command's output to stdout (``--json``, a table), flushed at the block's end. Where it cannot be written
    (a full disk under ``> FILE``, an I/O error) the command ends with one line that says so and what it had done
    (``done``: "; DST was written"), not a traceback; what is left unwritten goes to the null device, so the
    process's end raises nothing more. A closed pipe (``| head``) stays the command's quiet exit."""
    import os
    import sys

    from ..errors import GpubatchError

    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        raise GpubatchError(f"the command's output could not be written to standard output: {e.strerror or e}"
                            f"{done}") from None
