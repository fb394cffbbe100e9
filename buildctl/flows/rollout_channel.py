"""``rollout-channel``: on a schedule and on ``buildctl.node.engine-health``: advances, completes
or halts (and rolls back) the channel's rollouts, as :mod:`buildctl.rollouts` decides."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from buildctl import rollouts
from buildctl.flows.common import ProfileName, artifact_key, run_settings, short
from buildctl.flows.events import emit_rollout_halted
from buildctl.context import Context


def _rollout_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"rollout {p.get('profile') or 'all profiles'}/{p.get('channel', 'prod')}"


@flow(name="rollout-channel", flow_run_name=_rollout_run_name, log_prints=True)
def rollout_channel(channel: str = "prod", profile: ProfileName | None = None, store: str | None = None,
                    node_id: str | None = None) -> list[dict[str, Any]]:
    """Move every live rollout on ``channel`` on: advance a wave whose bake time passed within its
    failure budget, complete the last, or halt and roll the channel back when a wave's failures
    exceed its budget (the history record names the failing nodes). Runs on a schedule and on
    ``buildctl.node.engine-health`` events.

    Args:
        channel: The channel whose rollouts move on.
        profile: Only this profile's rollouts (default: all).
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        node_id: The node whose engine-health report started the run (for the log).
    """
    settings = run_settings(store)
    logger = get_run_logger()
    views = rollouts.tick(Context.from_settings(settings), channel=channel,
                          profile=profile)
    rows = []
    for v in views:
        done = f" -> #{v.applied.seq} ({v.applied.action})" if v.applied else ""
        (logger.warning if v.decision == "halt" else logger.info)(
            f"{v.record.profile}/{channel} [{short(v.record.compat_key)}] #{v.record.seq}: {v.decision}{done}: {v.why}")
        if v.decision == "halt" and v.applied is not None:  # halted by this run: someone must look
            emit_rollout_halted({**v.to_json(), "artifact_id": v.record.artifact_id,
                                 "rolled_back_to": v.applied.artifact_id})
        cur = v.waves[v.record.rollout.wave] if v.record.rollout else None
        rows.append({"profile": v.record.profile, "compat key": short(v.record.compat_key), "decision": v.decision,
                     "wave": f"{cur.index + 1}/{len(v.waves)} ({cur.percent:g}%)" if cur else "",
                     "nodes": cur.nodes if cur else 0, "healthy": cur.healthy if cur else 0,
                     "failed": cur.failed if cur else 0, "why": v.why,
                     "new record": v.applied.seq if v.applied else ""})
    if not views:
        logger.info(f"no rollout in progress on {channel}" + (f" (triggered by {node_id})" if node_id else ""))
    else:
        create_table_artifact(key=artifact_key("rollout", channel), table=rows,
                              description=f"rollouts on {channel}: what each wave shows and what this run did")
    return [v.to_json() for v in views]
