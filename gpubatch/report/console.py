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
