"""Prefect events emitted by node agents."""

from __future__ import annotations

from typing import Any

DRIVER_UPGRADED = "buildctl.node.driver-upgraded"


def resource_id(node_id: str) -> str:
    return f"buildctl.node.{node_id}"


def emit_driver_upgraded(node_id: str, payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.node.driver-upgraded`` for the node; returns the event id, or None when no
    Prefect API is configured to receive it."""
    from prefect.events import emit_event

    event = emit_event(event=DRIVER_UPGRADED, resource={"prefect.resource.id": resource_id(node_id),
                                                        "prefect.resource.name": node_id}, payload=payload)
    return str(event.id) if event is not None else None
