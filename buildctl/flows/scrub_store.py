"""``scrub-store``: deep-verify the store, channel-referenced artifacts first; quarantine and
report every failure as a ``buildctl.artifact.corrupted`` event. A scrub that found corruption
fails its run once it has finished (every artifact checked, every event sent, the table
published), so the run's state says what the scrub found."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.states import Failed, State

from buildctl.steps import healing
from buildctl.artifact_store.errors import ScrubFoundCorruptionError
from buildctl.artifact_store.read import get_manifest
from buildctl.flows.common import run_settings
from buildctl.flows.events import emit_artifact_corrupted
from buildctl.steps.context import Context


def _scrub_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"scrub {'channels' if p.get('channels_only') else 'store'} {float(p.get('sample', 1.0)):.0%}"


@flow(name="scrub-store", flow_run_name=_scrub_run_name, log_prints=True)
def scrub_store(sample: float = 1.0, channels_only: bool = False, budget_gib: float | None = None,
                store: str | None = None) -> dict[str, Any] | State:
    """Deep-verify the store, channel-referenced artifacts first; quarantine and report every failure
    as a ``buildctl.artifact.corrupted`` event (an automation heals it); then fail the run
    (:class:`ScrubFoundCorruptionError`) when any artifact was corrupt.

    Args:
        sample: Fraction (0-1] of the artifacts no channel references to check.
        channels_only: Only the artifacts a channel points at.
        budget_gib: Stop after re-hashing this many GiB.
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
    """
    settings = run_settings(store)
    c = Context.from_settings(settings)
    s = c.store
    report = healing.scrub(c, sample=sample, channels_only=channels_only,
                           budget_bytes=int(budget_gib * 2**30) if budget_gib is not None else None)
    events = []
    for row in report.corrupt:
        m = get_manifest(s, row.artifact_id)
        events.append(emit_artifact_corrupted(row.artifact_id, {"profile": m.profile_name, "compat_key": m.compat_key,
                                                                "problems": row.problems,
                                                                "quarantine_record": row.quarantine_key}))
    rows = [{"artifact": r.artifact_id, "profile": r.profile, "channels": ", ".join(r.channels), "bytes": r.bytes,
             "status": r.status, "problems": "; ".join(r.problems)} for r in report.rows]
    if rows:
        create_table_artifact(key="scrub-store", table=rows, description="scrub: every artifact checked")
    if report.failed:  # after the whole scrub: every artifact checked, every event sent
        # A Failed state, not a raise: the run fails with the one-line cause and no traceback in
        # its log (a found corruption is the scrub's finding, not a crash); a caller of the flow
        # still gets the error raised.
        err = ScrubFoundCorruptionError([r.artifact_id for r in report.corrupt], report.history)
        get_run_logger().error(str(err))
        return Failed(message=str(err), data=err)
    return {"checked_bytes": report.checked_bytes, "corrupt": [], "rows": rows, "events": events,
            "skipped_records": [{"key": k, "why": why} for k, why in report.skipped]}
