"""What the flows share: the run's settings, Prefect artifact keys, and starting child
build runs on the work queue of their compat key and waiting for them."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.deployments import run_deployment

from buildctl.steps import fleet
from buildctl.steps.profiles import load_profiles, profile_names
from buildctl.core.errors import BuildctlError
from buildctl.flows.summary import RunReport
from buildctl.core.settings import Settings, load_settings

BVP_DEPLOYMENT = "build-validate-publish/build-validate-publish"


def _profile_names() -> tuple[str, ...]:
    """The profiles in the profile directory (``BUILDCTL_PROFILE_DIR``, default ``build_profiles/``
    of the checkout the flows are deployed from)."""
    try:
        return profile_names(load_settings())
    except (OSError, BuildctlError):
        return ()


_SHIPPED = _profile_names()


#: A deployment parameter naming a profile: its allowed values are the profiles shipped, so the
#: Prefect API refuses a mistyped name when the run is created (``enforce_parameter_schema``).
ProfileName = Literal[_SHIPPED] if _SHIPPED else str  # type: ignore[valid-type]
#: The channels a flow may promote to by itself (prod is CI's: ``buildctl promote``).
AutoChannel = Literal["staging"]


@contextmanager
def published_summary(report: RunReport, key: Callable[[], str], description: str) -> Iterator[RunReport]:
    """Run the block and publish ``report`` as the run's markdown summary however it ends: a
    failure is recorded in it (step, one-line cause, what to do next) and raised again. ``key`` is
    called at the end (a build run's key names the compat key it planned)."""
    try:
        yield report
    except BaseException as err:
        report.fail(err)
        raise
    finally:
        create_markdown_artifact(key=key(), markdown=report.markdown(), description=description)


def bvp_run_name(profile: str, compat_key: str | None, trigger: dict[str, Any] | None = None) -> str:
    """A build run's name, ``PROFILE@COMPAT-KEY… WHAT``: given when the run is created, so a child
    run waiting on its queue is readable before it starts. WHAT says what the run does: ``build``,
    ``re-check`` (a driver upgrade's, on the node's soft values), ``heal`` (a quarantined
    artifact's rebuild), ``by hand`` (started from the UI or the CLI: no parent)."""
    kind = (trigger or {}).get("kind")
    what = ("re-check" if (trigger or {}).get("recheck") else "heal" if kind == "heal"
            else "build" if trigger else "by hand")
    return f"{profile}@{short(compat_key) or 'this-host'} {what}"


def short(key: str | None, n: int = 13) -> str:
    return key if key is None or len(key) <= n else key[:n] + "…"


def run_settings(store: str | None) -> Settings:
    """This run's settings: the worker's environment, with the flow's ``store`` parameter on top."""
    return load_settings(store=store)


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    raw = "-".join(parts).lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw).strip("-")[:120]


def tool_versions_line(tools: dict[str, str | None]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(tools.items()) if v) or "not recorded"


class ChildRunsFailedError(BuildctlError):
    """Runs a parent flow started did not complete (``runs``: one line each)."""

    def __init__(self, runs: list[str]) -> None:
        self.runs = list(runs)
        super().__init__(f"{len(runs)} child run(s) did not complete: " + "; ".join(runs))


def wait_for_children(started: list[dict[str, Any]], wait_s: float) -> list[str]:
    """Wait (Prefect's event-driven ``wait_for_flow_run``) for every child until ``wait_s`` has
    passed in all; fill in each one's final state; return a line for each that did not complete."""
    import time

    from prefect.exceptions import FlowRunWaitTimeout
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import wait_for_flow_run
    from prefect.utilities.asyncutils import run_coro_as_sync

    deadline = time.monotonic() + wait_s
    bad = []
    for child in started:
        try:
            run = run_coro_as_sync(wait_for_flow_run(child["flow_run_id"],
                                                     timeout=max(1, int(deadline - time.monotonic()))))
            st = run.state
            # wait_for_flow_run returns on the final-state event and reads the run once; on a busy
            # server that read can still see the state before it (Running): read until it is final.
            with get_client(sync_client=True) as client:
                while (st is None or not st.is_final()) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    st = client.read_flow_run(child["flow_run_id"]).state
            child["state"] = st.name if st else "unknown"
            if st is None or not st.is_completed():
                bad.append(f"{child['profile']}@{child['compat_key']}: {child['state']} "
                           f"({(st.message or '').splitlines()[0] if st and st.message else 'no message'})")
        except FlowRunWaitTimeout:
            child["state"] = "waiting"
            bad.append(f"{child['profile']}@{child['compat_key']}: still waiting after {wait_s:.0f} s; no live worker "
                       f"served its work queue {child.get('work_queue') or '(served deployment)'}")
    return bad


def work_pool_type(deployment: str) -> str | None:
    """The type of the deployment's work pool (``process``, ``kubernetes``, ...); None when it has
    none (a served deployment) or the server has no such deployment (its flows called directly):
    then the caller's own process does the work."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_deployment_by_name(deployment).work_pool_name
        except ObjectNotFound:
            return None
        return client.read_work_pool(pool).type if pool else None


def has_work_pool(deployment: str) -> bool:
    return work_pool_type(deployment) is not None


def start_builds(settings: Settings, pairs: list[tuple[str, str, int]], trigger: dict[str, Any],
                  promote_to: str | None, queues: list[str | None] | None = None,
                  triggers: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Start build-validate-publish for each (profile, compat key, nodes) as a subflow run, on the
    work queue of its compat key when the deployment has a work pool (``queues``: another queue
    for a pair, e.g. a re-check's soft-values queue; ``triggers``: a trigger per pair)."""
    pool_type = work_pool_type(BVP_DEPLOYMENT)
    pooled = pool_type is not None
    profiles = load_profiles(settings) if pool_type == "kubernetes" else {}
    logger = get_run_logger()
    started = []
    for i, (profile, compat_key, nodes) in enumerate(pairs):
        # With a work pool, each compat key has its own queue, served by workers on matching hosts
        # (`buildctl worker start`); a served deployment (flows.serve) has no pool.
        wanted = queues[i] if queues is not None and queues[i] else fleet.work_queue_for(compat_key)
        queue = wanted if pooled else None
        params = {"profile": profile, "target_compat_key": compat_key, "store": settings.store,
                  "trigger": {**(triggers[i] if triggers is not None else trigger), "nodes": nodes}}
        if promote_to:
            params["promote_to"] = promote_to
        # A Kubernetes pool's job takes the profile's GPUs and is pinned to nodes labelled with the key.
        jobs = fleet.job_variables(settings, profiles[profile], compat_key) if profile in profiles else None
        run = run_deployment(BVP_DEPLOYMENT, parameters=params, work_queue_name=queue, timeout=0, as_subflow=True,
                             flow_run_name=bvp_run_name(profile, compat_key, params["trigger"]), job_variables=jobs)
        logger.info(f"{profile} for {compat_key} ({nodes} nodes): flow run {run.id}"
                    + (f" on work queue {queue}" if queue else ""))
        started.append({"profile": profile, "compat_key": compat_key, "nodes": nodes, "flow_run_id": str(run.id),
                        "work_queue": queue, "state": "started"})
    return started
