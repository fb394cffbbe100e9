"""Rollout decisions: count each wave's nodes from the inventory, and move rollouts on.

Plain functions; the ``rollout-channel`` flow and ``buildctl rollout`` call them. A wave's nodes
are the inventory's nodes that serve the profile on the channel ref's compat key and whose wave
bucket is inside the wave's percentage (waves are cumulative). A node counts as *failed* for the
rollout when its engine state for the channel says its smoke check of the new artifact failed, or
it refused to install it (a pull failure about the artifact: bad bytes, quarantine, signature);
*healthy* when its check passed; *installed* while the
check runs; otherwise it is *pending* (it has not pulled yet).

:func:`decide` is pure: failures over the current wave's budget halt the rollout at once (active or
paused); an active wave whose bake time has passed within budget advances, or completes the
rollout when it is the last. :func:`tick` applies the decisions, each against the record it was
made on (compare-and-swap: a channel that moved meanwhile is decided again next time).

Once the store's node index is built (:mod:`buildctl.steps.node_index`), a view counts from its scope
and status markers (two LISTs per channel ref) instead of reading every node record; a node with
two states is read, and a halt is decided only on failures the failed nodes' records confirm.

:func:`rollout_step` writes each step (advance, complete, pause, resume, halt, abort) as a new,
signed channel record.

Signed channel records expire (``Settings.record_ttl_s``); :func:`resign_due` re-signs every
current record whose expiry is near, so nodes can refuse a frozen or replayed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from pydantic import Field

from buildctl.core.records import Record
from buildctl.steps.context import Context
from buildctl.steps.node_index import node_fingerprint
from buildctl.steps.node_index import index_built, scope_nodes, state_of, status_states
from buildctl.core.times import now_utc, parse_utc, utc_now
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import (
    ChannelRecord,
    all_channel_records,
    channel_compat_keys,
    channel_key,
    move_channel,
    read_channel,
    resign,
)
from buildctl.artifact_store.fleet.inventory import ARTIFACT_REFUSALS, NodeRecord, read_inventory, read_node
from buildctl.artifact_store.errors import (
    CasConflictError,
    ChannelNotFoundError,
    CorruptObjectError,
    RolloutStateError,
    StoreArgumentError,
)
from buildctl.artifact_store.backends.listing import map_bounded
from buildctl.artifact_store.fleet.waves import WaveSummary, in_wave
from buildctl.artifact_store.read import get_manifest

NODE_STATES = ("healthy", "failed", "installed", "pending")


@dataclass(frozen=True)
class WaveCount:
    """One wave's nodes and how they are doing with the new artifact."""

    index: int
    percent: float
    max_failures: str
    allowed: int
    nodes: int
    healthy: int
    failed: int
    installed: int
    pending: int
    failed_nodes: tuple[str, ...]
    state: str  # done, current, waiting

    @property
    def done(self) -> int:
        return self.healthy + self.failed


@dataclass
class RolloutView:
    """A rollout as the inventory sees it, and what should happen next."""

    record: ChannelRecord
    waves: list[WaveCount]
    decision: str  # advance, complete, halt, wait, none
    why: str
    bake_left_s: float = 0.0
    applied: ChannelRecord | None = field(default=None)

    def to_json(self) -> dict:
        r = self.record.rollout
        return {"profile": self.record.profile, "channel": self.record.channel, "compat_key": self.record.compat_key,
                "seq": self.record.seq, "state": r.state if r else None, "target": r.target if r else None,
                "base": r.base if r else None, "wave": (r.wave + 1) if r else None, "bake_s": r.bake_s if r else None,
                "bake_left_s": round(self.bake_left_s, 3), "decision": self.decision, "why": self.why,
                "failed_nodes": list(r.failed_nodes) if r else [],
                "summaries": [s.model_dump(mode="json") for s in r.summaries] if r else [],
                "applied_seq": self.applied.seq if self.applied else None,
                "waves": [{"wave": w.index + 1, "percent": w.percent, "max_failures": w.max_failures,
                           "allowed": w.allowed, "nodes": w.nodes, "done": w.done, "healthy": w.healthy,
                           "failed": w.failed, "installed": w.installed, "pending": w.pending,
                           "failed_nodes": list(w.failed_nodes), "state": w.state} for w in self.waves]}


def node_status(node: NodeRecord, profile: str, channel: str, target: str) -> str:
    """healthy, failed, installed or pending: this node with ``target`` on the channel."""
    e = node.engine(profile, channel)
    if e is not None and e.artifact_id == target:
        return e.status
    if any(f.artifact_id == target and f.profile == profile and f.channel == channel
           and f.error.startswith(ARTIFACT_REFUSALS) for f in node.pull_failures):
        return "failed"
    return "pending"


def nodes_in_scope(nodes: Iterable[NodeRecord], profile: str, channel: str, backend: str, compat_key: str) -> list[NodeRecord]:
    """The nodes a channel ref reaches: serving the profile (or having pulled it) on its compat key
    (the key their record holds, or, across the hard/soft key change, the new or the schema-1 key
    of their fingerprint: a node resolves both)."""
    return [n for n in nodes if (profile in n.profiles or n.engine(profile, channel) is not None)
            and on_key(n, backend, compat_key)]


def on_key(node: NodeRecord, backend: str, compat_key: str) -> bool:
    if node.compat_keys.get(backend) == compat_key:
        return True
    fp = node_fingerprint(node)
    return fp is not None and compat_key in (fp.compat_key(backend), fp.legacy_compat_key(backend))


def decide(rec: ChannelRecord, nodes: list[NodeRecord], now: datetime) -> RolloutView:
    """Count the waves and decide; ``nodes`` are the ones in scope (:func:`nodes_in_scope`)."""
    r = rec.rollout
    status = {n.node_id: node_status(n, rec.profile, rec.channel, r.target) for n in nodes} if r else {}
    return decide_statuses(rec, status, now)


def decide_statuses(rec: ChannelRecord, status: dict[str, str], now: datetime) -> RolloutView:
    """:func:`decide` on each in-scope node's status (node id -> :data:`NODE_STATES`)."""
    r = rec.rollout
    if r is None:
        return RolloutView(rec, [], "none", "no rollout on this channel")
    waves = []
    for i, w in enumerate(r.waves):
        members = sorted(n for n in status if in_wave(rec.profile, rec.channel, n, w.percent))
        counts = {s: sum(status[m] == s for m in members) for s in NODE_STATES}
        state = "done" if i < r.wave or r.state == "completed" else ("current" if i == r.wave else "waiting")
        waves.append(WaveCount(i, w.percent, w.max_failures, w.allowed_failures(len(members)), len(members),
                               counts["healthy"], counts["failed"], counts["installed"], counts["pending"],
                               tuple(m for m in members if status[m] == "failed"), state))
    if not r.live:
        return RolloutView(rec, waves, "none", f"rollout {r.state}")
    cur = waves[r.wave]
    bake_left = max(0.0, (parse_utc(r.wave_started_at) + timedelta(seconds=r.bake_s) - now).total_seconds())
    label = f"wave {r.wave + 1} ({cur.percent:g}%)"
    if cur.failed > cur.allowed:
        return RolloutView(rec, waves, "halt", f"{label}: {cur.failed} failed of {cur.nodes} nodes, budget "
                           f"{cur.allowed} ({cur.max_failures}): {', '.join(cur.failed_nodes)}", bake_left)
    if r.state == "paused":
        return RolloutView(rec, waves, "wait", f"{label}: paused", bake_left)
    if bake_left > 0:
        return RolloutView(rec, waves, "wait", f"{label}: baking, {bake_left:.0f}s left; {cur.healthy} healthy, "
                           f"{cur.failed} failed, {cur.pending + cur.installed} not reported of {cur.nodes}", bake_left)
    if r.wave + 1 < len(r.waves):
        return RolloutView(rec, waves, "advance", f"{label} baked with {cur.failed} failure(s) of {cur.nodes} "
                           f"(budget {cur.allowed}): on to {r.waves[r.wave + 1].percent:g}%")
    return RolloutView(rec, waves, "complete", f"{label} baked with {cur.failed} failure(s) of {cur.nodes} "
                       f"(budget {cur.allowed}): rollout complete")


# --- rollout steps: each a new, signed history record --------------------------------------------

ROLLOUT_STEPS = ("advance", "complete", "pause", "resume", "halt", "abort")


class StepBasis(Record):
    """What a rollout step was decided on (the tick's, for :func:`rollout_step`)."""

    expect_seq: int | None = Field(None, description="the record the decision was made on (None: the current one)")
    failed_nodes: tuple[str, ...] = Field((), description="a halt: the wave's failed nodes, recorded")
    summary: WaveSummary | None = Field(None, description="the tick's count of the wave it decided on")


def rollout_step(store: Store, profile: str, channel: str, compat_key: str, step: str, *,
                 auth: Authority = Authority(), reason: str | None = None,
                 basis: StepBasis = StepBasis()) -> ChannelRecord:
    """Move a live rollout on: ``advance`` to the next wave, ``complete`` it (every node has the
    new artifact), ``pause``/``resume`` it, or ``halt`` (failures over budget) / ``abort`` (an
    operator) it, which points the channel back at the rollout's base artifact. ``basis.expect_seq``:
    the record the decision was made on; if the channel moved since, :class:`CasConflictError`
    (decide again on the new record). ``basis.summary``: the tick's count of the wave it decided on,
    appended to the rollout's ``summaries`` in the record written; ``basis.failed_nodes``: a halt's."""
    expect_seq, failed_nodes, summary = basis.expect_seq, basis.failed_nodes, basis.summary
    if step not in ROLLOUT_STEPS:
        raise StoreArgumentError(f"unknown rollout step {step!r}: one of {', '.join(ROLLOUT_STEPS)}")

    def make(current: ChannelRecord | None) -> dict[str, Any] | None:
        if current is None:
            return None  # move_channel says the channel does not exist
        if expect_seq is not None and current.seq != expect_seq:
            raise CasConflictError(channel_key(profile, channel, compat_key), 1)
        r = current.rollout
        if r is None or not r.live:
            raise RolloutStateError(f"channel {channel} of {profile} [{compat_key}] has no rollout in progress"
                                    + (f" (the last one is {r.state})" if r else ""))
        keep = {k: getattr(current, k) for k in ("artifact_id", "previous", "verified_at", "verify_window_s")}
        if summary is not None:
            r = r.model_copy(update={"summaries": (*r.summaries, summary)})
        if step == "pause":
            if r.state == "paused":
                return None
            return {**keep, "action": "pause", "reason": reason, "rollout": r.model_copy(update={"state": "paused"})}
        if step == "resume":
            if r.state == "active":
                return None
            return {**keep, "action": "resume", "reason": reason, "rollout": r.model_copy(update={"state": "active"})}
        if r.state != "active" and step in ("advance", "complete"):
            raise RolloutStateError(f"the rollout on {channel} of {profile} is {r.state}: resume it first")
        if step == "advance":
            if r.wave + 1 >= len(r.waves):
                raise RolloutStateError(f"the rollout on {channel} of {profile} is in its last wave: complete it")
            return {**keep, "action": "advance", "reason": reason,
                    "rollout": r.model_copy(update={"wave": r.wave + 1, "wave_started_at": utc_now()})}
        if step == "complete":
            if r.wave + 1 != len(r.waves):
                raise RolloutStateError(f"the rollout on {channel} of {profile} is in wave {r.wave + 1} of {len(r.waves)}")
            return {**keep, "action": "complete", "reason": reason, "rollout": r.model_copy(update={"state": "completed"})}
        ended = "halted" if step == "halt" else "aborted"
        return {"artifact_id": r.base, "previous": r.target, "action": "rollback", "reason": reason or f"rollout {ended}",
                "verified_at": None, "verify_window_s": None,
                "rollout": r.model_copy(update={"state": ended, "failed_nodes": tuple(failed_nodes)})}

    return move_channel(store, profile, channel, compat_key, make, auth=auth)



def _records(store: Store, profile: str | None, channel: str, compat_key: str | None,
             skipped: list[tuple[str, str]] | None = None) -> list[ChannelRecord]:
    if profile is None:  # every profile's refs of the channel (tick: no caller narrows them by key)
        recs = [r for r in all_channel_records(store, skipped) if r.channel == channel]
    else:  # only this profile's refs: no need to read the whole store's channels
        recs = []

        def read(k: str) -> tuple[ChannelRecord, str] | CorruptObjectError | None:
            try:
                return read_channel(store, profile, channel, k)
            except CorruptObjectError as err:
                return err

        keys = [compat_key] if compat_key else channel_compat_keys(store, profile, channel)
        for k, got in zip(keys, map_bounded(read, keys)):  # the refs read at once
            if isinstance(got, CorruptObjectError):
                if skipped is None:
                    raise got
                skipped.append((channel_key(profile, channel, k), got.detail))
            elif got is not None:
                recs.append(got[0])
    if not recs and profile is not None and not skipped:
        from buildctl.artifact_store.node.pull import unknown_name

        raise ChannelNotFoundError(profile, channel, [compat_key or "<any>"], unknown_name(store, profile, channel))
    return sorted(recs, key=lambda r: (r.profile, r.compat_key))


def view(store: Store, rec: ChannelRecord, nodes: list[NodeRecord] | None = None,
         now: datetime | None = None) -> RolloutView:
    """The rollout on one channel ref, counted from the inventory: from ``nodes``, else from the
    node index once the store has one (two LISTs; a wave about to move on is read from its nodes'
    records, as the tick does), else from every node record."""
    return _view(store, rec, _inventory(store) if nodes is None else nodes, now, confirm=True)


def _inventory(store: Store, skipped: list[tuple[str, str]] | None = None) -> list[NodeRecord] | None:
    """Every node record, or None where the node index is built (the views LIST it per ref)."""
    return None if index_built(store) else read_inventory(store, skipped)


def _view(store: Store, rec: ChannelRecord, nodes: list[NodeRecord] | None, now: datetime | None,
          skipped: list[tuple[str, str]] | None = None, confirm: bool = False) -> RolloutView:
    """:func:`view` on ``nodes`` (None: from the node index; malformed markers go to ``skipped``)."""
    now = now or now_utc()
    if rec.rollout is None:
        return decide(rec, [], now)
    backend = get_manifest(store, rec.rollout.target).backend
    if nodes is None:
        return _view_from_index(store, rec, backend, now, skipped, confirm)
    return decide(rec, nodes_in_scope(nodes, rec.profile, rec.channel, backend, rec.compat_key), now)


def _view_from_index(store: Store, rec: ChannelRecord, backend: str, now: datetime,
                     skipped: list[tuple[str, str]] | None = None, confirm: bool = False) -> RolloutView:
    """The view from the node index's scope and status markers. The index may hold extra markers
    (an update interrupted between its markers and its record), so a node whose markers disagree
    or are malformed is read (a malformed marker is listed in ``skipped``, never fatal), and a
    halt is decided only on failures its nodes' own records confirm. With ``confirm`` (the tick,
    which acts), a wave moves on only when its members' records agree: `rollout status` shows
    the markers' view without reading them."""
    r = rec.rollout
    states = status_states(store, rec.profile, rec.channel, r.target, skipped)
    status: dict[str, str] = {}
    unsure = []
    for node_id in scope_nodes(store, rec.profile, rec.channel, backend, rec.compat_key):
        got = state_of(states.get(node_id, set()))
        if got is None:
            unsure.append(node_id)
        else:
            status[node_id] = got

    def from_records(node_ids: list[str]) -> None:  # the records read at once
        for node_id, got in zip(node_ids, map_bounded(lambda n: read_node(store, n), node_ids)):
            status.pop(node_id, None)
            if got is not None and nodes_in_scope([got[0]], rec.profile, rec.channel, backend, rec.compat_key):
                status[node_id] = node_status(got[0], rec.profile, rec.channel, r.target)

    from_records(unsure)
    v = decide_statuses(rec, status, now)
    if v.decision == "halt":
        from_records(list(v.waves[r.wave].failed_nodes))
        v = decide_statuses(rec, status, now)
    elif confirm and v.decision in ("advance", "complete"):
        # a marker alone never moves a wave on (any node role can write one): the current wave's
        # members are read from their records, once per wave, before it moves
        from_records([n for n in status if in_wave(rec.profile, rec.channel, n, r.waves[r.wave].percent)])
        v = decide_statuses(rec, status, now)
    return v


def status(store: Store, profile: str, channel: str, compat_key: str | None = None,
           skipped: list[tuple[str, str]] | None = None) -> list[RolloutView]:
    """Every compat key's rollout view of the channel (``buildctl rollout status``). With
    ``skipped``, malformed channel refs and node records are listed there and left out of the view
    (``tick``, which moves waves, never passes over a node it cannot read)."""
    nodes = _inventory(store, skipped)
    recs = _records(store, profile, channel, compat_key, skipped)
    per_ref: list[list[tuple[str, str]]] = [[] for _ in recs]
    views = map_bounded(lambda i: _view(store, recs[i], nodes, None, per_ref[i]), list(range(len(recs))))
    if skipped is not None:
        skipped.extend(s for lst in per_ref for s in lst)
    return views


def tick(ctx: Context, *, channel: str, profile: str | None = None, now: datetime | None = None) -> list[RolloutView]:
    """Decide every live rollout on ``channel`` (of ``profile``, or of every profile) and apply the
    decisions; returns the views, each with the record written (``applied``), if any."""
    store = ctx.store
    nodes = _inventory(store)
    live = [rec for rec in _records(store, profile, channel, None) if rec.rollout is not None and rec.rollout.live]
    out = []
    malformed: list[list[tuple[str, str]]] = [[] for _ in live]  # passed over: the nodes' records decided
    # The refs' views are counted at once (each LISTs its own markers); the decisions are applied in order.
    views = map_bounded(lambda i: _view(store, live[i], nodes, now, malformed[i], confirm=True),
                        list(range(len(live))))
    for rec, v, bad in zip(live, views, malformed):
        if bad:
            v.why += f" ({len(bad)} malformed status marker(s) passed over, their nodes' records read: {bad[0][0]}" \
                     + (", ..." if len(bad) > 1 else "") + ")"
        if v.decision in ("advance", "complete", "halt"):
            cur = v.waves[rec.rollout.wave]
            failed = cur.failed_nodes if v.decision == "halt" else ()
            summary = WaveSummary(wave=cur.index, percent=cur.percent, decision=v.decision, at=utc_now(), nodes=cur.nodes,
                                  healthy=cur.healthy, failed=cur.failed, installed=cur.installed, pending=cur.pending,
                                  allowed=cur.allowed)
            try:
                v.applied = rollout_step(store, rec.profile, rec.channel, rec.compat_key, v.decision, auth=ctx.auth,
                                         reason=f"rollout-channel: {v.why}",
                                         basis=StepBasis(expect_seq=rec.seq, failed_nodes=failed, summary=summary))
            except CasConflictError:
                v.why += " (the channel moved meanwhile; decided again next time)"
        out.append(v)
    return out


def control(ctx: Context, step: str, profile: str, channel: str, compat_key: str | None = None,
            reason: str | None = None) -> list[ChannelRecord]:
    """``buildctl rollout pause|resume|abort``: apply ``step`` to the channel's live rollouts."""
    if step not in ("pause", "resume", "abort"):
        raise StoreArgumentError(f"unknown rollout command {step!r}: pause, resume or abort")
    store = ctx.store
    recs = [r for r in _records(store, profile, channel, compat_key) if r.rollout is not None and r.rollout.live]
    if not recs:
        raise StoreArgumentError(f"no rollout in progress on {channel} of {profile}"
                                 + (f" [{compat_key}]" if compat_key else ""))
    return [rollout_step(store, r.profile, r.channel, r.compat_key, step, auth=ctx.auth, reason=reason) for r in recs]


def resign_due(ctx: Context, *, margin_s: float, now: datetime | None = None) -> list[ChannelRecord]:
    """Re-sign every current channel record that expires within ``margin_s`` (or carries no
    expiry) with the context's key; returns the new records."""
    settings, store = ctx.settings, ctx.store
    if ctx.auth.signer is None:
        raise StoreArgumentError("resign-channels needs a signing key (BUILDCTL_SIGNING_KEY): records are re-signed")
    if not settings.record_ttl_s:
        raise StoreArgumentError("record_ttl_s is 0 (records do not expire): nothing to re-sign")
    if margin_s >= settings.record_ttl_s:
        raise StoreArgumentError(f"margin {margin_s:g}s is not below the record lifetime {settings.record_ttl_s:g}s: "
                                 "every run would re-sign everything")
    horizon = (now or now_utc()) + timedelta(seconds=margin_s)
    out = []
    for rec in all_channel_records(store):
        if rec.expires is not None and parse_utc(rec.expires) > horizon:
            continue
        got = read_channel(store, rec.profile, rec.channel, rec.compat_key)
        if got is not None and got[0].seq == rec.seq:
            new = resign(store, rec, auth=ctx.auth)
            if new.seq != rec.seq:
                out.append(new)
    return out
