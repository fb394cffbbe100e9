"""What every command module shares: the global options' state, output helpers, the store."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from buildctl.core.settings import Settings, load_settings

if TYPE_CHECKING:
    from buildctl.steps.context import Context

JSON_OPT = typer.Option(False, "--json", help="JSON output.")
REQUIRE_CRYPTO_OPT = typer.Option(False, "--require-crypto", help="Refuse (exit 4) an engine bound by xxh3-128 only: a manifest without per-file BLAKE3 (written before it; `buildctl rehash` upgrades it) or a channel record without its manifest's BLAKE3 (default: BUILDCTL_REQUIRE_CRYPTO).")


@dataclass(frozen=True)
class CliState:
    """The global options, shared with every command through the click context."""

    settings: Settings
    json: bool = False
    verbose: int = 0
    made: dict[str, Any] = field(default_factory=dict, compare=False)  # the command's Context, made once


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, CliState) else CliState(load_settings())


def settings(ctx: typer.Context) -> Settings:
    return state(ctx).settings


def context(ctx: typer.Context, *, require_crypto: bool = False, existing: bool = False) -> "Context":
    """The command's context (store opened, keys read), made on first use and then reused;
    ``require_crypto``: the command's ``--require-crypto`` flag, on top of the settings;
    ``existing``: the command only reads or maintains a store, so one that does not exist is an
    error (exit 3) rather than an empty answer."""
    from dataclasses import replace

    from buildctl.steps.context import Context

    st = state(ctx)
    if "context" not in st.made:
        st.made["context"] = Context.from_settings(st.settings)
    if require_crypto and not st.made["context"].auth.require_crypto:
        made = st.made["context"]
        st.made["context"] = replace(made, settings=made.settings.with_flags(require_crypto=True),
                                     auth=made.auth.but(require_crypto=True))
    if existing:
        from buildctl.artifact_store.backends.store import require_store

        require_store(st.made["context"].store)
    return st.made["context"]


def want_json(ctx: typer.Context, local: bool) -> bool:
    return local or state(ctx).json


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def out() -> Console:
    """Plain stdout console: no markup (ids and keys contain brackets), wide when piped."""
    return Console(soft_wrap=True, markup=False, highlight=False, width=None if sys.stdout.isatty() else 200)


def short_id(artifact_id: str | None) -> str:
    return artifact_id[len("xxh3-128:"):][:16] if artifact_id else "-"


def fail_on_skipped(command: str, skipped: list[tuple[str, str]]) -> None:
    """After a store-wide command has printed its result: exit 10 naming each malformed record it
    passed over (``SkippedRecordsError``)."""
    from buildctl.artifact_store.errors import SkippedRecordsError

    if skipped:
        raise SkippedRecordsError(command, skipped)
