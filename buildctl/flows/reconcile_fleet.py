"""``reconcile-fleet``: plan the missing (profile, compat key) pairs from the store's inventory
and start ``build-validate-publish`` for each on the work queue serving that compat key."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from buildctl.steps import fleet
from buildctl.steps.profiles import load_profiles
from buildctl.flows.common import (ChildRunsFailedError, ProfileName, run_settings, short, start_builds,
                                   wait_for_children)
from buildctl.steps.context import open_store_of


def _reconcile_run_name() -> str:
    from prefect.runtime import flow_run

    profiles = flow_run.parameters.get("profiles")
    return "reconcile " + (", ".join(profiles) if profiles else "all profiles")


@flow(name="reconcile-fleet", flow_run_name=_reconcile_run_name, log_prints=True)
def reconcile_fleet(profiles: list[ProfileName] | None = None, store: str | None = None, wait: bool = True,
                    wait_s: float = 6 * 3600, trigger: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Start a build for every (profile, compat key) the fleet needs and the store lacks, each on
    the work queue of its compat key; with ``wait`` (the default), wait up to ``wait_s`` for them
    and fail if any did not complete, so this run's state is its children's.

    Args:
        profiles: Only these profiles (default: every profile a node serves).
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        wait: Wait for the builds it starts, and fail if any did not complete.
        wait_s: How long to wait for them, in seconds.
        trigger: What started the run, passed by the parent flow.
    """
    settings = run_settings(store)
    skipped: list[tuple[str, str]] = []
    needs = fleet.fleet_plan(open_store_of(settings), load_profiles(settings), profiles, skipped)
    logger = get_run_logger()
    for key, why in skipped:  # reported, and planned around (a malformed node record's node is not counted)
        logger.warning(f"skipped {key}: {why}")
    started = start_builds(settings, [(n.profile, n.compat_key, n.nodes) for n in needs],
                            trigger or {"kind": "reconcile"}, None) if needs else []
    if not needs:
        logger.info("every (profile, compat key) the fleet needs has an artifact")
    bad = wait_for_children(started, wait_s) if wait and started else []
    # the state second and the long ids shortened, so the table reads at 1400 px; the run's result
    # (and each child run's page) holds them whole
    rows = [{"profile": c["profile"], "state": c["state"], "compat key": short(c["compat_key"], 24), "nodes": c["nodes"],
             "flow run": c["flow_run_id"][:8],
             **({"work queue": c["work_queue"]} if c["work_queue"] not in (None, c["compat_key"]) else {})}
            for c in started]
    if rows:
        create_table_artifact(key="reconcile-fleet", table=rows, description="builds started for the fleet, and their states")
    if bad:
        raise ChildRunsFailedError(bad)
    return started
