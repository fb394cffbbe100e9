"""The ``buildctl`` console script and ``python -m buildctl``: signals are handled from the first
statement buildctl runs, so an interrupt during start-up (while the CLI's modules import) ends
the process with 130 (SIGINT) or 143 (SIGTERM) and one line, never a traceback. Nothing has
been done yet at that point, so nothing needs cleaning up; once a command runs,
:func:`buildctl.cli.main.run` turns both signals into exceptions that unwind it."""

from __future__ import annotations

import os
import signal

STARTUP_EXIT = {signal.SIGINT: (130, b"interrupted\n"), signal.SIGTERM: (143, b"terminated\n")}


def _quit_during_start_up(signum: int, _frame: object) -> None:
    code, line = STARTUP_EXIT[signal.Signals(signum)]
    os.write(2, line)
    os._exit(code)


def main() -> None:
    for sig in STARTUP_EXIT:
        signal.signal(sig, _quit_during_start_up)
    from buildctl.cli.main import main as run_cli

    run_cli()
