"""Following a log while a child process writes it: a long build or validation is never silent.

:func:`tailing` passes a log's new lines to a callback every few seconds while a block runs;
:func:`log_tail` reads its last lines. Plain threads and files: no layer below it."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

#: How often new log lines are passed on, and at most how many each time.
LOG_TAIL_EVERY_S = 5.0
LOG_TAIL_LINES = 20


@contextmanager
def tailing(log_path: Path, say: Callable[[str], None], every_s: float = LOG_TAIL_EVERY_S, *,
            prefix: str = "build log: ", keep: Callable[[str], bool] = lambda line: True) -> Iterator[None]:
    """While the block runs, pass the log's new lines (those ``keep`` accepts) to ``say`` every
    ``every_s`` seconds, at most :data:`LOG_TAIL_LINES` each time (the rest counted); whole lines,
    and the last partial one when the block ends."""
    stop = threading.Event()

    def follow() -> None:
        offset = 0
        while True:
            ended = stop.wait(every_s)
            try:
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                chunk = b""
            cut = chunk.rfind(b"\n") + 1 if not ended else len(chunk)  # whole lines, until the end
            offset += cut
            lines = [ln for ln in chunk[:cut].decode("utf-8", "replace").splitlines() if ln.strip() and keep(ln)]
            if len(lines) > LOG_TAIL_LINES:
                say(f"{prefix}({len(lines) - LOG_TAIL_LINES} lines more in {log_path})")
            for line in lines[-LOG_TAIL_LINES:]:
                say(f"{prefix}{line[:500]}")
            if ended:
                return

    t = threading.Thread(target=follow, name="log-tail", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=10)


def log_tail(log_path: Path, lines: int = 60, *, window: int = 256 * 1024) -> str:
    """The last ``lines`` lines of a log, read from its last ``window`` bytes ("" when it cannot
    be read)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - window))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""
