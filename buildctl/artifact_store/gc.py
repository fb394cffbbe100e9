"""Garbage collection: remove what nothing protects, never a rollback target, never under a publish.

An artifact is **protected** (every reason is reported, by ``gc --dry-run`` too) when:

* a channel points at it now, or a live rollout keeps it (its base and its target);
* one of the last ``keep_history`` records of any channel's history, for any compat key, names it
  (``buildctl rollback`` can go back to it);
* a node's inventory record reports it installed, current or previous (read from the node
  index's ``held/`` markers once the index is built: one LIST per 1,000 instead of a GET per
  node; an interrupted node update leaves extra markers, so this only ever over-protects; and
  before an artifact is removed because no marker names it, every node record is read, so a
  missing marker never removes what a node holds);
* it has a quarantine record younger than ``quarantine_retention_s`` (kept for forensics);
* its manifest is younger than ``grace_s`` (a publish may still be finishing around it);
* it is among the newest ``keep`` of its (profile, compat key).

The rest is removed, manifest first (the artifact disappears at once), then its index, identity,
provenance, attestation, signature, verification and quarantine records. Blobs are swept last, and only
blobs that no manifest listed *after* those removals references, whose publish touch is older
than the grace period (:mod:`buildctl.artifact_store.grace` has the protocol and why it is safe next to a
concurrent publish), checked and removed within the delete window. A removal the store refuses
(Object Lock, a bucket policy) is reported and skipped: gc does not fail on it.

A real run then compacts channel history: re-sign records behind each ref's last
``keep_history`` records go (:func:`_compact_history` says why nothing needs them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Iterable, cast

from pydantic import Field

from buildctl.core.records import Record
from buildctl.core.errors import BuildctlError
from buildctl.artifact_store import grace as grace_mod
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import ChannelRecord, _parse_record, all_channel_records
from buildctl.core.times import now_utc, parse_utc
from buildctl.artifact_store.layout import (
    BLOBS,
    COMPACTED_INDEX,
    HISTORY,
    TOUCHES,
    attestation_prefix,
    blob_key,
    compacted_key,
    digest_of_blob_key,
    identity_key,
    pair_key,
    parse_compacted_key,
    rehash_key,
    provenance_key,
    rehash_prefix,
    manifest_key,
    manifest_signature_prefix,
    quarantine_prefix,
    touch_key,
    verification_prefix,
)
from buildctl.artifact_store.fleet.inventory import index_built, node_protections, read_held, read_inventory
from buildctl.artifact_store.backends.listing import map_bounded
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.publish import build_key_owners
from buildctl.artifact_store.quarantine import quarantine_records_by_artifact
from buildctl.artifact_store.errors import CorruptObjectError, KeyNotFoundError
from buildctl.artifact_store.read import scan_manifests

DEFAULT_KEEP = 3
DEFAULT_KEEP_HISTORY = 5
DEFAULT_QUARANTINE_RETENTION_S = 30 * 86400.0


class GcPolicy(Record):
    """What a gc keeps, as one record (``buildctl gc``'s options, the gc-store flow's parameters):
    built by :func:`buildctl.steps.fleet.gc_policy` from the settings, which hold the grace period and
    the delete window every publish also uses."""

    grace_s: float | None = Field(None, ge=0, description="never remove a manifest created, or a blob a publish "
                                  "touched, within this (None: the settings' default, gc_grace_s)")
    delete_window_s: float | None = Field(None, ge=0, description="remove a blob within this of checking its touch "
                                          "(None: the settings' default, gc_delete_window_s)")
    keep: int = Field(DEFAULT_KEEP, ge=0, description="newest artifacts kept per (profile, compat key)")
    keep_history: int = Field(DEFAULT_KEEP_HISTORY, ge=0, description="artifacts of each channel's last N records kept")
    quarantine_retention_s: float = Field(DEFAULT_QUARANTINE_RETENTION_S, ge=0,
                                          description="quarantined artifacts kept this long, for forensics")
    compact_history: bool = Field(True, description="also remove superseded re-sign records from channel history")

    def resolved(self) -> "GcPolicy":
        """This policy with the settings' defaults where it says None (what gc decides with)."""
        grace, window = grace_mod.GraceWindows(grace_s=self.grace_s, delete_window_s=self.delete_window_s).seconds()
        return self.model_copy(update={"grace_s": grace, "delete_window_s": window})


@dataclass
class GcDecision:
    """One artifact: kept (with every reason) or removed (with why nothing protects it)."""

    artifact_id: str
    profile: str
    compat_key: str
    created_at: str
    size: int
    protected_by: list[str]
    why_removable: str = ""
    removed: bool = False
    error: str | None = None  # the store refused (part of) the removal

    def to_json(self) -> dict:
        return {"artifact_id": self.artifact_id, "profile": self.profile, "compat_key": self.compat_key,
                "created_at": self.created_at, "size": self.size, "protected_by": self.protected_by,
                "why_removable": self.why_removable or None, "removed": self.removed, "error": self.error}


@dataclass
class GcResult:
    dry_run: bool
    decisions: list[GcDecision] = field(default_factory=list)
    removed_blobs: int = 0
    freed_bytes: int = 0
    kept_blobs: int = 0  # unreferenced, but touched within the grace period or past the delete window
    not_removed: list[tuple[str, str]] = field(default_factory=list)  # (key, why) the store refused
    stopped_early: str | None = None
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (artifact, why): manifests that do not verify
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (key, why): malformed records passed over
    compacted_history: list[str] = field(default_factory=list)  # superseded re-sign records removed (a real run only)
    history_examined: int = 0  # history records compaction read (a dry run: would read), older than each ref's last N
    index_missing: list[str] = field(default_factory=list)  # artifacts a node record holds and no held marker named

    def to_json(self) -> dict:
        return {"dry_run": self.dry_run, "removed_artifacts": self.removed_artifacts, "removed_blobs": self.removed_blobs,
                "freed_bytes": self.freed_bytes, "kept": self.kept, "kept_blobs": self.kept_blobs,
                "artifacts": [d.to_json() for d in self.decisions],
                "not_removed": [{"key": k, "why": why} for k, why in self.not_removed],
                "stopped_early": self.stopped_early,
                "unreadable_manifests": [{"artifact_id": a, "why": why} for a, why in self.unreadable],
                "skipped_records": [{"key": k, "why": why} for k, why in self.skipped],
                "compacted_history": self.compacted_history, "history_examined": self.history_examined,
                "index_missing": self.index_missing}

    @property
    def removed_artifacts(self) -> list[str]:
        """Removed (a dry run: would be); an artifact whose manifest the store refused to remove is not."""
        return [d.artifact_id for d in self.decisions if not d.protected_by and (self.dry_run or d.removed)]

    @property
    def kept(self) -> int:
        return sum(1 for d in self.decisions if d.protected_by)



def protections(store: Store, arts: list[tuple[str, Manifest]], policy: GcPolicy, *, now: datetime,
                also: Iterable[tuple[str, str]] = (), skipped: list[tuple[str, str]] | None = None) -> dict[str, list[str]]:
    """Every reason each artifact is kept under ``policy`` (:meth:`GcPolicy.resolved`; an empty list:
    nothing protects it). ``also``: more (artifact,
    why) pairs (gc passes the engines the nodes' inventory records say they run and keep).
    ``skipped``: malformed channel and history records are appended there, and every artifact of
    their profile is kept (what they point at cannot be read, so whatever they might guard is)."""
    out: dict[str, dict[str, None]] = {a: {} for a, _ in arts}  # reasons in order, each once (O(1) to add)
    skipped = [] if skipped is None else skipped
    keep, keep_history, grace_s = policy.keep, policy.keep_history, cast(float, policy.grace_s)  # resolved

    def add(artifact: str | None, why: str) -> None:
        if artifact in out:
            out[artifact].setdefault(why, None)

    def guard_profile_of(key: str, why: str) -> None:
        skipped.append((key, why))
        profile = key.split("/")[1] if key.count("/") >= 2 else None
        for artifact, m in arts:
            if profile is None or m.profile_name == profile:
                add(artifact, f"a malformed record ({key}) of {m.profile_name} might point at it")

    channel_skips: list[tuple[str, str]] = []
    recs = all_channel_records(store, channel_skips)
    for key, why in channel_skips:
        guard_profile_of(key, why)
    for rec in recs:
        add(rec.artifact_id, f"channel {rec.channel} #{rec.seq} points at it ({rec.profile} [{rec.compat_key[:20]}])")
        if rec.rollout is not None and rec.rollout.live:
            add(rec.rollout.base, f"rollout on {rec.channel} #{rec.seq}: base")
            add(rec.rollout.target, f"rollout on {rec.channel} #{rec.seq}: target")
    if keep_history > 0:
        by_ref: dict[str, list[str]] = {}
        for key in store.list(HISTORY):
            by_ref.setdefault(key.rsplit("/", 1)[0], []).append(key)
        def read(key: str) -> ChannelRecord | CorruptObjectError:
            try:
                return _parse_record(store.get_bytes(key), key)
            except CorruptObjectError as err:
                return err

        last = [key for keys in by_ref.values() for key in sorted(keys)[-keep_history:]]
        for key, rec in zip(last, map_bounded(read, last)):  # the records read at once
            if isinstance(rec, CorruptObjectError):
                guard_profile_of(key, rec.detail)
                continue
            add(rec.artifact_id, f"history {rec.channel} #{rec.seq} (last {keep_history}) "
                                 f"[{rec.compat_key[:20]}]: a rollback target")
    for artifact, why in also:
        add(artifact, why)
    quarantined = quarantine_records_by_artifact(store, skipped)  # one listing for the whole store
    for artifact, _ in arts:
        recs = quarantined.get(artifact)
        if recs:
            last = parse_utc(recs[-1][1].when)
            until = last + timedelta(seconds=policy.quarantine_retention_s)
            if until > now:
                add(artifact, f"quarantine record of {recs[-1][1].when}: kept until {until:%Y-%m-%d} for forensics")
    cutoff = now - timedelta(seconds=grace_s)
    counts: dict[tuple[str, str], int] = {}
    for artifact, m in arts:  # newest first
        if parse_utc(m.created_at) > cutoff:
            add(artifact, f"created {m.created_at}, within the {grace_s / 3600:g} h grace period")
        pair = (m.profile_name, m.compat_key)
        counts[pair] = counts.get(pair, 0) + 1
        if counts[pair] <= keep:
            add(artifact, f"newest {counts[pair]} of {keep} for {m.profile_name} [{m.compat_key[:20]}]")
    return {a: list(why) for a, why in out.items()}


def gc(store: Store, policy: GcPolicy = GcPolicy(), *, dry_run: bool = False, now: datetime | None = None,
       clock: Callable[[], float] = time.monotonic) -> GcResult:
    """Decide and (unless ``dry_run``) remove what ``policy`` does not keep; see the module
    docstring for what is protected. ``policy.compact_history``: also remove superseded re-sign
    records from channel history (:func:`history_compaction`)."""
    policy = policy.resolved()
    keep, keep_history, grace = policy.keep, policy.keep_history, cast(float, policy.grace_s)
    now = now or now_utc()
    started = clock()

    def wall() -> datetime:  # ``now`` moved on by the time this run has taken
        return now + timedelta(seconds=clock() - started)

    scanned = {artifact: (m, why, named) for artifact, m, why, named in scan_manifests(store)}
    arts = sorted(((a, m) for a, (m, _, _) in scanned.items() if m is not None),
                  key=lambda am: am[1].created_at, reverse=True)  # newest first, as list_artifacts has them
    result = GcResult(dry_run=dry_run)
    indexed = index_built(store)
    # one LIST per 1,000 held markers instead of a GET per node
    nodes = node_protections((), held=read_held(store)) if indexed else _record_protections(store, result.skipped)
    keep_for = protections(store, arts, policy, now=now, also=nodes, skipped=result.skipped)
    if indexed and any(not why for why in keep_for.values()):
        _confirm_with_node_records(store, keep_for, result)
    for artifact, m in arts:
        d = GcDecision(artifact, m.profile_name, m.compat_key, m.created_at, m.total_size, keep_for[artifact])
        if not d.protected_by:
            d.why_removable = (f"no channel or its last {keep_history} history records name it, no node reports it, "
                               f"no quarantine record within retention, older than {grace / 3600:g} h, and not among "
                               f"the newest {keep} of {m.profile_name} [{m.compat_key[:20]}]")
        result.decisions.append(d)
    doomed = [(d, m) for d, (_, m) in zip(result.decisions, arts) if not d.protected_by]
    if not dry_run:
        for d, m in doomed:
            d.error = _remove_artifact(store, d.artifact_id, m, result)
            d.removed = d.error is None
    _sweep_blobs(store, result, policy, clock, wall, {d.artifact_id for d, _ in doomed}, scanned)
    if policy.compact_history:
        _compact_history(store, keep_history, result, dry_run=dry_run)
    return result


def _record_protections(store: Store, skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What the node records hold (one GET each; a malformed one is appended to ``skipped``), and
    every id a malformed record still names: it may run or keep them."""
    named: set[str] = set()
    held = node_protections(read_inventory(store, skipped, named))
    return held + [(a, "named by a malformed node record") for a in sorted(named)]


def _confirm_with_node_records(store: Store, keep_for: dict[str, list[str]], result: GcResult) -> None:
    """Before anything is removed on the index's word: read every node record (one GET each, only
    when something would go) and keep what a record holds though no ``held/`` marker said so. A
    marker is only a hint (deleted by a principal that may write the index, or lost); the record
    decides. Each such artifact is named in ``result.index_missing`` (``buildctl scrub`` writes the
    markers back)."""
    for artifact, why in _record_protections(store, result.skipped):
        if artifact in keep_for and not keep_for[artifact]:
            keep_for[artifact].append(f"{why} (read from the node records: the node index has no held marker)")
            result.index_missing.append(artifact)
    result.index_missing.sort()


def _compact_history(store: Store, keep_history: int, result: GcResult, *, dry_run: bool = False) -> None:
    """Remove the re-sign records older than each ref's newest ``max(keep_history, 1)`` records.
    A re-sign repeats the record before it with a new expiry and one signature, so nothing reads it
    once a newer record exists:

    - the freshness check lists only the records after the ref's own (the newest are kept, so a
      replayed or frozen ref is still refused: a newer signed record is there);
    - k-of-n approvals (``approved_before``), the staging-first rule and rollbacks look for the
      promote, rollback, rollout and migrate records, which are never compacted.

    Each record is read once: a mark (``index/history-compacted/<ref>/<seq>``) says how far this
    ref was examined, and the next run starts above it. A dry run LISTs the same keys and counts
    the records a real run would read (``history_examined``) without reading them: which of them
    are re-signs is known only from their bytes, and reading every record of a store gc never
    compacted would make a dry run cost a GET per record. A malformed record is kept (the
    protections report it); a ref whose removal the store refused is examined again."""
    marks: dict[str, tuple[int, list[str]]] = {}
    for key in store.list(COMPACTED_INDEX):
        ref, seq = parse_compacted_key(key)
        top, keys = marks.get(ref, (0, []))
        marks[ref] = (max(top, seq), keys + [key])
    by_ref: dict[str, list[str]] = {}
    for key in store.list(HISTORY):
        by_ref.setdefault(key.rsplit("/", 1)[0], []).append(key)
    for ref, keys in by_ref.items():
        done, old_marks = marks.get(ref, (0, []))
        todo = [k for k in sorted(keys)[:-max(keep_history, 1)] if _seq_of(k) > done]
        result.history_examined += len(todo)
        if not todo or dry_run:
            continue
        refused = False
        for key in todo:
            try:
                rec = _parse_record(store.get_bytes(key), key)
            except (CorruptObjectError, KeyNotFoundError):
                continue
            if rec.action == "resign":
                if _delete(store, key, result) is None:
                    result.compacted_history.append(key)
                else:
                    refused = True
        if not refused:
            store.put_bytes(compacted_key(ref, _seq_of(todo[-1])), b"")
            for key in old_marks:
                _delete(store, key, result)


def _seq_of(history_key: str) -> int:
    return int(history_key.rsplit("/", 1)[1][:-len(".json")])


def _delete(store: Store, key: str, result: GcResult) -> str | None:
    try:
        store.delete(key)
    except (BuildctlError, OSError) as err:
        result.not_removed.append((key, str(err)))
        return str(err)
    return None


def _remove_artifact(store: Store, artifact: str, m: Manifest, result: GcResult) -> str | None:
    """Manifest first: once it is gone the artifact is gone; the records after it are leftovers."""
    err = _delete(store, manifest_key(artifact), result)
    if err is not None:
        return f"manifest not removed: {err}"
    keys = [identity_key(m.identity()), pair_key(m.profile_name, m.profile_hash, artifact)]
    if store.stat(provenance_key(artifact)) is not None:
        keys.append(provenance_key(artifact))
    if m.rehashed_from:
        keys.append(rehash_key(m.rehashed_from, artifact))
    keys += list(store.list(rehash_prefix(artifact)))  # markers naming its successors
    if m.build_key:
        keys += [key for key, owner in build_key_owners(store, m.build_key) if owner == artifact]
    for prefix in (attestation_prefix(artifact), manifest_signature_prefix(artifact), verification_prefix(artifact),
                   quarantine_prefix(artifact)):
        keys += list(store.list(prefix))
    errors = [e for e in (_delete(store, k, result) for k in keys) if e]
    return f"{len(errors)} record(s) not removed: {errors[0]}" if errors else None


def _sweep_blobs(store: Store, result: GcResult, policy: GcPolicy, clock: Callable[[], float],
                 wall: Callable[[], datetime], doomed: set[str],
                 scanned: dict[str, tuple[Manifest | None, str, set[str] | None]]) -> None:
    """Mark (every manifest listed now) and sweep (every blob no manifest references), with the
    grace period and delete window of ``policy`` (resolved). In a dry run (``result.dry_run``) the
    doomed artifacts' manifests still exist: their blobs count as they would after.
    ``scanned``: the manifests gc read at its start; the mark lists the manifests again and reads
    only those it has not read (a manifest's key is its digest: the same key, the same bytes)."""
    grace, window, dry_run = cast(float, policy.grace_s), cast(float, policy.delete_window_s), result.dry_run
    listed = clock()
    live: set[str] = set()
    blind = False  # an unreadable manifest that names no blob we can read: it might reference any
    for artifact, m, why, named in scan_manifests(store, known=scanned):
        if m is None:
            result.unreadable.append((artifact, why))
            if named is None:
                blind = True
            else:
                live |= named  # its blobs stay: repair (or heal) can restore the manifest from its id
            continue
        if dry_run and artifact in doomed:
            continue
        live |= m.blob_digests()
    if blind:
        result.stopped_early = (f"{sum(1 for _ in result.unreadable)} manifest(s) do not verify and name no blobs "
                                "that can be read: no blob was removed (buildctl heal ARTIFACT, or scrub, repairs them)")
        return
    for key in list(store.list(BLOBS)):
        digest = digest_of_blob_key(key)
        if digest in live:
            continue
        checked = clock()
        if grace > 0 and checked - listed > grace / 2:  # grace 0: the operator says nothing publishes
            result.stopped_early = (f"stopped sweeping after {checked - listed:.0f} s (half the grace period): "
                                    "the rest is left for the next run")
            return
        touched = grace_mod.touched_at(store, digest)
        if touched is not None and touched > wall() - timedelta(seconds=grace):
            result.kept_blobs += 1  # a publish relied on it within the grace period
            continue
        size = store.stat(key)
        if size is None:
            continue
        if dry_run:
            result.removed_blobs += 1
            result.freed_bytes += size
            continue
        if clock() - checked > window:
            result.kept_blobs += 1  # too long since the check: a publish may have touched it since
            continue
        if _delete(store, key, result) is None:
            result.removed_blobs += 1
            result.freed_bytes += size
            _delete(store, touch_key(digest), result)
    if not dry_run:
        _sweep_touches(store, result, grace, wall)


def _sweep_touches(store: Store, result: GcResult, grace: float, wall: Callable[[], datetime]) -> None:
    """Touches of blobs that no longer exist, older than the grace period (a gc killed between a
    blob and its touch, or a publish that died before uploading)."""
    for key in list(store.list(TOUCHES)):
        digest = "xxh3-128:" + key.rsplit("/", 1)[1][:-len(".json")]
        if store.stat(blob_key(digest)) is not None:
            continue
        touched = grace_mod.touched_at(store, digest)
        if touched is None or touched < wall() - timedelta(seconds=grace):
            _delete(store, key, result)
