"""The manifest fuzz target, for a bounded time (``make faults`` runs it longer)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from ..support.helpers import REPO
from .conftest import scale


def test_manifest_fuzzing(tmp_path, record_fault):
    seconds = scale(20)
    r = subprocess.run([sys.executable, str(REPO / "fuzz" / "manifest_fuzz.py"), f"-max_total_time={seconds}",
                        "-rss_limit_mb=2048", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                       timeout=seconds + 120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    runs = re.findall(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)", r.stderr)
    executions = int(runs[-1]) if runs else 0
    assert executions > 100, r.stderr[-1000:]
    record_fault("manifest JSON (fuzzed)", f"atheris, {seconds} s, coverage-guided from a valid seed", executions)
