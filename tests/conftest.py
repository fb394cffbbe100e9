"""Shared fixtures. Heavy fixtures (S3 server, Prefect harness, tiny model) live in their own modules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "build_profiles"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep tests away from the user's store and fingerprint overrides."""
    for var in ("BUILDCTL_STORE", "BUILDCTL_FINGERPRINT_FILE", "BUILDCTL_DEBUG"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    from buildctl.cli import run

    def _run(*args: str) -> tuple[int, str, str]:
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run
