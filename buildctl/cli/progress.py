"""Progress bars for long transfers: rich on a TTY, silent in --json mode and when stdout or
stderr is not a terminal (piped output, logs, CI)."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def byte_progress(description: str, total: int | None, *, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """Yield an ``on_bytes(n)`` callback that advances a bar, or ``None`` when disabled."""
    if not enabled or not (sys.stdout.isatty() and sys.stderr.isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    lock = threading.Lock()
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int) -> None:
            with lock:
                bar.advance(task, n)

        yield advance
