"""#30 item 4: every deployment parameter says what it is, and names it picks from a known list.

Prefect builds each deployment's parameter schema from the flow's signature and its docstring's
Args section; the API refuses a run whose parameters do not fit (tests/flows/test_worker_queues.py
shows it on a real server). Here: the schema of every flow, offline."""

from __future__ import annotations

import importlib

import pytest

from buildctl.flows.alerts import FLOW_NAMES

from ..support.helpers import PROFILES


@pytest.mark.parametrize("flow_name", FLOW_NAMES)
def test_every_parameter_has_a_description_and_profiles_their_allowed_values(flow_name):
    from prefect.utilities.callables import parameter_schema

    module = flow_name.replace("-", "_")
    flow = getattr(importlib.import_module(f"buildctl.flows.{module}"), module)
    props = parameter_schema(flow.fn).model_dump()["properties"]
    assert props and not [k for k, v in props.items() if not v.get("description")], props
    shipped = sorted(f.stem for f in PROFILES.glob("*.yaml"))
    for name in ("profile", "profiles"):
        if name in props:
            text = str(props[name])
            assert all(p in text for p in shipped) and "enum" in text, props[name]
