"""buildctl.flows.common against a real Prefect API (prefect_test_harness)."""

from __future__ import annotations


def test_a_deployment_the_server_lacks_has_no_work_pool(prefect_api):
    """A heal run on a server where build-validate-publish was never deployed (its flows called
    directly, as scripts/ui-screenshots.sh does) crashed with Prefect's ObjectNotFound instead of
    rebuilding in its own process."""
    from buildctl.flows.common import has_work_pool, work_pool_type

    assert work_pool_type("build-validate-publish/not-deployed-here") is None
    assert has_work_pool("build-validate-publish/not-deployed-here") is False
