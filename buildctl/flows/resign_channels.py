"""``resign-channels``: re-signs channel records before they expire."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from buildctl.steps import rollouts
from buildctl.flows.common import run_settings, short
from buildctl.steps.context import Context


def _resign_run_name() -> str:
    from prefect.runtime import flow_run

    return f"resign records expiring within {float(flow_run.parameters.get('margin_s', 3 * 86400)) / 86400:g} d"


@flow(name="resign-channels", flow_run_name=_resign_run_name, log_prints=True)
def resign_channels(store: str | None = None, margin_s: float = 3 * 86400) -> list[dict[str, Any]]:
    """Re-sign every current channel record that expires within ``margin_s`` (TUF's timestamp
    role): nodes refuse expired records, so a frozen or replayed channel cannot linger.

    Args:
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        margin_s: Re-sign the records that expire within this many seconds.
    """
    settings = run_settings(store)
    new = rollouts.resign_due(Context.from_settings(settings), margin_s=margin_s)
    for rec in new:
        get_run_logger().info(f"re-signed {rec.profile}/{rec.channel} [{short(rec.compat_key)}] as #{rec.seq}, "
                              f"expires {rec.expires}")
    return [{"profile": r.profile, "channel": r.channel, "compat_key": r.compat_key, "seq": r.seq,
             "expires": r.expires} for r in new]
