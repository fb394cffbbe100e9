"""Alerts: named, described Prefect automations that notify someone who must act.

``buildctl alerts install`` creates or updates, by name,
one automation per condition below, each sending through one Prefect notification block that
the operator configures: a Custom Webhook block by default (``--webhook-url``), or any
notification block named ``TYPE-SLUG/NAME`` (``slack-webhook/oncall``,
``pager-duty-webhook/buildctl``; docs/prefect.md shows both).

* **buildctl run failed**: a run of a buildctl flow ended Failed or Crashed;
* **buildctl run late**: a run of a buildctl flow stayed Late for ``late_minutes`` (no worker
  serves its queue: ``buildctl worker queues`` names it);
* **buildctl artifact corrupted**: ``buildctl.artifact.corrupted`` (scrub, a gate or a node
  found bytes that do not match; heal-artifact is already running);
* **buildctl rollout halted**: ``buildctl.rollout.halted`` (a wave's failures passed its budget;
  the channel was rolled back);
* **buildctl channels not re-signed**: no ``resign-channels`` run completed in ``resign_hours``
  (channel records expire, and nodes refuse an expired record);
* **buildctl node on its fallback**: a node group (the nodes whose preferred runtime has one compat
  key) moved a served model onto a fallback runtime (``buildctl.node.runtime-fallback``) and did
  not move back (``buildctl.node.runtime-preferred``) within ``fallback_minutes``: the preferred
  engine's rebuild for that key is overdue.

Every message carries the run's link (``{{ flow_run|ui_url }}``) where a run is involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx

from buildctl.core.errors import BadInputError, NotFoundError, UnavailableError
from buildctl.engines.served import DEFAULT_MAX_FALLBACK_MINUTES
from buildctl.flows.events import ARTIFACT_CORRUPTED, ROLLOUT_HALTED, RUNTIME_FALLBACK, RUNTIME_PREFERRED

#: The buildctl flows (one per deployment in prefect.yaml; tests/flows/test_alerts.py checks it).
FLOW_NAMES = ("build-validate-publish", "reconcile-fleet", "on-driver-upgrade", "scrub-store", "heal-artifact",
              "rollout-channel", "resign-channels", "gc-store", "prepare-upgrade")
DEFAULT_BLOCK = "custom-webhook/buildctl-alerts"

_RUN = ("{{ flow.name }} run {{ flow_run.name }} is {{ flow_run.state.name }}: {{ flow_run.state.message }}\n"
        "{{ flow_run|ui_url }}")


@dataclass(frozen=True)
class Alert:
    name: str
    description: str
    trigger: dict[str, Any]  # an EventTrigger's fields
    subject: str
    body: str


def _our_flows() -> dict[str, Any]:
    return {"prefect.resource.role": "flow", "prefect.resource.name": list(FLOW_NAMES)}


def alerts(late_minutes: float = 30, resign_hours: float = 24,
           fallback_minutes: float = DEFAULT_MAX_FALLBACK_MINUTES) -> list[Alert]:
    """The alerts :func:`install_alerts` installs."""
    return [
        Alert("buildctl run failed", "A buildctl flow run ended Failed or Crashed: its summary artifact names the "
              "failing step, the cause and what to do next.",
              {"expect": {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}, "match_related": _our_flows(),
               "posture": "Reactive", "threshold": 1, "within": timedelta(0)},
              "buildctl: {{ flow.name }} run {{ flow_run.name }} {{ flow_run.state.name }}", _RUN),
        Alert("buildctl run late", f"A buildctl flow run stayed Late for {late_minutes:g} minutes: no live worker "
              "polls its work queue (`buildctl worker queues` flags it); start one on a host with that compat key.",
              {"after": {"prefect.flow-run.Late"}, "expect": {"prefect.flow-run.*"}, "match_related": _our_flows(),
               "for_each": {"prefect.resource.id"}, "posture": "Proactive", "threshold": 1,
               "within": timedelta(minutes=late_minutes)},
              "buildctl: {{ flow.name }} run {{ flow_run.name }} Late for " + f"{late_minutes:g} min",
              "{{ flow.name }} run {{ flow_run.name }} is still Late on queue {{ flow_run.work_queue_name }}: no worker "
              "serves it.\n{{ flow_run|ui_url }}"),
        Alert("buildctl artifact corrupted", "An artifact's stored bytes do not match its manifest: it is quarantined "
              "and heal-artifact rolls its channels back and repairs or rebuilds it; check that run.",
              {"expect": {ARTIFACT_CORRUPTED}, "match": {"prefect.resource.id": "buildctl.artifact.*"},
               "posture": "Reactive", "threshold": 1, "within": timedelta(0)},
              "buildctl: artifact {{ event.payload.artifact_id }} corrupted",
              "Artifact {{ event.payload.artifact_id }} ({{ event.payload.profile }} on "
              "{{ event.payload.compat_key }}) failed its deep verify and is quarantined: {{ event.payload.problems }}\n"
              "{{ flow_run|ui_url }}"),
        Alert("buildctl rollout halted", "A rollout wave's failures passed its budget: the rollout halted and the "
              "channel was rolled back; the failing nodes are named in the channel history.",
              {"expect": {ROLLOUT_HALTED}, "match": {"prefect.resource.id": "buildctl.channel.*"},
               "posture": "Reactive", "threshold": 1, "within": timedelta(0)},
              "buildctl: rollout of {{ event.payload.profile }}/{{ event.payload.channel }} halted",
              "Rollout of {{ event.payload.artifact_id }} on {{ event.payload.profile }}/{{ event.payload.channel }} "
              "halted and rolled back: {{ event.payload.why }}\n{{ flow_run|ui_url }}"),
        Alert("buildctl channels not re-signed", f"No resign-channels run completed in {resign_hours:g} hours: channel "
              "records near their expiry are not re-signed, and nodes refuse an expired record.",
              {"expect": {"prefect.flow-run.Completed"},
               "match_related": {"prefect.resource.role": "flow", "prefect.resource.name": "resign-channels"},
               "posture": "Proactive", "threshold": 1, "within": timedelta(hours=resign_hours)},
              "buildctl: no channel re-sign in " + f"{resign_hours:g} h",
              f"No resign-channels run completed in {resign_hours:g} hours. Run `buildctl resign` or check the "
              "resign-channels deployment and its worker."),
        Alert("buildctl node on its fallback", f"A node group has served a model from a fallback runtime for "
              f"{fallback_minutes:g} minutes: its preferred engine has no usable artifact for the node's compat key "
              "(not built, not promoted, quarantined or refused); the node moves back at its next pull once it has.",
              {"after": {RUNTIME_FALLBACK}, "expect": {RUNTIME_PREFERRED},
               "match": {"prefect.resource.id": "buildctl.served.*"}, "for_each": {"prefect.resource.id"},
               "posture": "Proactive", "threshold": 1, "within": timedelta(minutes=fallback_minutes)},
              "buildctl: {{ event.payload.model }} on {{ event.payload.preferred_compat_key }} on its fallback for "
              + f"{fallback_minutes:g} min",
              "Nodes of compat key {{ event.payload.preferred_compat_key }} (first: {{ event.payload.node_id }}) serve "
              "{{ event.payload.model }} from {{ event.payload.runtime }} (fallback #{{ event.payload.rank }}) since "
              "{{ event.payload.since }}: {{ event.payload.why }}"),
    ]


def _block_id(block: str, webhook_url: str | None) -> Any:
    """The notification block's document id; with ``webhook_url`` the Custom Webhook block is saved
    (created or updated) first."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    slug, _, name = block.partition("/")
    if not name:
        raise BadInputError(f"--block {block!r}: TYPE-SLUG/NAME (e.g. {DEFAULT_BLOCK}, slack-webhook/oncall)")
    if webhook_url:
        if slug != "custom-webhook":
            raise BadInputError(f"--webhook-url makes a custom-webhook block, not {slug!r}: drop one of them")
        CustomWebhookNotificationBlock(name="buildctl", url=webhook_url,
                                       json_data={"subject": "{{subject}}", "body": "{{body}}"}).save(name, overwrite=True)
    with get_client(sync_client=True) as client:
        try:
            return client.read_block_document_by_name(name, block_type_slug=slug).id
        except ObjectNotFound:
            raise NotFoundError(f"no notification block {block!r} on the Prefect server: create it in the UI "
                                "(Blocks) or pass --webhook-url") from None


def install_alerts(block: str = DEFAULT_BLOCK, webhook_url: str | None = None, late_minutes: float = 30,
                   resign_hours: float = 24, fallback_minutes: float = DEFAULT_MAX_FALLBACK_MINUTES) -> list[tuple[str, str]]:
    """Create or update (by name) every automation of :func:`alerts`, sending through ``block``.
    Returns (name, "created" | "updated") each; an unreachable server is :class:`UnavailableError`."""
    if not 0 < late_minutes <= 7 * 24 * 60 or not 0 < resign_hours <= 24 * 365 or not 0 < fallback_minutes <= 525_600:
        raise BadInputError("--late-minutes in (0, 10080], --resign-hours in (0, 8760], --fallback-minutes in (0, 525600]")
    try:
        return _install(block, webhook_url, alerts(late_minutes, resign_hours, fallback_minutes))
    except httpx.TransportError as err:  # connection refused, DNS, timeout: the server is not there
        from prefect.settings import PREFECT_API_URL

        raise UnavailableError(f"Prefect API {PREFECT_API_URL.value()} unreachable: {err}") from None


def _install(block: str, webhook_url: str | None, wanted: list[Alert]) -> list[tuple[str, str]]:
    from prefect.automations import Automation
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import EventTrigger

    block_id = _block_id(block, webhook_url)
    done = []
    for a in wanted:
        new = Automation(name=a.name, description=a.description, enabled=True, trigger=EventTrigger(**a.trigger),
                         actions=[SendNotification(block_document_id=block_id, subject=a.subject, body=a.body)])
        try:
            old = Automation.read(name=a.name)
        except ValueError:  # Prefect: "Automation with name ... not found"
            old = None
        if old is None:
            new.create()
            done.append((a.name, "created"))
        else:
            new.id = old.id
            new.update()
            done.append((a.name, "updated"))
    return done
