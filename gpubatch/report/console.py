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
