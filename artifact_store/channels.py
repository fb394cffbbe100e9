"""Channels: mutable refs per (profile, channel, compat key), moved with compare-and-swap, with an
append-only history; promotion through the gates, and rollback."""

from __future__ import annotations

import random
import re
import time
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from buildctl.digest import canonical_json
from buildctl.store.attestations import latest_attestation
from buildctl.store.backend import Store
from buildctl.store.errors import (
    ArtifactNotFoundError,
    CasConflictError,
    ChannelNotFoundError,
    CorruptObjectError,
    PromotionRefusedError,
    SignatureError,
    StoreArgumentError,
    StoreUnavailableError,
)
from buildctl.store.layout import (
    CHANNELS,
    channel_key,
    channel_prefix,
    compat_key_of_channel_key,
    history_channel_prefix,
    history_key,
    history_prefix,
)
from buildctl.store.manifest import Manifest, utc_now
from buildctl.store.signing import SigningKey, TrustedKeys, verify_signature
from buildctl.store.integrity import DEFAULT_VERIFY_WINDOW_S, check_integrity
from buildctl.store.verify import get_manifest, resolve_artifact

CHANNEL_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
UNKNOWN_ACTOR = "unknown"


class ChannelRecord(BaseModel):
    """One promotion: the channel ref's content and its append-only history entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(..., ge=1, description="Position in the channel's history, 1-based, no gaps.")
    profile: str = Field(..., description="Profile name.")
    channel: str = Field(..., description="Channel name.")
    compat_key: str = Field(..., description="Compat key the channel ref is for.")
    artifact_id: str = Field(..., description="The artifact the channel now points at.")
    previous: str | None = Field(None, description="The artifact it pointed at before, if any.")
    who: str = Field(..., description="user@host, or the CI identity.")
    when: str = Field(..., description="UTC ISO-8601 time of the promotion.")
    reason: str | None = Field(None, description="Why (required for forced promotions and rollbacks).")
    forced: bool = Field(False, description="Whether the promotion gates were overridden.")
    action: str = Field("promote", description="promote or rollback.")
    verified_at: str | None = Field(None, description="When the deep verify this move relied on ran (every blob re-hashed).")
    verify_window_s: float | None = Field(None, description="How old that deep verify was allowed to be, in seconds.")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")

    def signed_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", exclude={"signature"}))


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
    store.put_bytes(history_key(rec.profile, rec.channel, rec.compat_key, rec.seq), canonical_json(rec.model_dump(mode="json")))


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
    attempts: int = 30,
    sleep: Callable[[float], None] = time.sleep,
) -> ChannelRecord:
    """Move a channel to an artifact with compare-and-swap; retried with jitter; appends history."""
    if not re.match(CHANNEL_RE, channel):
        raise StoreArgumentError(f"bad channel name {channel!r}: lowercase letters, digits and dashes")
    profile, compat = manifest.profile_name, manifest.compat_key
    ref = channel_key(profile, channel, compat)
    for attempt in range(attempts):
        current = read_channel(store, profile, channel, compat)
        if current is not None:
            _settle_history(store, current[0])
            signed_by = (current[0].signature or {}).get("key_id")
            if action == "promote" and current[0].artifact_id == artifact_id and signed_by == (signer.key_id if signer else None):
                return current[0]  # already there: promotions are idempotent (CI retries)
        rec = ChannelRecord(
            seq=(current[0].seq + 1) if current else 1, profile=profile, channel=channel, compat_key=compat,
            artifact_id=artifact_id, previous=current[0].artifact_id if current else None,
            who=who, when=utc_now(), reason=reason, forced=forced, action=action, verified_at=verified_at,
            verify_window_s=verify_window_s,
        )
        if signer is not None:
            rec = rec.model_copy(update={"signature": signer.sign(rec.signed_bytes())})
        if store.cas(ref, canonical_json(rec.model_dump(mode="json")), current[1] if current else None):
            _settle_history(store, rec)
            return rec
        sleep(random.uniform(0, min(1.0, 0.01 * 2 ** attempt)))
    raise CasConflictError(ref, attempts)


def promote(store: Store, artifact_ref: str, channel: str, *, force: bool = False, reason: str | None = None,
            who: str = UNKNOWN_ACTOR, signer: SigningKey | None = None, trusted: TrustedKeys | None = None,
            verify_window_s: float = DEFAULT_VERIFY_WINDOW_S, attempts: int = 30) -> ChannelRecord:
    """Promote after the gates: the artifact is not quarantined and deep-verifies (every blob
    re-hashed, or a deep verify within ``verify_window_s``: a mismatch quarantines it and raises
    :class:`VerificationError`, exit 4), and its latest attestation for its compat key passed (and,
    with ``trusted`` keys, is signed by one of them). ``force`` overrides only the attestation
    gates: bytes that do not verify are never promoted."""
    artifact_id = resolve_artifact(store, artifact_ref)
    if force and not reason:
        raise StoreArgumentError("--force needs --reason: a break-glass promotion is recorded with why")
    reasons: list[str] = []
    verified_at = check_integrity(store, artifact_id, detector=f"promote to {channel}", who=who, signer=signer,
                                  window_s=verify_window_s)
    manifest = get_manifest(store, artifact_id)
    stored = latest_attestation(store, artifact_id, manifest.compat_key)
    if stored is not None and trusted is not None:
        try:
            verify_signature(f"attestation of {artifact_id}", stored.signed_bytes, stored.attestation.signature, trusted)
        except SignatureError as err:
            reasons.append(f"attestation signature: {err.detail}")
    if stored is None:
        reasons.append(f"no validation attestation for compat key {manifest.compat_key}")
    elif not stored.attestation.passed:
        att = stored.attestation
        reasons.append(f"latest validation attestation ({att.created_at}) did not pass: verdict {att.verdict!r}")
    if reasons and not force:
        raise PromotionRefusedError(artifact_id, channel, reasons)
    return set_channel(store, artifact_id, manifest, channel, reason=reason, forced=bool(reasons) and force,
                       who=who, signer=signer, verified_at=verified_at, verify_window_s=verify_window_s,
                       attempts=attempts)


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
             verify_window_s: float = DEFAULT_VERIFY_WINDOW_S) -> ChannelRecord:
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
    verified_at = check_integrity(store, target, detector=f"rollback of {channel}", who=who, signer=signer,
                                  window_s=verify_window_s)
    return set_channel(store, target, manifest, channel, reason=reason or "rollback", action="rollback",
                       who=who, signer=signer, verified_at=verified_at, verify_window_s=verify_window_s)


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
