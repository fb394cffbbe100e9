"""The ``buildctl`` entry point: builds the typer app and registers every command module.

Like huggingface_hub's ``cli/hf.py``: the command modules (``build``, ``artifacts``, ``promote``,
``pull``, ``keys``, ``index``, ``validate``, ``node``, ``profile``, ``fingerprint``, ...) define their commands and import only
:mod:`buildctl.cli._common`; this module imports them and registers them, so there is no import
loop. Errors are reported by :func:`run`, which maps error *types* to exit codes with the one
table :data:`EXIT_CODES`. Commands never pick exit codes themselves.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Optional

import typer
from rich.console import Console
from typer.core import TyperOption

from buildctl.cli import (alerts, artifacts, build, fingerprint, heal, index, keys, node, profile, promote, pull,
                          rollout, upgrade, validate, worker, worth)
from buildctl.cli._common import CliState
from buildctl.core.errors import (
    BadInputError,
    BuildctlError,
    BuildFailedError,
    ConflictError,
    DestinationError,
    EventNotDeliveredError,
    GateRefusedError,
    IntegrityError,
    NoRuntimeFitsError,
    NotFoundError,
    PreflightRefusedError,
    UnavailableError,
    as_disk_error,
    as_path_error,
)
from buildctl.artifact_store.errors import SkippedRecordsError
from buildctl.core.settings import load_settings

EXIT_OK = 0


class Terminated(BaseException):
    """SIGTERM while a command runs: raised in the main thread so that the command unwinds (its
    staging removed, its transfers cancelled) and exits 143."""


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise Terminated()

# The one table from error type to exit code, rendered into docs/cli.md. The first matching row
# wins (most specific first); no other module holds an exit-code literal.
EXIT_CODES: tuple[tuple[type[BaseException], int, str], ...] = (
    (NoRuntimeFitsError, 13, "no runtime of the served model fits this node (each one's reason is named); what was installed stays"),
    (BadInputError, 2, "bad input"),
    (NotFoundError, 3, "not found"),
    (IntegrityError, 4, "integrity failure"),
    (GateRefusedError, 5, "gate refused"),
    (ConflictError, 6, "conflict"),
    (BuildFailedError, 7, "build failed"),
    (PreflightRefusedError, 8, "engine refused on this host: its preflight load failed (not installed), or its smoke check failed (switched back)"),
    (UnavailableError, 9, "store or Prefect API unreachable, or credentials refused"),
    (SkippedRecordsError, 10, "completed, but malformed records were skipped (each listed with its key)"),
    (DestinationError, 12, "this host's destination cannot be written (full disk, read-only, permissions, not a directory); what was installed stays"),
    (EventNotDeliveredError, 11, "recorded, but its Prefect event could not be delivered: it stays pending and the next report re-sends it"),
    (BuildctlError, 1, "error"),
    (typer.TyperException, 2, "usage error"),
    (KeyboardInterrupt, 130, "interrupted (SIGINT); re-running finishes the job"),
    (Terminated, 143, "terminated (SIGTERM); re-running finishes the job"),
    (typer.Abort, 130, "aborted"),
    (BaseException, 1, "unexpected error"),
)


def exit_code_for(err: BaseException) -> int:
    return next(code for kind, code, _ in EXIT_CODES if isinstance(err, kind))


def _flag_shows_no_type(original):
    """typer (0.2x) prints a ``<bool>`` type beside every on/off flag in ``--help``, its own
    ``--help`` included; a flag takes no value, so show none (other options keep theirs)."""

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_bool_flag", False) else original(self, ctx)

    return display_type_rich


if hasattr(TyperOption, "display_type_rich"):
    TyperOption.display_type_rich = _flag_shows_no_type(TyperOption.display_type_rich)

app = typer.Typer(
    name="buildctl",
    help="Build, checksum, publish, validate, promote and pull inference engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _global(
    ctx: typer.Context,
    store_uri: Optional[str] = typer.Option(None, "--store", help="Artifact store URI: file:///dir or s3://bucket/prefix "
                                            "(env BUILDCTL_STORE; default ~/.local/share/buildctl/store)."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable JSON output."),
    verbose: int = typer.Option(0, "-v", "--verbose", count=True, help="More detail (repeatable)."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", help="S3 endpoint (env BUILDCTL_ENDPOINT_URL; default: boto3's, e.g. AWS_ENDPOINT_URL)."),
) -> None:
    ctx.obj = CliState(load_settings(store=store_uri, endpoint_url=endpoint_url), json=json_out, verbose=verbose)


# --- registration: one line per command ------------------------------------------------------

app.command("fingerprint")(fingerprint.fingerprint_cmd)
app.add_typer(profile.profile_app, name="profile")
app.command("build")(build.build_cmd)
app.command("generate")(build.generate_cmd)
app.add_typer(build.model_app, name="model")
app.command("import")(artifacts.import_cmd)
app.command("ls")(artifacts.ls_cmd)
app.command("show")(artifacts.show_cmd)
app.command("verify")(artifacts.verify_cmd)
app.command("rehash")(artifacts.rehash_cmd)
app.command("export-signature")(artifacts.export_signature_cmd)
app.command("promote")(promote.promote_cmd)
app.command("history")(promote.history_cmd)
app.command("rollback")(promote.rollback_cmd)
app.command("pull")(pull.pull_cmd)
app.add_typer(rollout.rollout_app, name="rollout")
app.command("gc")(artifacts.gc_cmd)
app.add_typer(keys.key_app, name="key")
app.add_typer(index.index_app, name="index")
app.command("quarantine")(heal.quarantine_cmd)
app.command("repair")(heal.repair_cmd)
app.command("scrub")(heal.scrub_cmd)
app.command("heal")(heal.heal_cmd)
app.command("validate")(validate.validate_cmd)
app.command("worth")(worth.worth_cmd)
app.add_typer(node.node_app, name="node")
app.add_typer(worker.worker_app, name="worker")
app.add_typer(alerts.alerts_app, name="alerts")
app.add_typer(upgrade.upgrade_app, name="upgrade")
app.command("migrate-keys")(upgrade.migrate_keys_cmd)

_err = Console(stderr=True, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map errors to the exit-code table. Returns (and exits with) the code. After an
    interrupt the process exits at once, without waiting for transfer threads still in a read or
    a write (the command has removed what it staged; see :mod:`buildctl.artifact_store.backends.pools`)."""
    code = run(argv)
    if code in (exit_code_for(KeyboardInterrupt()), exit_code_for(Terminated())):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _debug() -> bool:
    try:
        return load_settings().debug
    except BuildctlError:
        return False


def _handle_signals() -> dict[int, object] | None:
    """While a command runs: SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated`, in
    the main thread (the only one Python lets handle signals); the previous handlers are returned."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT), signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    return previous


def run(argv: list[str] | None = None) -> int:
    """Run the CLI without exiting; the return value is the process exit code."""
    previous = _handle_signals()
    try:
        return _run(argv)
    finally:
        if previous is not None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]


def _say(message: str, **style) -> None:
    """The one line of an error, on stderr; a stderr that cannot be written (a full disk under
    a redirect) loses the line, never the exit code."""
    try:
        _err.print(message, highlight=False, markup=False, **style)
    except OSError:
        pass


def _interrupted(e: BaseException) -> int:
    _say("terminated" if isinstance(e, Terminated) else "interrupted", style="red")
    return exit_code_for(e)


def _run(argv: list[str] | None) -> int:
    try:
        rc = app(args=argv, prog_name="buildctl", standalone_mode=False)
        # typer, not standalone, turns KeyboardInterrupt into exit code 130 and returns it
        if rc == exit_code_for(KeyboardInterrupt()):
            return _interrupted(KeyboardInterrupt())
        return EXIT_OK
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:  # usage errors: typer's vendored click exceptions
        show = getattr(e, "show", None)
        if callable(show):
            show()
        return exit_code_for(e)
    except (typer.Abort, KeyboardInterrupt, Terminated) as e:
        return _interrupted(e)
    except BuildctlError as e:
        if _debug():
            traceback.print_exc()
        _say(f"error: {e}", style="red")
        return exit_code_for(e)
    except Exception as e:  # noqa: BLE001 - the CLI's last resort
        if _debug():
            traceback.print_exc()
        known = as_path_error(e) or as_disk_error(e)
        if known is not None:  # a path that cannot name a file (bad input), or a disk that takes no write
            _say(f"error: {known}", style="red")
            return exit_code_for(known)
        if not _debug():
            _say(f"unexpected error: {type(e).__name__}: {e} (set BUILDCTL_DEBUG=1 for a traceback)", style="red")
        return exit_code_for(e)
