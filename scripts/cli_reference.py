"""Generate docs/cli.md from the typer app: every command's ``--help`` exactly as ``buildctl``
prints it (100 columns), the settings (``BUILDCTL_*``) from the ``Settings`` model, and the
exit codes from the CLI's one table.

    python scripts/cli_reference.py          # rewrite docs/cli.md
    python scripts/cli_reference.py --check  # exit 1 when docs/cli.md is stale

``make docs`` runs the check; ``tests/cli/test_reference.py`` compares the page with the help
of every command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "cli.md"
COLUMNS = 100
HELP_ENV = {"COLUMNS": str(COLUMNS), "NO_COLOR": "1", "TERM": "dumb"}


def commands() -> list[list[str]]:
    """Every command path, depth first in registration order: [], ["build"], ["key", "revoke"], ..."""
    from buildctl.cli.main import app

    out: list[list[str]] = []

    def walk(cmd, path: list[str]) -> None:  # typer's own (vendored) click command classes
        out.append(path)
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                if not sub.hidden:
                    walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def help_text(path: list[str]) -> str:
    """What ``buildctl PATH --help`` prints at 100 columns."""
    from buildctl.cli.main import app

    r = CliRunner().invoke(app, [*path, "--help"], prog_name="buildctl", env=HELP_ENV)
    if r.exit_code != 0:
        raise RuntimeError(f"buildctl {' '.join(path)} --help exited {r.exit_code}: {r.output}")
    return "\n".join(line.rstrip() for line in r.output.splitlines()).strip("\n")


def _settings_rows() -> list[str]:
    from buildctl.core.settings import Settings

    rows = ["| variable | default | what |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        env = f"BUILDCTL_{name.upper()}"
        if field.validation_alias is not None:
            env = " or ".join(getattr(field.validation_alias, "choices", [env]))
        default = "(computed)" if field.default_factory is not None else repr(field.default)
        rows.append(f"| `{env}` | `{default}` | {(field.description or '').replace('|', '/')} |")
    return rows


def _exit_rows() -> list[str]:
    from buildctl.cli.main import EXIT_CODES

    rows = ["| exit | error type | meaning |", "|---|---|---|"]
    rows += [f"| {code} | `{kind.__name__}` | {what} |" for kind, code, what in EXIT_CODES]
    return rows


def render() -> str:
    parts = ["# CLI reference", "",
             "Generated from the typer app by `python scripts/cli_reference.py`; do not edit by hand.",
             "`make docs` fails when this page is stale, and a test compares it with every command's",
             "`--help`.", "",
             "## Settings", "",
             "Global options come before the command (`buildctl --store URI --json ls`). Every other",
             "setting is an environment variable, read once into `buildctl.core.settings.Settings`:", "",
             *_settings_rows(), "",
             "## Exit codes", "",
             "One table maps error types to exit codes (`EXIT_CODES` in `buildctl/cli/main.py`); the first",
             "row that matches wins.", "",
             *_exit_rows(), ""]
    for path in commands():
        parts += [f"## `buildctl{''.join(' ' + p for p in path)}`", "", "```text", help_text(path), "```", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/cli_reference.py")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is stale; write nothing")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            sys.stderr.write(f"{PAGE.relative_to(REPO)} is stale: run `python scripts/cli_reference.py`\n")
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
