"""Rollout records: a channel move that reaches the fleet in waves.

A rollout lives inside the channel record it belongs to (``ChannelRecord.rollout``), so it is
moved with the same compare-and-swap, kept in the same create-only history, and signed with it.
While it is active or paused, a node resolves the channel by its *wave bucket*: a stable number in
[0, 100) from the hash of the channel and its node id. A node whose bucket is below the current
wave's percentage gets the new artifact (``ChannelRecord.artifact_id``); the rest keep the
artifact the channel pointed at before (``Rollout.base``). Buckets depend only on the node id and
the channel, so a node that was in the 1% canary is in every later wave too (waves only grow), and
the same nodes are canaries for every rollout of a channel: operators can know them.

This module is pure: parsing, buckets and per-node resolution. Moving a rollout on is
:mod:`buildctl.artifact_store.channels`; deciding when is :mod:`buildctl.steps.rollouts`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import xxhash
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from buildctl.core.records import Record
from buildctl.artifact_store.errors import StoreArgumentError

RolloutState = Literal["active", "paused", "completed", "halted", "aborted"]
LIVE_STATES = ("active", "paused")  # nodes resolve per wave bucket only in these
BUDGET_RE = re.compile(r"^(\d+)(%)?$|^(\d+\.\d+)%$")
BUCKETS = 10_000  # bucket resolution: 0.01 %


class Wave(Record):
    """One wave: the share of the fleet that has the new artifact, and how many failures it tolerates."""

    percent: float = Field(..., gt=0, le=100, description="Cumulative share of nodes (by wave bucket) in this wave.")
    max_failures: str = Field("0", description="Failed nodes tolerated: a count (\"1\") or a share of the wave's nodes (\"2%\").")

    @model_validator(mode="after")
    def _budget(self) -> "Wave":
        if not BUDGET_RE.match(self.max_failures):
            raise ValueError(f"max_failures {self.max_failures!r}: a count like 1 or a share like 2%")
        return self

    def allowed_failures(self, nodes: int) -> int:
        """The failures this wave tolerates among ``nodes`` nodes (a share rounds down)."""
        if self.max_failures.endswith("%"):
            return math.floor(nodes * float(self.max_failures[:-1]) / 100 + 1e-9)
        return int(self.max_failures)


class RolloutPlan(Record):
    """What ``promote --rollout`` asks for: the waves and the bake time."""

    waves: tuple[Wave, ...] = Field(..., min_length=1, description="The waves, growing, the last at 100%.")
    bake_s: float = Field(0.0, ge=0, description="How long a wave runs before the next may start, in seconds.")


class WaveSummary(Record):
    """What the rollout tick counted in a wave when it decided on it (advance, complete, halt),
    kept in the signed record it wrote: each ended wave's outcome, read with the ref, no node
    record or marker read again."""

    wave: int = Field(..., ge=0, description="Index of the wave decided on.")
    percent: float = Field(..., description="The wave's percentage of the fleet.")
    decision: Literal["advance", "complete", "halt"] = Field(..., description="What the tick decided.")
    at: str = Field(..., description="UTC ISO-8601 time of the decision.")
    nodes: int = Field(..., ge=0, description="Nodes in the wave.")
    healthy: int = Field(..., ge=0)
    failed: int = Field(..., ge=0)
    installed: int = Field(..., ge=0, description="Installed, smoke check not reported yet.")
    pending: int = Field(..., ge=0, description="Not pulled yet.")
    allowed: int = Field(..., ge=0, description="The wave's failure budget, in nodes.")


class Rollout(Record):
    """A rollout's plan and state, carried by its channel record."""

    waves: tuple[Wave, ...] = Field(..., min_length=1, description="The waves, growing, the last at 100%.")
    bake_s: float = Field(..., ge=0, description="How long a wave runs before the next may start, in seconds.")
    wave: int = Field(0, ge=0, description="Index of the current wave.")
    wave_started_at: str = Field(..., description="UTC ISO-8601 time the current wave started.")
    state: RolloutState = Field("active", description="active, paused, completed, halted or aborted.")
    base: str = Field(..., description="The artifact nodes outside the wave keep (the channel's artifact before the rollout).")
    target: str = Field(..., description="The artifact being rolled out.")
    started_at: str = Field(..., description="UTC ISO-8601 time the rollout started.")
    failed_nodes: tuple[str, ...] = Field((), description="Nodes whose failures halted the rollout.")
    summaries: tuple[WaveSummary, ...] = Field((), description="The tick's count of each wave it decided on, oldest first.")

    @model_serializer(mode="wrap")
    def _omit_no_summaries(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if not out.get("summaries"):
            out.pop("summaries", None)  # a record written before summaries keeps its signed bytes
        return out

    @model_validator(mode="after")
    def _shape(self) -> "Rollout":
        pct = [w.percent for w in self.waves]
        if any(b <= a for a, b in zip(pct, pct[1:])) or pct[-1] != 100:
            raise ValueError(f"waves {pct}: percentages must grow and end at 100")
        if self.wave >= len(self.waves):
            raise ValueError(f"wave {self.wave} out of range for {len(self.waves)} waves")
        return self

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def current(self) -> Wave:
        return self.waves[self.wave]


def wave_bucket(profile: str, channel: str, node_id: str) -> float:
    """The node's stable bucket in [0, 100) for this channel (0.01 % resolution)."""
    return (xxhash.xxh3_64_intdigest(f"{profile}/{channel}\0{node_id}".encode()) % BUCKETS) / (BUCKETS / 100)


def in_wave(profile: str, channel: str, node_id: str | None, percent: float) -> bool:
    """Whether the node is inside a wave of ``percent``; a node without an id is in no partial wave."""
    if percent >= 100:
        return True
    return node_id is not None and wave_bucket(profile, channel, node_id) < percent


def artifact_for_node(profile: str, channel: str, artifact_id: str, rollout: Rollout | None, node_id: str | None) -> str:
    """The artifact a channel record gives this node."""
    if rollout is None or not rollout.live:
        return artifact_id
    return rollout.target if in_wave(profile, channel, node_id, rollout.current.percent) else rollout.base


def parse_waves(rollout: str, max_failures: str | None) -> tuple[Wave, ...]:
    """``--rollout 1,10,50,100`` and ``--max-failures 0,1%,2%,2%`` (one value for every wave, or
    one per wave; default 0) as waves."""
    try:
        pct = [float(x) for x in rollout.split(",") if x.strip()]
    except ValueError:
        raise StoreArgumentError(f"--rollout {rollout!r}: comma-separated percentages, e.g. 1,10,50,100") from None
    budgets = [x.strip() for x in (max_failures or "0").split(",") if x.strip()]
    if len(budgets) == 1:
        budgets = budgets * len(pct)
    if len(budgets) != len(pct):
        raise StoreArgumentError(f"--max-failures has {len(budgets)} values for {len(pct)} waves: give one, or one per wave")
    if not pct or any(p <= 0 or p > 100 for p in pct) or any(b <= a for a, b in zip(pct, pct[1:])) or pct[-1] != 100:
        raise StoreArgumentError(f"--rollout {rollout!r}: percentages in (0, 100], growing, the last 100")
    bad = [b for b in budgets if not BUDGET_RE.match(b)]
    if bad:
        raise StoreArgumentError(f"--max-failures {bad[0]!r}: a count like 1 or a share like 2%")
    return tuple(Wave(percent=p, max_failures=b) for p, b in zip(pct, budgets))


