"""The one stderr Console every report and progress bar writes to (stdout is for data and --json)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


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
