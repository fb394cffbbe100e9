"""``buildctl alerts``: the Prefect automations that notify someone who must act
(:mod:`buildctl.flows.alerts`). The one command here that needs Prefect imports it when it runs,
so a node without Prefect still runs every other command."""

from __future__ import annotations

from typing import Optional

import typer

from buildctl.cli._common import emit_json, out, settings, want_json
from buildctl.core.errors import BadInputError

alerts_app = typer.Typer(help="Prefect automations that notify on failed, crashed and late runs, corruption, "
                              "halted rollouts, channels not re-signed and nodes left on a fallback runtime.",
                         no_args_is_help=True)


@alerts_app.command("install")
def install_cmd(
    ctx: typer.Context,
    block: str = typer.Option("custom-webhook/buildctl-alerts", "--block",
                              help="The notification block, TYPE-SLUG/NAME (slack-webhook/oncall, pager-duty-webhook/x)."),
    webhook_url: Optional[str] = typer.Option(None, "--webhook-url", help="Create or update the Custom Webhook block with this URL first."),
    late_minutes: float = typer.Option(30, "--late-minutes", min=0.2, max=10080, help="Alert on a run Late this long."),
    resign_hours: float = typer.Option(24, "--resign-hours", min=0.01, max=8760, help="Alert when no resign-channels run completed this long."),
    fallback_minutes: Optional[float] = typer.Option(None, "--fallback-minutes", min=0.1, max=525600, help="Alert when a node serves a model from a fallback runtime this long (default: the smallest max_fallback_minutes of the served models, else 240)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Create or update (by name) the buildctl alert automations on the Prefect server (PREFECT_API_URL)."""
    if not settings(ctx).prefect_api_url:
        raise BadInputError("no Prefect API: set PREFECT_API_URL")
    try:
        from buildctl.flows.alerts import install_alerts
    except ImportError as err:
        raise BadInputError(f"alerts install needs Prefect on this machine ({err})") from None
    if fallback_minutes is None:
        from buildctl.steps.profiles import fallback_alert_minutes

        fallback_minutes = fallback_alert_minutes(settings(ctx))
    done = install_alerts(block, webhook_url, late_minutes, resign_hours, fallback_minutes)
    if want_json(ctx, json_out):
        emit_json([{"automation": n, "action": how} for n, how in done])
        return
    for n, how in done:
        out().print(f"{n}: {how} (notifies through {block})")
