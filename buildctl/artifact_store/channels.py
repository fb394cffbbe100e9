"""Channels: mutable refs per (profile, channel, compat key), moved with compare-and-swap, with an
append-only history; promotion through the gates, and rollback."""

from __future__ import annotations

import random
import re
import time
from datetime import datetime, timezone
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from buildctl.digest import canonical_json
from buildctl.artifact_store.attestations import latest_attestation, recomputed_verdict
from buildctl.artifact_store.backend import Store
from buildctl.artifact_store.errors import (
    ArtifactNotFoundError,
    CasConflictError,
    ChannelNotFoundError,
    CorruptObjectError,
    PromotionRefusedError,
    RolloutInProgressError,
    RolloutStateError,
    SignatureError,
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
from buildctl.times import after, parse_utc, utc_now
from buildctl.artifact_store.rollout import Rollout, RolloutPlan, artifact_for_node
from buildctl.artifact_store.revocation import with_revocations
from buildctl.artifact_store.signing import SigningKey, TrustedKeys, promoter_signers, verify_signature
from buildctl.artifact_store.integrity import DEFAULT_VERIFY_WINDOW_S, verify_recent_or_quarantine
from buildctl.artifact_store.verify import get_manifest, resolve_artifact

CHANNEL_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
UNKNOWN_ACTOR = "unknown"


OPTIONAL_SIGNED = ("rollout", "expires", "cosignatures")  # left out when unset: older records' bytes stay the same


class ChannelRecord(BaseModel):
    """One channel move: the channel ref's content and its append-only history entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    action: str = Field("promote", description="promote, rollback, or a rollout step (advance, pause, resume, complete, halt, abort), or resign.")
    verified_at: str | None = Field(None, description="When the deep verify this move relied on ran (every blob re-hashed).")
    verify_window_s: float | None = Field(None, description="How old that deep verify was allowed to be, in seconds.")
    rollout: Rollout | None = Field(None, description="The rollout in progress or last run through this record, if any.")
    expires: str | None = Field(None, description="UTC ISO-8601 time after which nodes refuse this record (signed records; re-signed before).")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")
    cosignatures: tuple[dict[str, str], ...] | None = Field(None, description="More promoter signatures of the same bytes (k-of-n channels).")

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

    def artifact_for(self, node_id: str | None) -> str:
        """The artifact this record gives a node (per wave bucket while a rollout is live)."""
        return artifact_for_node(self.profile, self.channel, self.artifact_id, self.rollout, node_id)

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires is not None and parse_utc(self.expires) <= (now or datetime.now(timezone.utc))


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


def _settle_history(store: Store, rec: ChannelRecord) -> None:
    """Make sure the current ref's record is in the history (a promoter may have died in between)."""
    store.put_bytes(history_key(rec.profile, rec.channel, rec.compat_key, rec.seq), rec.to_bytes())


# What a move makes of the current record: the new record's fields (seq, previous, who, when and
# the signature are filled in), or None when there is nothing to write (returns the current one).
MoveFn = Callable[[ChannelRecord | None], dict[str, Any] | None]


def move_channel(store: Store, profile: str, channel: str, compat: str, make: MoveFn, *, who: str = UNKNOWN_ACTOR,
                 signer: SigningKey | None = None, ttl_s: float | None = None, attempts: int = 30,
                 sleep: Callable[[float], None] = time.sleep, threshold: int = 1,
                 trusted: TrustedKeys | None = None) -> ChannelRecord:
    """Write the channel's next record with compare-and-swap (retried with jitter), then its
    history entry. ``make`` sees the current record on every attempt, so a decision is always
    made against what is there. Signed records expire ``ttl_s`` after they are written. With a
    ``threshold`` above 1 the record waits in ``pending/`` until that many trusted promoter keys
    have signed it (each promoter runs the same promote); the returned record is then pending
    (:func:`pending_promotion`), and the channel moves when the last signature lands."""
    if not re.match(CHANNEL_RE, channel):
        raise StoreArgumentError(f"bad channel name {channel!r}: lowercase letters, digits and dashes")
    ref = channel_key(profile, channel, compat)
    for attempt in range(attempts):
        current = read_channel(store, profile, channel, compat)
        if current is not None:
            _settle_history(store, current[0])
        fields = make(current[0] if current else None)
        if fields is None:
            if current is None:
                raise ChannelNotFoundError(profile, channel, [compat])
            return current[0]
        now = utc_now()
        expires = None
        if signer is not None and ttl_s:
            expires = after(now, ttl_s)
        rec = ChannelRecord(**{"previous": current[0].artifact_id if current else None, **fields,
                               "seq": (current[0].seq + 1) if current else 1, "profile": profile, "channel": channel,
                               "compat_key": compat, "who": who, "when": now, "expires": expires})
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
        sleep(random.uniform(0, min(1.0, 0.01 * 2 ** attempt)))
    raise CasConflictError(ref, attempts)


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


def set_channel(
    store: Store,
    artifact_id: str,
    manifest: Manifest,
    channel: str,
    *,
    reason: str | None = None,
    forced: bool = False,
    action: str = "promote",
    who: str = UNKNOWN_ACTOR,
    signer: SigningKey | None = None,
    verified_at: str | None = None,
    verify_window_s: float | None = None,
    rollout: RolloutPlan | None = None,
    ttl_s: float | None = None,
    attempts: int = 30,
    sleep: Callable[[float], None] = time.sleep,
    trusted: TrustedKeys | None = None,
) -> ChannelRecord:
    """Move a channel to an artifact with compare-and-swap; retried with jitter; appends history.
    A live rollout on the channel is never replaced silently: abort it first (a rollback, which
    ends it, may replace it). ``rollout``: start one (its base and start time are filled in)."""

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
        return {"artifact_id": artifact_id, "reason": reason, "forced": forced, "action": action,
                "verified_at": verified_at, "verify_window_s": verify_window_s, "rollout": started}

    threshold = trusted.threshold(channel) if trusted is not None and action == "promote" else 1
    return move_channel(store, manifest.profile_name, channel, manifest.compat_key, make, who=who, signer=signer,
                        ttl_s=ttl_s, attempts=attempts, sleep=sleep, threshold=threshold, trusted=trusted)


def promote(store: Store, artifact_ref: str, channel: str, *, force: bool = False, reason: str | None = None,
            who: str = UNKNOWN_ACTOR, signer: SigningKey | None = None, trusted: TrustedKeys | None = None,
            verify_window_s: float = DEFAULT_VERIFY_WINDOW_S, attempts: int = 30,
            rollout: RolloutPlan | None = None, ttl_s: float | None = None) -> ChannelRecord:
    """Promote after the gates: the artifact is not quarantined and deep-verifies (every blob
    re-hashed, or a deep verify within ``verify_window_s``: a mismatch quarantines it and raises
    :class:`VerificationError`, exit 4), and its latest attestation for its compat key passed (and,
    with ``trusted`` keys, is signed by one of them). ``force`` overrides only the attestation
    gates: bytes that do not verify are never promoted."""
    artifact_id = resolve_artifact(store, artifact_ref)
    if force and not reason:
        raise StoreArgumentError("--force needs --reason: a break-glass promotion is recorded with why")
    reasons: list[str] = []
    verified_at = verify_recent_or_quarantine(store, artifact_id, detector=f"promote to {channel}", who=who, signer=signer,
                                  window_s=verify_window_s)
    manifest = get_manifest(store, artifact_id)
    stored = latest_attestation(store, artifact_id, manifest.compat_key)
    if stored is not None and trusted is not None:
        try:
            verify_signature(f"attestation of {artifact_id}", stored.signed_bytes, stored.attestation.signature,
                             with_revocations(store, trusted), "validator", signed_at=stored.attestation.created_at)
        except SignatureError as err:
            reasons.append(f"attestation signature: {err.detail}")
    if stored is None:
        reasons.append(f"no validation attestation for compat key {manifest.compat_key}")
    elif not stored.attestation.passed:
        att = stored.attestation
        reasons.append(f"latest validation attestation ({att.created_at}) did not pass: verdict {att.verdict!r}")
    else:  # it says pass: its own figures must say so too
        verdict, why = recomputed_verdict(stored.attestation)
        if verdict != "pass":
            reasons.append(f"latest validation attestation ({stored.attestation.created_at}) says pass but its "
                           f"recorded figures give {verdict}: " + "; ".join(why))
    if reasons and not force:
        raise PromotionRefusedError(artifact_id, channel, reasons)
    return set_channel(store, artifact_id, manifest, channel, reason=reason, forced=bool(reasons) and force,
                       who=who, signer=signer, verified_at=verified_at, verify_window_s=verify_window_s,
                       attempts=attempts, rollout=rollout, ttl_s=ttl_s, trusted=trusted)


def channel_compat_keys(store: Store, profile: str, channel: str) -> list[str]:
    return [compat_key_of_channel_key(k) for k in store.list(channel_prefix(profile, channel))]


def history(store: Store, profile: str, channel: str, compat_key: str | None = None) -> list[ChannelRecord]:
    """The channel's records, oldest first, for one compat key or all of them.

    A promoter that died between its swap and its history write leaves the ref one record ahead:
    that record is included (and written, where this caller may write) so the chain has no gap.
    """
    prefix = history_prefix(profile, channel, compat_key) if compat_key else history_channel_prefix(profile, channel)
    out = {(r.compat_key, r.seq): r for r in (_parse_record(store.get_bytes(k), k) for k in store.list(prefix))}
    for key in (compat_key,) if compat_key else channel_compat_keys(store, profile, channel):
        got = read_channel(store, profile, channel, key)
        if got and (got[0].compat_key, got[0].seq) not in out:
            out[(got[0].compat_key, got[0].seq)] = got[0]
            try:
                _settle_history(store, got[0])
            except StoreUnavailableError:
                pass  # a read-only caller (a node): the record is still reported
    return sorted(out.values(), key=lambda r: (r.compat_key, r.seq))


def rollback(store: Store, profile: str, channel: str, *, to: str | None = None, compat_key: str | None = None,
             reason: str | None = None, who: str = UNKNOWN_ACTOR, signer: SigningKey | None = None,
             verify_window_s: float = DEFAULT_VERIFY_WINDOW_S, ttl_s: float | None = None) -> ChannelRecord:
    """Point the channel at an earlier artifact, recorded as a new, higher history record."""
    keys = [compat_key] if compat_key else channel_compat_keys(store, profile, channel)
    if not keys or (compat_key and read_channel(store, profile, channel, compat_key) is None):
        raise ChannelNotFoundError(profile, channel, keys or ["<none>"])
    if len(keys) > 1:
        raise StoreArgumentError(f"channel {channel!r} of {profile!r} has refs for {len(keys)} compat keys; pass --compat-key")
    compat = keys[0]
    current = read_channel(store, profile, channel, compat)
    if current is None:
        raise ChannelNotFoundError(profile, channel, [compat])
    if to is not None:
        target = resolve_artifact(store, to)
    else:
        target = None
        for rec in reversed(history(store, profile, channel, compat)):
            if rec.artifact_id != current[0].artifact_id:
                target = rec.artifact_id
                break
        if target is None:
            raise ArtifactNotFoundError("<previous>", f"channel {channel!r} has no earlier artifact to roll back to")
    manifest = get_manifest(store, target)
    if manifest.profile_name != profile or manifest.compat_key != compat:
        raise StoreArgumentError(f"artifact {target} is for {manifest.profile_name}/{manifest.compat_key}, not {profile}/{compat}")
    verified_at = verify_recent_or_quarantine(store, target, detector=f"rollback of {channel}", who=who, signer=signer,
                                  window_s=verify_window_s)
    return set_channel(store, target, manifest, channel, reason=reason or "rollback", action="rollback",
                       who=who, signer=signer, verified_at=verified_at, verify_window_s=verify_window_s, ttl_s=ttl_s)


# --- rollout steps: each a new, signed history record --------------------------------------------

ROLLOUT_STEPS = ("advance", "complete", "pause", "resume", "halt", "abort")


def rollout_step(store: Store, profile: str, channel: str, compat_key: str, step: str, *,
                 expect_seq: int | None = None, reason: str | None = None, failed_nodes: tuple[str, ...] = (),
                 who: str = UNKNOWN_ACTOR, signer: SigningKey | None = None, ttl_s: float | None = None) -> ChannelRecord:
    """Move a live rollout on: ``advance`` to the next wave, ``complete`` it (every node has the
    new artifact), ``pause``/``resume`` it, or ``halt`` (failures over budget) / ``abort`` (an
    operator) it, which points the channel back at the rollout's base artifact. ``expect_seq``:
    the record the decision was made on; if the channel moved since, :class:`CasConflictError`
    (decide again on the new record)."""
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

    return move_channel(store, profile, channel, compat_key, make, who=who, signer=signer, ttl_s=ttl_s)


def resign(store: Store, rec: ChannelRecord, *, who: str, signer: SigningKey, ttl_s: float) -> ChannelRecord:
    """Write the channel's current content again as a new record, freshly signed with a new expiry
    (the TUF timestamp role's job); a record moved since ``rec`` is left alone (it is newer)."""

    def make(current: ChannelRecord | None) -> dict[str, Any] | None:
        if current is None or current.seq != rec.seq:
            return None
        keep = current.model_dump(exclude={"seq", "profile", "channel", "compat_key", "who", "when", "expires",
                                           "signature", "action", "reason"})
        keep["rollout"] = current.rollout
        return {**keep, "action": "resign", "reason": f"re-signed #{current.seq} before it expires"}

    return move_channel(store, rec.profile, rec.channel, rec.compat_key, make, who=who, signer=signer, ttl_s=ttl_s)


def all_channel_records(store: Store) -> list[ChannelRecord]:
    """Every channel ref's current record."""
    out = []
    for key in store.list(CHANNELS):
        got = store.get_ref(key)
        if got is not None:
            out.append(_parse_record(got[0], key))
    return out


def channels_pointing_at(store: Store, artifact_id: str) -> list[ChannelRecord]:
    return [rec for rec in all_channel_records(store) if rec.artifact_id == artifact_id]
