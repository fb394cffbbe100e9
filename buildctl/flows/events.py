"""Prefect events: what node agents and the scrub report. The only flows module the CLI imports
(lazily); without Prefect installed (a node's slim install) every emitter returns ``None`` and the
report stays recorded in the store, where the nightly flows find it."""

from __future__ import annotations

from typing import Any

from buildctl.core.errors import EventNotDeliveredError
from buildctl.steps.fleet import DRIVER_UPGRADED

PULL_FAILED = "buildctl.node.pull-failed"
ENGINE_HEALTH = "buildctl.node.engine-health"
ARTIFACT_CORRUPTED = "buildctl.artifact.corrupted"
ARTIFACT_VALIDATED = "buildctl.artifact.validated"
ARTIFACT_VALIDATION_FAILED = "buildctl.artifact.validation-failed"
ARTIFACT_INCONCLUSIVE = "buildctl.artifact.inconclusive"
ARTIFACT_PROMOTABLE = "buildctl.artifact.promotable"
ROLLOUT_HALTED = "buildctl.rollout.halted"
ROLLOUT_STARTED = "buildctl.rollout.started"
#: A node moved a served model to a fallback runtime, or back to (or first onto) its preferred one:
#: the "node on its fallback" alert waits for the second after the first.
RUNTIME_FALLBACK = "buildctl.node.runtime-fallback"
RUNTIME_PREFERRED = "buildctl.node.runtime-preferred"
#: The event a validation verdict emits (``promotable`` follows ``validated`` when the next
#: channel's gates can be met).
VERDICT_EVENTS = {"pass": ARTIFACT_VALIDATED, "fail": ARTIFACT_VALIDATION_FAILED, "inconclusive": ARTIFACT_INCONCLUSIVE}


def resource_id(node_id: str) -> str:
    return f"buildctl.node.{node_id}"


def artifact_resource_id(artifact_id: str) -> str:
    return f"buildctl.artifact.{artifact_id.removeprefix('xxh3-128:')}"


def related_resources(artifact_id: str | None = None, profile: str | None = None,
                      compat_key: str | None = None, node_id: str | None = None,
                      profiles: list[str] | None = None, compat_keys: list[str] | None = None) -> list[dict[str, str]]:
    """Related resources, so the UI links an event to the artifact, profiles, compat keys and node
    (an event emitted inside a flow run also carries the run, added by Prefect)."""
    out = []
    if node_id:
        out.append({"prefect.resource.id": resource_id(node_id), "prefect.resource.role": "node",
                    "prefect.resource.name": node_id})
    for name in profiles or []:
        out.append({"prefect.resource.id": f"buildctl.profile.{name}", "prefect.resource.role": "profile",
                    "prefect.resource.name": name})
    for key in compat_keys or []:
        out.append({"prefect.resource.id": f"buildctl.compat-key.{key}", "prefect.resource.role": "compat-key",
                    "prefect.resource.name": key})
    if artifact_id:
        out.append({"prefect.resource.id": artifact_resource_id(artifact_id), "prefect.resource.role": "artifact",
                    "prefect.resource.name": artifact_id})
    if profile:
        out.append({"prefect.resource.id": f"buildctl.profile.{profile}", "prefect.resource.role": "profile",
                    "prefect.resource.name": profile})
    if compat_key:
        out.append({"prefect.resource.id": f"buildctl.compat-key.{compat_key}", "prefect.resource.role": "compat-key",
                    "prefect.resource.name": compat_key})
    return out


def _emit(event: str, resource: dict[str, str], payload: dict[str, Any],
          related: list[dict[str, str]] | None = None) -> str | None:
    """Queue one event on Prefect's events worker (its websocket), for a node's CLI: outside a
    run it is drained before returning."""
    try:
        from prefect.events import emit_event
        from prefect.settings import PREFECT_API_URL
    except ImportError:
        return None
    if not PREFECT_API_URL.value():  # no server to receive it (emitting would start a temporary one)
        return None
    import logging

    from prefect.context import FlowRunContext
    from prefect.events.worker import EventsWorker

    sent = emit_event(event=event, resource=resource, payload=payload, related=related or None)
    if FlowRunContext.get() is None:
        # Outside a run (the node agent, a short-lived CLI process): deliver it now, not in an exit
        # hook, so it is neither lost nor followed by Prefect's "Still processing items" noise.
        logging.getLogger("EventsWorker").setLevel(logging.ERROR)  # its "Still processing items" while draining
        EventsWorker.drain_all(timeout=10)
    return str(sent.id) if sent is not None else None


def _deliver(event: str, resource: dict[str, str], payload: dict[str, Any],
             related: list[dict[str, str]] | None = None) -> str | None:
    """Send one event and return once the server has taken it: one ``POST /api/events`` through
    Prefect's own client, which asks again on a busy server (429/503) and on timeouts; inside a
    run, the run's own resources are related, as Prefect's events worker would. Raise
    :class:`EventNotDeliveredError` when it could not be delivered. ``None`` when Prefect is not
    installed or no API is configured (nothing to deliver to).

    Not the events worker: its websocket drops an event after a failed reconnect, with only a log
    line in the sender, and a busy server made it drop the alerts' events (#30)."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.events import Event
        from prefect.events.related import related_resources_from_run_context
        from prefect.settings import PREFECT_API_URL
        from prefect.utilities.asyncutils import run_coro_as_sync
    except ImportError:
        return None
    api = PREFECT_API_URL.value()
    if not api:
        return None
    ev = Event(event=event, resource=resource, payload=payload, related=related or [])

    async def send() -> None:
        async with get_client() as client:
            ev.related += await related_resources_from_run_context(
                client, exclude={r.id for r in ev.involved_resources})
            response = await client.request("POST", "/events", json=[ev.model_dump(mode="json")])
            response.raise_for_status()

    try:
        run_coro_as_sync(send())
    except Exception as err:  # noqa: BLE001 - any failure to reach the server means not delivered
        raise EventNotDeliveredError(f"{event} not delivered to {api}: {type(err).__name__}: "
                                     f"{str(err).splitlines()[0] if str(err) else 'no answer'}") from None
    return str(ev.id)


def _alert(event: str, resource: dict[str, str], payload: dict[str, Any],
           related: list[dict[str, str]] | None = None) -> str | None:
    """Deliver an event a flow run sends for an automation (an alert, a promotion); when the
    server did not take it, say so at ERROR in the run's log (the record it reports is in the
    store either way) and leave it to Prefect's events worker to try once more. The run goes on:
    what it built, checked or rolled back stands."""
    try:
        return _deliver(event, resource, payload, related)
    except EventNotDeliveredError as err:
        from prefect.logging import get_run_logger

        get_run_logger().error(f"{err}; its automation will not fire unless Prefect's events worker delivers it")
        return _emit(event, resource, payload, related)


def emit_driver_upgraded(node_id: str, payload: dict[str, Any], compat_keys: list[str] | None = None) -> str | None:
    """Deliver ``buildctl.node.driver-upgraded`` for the node, related to its profiles and its new
    ``compat_keys``; returns the event id once the server has it, None when no Prefect API
    (``PREFECT_API_URL``) is configured to receive it or Prefect is not installed, and raises
    :class:`EventNotDeliveredError` when the configured API did not take it."""
    return _deliver(DRIVER_UPGRADED, {"prefect.resource.id": resource_id(node_id), "prefect.resource.name": node_id},
                    payload, related_resources(profiles=payload.get("profiles"), compat_keys=compat_keys))


def emit_pull_failed(node_id: str, payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.node.pull-failed`` (payload: the pull failure), related to the artifact,
    profile and compat key."""
    return _emit(PULL_FAILED, {"prefect.resource.id": resource_id(node_id), "prefect.resource.name": node_id},
                 {"node_id": node_id, **payload},
                 related_resources(payload.get("artifact_id"), payload.get("profile"), payload.get("compat_key")))


def emit_engine_health(node_id: str, payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.node.engine-health`` (payload: the node's engine state: installed, healthy or
    failed), related to the artifact, profile and compat key; the rollout-channel deployment is
    triggered by the failed ones."""
    return _emit(ENGINE_HEALTH, {"prefect.resource.id": resource_id(node_id), "prefect.resource.name": node_id,
                                 "buildctl.engine-health": str(payload.get("status"))},
                 {"node_id": node_id, **payload},
                 related_resources(payload.get("artifact_id"), payload.get("profile"), payload.get("compat_key")))


def served_resource_id(model: str, group_key: str) -> str:
    """The resource of one served model on one node group: the nodes whose preferred runtime has
    the compat key ``group_key`` (the fallback alert waits per resource, so a group pages once)."""
    return f"buildctl.served.{model}.{group_key}"


def emit_runtime_choice(node_id: str, payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.node.runtime-fallback`` when a node moved a served model onto a fallback
    runtime, ``buildctl.node.runtime-preferred`` when onto its preferred one (payload: the choice,
    its rank, since when, why each earlier runtime was passed over, and ``preferred_compat_key``:
    the node's compat key for the preferred runtime, which names its group)."""
    event = RUNTIME_FALLBACK if payload.get("fallback") else RUNTIME_PREFERRED
    model, group = str(payload.get("model")), str(payload.get("preferred_compat_key"))
    return _emit(event, {"prefect.resource.id": served_resource_id(model, group),
                         "prefect.resource.name": f"{model} on {group}", "buildctl.runtime": str(payload.get("runtime"))},
                 {"node_id": node_id, **payload},
                 related_resources(payload.get("artifact_id"), payload.get("runtime"), payload.get("compat_key"),
                                   node_id=node_id))


def emit_rollout_started(profile: str, channel: str, compat_key: str, artifact_id: str, seq: int) -> str | None:
    """Emit ``buildctl.rollout.started`` for a promotion that started a rollout: the
    rollout-channel deployment's trigger runs it at once, and that run turns its 5-minute
    schedule on for as long as a rollout is live (docs/rollouts.md)."""
    return _emit(ROLLOUT_STARTED, {"prefect.resource.id": f"buildctl.channel.{profile}.{channel}",
                                   "prefect.resource.name": f"{profile}/{channel}", "buildctl.channel": channel},
                 {"profile": profile, "channel": channel, "compat_key": compat_key, "artifact_id": artifact_id,
                  "seq": seq},
                 related_resources(artifact_id, profile, compat_key))


def emit_artifact_corrupted(artifact_id: str, payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.artifact.corrupted`` for an artifact the scrub found bad."""
    return _alert(ARTIFACT_CORRUPTED, {"prefect.resource.id": artifact_resource_id(artifact_id),
                                       "prefect.resource.name": artifact_id},
                  {"artifact_id": artifact_id, **payload},
                  related_resources(None, payload.get("profile"), payload.get("compat_key")))


def emit_validation_outcome(artifact_id: str, verdict: str, payload: dict[str, Any],
                            next_channel: str | None = None) -> list[str]:
    """Emit the verdict's event (:data:`VERDICT_EVENTS`: ``buildctl.artifact.validated`` only for a
    pass, ``validation-failed``, ``inconclusive``) from a build run, with the verdict as the
    resource label ``buildctl.verdict`` so an automation can match on it; after a pass,
    ``buildctl.artifact.promotable`` names ``next_channel``, the channel the artifact may go to
    next. Each is related to the profile, compat key and the node whose report started the run;
    Prefect adds the flow run itself, so the event feed links an upgrade to its runs and its
    artifact. Returns the ids of the events sent."""
    resource = {"prefect.resource.id": artifact_resource_id(artifact_id), "prefect.resource.name": artifact_id,
                "buildctl.verdict": verdict}
    related = related_resources(None, payload.get("profile"), payload.get("compat_key"), payload.get("node_id"))
    body = {"artifact_id": artifact_id, "verdict": verdict, **payload}
    sent = [_alert(VERDICT_EVENTS.get(verdict, ARTIFACT_VALIDATION_FAILED), resource, body, related)]
    if verdict == "pass" and next_channel:
        sent.append(_alert(ARTIFACT_PROMOTABLE, {**resource, "buildctl.next-channel": next_channel},
                           {**body, "next_channel": next_channel}, related))
    return [e for e in sent if e]


def channel_resource_id(profile: str, channel: str, compat_key: str) -> str:
    return f"buildctl.channel.{profile}.{channel}.{compat_key}"


def emit_rollout_halted(payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.rollout.halted`` from the rollout run that halted a rollout and rolled the
    channel back (payload: the rollout view), on the channel's resource, related to the artifact,
    profile and compat key (an alert automation matches it)."""
    return _alert(ROLLOUT_HALTED, {"prefect.resource.id": channel_resource_id(payload["profile"], payload["channel"],
                                                                            payload["compat_key"]),
                                   "prefect.resource.name": f"{payload['profile']}/{payload['channel']}"},
                  payload, related_resources(payload.get("artifact_id"), payload.get("profile"), payload.get("compat_key")))
