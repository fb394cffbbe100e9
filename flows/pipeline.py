"""Prefect flows: thin wrappers over the pipeline functions. Every task is a few lines.

* ``build_validate_publish``: check the target, build (or take a cache hit) under a strict
  concurrency limit, publish (retried: a network step), validate (never retried blindly),
  optionally promote to a non-production channel, and publish Prefect artifacts.
* ``reconcile_fleet``: plan the missing (profile, compat key) pairs from the store's inventory
  and start ``build_validate_publish`` for each on the work queue serving that compat key.
* ``on_driver_upgrade``: started by the ``buildctl.node.driver-upgraded`` event trigger; records
  the node's new fingerprint and reconciles the profiles the node serves.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.concurrency.sync import concurrency
from prefect.deployments import run_deployment

from artifact_store.ops import latest_attestation, promote
from artifact_store.store import open_store
from buildctl import fleet, pipeline
from engines.fingerprint import Fingerprint, parse_fingerprint
from engines.profile import load_profile
from artifact_store.errors import StoreArgumentError
from validators.errors import ValidationFailedError
from validators.validate import validate_in_subprocess

BUILD_LIMIT_ENV = "BUILDCTL_BUILD_LIMIT"
DEFAULT_BUILD_LIMIT = "buildctl-builds"
PROTECTED_CHANNELS = {"prod", "production"}
BVP_DEPLOYMENT = "build-validate-publish/build-validate-publish"


def build_limit_name() -> str:
    """The global concurrency limit builds take a slot of: one per worker or GPU pool."""
    return os.environ.get(BUILD_LIMIT_ENV, DEFAULT_BUILD_LIMIT)


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    raw = "-".join(parts).lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw).strip("-")[:120]


@task(cache_policy=NONE)
def plan_task(store_uri: str | None, profile_name: str, model: str | None, target_compat_key: str | None):
    profile = load_profile(fleet.profile_path(profile_name))
    return pipeline.plan_build(open_store(store_uri), profile, model=model, target_compat_key=target_compat_key,
                               say=get_run_logger().info)


def build_slot():
    """A slot of the build pool's global concurrency limit. ``strict``: a missing limit is an
    error, never silently unlimited."""
    return concurrency(build_limit_name(), occupy=1, strict=True)


@task(cache_policy=NONE)
def build_task(plan: pipeline.BuildPlan) -> pipeline.BuiltEngine:
    with build_slot():
        return pipeline.run_build(plan, say=get_run_logger().info)


@task(retries=3, retry_delay_seconds=[5, 15, 45], cache_policy=NONE)
def publish_task(store_uri: str | None, built: pipeline.BuiltEngine) -> str:
    res = pipeline.publish_build(open_store(store_uri), built, say=get_run_logger().info)
    return res.build_key_owner or res.artifact_id


@task(cache_policy=NONE)
def validate_task(store_uri: str | None, artifact_id: str, compat_key: str, revalidate: bool) -> dict[str, Any]:
    previous = None if revalidate else latest_attestation(open_store(store_uri), artifact_id, compat_key)
    if previous is not None and previous["verdict"] == "pass":
        get_run_logger().info(f"already validated on {compat_key} ({previous['created_at']}): not re-running")
        return previous
    return validate_in_subprocess(store_uri, artifact_id)


@task(retries=3, retry_delay_seconds=[2, 5, 10], cache_policy=NONE)
def promote_task(store_uri: str | None, artifact_id: str, channel: str) -> dict[str, Any]:
    return promote(open_store(store_uri), artifact_id, channel).model_dump(mode="json")


def _publish_prefect_artifacts(profile: str, plan: pipeline.BuildPlan, artifact_id: str, cache_hit: bool,
                               attestation: dict[str, Any], promoted: dict[str, Any] | None) -> None:
    key = artifact_key("bvp", profile, plan.compat_key[:24])
    rows = [{"metric": "parity", "candidate": f"{attestation['parity']['identical']} identical / "
             f"{attestation['parity']['prompts']}", "reference": "vLLM", "ratio": "",
             "gate": "pass" if attestation["parity"]["passed"] else "FAIL"}]
    for lv in attestation["speed"]["levels"]:
        c, r = lv["candidate"], lv["reference"]
        rows.append({"metric": f"output tok/s @ c={lv['concurrency']}", "candidate": round(c["output_tok_s"], 1),
                     "reference": round(r["output_tok_s"], 1), "ratio": round(lv["throughput_ratio"], 3),
                     "gate": "pass" if lv["passed"] else "FAIL"})
        rows.append({"metric": f"p99 TTFT ms @ c={lv['concurrency']}", "candidate": round(c["ttft_p99_ms"], 2),
                     "reference": round(r["ttft_p99_ms"], 2), "ratio": round(lv["p99_ttft_ratio"], 3), "gate": ""})
    create_table_artifact(key=key + "-validation", table=rows, description=f"{profile}: candidate vs vLLM reference")
    md = (f"# {profile} on `{plan.compat_key}`\n\n"
          f"| | |\n|---|---|\n| artifact | `{artifact_id}` |\n| build key | `{plan.build_key}` |\n"
          f"| model | `{plan.model_digest}` |\n| fingerprint | `{plan.fingerprint.digest()}` |\n"
          f"| build | {'cache hit (no builder ran)' if cache_hit else 'built'} |\n"
          f"| verdict | **{attestation['verdict']}** |\n"
          + (f"| promoted | `{promoted['channel']}` #{promoted['seq']} |\n" if promoted else "")
          + "".join(f"\n- {r}" for r in attestation.get("reasons", [])))
    create_markdown_artifact(key=key + "-summary", markdown=md, description=f"{profile}: build summary")


@flow(name="build-validate-publish", log_prints=True)
def build_validate_publish(profile: str, model: str | None = None, target_compat_key: str | None = None,
                           promote_to: str | None = None, store: str | None = None,
                           revalidate: bool = False) -> dict[str, Any]:
    """Build (or take a cache hit), publish, validate, and optionally promote to a non-production channel."""
    if promote_to and promote_to in PROTECTED_CHANNELS:
        raise StoreArgumentError(f"the flow promotes to non-production channels only; promote to {promote_to!r} from CI")
    store = store or os.environ.get("BUILDCTL_STORE")
    plan = plan_task(store, profile, model, target_compat_key)
    cache_hit = plan.cached is not None
    build_s = 0.0
    if cache_hit:
        artifact_id = plan.cached
    else:
        built = build_task(plan)
        build_s = built.wall_s
        try:
            artifact_id = publish_task(store, built)
        finally:
            shutil.rmtree(built.run_dir, ignore_errors=True)
    attestation = validate_task(store, artifact_id, plan.compat_key, revalidate)
    promoted = None
    if promote_to and attestation["verdict"] == "pass":
        promoted = promote_task(store, artifact_id, promote_to)
    _publish_prefect_artifacts(profile, plan, artifact_id, cache_hit, attestation, promoted)
    if attestation["verdict"] != "pass":
        raise ValidationFailedError(artifact_id, attestation.get("attestation_id", "?"), attestation["reasons"])
    return {"artifact_id": artifact_id, "cache_hit": cache_hit, "build_key": plan.build_key,
            "compat_key": plan.compat_key, "verdict": attestation["verdict"], "promoted": promoted, "build_s": build_s,
            "attestation": attestation}


@flow(name="reconcile-fleet", log_prints=True)
def reconcile_fleet(profiles: list[str] | None = None, store: str | None = None, wait: bool = False) -> list[dict[str, Any]]:
    """Start a build for every (profile, compat key) the fleet needs and the store lacks."""
    store = store or os.environ.get("BUILDCTL_STORE")
    needs = fleet.fleet_plan(open_store(store), fleet.load_profiles(), profiles)
    logger = get_run_logger()
    started = []
    pooled = _has_work_pool(BVP_DEPLOYMENT) if needs else False
    for need in needs:
        # With a work pool, each compat key has its own queue, served by workers on matching GPUs;
        # a served deployment (flows.serve) has no pool and runs everything itself.
        run = run_deployment(BVP_DEPLOYMENT, parameters={"profile": need.profile, "target_compat_key": need.compat_key,
                                                         "store": store},
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
    store = store or os.environ.get("BUILDCTL_STORE")
    fp: Fingerprint = parse_fingerprint(fingerprint, f"event for {node_id}")
    s = open_store(store)
    current = fleet.read_node(s, node_id)
    served = profiles if profiles is not None else (list(current[0].profiles) if current else [])
    if current is None or current[0].fingerprint != fp.model_dump(mode="json"):
        fleet.report_node(s, node_id, fp, served)
    return reconcile_fleet(profiles=served, store=store)
