"""The lock (``requirements.lock``) agrees with ``pyproject.toml``, the install used it, and the
check fails when the two disagree."""

from __future__ import annotations

import subprocess
import sys

from .support.helpers import REPO

CHECK = [sys.executable, str(REPO / "scripts" / "lock.py"), "check"]


def test_the_lock_agrees_with_pyproject_and_the_install_used_it():
    r = subprocess.run([*CHECK, "--installed"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "pins agree" in r.stdout
    assert "sqlalchemy==2.0." in (REPO / "requirements.lock").read_text()  # below 2.1: the scheduler works


def test_the_check_fails_when_pyproject_and_the_lock_disagree(tmp_path):
    pyproject = (REPO / "pyproject.toml").read_text()
    cases = {
        "out of range": (pyproject.replace('"pydantic>=2.7,<3"', '"pydantic>=3"'), "pydantic>=3: requirements.lock pins 2."),
        "not locked": (pyproject.replace('"xxhash>=3.4",', '"xxhash>=3.4", "left-pad>=1",'), "left-pad>=1: not in"),
        "extra not locked": (pyproject.replace('bench = ["matplotlib>=3.8"]', 'bench = ["matplotlib>=3.8", "seaborn"]'),
                             "seaborn: not in"),
    }
    for name, (text, expected) in cases.items():
        assert text != pyproject, name
        p = tmp_path / f"{name.replace(' ', '-')}.toml"
        p.write_text(text)
        r = subprocess.run([*CHECK, "--pyproject", str(p)], capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 1 and expected in r.stderr, (name, r.stderr)
    # an installed version that differs from its pin
    lock = tmp_path / "requirements.lock"
    lock.write_text((REPO / "requirements.lock").read_text().replace("\ntyper==", "\ntyper==0.0.1\n# was typer=="))
    r = subprocess.run([*CHECK, "--installed", "--lock", str(lock)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "typer: pinned 0.0.1, installed" in r.stderr, r.stderr
