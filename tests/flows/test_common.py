"""buildctl.flows.common against a real Prefect API (prefect_test_harness)."""

from __future__ import annotations


def test_a_deployment_the_server_lacks_has_no_work_pool(prefect_api):
    """A heal run on a server where build-validate-publish was never deployed (its flows called
    directly, as scripts/ui-screenshots.sh does) crashed with Prefect's ObjectNotFound instead of
    rebuilding in its own process."""
    from buildctl.flows.common import has_work_pool, work_pool_type

    assert work_pool_type("build-validate-publish/not-deployed-here") is None
    assert has_work_pool("build-validate-publish/not-deployed-here") is False


def test_a_child_whose_final_event_came_before_its_state_is_read_again(prefect_api, monkeypatch):
    """Prefect's wait_for_flow_run returns on the child's final-state event and reads the run once:
    on a busy server that read still said Running (the routing test's prepare-upgrade failed with
    "1 child run(s) did not complete: ...: Running (no message)" while the child completed 0.1 s
    later). The parent reads the run again until its state is final."""
    import prefect.flow_runs
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from buildctl.flows.common import wait_for_children

    @flow(name="buildctl-child-probe")
    def probe() -> None:
        return None

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe)
        client.set_flow_run_state(run.id, Running(), force=True)
        client.set_flow_run_state(run.id, Completed(), force=True)
        stale = client.read_flow_run(run.id).model_copy(update={"state": Running()})

    async def early(flow_run_id, timeout=10800, **kw):  # the race, made certain: the state read before it was final
        return stale

    monkeypatch.setattr(prefect.flow_runs, "wait_for_flow_run", early)
    started = [{"flow_run_id": str(run.id), "profile": "p", "compat_key": "k"}]
    assert wait_for_children(started, 30) == []
    assert started[0]["state"] == "Completed"
