"""Prefect events emitted by node agents: the only flows module the CLI imports (lazily)."""

from __future__ import annotations

from typing import Any

DRIVER_UPGRADED = "buildctl.node.driver-upgraded"


def resource_id(node_id: str) -> str:
    return f"buildctl.node.{node_id}"


def emit_driver_upgraded(node_id: str, payload: dict[str, Any]) -> str | None:
    """Emit ``buildctl.node.driver-upgraded`` for the node; returns the event id, or None when no
    Prefect API is configured to receive it, or Prefect is not installed (a node agent's slim
    install: the report is recorded in the store all the same, and the nightly reconcile finds it)."""
    try:
        from prefect.events import emit_event
    except ImportError:
        return None

    event = emit_event(event=DRIVER_UPGRADED, resource={"prefect.resource.id": resource_id(node_id),
                                                        "prefect.resource.name": node_id}, payload=payload)
    return str(event.id) if event is not None else None
