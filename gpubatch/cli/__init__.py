"""The ``gpubatch`` command: a root group with lazily imported subcommands.

Commands are thin: parse flags -> build a request -> call the public API -> report. Errors a user can
act on print as one line on stderr with a fixed exit code (see :class:`gpubatch.errors.ExitCode`);
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C before the command runs (while its imports load): one line and exit 130, no traceback."""
    os.write(2, b"interrupted\n")
    os._exit(130)


_SIGNALLED: list[bool] = []  # set once the command's own Ctrl-C or SIGTERM handler raised (main)


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C once the command runs: KeyboardInterrupt, as Python's own handler raises it, except where Python would
    swallow it. Raised inside a weakref's callback (importlib's module locks have one, and the command imports
    lazily) or a ``__del__``, the interrupt would be printed as "Exception ignored" and lost, the command running
    on; there it is sent again a moment later, to be raised in the command's own code. Raised under an extension
    module's start (NumPy's ``import_array``), it is printed there through ``sys.excepthook`` and replaced by an
    ImportError: :func:`_quiet_interrupts` keeps that print off, and :func:`_main` says "interrupted" for what
    replaced it."""
    code = getattr(frame, "f_code", None)
    name, where = (code.co_name, code.co_filename) if code is not None else ("", "")
    if name == "__del__" or (name == "cb" and where.startswith("<frozen importlib")):
        import threading

        again = threading.Timer(0.005, os.kill, (os.getpid(), signal.SIGINT))
        again.daemon = True
        again.start()
        return
    _SIGNALLED.append(True)
    raise KeyboardInterrupt


def _quiet_interrupts(kind: type, value: BaseException, tb: object) -> None:
    """``sys.excepthook`` while the command runs: an interrupt an extension module's start printed with
    ``PyErr_Print`` (and then replaced by its own ImportError) is not printed as a traceback; anything else is
    printed as before."""
    if issubclass(kind, KeyboardInterrupt) and _SIGNALLED:
        return
    sys.__excepthook__(kind, value, tb)  # type: ignore[arg-type]


def _starting() -> None:
    """Install :func:`_interrupted_while_starting` for the command's start (never in a library's import:
    only where the process is the ``gpubatch`` command)."""
    try:
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    except ValueError:  # pragma: no cover - imported off the main thread (an embedding program's)
        pass


_EXIT: list[int] = []  # the command's exit status, once it has one (main)


def _ending() -> None:
    """Once every other exit handler ran, the command's process ends at once with its status (``os._exit``,
    its output flushed) instead of tearing its interpreter down, module by module. Only where the command set
    its status (:func:`main`; an exception that escaped it, under ``--debug``, ends as Python ends), where its
    output flushes (what :func:`~.options.standard_output` did not write: Python's own end says so, with its
    status), and where no exit handler was there before this one (it would not run: a coverage tool's, an
    embedding script's)."""
    import atexit

    if getattr(atexit, "_ncallbacks", lambda: 1)():
        return

    def end() -> None:
        if not _EXIT:
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - (Python's own end reports it)
            return
        os._exit(_EXIT[0])

    atexit.register(end)


if os.path.basename(sys.argv[0] if sys.argv else "") in ("gpubatch", "-m", "__main__.py"):
    _starting()  # first, before the imports below (click, rich...) take their tens of milliseconds
    _ending()  # (the first exit handler: the last to run)
    from .. import _prescan
    from ..engine.execute.early import sniff

    _prescan.begin(sys.argv[1:])  # a folder source listed beside the imports (forked while this has one thread)
    sniff(sys.argv[1:])  # a GPU image run's workers, their GPU's start begun before the imports (execute/early.py)

import importlib  # noqa: E402

import click  # noqa: E402

from .. import __version__  # noqa: E402

_COMMANDS = {
    "bench": ("gpubatch.cli.bench", "bench", "Measure a model's preprocessing: GPU vs CPU vs peers, with reports."),
    "convert": ("gpubatch.cli.convert", "convert", "Convert a dataset to another format (optionally resizing / re-encoding)."),
    "augment": ("gpubatch.cli.augment", "augment", "Write K augmented copies of every image (GPU, box-aware, seeded)."),
    "finish": ("gpubatch.cli.finish", "finish", "Make the dataset from the shards its parts committed (--num-parts)."),
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
        _SIGNALLED.append(True)
        raise Terminated

    try:
        signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # pragma: no cover - not the main thread (an embedding program's)
        pass


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and map errors to exit codes. Run as the process's command (``argv`` None),
    it leaves every object it made to the interpreter's end uncollected (``gc.freeze``): the collection
    Python runs at its exit over them took 153-226 ms of a 2.2-s pass-through on the 2-core CI machine, 80-100
    ms frozen (2026-12-02, benchmarks/RESULTS.md). Called with arguments, it gives back what it set for the
    command: the SIGTERM handler it found (a process the caller forks later must not raise ``Terminated`` on
    SIGTERM) and the library's own wording of messages (keywords, not flags: ``FROM_CLI``)."""
    from ..errors import FROM_CLI

    previous, worded = signal.getsignal(signal.SIGTERM) if argv is not None else None, FROM_CLI.get()
    hook = sys.excepthook
    _SIGNALLED.clear()
    try:
        _main(argv)
    except SystemExit as e:
        if argv is None and (e.code is None or isinstance(e.code, int)):
            _EXIT[:] = [e.code or 0]  # (the status :func:`_ending` ends the process with)
        raise
    finally:
        if argv is None:  # (a caller's process, as a test's, goes on: its objects stay collectable)
            gc.freeze()
        else:
            FROM_CLI.set(worded)
            sys.excepthook = hook
            _SIGNALLED.clear()
            if previous is not None:
                with contextlib.suppress(ValueError):  # (not the main thread: nothing was installed)
                    signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> None:
    from ..errors import FROM_CLI, LIMITS, ExitCode, GpubatchError, Terminated

    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(os.environ.get("GPUBATCH_DEBUG"))
    _terminate_as_interrupt()
    from ..engine.processes import keep_freed_memory

    keep_freed_memory()  # this process's per-record arrays reuse freed memory (docs/engine.md)
    FROM_CLI.set(True)  # messages name the command's flags
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:  # from here Ctrl-C is KeyboardInterrupt
            sys.excepthook = _quiet_interrupts
            signal.signal(signal.SIGINT, _interrupt)
        cli.main(args=argv, prog_name="gpubatch", standalone_mode=False)
    except (Terminated, click.exceptions.Abort) as e:  # click turns an interrupt into Abort
        cause = e.__cause__ or e.__context__
        kept = getattr(e, "gpubatch_kept", None) or getattr(cause, "gpubatch_kept", None)
        if isinstance(e, Terminated) or isinstance(cause, Terminated):
            click.echo(f"terminated: {kept or 'nothing was written to the destination'}", err=True)
            sys.exit(ExitCode.TERMINATED)
        click.echo(f"interrupted{': ' + kept if kept else ''}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.UsageError as e:  # one line, as every other usage error (click's own is a block)
        message = " ".join(e.format_message().split()).replace(". Choose from: ", " (one of: ").replace(",", ", ")
        message = message.replace(",  ", ", ") + (")" if "(one of: " in message else "")
        message = message.rstrip(".")
        given = argv if argv is not None else sys.argv[1:]
        path = e.ctx.command_path if e.ctx is not None else " ".join(
            ["gpubatch", *[a for a in given if a in _COMMANDS][:1]])
        where = f"; see '{path} --help'"
        click.echo(f"error: {message[:1].lower()}{message[1:]}{where}", err=True)
        sys.exit(ExitCode.USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:
        kept = getattr(e, "gpubatch_kept", None)
        click.echo(f"interrupted: {kept or 'nothing was written to the destination'}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except GpubatchError as e:
        if debug:
            raise
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(ExitCode.OK)
    except MemoryError:
        if debug:
            raise
        click.echo(f"error: out of memory: {LIMITS}", err=True)
        sys.exit(ExitCode.ERROR)
    except Exception as e:
        # Python wraps what a class's creation raised in a RuntimeError (a Ctrl-C while a module loads), and an
        # extension module's start replaces it by an ImportError (NumPy's, after printing it: _quiet_interrupts)
        cause = e.__cause__
        if isinstance(e, RuntimeError) and "can't start new thread" in str(e) and not debug:  # (memory or threads)
            click.echo(f"error: the system refused this process a new thread: {LIMITS}", err=True)
            sys.exit(ExitCode.ERROR)
        if isinstance(e, RuntimeError) and isinstance(cause, KeyboardInterrupt):  # (Terminated is one)
            terminated = isinstance(cause, Terminated)
        elif _SIGNALLED and not debug:
            terminated = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # (its handler, once raised, is reset)
        else:
            raise
        kept = getattr(e, "gpubatch_kept", None) or "nothing was written to the destination"
        click.echo(f"{'terminated' if terminated else 'interrupted'}: {kept}", err=True)
        sys.exit(ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED)
    sys.exit(ExitCode.OK)
