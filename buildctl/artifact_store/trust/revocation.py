"""Key revocation: create-only, promoter-signed records that nodes and promote honour.

A revocation names a key id, when it stops counting, and why. The records are create-only
(``keys/revocations/<when>-<digest>.json``, under Object Lock in production), so the list only
grows: deleting one takes the break-glass role. With trusted keys, only records signed by a
trusted **promoter** key (one not itself revoked at the time of the record) count; the rest are
ignored. A signature by a revoked key counts only on a record made before the revocation time
(the record's own time: a manifest's or attestation's ``created_at``, a channel record's ``when``).
A stolen key can backdate what it signs, so after a revocation, re-sign the channels
(``resign-channels``): nodes then refuse anything older than what they saw (rollback protection).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json, digest_bytes
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.errors import SignatureError, SignerNotTrustedError, StoreArgumentError
from buildctl.artifact_store.layout import REVOCATIONS, revocation_key
from buildctl.core.times import parse_utc, utc_now
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.trust.signing import TrustedKeys


class Revocation(Record):
    """One key's revocation."""

    key_id: str = Field(..., description="The revoked key's id.")
    revoked_at: str = Field(..., description="UTC ISO-8601 time from which the key's signatures do not count.")
    reason: str = Field(..., description="Why (a leak, a departure, a rotation).")
    who: str = Field(..., description="user@host or the CI identity that revoked it.")
    when: str = Field(..., description="UTC ISO-8601 time the record was written.")
    signature: dict[str, str] | None = Field(None, description="A promoter key's Ed25519 signature over the record without this field.")

    def signed_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", exclude={"signature"}))


def revoke(store: Store, key_id: str, reason: str, *, auth: Authority,
           revoked_at: str | None = None) -> Revocation:
    """Write a revocation of ``key_id`` (from ``revoked_at``, default now), signed by ``auth``'s key.
    Only a revocation that will count is written: the signer must be a trusted promoter key, not
    revoked (:class:`SignerNotTrustedError`, exit 5), and the key must be trusted and not already
    revoked from that time or earlier (a no-op is an argument error)."""
    from buildctl.artifact_store.trust.signing import signer_refusal

    if not reason:
        raise StoreArgumentError("a revocation needs --reason")
    signer = auth.signer
    if signer is None:
        raise StoreArgumentError("a revocation is signed: set BUILDCTL_SIGNING_KEY to a promoter key")
    if auth.trusted is None:
        raise StoreArgumentError("key revoke needs BUILDCTL_TRUSTED_KEYS: without trusted keys no node checks "
                                 "signatures, so a revocation would count for nothing")
    now = utc_now()
    trusted = with_revocations(store, auth.trusted)
    why = signer_refusal(trusted, signer.key_id, "promoter")
    if why is not None:
        raise SignerNotTrustedError(signer.key_id, "promoter", why)
    if trusted.role_of(key_id) is None:
        raise StoreArgumentError(f"key {key_id} is not a trusted key: revoking it changes nothing")
    at = parse_utc(revoked_at or now)
    if key_id in trusted.revoked and trusted.revoked[key_id][0] <= at:
        was, why_then = trusted.revoked[key_id]
        raise StoreArgumentError(f"key {key_id} is already revoked from {was.isoformat()} ({why_then}): "
                                 "this revocation would change nothing")
    rec = Revocation(key_id=key_id, revoked_at=revoked_at or now, reason=reason, who=auth.who, when=now)
    rec = rec.model_copy(update={"signature": signer.sign(rec.signed_bytes())})
    body = canonical_json(rec.model_dump(mode="json"))
    store.put_bytes(revocation_key(now, digest_bytes(body)), body)
    return rec


def revocation_keys(store: Store) -> list[str]:
    """The keys of the revocation records (create-only, so the same keys are the same records)."""
    return list(store.list(REVOCATIONS))


def revocations(store: Store, keys: list[str] | None = None) -> list[Revocation]:
    """Every well-formed revocation record, oldest first (signatures not checked here); ``keys``:
    the listing already made (:func:`revocation_keys`)."""
    out = []
    for key in revocation_keys(store) if keys is None else keys:
        try:
            out.append(Revocation.model_validate_json(store.get_bytes(key)))
        except ValidationError:
            continue  # a malformed record revokes nothing
    return out


def with_revocations(store: Store, trusted: TrustedKeys, keys: list[str] | None = None) -> TrustedKeys:
    """``trusted`` with the revocations that a trusted promoter key signed (and was not itself
    revoked at the time of signing); ``keys``: the revocation listing already made."""
    from buildctl.artifact_store.trust.signing import verify_signature

    revoked: dict[str, tuple[datetime, str]] = dict(trusted.revoked)  # those given, and the store's
    for rec in revocations(store, keys):  # oldest first: a revocation by a since-revoked key counts if made before
        probe = replace(trusted, revoked=dict(revoked))
        try:
            verify_signature(f"revocation of {rec.key_id}", rec.signed_bytes(), rec.signature, probe, "promoter",
                             signed_at=rec.when)
        except SignatureError:
            continue
        at = parse_utc(rec.revoked_at)
        if rec.key_id not in revoked or at < revoked[rec.key_id][0]:
            revoked[rec.key_id] = (at, rec.reason)
    return replace(trusted, revoked=revoked)
