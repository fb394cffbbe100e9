"""The README is a front page that works as written: short, every ``buildctl`` command it shows
exists with the options it uses, and the Prefect quick start completes on one host."""

from __future__ import annotations

import re
import shlex
import shutil
import time

import pytest
import typer

from buildctl.artifact_store.backends.store import open_store
from buildctl.engines.fingerprint import detect

from .support.helpers import REPO, checkout_like, run_docs_block, write_attestation

README = (REPO / "README.md").read_text()


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", text, re.S | re.M)


def block_after(heading: str) -> str:
    section = README.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = bash_blocks(section)
    return block


def buildctl_invocations(block: str) -> list[list[str]]:
    """The argument lists of every ``buildctl`` command in a shell block (comments dropped)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split("  #", 1)[0]
        for m in re.finditer(r"(?:^|\$\(|;|&&)\s*buildctl\s+([^)#;&]*)", line):
            out.append(shlex.split(m.group(1)))
    return out


def test_the_readme_is_a_front_page():
    assert len(README) <= 12_000
    for heading in ("The two commands", "A tour in five commands", "Quick start with Prefect", "Where the code is",
                    "Documentation"):
        assert f"\n## {heading}\n" in README
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", README):
        assert (REPO / link).is_file(), link


def test_every_buildctl_command_in_the_readme_exists_with_its_options():
    from buildctl.cli.main import app

    root = typer.main.get_command(app)
    calls = [c for b in bash_blocks(README) for c in buildctl_invocations(b)]
    assert len(calls) >= 5
    for args in calls:
        cmd, rest, name = root, list(args), "buildctl"
        while hasattr(cmd, "commands") and rest and rest[0] in cmd.commands:
            name += " " + rest[0]
            cmd = cmd.commands[rest.pop(0)]
        assert not hasattr(cmd, "commands"), f"{args}: no such command"
        cmd.make_context(name, rest)  # raises on an unknown option, a missing argument or a bad value
    # the check bites: an option the command does not have is refused
    with pytest.raises(Exception, match="no-such-flag"):
        root.commands["pull"].make_context("buildctl pull", ["--no-such-flag"])


@pytest.mark.slow
def test_the_prefect_quick_start_completes_as_written(tmp_path, tiny_build):
    """The README's quick start, run by bash as written, in a directory that looks like a
    checkout after ``make demo`` (the demo store holds the tiny build and a passing attestation,
    so the run is a cache hit). Only the port differs: 4200 may be taken here."""
    block = block_after("Quick start with Prefect")
    work = checkout_like(tmp_path / "checkout")
    shutil.copytree(tiny_build["root"] / "store", work / ".demo" / "store")
    demo = open_store(str(work / ".demo" / "store"))
    write_attestation(demo, tiny_build["outcome"].artifact_id, tiny_build["outcome"].compat_key,
                      validator=detect())  # judged on this host: its soft values are covered
    t0 = time.monotonic()
    out = run_docs_block(block, work, 420, ".prefect-serve.log")
    serve_log = (work / ".prefect-serve.log").read_text(errors="replace")
    assert "Completed" in out and "already validated" in serve_log, out[-2000:] + serve_log[-3000:]
    assert time.monotonic() - t0 < 420
