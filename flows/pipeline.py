"""Prefect flows: thin wrappers over the pipeline steps. They add only Prefect's concerns
(retries, concurrency, artifacts, events); every decision is a :mod:`buildctl.pipeline` or
:mod:`buildctl.fleet` step.

* ``build_validate_publish``: check the target, build (or take a cache hit) under a strict
  concurrency limit, publish (retried: a network step), validate (never retried blindly),
  optionally promote to a non-production channel, and publish Prefect artifacts.
* ``reconcile_fleet``: plan the missing (profile, compat key) pairs from the store's inventory
  and start ``build_validate_publish`` for each on the work queue serving that compat key.
* ``on_driver_upgrade``: started by the ``buildctl.node.driver-upgraded`` event trigger; records
  the node's new fingerprint and reconciles the profiles the node serves.
* ``rollout_channel``: on a schedule and on ``buildctl.node.engine-health``: advances, completes
  or halts (and rolls back) the channel's rollouts, as :mod:`buildctl.rollouts` decides.
* ``resign_channels``: re-signs channel records before they expire.

Each run builds its :class:`~buildctl.settings.Settings` once, from the worker's environment
and the ``store`` parameter.
"""

from __future__ import annotations

import shutil
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.concurrency.sync import concurrency
from prefect.deployments import run_deployment

from buildctl import fleet, healing, pipeline, rollouts
from buildctl.engines.fingerprint import parse_fingerprint
from buildctl.settings import Settings, load_settings
from buildctl.flows.events import emit_artifact_corrupted, emit_artifact_validated
from buildctl.flows.summary import RunReport, describe_trigger
from buildctl.errors import BuildctlError
from buildctl.store.errors import StoreArgumentError
from buildctl.store.verify import get_manifest
from buildctl.validate_process import ValidationOutcome, validate_in_subprocess
from buildctl.validators.errors import verdict_error
from buildctl.validators.render import metric_rows

BVP_DEPLOYMENT = "build-validate-publish/build-validate-publish"


def _short(key: str | None, n: int = 13) -> str:
    return key if key is None or len(key) <= n else key[:n] + "…"


# Run names an on-call engineer can read in the runs list (Prefect calls these in the run).
def _bvp_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"{p['profile']}@{_short(p.get('target_compat_key')) or 'this-host'}"


def _reconcile_run_name() -> str:
    from prefect.runtime import flow_run

    profiles = flow_run.parameters.get("profiles")
    return "reconcile " + (", ".join(profiles) if profiles else "all profiles")


def _upgrade_run_name() -> str:
    from prefect.runtime import flow_run

    return f"driver-upgrade {flow_run.parameters['node_id']}"


def _scrub_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"scrub {'channels' if p.get('channels_only') else 'store'} {float(p.get('sample', 1.0)):.0%}"


def _heal_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"heal {_short(p['artifact_id'], 22)}" + (f" from {p['node_id']}" if p.get("node_id") else "")


def run_settings(store: str | None) -> Settings:
    """This run's settings: the worker's environment, with the flow's ``store`` parameter on top."""
    return load_settings(store=store)


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    raw = "-".join(parts).lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw).strip("-")[:120]


@task(cache_policy=NONE)
def plan_task(settings: Settings, profile_name: str, model: str | None, target_compat_key: str | None):
    profile = pipeline.profile_by_name(settings, profile_name)
    return pipeline.plan_build(settings, pipeline.store_of(settings), profile, model=model,
                               target_compat_key=target_compat_key, say=get_run_logger().info)


def build_slot(settings: Settings):
    """A slot of the build pool's global concurrency limit. ``strict``: a missing limit is an
    error, never silently unlimited."""
    return concurrency(settings.build_limit, occupy=1, strict=True)


@task(cache_policy=NONE)
def build_task(settings: Settings, plan: pipeline.BuildPlan) -> pipeline.BuiltEngine:
    with build_slot(settings):
        return pipeline.run_build(settings, plan, say=get_run_logger().info)


@task(retries=3, retry_delay_seconds=[5, 15, 45], cache_policy=NONE)
def publish_task(settings: Settings, built: pipeline.BuiltEngine) -> str:
    res = pipeline.publish_build(settings, pipeline.store_of(settings), built, say=get_run_logger().info)
    return res.build_key_owner or res.artifact_id


# An inconclusive speed verdict (the machine was too noisy to decide within the budget) is
# retried once with this multiple of the budget before the run fails.
INCONCLUSIVE_RETRY_BUDGET = 2.0


@task(cache_policy=NONE)
def validate_task(settings: Settings, artifact_id: str, compat_key: str, revalidate: bool,
                  speed_budget: float = 1.0) -> ValidationOutcome:
    previous = None if revalidate else pipeline.reusable_attestation(settings, pipeline.store_of(settings), artifact_id,
                                                                      compat_key)
    if previous is not None:
        get_run_logger().info(f"already validated on {compat_key} ({previous.attestation.created_at}): not re-running")
        return ValidationOutcome(previous.attestation_id, previous.attestation, reused=True)
    return validate_in_subprocess(settings, artifact_id, speed_budget=speed_budget)


def validate_with_retry(settings: Settings, artifact_id: str, compat_key: str, revalidate: bool) -> ValidationOutcome:
    """Validate; an inconclusive verdict is retried once with :data:`INCONCLUSIVE_RETRY_BUDGET`
    times the speed budget (both attestations stay on record)."""
    outcome = validate_task(settings, artifact_id, compat_key, revalidate)
    if outcome.attestation.verdict == "inconclusive":
        get_run_logger().warning(f"validation of {artifact_id} inconclusive ({'; '.join(outcome.attestation.reasons)}); "
                                 f"retrying once with {INCONCLUSIVE_RETRY_BUDGET:g}x the speed budget")
        outcome = validate_task.with_options(task_run_name="validate-task-retry")(
            settings, artifact_id, compat_key, True, INCONCLUSIVE_RETRY_BUDGET)
    return outcome


@task(retries=3, retry_delay_seconds=[2, 5, 10], cache_policy=NONE)
def promote_task(settings: Settings, artifact_id: str, channel: str) -> dict[str, Any]:
    return pipeline.promote_artifact(settings, pipeline.store_of(settings), artifact_id, channel).model_dump(mode="json")


@task(retries=3, retry_delay_seconds=[2, 5, 10], cache_policy=NONE)
def recover_task(settings: Settings, artifact_id: str) -> list[dict[str, Any]]:
    """Roll channels off a quarantined artifact (each a history record naming the quarantine)."""
    recs = healing.recover_channels(settings, pipeline.store_of(settings), artifact_id)
    for r in recs:
        get_run_logger().warning(f"{r.profile}/{r.channel} [{r.compat_key}] pointed at quarantined {artifact_id}: "
                                 + (f"rolled back to {r.rolled_back_to} (#{r.seq})" if r.rolled_back_to else r.detail))
    return [{"artifact_id": artifact_id, "profile": r.profile, "channel": r.channel, "compat_key": r.compat_key,
             "rolled_back_to": r.rolled_back_to, "seq": r.seq} for r in recs]


def _versions(tools: dict[str, str | None]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(tools.items()) if v) or "not recorded"


@flow(name="build-validate-publish", flow_run_name=_bvp_run_name, log_prints=True)
def build_validate_publish(profile: str, model: str | None = None, target_compat_key: str | None = None,
                           promote_to: str | None = None, store: str | None = None,
                           revalidate: bool = False, trigger: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build (or take a cache hit), publish, validate, and optionally promote to a non-production
    channel. Every run, failed or not, publishes a summary artifact (``trigger``: what started it,
    passed by the parent flow)."""
    report = RunReport(title=f"{profile} on `{target_compat_key or 'this host'}`", compat_key=target_compat_key)
    report.add("trigger", describe_trigger(trigger))
    try:
        return _build_validate_publish(report, profile, model, target_compat_key, promote_to, store, revalidate,
                                       trigger)
    except BaseException as err:
        report.fail(err)
        raise
    finally:
        create_markdown_artifact(key=_bvp_key(profile, report.compat_key) + "-summary", markdown=report.markdown(),
                                 description=f"{profile}: run summary")


def _bvp_key(profile: str, compat_key: str | None) -> str:
    """The prefix of a build run's artifact keys: its profile and compat key."""
    return artifact_key("bvp", profile, (compat_key or "this-host")[:24])


def _build_validate_publish(report: RunReport, profile: str, model: str | None,
                            target_compat_key: str | None, promote_to: str | None, store: str | None,
                            revalidate: bool, trigger: dict[str, Any] | None) -> dict[str, Any]:
    report.step = "plan"
    if promote_to:
        pipeline.check_automatic_promotion(promote_to)
    settings = run_settings(store)
    plan = plan_task(settings, profile, model, target_compat_key)
    report.compat_key = plan.compat_key
    report.title = f"{profile} on `{plan.compat_key}`"
    report.add("compat key", f"`{plan.compat_key}`")
    report.add("build key", f"`{plan.build_key}`")
    report.add("model", f"`{plan.model_digest}`")
    recovered = [r for aid in plan.quarantined for r in recover_task(settings, aid)]
    if plan.quarantined:
        report.add("healed", f"cached {', '.join(plan.quarantined)} did not deep-verify: quarantined, rebuilt")
    cache_hit = plan.cached is not None
    build_s = 0.0
    if plan.cached is not None:
        artifact_id = plan.cached
        manifest = get_manifest(pipeline.store_of(settings), artifact_id)
        report.add("build", f"cache hit, no builder ran (built {manifest.created_at}; {_versions(manifest.tool_versions)})")
    else:
        report.step = "build"
        built = build_task(settings, plan)
        build_s = built.wall_s
        report.add("build", f"built in {build_s:.1f} s ({_versions(built.tool_versions)})")
        report.step = "publish"
        try:
            artifact_id = publish_task(settings, built)
        finally:
            shutil.rmtree(built.run_dir, ignore_errors=True)
    report.add("artifact", f"`{artifact_id}`")
    report.step = "validate"
    outcome = validate_with_retry(settings, artifact_id, plan.compat_key, revalidate)
    attestation = outcome.attestation
    report.add("attestation", f"`{outcome.attestation_id}` ({attestation.created_at}"
                              + (", validated earlier and reused: not re-run" if outcome.reused else "") + ")")
    report.add("verdict", f"**{attestation.verdict}**" + "".join(f"; {r}" for r in attestation.reasons))
    create_table_artifact(key=_bvp_key(profile, plan.compat_key) + "-validation",
                          table=metric_rows(attestation),
                          description=f"{profile}: candidate vs vLLM reference; attestation `{outcome.attestation_id}` "
                                      f"of `{artifact_id}` (`buildctl show {artifact_id}`)"
                                      + (" — reused from an earlier validation" if outcome.reused else ""))
    promoted = None
    if promote_to and outcome.passed:
        report.step = "promote"
        promoted = promote_task(settings, artifact_id, promote_to)
        report.add("promoted", f"`{promoted['channel']}` #{promoted['seq']}")
    else:
        report.add("promoted", "no" + (" (validation did not pass)" if promote_to else " (no channel asked)"))
    emit_artifact_validated(artifact_id, {"profile": profile, "compat_key": plan.compat_key,
                                          "verdict": attestation.verdict, "attestation_id": outcome.attestation_id,
                                          "node_id": (trigger or {}).get("node_id")})
    if not outcome.passed:
        raise verdict_error(artifact_id, outcome.attestation_id, attestation)
    report.step = "done"
    report.next_steps = [f"buildctl promote {artifact_id} --channel prod   # from CI"]
    return {"artifact_id": artifact_id, "cache_hit": cache_hit, "build_key": plan.build_key,
            "compat_key": plan.compat_key, "verdict": attestation.verdict, "promoted": promoted, "build_s": build_s,
            "attestation_id": outcome.attestation_id, "attestation": attestation.model_dump(mode="json"),
            "quarantined": plan.quarantined, "recovered": recovered, "attestation_reused": outcome.reused}


class ChildRunsFailedError(BuildctlError):
    """Runs a parent flow started did not complete (``runs``: one line each)."""

    def __init__(self, runs: list[str]) -> None:
        self.runs = list(runs)
        super().__init__(f"{len(runs)} child run(s) did not complete: " + "; ".join(runs))


def _wait_for_children(started: list[dict[str, Any]], wait_s: float) -> list[str]:
    """Wait (Prefect's event-driven ``wait_for_flow_run``) for every child until ``wait_s`` has
    passed in all; fill in each one's final state; return a line for each that did not complete."""
    import time

    from prefect.exceptions import FlowRunWaitTimeout
    from prefect.flow_runs import wait_for_flow_run
    from prefect.utilities.asyncutils import run_coro_as_sync

    deadline = time.monotonic() + wait_s
    bad = []
    for child in started:
        try:
            run = run_coro_as_sync(wait_for_flow_run(child["flow_run_id"],
                                                     timeout=max(1, int(deadline - time.monotonic()))))
            st = run.state
            child["state"] = st.name if st else "unknown"
            if st is None or not st.is_completed():
                bad.append(f"{child['profile']}@{child['compat_key']}: {child['state']} "
                           f"({(st.message or '').splitlines()[0] if st and st.message else 'no message'})")
        except FlowRunWaitTimeout:
            child["state"] = "waiting"
            bad.append(f"{child['profile']}@{child['compat_key']}: still waiting after {wait_s:.0f} s; no live worker "
                       f"served its work queue {child.get('work_queue') or '(served deployment)'}")
    return bad


@flow(name="reconcile-fleet", flow_run_name=_reconcile_run_name, log_prints=True)
def reconcile_fleet(profiles: list[str] | None = None, store: str | None = None, wait: bool = True,
                    wait_s: float = 6 * 3600, trigger: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Start a build for every (profile, compat key) the fleet needs and the store lacks, each on
    the work queue of its compat key; with ``wait`` (the default), wait up to ``wait_s`` for them
    and fail if any did not complete, so this run's state is its children's."""
    settings = run_settings(store)
    needs = fleet.fleet_plan(pipeline.store_of(settings), pipeline.load_profiles(settings), profiles)
    logger = get_run_logger()
    started = _start_builds(settings, [(n.profile, n.compat_key, n.nodes) for n in needs],
                            trigger or {"kind": "reconcile"}, None) if needs else []
    if not needs:
        logger.info("every (profile, compat key) the fleet needs has an artifact")
    bad = _wait_for_children(started, wait_s) if wait and started else []
    rows = [{"profile": c["profile"], "compat key": c["compat_key"], "nodes": c["nodes"], "work queue": c["work_queue"] or "",
             "flow run": c["flow_run_id"], "state": c["state"]} for c in started]
    if rows:
        create_table_artifact(key="reconcile-fleet", table=rows, description="builds started for the fleet, and their states")
    if bad:
        raise ChildRunsFailedError(bad)
    return started


def _has_work_pool(deployment: str) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return bool(client.read_deployment_by_name(deployment).work_pool_name)


@flow(name="on-driver-upgrade", flow_run_name=_upgrade_run_name, log_prints=True)
def on_driver_upgrade(node_id: str, fingerprint: dict[str, Any], profiles: list[str] | None = None,
                      store: str | None = None, old_fingerprint: dict[str, Any] | None = None,
                      event_id: str | None = None) -> list[dict[str, Any]]:
    """Record the node's new fingerprint and reconcile the profiles it serves; the builds it starts
    name this node, its old and new compat keys and the event in their summaries."""
    settings = run_settings(store)
    fp = parse_fingerprint(fingerprint, f"event for {node_id}")
    old = parse_fingerprint(old_fingerprint, f"event for {node_id}") if old_fingerprint else None
    s = pipeline.store_of(settings)
    served = fleet.record_reported_fingerprint(s, node_id, fp, profiles)
    backends = sorted({p.engine.backend for n, p in pipeline.load_profiles(settings).items() if n in served})
    keys = {b: (old.compat_key(b) if old else None, fp.compat_key(b)) for b in backends}
    for b, (was, now) in keys.items():
        get_run_logger().info(f"{node_id}: {b} compat key {was or 'none'} -> {now}")
    trigger = {"kind": "driver-upgrade", "node_id": node_id, "event_id": event_id,
               "compat_keys": {b: list(v) for b, v in keys.items()}}
    return reconcile_fleet(profiles=served, store=settings.store, trigger=trigger)


@flow(name="scrub-store", flow_run_name=_scrub_run_name, log_prints=True)
def scrub_store(sample: float = 1.0, channels_only: bool = False, budget_gib: float | None = None,
                store: str | None = None) -> dict[str, Any]:
    """Deep-verify the store, channel-referenced artifacts first; quarantine and report every failure
    as a ``buildctl.artifact.corrupted`` event (an automation heals it)."""
    settings = run_settings(store)
    s = pipeline.store_of(settings)
    report = healing.scrub(settings, s, sample=sample, channels_only=channels_only,
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
    return {"checked_bytes": report.checked_bytes, "corrupt": [r.artifact_id for r in report.corrupt],
            "rows": rows, "events": events}


def _start_builds(settings: Settings, pairs: list[tuple[str, str, int]], trigger: dict[str, Any],
                  promote_to: str | None) -> list[dict[str, Any]]:
    """Start build-validate-publish for each (profile, compat key, nodes) as a subflow run, on the
    work queue of its compat key when the deployment has a work pool."""
    pooled = _has_work_pool(BVP_DEPLOYMENT)
    logger = get_run_logger()
    started = []
    for profile, compat_key, nodes in pairs:
        # With a work pool, each compat key has its own queue, served by workers on matching hosts
        # (`buildctl worker start`); a served deployment (flows.serve) has no pool.
        queue = fleet.work_queue_for(compat_key) if pooled else None
        params = {"profile": profile, "target_compat_key": compat_key, "store": settings.store,
                  "trigger": {**trigger, "nodes": nodes}}
        if promote_to:
            params["promote_to"] = promote_to
        run = run_deployment(BVP_DEPLOYMENT, parameters=params, work_queue_name=queue, timeout=0, as_subflow=True)
        logger.info(f"{profile} for {compat_key} ({nodes} nodes): flow run {run.id}"
                    + (f" on work queue {queue}" if queue else ""))
        started.append({"profile": profile, "compat_key": compat_key, "nodes": nodes, "flow_run_id": str(run.id),
                        "work_queue": queue, "state": "started"})
    return started


def _rebuild_on_matching_workers(settings: Settings, pairs: list[tuple[str, str]], trigger: dict[str, Any],
                                 wait_s: float) -> list[dict[str, Any]]:
    """Rebuild each (profile, compat key) on a worker of that compat key, promote it to staging,
    and report what staging points at afterwards."""
    from buildctl.store.channels import read_channel

    started = _start_builds(settings, [(p, k, 0) for p, k in pairs], trigger, "staging")
    bad = _wait_for_children(started, wait_s)
    if bad:
        raise ChildRunsFailedError(bad)
    out = []
    for child in started:
        rec = read_channel(pipeline.store_of(settings), child["profile"], "staging", child["compat_key"])
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
    ``wait_s``); prod stays on the rolled-back artifact until CI promotes again."""
    settings = run_settings(store)
    logger = get_run_logger()
    rep = healing.heal_artifact(settings, pipeline.store_of(settings), artifact_id, repair_source=repair_from)
    if rep.store_copy_ok:
        logger.info(f"{artifact_id}: the store's copy deep-verifies" + (f"; {node_id}'s own copy was bad" if node_id else ""))
        return {"artifact_id": artifact_id, "store_copy_ok": True, "rebuilt": []}
    logger.warning(f"{artifact_id}: quarantined ({rep.quarantine_key}): {'; '.join(rep.problems)}")
    rebuilt = []
    trigger = {"kind": "heal", "artifact_id": artifact_id, "node_id": node_id}
    if rebuild and rep.rebuild and _has_work_pool(BVP_DEPLOYMENT):
        rebuilt = _rebuild_on_matching_workers(settings, rep.rebuild, trigger, wait_s)
    elif rebuild:  # served or local: this process builds (the target check refuses a foreign compat key)
        for profile, compat_key in rep.rebuild:
            rebuilt.append(build_validate_publish(profile=profile, target_compat_key=compat_key, promote_to="staging",
                                                  store=settings.store, trigger=trigger))
    return {"artifact_id": artifact_id, "store_copy_ok": False, "quarantine_record": rep.quarantine_key,
            "problems": rep.problems,
            "recovered": [{"profile": r.profile, "channel": r.channel, "compat_key": r.compat_key,
                           "rolled_back_to": r.rolled_back_to, "seq": r.seq} for r in rep.recoveries],
            "repaired": rep.repair.replaced if rep.repair else [],
            "rebuilt": [{"artifact_id": b["artifact_id"], "verdict": b["verdict"], "promoted": b["promoted"]}
                        for b in rebuilt]}


def _rollout_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"rollout {p.get('profile') or 'all profiles'}/{p.get('channel', 'prod')}"


@flow(name="rollout-channel", flow_run_name=_rollout_run_name, log_prints=True)
def rollout_channel(channel: str = "prod", profile: str | None = None, store: str | None = None,
                    node_id: str | None = None) -> list[dict[str, Any]]:
    """Move every live rollout on ``channel`` on: advance a wave whose bake time passed within its
    failure budget, complete the last, or halt and roll the channel back when a wave's failures
    exceed its budget (the history record names the failing nodes). Runs on a schedule and on
    ``buildctl.node.engine-health`` events (``node_id``: the reporting node, for the run's log)."""
    settings = run_settings(store)
    logger = get_run_logger()
    views = rollouts.tick(settings, pipeline.store_of(settings), pipeline.signer_of(settings), channel=channel,
                          profile=profile)
    rows = []
    for v in views:
        done = f" -> #{v.applied.seq} ({v.applied.action})" if v.applied else ""
        (logger.warning if v.decision == "halt" else logger.info)(
            f"{v.record.profile}/{channel} [{_short(v.record.compat_key)}] #{v.record.seq}: {v.decision}{done}: {v.why}")
        cur = v.waves[v.record.rollout.wave] if v.record.rollout else None
        rows.append({"profile": v.record.profile, "compat key": _short(v.record.compat_key), "decision": v.decision,
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


@flow(name="resign-channels", log_prints=True)
def resign_channels(store: str | None = None, margin_s: float = 3 * 86400) -> list[dict[str, Any]]:
    """Re-sign every current channel record that expires within ``margin_s`` (TUF's timestamp
    role): nodes refuse expired records, so a frozen or replayed channel cannot linger."""
    settings = run_settings(store)
    signer = pipeline.signer_of(settings)
    if signer is None:
        raise StoreArgumentError("resign-channels needs a signing key (BUILDCTL_SIGNING_KEY on the worker)")
    new = rollouts.resign_due(settings, pipeline.store_of(settings), signer, margin_s=margin_s)
    for rec in new:
        get_run_logger().info(f"re-signed {rec.profile}/{rec.channel} [{_short(rec.compat_key)}] as #{rec.seq}, "
                              f"expires {rec.expires}")
    return [{"profile": r.profile, "channel": r.channel, "compat_key": r.compat_key, "seq": r.seq,
             "expires": r.expires} for r in new]


def _gc_rows(res) -> list[dict[str, Any]]:
    return [{"artifact": d.artifact_id, "profile": d.profile, "compat key": _short(d.compat_key, 24),
             "action": ("remove" if res.dry_run else ("removed" if d.removed else "NOT removed")) if not d.protected_by
             else "keep", "why": d.why_removable if not d.protected_by else "; ".join(d.protected_by)}
            for d in res.decisions]


@flow(name="gc-store", log_prints=True)
def gc_store(store: str | None = None, keep: int = 3, keep_history: int = 5, grace_s: float | None = None,
             quarantine_retention_s: float = 30 * 86400, dry_run_only: bool = False) -> dict[str, Any]:
    """Garbage-collect the store: first a dry run, published as a table of every artifact with
    what keeps it or why nothing does, then (unless ``dry_run_only``) the real run, which decides
    again from what is there then, and its result."""
    settings = run_settings(store)
    s = pipeline.store_of(settings)
    opts: dict[str, Any] = {"keep": keep, "keep_history": keep_history, "quarantine_retention_s": quarantine_retention_s}
    if grace_s is not None:
        opts["grace_s"] = grace_s
    plan = fleet.collect_garbage(settings, s, dry_run=True, **opts)
    create_table_artifact(key="gc-store-plan", table=_gc_rows(plan),
                          description=f"gc dry run: would remove {len(plan.removed_artifacts)} artifacts and "
                                      f"{plan.removed_blobs} blobs ({plan.freed_bytes} bytes); keeps {plan.kept}")
    summary: dict[str, Any] = {"planned": plan.removed_artifacts, "planned_blobs": plan.removed_blobs}
    if dry_run_only:
        return summary
    done = fleet.collect_garbage(settings, s, **opts)
    refused = "\n".join(f"- `{k}`: {why}" for k, why in done.not_removed) or "none"
    create_markdown_artifact(key="gc-store-result", markdown=(
        f"# gc-store\n\nremoved **{len(done.removed_artifacts)}** artifacts and **{done.removed_blobs}** blobs "
        f"({done.freed_bytes} bytes); kept {done.kept} artifacts and {done.kept_blobs} recently touched blobs.\n\n"
        f"Refused by the store (Object Lock, policy): {refused}\n"
        + (f"\n{done.stopped_early}\n" if done.stopped_early else "")))
    for k, why in done.not_removed:
        get_run_logger().warning(f"could not remove {k}: {why}")
    return {**summary, "removed": done.removed_artifacts, "removed_blobs": done.removed_blobs,
            "freed_bytes": done.freed_bytes, "not_removed": [k for k, _ in done.not_removed]}
