"""The fleet: node reports into the inventory, and the reconcile plan (a pure function).

Each node agent reports its fingerprint and the profiles it serves (``buildctl node report``);
the record (:mod:`buildctl.artifact_store.fleet.inventory`, which owns the models) lives at
``inventory/nodes/<shard>/<node_id>.json`` (:func:`~buildctl.artifact_store.layout.node_key`; read at the pre-shard ``inventory/nodes/<node_id>.json`` too) and is replaced with compare-and-swap.
The plan computes which (profile, compat key) pairs the nodes need and drops those that already
have an artifact built from the profile's current build hash; each distinct pair is built once,
however many nodes share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable

from buildctl.steps.coverage import serving_key
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile
from buildctl.engines.registry import backend_names, get_backend
from buildctl.steps.context import Context
from buildctl.core.settings import Settings
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.errors import StoreArgumentError
import buildctl.artifact_store.gc
from buildctl.artifact_store.gc import GcPolicy, GcResult
from buildctl.artifact_store.fleet.inventory import (
    MAX_PULL_FAILURES,
    EngineState,
    NodeRecord,
    PendingEvent,
    PullFailure,
    read_inventory,
    read_node,
    update_node,
)
from buildctl.core.times import now_utc, parse_utc, utc_now
from buildctl.artifact_store.trust.attestations import latest_attestation
from buildctl.artifact_store.backends.listing import map_bounded
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.read import artifacts_built_from, list_artifacts
from buildctl.steps.node_index import demand_counts, index_built, node_compat_keys, node_fingerprint, node_markers


# The event a node report emits when a field its engines depend on changed (buildctl.flows.events).
DRIVER_UPGRADED = "buildctl.node.driver-upgraded"


@dataclass
class ReportResult:
    record: NodeRecord
    previous: NodeRecord | None

    @property
    def compat_changed(self) -> bool:
        """Whether any backend's compat key (its hard fields) changed since the last report: the
        node needs other bytes. Keys are compared as this version computes them, so a record
        written under schema-1 keys does not count as a change."""
        return self.previous is not None and node_compat_keys(self.previous) != self.record.compat_keys

    @property
    def soft_changed(self) -> dict[str, dict[str, tuple[Any, Any]]]:
        """Per backend, the soft fields that changed since the last report (the engines must be
        re-checked on the new values), as ``{backend: {field: (old, new)}}``."""
        if self.previous is None:
            return {}
        old, new = node_fingerprint(self.previous), node_fingerprint(self.record)
        if old is None or new is None:
            return {}
        out = {b: old.soft_differences(new, b) for b in backend_names()}
        return {b: d for b, d in out.items() if d}

    @property
    def upgraded(self) -> bool:
        """Whether the report changed anything an engine of any backend depends on, hard or soft."""
        return self.compat_changed or bool(self.soft_changed)

    def upgraded_for(self, backends: Iterable[str]) -> bool:
        """Whether a field the engines of ``backends`` (the node's profiles') depend on changed:
        their compat key (hard) or a soft field. A change only another backend cares about is none."""
        if self.previous is None:
            return False
        wanted = set(backends)
        before, now = node_compat_keys(self.previous), self.record.compat_keys
        return any(before.get(b) != now.get(b) for b in wanted) or any(b in wanted for b in self.soft_changed)


def _identity(node_id: str, fingerprint: Fingerprint, profiles: tuple[str, ...]) -> dict[str, Any]:
    """A node record's fields that come from the node's fingerprint, and when it reported them."""
    return {"node_id": node_id, "fingerprint": fingerprint.model_dump(mode="json"),
            "compat_keys": {b: fingerprint.compat_key(b) for b in backend_names()}, "profiles": profiles,
            "reported_at": utc_now()}


def report_node(store: Store, node_id: str, fingerprint: Fingerprint, profiles: Iterable[str], *,
                attempts: int = 20) -> ReportResult:
    """Write this node's record with compare-and-swap; returns it and the record it replaced."""
    served = tuple(sorted(set(profiles)))

    def change(current: NodeRecord | None) -> NodeRecord:
        return NodeRecord(**_identity(node_id, fingerprint, served), reports=(current.reports + 1) if current else 1,
                          pull_failures=current.pull_failures if current else (),
                          engines=current.engines if current else (),
                          event_pending=current.event_pending if current else None)

    rec, previous = update_node(store, node_id, change, attempts=attempts, markers=node_markers)
    return ReportResult(rec, previous)


def set_event_pending(store: Store, node_id: str, pending: PendingEvent | None, *, attempts: int = 20) -> NodeRecord:
    """Mark an event the node's report owes (``None``: delivered, clear the mark)."""
    def change(current: NodeRecord | None) -> NodeRecord:
        if current is None:
            raise StoreArgumentError(f"node {node_id!r} has no inventory record to mark")
        return current.model_copy(update={"event_pending": pending})

    return update_node(store, node_id, change, attempts=attempts, markers=node_markers)[0]


def owed_event(result: ReportResult, backends: Iterable[str]) -> PendingEvent | None:
    """The driver-upgraded event this report owes: a new one when a field the node's engines
    depend on changed (it supersedes an undelivered one), else the one an earlier report could
    not deliver, else none."""
    if result.upgraded_for(backends):
        return PendingEvent(event=DRIVER_UPGRADED, payload=event_payload(result),
                            compat_keys=tuple(sorted(result.record.compat_keys.values())), since=result.record.reported_at)
    return result.previous.event_pending if result.previous is not None else None


def _update_node(store: Store, node_id: str, fingerprint: Fingerprint, profile: str,
                 change: Callable[[NodeRecord], NodeRecord], attempts: int) -> NodeRecord:
    """Apply ``change`` to the node's inventory record with compare-and-swap (a node that never
    reported gets a record from its fingerprint)."""

    def apply(current: NodeRecord | None) -> NodeRecord:
        return change(current if current is not None else NodeRecord(**_identity(node_id, fingerprint, (profile,))))

    return update_node(store, node_id, apply, attempts=attempts, markers=node_markers)[0]


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
    return needs(counts, have)


def needs(counts: dict[tuple[str, str], int], have: set[tuple[str, str]]) -> list[BuildNeed]:
    """The pairs of ``counts`` ((profile, compat key) -> nodes) that have no artifact yet."""
    return [BuildNeed(p, k, n) for (p, k), n in sorted(counts.items()) if (p, k) not in have]


# How long a published artifact without a verdict counts as built: its validation is under way
# (the build flow validates right after it publishes; reconcile waits this long for its children).
VALIDATION_PENDING_S = 6 * 3600.0


def existing_pairs(store: Store, profile_hashes: dict[str, str], *, now: datetime | None = None,
                   skipped: list[tuple[str, str]] | None = None) -> set[tuple[str, str]]:
    """(profile, compat key) pairs that have a usable artifact built from the profile's current
    hash, each under the key it serves under now: not quarantined, and passed its validation under
    that key (or, without a verdict yet, published within :data:`VALIDATION_PENDING_S`). A failed
    or inconclusive one is built again by the next reconcile."""
    now = now or now_utc()
    if index_built(store):  # only the current hashes' artifacts, from the pair index
        arts = sorted((am for part in map_bounded(lambda ph: artifacts_built_from(store, *ph), profile_hashes.items())
                       for am in part), key=lambda am: am[1].created_at, reverse=True)
    else:
        arts = list_artifacts(store)
    candidates: dict[tuple[str, str], list[tuple[str, Manifest]]] = {}  # pair -> its artifacts, newest first
    for aid, m in arts:
        if profile_hashes.get(m.profile_name) == m.profile_hash:
            candidates.setdefault((m.profile_name, serving_key(m)), []).append((aid, m))
    local_skips: list[list[tuple[str, str]]] = [[] for _ in candidates]

    def usable(i: int, pair: tuple[str, str]) -> bool:  # the pair's artifacts in order, until one is usable
        for aid, m in candidates[pair]:
            if active_quarantine(store, aid, None if skipped is None else local_skips[i]) is not None:
                continue
            stored = latest_attestation(store, aid, {m.compat_key, pair[1]})
            if stored is not None and stored.attestation.passed:
                return True
            if stored is None and (now - parse_utc(m.created_at)).total_seconds() < VALIDATION_PENDING_S:
                return True
        return False

    found = map_bounded(lambda ip: usable(*ip), list(enumerate(candidates)))  # the pairs checked at once
    if skipped is not None:
        for part in local_skips:
            skipped.extend(part)
    return {pair for pair, ok in zip(candidates, found) if ok}


def work_queue_for(compat_key: str) -> str:
    """The work queue that serves a compat key: one queue per compat key, named after it."""
    return compat_key


def hand_started_queues(profile: str, backend: str, pool: str, target_compat_key: str | None,
                        queues: Iterable[tuple[str, bool]], why: str) -> list[str]:
    """Where a build run started by hand goes when the worker that took it cannot build it
    (``why``): its target's queue, or else each compat-key queue of the profile's backend that a
    live worker polls (``queues``: name, polled by a live worker), as a parent flow would route it.
    None of those: :class:`~buildctl.engines.errors.UnroutableBuildError`, naming the command."""
    import re

    from buildctl.engines.errors import UnroutableBuildError

    if target_compat_key:
        return [work_queue_for(target_compat_key)]
    key = re.compile(rf"^{re.escape(backend)}-[0-9a-f]{{32}}$")
    live = sorted(name for name, polled in queues if polled and key.match(name))
    if not live:
        raise UnroutableBuildError(profile, backend, pool, why)
    return live


def recheck_queue_for(compat_key: str, soft: dict[str, Any]) -> str:
    """The work queue of re-checks on one set of soft values under a compat key: any worker of the
    key builds, but only one with the node's soft values (driver, compiler, ...) can say the
    engine runs on them. ``<compat key>-soft-<12 hex of the soft values>``."""
    from buildctl.core.digest import canonical_json, digest_bytes

    return f"{compat_key}-soft-{digest_bytes(canonical_json(soft)).split(':', 1)[1][:12]}"


#: Kubernetes node labels (``buildctl node labels``): the pod of a build for compat key K of
#: backend B is pinned to nodes labelled ``buildctl.io/compat-B=K`` (docker/k8s/base-job-template.json).
LABEL_PREFIX = "buildctl.io/"


def _label_value(value: Any) -> str:
    """A Kubernetes label value: at most 63 characters of ``[A-Za-z0-9_.-]``, alphanumeric at both ends."""
    text = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in str(value))[:63]
    return text.strip("-_.")


def node_labels(settings: Settings, fingerprint: Fingerprint) -> dict[str, str]:
    """This node's labels, for each backend whose build tool this runtime has (run it in the
    builder image on the node: the key covers the node's GPU and driver and the image's
    toolchain): ``buildctl.io/compat-<backend>`` = its compat key (what build jobs select on; the
    key hashes every hard field), and each hard field, readable (``buildctl.io/trtllm.gpu_name``),
    for people and ``kubectl get nodes -L``."""
    out = {}
    for backend in sorted(serving_queues(settings, fingerprint)):
        out[f"{LABEL_PREFIX}compat-{backend}"] = fingerprint.compat_key(backend)
        for field, value in fingerprint.compat_fields(backend).items():
            if field != "backend" and value is not None and _label_value(value):
                out[f"{LABEL_PREFIX}{backend}.{_label_value(field)}"] = _label_value(value)
    return out


def unlabelled_gpu_backends(settings: Settings, fingerprint: Fingerprint,
                            profiles: dict[str, BuildProfile]) -> dict[str, list[str]]:
    """The backends of GPU profiles (a build that takes GPUs) that this runtime cannot label: no
    compat key for them here (:func:`node_labels`), each with the profiles that need it."""
    served = serving_queues(settings, fingerprint)
    out: dict[str, list[str]] = {}
    for name, profile in sorted(profiles.items()):
        backend = profile.engine.backend
        if backend not in served and get_backend(backend, settings).gpus_needed(profile) > 0:
            out.setdefault(backend, []).append(name)
    return out


def job_variables(settings: Settings, profile: BuildProfile, compat_key: str) -> dict[str, Any]:
    """The Kubernetes job variables of a build run for ``profile`` on ``compat_key``
    (docker/k8s/base-job-template.json): the GPUs its build takes (the backend says), the node
    affinity's backend and key, and resources that grow with the GPUs: 4 CPUs and 8 GiB of
    /dev/shm per GPU (at least one's worth), 50 GiB of ephemeral storage per GPU (the work
    directory and the engine before publish), and memory from the profile's
    ``build_memory_limit_mb`` when it sets one, else 16 GiB per GPU."""
    backend = profile.engine.backend
    gpus = get_backend(backend, settings).gpus_needed(profile)
    n = max(1, gpus)
    limit_mb = profile.engine.build_memory_limit_mb
    memory = f"{limit_mb}Mi" if limit_mb else f"{16 * n}Gi"
    return {"gpus": gpus, "backend": backend, "compat_key": compat_key, "cpu_request": str(4 * n),
            "memory_request": memory, "memory_limit": memory, "ephemeral_storage": f"{50 * n}Gi",
            "shm_size": f"{8 * n}Gi"}


def serving_queues(settings: Settings, fingerprint: Fingerprint) -> dict[str, str]:
    """The work queues a worker on this host can serve, by backend: one per backend whose build tool
    this host has (its ``tool_version`` is known), named after the host's compat key for it."""
    out = {}
    for name in backend_names():
        if get_backend(name, settings).tool_version(fingerprint) is not None:
            out[name] = work_queue_for(fingerprint.compat_key(name))
    return out


def recheck_queues(settings: Settings, fingerprint: Fingerprint) -> dict[str, str]:
    """The re-check queues a worker on this host serves, by backend: its compat key and its own
    soft values (:func:`recheck_queue_for`), for each backend it can build."""
    return {b: recheck_queue_for(fingerprint.compat_key(b), fingerprint.soft_fields(b))
            for b in serving_queues(settings, fingerprint)}


def fleet_plan(store: Store, profiles: dict[str, BuildProfile], only_profiles: Iterable[str] | None = None,
               skipped: list[tuple[str, str]] | None = None) -> list[BuildNeed]:
    """Read the inventory and the artifacts, and plan. ``profiles``: name -> profile (``profiles.load_profiles``).
    ``skipped``: malformed node and quarantine records are listed there and passed over (an
    artifact whose quarantine record is malformed counts as quarantined: it is built again)."""
    skipped = [] if skipped is None else skipped
    backends = {n: p.engine.backend for n, p in profiles.items()}
    planned = set(backends if only_profiles is None else only_profiles)
    have = existing_pairs(store, {n: p.build_hash() for n, p in profiles.items() if n in planned}, skipped=skipped)
    if index_built(store):  # one LIST per 1,000 (node, profile) entries of the profiles planned
        wanted = sorted(planned & set(backends))
        return needs({(name, key): count for name in wanted
                      for key, count in demand_counts(store, name, backends[name]).items()}, have)
    inventory = read_inventory(store, skipped)
    return plan_builds(((n.profiles, node_compat_keys(n)) for n in inventory), backends, have, only_profiles)


def event_payload(result: ReportResult) -> dict[str, Any]:
    """The ``buildctl.node.driver-upgraded`` payload: old and new fingerprints, the soft fields that
    changed, and the node's profiles."""
    return {"node_id": result.record.node_id,
            "soft_changed": {b: {k: list(v) for k, v in d.items()} for b, d in result.soft_changed.items()},
            "old_fingerprint": result.previous.fingerprint if result.previous else None,
            "new_fingerprint": result.record.fingerprint,
            "old_compat_keys": result.previous.compat_keys if result.previous else None,
            "new_compat_keys": result.record.compat_keys,
            "profiles": list(result.record.profiles)}


def gc_policy(settings: Settings, *, keep: int | None = None, keep_history: int | None = None,
              grace_s: float | None = None, quarantine_retention_s: float | None = None,
              compact_history: bool = True) -> GcPolicy:
    """gc's policy: the operator's choices (None: the default) over the grace period and delete
    window of ``settings``, which the publishes use too."""
    chosen = {"keep": keep, "keep_history": keep_history, "quarantine_retention_s": quarantine_retention_s}
    return GcPolicy(grace_s=settings.gc_grace_s if grace_s is None else grace_s,
                    delete_window_s=settings.gc_delete_window_s, compact_history=compact_history,
                    **{k: v for k, v in chosen.items() if v is not None})


def gc(ctx: Context, policy: GcPolicy, *, dry_run: bool = False, now: datetime | None = None) -> GcResult:
    """``buildctl gc`` and the gc-store flow: the store's gc (which keeps what the nodes report)
    under ``policy`` (:func:`gc_policy`)."""
    return buildctl.artifact_store.gc.gc(ctx.store, policy, dry_run=dry_run, now=now)
