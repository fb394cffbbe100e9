"""Healing: what the pipeline does when an artifact's stored bytes rot.

* :func:`heal_artifact`: deep-verify the store's copy; only a failing store copy is quarantined
  (one node's bad disk never takes a good artifact out of service); roll every channel that
  points at it back to the newest earlier artifact that deep-verifies, is not quarantined and
  (for protected channels) has a passing attestation; repair it from a verified copy when one is
  given; otherwise say which (profile, compat key) pairs need a rebuild.
* :func:`scrub`: deep-verify artifacts, channel-referenced ones first, within a sample and a
  byte budget (like ``restic check --read-data-subset``), quarantining every failure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from buildctl.steps.context import Context
from buildctl.steps import node_index
from buildctl.steps.node_index import IndexReport, index_built
from buildctl.artifact_store.promotion import PROTECTED_CHANNELS
from buildctl.steps.validate import passing_attestation
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import all_channel_records, channels_pointing_at, checked_history, history
from buildctl.artifact_store.promotion import rollback
from buildctl.artifact_store.errors import (ArtifactNotFoundError, CorruptObjectError, QuarantinedError, StoreArgumentError,
                                           VerificationError)
from buildctl.artifact_store.upkeep.integrity import verify_recent_or_quarantine, verify_deep_or_quarantine
import buildctl.artifact_store.quarantine
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.records import check_records
from buildctl.artifact_store.upkeep.repair import RepairResult, manifest_copies, repair_from, restore_manifest
from buildctl.artifact_store.read import get_manifest, list_artifacts, resolve_artifact, scan_manifests


@dataclass
class ChannelRecovery:
    """What recovery did to one channel ref that pointed at a quarantined artifact."""

    profile: str
    channel: str
    compat_key: str
    rolled_back_to: str | None  # None: no earlier artifact qualified; the ref still points at the bad one
    seq: int | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return {"profile": self.profile, "channel": self.channel, "compat_key": self.compat_key,
                "rolled_back_to": self.rolled_back_to, "seq": self.seq, "detail": self.detail}


@dataclass
class HealReport:
    artifact_id: str
    store_copy_ok: bool
    quarantine_key: str | None = None
    problems: list[str] = field(default_factory=list)
    recoveries: list[ChannelRecovery] = field(default_factory=list)
    repair: RepairResult | None = None
    rebuild: list[tuple[str, str]] = field(default_factory=list)  # (profile, compat key) still to rebuild

    def to_json(self) -> dict:
        return {"artifact_id": self.artifact_id, "store_copy_ok": self.store_copy_ok,
                "quarantine_record": self.quarantine_key, "problems": self.problems,
                "channels": [r.to_json() for r in self.recoveries],
                "repaired": self.repair.replaced if self.repair else [],
                "healthy_after_repair": bool(self.repair and self.repair.healthy),
                "rebuild": [{"profile": p, "compat_key": k} for p, k in self.rebuild]}


def quarantine(ctx: Context, artifact_ref: str, reason: str) -> tuple[str, str]:
    """Quarantine by hand (``buildctl quarantine``); returns (artifact id, record key)."""
    if not reason.strip():
        raise StoreArgumentError("--reason must say why the artifact is quarantined")
    artifact_id = resolve_artifact(ctx.store, artifact_ref)
    key, _ = buildctl.artifact_store.quarantine.quarantine(ctx.store, artifact_id, reason, auth=ctx.auth)
    return artifact_id, key


def recover_channels(ctx: Context, artifact_id: str) -> list[ChannelRecovery]:
    """Roll every channel ref that points at the (quarantined) artifact back to its newest earlier
    artifact that is not quarantined, deep-verifies and, on a protected channel, passed validation
    for the compat key. Each rollback is a new history record whose reason names the quarantine."""
    store = ctx.store
    active = active_quarantine(store, artifact_id)
    why = f"quarantine of {artifact_id}" + (f": {active[1].reason}" if active else "")
    out = []
    for rec in channels_pointing_at(store, artifact_id):
        target, detail = None, "no earlier artifact deep-verifies and qualifies"
        tried: set[str] = {artifact_id}
        for past in reversed(history(store, rec.profile, rec.channel, rec.compat_key)):
            cand = past.artifact_id
            if cand in tried:
                continue
            tried.add(cand)
            if rec.channel in PROTECTED_CHANNELS and passing_attestation(store, cand, rec.compat_key) is None:
                continue
            try:
                verify_recent_or_quarantine(store, cand, detector=f"recovery of {rec.channel}", auth=ctx.auth,
                                            window_s=0)
            except (VerificationError, QuarantinedError, ArtifactNotFoundError):
                continue
            target = cand
            break
        if target is None:
            out.append(ChannelRecovery(rec.profile, rec.channel, rec.compat_key, None, detail=detail))
            continue
        new = rollback(store, rec.profile, rec.channel, auth=ctx.auth, to=target, compat_key=rec.compat_key, reason=why)
        out.append(ChannelRecovery(rec.profile, rec.channel, rec.compat_key, target, new.seq, "rolled back"))
    return out


def heal_artifact(ctx: Context, artifact_ref: str, *, repair_source: str | None = None) -> HealReport:
    """Deep verify -> quarantine -> roll channels back -> repair (from ``repair_source``) or name the rebuilds."""
    store = ctx.store
    artifact_id = resolve_artifact(store, artifact_ref)
    report = HealReport(artifact_id, store_copy_ok=False)
    restored = restore_manifest(store, artifact_id, manifest_copies(artifact_id, repair_source, ctx.open_other)
                                if repair_source else ())  # a manifest that does not hash to its id first
    if restored is not None:
        report.problems.append(f"manifest: its bytes did not hash to {artifact_id}; restored from {restored}")
    active = active_quarantine(store, artifact_id)
    if active is None:
        try:
            verify_deep_or_quarantine(store, artifact_id, detector="heal", auth=ctx.auth)
            report.store_copy_ok = True  # the reporter's own copy was bad: nothing to do in the store
            return report
        except VerificationError as err:
            report.problems = [p.render() for p in err.problems]
            report.quarantine_key = err.quarantine_key
    else:
        report.quarantine_key, report.problems = active[0], list(active[1].problems)
    report.recoveries = recover_channels(ctx, artifact_id)
    if repair_source:
        report.repair = repair_from(store, artifact_id, repair_source, open_store=ctx.open_other, auth=ctx.auth)
    if report.repair is None or not report.repair.healthy:
        m = get_manifest(store, artifact_id)
        report.rebuild = [(m.profile_name, m.compat_key)]
    return report


def repair(ctx: Context, artifact_ref: str, source: str) -> RepairResult:
    """``buildctl repair ARTIFACT --from DIR|STORE-URI``."""
    artifact_id = resolve_artifact(ctx.store, artifact_ref)
    restore_manifest(ctx.store, artifact_id, manifest_copies(artifact_id, source, ctx.open_other))
    return repair_from(ctx.store, artifact_id, source, open_store=ctx.open_other, auth=ctx.auth)


@dataclass
class ScrubRow:
    artifact_id: str
    profile: str
    channels: list[str]
    bytes: int
    status: str  # ok, corrupt, quarantined (already), skipped (budget)
    problems: list[str] = field(default_factory=list)
    quarantine_key: str | None = None

    def to_json(self) -> dict:
        return {"artifact_id": self.artifact_id, "profile": self.profile, "channels": self.channels, "bytes": self.bytes,
                "status": self.status, "problems": self.problems, "quarantine_record": self.quarantine_key}


@dataclass
class ScrubReport:
    rows: list[ScrubRow]
    skipped: list[tuple[str, str]]  # (key, why): malformed records passed over
    checked_records: int
    node_index: IndexReport | None = None  # the node index checked and repaired (None: not built yet)
    history: list[tuple[str, str]] = field(default_factory=list)  # (key, why): forged or broken history records

    @property
    def failed(self) -> bool:
        """Whether scrub found what no reader may act on: corrupt artifacts or broken history."""
        return bool(self.corrupt or self.history)

    def to_json(self) -> dict:
        return {"checked_bytes": self.checked_bytes, "checked_records": self.checked_records,
                "artifacts": [r.to_json() for r in self.rows],
                "history": [{"key": k, "why": why} for k, why in self.history],
                "skipped_records": [{"key": k, "why": why} for k, why in self.skipped],
                "node_index": self.node_index.to_json() if self.node_index else None}

    @property
    def corrupt(self) -> list[ScrubRow]:
        return [r for r in self.rows if r.status == "corrupt"]

    @property
    def checked_bytes(self) -> int:
        return sum(r.bytes for r in self.rows if r.status in ("ok", "corrupt"))


def scrub(ctx: Context, *, sample: float = 1.0, channels_only: bool = False,
          budget_bytes: int | None = None, seed: int | None = None) -> ScrubReport:
    """Deep-verify artifacts, those a channel points at first, then a ``sample`` fraction of the
    rest; stop at ``budget_bytes``. Every failure is quarantined. Then read every small record of
    every kind (:func:`~buildctl.artifact_store.records.check_records`): each malformed one is in
    the report's ``skipped``."""
    store = ctx.store
    if not 0 < sample <= 1:
        raise StoreArgumentError(f"--sample {sample}: a fraction in (0, 1]")
    referenced: dict[str, list[str]] = {}
    skipped: list[tuple[str, str]] = []
    for rec in channels_pointing_at_all(store, skipped):
        referenced.setdefault(rec[0], []).append(rec[1])
    rows = []
    for aid, m, why, _ in scan_manifests(store):  # a manifest that does not hash to its id: restore it first
        if m is not None:
            continue
        row = ScrubRow(aid, "?", sorted(referenced.get(aid, [])), 0, "corrupt", [f"manifest: {why}"])
        restored = restore_manifest(store, aid)
        if restored is not None:
            row.status, row.problems = "repaired", [f"manifest: {why}; restored from {restored}"]
            row.profile = get_manifest(store, aid).profile_name
        rows.append(row)
    artifacts = list_artifacts(store)
    known = {a for a, _ in artifacts} | {r.artifact_id for r in rows}
    for aid in sorted(set(referenced) - known):  # a channel points at an artifact with no manifest at all
        row = ScrubRow(aid, "?", sorted(referenced[aid]), 0, "corrupt",
                       ["manifest: missing; every node pulling " + ", ".join(sorted(referenced[aid])) + " fails"])
        restored = restore_manifest(store, aid)
        if restored is not None:
            row.status, row.problems = "repaired", [f"manifest: missing; restored from {restored}"]
            row.profile = get_manifest(store, aid).profile_name
        rows.append(row)
    first = [(a, m) for a, m in artifacts if a in referenced]
    rest = [(a, m) for a, m in artifacts if a not in referenced]
    rng = random.Random(seed)
    rng.shuffle(rest)
    sampled = [] if channels_only or not rest else rest[:max(1, round(len(rest) * sample))]
    chosen = first + sampled
    spent = 0
    for aid, m in chosen:
        row = ScrubRow(aid, m.profile_name, sorted(referenced.get(aid, [])), m.total_size, "ok")
        rows.append(row)
        if active_quarantine(store, aid, skipped) is not None:
            row.status = "quarantined"
            continue
        if budget_bytes is not None and spent + m.total_size > budget_bytes:
            row.status = "skipped"
            continue
        spent += m.total_size
        try:
            verify_deep_or_quarantine(store, aid, detector="scrub", auth=ctx.auth)
        except VerificationError as err:
            row.status, row.problems, row.quarantine_key = "corrupt", [p.render() for p in err.problems], err.quarantine_key
    report = ScrubReport(rows, skipped, check_records(store, skipped))  # then every small record, of every kind
    refs = sorted({(r.profile, r.channel, r.compat_key) for r in all_channel_records(store, [])})
    for profile, channel, compat in refs:  # and every ref's history chain, as rollback reads it
        try:  # malformed records are already listed by check_records (exit 10); broken chains are exit 4
            chain = checked_history(store, profile, channel, compat, ctx.auth.trusted, skipped=[])
        except CorruptObjectError:
            continue  # the ref turned malformed since it was listed: check_records names it
        report.history += [(e.key, e.problem) for e in chain if e.problem]
    if index_built(store):  # and the node index against the node records: missing markers written, stale deleted
        report.node_index = node_index.rebuild(store, repair=True)
    return report


def channels_pointing_at_all(store: Store, skipped: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """(artifact, "profile/channel/compat key") for every channel ref (``skipped``: see
    :func:`~buildctl.artifact_store.channels.all_channel_records`)."""
    return [(r.artifact_id, f"{r.profile}/{r.channel}/{r.compat_key}") for r in all_channel_records(store, skipped)]
