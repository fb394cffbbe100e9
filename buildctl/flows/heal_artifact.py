"""``heal-artifact``: started by ``buildctl.node.pull-failed`` and ``buildctl.artifact.corrupted``;
deep verify, quarantine, roll back, repair or rebuild."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from buildctl.steps import healing
from buildctl.flows.build_validate_publish import build_validate_publish
from buildctl.flows.common import (BVP_DEPLOYMENT, ChildRunsFailedError, artifact_key, has_work_pool,
                                   published_summary, run_settings, short, start_builds, wait_for_children)
from buildctl.flows.summary import RunReport
from buildctl.core.settings import Settings
from buildctl.steps.context import Context, open_store_of


def _heal_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"heal {short(p['artifact_id'], 22)}" + (f" from {p['node_id']}" if p.get("node_id") else "")


def _rebuild_on_matching_workers(settings: Settings, pairs: list[tuple[str, str]], trigger: dict[str, Any],
                                 wait_s: float) -> list[dict[str, Any]]:
    """Rebuild each (profile, compat key) on a worker of that compat key, promote it to staging,
    and report what staging points at afterwards."""
    from buildctl.artifact_store.channels import read_channel

    started = start_builds(settings, [(p, k, 0) for p, k in pairs], trigger, "staging")
    bad = wait_for_children(started, wait_s)
    if bad:
        raise ChildRunsFailedError(bad)
    out = []
    for child in started:
        rec = read_channel(open_store_of(settings), child["profile"], "staging", child["compat_key"])
        out.append({"artifact_id": rec[0].artifact_id if rec else None, "verdict": "pass",
                    "promoted": {"channel": "staging", "seq": rec[0].seq} if rec else None})
    return out


@flow(name="heal-artifact", flow_run_name=_heal_run_name, log_prints=True)
def heal_artifact(artifact_id: str, node_id: str | None = None, repair_from: str | None = None,
                  rebuild: bool = True, store: str | None = None, wait_s: float = 6 * 3600) -> dict[str, Any]:
    """Deep verify the store's copy -> quarantine -> roll channels back -> repair or rebuild.

    Started by ``buildctl.node.pull-failed`` and ``buildctl.artifact.corrupted``. Only a failing
    store copy is quarantined: a node whose own disk is bad does not take a good artifact out of
    service. The rebuild takes the normal path (build, publish, validate, promote to staging), on a
    worker of the artifact's compat key when the build deployment has a work pool (waiting up to
    ``wait_s``); prod stays on the rolled-back artifact until CI promotes again.

    Args:
        artifact_id: The artifact to check and heal (from the event).
        node_id: The node whose failed pull started the run, if any.
        repair_from: A verified copy to repair from (a directory or a store URI).
        rebuild: Rebuild when it cannot be repaired.
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        wait_s: How long to wait for the rebuilds, in seconds.
    """
    report = RunReport(title=f"heal {short(artifact_id, 22)}")
    report.add("trigger", f"a failed pull on node {node_id}" if node_id else "buildctl.artifact.corrupted or by hand")
    with published_summary(report, lambda: artifact_key("heal", artifact_id.removeprefix("xxh3-128:")[:16]),
                           f"heal {artifact_id}: what was found and done"):
        return _heal(report, artifact_id, node_id, repair_from, rebuild, store, wait_s)


def _heal(report: RunReport, artifact_id: str, node_id: str | None, repair_from: str | None, rebuild: bool,
          store: str | None, wait_s: float) -> dict[str, Any]:
    report.step = "verify"
    settings = run_settings(store)
    logger = get_run_logger()
    rep = healing.heal_artifact(Context.from_settings(settings), artifact_id, repair_source=repair_from)
    if rep.store_copy_ok:
        logger.info(f"{artifact_id}: the store's copy deep-verifies" + (f"; {node_id}'s own copy was bad" if node_id else ""))
        report.add("found", "the store's copy deep-verifies: nothing quarantined"
                   + (f" ({node_id}'s own copy was bad)" if node_id else ""))
        report.step = "done"
        report.next_steps = [f"buildctl pull ... --node-id {node_id}   # on {node_id}: it re-downloads and verifies"
                             if node_id else "nothing to do"]
        return {"artifact_id": artifact_id, "store_copy_ok": True, "rebuilt": []}
    logger.warning(f"{artifact_id}: quarantined ({rep.quarantine_key}): {'; '.join(rep.problems)}")
    report.add("found", "; ".join(rep.problems) or "the store's copy does not deep-verify")
    report.add("quarantined", f"`{rep.quarantine_key}`")
    for r in rep.recoveries:
        report.add(f"{r.profile}/{r.channel}", f"[{short(r.compat_key)}] "
                   + (f"rolled back to `{r.rolled_back_to}` (#{r.seq})" if r.rolled_back_to else r.detail))
    if rep.repair is not None:
        report.add("repair", f"replaced {', '.join(rep.repair.replaced) or 'nothing'}; "
                   + ("healthy, quarantine lifted" if rep.repair.healthy else f"still bad: {', '.join(rep.repair.unrepaired)}"))
    rebuilt = []
    trigger = {"kind": "heal", "artifact_id": artifact_id, "node_id": node_id}
    report.step = "rebuild"
    if rebuild and rep.rebuild and has_work_pool(BVP_DEPLOYMENT):
        rebuilt = _rebuild_on_matching_workers(settings, rep.rebuild, trigger, wait_s)
    elif rebuild:  # served or local: this process builds (the target check refuses a foreign compat key)
        for profile, compat_key in rep.rebuild:
            rebuilt.append(build_validate_publish(profile=profile, target_compat_key=compat_key, promote_to="staging",
                                                  store=settings.store, trigger=trigger))
    for b in rebuilt:
        report.add("rebuilt", f"`{b['artifact_id']}`, {b['verdict']}"
                   + (f", on {b['promoted']['channel']} #{b['promoted']['seq']}" if b.get("promoted") else ""))
    report.step = "done"
    report.next_steps = ([f"buildctl promote {b['artifact_id']} --channel prod   # from CI, if prod was rolled back"
                          for b in rebuilt if b.get("artifact_id")]
                         or ([f"buildctl build <profile of {p}> on a host with compat key {k}" for p, k in rep.rebuild]
                             if not rebuild else []))
    return {"artifact_id": artifact_id, "store_copy_ok": False, "quarantine_record": rep.quarantine_key,
            "problems": rep.problems,
            "recovered": [{"profile": r.profile, "channel": r.channel, "compat_key": r.compat_key,
                           "rolled_back_to": r.rolled_back_to, "seq": r.seq} for r in rep.recoveries],
            "repaired": rep.repair.replaced if rep.repair else [],
            "rebuilt": [{"artifact_id": b["artifact_id"], "verdict": b["verdict"], "promoted": b["promoted"]}
                        for b in rebuilt]}
