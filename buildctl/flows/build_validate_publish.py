"""``build-validate-publish``: check the target, build (or take a cache hit) under a strict
concurrency limit, publish (retried: a network step), validate (never retried blindly),
optionally promote to a non-production channel, and publish Prefect artifacts. Every decision
is a step of :mod:`buildctl.steps` (build, validate, promote)."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.concurrency.sync import concurrency

from buildctl.steps import healing
from buildctl.steps import build, profiles, promote, validate
from buildctl.artifact_store.layout import blob_key
from buildctl.artifact_store.promotion import next_channel
from buildctl.artifact_store.read import get_manifest
from buildctl.steps.coverage import coverage, describe_soft
from buildctl.engines.fingerprint import host_fingerprint
from buildctl.flows.common import (AutoChannel, ChildRunsFailedError, ProfileName, artifact_key, bvp_run_name,
                                   published_summary, run_settings, start_builds, tool_versions_line, wait_for_children)
from buildctl.flows.events import emit_validation_outcome
from buildctl.flows.summary import RunReport, describe_trigger
from buildctl.core.settings import Settings
from buildctl.steps.validate_process import ValidationOutcome, validate_in_subprocess
from buildctl.validators.errors import ValidatorProcessError, verdict_error
from buildctl.engines.errors import EngineLoadError, HostRequirementsError, IncompatibleTargetError
from buildctl.core.errors import BuildFailedError
from buildctl.core.logtail import log_tail
from buildctl.validators.render import metric_rows, warm_start_line
from buildctl.steps.context import Context, open_store_of


# Run names an on-call engineer can read in the runs list (Prefect calls these in the run).
def _bvp_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return bvp_run_name(p["profile"], p.get("target_compat_key"), p.get("trigger"))


@task(name="plan", task_run_name="plan {profile_name}", cache_policy=NONE)
def plan_task(settings: Settings, profile_name: str, model: str | None, target_compat_key: str | None,
              rebuild_of: str | None = None):
    profile = profiles.profile_by_name(settings, profile_name)
    return build.plan_build(Context.from_settings(settings), profile, model=model,
                               target_compat_key=target_compat_key, rebuild_of=rebuild_of, say=get_run_logger().info)


def build_slot(settings: Settings):
    """A slot of the build pool's global concurrency limit. ``strict``: a missing limit is an
    error, never silently unlimited."""
    return concurrency(settings.build_limit, occupy=1, strict=True)


@task(name="build", task_run_name="build {plan.profile.name}", cache_policy=NONE)
def build_task(settings: Settings, plan: build.BuildPlan) -> build.BuiltEngine | str:
    """The build in a slot of the build limit; a str: the artifact another run published for the
    same build key while this one waited for its slot."""
    return build.build_in_slot(Context.from_settings(settings), plan, build_slot(settings), say=get_run_logger().info)


@task(name="publish", task_run_name="publish", retries=3, retry_delay_seconds=[5, 15, 45], cache_policy=NONE)
def publish_task(settings: Settings, built: build.BuiltEngine) -> str:
    res = build.publish(Context.from_settings(settings), built, say=get_run_logger().info)
    return res.build_key_owner or res.artifact_id


# An inconclusive speed verdict (the machine was too noisy to decide within the budget) is
# retried once with this multiple of the budget before the run fails.
INCONCLUSIVE_RETRY_BUDGET = 2.0


@task(name="validate", task_run_name="validate {artifact_id}", cache_policy=NONE)
def validate_task(settings: Settings, artifact_id: str, compat_key: str, revalidate: bool,
                  speed_budget: float = 1.0) -> ValidationOutcome:
    ctx = Context.from_settings(settings)
    previous = None if revalidate else validate.reusable_attestation(ctx, artifact_id, compat_key, ctx.fingerprint)
    if previous is not None:
        get_run_logger().info(f"already validated on {compat_key} with this host's soft values "
                              f"({previous.attestation.created_at}): not re-running")
        return ValidationOutcome(previous.attestation_id, previous.attestation, reused=True)
    try:
        return validate_in_subprocess(settings, artifact_id, speed_budget=speed_budget, say=get_run_logger().info)
    except ValidatorProcessError as err:  # its one-line cause fails the run; its output's tail is in the log
        if err.tail:
            get_run_logger().warning("the validation process's last lines:\n" + err.tail)
        raise


def validate_with_retry(settings: Settings, artifact_id: str, compat_key: str, revalidate: bool) -> ValidationOutcome:
    """Validate; an inconclusive verdict is retried once with :data:`INCONCLUSIVE_RETRY_BUDGET`
    times the speed budget (both attestations stay on record)."""
    outcome = validate_task(settings, artifact_id, compat_key, revalidate)
    if outcome.attestation.verdict == "inconclusive":
        get_run_logger().warning(f"validation of {artifact_id} inconclusive ({'; '.join(outcome.attestation.reasons)}); "
                                 f"retrying once with {INCONCLUSIVE_RETRY_BUDGET:g}x the speed budget")
        outcome = validate_task.with_options(task_run_name="validate {artifact_id} again, 2x budget")(
            settings, artifact_id, compat_key, True, INCONCLUSIVE_RETRY_BUDGET)
    return outcome


@task(name="promote", task_run_name="promote to {channel}", retries=3, retry_delay_seconds=[2, 5, 10], cache_policy=NONE)
def promote_task(settings: Settings, artifact_id: str, channel: str) -> dict[str, Any]:
    return promote.promote(Context.from_settings(settings), artifact_id, channel).model_dump(mode="json")


@task(name="roll channels back", task_run_name="roll channels off {artifact_id}", retries=3,
      retry_delay_seconds=[2, 5, 10], cache_policy=NONE)
def recover_task(settings: Settings, artifact_id: str) -> list[dict[str, Any]]:
    """Roll channels off a quarantined artifact (each a history record naming the quarantine)."""
    recs = healing.recover_channels(Context.from_settings(settings), artifact_id)
    for r in recs:
        get_run_logger().warning(f"{r.profile}/{r.channel} [{r.compat_key}] pointed at quarantined {artifact_id}: "
                                 + (f"rolled back to {r.rolled_back_to} (#{r.seq})" if r.rolled_back_to else r.detail))
    return [{"artifact_id": artifact_id, "profile": r.profile, "channel": r.channel, "compat_key": r.compat_key,
             "rolled_back_to": r.rolled_back_to, "seq": r.seq} for r in recs]


@flow(name="build-validate-publish", flow_run_name=_bvp_run_name, log_prints=True)
def build_validate_publish(profile: ProfileName, model: str | None = None, target_compat_key: str | None = None,
                           promote_to: AutoChannel | None = None, store: str | None = None,
                           revalidate: bool = False, trigger: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build (or take a cache hit), publish, validate, and optionally promote to a non-production
    channel. Every run, failed or not, publishes a summary artifact.

    Args:
        profile: The build profile (a file in build_profiles/).
        model: A model directory to build from instead of the profile's own.
        target_compat_key: The compat key to build for; the worker's host must have it (default: the worker's own).
        promote_to: Promote a passing artifact to this channel (staging only; CI promotes to prod).
        store: The artifact store URI (default: the worker's BUILDCTL_STORE).
        revalidate: Validate again even when a passing attestation covers this host.
        trigger: What started the run, passed by the parent flow (shown in the summary).
    """
    report = RunReport(title=f"{profile} on `{target_compat_key or 'this host'}`", compat_key=target_compat_key)
    report.add("trigger", describe_trigger(trigger))
    with published_summary(report, lambda: _bvp_key(profile, report.compat_key) + "-summary", f"{profile}: run summary"):
        return _build_validate_publish(report, profile, model, target_compat_key, promote_to, store, revalidate,
                                       trigger)


def _build_and_publish(report: RunReport, settings: Settings, plan: build.BuildPlan,
                       done: str) -> tuple[str, bool, float]:
    """Build in a slot and publish: (artifact, whether it was a concurrent run's, build seconds)."""
    report.step = "build"
    try:
        built = build_task(settings, plan)
    except BuildFailedError as err:  # the log stays on the worker's disk: its tail goes on the run's page
        if getattr(err, "log_path", None):
            _log_artifact(plan, f"kept on worker `{socket.gethostname()}` at `{err.log_path}`", Path(err.log_path))
        raise
    if isinstance(built, str):  # published by a concurrent run while this one waited for its slot
        report.add("build", "a concurrent run built this build key while this one waited for its slot: taken, "
                            "no builder ran")
        return built, True, 0.0
    report.add("build", f"{done} in {built.wall_s:.1f} s ({tool_versions_line(built.tool_versions)})")
    report.step = "publish"
    try:
        artifact_id = publish_task(settings, built)
        store = open_store_of(settings)
        log = get_manifest(store, artifact_id).build_log
        where = (f"in the store with the artifact: `{store.uri.rstrip('/')}/{blob_key(log)}` "
                 f"(`buildctl show {artifact_id}`)") if log else "not kept"
        _log_artifact(plan, where, built.log_path)
        return artifact_id, False, built.wall_s
    finally:
        shutil.rmtree(built.run_dir, ignore_errors=True)


def _log_artifact(plan: build.BuildPlan, where: str, log_path: Path) -> None:
    """The build log on the run's page: where it lives, and its last lines."""
    tail = log_tail(log_path).replace("```", "` ` `")
    create_markdown_artifact(key=_bvp_key(plan.profile.name, plan.compat_key) + "-build-log",
                             markdown=f"# build log\n\n{where}\n\nLast lines:\n\n```\n{tail}\n```\n",
                             description=f"{plan.profile.name}: the build's log")


def check_recheck_worker(settings: Settings, plan: build.BuildPlan, trigger: dict[str, Any] | None) -> None:
    """A driver upgrade's re-check names the node's soft values (``trigger["soft"]``): a worker
    whose own differ refuses it (:class:`WrongRecheckWorkerError`), so it never ends green on
    values nobody checked."""
    from buildctl.steps import fleet
    from buildctl.engines.errors import WrongRecheckWorkerError

    wanted = (trigger or {}).get("soft")
    if not (trigger or {}).get("recheck") or wanted is None:
        return
    have = host_fingerprint(settings).soft_fields(plan.profile.engine.backend)
    if have != wanted:
        raise WrongRecheckWorkerError(describe_soft(wanted), describe_soft(have),
                                      fleet.recheck_queue_for(plan.compat_key, wanted))


def _this_run_pool_and_queue() -> tuple[str | None, str | None]:
    """The work pool and queue of the running flow run: (None, None) for a served or in-process run."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None, None
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
    return run.work_pool_name, run.work_queue_name


HAND_STARTED_WAIT_S = 6 * 3600  # how long a hand-started run waits for the builds it routed


def _route_hand_started(report: RunReport, settings: Settings, profile: str, target_compat_key: str | None,
                        promote_to: str | None, trigger: dict[str, Any] | None,
                        err: HostRequirementsError | IncompatibleTargetError) -> dict[str, Any] | None:
    """A run started by hand or from the UI (no ``trigger``: parent flows always pass one) that
    landed on a worker whose host cannot build it goes where a parent flow would have sent it
    (:func:`buildctl.steps.fleet.hand_started_queues`), and waits for those runs; it never builds here.
    None: not such a run (served, in-process, a parent's child, or already on the queue it would
    go to), and the error stands."""
    from prefect.client.orchestration import get_client

    from buildctl.steps import fleet

    pool, queue = _this_run_pool_and_queue()
    if trigger or pool is None:
        return None
    backend = profiles.profile_by_name(settings, profile).engine.backend
    with get_client(sync_client=True) as client:
        rows = [(q.name, str(getattr(q.status, "value", q.status)) == "READY" and q.name != queue)
                for q in client.read_work_queues(work_pool_name=pool)]
    why = "; ".join(err.unmet) if isinstance(err, HostRequirementsError) else str(err).splitlines()[0]
    targets = [q for q in fleet.hand_started_queues(profile, backend, pool, target_compat_key, rows, why) if q != queue]
    if not targets:
        return None
    report.add("routed", f"this worker cannot build {profile} ({why}): started on "
               + ", ".join(f"`{q}`" for q in targets))
    started = start_builds(settings, [(profile, q, 0) for q in targets],
                           {"kind": "by-hand", "routed_from": queue or "default"}, promote_to)
    report.step = "wait"
    bad = wait_for_children(started, HAND_STARTED_WAIT_S)
    report.add("routed runs", "; ".join(f"`{c['compat_key']}`: {c['state']}" for c in started))
    if bad:
        raise ChildRunsFailedError(bad)
    report.step = "done"
    report.next_steps = [f"buildctl ls --profile {profile}   # the routed runs' artifacts"]
    return {"routed": [{"compat_key": c["compat_key"], "flow_run_id": c["flow_run_id"], "state": c["state"]}
                       for c in started]}


def _bvp_key(profile: str, compat_key: str | None) -> str:
    """The prefix of a build run's artifact keys: its profile and compat key."""
    return artifact_key("bvp", profile, (compat_key or "this-host")[:24])


def _build_validate_publish(report: RunReport, profile: str, model: str | None,
                            target_compat_key: str | None, promote_to: str | None, store: str | None,
                            revalidate: bool, trigger: dict[str, Any] | None) -> dict[str, Any]:
    report.step = "plan"
    if promote_to:
        promote.check_automatic_promotion(promote_to)
    settings = run_settings(store)
    try:
        plan = plan_task(settings, profile, model, target_compat_key)
    except (HostRequirementsError, IncompatibleTargetError) as err:
        routed = _route_hand_started(report, settings, profile, target_compat_key, promote_to, trigger, err)
        if routed is None:
            raise
        return routed
    report.compat_key = plan.compat_key
    check_recheck_worker(settings, plan, trigger)
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
        manifest = get_manifest(open_store_of(settings), artifact_id)
        report.add("build", f"cache hit, no builder ran (built {manifest.created_at}; {tool_versions_line(manifest.tool_versions)})")
    else:
        artifact_id, cache_hit, build_s = _build_and_publish(report, settings, plan, "built")
    report.add("artifact", f"`{artifact_id}`")
    report.step = "validate"
    ctx = Context.from_settings(settings)
    recheck = None
    if cache_hit and not revalidate:  # existing bytes: is this host's set of soft values already validated?
        manifest = get_manifest(ctx.store, artifact_id)
        cov = coverage(ctx.store, artifact_id, manifest, plan.fingerprint)
        if not cov.covered and cov.validated_on:
            recheck = cov
            get_run_logger().info(f"{artifact_id}: {cov.describe()}; re-checking on this host before any rebuild")
    t0 = time.monotonic()
    try:
        outcome = validate_with_retry(settings, artifact_id, plan.compat_key, revalidate)
        failed = None if outcome.passed else "; ".join(outcome.attestation.reasons) or outcome.attestation.verdict
    except (ValidatorProcessError, EngineLoadError, IncompatibleTargetError) as err:
        if recheck is None:
            raise
        failed = f"it did not load here: {str(err).splitlines()[0]}"  # a soft change can break loading
    if recheck is not None and failed is None:
        report.add("re-check", f"re-checked on {describe_soft(recheck.soft)}, no rebuild ({time.monotonic() - t0:.0f} s)")
    elif recheck is not None:
        report.add("re-check", f"re-check failed ({failed}): rebuilt")
        get_run_logger().warning(f"re-check of {artifact_id} on {describe_soft(recheck.soft)} failed ({failed}): rebuilding")
        report.step = "build"
        failed_recheck = artifact_id
        plan = plan_task.with_options(task_run_name="plan {profile_name} rebuild")(settings, profile, model, target_compat_key,
                                                                         failed_recheck)
        report.add("build key", f"`{plan.build_key}` (a rebuild of `{failed_recheck}` for these soft values)")
        if plan.cached is not None:
            artifact_id, cache_hit = plan.cached, True
        else:
            artifact_id, cache_hit, build_s = _build_and_publish(report, settings, plan, "rebuilt")
        report.add("artifact", f"`{artifact_id}`")
        report.step = "validate"
        outcome = validate_with_retry(settings, artifact_id, plan.compat_key, revalidate)
    attestation = outcome.attestation
    report.add("attestation", f"`{outcome.attestation_id}` ({attestation.created_at}"
                              + (", validated earlier and reused: not re-run" if outcome.reused else "") + ")")
    report.add("verdict", f"**{attestation.verdict}**" + "".join(f"; {r}" for r in attestation.reasons))
    if attestation.warm_start is not None:
        report.add("warm start", warm_start_line(attestation))
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
    emit_validation_outcome(artifact_id, attestation.verdict,
                            {"profile": profile, "compat_key": plan.compat_key, "attestation_id": outcome.attestation_id,
                             "node_id": (trigger or {}).get("node_id")},
                            next_channel=next_channel(promoted["channel"] if promoted else None))
    if not outcome.passed:
        raise verdict_error(artifact_id, outcome.attestation_id, attestation)
    report.step = "done"
    report.next_steps = [f"buildctl promote {artifact_id} --channel prod   # from CI"]
    return {"artifact_id": artifact_id, "cache_hit": cache_hit, "build_key": plan.build_key,
            "compat_key": plan.compat_key, "verdict": attestation.verdict, "promoted": promoted, "build_s": build_s,
            "attestation_id": outcome.attestation_id, "attestation": attestation.model_dump(mode="json"),
            "quarantined": plan.quarantined, "recovered": recovered, "attestation_reused": outcome.reused,
            "rechecked": recheck is not None, "recheck_passed": recheck is not None and plan.rebuild_of is None,
            "rebuild_of": plan.rebuild_of}

