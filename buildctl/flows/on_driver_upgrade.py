"""``on-driver-upgrade``: started by the ``buildctl.node.driver-upgraded`` event trigger; records
the node's new fingerprint, re-checks the engines whose soft fields changed and reconciles the
profiles the node serves (builds for compat keys that have no artifact)."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from buildctl import fleet, pipeline
from buildctl.context import open_store_of
from buildctl.coverage import recheck_needs, recheck_outcome
from buildctl.engines.fingerprint import parse_fingerprint
from buildctl.flows.common import ChildRunsFailedError, ProfileName, artifact_key, run_settings, start_builds, wait_for_children
from buildctl.flows.reconcile_fleet import reconcile_fleet


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
    settings = run_settings(store)
    fp = parse_fingerprint(fingerprint, f"event for {node_id}")
    old = parse_fingerprint(old_fingerprint, f"event for {node_id}") if old_fingerprint else None
    s = open_store_of(settings)
    served = fleet.record_reported_fingerprint(s, node_id, fp, profiles)
    known = {n: p for n, p in pipeline.load_profiles(settings).items() if n in served}
    backends = sorted({p.engine.backend for p in known.values()})
    keys = {b: (old.compat_key(b) if old else None, fp.compat_key(b)) for b in backends}
    logger = get_run_logger()
    for b, (was, now) in keys.items():
        soft = old.soft_differences(fp, b) if old else {}
        logger.info(f"{node_id}: {b} compat key {was or 'none'} -> {now}"
                    + (f"; soft fields changed: {', '.join(f'{k} {a} -> {z}' for k, (a, z) in soft.items())}" if soft else ""))
    trigger = {"kind": "driver-upgrade", "node_id": node_id, "event_id": event_id,
               "compat_keys": {b: list(v) for b, v in keys.items()}}
    rechecks = recheck_needs(s, fp, known)
    started = start_builds(settings, [(p, k, 1) for p, k, _ in rechecks], {**trigger, "recheck": True}, None) if rechecks else []
    for (p, k, aid), run in zip(rechecks, started):
        logger.info(f"{p}: {aid} is not validated on {node_id}'s soft values: re-checking on {k} (run {run['flow_run_id']})")
    bad = wait_for_children(started, wait_s) if started else []
    lines = []
    for (p, _, aid), c in zip(rechecks, started):
        c["outcome"] = recheck_outcome(s, known[p], aid, fp, run_seconds(c["flow_run_id"]))
        lines.append(f"- `{p}` on `{c['compat_key']}`: {c['outcome']} (run `{c['flow_run_id']}`, {c['state']})")
        logger.info(f"{node_id} {p}: {c['outcome']}")
    create_markdown_artifact(key=artifact_key("driver-upgrade", node_id), description=f"{node_id}: what its report started",
                             markdown=f"# driver upgrade on {node_id}\n\n" + ("\n".join(lines) if lines else
                                      "no engine of its profiles needed a re-check") + "\n")
    if bad:
        raise ChildRunsFailedError(bad)
    rebuilt = reconcile_fleet(profiles=served, store=settings.store, trigger=trigger)
    return [{**c, "recheck": True} for c in started] + rebuilt
