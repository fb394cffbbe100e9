"""The fleet: node inventory in the store, and the reconcile plan (a pure function).

Each node agent reports its fingerprint and the profiles it serves (``buildctl node report``);
the record lives at ``inventory/nodes/<node_id>.json`` and is replaced with compare-and-swap.
The plan computes which (profile, compat key) pairs the nodes need and drops those that already
have an artifact built from the profile's current build hash; each distinct pair is built once,
however many nodes share it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from buildctl.digest import canonical_json
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile
from buildctl.engines.registry import backend_names, get_backend
from buildctl.settings import Settings
from buildctl.artifact_store.backend import Store
from buildctl.artifact_store.errors import CasConflictError, CorruptObjectError, StoreArgumentError
from buildctl.artifact_store.gc import GcResult, gc as store_gc
from buildctl.artifact_store.layout import NODES, node_key
from buildctl.times import utc_now
from buildctl.artifact_store.verify import list_artifacts

NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class PullFailure(BaseModel):
    """A pull this node refused: the artifact stays out of ``current``, and the report says why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact_id: str = Field(..., description="The artifact the channel pointed at.")
    profile: str = Field(..., description="Profile pulled.")
    channel: str = Field(..., description="Channel pulled.")
    compat_key: str = Field(..., description="The channel ref's compat key.")
    files: tuple[str, ...] = Field((), description="The files that failed, when the bytes were wrong.")
    error: str = Field(..., description="The error's type and message.")
    when: str = Field(..., description="UTC ISO-8601 time.")


MAX_PULL_FAILURES = 10
HealthStatus = Literal["installed", "healthy", "failed"]


class EngineState(BaseModel):
    """What a node runs for one (profile, channel), and what its smoke check said."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = Field(..., description="Profile pulled.")
    channel: str = Field(..., description="Channel pulled.")
    compat_key: str = Field(..., description="The channel ref's compat key.")
    artifact_id: str = Field(..., description="The artifact the channel gave this node.")
    seq: int = Field(..., ge=1, description="The channel record it was resolved from.")
    status: HealthStatus = Field(..., description="installed (smoke check pending), healthy or failed.")
    detail: str | None = Field(None, description="Why the smoke check failed, or what it ran.")
    current: str | None = Field(None, description="The artifact DIR/current holds now (after a failure: the one switched back to).")
    previous: str | None = Field(None, description="The artifact DIR/previous holds now (the node's own rollback target).")
    when: str = Field(..., description="UTC ISO-8601 time.")


class NodeRecord(BaseModel):
    """What one node reported."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: str = Field(..., description="The node's id (hostname or cloud instance id).")
    fingerprint: dict[str, Any] = Field(..., description="The node's fingerprint.")
    compat_keys: dict[str, str] = Field(..., description="Compat key per backend, from the fingerprint.")
    profiles: tuple[str, ...] = Field((), description="Profiles the node serves.")
    reported_at: str = Field(..., description="UTC time of the report.")
    reports: int = Field(1, ge=1, description="How many reports this node has made.")
    pull_failures: tuple[PullFailure, ...] = Field((), description=f"The node's latest refused pulls, newest last (at most {MAX_PULL_FAILURES}).")
    engines: tuple[EngineState, ...] = Field((), description="Per (profile, channel): the engine installed and its health.")

    def engine(self, profile: str, channel: str) -> EngineState | None:
        return next((e for e in self.engines if e.profile == profile and e.channel == channel), None)


@dataclass
class ReportResult:
    record: NodeRecord
    previous: NodeRecord | None

    @property
    def compat_changed(self) -> bool:
        """Whether any backend's compat key changed since the last report (a driver/CUDA/... upgrade)."""
        return self.previous is not None and self.previous.compat_keys != self.record.compat_keys


def read_node(store: Store, node_id: str) -> tuple[NodeRecord, str] | None:
    got = store.get_ref(node_key(node_id))
    if got is None:
        return None
    try:
        return NodeRecord.model_validate_json(got[0]), got[1]
    except ValidationError:
        raise CorruptObjectError(node_key(node_id), "malformed node record") from None


def report_node(store: Store, node_id: str, fingerprint: Fingerprint, profiles: Iterable[str], *,
                attempts: int = 20) -> ReportResult:
    """Write this node's record with compare-and-swap; returns it and the record it replaced."""
    if not NODE_ID_RE.match(node_id):
        raise StoreArgumentError(f"bad node id {node_id!r}: letters, digits, '.', '_' and '-'")
    profiles = tuple(sorted(set(profiles)))
    for _ in range(attempts):
        current = read_node(store, node_id)
        rec = NodeRecord(node_id=node_id, fingerprint=fingerprint.model_dump(mode="json"),
                         compat_keys={b: fingerprint.compat_key(b) for b in backend_names()}, profiles=profiles,
                         reported_at=utc_now(), reports=(current[0].reports + 1) if current else 1,
                         pull_failures=current[0].pull_failures if current else (),
                         engines=current[0].engines if current else ())
        if store.cas(node_key(node_id), canonical_json(rec.model_dump(mode="json")), current[1] if current else None):
            return ReportResult(rec, current[0] if current else None)
        time.sleep(0.05)
    raise CasConflictError(node_key(node_id), attempts)


def _update_node(store: Store, node_id: str, fingerprint: Fingerprint, profile: str,
                 change: Callable[[NodeRecord], NodeRecord], attempts: int) -> NodeRecord:
    """Apply ``change`` to the node's inventory record with compare-and-swap (a node that never
    reported gets a record from its fingerprint)."""
    if not NODE_ID_RE.match(node_id):
        raise StoreArgumentError(f"bad node id {node_id!r}: letters, digits, '.', '_' and '-'")
    for _ in range(attempts):
        current = read_node(store, node_id)
        base = current[0] if current is not None else NodeRecord(
            node_id=node_id, fingerprint=fingerprint.model_dump(mode="json"),
            compat_keys={b: fingerprint.compat_key(b) for b in backend_names()}, profiles=(profile,),
            reported_at=utc_now())
        rec = change(base)
        if store.cas(node_key(node_id), canonical_json(rec.model_dump(mode="json")), current[1] if current else None):
            return rec
        time.sleep(0.05)
    raise CasConflictError(node_key(node_id), attempts)


def record_pull_failure(store: Store, node_id: str, fingerprint: Fingerprint, failure: PullFailure, *,
                        attempts: int = 20) -> NodeRecord:
    """Append a refused pull to the node's inventory record (compare-and-swap; the node role may
    write only its inventory record, so this is how a node reports a bad artifact)."""
    return _update_node(store, node_id, fingerprint, failure.profile, lambda r: r.model_copy(
        update={"pull_failures": (*r.pull_failures, failure)[-MAX_PULL_FAILURES:]}), attempts)


def record_engine_state(store: Store, node_id: str, fingerprint: Fingerprint, state: EngineState, *,
                        attempts: int = 20) -> NodeRecord:
    """Set the node's engine state for ``state``'s (profile, channel), with compare-and-swap."""
    return _update_node(store, node_id, fingerprint, state.profile, lambda r: r.model_copy(update={"engines": tuple(
        sorted([e for e in r.engines if (e.profile, e.channel) != (state.profile, state.channel)] + [state],
               key=lambda e: (e.profile, e.channel)))}), attempts)


def record_reported_fingerprint(store: Store, node_id: str, fingerprint: Fingerprint,
                                profiles: Iterable[str] | None) -> list[str]:
    """A node's fingerprint as an event reported it: record it unless the inventory already holds
    it; returns the profiles the node serves (the event's, else the recorded ones)."""
    current = read_node(store, node_id)
    served = list(profiles) if profiles is not None else (list(current[0].profiles) if current else [])
    if current is None or current[0].fingerprint != fingerprint.model_dump(mode="json"):
        report_node(store, node_id, fingerprint, served)
    return served


def read_inventory(store: Store) -> list[NodeRecord]:
    out = []
    for key in store.list(NODES):
        got = store.get_ref(key)
        if got is not None:
            out.append(NodeRecord.model_validate_json(got[0]))
    return out


@dataclass(frozen=True)
class BuildNeed:
    """One distinct (profile, compat key) pair without an artifact, and how many nodes wait for it."""

    profile: str
    compat_key: str
    nodes: int


def plan_builds(nodes: Iterable[tuple[Iterable[str], dict[str, str]]], profile_backends: dict[str, str],
                have: set[tuple[str, str]], only_profiles: Iterable[str] | None = None) -> list[BuildNeed]:
    """The pairs to build. Pure and linear in the number of (node, profile) entries.

    ``nodes``: each node's profiles and its compat key per backend; ``profile_backends``: profile
    name -> backend (profiles unknown here are skipped); ``have``: (profile, compat key) pairs that
    already have an artifact of the profile's current build hash.
    """
    wanted = set(only_profiles) if only_profiles is not None else None
    counts: dict[tuple[str, str], int] = {}
    for profiles, compat_keys in nodes:
        for name in profiles:
            backend = profile_backends.get(name)
            if backend is None or (wanted is not None and name not in wanted):
                continue
            pair = (name, compat_keys[backend])
            counts[pair] = counts.get(pair, 0) + 1
    return [BuildNeed(p, k, n) for (p, k), n in sorted(counts.items()) if (p, k) not in have]


def existing_pairs(store: Store, profile_hashes: dict[str, str]) -> set[tuple[str, str]]:
    """(profile, compat key) pairs that have an artifact built from the profile's current hash."""
    return {(m.profile_name, m.compat_key) for _, m in list_artifacts(store)
            if profile_hashes.get(m.profile_name) == m.profile_hash}


def work_queue_for(compat_key: str) -> str:
    """The work queue that serves a compat key: one queue per compat key, named after it."""
    return compat_key


def serving_queues(settings: Settings, fingerprint: Fingerprint) -> dict[str, str]:
    """The work queues a worker on this host can serve, by backend: one per backend whose build tool
    this host has (its ``tool_version`` is known), named after the host's compat key for it."""
    out = {}
    for name in backend_names():
        if get_backend(name, settings).tool_version(fingerprint) is not None:
            out[name] = work_queue_for(fingerprint.compat_key(name))
    return out


def fleet_plan(store: Store, profiles: dict[str, BuildProfile], only_profiles: Iterable[str] | None = None) -> list[BuildNeed]:
    """Read the inventory and the artifacts, and plan. ``profiles``: name -> profile (``pipeline.load_profiles``)."""
    inventory = read_inventory(store)
    have = existing_pairs(store, {n: p.build_hash() for n, p in profiles.items()})
    return plan_builds(((n.profiles, n.compat_keys) for n in inventory),
                       {n: p.engine.backend for n, p in profiles.items()}, have, only_profiles)


def event_payload(result: ReportResult) -> dict[str, Any]:
    """The ``buildctl.node.driver-upgraded`` payload: old and new fingerprints and the node's profiles."""
    return {"node_id": result.record.node_id,
            "old_fingerprint": result.previous.fingerprint if result.previous else None,
            "new_fingerprint": result.record.fingerprint,
            "old_compat_keys": result.previous.compat_keys if result.previous else None,
            "new_compat_keys": result.record.compat_keys,
            "profiles": list(result.record.profiles)}


def node_protections(nodes: Iterable[NodeRecord]) -> list[tuple[str, str]]:
    """What the nodes run or keep, as gc protections: (artifact, why)."""
    out = []
    for node in nodes:
        for e in node.engines:
            out.append((e.artifact_id, f"node {node.node_id} reports it installed ({e.profile}/{e.channel}, {e.status})"))
            if e.current:
                out.append((e.current, f"node {node.node_id} runs it (current, {e.profile}/{e.channel})"))
            if e.previous:
                out.append((e.previous, f"node {node.node_id} keeps it as previous ({e.profile}/{e.channel})"))
    return out


def gc(settings: Settings, store: Store, **options: Any) -> GcResult:
    """``buildctl gc`` and the gc-store flow: the store's gc, with what the nodes report protected,
    and the grace period and delete window the publishes use."""
    options.setdefault("grace_s", settings.gc_grace_s)
    options.setdefault("delete_window_s", settings.gc_delete_window_s)
    return store_gc(store, also_protected=node_protections(read_inventory(store)), **options)
