"""The node inventory: what each node reported, one record per node under
``inventory/nodes/<shard>/<node_id>.json`` (:func:`~buildctl.artifact_store.layout.node_key`; read at the pre-shard ``inventory/nodes/<node_id>.json`` too), replaced with compare-and-swap.

The store owns this data: nodes write their own record and the node-index markers derived from
it (``update_node``'s ``markers``; the node role may write nothing else),
rollouts count waves from it, and garbage collection (:mod:`.gc`) reads the engines nodes run
and keep from it (:func:`node_protections`). Reporting a fingerprint is
:mod:`buildctl.steps.fleet`'s (it computes the compat keys).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Iterable, Literal

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json
from buildctl.artifact_store.backends.store import Store
from buildctl.core.errors import BuildctlError
from buildctl.artifact_store.errors import CasConflictError, CorruptObjectError, StoreArgumentError
from buildctl.artifact_store.backends.listing import hex_bounds, list_ranges
from buildctl.artifact_store.layout import (
    HELD_INDEX,
    NODE_INDEX_META,
    NODES,
    held_key,
    is_legacy_node_key,
    legacy_node_key,
    node_key,
    node_of_node_key,
    parse_held_key,
    status_prefix,
)

NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class PullFailure(Record):
    """A pull this node refused: the artifact stays out of ``current``, and the report says why."""

    artifact_id: str = Field(..., description="The artifact the channel pointed at.")
    profile: str = Field(..., description="Profile pulled.")
    channel: str = Field(..., description="Channel pulled.")
    compat_key: str = Field(..., description="The channel ref's compat key.")
    files: tuple[str, ...] = Field((), description="The files that failed, when the bytes were wrong.")
    error: str = Field(..., description="The error's type and message.")
    when: str = Field(..., description="UTC ISO-8601 time.")


MAX_PULL_FAILURES = 10
HealthStatus = Literal["installed", "healthy", "failed"]


class EngineState(Record):
    """What a node runs for one (profile, channel), and what its smoke check said."""

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


class PendingEvent(Record):
    """A Prefect event a report owes and has not delivered yet (the API was down): kept in the
    node's record until it is delivered; the next report re-sends it."""

    event: str = Field(..., description="The event's name (buildctl.node.driver-upgraded).")
    payload: dict[str, Any] = Field(..., description="Its payload, as first computed.")
    compat_keys: tuple[str, ...] = Field((), description="The compat keys it relates to.")
    since: str = Field(..., description="UTC time of the report that first owed it.")


class NodeRecord(Record):
    """What one node reported."""

    node_id: str = Field(..., description="The node's id (hostname or cloud instance id).")
    fingerprint: dict[str, Any] = Field(..., description="The node's fingerprint.")
    compat_keys: dict[str, str] = Field(..., description="Compat key per backend, from the fingerprint.")
    profiles: tuple[str, ...] = Field((), description="Profiles the node serves.")
    reported_at: str = Field(..., description="UTC time of the report.")
    reports: int = Field(1, ge=1, description="How many reports this node has made.")
    pull_failures: tuple[PullFailure, ...] = Field((), description=f"The node's latest refused pulls, newest last (at most {MAX_PULL_FAILURES}).")
    engines: tuple[EngineState, ...] = Field((), description="Per (profile, channel): the engine installed and its health.")
    event_pending: PendingEvent | None = Field(None, description="An event a report owes and could not deliver yet.")

    def engine(self, profile: str, channel: str) -> EngineState | None:
        return next((e for e in self.engines if e.profile == profile and e.channel == channel), None)


def read_node(store: Store, node_id: str) -> tuple[NodeRecord, str] | None:
    """The node's record and its version token: at its shard (:func:`node_key`), else where it
    was written before the shards (:func:`legacy_node_key`)."""
    got = _read_node_at(store, node_id)
    return (got[0], got[1]) if got is not None else None


def _read_node_at(store: Store, node_id: str) -> tuple[NodeRecord, str, str] | None:
    """:func:`read_node`, with the key the record was read from."""
    for key in (node_key(node_id), legacy_node_key(node_id)):
        got = store.get_ref(key)
        if got is None:
            continue
        try:
            return NodeRecord.model_validate_json(got[0]), got[1], key
        except ValidationError:
            raise CorruptObjectError(key, "malformed node record") from None
    return None


def check_node_id(node_id: str) -> None:
    if not NODE_ID_RE.match(node_id):
        raise StoreArgumentError(f"bad node id {node_id!r}: letters, digits, '.', '_' and '-'")


def update_node(store: Store, node_id: str, change: Callable[[NodeRecord | None], NodeRecord], *,
                attempts: int = 20, markers: Callable[[NodeRecord], set[str]] | None = None
                ) -> tuple[NodeRecord, NodeRecord | None]:
    """Replace the node's record with ``change(current)`` (``None``: no record yet), with
    compare-and-swap, retried; returns the new record and the one it replaced.

    ``markers``: the node-index keys a record implies (``buildctl.steps.node_index.node_markers``). The
    ones the new record adds are written before it, and again after it (a concurrent ``index
    rebuild`` may have deleted them in between), and the ones it drops are deleted after it, so an
    interrupted update leaves extra markers (which readers confirm against the record, and a check
    finds), never a committed record without its markers."""
    check_node_id(node_id)
    for _ in range(attempts):
        current = _read_node_at(store, node_id)
        rec = change(current[0] if current else None)
        before = markers(current[0]) if markers is not None and current else set()
        after = markers(rec) if markers is not None else set()
        for key in sorted(after - before):
            store.put_bytes(key, b"")
        # A record read from its legacy key moves to its shard: created there (a concurrent mover
        # loses the swap and reads it from the shard next time); the legacy copy is then shadowed.
        token = current[1] if current and current[2] == node_key(node_id) else None
        if store.cas(node_key(node_id), canonical_json(rec.model_dump(mode="json")), token):
            # Again after the swap: an `index rebuild` that read the record before it may have taken
            # them for stale and deleted them (create-only puts: a marker still there is left as is).
            for key in sorted(after - before):
                store.put_bytes(key, b"")
            for key in sorted(before - after):
                store.delete(key)
            if current is not None and current[2] != node_key(node_id):
                _drop_legacy(store, current[2])
            return rec, current[0] if current else None
        time.sleep(0.05)
    raise CasConflictError(node_key(node_id), attempts)


def _drop_legacy(store: Store, key: str) -> None:
    """Delete a moved record's legacy copy where this writer may (the node role may not: the copy
    stays, shadowed by the shard's, and readers skip it)."""
    try:
        store.delete(key)
    except (BuildctlError, OSError):
        pass


# Refused pulls that are about the artifact (its bytes, its quarantine, its signature). A stale,
# expired or replayed channel record is refused too, but says nothing about the artifact.
ARTIFACT_REFUSALS = ("VerificationError", "CorruptObjectError", "QuarantinedError", "SignatureError: manifest")
HOLDS = ("installed", "current", "previous")


def held_markers(rec: NodeRecord) -> set[str]:
    """The artifacts the node reports installed, current or previous, as node-index keys (gc keeps them)."""
    return {held_key(artifact, rec.node_id, how) for e in rec.engines
            for artifact, how in zip((e.artifact_id, e.current, e.previous), HOLDS) if artifact}


def status_markers(rec: NodeRecord) -> set[str]:
    """The node's state with each artifact on each channel, as node-index keys: its engine states,
    and ``refused`` for each artifact a pull refused on its bytes, quarantine or signature."""
    out = {f"{status_prefix(e.profile, e.channel, e.artifact_id)}{rec.node_id}.{e.status}" for e in rec.engines}
    out |= {f"{status_prefix(f.profile, f.channel, f.artifact_id)}{rec.node_id}.refused" for f in rec.pull_failures
            if f.error.startswith(ARTIFACT_REFUSALS)}
    return out


def index_built(store: Store) -> bool:
    """Whether the node index has been built (``buildctl index rebuild`` writes its meta marker):
    until then, readers read the node records."""
    return store.stat(NODE_INDEX_META) is not None


def read_held(store: Store) -> dict[str, dict[str, set[str]]]:
    """artifact -> how -> node ids, from the node index's held markers (one LIST per 1,000; on S3,
    16 ranges of artifact ids at once)."""
    held: dict[str, dict[str, set[str]]] = {}
    for key in list_ranges(store, HELD_INDEX, hex_bounds(HELD_INDEX)):
        try:
            artifact, node_id, how = parse_held_key(key)
        except ValueError:
            continue
        held.setdefault(artifact, {}).setdefault(how, set()).add(node_id)
    return held


INVENTORY_READERS = 16  # node records read at once (S3: one connection each)


def read_inventory(store: Store, skipped: list[tuple[str, str]] | None = None,
                   named: set[str] | None = None, *, workers: int = INVENTORY_READERS) -> list[NodeRecord]:
    """Every node's record, in key order, ``workers`` read at once. A malformed one raises
    :class:`CorruptObjectError`; with ``skipped`` (store-wide commands) it is appended there as
    ``(key, why)`` and passed over, and with ``named`` the artifact ids its bytes still name are
    added there (gc keeps them)."""
    from buildctl.artifact_store.backends.pools import interruptible_pool

    listed = list(store.list(NODES))
    sharded = {node_of_node_key(k) for k in listed if not is_legacy_node_key(k)}
    # A record at its shard shadows its legacy copy (a node moved it and could not delete the old one).
    keys = [k for k in listed if not (is_legacy_node_key(k) and node_of_node_key(k) in sharded)]
    with interruptible_pool(min(workers, max(1, len(keys))), "inventory") as (pool, _):
        bodies = list(pool.map(store.get_ref, keys))
    out = []
    for key, got in zip(keys, bodies):
        if got is None:
            continue
        try:
            out.append(NodeRecord.model_validate_json(got[0]))
        except (ValueError, ValidationError):
            if skipped is None:
                raise CorruptObjectError(key, "malformed node record") from None
            skipped.append((key, "malformed node record"))
            if named is not None:
                named.update(re.findall(r"xxh3-128:[0-9a-f]{32}", got[0].decode("utf-8", "replace")))
    return out


def node_protections(nodes: Iterable[NodeRecord], examples: int = 3,
                     held: dict[str, dict[str, set[str]]] | None = None) -> list[tuple[str, str]]:
    """What the nodes run or keep, as gc protections: one (artifact, why) per artifact, counting
    the nodes that report it installed, run it (current) or keep it (previous), with the first
    ``examples`` node ids. Linear in the nodes: 100,000 nodes on one artifact give one reason.
    ``held``: the same facts read from the node index (:func:`read_held`), added to the records'."""
    held = {a: {h: set(ids) for h, ids in by.items()} for a, by in (held or {}).items()}
    for node in nodes:
        for e in node.engines:
            for artifact, how in zip((e.artifact_id, e.current, e.previous), HOLDS):
                if artifact:
                    held.setdefault(artifact, {}).setdefault(how, set()).add(node.node_id)
    out = []
    for artifact, by in held.items():
        ids = sorted(set().union(*by.values()))
        shown = ", ".join(ids[:examples]) + (f" and {len(ids) - examples} more" if len(ids) > examples else "")
        hows = "; ".join(f"{how} on {len(by[how])}" for how in ("current", "previous", "installed") if how in by)
        out.append((artifact, f"held by {len(ids)} node(s) ({hows}): {shown}"))
    return out
