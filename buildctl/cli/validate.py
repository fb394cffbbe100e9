"""``buildctl validate``: parity and speed side by side with vLLM, stored as an attestation."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import emit_json, context, out, want_json


def _print(att, att_id: str) -> None:
    from buildctl.validators.render import METRIC_COLUMNS, headline, metric_rows

    head = Table(title=f"validation of {att.artifact_id}", show_header=False)
    head.add_column("k")
    head.add_column("v")
    for k, v in headline(att):
        head.add_row(k, v)
    metrics = Table(title="candidate | vLLM reference")
    for c in METRIC_COLUMNS:
        metrics.add_column(c)
    for row in metric_rows(att):
        metrics.add_row(*(row[c] for c in METRIC_COLUMNS))
    out().print(head)
    out().print(metrics)
    out().print(f"attestation {att_id}")


def validate_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Extra JSONL prompts: {\"prompt_token_ids\": [...]} or {\"prompt\": \"...\"} per line."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="The artifact's profile file (default: <profile dir>/<name>.yaml)."),
    speed_budget: float = typer.Option(1.0, "--speed-budget", min=0.1, max=100.0, help="Multiply the speed gate's budget (max_repetitions, max_seconds) while a verdict is inconclusive."),
    json_out: bool = typer.Option(False, "--json", help="JSON output (the attestation)."),
) -> None:
    """Validate an artifact against vLLM (parity and speed); write an attestation; exit 5 on fail or inconclusive."""
    from buildctl.steps.validate import validate
    from buildctl.validators.errors import ValidationFailedError

    quiet = want_json(ctx, json_out)
    say = (lambda m: None) if quiet else (lambda m: typer.echo(f"[validate] {m}", err=True))
    try:
        res = validate(context(ctx), artifact, profile_path=profile,
                                prompts_file=prompts, speed_budget=speed_budget, say=say)
        att, att_id, failure = res.attestation, res.attestation_id, None
    except ValidationFailedError as err:  # the attestation this run wrote, failing
        att, att_id, failure = err.attestation, err.attestation_id, err
    if quiet:
        emit_json({"attestation_id": att_id, **att.model_dump(mode="json")})
    else:
        _print(att, att_id)
    if failure is not None:
        raise failure
