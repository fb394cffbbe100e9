"""The ``buildctl`` command line: a thin typer layer over the pipeline functions.

Every command reports errors through :func:`main`, which maps error *types* to exit codes
with the one table :data:`EXIT_CODES`. Commands never pick exit codes themselves.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from buildctl.errors import (
    BadInputError,
    BuildctlError,
    BuildFailedError,
    ConflictError,
    GateRefusedError,
    IntegrityError,
    NotFoundError,
)

# The one table from error type to exit code. The first matching row wins (most specific first).
EXIT_CODES: tuple[tuple[type[BaseException], int, str], ...] = (
    (BadInputError, 2, "bad input"),
    (NotFoundError, 3, "not found"),
    (IntegrityError, 4, "integrity failure"),
    (GateRefusedError, 5, "gate refused"),
    (ConflictError, 6, "conflict"),
    (BuildFailedError, 7, "build failed"),
    (BuildctlError, 1, "error"),
)
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2


def exit_code_for(err: BaseException) -> int:
    for kind, code, _ in EXIT_CODES:
        if isinstance(err, kind):
            return code
    return EXIT_UNEXPECTED


@dataclass
class Settings:
    """Global options, shared with every command through the click context."""

    store: str | None
    json: bool
    verbose: int
    endpoint_url: str | None = None


app = typer.Typer(
    name="buildctl",
    help="Build, checksum, publish, validate, promote and pull inference engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
profile_app = typer.Typer(help="Check and show build profiles.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")

_err = Console(stderr=True, soft_wrap=True)


@app.callback()
def _global(
    ctx: typer.Context,
    store: Optional[str] = typer.Option(None, "--store", envvar="BUILDCTL_STORE", help="Artifact store URI: file:///dir or s3://bucket/prefix."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON output."),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True, help="More detail (repeatable)."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL or AWS)."),
) -> None:
    ctx.obj = Settings(store=store, json=json_out, verbose=verbose, endpoint_url=endpoint_url)


def settings(ctx: typer.Context) -> Settings:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Settings) else Settings(store=None, json=False, verbose=0)


def open_store_for(ctx: typer.Context):
    from artifact_store.store import open_store

    s = settings(ctx)
    return open_store(s.store, endpoint_url=s.endpoint_url)


def want_json(ctx: typer.Context, local: bool) -> bool:
    return local or settings(ctx).json


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def out() -> Console:
    """Plain stdout console: no markup (ids and keys contain brackets), wide when piped."""
    return Console(soft_wrap=True, markup=False, highlight=False, width=None if sys.stdout.isatty() else 200)


# --- fingerprint -----------------------------------------------------------------------------


@app.command()
def fingerprint(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the fingerprint as JSON (loadable with --fingerprint-file)."),
) -> None:
    """Print this host's fingerprint and its compat key per backend."""
    from engines.fingerprint import detect

    fp = detect()
    if want_json(ctx, json_out):
        emit_json(fp.model_dump(mode="json"))
        return
    t = Table(title="host fingerprint", show_header=False)
    t.add_column("field")
    t.add_column("value")
    gpus = ", ".join(f"{g.name} (SM {g.sm}, {g.memory_mib} MiB)" for g in fp.gpus) or "none"
    rows = [
        ("gpus", f"{fp.gpu_count}: {gpus}"),
        ("driver", fp.driver_version), ("cuda", fp.cuda_version),
        ("tensorrt", fp.tensorrt_version), ("tensorrt-llm", fp.tensorrt_llm_version),
        ("torch", fp.torch_version), ("cpu", f"{fp.cpu.machine} {fp.cpu.isa_level}"),
        ("platform", fp.platform), ("glibc", fp.glibc_version), ("compiler", fp.compiler_version),
        ("digest", fp.digest()),
        ("compat key (trtllm)", fp.compat_key("trtllm")), ("compat key (aoti)", fp.compat_key("aoti")),
    ]
    for k, v in rows:
        t.add_row(k, "-" if v is None else str(v))
    out().print(t)


# --- profile ---------------------------------------------------------------------------------


@profile_app.command("check")
def profile_check(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(..., help="Profile YAML files."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Validate profile files; every problem names the file, the field path and the rule."""
    from engines.errors import ProfileError
    from engines.profile import load_profile

    results, failures = [], []
    for f in files:
        try:
            p = load_profile(f)
            results.append({"file": str(f), "ok": True, "name": p.name, "build_hash": p.build_hash()})
        except ProfileError as err:
            failures.append(err)
            results.append({"file": str(f), "ok": False,
                            "problems": [{"path": x.path, "rule": x.rule, "message": x.message} for x in err.problems]})
    if want_json(ctx, json_out):
        emit_json(results)
    else:
        for r in results:
            if r["ok"]:
                out().print(f"ok  {r['file']}  {r['name']}  {r['build_hash']}")
    if failures:
        if len(failures) == 1:
            raise failures[0]
        raise ProfileCheckFailed(failures)


class ProfileCheckFailed(BadInputError):
    """Several profile files failed; the message holds each file's problems."""

    def __init__(self, errors: list[BuildctlError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@profile_app.command("show")
def profile_show(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="Profile YAML file."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Print the resolved profile (defaults filled in) and its build-affecting hash."""
    import yaml

    from engines.profile import HASH_EXCLUDED_FIELDS, load_profile

    p = load_profile(file)
    resolved = p.model_dump(mode="json")
    if want_json(ctx, json_out):
        emit_json({"file": str(file), "build_hash": p.build_hash(), "profile": resolved,
                   "hash_excludes": HASH_EXCLUDED_FIELDS})
        return
    console = out()
    console.print(f"# {file}", highlight=False)
    console.print(f"# build hash: {p.build_hash()}", highlight=False)
    console.print(f"# not hashed: {', '.join(HASH_EXCLUDED_FIELDS)}", highlight=False)
    console.print(yaml.safe_dump(resolved, sort_keys=False), highlight=False, markup=False)


from buildctl import cli_build, cli_node, cli_store, cli_validate  # noqa: E402,F401  (register their commands)

# --- entry point -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to the exit-code table. Returns (and exits with) the code."""
    code = run(argv)
    sys.exit(code)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI without exiting; the return value is the process exit code."""
    debug = os.environ.get("BUILDCTL_DEBUG") == "1"
    try:
        app(args=argv, prog_name="buildctl", standalone_mode=False)
        return 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        _err.print("aborted", style="red")
        return 130
    except typer.TyperException as e:  # usage errors: typer's vendored click exceptions
        show = getattr(e, "show", None)
        if callable(show):
            show()
        return EXIT_USAGE
    except BuildctlError as e:
        if debug:
            traceback.print_exc()
        code = exit_code_for(e)
        _err.print(f"error: {e}", style="red", highlight=False, markup=False)
        return code
    except KeyboardInterrupt:
        _err.print("interrupted", style="red")
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI's last resort
        if debug:
            traceback.print_exc()
        else:
            _err.print(f"unexpected error: {type(e).__name__}: {e} (set BUILDCTL_DEBUG=1 for a traceback)",
                       style="red", highlight=False, markup=False)
        return EXIT_UNEXPECTED
