"""``on-driver-upgrade``: started by the ``buildctl.node.driver-upgraded`` event trigger; records
the node's new fingerprint and reconciles the profiles the node serves."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from buildctl import fleet, pipeline
from buildctl.engines.fingerprint import parse_fingerprint
from buildctl.flows.common import run_settings
from buildctl.flows.reconcile_fleet import reconcile_fleet
from buildctl.context import open_store_of


def _upgrade_run_name() -> str:
    from prefect.runtime import flow_run

    return f"driver-upgrade {flow_run.parameters['node_id']}"


@flow(name="on-driver-upgrade", flow_run_name=_upgrade_run_name, log_prints=True)
def on_driver_upgrade(node_id: str, fingerprint: dict[str, Any], profiles: list[str] | None = None,
                      store: str | None = None, old_fingerprint: dict[str, Any] | None = None,
                      event_id: str | None = None) -> list[dict[str, Any]]:
    """Record the node's new fingerprint and reconcile the profiles it serves; the builds it starts
    name this node, its old and new compat keys and the event in their summaries."""
    settings = run_settings(store)
    fp = parse_fingerprint(fingerprint, f"event for {node_id}")
    old = parse_fingerprint(old_fingerprint, f"event for {node_id}") if old_fingerprint else None
    s = open_store_of(settings)
    served = fleet.record_reported_fingerprint(s, node_id, fp, profiles)
    backends = sorted({p.engine.backend for n, p in pipeline.load_profiles(settings).items() if n in served})
    keys = {b: (old.compat_key(b) if old else None, fp.compat_key(b)) for b in backends}
    for b, (was, now) in keys.items():
        get_run_logger().info(f"{node_id}: {b} compat key {was or 'none'} -> {now}")
    trigger = {"kind": "driver-upgrade", "node_id": node_id, "event_id": event_id,
               "compat_keys": {b: list(v) for b, v in keys.items()}}
    return reconcile_fleet(profiles=served, store=settings.store, trigger=trigger)
