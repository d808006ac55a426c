"""The one stderr Console every report and progress bar writes to (stdout is for data and --json)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

_said: list[Callable[[], str]] = []  # what :func:`say` holds until the console is made (printed first then)


@functools.lru_cache(maxsize=1)
def console():
    from rich.console import Console

    con = Console(stderr=True, highlight=False)
    for markup in _said:
        con.print(markup())
    _said.clear()
    return con


def no_terminal() -> bool:
    """Whether the stderr console will be no terminal, told without importing rich (its imports take 25-40 ms
    of a command's start): rich's own ``Console.is_terminal`` checks, in its order (``TTY_COMPATIBLE``,
    ``FORCE_COLOR``, then the stream's ``isatty``). False where unsure: rich is then asked."""
    env = os.environ
    compatible = env.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "0"
    if "FORCE_COLOR" in env:
        return env["FORCE_COLOR"] == ""
    try:
        return not sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def say(markup: Callable[[], str]) -> None:
    """Print the markup ``markup()`` makes (:func:`esc` imports rich) on the stderr console. Where that is no
    terminal and the console is not made yet, it is printed when the console is made: by the run's first progress,
    while the command waits on its workers (:func:`~.progress.progress_bar`), by the summary, or by :func:`said_out`
    (an error's way out). A pass-through's command then imports rich beside its workers' work, not before its run."""
    if console.cache_info().currsize or not no_terminal():
        console().print(markup())
    else:
        _said.append(markup)


def said_out() -> None:
    """What :func:`say` holds, printed now."""
    if _said:
        console()


def warm() -> None:
    """The console made and the modules the summary draws with imported (a no-op once done)."""
    console()
    import rich.markup  # noqa: F401
    import rich.table  # noqa: F401
    import rich.text  # noqa: F401


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def esc(value: object) -> str:
    """``value`` as text that rich prints as it is: brackets in file names, reasons and install hints
    (``pip install 'gpubatch[cu13]'``) are not taken for markup."""
    from rich.markup import escape

    return escape(str(value))


def titled(title: str, **options: object):
    """A rich Table under ``title`` (markup), left-justified and at least as wide as the title where the
    console is: a title wider than the table's cells wraps to the cells' width otherwise (a short summary
    of a long path printed its title over two lines on a 100-column terminal)."""
    from rich.table import Table
    from rich.text import Text

    width = Text.from_markup(title).cell_len + 4  # (the table's borders and padding)
    return Table(title=title, title_justify="left", min_width=min(width, console().width), **options)
