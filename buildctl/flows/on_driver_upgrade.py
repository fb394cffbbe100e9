"""``on-driver-upgrade``: started by the ``buildctl.node.driver-upgraded`` event trigger; records
the node's new fingerprint, re-checks the engines whose soft fields changed and reconciles the
profiles the node serves (builds for compat keys that have no artifact)."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from buildctl.steps import fleet
from buildctl.steps.profiles import load_profiles
from buildctl.steps.context import Context, open_store_of
from buildctl.steps.node_agent import DEFAULT_CHANNEL
from buildctl.steps.upgrade import node_outcomes
from buildctl.steps.coverage import describe_soft, recheck_needs, recheck_outcome
from buildctl.core.errors import BuildctlError
from buildctl.engines.fingerprint import parse_fingerprint
from buildctl.flows.common import (ChildRunsFailedError, ProfileName, artifact_key, published_summary, run_settings,
                                   start_builds, wait_for_children)
from buildctl.flows.reconcile_fleet import reconcile_fleet
from buildctl.flows.summary import RunReport


class RecheckNotCoveredError(BuildctlError):
    """A driver upgrade's re-check did not cover the node's soft values: no worker with them ran it
    (or one refused it), so nothing vouches for the engine on that node."""

    def __init__(self, node_id: str, needs: list[str], runs: list[str]) -> None:
        self.node_id, self.needs, self.runs = node_id, list(needs), list(runs)
        super().__init__(f"{node_id}: re-check did not cover its soft values: " + "; ".join(needs)
                         + (f" (runs: {'; '.join(runs)})" if runs else ""))


def run_seconds(flow_run_id: str) -> float | None:
    """How long a flow run ran (Prefect's total run time)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    return run.total_run_time.total_seconds() if run.total_run_time else None


def _upgrade_run_name() -> str:
    from prefect.runtime import flow_run

    return f"driver-upgrade {flow_run.parameters['node_id']}"


@flow(name="on-driver-upgrade", flow_run_name=_upgrade_run_name, log_prints=True)
def on_driver_upgrade(node_id: str, fingerprint: dict[str, Any], profiles: list[ProfileName] | None = None,
                      store: str | None = None, old_fingerprint: dict[str, Any] | None = None,
                      event_id: str | None = None, wait_s: float = 6 * 3600) -> list[dict[str, Any]]:
    """Record the node's new fingerprint; for each profile it serves whose artifact for its compat
    key is not validated on its soft values, start a re-check (a build run that takes the cache hit
    and validates on the worker; only a failed re-check rebuilds); then reconcile the keys that have
    no artifact. The runs it starts name this node, its old and new compat keys and the event.

    Args:
        node_id: The node that reported the upgrade.
        fingerprint: The node's new fingerprint (from the event).
        profiles: The profiles the node serves (default: those on record for it).
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        old_fingerprint: The node's fingerprint before the upgrade (from the event).
        event_id: The buildctl.node.driver-upgraded event that started the run.
        wait_s: How long to wait for the runs it starts, in seconds.
    """
    report = RunReport(title=f"driver upgrade on {node_id}")
    report.add("trigger", "buildctl.node.driver-upgraded" + (f" (event {event_id})" if event_id else ""))
    with published_summary(report, lambda: artifact_key("driver-upgrade", node_id),
                           f"{node_id}: what its report found and started"):
        return _on_driver_upgrade(report, node_id, fingerprint, profiles, store, old_fingerprint, event_id, wait_s)


def _served_outcomes(report: RunReport, logger, ctx: Context, node_id: str, fp, profiles: dict,
                     serves: list[str]) -> None:
    """Per served model the node serves: what it runs now on its new fingerprint (swap, fallback or
    idle; steps.upgrade.node_outcomes). The fleet is pull-based: the node moves itself with
    ``pull --model`` (or ``node activate --model``) and back once the rebuild is promoted."""
    outcomes, problems = node_outcomes(ctx, node_id, fp, profiles, serves, DEFAULT_CHANNEL)
    for o in outcomes:
        move = {"swap": f"its next `buildctl pull --model {o.model}` swaps to it",
                "fallback": f"its next `buildctl pull --model {o.model}` moves it to {o.runtime} now, and back to "
                            f"{o.group.profile} on the first pull after the rebuild is promoted",
                "idle": f"nothing to serve until {o.group.profile} is rebuilt and promoted"}[o.outcome]
        line = f"{o.outcome} on {DEFAULT_CHANNEL}: {o.detail}; {move}"
        (logger.warning if o.outcome == "idle" else logger.info)(f"{node_id} serves {o.model}: {line}")
        report.add(f"serves {o.model}", line)
    for p in problems:
        logger.warning(f"{node_id}: {p}")
        report.add("served models", p)


def _on_driver_upgrade(report: RunReport, node_id: str, fingerprint: dict[str, Any], profiles: list[str] | None,
                       store: str | None, old_fingerprint: dict[str, Any] | None, event_id: str | None,
                       wait_s: float) -> list[dict[str, Any]]:
    report.step = "record"
    settings = run_settings(store)
    fp = parse_fingerprint(fingerprint, f"event for {node_id}")
    old = parse_fingerprint(old_fingerprint, f"event for {node_id}") if old_fingerprint else None
    s = open_store_of(settings)
    served = fleet.record_reported_fingerprint(s, node_id, fp, profiles)
    report.add("profiles", ", ".join(f"`{p}`" for p in served) or "none on record")
    every = load_profiles(settings)
    known = {n: p for n, p in every.items() if n in served}
    backends = sorted({p.engine.backend for p in known.values()})
    keys = {b: (old.compat_key(b) if old else None, fp.compat_key(b)) for b in backends}
    logger = get_run_logger()
    for b, (was, now) in keys.items():
        soft = old.soft_differences(fp, b) if old else {}
        changes = ', '.join(f'{k} {a} -> {z}' for k, (a, z) in soft.items())
        logger.info(f"{node_id}: {b} compat key {was or 'none'} -> {now}" + (f"; soft fields changed: {changes}" if soft else ""))
        report.add(f"{b} compat key", f"`{was or 'none'}` → `{now}`" + (f"; soft: {changes}" if soft else ""))
    report.step = "served models"
    _served_outcomes(report, logger, Context.from_settings(settings, store=s), node_id, fp, every, served)
    trigger = {"kind": "driver-upgrade", "node_id": node_id, "event_id": event_id,
               "compat_keys": {b: list(v) for b, v in keys.items()}}
    report.step = "re-check"
    rechecks = recheck_needs(s, fp, known)
    # A re-check must run where the node's soft values are: any worker of the compat key builds, but
    # only one with the node's driver (compiler, ...) can validate on it. Each goes to the queue of
    # its key and those soft values (`buildctl worker start` polls its own), and carries them, so a
    # worker with other values refuses it at once instead of vouching for values nobody checked.
    softs = [fp.soft_fields(known[p].engine.backend) for p, _, _ in rechecks]
    queues = [fleet.recheck_queue_for(k, soft) for (_, k, _), soft in zip(rechecks, softs)]
    started = start_builds(settings, [(p, k, 1) for p, k, _ in rechecks], trigger, None, queues=queues,
                           triggers=[{**trigger, "recheck": True, "soft": soft} for soft in softs]) if rechecks else []
    for (p, k, aid), run, q in zip(rechecks, started, queues):
        logger.info(f"{p}: {aid} is not validated on {node_id}'s soft values: re-checking on {k}, queue {q} "
                    f"(run {run['flow_run_id']})")
    bad = wait_for_children(started, wait_s) if started else []
    uncovered = []
    for (p, _, aid), c, q, soft in zip(rechecks, started, queues, softs):
        c["outcome"] = recheck_outcome(s, known[p], aid, fp, run_seconds(c["flow_run_id"]))
        report.add(f"re-check {p}", f"on `{c['compat_key']}`: {c['outcome']} (run `{c['flow_run_id']}`, {c['state']})")
        logger.info(f"{node_id} {p}: {c['outcome']}")
        if c["outcome"].startswith("re-check did not cover"):
            uncovered.append(f"{p}: needs a worker with {describe_soft(soft)} on compat key {c['compat_key']} "
                             f"(it polls queue {q})")
    if not rechecks:
        report.add("re-checks", "none needed: every engine of its profiles is validated on its soft values or has none")
    if uncovered:  # nobody checked the node's values: a state that pages, never a recommendation to promote
        report.next_steps = [f"start `buildctl worker start --pool POOL` on a host with the node's soft values; {u}"
                             for u in uncovered]
        raise RecheckNotCoveredError(node_id, uncovered, bad)
    if bad:
        raise ChildRunsFailedError(bad)
    report.step = "reconcile"
    rebuilt = reconcile_fleet(profiles=served, store=settings.store, trigger=trigger)
    for c in rebuilt:
        report.add(f"build {c['profile']}", f"on `{c['compat_key']}`: {c['state']} (run `{c['flow_run_id']}`)")
    if not rebuilt:
        report.add("builds", "none needed: every compat key the node has an artifact")
    report.step = "done"
    report.next_steps = [f"buildctl history --profile {p} --channel staging   # then from CI: buildctl promote ARTIFACT "
                         "--channel prod" for p in served]
    return [{**c, "recheck": True} for c in started] + rebuilt
