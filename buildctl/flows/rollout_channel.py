"""``rollout-channel``: advances, completes or halts (and rolls back) the channel's rollouts, as
:mod:`buildctl.steps.rollouts` decides. It runs at once when a promotion starts a rollout
(``buildctl.rollout.started``) and when a node's engine fails (``buildctl.node.engine-health``),
every 5 minutes while a rollout is live, and hourly otherwise: each run turns its
``while-rolling-out`` schedule on when a rollout is live after it and off when none is, so the runs
list stays quiet between rollouts."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from buildctl.steps import rollouts
from buildctl.flows.common import ProfileName, artifact_key, run_settings, short
from buildctl.flows.events import emit_rollout_halted
from buildctl.steps.context import Context


#: The schedule (slug, in prefect.yaml and flows.serve) that runs only while a rollout is live.
WHILE_ROLLING_OUT = "while-rolling-out"


def switch_schedule(channel: str, live: bool) -> str | None:
    """Turn the running deployment's :data:`WHILE_ROLLING_OUT` schedule for ``channel`` on
    (``live``) or off; Prefect drops the runs it had scheduled when it goes off. Returns ``"on"``
    or ``"off"`` when it changed it, ``None`` when it was already so, or outside a deployment."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    if not deployment.id:
        return None
    with get_client(sync_client=True) as client:
        dep = client.read_deployment(deployment.id)
        for sched in dep.schedules:
            params = {**(dep.parameters or {}), **(sched.parameters or {})}
            if sched.slug != WHILE_ROLLING_OUT or params.get("channel", "prod") != channel:
                continue
            if sched.active != live:
                client.update_deployment_schedule(dep.id, sched.id, active=live)
                return "on" if live else "off"
    return None


def _rollout_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"rollout {p.get('profile') or 'all profiles'}/{p.get('channel', 'prod')}"


@flow(name="rollout-channel", flow_run_name=_rollout_run_name, log_prints=True)
def rollout_channel(channel: str = "prod", profile: ProfileName | None = None, store: str | None = None,
                    node_id: str | None = None) -> list[dict[str, Any]]:
    """Move every live rollout on ``channel`` on: advance a wave whose bake time passed within its
    failure budget, complete the last, or halt and roll the channel back when a wave's failures
    exceed its budget (the history record names the failing nodes). Then turn the
    ``while-rolling-out`` schedule on while a rollout is live, off when none is.

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
    # Live after this run: any rollout this run did not end (a complete or a halt it wrote).
    live = any(not (v.decision in ("complete", "halt") and v.applied is not None) for v in views)
    if profile is None:  # a run for one profile does not know the others'
        try:
            changed = switch_schedule(channel, live)
        except Exception as err:  # noqa: BLE001 - the decisions are applied; the schedule is only pacing
            logger.warning(f"could not turn the {WHILE_ROLLING_OUT} schedule {'on' if live else 'off'}: "
                           f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        else:
            if changed:
                logger.info(f"{WHILE_ROLLING_OUT} schedule {changed}: "
                            + ("a rollout is live on " if live else "no rollout is live on ") + channel)
    return [v.to_json() for v in views]
