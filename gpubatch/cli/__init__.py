"""The ``gpubatch`` command: a root group with lazily imported subcommands.

Commands are thin: parse flags -> build a request -> call the public API -> report. Errors a user can
act on print as one line on stderr with a fixed exit code (see :class:`gpubatch.errors.ExitCode`);
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from .. import __version__

_COMMANDS = {
    "bench": ("gpubatch.cli.bench", "bench", "Measure a model's preprocessing: GPU vs CPU vs peers, with reports."),
    "convert": ("gpubatch.cli.convert", "convert", "Convert a dataset to another format (optionally resizing / re-encoding)."),
    "augment": ("gpubatch.cli.augment", "augment", "Write K augmented copies of every image (GPU, box-aware, seeded)."),
    "info": ("gpubatch.cli.info", "info", "Show what a dataset holds."),
    "formats": ("gpubatch.cli.info", "formats", "List the dataset formats gpubatch reads and writes."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help lists the commands without importing them.
        with formatter.section("Commands"):
            formatter.write_dl([(n, _COMMANDS[n][2]) for n in sorted(_COMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpubatch")
@click.option("--debug", is_flag=True, envvar="GPUBATCH_DEBUG", help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """gpubatch: convert, decode, resize and augment whole datasets on the GPU (or the CPU).

    \b
    Quick start:
      gpubatch info sample_data/imagenet
      gpubatch convert sample_data/imagenet out/wds --to webdataset
      gpubatch convert sample_data/imagenet out/tfr --to tfrecord --resize-shorter 256 --quality 90
      gpubatch augment sample_data/coco out/coco-aug --preset ssd --copies 2
    """
    ctx.obj = {"debug": debug}


def _terminate_as_interrupt() -> None:
    """SIGTERM winds a run down as Ctrl-C does (staging removed, exit 143) instead of killing it where
    it stands; only the command installs this, never the library."""
    import signal

    from ..errors import Terminated

    def raise_terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        raise Terminated

    try:
        signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # pragma: no cover - not the main thread (an embedding program's)
        pass


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and map errors to exit codes."""
    from ..errors import FROM_CLI, ExitCode, GpubatchError, Terminated

    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(os.environ.get("GPUBATCH_DEBUG"))
    _terminate_as_interrupt()
    from ..engine.processes import keep_freed_memory

    keep_freed_memory()  # this process's per-record arrays reuse freed memory (docs/engine.md)
    FROM_CLI.set(True)  # messages name the command's flags
    try:
        cli.main(args=argv, prog_name="gpubatch", standalone_mode=False)
    except (Terminated, click.exceptions.Abort) as e:  # click turns an interrupt into Abort
        if isinstance(e, Terminated) or isinstance(e.__cause__, Terminated):
            click.echo("terminated: nothing was written to the destination", err=True)
            sys.exit(ExitCode.TERMINATED)
        click.echo("interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.ClickException as e:
        e.show()
        sys.exit(ExitCode.USAGE if isinstance(e, click.UsageError) else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted: nothing was written to the destination", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except GpubatchError as e:
        if debug:
            raise
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(ExitCode.OK)
    sys.exit(ExitCode.OK)
