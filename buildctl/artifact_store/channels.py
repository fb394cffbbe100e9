"""Channels: mutable refs per (profile, channel, compat key), moved with compare-and-swap, with an
append-only history, k-of-n co-signing and re-signing.

Moves that pass gates first are elsewhere: promotion and rollback in
:mod:`buildctl.artifact_store.promotion`, rollout steps in :mod:`buildctl.steps.rollouts`."""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator

from pydantic import Field, ValidationError, field_validator

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json, is_crypto_digest, is_digest
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.trust.binding import manifest_blake3
from buildctl.artifact_store.backends.listing import map_bounded
from buildctl.artifact_store.errors import (
    CasConflictError,
    ChannelNotFoundError,
    CorruptObjectError,
    HistoryConflictError,
    RolloutInProgressError,
    SignerNotTrustedError,
    StoreArgumentError,
    StoreUnavailableError,
)
from buildctl.artifact_store.layout import (
    CHANNELS,
    channel_key,
    channel_prefix,
    pending_key,
    compat_key_of_channel_key,
    history_channel_prefix,
    history_key,
    history_prefix,
)
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.fleet.waves import Rollout, RolloutPlan, artifact_for_node
from buildctl.artifact_store.trust.revocation import with_revocations
from buildctl.artifact_store.trust.signing import SigningKey, TrustedKeys, promoter_signers, signer_refusal
from buildctl.core.times import after, now_utc, parse_utc, utc_now

CHANNEL_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


OPTIONAL_SIGNED = ("rollout", "expires", "cosignatures", "migrated_from", "manifest_blake3")  # left out when unset: older records' bytes stay the same


class ChannelRecord(Record):
    """One channel move: the channel ref's content and its append-only history entry."""

    seq: int = Field(..., ge=1, description="Position in the channel's history, 1-based, no gaps.")
    profile: str = Field(..., description="Profile name.")
    channel: str = Field(..., description="Channel name.")
    compat_key: str = Field(..., description="Compat key the channel ref is for.")
    artifact_id: str = Field(..., description="The artifact the channel now points at (during a rollout: the one rolled out).")
    previous: str | None = Field(None, description="The artifact it pointed at before, if any.")
    who: str = Field(..., description="user@host, or the CI identity.")
    when: str = Field(..., description="UTC ISO-8601 time of the move.")
    reason: str | None = Field(None, description="Why (required for forced promotions and rollbacks).")
    forced: bool = Field(False, description="Whether the promotion gates were overridden.")
    action: str = Field("promote", description="promote, rollback, or a rollout step (advance, pause, resume, complete, halt, abort), resign, or migrate-keys.")
    verified_at: str | None = Field(None, description="When the deep verify this move relied on ran (every blob re-hashed).")
    verify_window_s: float | None = Field(None, description="How old that deep verify was allowed to be, in seconds.")
    rollout: Rollout | None = Field(None, description="The rollout in progress or last run through this record, if any.")
    expires: str | None = Field(None, description="UTC ISO-8601 time after which nodes refuse this record (signed records; re-signed before).")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")
    cosignatures: tuple[dict[str, str], ...] | None = Field(None, description="More promoter signatures of the same bytes (k-of-n channels).")
    migrated_from: str | None = Field(None, description="migrate-keys: the schema-1 compat key whose ref this one continues (its history holds the approvals).")
    manifest_blake3: dict[str, str] | None = Field(None, description="BLAKE3-256 of the manifest bytes of every artifact this record can give a node (the artifact; during a rollout its base and target too), by artifact id: what binds the signature to those exact bytes. Absent in records written before BLAKE3.")

    @field_validator("manifest_blake3")
    @classmethod
    def _bound_form(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and not all(is_digest(a) and is_crypto_digest(b) for a, b in v.items()):
            raise ValueError("manifest_blake3 maps xxh3-128 artifact ids to blake3:<64 hex>")
        return v

    def body(self) -> dict:
        """The stored form: every field, less the optional ones that are unset."""
        d = self.model_dump(mode="json")
        for name in OPTIONAL_SIGNED:
            if d[name] is None:
                del d[name]
        return d

    def signed_bytes(self) -> bytes:
        d = self.body()
        d.pop("signature", None)
        d.pop("cosignatures", None)
        return canonical_json(d)

    def all_signatures(self) -> list[dict | None]:
        return [self.signature, *(self.cosignatures or ())]

    def signers(self, trusted: TrustedKeys) -> set[str]:
        """The distinct trusted promoter keys that signed this record (unrevoked at its time)."""
        return promoter_signers(self.signed_bytes(), self.all_signatures(), trusted, self.when)

    def to_bytes(self) -> bytes:
        return canonical_json(self.body())

    def bound(self, artifact_id: str) -> str | None:
        """The BLAKE3 of ``artifact_id``'s manifest bytes that this record signs, if it carries one."""
        return (self.manifest_blake3 or {}).get(artifact_id)

    def servable(self) -> set[str]:
        """Every artifact this record can give a node."""
        out = {self.artifact_id}
        if self.rollout is not None:
            out |= {self.rollout.base, self.rollout.target}
        return out

    def artifact_for(self, node_id: str | None) -> str:
        """The artifact this record gives a node (per wave bucket while a rollout is live)."""
        return artifact_for_node(self.profile, self.channel, self.artifact_id, self.rollout, node_id)

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires is not None and parse_utc(self.expires) <= (now or now_utc())


def _parse_record(body: bytes, key: str) -> ChannelRecord:
    try:
        return ChannelRecord.model_validate_json(body)
    except ValidationError as err:
        raise CorruptObjectError(key, f"malformed channel record: {err.error_count()} error(s)") from None


def read_channel(store: Store, profile: str, channel: str, compat_key: str) -> tuple[ChannelRecord, str] | None:
    """The current channel record and its version token, or ``None``."""
    key = channel_key(profile, channel, compat_key)
    got = store.get_ref(key)
    if got is None:
        return None
    return _parse_record(got[0], key), got[1]


def _settle_history(store: Store, rec: ChannelRecord, *, own: bool = True) -> None:
    """Make sure the current ref's record is in the history (a promoter may have died in between).
    The slot is create-only: when it already holds other bytes, another principal wrote it. A
    writer settling its ``own`` record says so (:class:`HistoryConflictError`: the ref moved, its
    record is not in the history); settling another's, it goes on (readers mark the stranger and
    take the ref's own record: :func:`checked_history`), so a squatter cannot stop every move."""
    key = history_key(rec.profile, rec.channel, rec.compat_key, rec.seq)
    body = rec.to_bytes()
    if not store.put_bytes(key, body) and own and store.get_bytes(key) != body:
        raise HistoryConflictError(key, moved=True)


class CasRetry(Record):
    """How a move retries when another writer moved the ref between its read and its
    compare-and-swap: up to ``attempts`` tries, a jittered ``sleep`` between them (tests pass a
    recorder)."""

    attempts: int = Field(30, ge=1, description="compare-and-swap tries before CasConflictError")
    sleep: Callable[[float], None] = Field(time.sleep, description="waits between tries (seconds)")


class ChannelMove(Record):
    """What one move writes into the channel record beside the artifact: its action, why, what it
    relied on; and ``compat_key``, the ref's key when it is not the manifest's own (an artifact
    published under a schema-1 key serves under the key its build fingerprint has now)."""

    action: str = Field("promote", description="the record's action (ChannelRecord.action)")
    reason: str | None = Field(None, description="why (required with force, recorded)")
    forced: bool = Field(False, description="the promotion gates were overridden (promote: the caller forces them; "
                         "the record says so only when a gate refused)")
    verified_at: str | None = Field(None, description="the deep verify the move relied on")
    rollout: RolloutPlan | None = Field(None, description="start a rollout to this artifact (base and start filled in)")
    compat_key: str | None = Field(None, description="the ref's compat key, when not the manifest's")
    migrated_from: str | None = Field(None, description="migrate-keys: the schema-1 key whose ref this one continues")


# What a move makes of the current record: the new record's fields (seq, previous, who, when and
# the signature are filled in), or None when there is nothing to write (returns the current one).
MoveFn = Callable[[ChannelRecord | None], dict[str, Any] | None]


def move_channel(store: Store, profile: str, channel: str, compat: str, make: MoveFn, *,
                 auth: Authority = Authority(), retry: CasRetry = CasRetry(), threshold: int = 1) -> ChannelRecord:
    """Write the channel's next record with compare-and-swap (retried with jitter, ``retry``), then its
    history entry, as ``auth`` (who, signer, record lifetime). ``make`` sees the current record on
    every attempt, so a decision is always made against what is there. Signed records expire
    ``auth.ttl_s`` after they are written. With a
    ``threshold`` above 1 the record waits in ``pending/`` until that many trusted promoter keys
    (of ``auth.trusted``) have signed it (each promoter runs the same promote); the returned record is then pending
    (:func:`pending_promotion`), and the channel moves when the last signature lands."""
    if not re.match(CHANNEL_RE, channel):
        raise StoreArgumentError(f"bad channel name {channel!r}: lowercase letters, digits and dashes")
    ref = channel_key(profile, channel, compat)
    signer, trusted = auth.signer, auth.trusted
    if signer is not None and trusted is not None:  # nodes would refuse the record: write nothing
        why = signer_refusal(with_revocations(store, trusted), signer.key_id, "promoter")
        if why is not None:
            raise SignerNotTrustedError(signer.key_id, "promoter", why)
    # BLAKE3 of each servable artifact's manifest bytes as stored (whose xxh3 is the id), read once
    # over every attempt; never copied from the current record, which this move does not vouch for.
    hashed: dict[str, str | None] = {}

    def bind(rec: ChannelRecord) -> ChannelRecord:
        out = {}
        for a in sorted(rec.servable()):
            if a not in hashed:
                hashed[a] = manifest_blake3(store, a)
            if hashed[a] is not None:
                out[a] = hashed[a]
        return rec.model_copy(update={"manifest_blake3": out or None})

    for attempt in range(retry.attempts):
        current = read_channel(store, profile, channel, compat)
        if current is not None:
            _settle_history(store, current[0], own=False)
        fields = make(current[0] if current else None)
        nxt = history_key(profile, channel, compat, (current[0].seq + 1) if current else 1)
        # A slot taken before the ref reached it: nobody but a squatter writes ahead. A promotion fails
        # before moving; a rollback (a halt, an abort) still moves, and then says its record is not there.
        if fields is not None and fields.get("action") != "rollback" and store.stat(nxt) is not None:
            again = read_channel(store, profile, channel, compat)
            if (again[1] if again else None) != (current[1] if current else None):
                continue  # another promoter moved the ref and wrote that slot meanwhile: decide again
            raise HistoryConflictError(nxt, moved=False)
        if fields is None:
            if current is None:
                raise ChannelNotFoundError(profile, channel, [compat])
            return current[0]
        now = utc_now()
        expires = None
        if signer is not None and auth.ttl_s:
            expires = after(now, auth.ttl_s)
        rec = ChannelRecord(**{"previous": current[0].artifact_id if current else None, **fields,
                               "seq": (current[0].seq + 1) if current else 1, "profile": profile, "channel": channel,
                               "compat_key": compat, "who": auth.who, "when": now, "expires": expires})
        rec = bind(rec)
        if signer is not None:
            rec = rec.model_copy(update={"signature": signer.sign(rec.signed_bytes())})
        if threshold > 1:
            if signer is None or trusted is None:
                raise StoreArgumentError(f"channel {channel} needs {threshold} promoter signatures: promote with "
                                         "BUILDCTL_SIGNING_KEY and BUILDCTL_TRUSTED_KEYS set")
            rec = _cosign_pending(store, rec, signer, trusted)
            if rec is None:
                continue  # another promoter's signature landed meanwhile: look again
            if len(rec.signers(trusted)) < threshold:
                return rec  # pending: the next promoter's run completes it
        if store.cas(ref, rec.to_bytes(), current[1] if current else None):
            _settle_history(store, rec)
            if threshold > 1:
                store.delete(pending_key(profile, channel, compat))
            return rec
        retry.sleep(random.uniform(0, min(1.0, 0.01 * 2 ** attempt)))
    raise CasConflictError(ref, retry.attempts)


def pending_promotion(store: Store, profile: str, channel: str, compat: str) -> ChannelRecord | None:
    """The promotion waiting for more signatures on this channel ref, if any."""
    got = store.get_ref(pending_key(profile, channel, compat))
    return _parse_record(got[0], pending_key(profile, channel, compat)) if got else None


def _cosign_pending(store: Store, rec: ChannelRecord, signer: SigningKey, trusted: TrustedKeys) -> ChannelRecord | None:
    """Add ``signer``'s signature to the pending proposal of the same move (same seq, artifact and
    rollout plan), or make ``rec`` the proposal; ``None`` when another writer won the swap."""
    key = pending_key(rec.profile, rec.channel, rec.compat_key)
    got = store.get_ref(key)
    pend = _parse_record(got[0], key) if got else None
    same = (pend is not None and pend.seq == rec.seq and pend.artifact_id == rec.artifact_id
            and (pend.rollout.waves if pend.rollout else None) == (rec.rollout.waves if rec.rollout else None))
    if same and pend is not None:
        if signer.key_id in pend.signers(trusted):
            return pend
        rec = pend.model_copy(update={"cosignatures": (*(pend.cosignatures or ()), signer.sign(pend.signed_bytes()))})
    if not store.cas(key, rec.to_bytes(), got[1] if got else None):
        return None
    return rec


def set_channel(store: Store, artifact_id: str, manifest: Manifest, channel: str, *,
                auth: Authority = Authority(), move: ChannelMove = ChannelMove(),
                retry: CasRetry = CasRetry()) -> ChannelRecord:
    """Move a channel to an artifact with compare-and-swap (retried with jitter, ``retry``);
    appends history. ``move``: what the record says beside the artifact (:class:`ChannelMove`).
    A live rollout on the channel is never replaced silently: abort it first (a rollback, which
    ends it, may replace it). ``move.rollout``: start one (its base and start time are filled in).
    ``move.verified_at``: the deep verify the move relied on, recorded with ``auth``'s verify window."""
    action, rollout = move.action, move.rollout
    signer = auth.signer
    verify_window_s = auth.verify_window_s if move.verified_at is not None else None

    def make(current: ChannelRecord | None) -> dict[str, Any] | None:
        if current is not None:
            live = current.rollout is not None and current.rollout.live
            signed_by = (current.signature or {}).get("key_id")
            if (action == "promote" and current.artifact_id == artifact_id and not live and rollout is None
                    and signed_by == (signer.key_id if signer else None)):
                return None  # already there: promotions are idempotent (CI retries)
            if live and action != "rollback":
                raise RolloutInProgressError(manifest.profile_name, channel, current.seq, current.artifact_id)
        started = None
        if current is not None and current.rollout is not None and current.rollout.live:  # a rollback ends it
            started = current.rollout.model_copy(update={"state": "aborted"})
        if rollout is not None:
            if current is None:
                raise StoreArgumentError(f"channel {channel!r} has no artifact yet for the nodes outside the waves: "
                                         "make its first promotion without --rollout")
            if current.artifact_id == artifact_id:
                raise StoreArgumentError(f"channel {channel!r} already points at {artifact_id}: nothing to roll out")
            now = utc_now()
            started = Rollout(waves=rollout.waves, bake_s=rollout.bake_s, base=current.artifact_id, target=artifact_id,
                              started_at=now, wave_started_at=now)
        return {"artifact_id": artifact_id, "reason": move.reason, "forced": move.forced, "action": action,
                "verified_at": move.verified_at, "verify_window_s": verify_window_s, "rollout": started,
                "migrated_from": move.migrated_from}

    threshold = auth.trusted.threshold(channel) if auth.trusted is not None and action == "promote" else 1
    return move_channel(store, manifest.profile_name, channel, move.compat_key or manifest.compat_key, make, auth=auth,
                        retry=retry, threshold=threshold)


def channel_compat_keys(store: Store, profile: str, channel: str) -> list[str]:
    return [compat_key_of_channel_key(k) for k in store.list(channel_prefix(profile, channel))]


def history(store: Store, profile: str, channel: str, compat_key: str | None = None,
            skipped: list[tuple[str, str]] | None = None, *, since_seq: int = 0,
            limit: int | None = None) -> list[ChannelRecord]:
    """The channel's records, oldest first, for one compat key or all of them. A malformed record
    (in the history or the ref) raises; with ``skipped`` it is appended there and passed over.
    ``since_seq``: only records after it (for one compat key, the listing starts after its key);
    ``limit``: only the newest ``limit`` of each compat key. Only the records kept are read.

    A promoter that died between its swap and its history write leaves the ref one record ahead:
    that record is included (and written, where this caller may write) so the chain has no gap.
    """
    def skip(key: str, err: CorruptObjectError) -> None:
        if skipped is None:
            raise err
        skipped.append((key, err.detail))

    prefix = history_prefix(profile, channel, compat_key) if compat_key else history_channel_prefix(profile, channel)
    after = history_key(profile, channel, compat_key, since_seq) if compat_key and since_seq else None
    by_ref: dict[str, list[str]] = {}
    for k in store.list(prefix, start_after=after):
        if since_seq and int(k.rsplit("/", 1)[1].split(".", 1)[0]) <= since_seq:
            continue
        by_ref.setdefault(k.rsplit("/", 1)[0], []).append(k)
    wanted = [k for keys in by_ref.values() for k in (keys[-limit:] if limit else keys)]
    out = {}
    for k in wanted:
        try:
            r = _parse_record(store.get_bytes(k), k)
        except CorruptObjectError as err:
            skip(k, err)
            continue
        out[(r.compat_key, r.seq)] = r
    for key in (compat_key,) if compat_key else channel_compat_keys(store, profile, channel):
        try:
            got = read_channel(store, profile, channel, key)
        except CorruptObjectError as err:
            skip(channel_key(profile, channel, key), err)
            continue
        if got and got[0].seq > since_seq and out.get((got[0].compat_key, got[0].seq)) != got[0]:
            unsettled = (got[0].compat_key, got[0].seq) not in out
            out[(got[0].compat_key, got[0].seq)] = got[0]  # the ref's own record, over a stranger in its slot
            if unsettled:
                try:
                    _settle_history(store, got[0], own=False)
                except StoreUnavailableError:
                    pass  # a read-only caller (a node): the record is still reported
    recs = sorted(out.values(), key=lambda r: (r.compat_key, r.seq))
    if limit:
        recs = [r for r in recs if sum(1 for q in recs if q.compat_key == r.compat_key and q.seq > r.seq) < limit]
    return recs


@dataclass(frozen=True)
class CheckedRecord:
    """One history record with what its reader found wrong with it (``problem``; None: it is the
    ref's own record, or signed as required and linked to the record after it)."""

    record: ChannelRecord
    key: str
    problem: str | None


def checked_history(store: Store, profile: str, channel: str, compat: str,
                    trusted: TrustedKeys | None = None,
                    skipped: list[tuple[str, str]] | None = None) -> list[CheckedRecord]:
    """The ref's history, oldest first, each record checked as every reader that acts on history
    must (rollback, ``history``, scrub):

    * it is where it says it is (its profile, channel, compat key and seq are its slot's);
    * it is not ahead of the ref, and at the ref's seq it is the ref's own record (the ref is
      written by compare-and-swap; a history slot by whoever writes it first);
    * with ``trusted`` keys, on a channel whose ref a trusted promoter key signed, such a key
      signed it too;
    * it is linked: the next good record's ``previous`` is its artifact.

    A record that fails is returned with its ``problem``; the ref's record stands in for a
    stranger in its slot. A malformed record raises, or with ``skipped`` is listed there (as
    :func:`history` does) and passed over."""
    got = read_channel(store, profile, channel, compat)
    ref = got[0] if got else None
    signed_channel = trusted is not None and ref is not None and bool(ref.signers(trusted))
    entries: dict[int, CheckedRecord] = {}
    strangers: list[CheckedRecord] = []
    for key in store.list(history_prefix(profile, channel, compat)):
        try:
            rec = read_history_record(store, key)
        except CorruptObjectError as err:
            if skipped is None:
                raise
            skipped.append((key, err.detail))
            continue
        problem = None
        if history_key(rec.profile, rec.channel, rec.compat_key, rec.seq) != key:
            problem = f"misplaced: it claims {rec.profile}/{rec.channel}/{rec.compat_key} #{rec.seq}"
        elif ref is None or rec.seq > ref.seq:
            problem = f"ahead of the ref (#{ref.seq if ref else 0}): written before the ref reached it"
        elif rec.seq == ref.seq and rec != ref:
            problem = f"not the ref's record #{ref.seq}: written into its slot by another principal"
        elif signed_channel and rec.seq != ref.seq and not rec.signers(trusted):
            problem = "not signed by a trusted promoter key"
        if problem is None:
            entries[rec.seq] = CheckedRecord(rec, key, None)
        else:
            strangers.append(CheckedRecord(rec, key, problem))
    if ref is not None and ref.seq not in entries:
        entries[ref.seq] = CheckedRecord(ref, channel_key(profile, channel, compat), None)
    good: dict[int, CheckedRecord] = {}
    successor: ChannelRecord | None = None
    for seq in sorted(entries, reverse=True):  # links, from the ref down
        e = entries[seq]
        if successor is not None and successor.seq == seq + 1 and successor.previous != e.record.artifact_id:
            strangers.append(CheckedRecord(e.record, e.key, f"broken link: #{seq + 1} names {successor.previous} "
                                                            f"as the artifact before it, not {e.record.artifact_id}"))
            successor = None
            continue
        good[seq] = e
        successor = e.record
    return sorted([*good.values(), *strangers], key=lambda e: (e.record.seq, e.problem is not None, e.key))


def record_problems(store: Store, records: list[ChannelRecord],
                    trusted: TrustedKeys | None = None) -> dict[tuple[str, int], str]:
    """What :func:`checked_history` would say of the records ``history`` returned, by (compat key,
    seq), from them and their refs alone (``--limit`` reads no more): ahead of the ref, unsigned on
    a signed channel, or not linked to the good record after it."""
    out: dict[tuple[str, int], str] = {}
    by_key: dict[str, list[ChannelRecord]] = {}
    for r in records:
        by_key.setdefault(r.compat_key, []).append(r)
    for compat, recs in by_key.items():
        try:
            got = read_channel(store, recs[0].profile, recs[0].channel, compat)
        except CorruptObjectError:
            got = False  # a malformed ref (history lists it as skipped): only the links can be checked
        ref = got[0] if got else None
        signed_channel = trusted is not None and ref is not None and bool(ref.signers(trusted))
        successor = None
        for r in sorted(recs, key=lambda r: r.seq, reverse=True):
            problem = None
            if got is not False and (ref is None or r.seq > ref.seq):
                problem = f"ahead of the ref (#{ref.seq if ref else 0}): written before the ref reached it"
            elif signed_channel and r != ref and not r.signers(trusted):
                problem = "not signed by a trusted promoter key"
            elif successor is not None and successor.seq == r.seq + 1 and successor.previous != r.artifact_id:
                problem = f"broken link: #{r.seq + 1} names {successor.previous} as the artifact before it"
            if problem:
                out[(compat, r.seq)] = problem
            else:
                successor = r
    return out


def history_after(store: Store, record: ChannelRecord) -> Iterator[ChannelRecord]:
    """The history records of ``record``'s ref newer than it, newest first: one LIST that starts
    after ``record``'s own key (normally empty), then a GET for each one found."""
    prefix = history_prefix(record.profile, record.channel, record.compat_key)
    after = history_key(record.profile, record.channel, record.compat_key, record.seq)
    for k in reversed(list(store.list(prefix, start_after=after))):
        yield read_history_record(store, k)


def read_history_record(store: Store, key: str) -> ChannelRecord:
    """One history record by its key (``history_key``); a malformed one raises ``CorruptObjectError``."""
    return _parse_record(store.get_bytes(key), key)


def resign(store: Store, rec: ChannelRecord, *, auth: Authority) -> ChannelRecord:
    """Write the channel's current content again as a new record, freshly signed by ``auth`` with a
    new expiry (the TUF timestamp role's job); a record moved since ``rec`` is left alone (it is newer)."""
    if auth.signer is None:
        raise StoreArgumentError("re-signing needs a signing key (BUILDCTL_SIGNING_KEY)")

    def make(current: ChannelRecord | None) -> dict[str, Any] | None:
        if current is None or current.seq != rec.seq:
            return None
        keep = current.model_dump(exclude={"seq", "profile", "channel", "compat_key", "who", "when", "expires",
                                           "signature", "action", "reason"})
        keep["rollout"] = current.rollout
        return {**keep, "action": "resign", "reason": f"re-signed #{current.seq} before it expires"}

    return move_channel(store, rec.profile, rec.channel, rec.compat_key, make, auth=auth)


def all_channel_records(store: Store, skipped: list[tuple[str, str]] | None = None) -> list[ChannelRecord]:
    """Every channel ref's current record. With ``skipped``, a malformed one is appended there as
    ``(key, why)`` and passed over (store-wide maintenance goes on); without, it raises."""
    keys = list(store.list(CHANNELS))
    out = []
    for key, got in zip(keys, map_bounded(store.get_ref, keys)):  # the refs read at once, kept in key order
        if got is None:
            continue
        try:
            out.append(_parse_record(got[0], key))
        except CorruptObjectError as err:
            if skipped is None:
                raise
            skipped.append((key, err.detail))
    return out


def channels_pointing_at(store: Store, artifact_id: str) -> list[ChannelRecord]:
    return [rec for rec in all_channel_records(store) if rec.artifact_id == artifact_id]
