"""benchmarks.report dates each section by its own result, not by when the report ran."""

from __future__ import annotations

import re

from benchmarks.common import RESULTS
from benchmarks.report import measured_on


def test_a_committed_result_is_dated_by_its_commit_and_a_new_one_says_so(tmp_path):
    import subprocess

    import pytest

    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=RESULTS, capture_output=True, text=True)
    if inside.stdout.strip() != "true":
        pytest.skip("not a git checkout: results carry no commit date")
    committed = measured_on(RESULTS / "rollout.json")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", committed), committed
    fresh = RESULTS / "zz-not-committed.json"
    fresh.write_text("{}")
    try:
        assert measured_on(fresh).endswith("(not committed yet)")
    finally:
        fresh.unlink()
