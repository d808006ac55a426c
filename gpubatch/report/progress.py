"""A rich progress bar (records/s, ETA) on a terminal; silent when stderr is not one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .console import console


@contextmanager
def progress_bar(description: str, enabled: bool = True,
                 unit: str = "records") -> Iterator[Callable[[int], Callable[[int], None]]]:
    """Yield ``start(total) -> advance(n)``; the bar is shown only on an interactive terminal. ``unit``:
    "records" (n of N, records/s) or "bytes" (MiB of MiB, MiB/s)."""
    con = console()
    if not enabled or not con.is_terminal:
        yield lambda total: (lambda n: None)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    class Rate(TextColumn):
        def render(self, task):  # records/s from rich's own speed estimate
            from rich.text import Text

            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} rec/s" if speed else "", style="progress.data.speed")

    if unit == "bytes":
        from rich.progress import DownloadColumn, TransferSpeedColumn

        counted: tuple[Any, ...] = (DownloadColumn(binary_units=True), TransferSpeedColumn())
    else:
        counted = (MofNCompleteColumn(), Rate(""))
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), *counted,
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=con, transient=False,
    ) as prog:

        def start(total: int) -> Callable[..., None]:
            task = prog.add_task(description, total=total)
            rows: dict[str, Any] = {}

            def advance(n: int, where: str | None = None) -> None:
                """``n`` more records; ``where``: the GPU of a several-GPU run that wrote them (a row each,
                its records and rate under the bar)."""
                prog.advance(task, n)
                if where is not None:
                    if where not in rows:
                        rows[where] = prog.add_task(f"  gpu {where}", total=None)
                    prog.advance(rows[where], n)

            advance.takes_where = True  # type: ignore[attr-defined]
            return advance

        yield start
