"""Planned upgrades: which nodes will have an engine after a driver or toolchain upgrade, and
what to re-check or build first so that the upgrade costs each node a swap, not a build.

A TARGET (:class:`~buildctl.engines.fingerprint.UpgradeTarget`) gives fingerprint fields after
the upgrade. Each node of the inventory is projected (its fingerprint with the target's fields),
and for each profile it serves gets one state:

* ``ready``: the channel's artifact for the projected compat key is validated (a passing
  attestation) on the projected soft values: the node can swap at once;
* ``promote``: an artifact for the key covers the projected values but the channel does not point
  at it yet (for ``prod``, CI's ``buildctl promote``);
* ``re-check``: an artifact for the key exists, but is not validated on those soft values;
* ``build``: no artifact for the key;
* ``blocked``: no worker queue serves the projected key (the queue is named; for a re-check, the
  queue of the key and the projected soft values, which only a worker on a host with those values
  polls), or the projected host is below one of the backend's floors.

Nodes are grouped by (profile, projected key, projected soft values): each group is decided once,
whatever its size. :func:`migrate_keys` re-points channels written under schema-1 compat keys.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

from buildctl.artifact_store.channels import ChannelMove, ChannelRecord, all_channel_records, read_channel, set_channel
from buildctl.artifact_store.errors import ChannelNotFoundError
from buildctl.artifact_store.fleet.inventory import NodeRecord, read_inventory, read_node
from buildctl.artifact_store.node.pull import resolve_channel
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.read import get_manifest
from buildctl.steps.context import Context, Say, quiet
from buildctl.steps.coverage import Coverage, artifacts_for_key, coverage, serving_key
from buildctl.engines.errors import EngineLoadError, IncompatibleTargetError
from buildctl.engines.fingerprint import Fingerprint, UpgradeTarget, host_fingerprint
from buildctl.engines.profile import BuildProfile
from buildctl.core.errors import GateRefusedError, NotFoundError
from buildctl.steps.node_index import node_fingerprint
from buildctl.steps.fleet import recheck_queue_for, recheck_queues, serving_queues, work_queue_for
from buildctl.artifact_store.promotion import PROTECTED_CHANNELS
from buildctl.steps.build import build, plan_build, publish, run_build
from buildctl.steps.host import host_compat_keys
from buildctl.steps.promote import promote
from buildctl.steps.validate import validate
from buildctl.validators.errors import ValidationFailedError

State = Literal["ready", "promote", "re-check", "build", "blocked"]
STATES: tuple[State, ...] = ("ready", "promote", "re-check", "build", "blocked")


class UnknownNodeError(NotFoundError):
    """``upgrade ready --node`` names a node the inventory does not hold."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"node {node_id!r} is not in the store's inventory (buildctl node report adds it)")


class NotReadyError(GateRefusedError):
    """A node is not ready for the upgrade: some profile has no validated engine for it yet."""

    def __init__(self, node_id: str, missing: list[str]) -> None:
        self.node_id = node_id
        self.missing = list(missing)
        super().__init__(f"node {node_id} is not ready for the upgrade: " + "; ".join(missing))


class UpgradeBlockedError(GateRefusedError):
    """A planned upgrade cannot be prepared: a projected key has no worker, or a host is below a floor."""

    def __init__(self, blocked: list[str]) -> None:
        self.blocked = list(blocked)
        super().__init__("upgrade blocked: " + "; ".join(blocked))


@dataclass
class Group:
    """Nodes that share a profile, a projected compat key and projected soft values."""

    profile: str
    backend: str
    compat_key: str
    projected: Fingerprint  # one node's projected fingerprint (they share what matters)
    nodes: list[str] = field(default_factory=list)
    state: State = "build"
    artifact_id: str | None = None
    detail: str = ""
    coverage: Coverage | None = None
    command: str | None = None  # for ``promote``: the command that moves the channel
    recheck: bool = False  # its work is a re-check: only a worker with the projected soft values can do it

    @property
    def queue(self) -> str:
        """The work queue of its work: the compat key's, or for a re-check the key's and projected
        soft values' (:func:`~buildctl.steps.fleet.recheck_queue_for`), which only a worker on a host
        with those values polls."""
        if self.recheck:
            return recheck_queue_for(self.compat_key, self.soft)
        return work_queue_for(self.compat_key)

    @property
    def soft(self) -> dict[str, Any]:
        """Its nodes' projected soft values for its backend."""
        return self.projected.soft_fields(self.backend)

    @property
    def gpu_model(self) -> str:
        names = sorted({g.name for g in self.projected.gpus})
        return ", ".join(names) if names else f"CPU {self.projected.cpu.isa_level}"

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "backend": self.backend, "compat_key": self.compat_key,
                "gpu_model": self.gpu_model, "soft": self.soft, "state": self.state,
                "artifact_id": self.artifact_id, "queue": self.queue, "detail": self.detail, "command": self.command,
                "nodes": sorted(self.nodes)}


# A node's swap to a staged engine, in minutes: `node activate` of a staged engine stays under a
# second (benchmarks/activate.py; tests/steps/test_node_agent.py checks the bound).
SWAP_MINUTES = 1 / 60
Outcome = Literal["swap", "fallback", "idle"]


@dataclass
class ServedGroup:
    """A group of nodes whose profile is a served model's preferred runtime, and what the upgrade
    costs them: ``swap`` (the engine for the projected key is ready), ``fallback`` (a fallback
    runtime is ready and in cross-runtime parity while the engine is built or re-checked) or
    ``idle`` (nothing covers them until the engine is ready)."""

    model: str
    group: Group
    outcome: Outcome
    runtime: str | None  # what the nodes serve right after the upgrade (None: nothing)
    detail: str
    ready_minutes: float | None  # until the preferred engine is ready (None: unknown)
    estimate: str  # where that figure comes from

    @property
    def node_minutes_without(self) -> float | None:
        """Node-minutes without a servable runtime: a swap each (two on a fallback: there and
        back), plus, when idle, the wait for the engine (None: unknown)."""
        n = len(self.group.nodes)
        if self.outcome == "swap":
            return n * SWAP_MINUTES
        if self.outcome == "fallback":
            return 2 * n * SWAP_MINUTES
        return None if self.ready_minutes is None else n * (self.ready_minutes + SWAP_MINUTES)

    @property
    def node_minutes_on_fallback(self) -> float | None:
        if self.outcome != "fallback":
            return 0.0
        return None if self.ready_minutes is None else len(self.group.nodes) * self.ready_minutes

    def to_json(self) -> dict[str, Any]:
        r = (lambda x: None if x is None else round(x, 2))
        return {"model": self.model, "profile": self.group.profile, "compat_key": self.group.compat_key,
                "gpu_model": self.group.gpu_model, "nodes": sorted(self.group.nodes), "engine_state": self.group.state,
                "outcome": self.outcome, "runtime": self.runtime, "detail": self.detail,
                "ready_minutes": r(self.ready_minutes), "estimate": self.estimate,
                "node_minutes_without_runtime": r(self.node_minutes_without),
                "node_minutes_on_fallback": r(self.node_minutes_on_fallback)}


@dataclass
class UpgradePlan:
    """Every node's state per profile after the target's upgrade."""

    target: dict[str, Any]
    channel: str
    groups: list[Group]
    skipped: list[str] = field(default_factory=list)  # nodes whose record cannot be read, and why
    served: list[ServedGroup] = field(default_factory=list)  # served models' groups: swap, fallback or idle

    def states_of(self, node_id: str) -> dict[str, Group]:
        return {g.profile: g for g in self.groups if node_id in g.nodes}

    def counts(self) -> dict[str, int]:
        """How many (node, profile) pairs are in each state."""
        c: Counter[str] = Counter()
        for g in self.groups:
            c[g.state] += len(g.nodes)
        return {s: c[s] for s in STATES if c[s]}

    def table(self) -> list[dict[str, Any]]:
        """One row per GPU model × profile × state (the prepare-upgrade flow's table artifact)."""
        rows: dict[tuple[str, str, str], dict[str, Any]] = {}
        for g in self.groups:
            row = rows.setdefault((g.gpu_model, g.profile, g.state), {
                "gpu model": g.gpu_model, "profile": g.profile, "state": g.state, "nodes": 0, "compat key": g.compat_key,
                "artifact": g.artifact_id or "", "detail": g.detail})
            row["nodes"] += len(g.nodes)
        return [rows[k] for k in sorted(rows)]

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "channel": self.channel, "counts": self.counts(),
                "groups": [g.to_json() for g in self.groups], "skipped": self.skipped,
                "served": [s.to_json() for s in self.served],
                "nodes": {n: {p: g.state for p, g in self.states_of(n).items()}
                          for n in sorted({n for g in self.groups for n in g.nodes})}}


def project(records: Iterable[NodeRecord], target: UpgradeTarget, profiles: dict[str, BuildProfile],
            nodes_glob: str | None = None) -> tuple[list[Group], list[str]]:
    """Group the nodes by (profile, projected key, projected soft values)."""
    groups: dict[tuple[str, str, str], Group] = {}
    skipped = []
    for rec in records:
        if nodes_glob and not fnmatch.fnmatchcase(rec.node_id, nodes_glob):
            continue
        fp = node_fingerprint(rec)
        if fp is None:
            skipped.append(f"{rec.node_id}: its recorded fingerprint does not parse")
            continue
        projected = target.apply(fp)
        for name in rec.profiles:
            profile = profiles.get(name)
            if profile is None:
                skipped.append(f"{rec.node_id}: profile {name} is not in the profile directory")
                continue
            backend = profile.engine.backend
            key = projected.compat_key(backend)
            gk = (name, key, json.dumps(projected.soft_fields(backend), sort_keys=True))
            g = groups.get(gk)
            if g is None:
                g = groups[gk] = Group(name, backend, key, projected)
            g.nodes.append(rec.node_id)
    return [groups[k] for k in sorted(groups)], skipped


def decide(ctx: Context, group: Group, profile: BuildProfile, channel: str, served: set[str] | None,
           memo: dict | None = None) -> None:
    """Set the group's state (see the module docstring). ``memo``: the artifacts per (profile,
    key) already listed for this plan (groups of one key share them)."""
    store, projected, backend = ctx.store, group.projected, group.backend
    floors = projected.floor_problems(backend)
    if floors:
        group.state, group.detail = "blocked", "; ".join(floors)
        return
    rec = _channel_record(store, group.profile, channel, projected)
    if rec is not None and active_quarantine(store, rec.artifact_id) is None:
        aid = rec.artifact_for(group.nodes[0])
        cov = coverage(store, aid, get_manifest(store, aid), projected)
        group.coverage, group.artifact_id = cov, aid
        if cov.floor_problems:
            group.state, group.detail = "blocked", "; ".join(cov.floor_problems)
            return
        if cov.covered:
            group.state, group.detail = "ready", f"{channel} #{rec.seq}, attestation {cov.attestation_id}"
            return
    memo = {} if memo is None else memo
    if (profile.name, group.compat_key) not in memo:
        memo[(profile.name, group.compat_key)] = artifacts_for_key(store, profile, group.compat_key)
    candidates = memo[(profile.name, group.compat_key)]
    covering = [(aid, c) for aid, m in candidates if (c := coverage(store, aid, m, projected)).covered]
    if covering:
        group.artifact_id, group.coverage = covering[0][0], covering[0][1]
        group.state = "promote"
        group.command = f"buildctl promote {covering[0][0]} --channel {channel}"
        group.detail = f"validated, not on {channel}: {group.command}" + ("   # from CI" if channel in PROTECTED_CHANNELS else "")
        return
    if group.artifact_id is None and candidates:
        group.artifact_id = candidates[0][0]
        group.coverage = coverage(store, candidates[0][0], candidates[0][1], projected)
    if group.artifact_id is not None:
        group.state, group.recheck = "re-check", True
        group.detail = group.coverage.describe() if group.coverage else ""
    else:
        group.state, group.detail = "build", f"no artifact of {group.profile} for {group.compat_key}"
    if served is not None and group.queue not in served:
        group.detail = f"no worker serves queue {group.queue} (needed to {group.state})" + (
            f": {group.detail}" if group.recheck and group.detail else "")
        group.state = "blocked"


def _channel_record(store, profile: str, channel: str, fp: Fingerprint) -> ChannelRecord | None:
    try:
        return resolve_channel(store, profile, channel, host_compat_keys(fp))
    except ChannelNotFoundError:
        return None


def plan(ctx: Context, target: UpgradeTarget, profiles: dict[str, BuildProfile], *, channel: str = "prod",
         nodes_glob: str | None = None, served: set[str] | None = None,
         records: Iterable[NodeRecord] | None = None) -> UpgradePlan:
    """The upgrade plan of the inventory's nodes (``records``: these instead). ``served``: the work
    queues that have a worker; ``None``: unknown, so nothing is blocked for want of one."""
    groups, skipped = project(read_inventory(ctx.store) if records is None else records, target, profiles, nodes_glob)
    memo: dict = {}
    for g in groups:
        decide(ctx, g, profiles[g.profile], channel, served, memo)
    outcomes, problems = served_outcomes(ctx, groups, profiles, channel, served, memo)
    return UpgradePlan(target.fields(), channel, groups, skipped + problems, outcomes)


def node_outcomes(ctx: Context, node_id: str, fp: Fingerprint, profiles: dict[str, BuildProfile],
                  serves: Iterable[str], channel: str = "prod") -> tuple[list[ServedGroup], list[str]]:
    """What one node with fingerprint ``fp`` (say, just upgraded) serves now, per served model whose
    preferred runtime is among the profiles it ``serves``: swap, fallback or idle, as
    :func:`served_outcomes` decides it for a group (``profiles``: every profile, so that a fallback
    the node does not serve yet counts). The fleet is pull-based: the node moves with ``pull --model`` (or
    ``node activate --model``), and back on a later pull once the engine is promoted."""
    wanted = set(serves)
    groups = [Group(name, p.engine.backend, fp.compat_key(p.engine.backend), fp, [node_id])
              for name, p in sorted(profiles.items()) if name in wanted]
    memo: dict = {}
    for g in groups:
        decide(ctx, g, profiles[g.profile], channel, None, memo)
    return served_outcomes(ctx, groups, profiles, channel, None, memo)


def served_outcomes(ctx: Context, groups: list[Group], profiles: dict[str, BuildProfile], channel: str,
                    served: set[str] | None, memo: dict) -> tuple[list[ServedGroup], list[str]]:
    """For each group whose profile is a served model's preferred runtime: swap, fallback or idle
    (see :class:`ServedGroup`). A fallback must be ``ready`` for the same projected nodes and in
    cross-runtime parity with the preferred runtime, as a node checks it. Also returns why served
    models were left out (a malformed file, a runtime not among ``profiles``)."""
    from buildctl.core.errors import BuildctlError
    from buildctl.steps.fallback import fallback_refusal
    from buildctl.steps.profiles import served_models

    try:
        models = served_models(ctx.settings)
    except BuildctlError as err:
        return [], [f"served models: {str(err).splitlines()[0]}"]
    out, problems = [], []
    for model in models:
        missing = [r for r in model.runtimes if r not in profiles]
        if missing:
            problems.append(f"served model {model.name}: runtimes {', '.join(missing)} not in this plan's profiles")
            continue
        for g in (g for g in groups if g.profile == model.preferred):
            if g.state == "ready":
                out.append(ServedGroup(model.name, g, "swap", g.profile, f"{g.profile} is ready: {g.detail}", 0.0,
                                       "ready"))
                continue
            minutes, estimate = _ready_minutes(ctx, g, profiles[g.profile])
            outcome = ServedGroup(model.name, g, "idle", None, f"{g.profile} is {g.state} ({g.detail}); no fallback "
                                  "is ready", minutes, estimate)
            why = []
            for name in model.runtimes[1:]:
                fb = profiles[name]
                other = Group(name, fb.engine.backend, g.projected.compat_key(fb.engine.backend), g.projected,
                              list(g.nodes))
                decide(ctx, other, fb, channel, served, memo)
                rec = _channel_record(ctx.store, name, channel, g.projected) if other.state == "ready" else None
                refusal = fallback_refusal(ctx, model, rec, rec.artifact_for(g.nodes[0])) if rec is not None else (
                    f"{other.state} ({other.detail})")
                if refusal is None:
                    outcome = ServedGroup(model.name, g, "fallback", name,
                                          f"{name} covers them while {g.profile} is {g.state} ({g.detail})",
                                          minutes, estimate)
                    break
                why.append(f"{name}: {refusal}")
            if outcome.outcome == "idle" and why:
                outcome.detail += ": " + "; ".join(why)
            out.append(outcome)
    return out, problems


def _ready_minutes(ctx: Context, group: Group, profile: BuildProfile) -> tuple[float | None, str]:
    """How long until the group's engine is ready, from the last build and validation of the
    profile on record (provenance, attestation): a re-check is a validation, a build both, a
    promote CI's move only. None when blocked or nothing is on record."""
    from buildctl.artifact_store.read import artifacts_built_from
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.artifact_store.trust.provenance import read_provenance

    if group.state == "promote":
        return 0.0, "a promote (CI's wait not counted)"
    if group.state == "blocked":
        return None, "blocked: until it is unblocked"
    build_s = validate_s = None
    for aid, _ in artifacts_built_from(ctx.store, profile.name, profile.build_hash())[:5]:
        if build_s is None and (prov := read_provenance(ctx.store, aid)) is not None:
            build_s = prov.build_seconds()
        if validate_s is None and (atts := list_attestations(ctx.store, aid)):
            validate_s = atts[-1].attestation.duration_s
    if validate_s is None or (group.state == "build" and build_s is None):
        return None, f"no {'build and ' if group.state == 'build' else ''}validation of {profile.name} on record"
    if group.state == "re-check":
        return validate_s / 60, f"the last validation of {profile.name} ({validate_s:.0f} s)"
    return (build_s + validate_s) / 60, f"the last build and validation of {profile.name} ({build_s:.0f} + {validate_s:.0f} s)"


def node_record(ctx: Context, node_id: str) -> NodeRecord:
    got = read_node(ctx.store, node_id)
    if got is None:
        raise UnknownNodeError(node_id)
    return got[0]


def ready(ctx: Context, node_id: str, target: UpgradeTarget, profiles: dict[str, BuildProfile], *,
          channel: str = "prod") -> UpgradePlan:
    """The node's plan; raises :class:`NotReadyError` (exit 5) listing what is missing unless every
    profile it serves is ``ready``."""
    p = plan(ctx, target, profiles, channel=channel, records=[node_record(ctx, node_id)])
    missing = [f"{g.profile}: {g.state} ({g.detail})" for g in p.groups if g.state != "ready"]
    missing += p.skipped
    if missing:
        raise NotReadyError(node_id, missing)
    return p


# --- migrate-keys ------------------------------------------------------------------------------


@dataclass
class KeyMove:
    """One channel ref under a schema-1 key and the ref it gets under its artifact's key now."""

    profile: str
    channel: str
    old_key: str
    new_key: str
    artifact_id: str
    action: Literal["re-point", "already there", "skipped"]
    detail: str = ""
    seq: int | None = None  # the new ref's record, once written

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "channel": self.channel, "old_key": self.old_key, "new_key": self.new_key,
                "artifact_id": self.artifact_id, "action": self.action, "detail": self.detail, "seq": self.seq}


def migrate_keys(ctx: Context, *, apply: bool = False, say: Say = quiet) -> list[KeyMove]:
    """Every channel ref whose key is not its artifact's key now (a schema-1 key), and with
    ``apply`` a ref under the new key for the same artifact, recorded in history with the old key
    in its reason. The old ref stays: nodes of this version resolve the new key first, and older
    node agents still find the old one. A ref whose new key already has one is left alone."""
    store = ctx.store
    moves = []
    for rec in sorted(all_channel_records(store), key=lambda r: (r.profile, r.channel, r.compat_key)):
        profile, channel, old = rec.profile, rec.channel, rec.compat_key
        manifest = get_manifest(store, rec.artifact_id)
        new = serving_key(manifest)
        if new == old:
            continue
        move = KeyMove(profile, channel, old, new, rec.artifact_id, "re-point")
        there = read_channel(store, profile, channel, new)
        if there is not None:
            move.action, move.detail = "already there", f"{new} has #{there[0].seq} ({there[0].artifact_id})"
        elif rec.rollout is not None and rec.rollout.live:
            move.action, move.detail = "skipped", "a rollout is live on the old key: finish or abort it first"
        elif apply:
            written = set_channel(store, rec.artifact_id, manifest, channel, auth=ctx.auth,
                                  move=ChannelMove(action="migrate-keys", compat_key=new, migrated_from=old,
                                                   reason=f"migrate-keys: from schema-1 key {old} (#{rec.seq})"))
            move.seq = written.seq
            say(f"{profile}/{channel}: {old} -> {new} (#{written.seq}, {rec.artifact_id})")
        moves.append(move)
    return moves


# --- prepare: re-check and build in process, as a worker of this host's fingerprint ------------


@dataclass
class Prepared:
    """What ``upgrade prepare`` did for one group."""

    profile: str
    compat_key: str
    action: Literal["re-checked", "rebuilt", "built", "promoted"]
    artifact_id: str | None
    detail: str
    seconds: float = 0.0
    promote_commands: list[str] = field(default_factory=list)  # what CI runs for a protected channel

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "compat_key": self.compat_key, "action": self.action,
                "artifact_id": self.artifact_id, "detail": self.detail, "seconds": round(self.seconds, 1),
                "promote_commands": self.promote_commands}


def prepare(ctx: Context, target: UpgradeTarget, profiles: dict[str, BuildProfile], *, channel: str = "prod",
            nodes_glob: str | None = None, say: Say = quiet) -> tuple[list[Prepared], UpgradePlan]:
    """Run the plan's re-checks and builds here, as a worker of this host's fingerprint: groups
    of another compat key are left to their workers, and a re-check of soft values other than this
    host's is left to a worker that has them (both are ``blocked`` here, naming the queue). New builds go to ``staging`` (and to ``channel`` when
    it is not a protected one); a re-check only adds an attestation. For a protected channel the
    ``buildctl promote`` commands CI runs are returned. Returns what was done and the plan after."""
    ctx = ctx.with_fingerprint(host_fingerprint(ctx.settings))  # this host as it is now: measured at each prepare
    host = ctx.fingerprint
    served = set(serving_queues(ctx.settings, host).values()) | set(recheck_queues(ctx.settings, host).values())
    before = plan(ctx, target, profiles, channel=channel, nodes_glob=nodes_glob, served=served)
    done: list[Prepared] = []

    def validated(aid: str) -> str | None:
        """Why validation here failed (its reasons, or that the engine did not load: a soft change
        can break loading), or None when it passed."""
        try:
            validate(ctx, aid, say=say)
            return None
        except ValidationFailedError as err:
            return "; ".join(err.attestation.reasons) or err.attestation.verdict
        except (EngineLoadError, IncompatibleTargetError) as err:
            return f"it did not load here: {str(err).splitlines()[0]}"

    def promoted(aid: str) -> list[str]:
        promote(ctx, aid, "staging")
        if channel in PROTECTED_CHANNELS:
            return [f"buildctl promote {aid} --channel {channel}"]
        if channel != "staging":
            promote(ctx, aid, channel)
        return []

    for g in before.groups:
        profile = profiles[g.profile]
        if g.state in ("ready", "blocked"):
            continue
        t0 = time.monotonic()
        if g.state == "promote" and g.artifact_id is not None:
            cmds = promoted(g.artifact_id) if channel not in PROTECTED_CHANNELS else [
                f"buildctl promote {g.artifact_id} --channel {channel}"]
            done.append(Prepared(g.profile, g.compat_key, "promoted", g.artifact_id,
                                 "validated earlier" + (f"; promoted to {channel}" if not cmds else ""), 0.0, cmds))
            continue
        if g.state == "re-check" and g.artifact_id is not None:
            say(f"{g.profile}: re-checking {g.artifact_id} on this host")
            why = validated(g.artifact_id)
            if why is None:
                done.append(Prepared(g.profile, g.compat_key, "re-checked", g.artifact_id,
                                     "re-checked on this host, no rebuild", time.monotonic() - t0))
                continue
            say(f"{g.profile}: re-check failed ({why}): rebuilding")
            bp = plan_build(ctx, profile, fingerprint=host, rebuild_of=g.artifact_id, say=say)
            if bp.cached is None:
                built = run_build(ctx.settings, bp, say=say)
                try:
                    pub = publish(ctx, built, say=say)
                finally:
                    shutil.rmtree(built.run_dir, ignore_errors=True)
                aid = pub.build_key_owner or pub.artifact_id
            else:
                aid = bp.cached
            failed = validated(aid)
            if failed is not None:
                done.append(Prepared(g.profile, g.compat_key, "rebuilt", aid,
                                     f"re-check failed ({why}); the rebuild failed validation too ({failed})",
                                     time.monotonic() - t0))
                continue
            done.append(Prepared(g.profile, g.compat_key, "rebuilt", aid, f"re-check failed ({why}): rebuilt",
                                 time.monotonic() - t0, promoted(aid)))
            continue
        say(f"{g.profile}: building for {g.compat_key}")
        outcome = build(ctx, profile, fingerprint=host, say=say)
        failed = validated(outcome.artifact_id)
        if failed is not None:
            done.append(Prepared(g.profile, g.compat_key, "built", outcome.artifact_id,
                                 f"built; validation failed ({failed})", time.monotonic() - t0))
            continue
        done.append(Prepared(g.profile, g.compat_key, "built", outcome.artifact_id,
                             "cache hit" if outcome.cache_hit else f"built in {outcome.build_s:.0f} s",
                             time.monotonic() - t0, promoted(outcome.artifact_id)))
    return done, plan(ctx, target, profiles, channel=channel, nodes_glob=nodes_glob, served=served)
