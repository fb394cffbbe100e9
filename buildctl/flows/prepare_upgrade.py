"""``prepare-upgrade``: before a planned driver or toolchain upgrade, re-check and build what the
fleet will need after it, through the compat-key work queues, and end with the plan table.

The plan (:func:`buildctl.steps.upgrade.plan`) knows which work queues have a live worker (a queue is
READY when a worker polled it within the last minute): a projected key no worker serves is
``blocked`` and fails the run, naming its queue. Each (profile, projected key) that needs a build
gets one ``build-validate-publish`` run on its key's queue. A re-check goes to the queue of its
key and the projected soft values, which only a worker on a host with those values polls (for a
driver upgrade: a host upgraded first); with none, the row is ``blocked`` and the run fails,
naming the queue, instead of a worker vouching for a driver it does not run. The worker takes
the cache hit and re-checks it (a failed re-check rebuilds), or builds. Results go to the
channel, or to ``staging`` when the channel is a protected one (prod stays CI's: the table names
the ``buildctl promote`` commands).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from buildctl.artifact_store.promotion import PROTECTED_CHANNELS
from buildctl.steps.profiles import load_profiles
from buildctl.steps import upgrade
from buildctl.steps.context import Context
from buildctl.engines.fingerprint import UpgradeTarget
from buildctl.flows.common import (
    BVP_DEPLOYMENT,
    ChildRunsFailedError,
    artifact_key,
    run_settings,
    short,
    start_builds,
    wait_for_children,
)
from buildctl.steps.upgrade import STATES


def _prepare_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return "prepare-upgrade " + ", ".join(f"{k}={v}" for k, v in sorted((p.get("target") or {}).items()))


def served_queues() -> set[str] | None:
    """The work queues of the build deployment's pool that a worker polls now (READY); ``None``
    when the deployment has no pool (a served deployment: this process runs every run)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkQueueStatus

    with get_client(sync_client=True) as client:
        pool = client.read_deployment_by_name(BVP_DEPLOYMENT).work_pool_name
        if not pool:
            return None
        return {q.name for q in client.read_work_queues(work_pool_name=pool) if q.status == WorkQueueStatus.READY}


def _fields(fields: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in fields.items())


def _next_step(counts: dict[str, int], bad: list[str], blocked: list, commands: list[str], channel: str) -> str:
    """The one thing to do next, for the outcome: fix what failed or is blocked, promote from CI,
    or upgrade the nodes."""
    if bad:
        return "open the failed runs above (their summaries say why), fix, and start prepare-upgrade again"
    if blocked:
        return ("start a worker for each blocked row's queue (`buildctl worker start` on a host with its compat key, "
                "and for a re-check its soft values: for a driver, a host upgraded first), or fix the target; then "
                "start prepare-upgrade again")
    if commands:
        return f"promote to {channel} from CI (the commands above), then upgrade the nodes"
    if counts.get("re-check") or counts.get("build"):
        return "wait for the runs still going, then start prepare-upgrade again to see the plan"
    return f"every group is ready on {channel}: upgrade the nodes (`buildctl node activate` after each one's upgrade)"


@flow(name="prepare-upgrade", flow_run_name=_prepare_run_name, log_prints=True)
def prepare_upgrade(target: dict[str, Any], channel: str = "prod", nodes: str | None = None,
                    store: str | None = None, wait_s: float = 6 * 3600) -> dict[str, Any]:
    """Plan the upgrade to ``target`` (fingerprint fields after it, as in a TARGET file), start a
    re-check or a build for each (profile, projected key) that needs one on its key's work queue,
    wait for them, and publish the plan table: one row per GPU model x profile, with its state.

    Args:
        target: Fingerprint fields after the upgrade, as in a TARGET file (e.g. {"driver_version": "570.86"}).
        channel: The channel whose artifacts the fleet runs.
        nodes: Only nodes whose id matches this glob.
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        wait_s: How long to wait for the runs it starts, in seconds.
    """
    settings = run_settings(store)
    logger = get_run_logger()
    tgt = UpgradeTarget.model_validate(target)
    ctx = Context.from_settings(settings)
    profiles = load_profiles(settings)
    before = upgrade.plan(ctx, tgt, profiles, channel=channel, nodes_glob=nodes, served=served_queues())
    publish = "staging" if channel in PROTECTED_CHANNELS else channel
    blocked = [g for g in before.groups if g.state == "blocked"]
    # One run per (profile, key, queue): a build on the key's queue; a re-check on the queue of the
    # key and the projected soft values, carrying them, so that only a worker that has them takes it
    # and any other refuses it (it never ends green on values nobody checked).
    work: dict[tuple[str, str, str], list] = {}
    for g in before.groups:
        if g.state in ("re-check", "build"):
            work.setdefault((g.profile, g.compat_key, g.queue), []).append(g)
    todo = sorted(work.items())
    trigger = {"kind": "prepare-upgrade", "target": tgt.fields(), "channel": channel}
    triggers = [{**trigger, "recheck": True, "soft": gs[0].soft} if gs[0].recheck else trigger for _, gs in todo]
    started = start_builds(settings, [(p, k, sum(len(g.nodes) for g in gs)) for (p, k, _), gs in todo], trigger,
                           publish, queues=[q for (_, _, q), _ in todo], triggers=triggers) if todo else []
    for g in before.groups:
        if g.state == "promote" and g.artifact_id and publish == channel:
            promote.promote(ctx, g.artifact_id, channel)
            logger.info(f"{g.profile} [{g.compat_key}]: promoted {g.artifact_id} to {channel}")
    bad = wait_for_children(started, wait_s) if started else []
    after = upgrade.plan(ctx, tgt, profiles, channel=channel, nodes_glob=nodes, served=served_queues())
    create_table_artifact(key=artifact_key("prepare-upgrade", channel), table=after.table(),
                          description=f"upgrade to {tgt.fields()}: each GPU model x profile on {channel}, and its state")
    commands = sorted({g.command for g in after.groups if g.state == "promote" and g.command})
    still_blocked = [g for g in after.groups if g.state == "blocked"]
    md = [f"# prepare-upgrade to {_fields(tgt.fields())} on `{channel}`", "",
          "| | " + " | ".join(STATES) + " |", "|---|" + "---|" * len(STATES),
          "| before | " + " | ".join(str(before.counts().get(s, 0)) for s in STATES) + " |",
          "| after | " + " | ".join(str(after.counts().get(s, 0)) for s in STATES) + " |", ""]
    md += [f"- run `{c['flow_run_id']}`: `{c['profile']}` on `{short(c['compat_key'], 24)}`, {c['state']}" for c in started]
    if commands:
        md += ["", f"{channel} is promoted from CI:", ""] + [f"    {c}" for c in commands]
    md += ["", "**Next:** " + _next_step(after.counts(), bad, still_blocked, commands, channel)]
    create_markdown_artifact(key=artifact_key("prepare-upgrade", channel, "summary"), markdown="\n".join(md) + "\n",
                             description="what the run started and what is left")
    logger.info("upgrade plan after: " + ", ".join(f"{n} {s}" for s, n in after.counts().items()))
    if bad:
        raise ChildRunsFailedError(bad)
    if blocked or still_blocked:
        raise upgrade.UpgradeBlockedError([f"{g.profile} on {g.gpu_model}: {g.detail}" for g in (still_blocked or blocked)])
    return after.to_json()
