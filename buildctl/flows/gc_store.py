"""``gc-store``: a dry run published as a table of every artifact with what keeps it, then the
real run."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from buildctl.steps import fleet
from buildctl.flows.common import run_settings, short
from buildctl.steps.context import Context


def _gc_rows(res) -> list[dict[str, Any]]:
    return [{"artifact": d.artifact_id, "profile": d.profile, "compat key": short(d.compat_key, 24),
             "action": ("remove" if res.dry_run else ("removed" if d.removed else "NOT removed")) if not d.protected_by
             else "keep", "why": d.why_removable if not d.protected_by else "; ".join(d.protected_by)}
            for d in res.decisions]


def _gc_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"gc {'dry run' if p.get('dry_run_only') else 'store'} keep {p.get('keep', 3)}"


@flow(name="gc-store", flow_run_name=_gc_run_name, log_prints=True)
def gc_store(store: str | None = None, keep: int = 3, keep_history: int = 5, grace_s: float | None = None,
             quarantine_retention_s: float = 30 * 86400, dry_run_only: bool = False) -> dict[str, Any]:
    """Garbage-collect the store: first a dry run, published as a table of every artifact with
    what keeps it or why nothing does, then (unless ``dry_run_only``) the real run, which decides
    again from what is there then, and its result.

    Args:
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        keep: Unreferenced artifacts to keep per (profile, compat key), newest first.
        keep_history: Artifacts of each channel's history to keep, newest first.
        grace_s: Keep blobs a publish touched within this many seconds (default: the store's grace).
        quarantine_retention_s: Keep quarantined artifacts this long, for forensics.
        dry_run_only: Publish the dry run's table and remove nothing.
    """
    settings = run_settings(store)
    c = Context.from_settings(settings)
    policy = fleet.gc_policy(settings, keep=keep, keep_history=keep_history, grace_s=grace_s,
                             quarantine_retention_s=quarantine_retention_s)
    plan = fleet.gc(c, policy, dry_run=True)
    create_table_artifact(key="gc-store-plan", table=_gc_rows(plan),
                          description=f"gc dry run: would remove {len(plan.removed_artifacts)} artifacts and "
                                      f"{plan.removed_blobs} blobs ({plan.freed_bytes} bytes); keeps {plan.kept}")
    summary: dict[str, Any] = {"planned": plan.removed_artifacts, "planned_blobs": plan.removed_blobs}
    if dry_run_only:
        return summary
    done = fleet.gc(c, policy)
    refused = "\n".join(f"- `{k}`: {why}" for k, why in done.not_removed) or "none"
    create_markdown_artifact(key="gc-store-result", markdown=(
        f"# gc-store\n\nremoved **{len(done.removed_artifacts)}** artifacts and **{done.removed_blobs}** blobs "
        f"({done.freed_bytes} bytes); kept {done.kept} artifacts and {done.kept_blobs} recently touched blobs; "
        f"compacted {len(done.compacted_history)} superseded re-sign records from channel history.\n\n"
        f"Refused by the store (Object Lock, policy): {refused}\n"
        + (f"\n{done.stopped_early}\n" if done.stopped_early else "")))
    for k, why in done.not_removed:
        get_run_logger().warning(f"could not remove {k}: {why}")
    return {**summary, "removed": done.removed_artifacts, "removed_blobs": done.removed_blobs,
            "freed_bytes": done.freed_bytes, "not_removed": [k for k, _ in done.not_removed],
            "compacted_history": len(done.compacted_history)}
