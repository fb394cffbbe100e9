"""The events a flow run sends for an automation reach the server before the run goes on, even
when Prefect's events worker cannot (a real Prefect API: prefect_test_harness)."""

from __future__ import annotations

import asyncio
import time


def server_events(name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    async def go():
        async with get_client() as c:
            return (await c.read_events(filter=EventFilter(event=EventNameFilter(name=[name])), limit=50)).events

    return asyncio.run(go())


def test_an_alert_event_from_a_run_is_on_the_server_when_the_emitter_returns(prefect_api):
    """CI (#30): a busy server made the test process's events worker fail its websocket reconnects and
    drop the events it held, so the scrub's ``buildctl.artifact.corrupted`` and the build's verdict events
    never arrived and no automation could fire. Here the events worker's websocket points at a port
    nobody listens on; the alert must still be on the server, related to its run, when the emitter
    returns."""
    from prefect import flow
    from prefect.events.clients import PrefectEventsClient
    from prefect.events.worker import EventsWorker

    from buildctl.flows.events import emit_artifact_corrupted

    from ..support.s3server import free_ports

    (dead,) = free_ports(1)
    artifact = "xxh3-128:" + format(time.time_ns(), "032x")[-32:]

    @flow(name="alert-delivery")
    def scrub_like() -> tuple[str | None, str]:
        from prefect.runtime import flow_run

        return emit_artifact_corrupted(artifact, {"profile": "tiny", "problems": ["flip"]}), str(flow_run.id)

    EventsWorker.set_client_override(PrefectEventsClient, api_url=f"http://127.0.0.1:{dead}/api",
                                     reconnection_attempts=0)
    try:
        event_id, run_id = scrub_like()
    finally:
        EventsWorker.set_client_override(None)
    assert event_id
    deadline = time.monotonic() + 30  # taken by the API; the server persists in batches
    while not (mine := [e for e in server_events("buildctl.artifact.corrupted") if str(e.id) == event_id]) \
            and time.monotonic() < deadline:
        time.sleep(0.3)
    assert mine, "the alert did not reach the server"
    (got,) = mine
    assert got.resource["prefect.resource.name"] == artifact and got.payload["problems"] == ["flip"]
    related = {r["prefect.resource.id"] for r in got.related}
    assert f"prefect.flow-run.{run_id}" in related and "buildctl.profile.tiny" in related


def test_an_alert_the_server_cannot_take_is_logged_at_error_in_the_run(prefect_api):
    """When the API does not take it either, the run says so at ERROR and goes on."""
    import logging

    from prefect import flow
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from buildctl.flows.events import emit_rollout_halted

    from ..support.s3server import free_ports

    (dead,) = free_ports(1)

    @flow(name="alert-undeliverable")
    def halting() -> str:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{dead}/api"}):
            emit_rollout_halted({"profile": "tiny", "channel": "prod", "compat_key": "k" * 24})
        return "went on"

    class Recorder(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.ERROR)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    # on the run logger itself: Prefect's logging setup may stop it propagating to pytest's caplog
    run_logger, recorder = logging.getLogger("prefect.flow_runs"), Recorder()
    run_logger.addHandler(recorder)
    try:
        assert halting() == "went on"
    finally:
        run_logger.removeHandler(recorder)
    assert any("buildctl.rollout.halted not delivered" in r.getMessage() and r.levelno == logging.ERROR
               for r in recorder.records), [r.getMessage() for r in recorder.records]
