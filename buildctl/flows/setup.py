"""Prefect-side setup shared by ``flows.serve`` and the local demo runner."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from buildctl.core.settings import Settings

REPO = Path(__file__).resolve().parents[2]  # buildctl/flows/setup.py: the checkout


def ensure_build_limit(settings: Settings) -> str:
    """Create the builds' global concurrency limit if it does not exist (builds acquire it strictly)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    name, slots = settings.build_limit, settings.build_slots

    async def go() -> None:
        async with get_client() as client:
            try:
                await client.read_global_concurrency_limit_by_name(name)
            except Exception:
                await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))

    asyncio.run(go())
    return name


def _declared(deployment: str, prefect_yaml: Path | None) -> dict[str, Any]:
    """The deployment's entry in prefect.yaml ({} when it declares none)."""
    spec = yaml.safe_load((prefect_yaml or REPO / "prefect.yaml").read_text())
    return next((d for d in spec.get("deployments", []) if d["name"] == deployment), {})


def deployment_schedules(deployment: str, prefect_yaml: Path | None = None) -> list[Any]:
    """The cron schedules declared for a deployment in prefect.yaml (with their slugs), as
    Prefect schedules, so a served deployment has the same ones."""
    from prefect.schedules import Cron

    return [Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True), slug=s.get("slug"),
                 parameters=s.get("parameters")) for s in _declared(deployment, prefect_yaml).get("schedules") or []]


def deployment_triggers(deployment: str, prefect_yaml: Path | None = None) -> list[Any]:
    """The triggers declared for a deployment in prefect.yaml, as DeploymentEventTrigger objects."""
    from prefect.events import DeploymentEventTrigger

    return [DeploymentEventTrigger(name=t.get("name"), description=t.get("description") or "",
                                   expect=set(t["expect"]), match=t["match"], parameters=t.get("parameters", {}),
                                   enabled=t.get("enabled", True))
            for t in _declared(deployment, prefect_yaml).get("triggers", [])]
