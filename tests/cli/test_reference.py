"""docs/cli.md is generated from the typer app: it holds every command's ``--help`` as
``buildctl`` prints it, and the check fails when the page is stale."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys

import pytest

from ..support.helpers import REPO

ref = runpy.run_path(str(REPO / "scripts" / "cli_reference.py"))
PAGE = REPO / "docs" / "cli.md"


def page_sections() -> dict[str, str]:
    text = PAGE.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^## `(buildctl[^`]*)`\n\n```text\n(.*?)\n```$", text,
                                                         re.S | re.M)}


def test_the_page_has_every_command_and_is_current():
    sections = page_sections()
    paths = ref["commands"]()
    assert len(paths) >= 30 and sorted(sections) == sorted("buildctl" + "".join(" " + p for p in path) for path in paths)
    for path in paths:
        assert sections["buildctl" + "".join(" " + p for p in path)] == ref["help_text"](path)
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "cli_reference.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", [[], ["pull"], ["rollout", "status"], ["key", "revoke"]])
def test_the_page_matches_what_buildctl_prints(path):
    """The page's text is what the installed command prints at 100 columns, not only what the
    generator renders in-process."""
    r = subprocess.run([sys.executable, "-m", "buildctl", *path, "--help"], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, **ref["HELP_ENV"]})
    assert r.returncode == 0, r.stderr
    printed = "\n".join(line.rstrip() for line in r.stdout.splitlines()).strip("\n")
    assert page_sections()["buildctl" + "".join(" " + p for p in path)] == printed


def test_a_stale_page_fails_the_check(tmp_path, monkeypatch):
    """Changing one command's help (here: the page losing a line) makes --check fail."""
    stale = PAGE.read_text().replace("Install the channel's engine for this node", "Install an engine", 1)
    assert stale != PAGE.read_text()
    page = tmp_path / "cli.md"
    page.write_text(stale)
    monkeypatch.setitem(ref["main"].__globals__, "PAGE", page)
    monkeypatch.setitem(ref["main"].__globals__, "REPO", tmp_path)
    assert ref["main"](["--check"]) == 1
    assert ref["main"]([]) == 0 and page.read_text() == PAGE.read_text()  # regenerated: current again
