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

from buildctl import fleet, healing, pipeline
from buildctl.engines.fingerprint import parse_fingerprint
from buildctl.settings import Settings, load_settings
from buildctl.store.attestations import Attestation
from buildctl.flows.events import emit_artifact_corrupted
from buildctl.store.verify import get_manifest
from buildctl.validate_process import ValidationOutcome, validate_in_subprocess
from buildctl.validators.errors import ValidationFailedError, ValidationInconclusiveError
from buildctl.validators.render import headline, metric_rows

BVP_DEPLOYMENT = "build-validate-publish/build-validate-publish"


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
        return ValidationOutcome(previous.attestation_id, previous.attestation)
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


def _publish_prefect_artifacts(profile: str, plan: pipeline.BuildPlan, artifact_id: str, cache_hit: bool,
                               attestation: Attestation, promoted: dict[str, Any] | None) -> None:
    key = artifact_key("bvp", profile, plan.compat_key[:24])
    create_table_artifact(key=key + "-validation", table=metric_rows(attestation),
                          description=f"{profile}: candidate vs vLLM reference")
    md = (f"# {profile} on `{plan.compat_key}`\n\n"
          f"| | |\n|---|---|\n| artifact | `{artifact_id}` |\n| build key | `{plan.build_key}` |\n"
          f"| model | `{plan.model_digest}` |\n| fingerprint | `{plan.fingerprint.digest()}` |\n"
          f"| build | {'cache hit (no builder ran)' if cache_hit else 'built'} |\n"
          f"| verdict | **{attestation.verdict}** |\n"
          + (f"| promoted | `{promoted['channel']}` #{promoted['seq']} |\n" if promoted else "")
          + "".join(f"\n- {v}" for k, v in headline(attestation) if k == "reason"))
    create_markdown_artifact(key=key + "-summary", markdown=md, description=f"{profile}: build summary")


@flow(name="build-validate-publish", log_prints=True)
def build_validate_publish(profile: str, model: str | None = None, target_compat_key: str | None = None,
                           promote_to: str | None = None, store: str | None = None,
                           revalidate: bool = False) -> dict[str, Any]:
    """Build (or take a cache hit), publish, validate, and optionally promote to a non-production channel."""
    if promote_to:
        pipeline.check_automatic_promotion(promote_to)
    settings = run_settings(store)
    plan = plan_task(settings, profile, model, target_compat_key)
    recovered = [r for aid in plan.quarantined for r in recover_task(settings, aid)]
    cache_hit = plan.cached is not None
    build_s = 0.0
    if plan.cached is not None:
        artifact_id = plan.cached
    else:
        built = build_task(settings, plan)
        build_s = built.wall_s
        try:
            artifact_id = publish_task(settings, built)
        finally:
            shutil.rmtree(built.run_dir, ignore_errors=True)
    outcome = validate_with_retry(settings, artifact_id, plan.compat_key, revalidate)
    attestation = outcome.attestation
    promoted = None
    if promote_to and outcome.passed:
        promoted = promote_task(settings, artifact_id, promote_to)
    _publish_prefect_artifacts(profile, plan, artifact_id, cache_hit, attestation, promoted)
    if not outcome.passed:
        error = ValidationInconclusiveError if attestation.verdict == "inconclusive" else ValidationFailedError
        raise error(artifact_id, outcome.attestation_id, attestation)
    return {"artifact_id": artifact_id, "cache_hit": cache_hit, "build_key": plan.build_key,
            "compat_key": plan.compat_key, "verdict": attestation.verdict, "promoted": promoted, "build_s": build_s,
            "attestation_id": outcome.attestation_id, "attestation": attestation.model_dump(mode="json"),
            "quarantined": plan.quarantined, "recovered": recovered}


@flow(name="reconcile-fleet", log_prints=True)
def reconcile_fleet(profiles: list[str] | None = None, store: str | None = None, wait: bool = False) -> list[dict[str, Any]]:
    """Start a build for every (profile, compat key) the fleet needs and the store lacks."""
    settings = run_settings(store)
    needs = fleet.fleet_plan(pipeline.store_of(settings), pipeline.load_profiles(settings), profiles)
    logger = get_run_logger()
    started = []
    pooled = _has_work_pool(BVP_DEPLOYMENT) if needs else False
    for need in needs:
        # With a work pool, each compat key has its own queue, served by workers on matching GPUs;
        # a served deployment (flows.serve) has no pool and runs everything itself.
        run = run_deployment(BVP_DEPLOYMENT, parameters={"profile": need.profile, "target_compat_key": need.compat_key,
                                                         "store": settings.store},
                             work_queue_name=fleet.work_queue_for(need.compat_key) if pooled else None,
                             timeout=None if wait else 0, as_subflow=True)
        logger.info(f"{need.profile} for {need.compat_key} ({need.nodes} nodes): flow run {run.id}")
        started.append({"profile": need.profile, "compat_key": need.compat_key, "nodes": need.nodes,
                        "flow_run_id": str(run.id)})
    if not needs:
        logger.info("every (profile, compat key) the fleet needs has an artifact")
    return started


def _has_work_pool(deployment: str) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return bool(client.read_deployment_by_name(deployment).work_pool_name)


@flow(name="on-driver-upgrade", log_prints=True)
def on_driver_upgrade(node_id: str, fingerprint: dict[str, Any], profiles: list[str] | None = None,
                      store: str | None = None) -> list[dict[str, Any]]:
    """Record the node's new fingerprint and reconcile the profiles it serves."""
    settings = run_settings(store)
    fp = parse_fingerprint(fingerprint, f"event for {node_id}")
    served = fleet.record_reported_fingerprint(pipeline.store_of(settings), node_id, fp, profiles)
    return reconcile_fleet(profiles=served, store=settings.store)


@flow(name="scrub-store", log_prints=True)
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


@flow(name="heal-artifact", log_prints=True)
def heal_artifact(artifact_id: str, node_id: str | None = None, repair_from: str | None = None,
                  rebuild: bool = True, store: str | None = None) -> dict[str, Any]:
    """Deep verify the store's copy -> quarantine -> roll channels back -> repair or rebuild.

    Started by ``buildctl.node.pull-failed`` and ``buildctl.artifact.corrupted``. Only a failing
    store copy is quarantined: a node whose own disk is bad does not take a good artifact out of
    service. The rebuild takes the normal path (build, publish, validate, promote to staging);
    prod stays on the rolled-back artifact until CI promotes again."""
    settings = run_settings(store)
    logger = get_run_logger()
    rep = healing.heal_artifact(settings, pipeline.store_of(settings), artifact_id, repair_source=repair_from)
    if rep.store_copy_ok:
        logger.info(f"{artifact_id}: the store's copy deep-verifies" + (f"; {node_id}'s own copy was bad" if node_id else ""))
        return {"artifact_id": artifact_id, "store_copy_ok": True, "rebuilt": []}
    logger.warning(f"{artifact_id}: quarantined ({rep.quarantine_key}): {'; '.join(rep.problems)}")
    rebuilt = []
    if rebuild:
        for profile, compat_key in rep.rebuild:
            rebuilt.append(build_validate_publish(profile=profile, target_compat_key=compat_key, promote_to="staging",
                                                  store=settings.store))
    return {"artifact_id": artifact_id, "store_copy_ok": False, "quarantine_record": rep.quarantine_key,
            "problems": rep.problems,
            "recovered": [{"profile": r.profile, "channel": r.channel, "compat_key": r.compat_key,
                           "rolled_back_to": r.rolled_back_to, "seq": r.seq} for r in rep.recoveries],
            "repaired": rep.repair.replaced if rep.repair else [],
            "rebuilt": [{"artifact_id": b["artifact_id"], "verdict": b["verdict"], "promoted": b["promoted"]}
                        for b in rebuilt]}
