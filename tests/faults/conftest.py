"""The fault matrix: every case records what was injected, how many cases ran, and the outcome.

``FAULTS_SCALE`` multiplies the case counts (1 in CI; ``make faults`` runs more). With
``FAULTS_REPORT=FILE`` each test appends one JSON line; ``tests/faults/report.py`` turns them
into docs/reliability.md.
"""

from __future__ import annotations

import json
import os

import pytest


def scale(n: int) -> int:
    return max(1, int(n * float(os.environ.get("FAULTS_SCALE", "1"))))


@pytest.fixture
def record_fault(request):
    def record(fault: str, injection: str, cases: int, lost_artifacts: int = 0, lost_records: int = 0,
               bad_installs: int = 0, outcome: str = "ok") -> None:
        path = os.environ.get("FAULTS_REPORT")
        if not path:
            return
        with open(path, "a") as f:
            f.write(json.dumps({"test": request.node.nodeid, "fault": fault, "injection": injection, "cases": cases,
                                "lost_artifacts": lost_artifacts, "lost_records": lost_records,
                                "bad_installs": bad_installs, "outcome": outcome}) + "\n")

    return record


def time_to_done(script: str, args: list[str]) -> float:
    """Run ``script`` (as :func:`kill_at_random_point` does) to the end: the seconds from "go" to its
    "done" line, so kill times can be drawn over the work's own length on this machine."""
    import subprocess
    import sys
    import time

    from ..support.helpers import REPO

    p = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "done"
    took = time.monotonic() - t0
    p.wait()
    return took


def kill_at_random_point(script: str, args: list[str], delay_s: float) -> None:
    """Run ``script`` (which prints "ready" and waits for a line on stdin), let it go, and SIGKILL
    it ``delay_s`` later: a crash at an arbitrary point of the work it does after "ready"."""
    import signal
    import subprocess
    import sys
    import time

    from ..support.helpers import REPO

    p = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.stdin.write("go\n")
    p.stdin.flush()
    time.sleep(delay_s)
    p.send_signal(signal.SIGKILL)
    p.wait()
