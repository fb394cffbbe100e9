"""Gated channel moves: promotion and rollback.

``promote`` moves a channel only when the promotion gate passes (:func:`promotion_refusals`): the
artifact is not quarantined, its bytes deep-verify now (or, when the caller opts in with
``trust_verify_within_s``, did that recently; a mismatch quarantines it), and its latest attestation for its compat key passed, says so in its own
figures and, with trusted keys, is signed by a validator key. ``force`` overrides only the
attestation part and the staging-first rule (``prod`` takes only what was on ``staging``), with a
reason on record: bytes that do not verify are never promoted.
``rollback`` points a channel at an earlier artifact, after the same byte check.
"""

from __future__ import annotations

from buildctl.artifact_store.trust.attestations import latest_attestation, recomputed_verdict
from buildctl.artifact_store.trust.binding import manifest_blake3
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import Store
from buildctl.core.errors import BuildctlError
from buildctl.artifact_store.channels import (
    CasRetry,
    ChannelMove,
    ChannelRecord,
    channel_compat_keys,
    checked_history,
    history,
    read_channel,
    set_channel,
)
from buildctl.artifact_store.errors import (
    ArtifactNotFoundError,
    ChannelNotFoundError,
    PromotionRefusedError,
    SignatureError,
    StoreArgumentError,
)
from buildctl.artifact_store.upkeep.integrity import verify_recent_or_quarantine
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.trust.revocation import with_revocations
from buildctl.artifact_store.fleet.waves import RolloutPlan
from buildctl.artifact_store.trust.signing import TrustedKeys, verify_signature
from buildctl.artifact_store.trust.provenance import ExpectedInputs, provenance_refusals
from buildctl.artifact_store.read import get_manifest, resolve_artifact


def promotion_refusals(store: Store, artifact_id: str, manifest: Manifest, auth: Authority,
                       compat_key: str | None = None) -> list[str]:
    """Why the attestation gate refuses the artifact (empty: it passes): no attestation for its
    compat key, one that did not pass, one whose own figures do not give a pass, or (with trusted
    keys) one not signed by an unrevoked validator key. ``compat_key``: the key it is promoted
    under when not the manifest's (a schema-1 key's hosts are a subset of the new key's, so an
    attestation under either counts; the newest of them decides)."""
    reasons: list[str] = []
    keys = {manifest.compat_key, compat_key or manifest.compat_key}
    stored = latest_attestation(store, artifact_id, keys)
    if stored is None and manifest.rehashed_from is not None:
        # `buildctl rehash`: the same files as the schema 1 artifact it names, so that one's
        # validation is this one's (its attestation binds the old manifest's bytes, checked below)
        try:
            before = get_manifest(store, manifest.rehashed_from)
        except BuildctlError:
            before = None
        if before is not None and before.same_files(manifest):
            artifact_id = manifest.rehashed_from
            stored = latest_attestation(store, artifact_id, keys)
    if stored is not None and auth.trusted is not None:
        try:
            verify_signature(f"attestation of {artifact_id}", stored.signed_bytes, stored.attestation.signature,
                             with_revocations(store, auth.trusted), "validator", signed_at=stored.attestation.created_at)
        except SignatureError as err:
            reasons.append(f"attestation signature: {err.detail}")
    if stored is not None and stored.attestation.manifest_blake3 is not None:
        now = manifest_blake3(store, artifact_id)
        if now != stored.attestation.manifest_blake3:
            reasons.append(f"attestation {stored.attestation_id} signed manifest bytes {stored.attestation.manifest_blake3}, "
                           f"the store's hash to {now}: not evidence for these bytes")
    if stored is None:
        reasons.append(f"no validation attestation for compat key {compat_key or manifest.compat_key}")
    elif not stored.attestation.passed:
        att = stored.attestation
        reasons.append(f"latest validation attestation ({att.created_at}) did not pass: verdict {att.verdict!r}")
    else:  # it says pass: its own figures must say so too
        verdict, why = recomputed_verdict(stored.attestation)
        if verdict != "pass":
            reasons.append(f"latest validation attestation ({stored.attestation.created_at}) says pass but its "
                           f"recorded figures give {verdict}: " + "; ".join(why))
    return reasons


# Production channels: the flows never promote to them (CI does), and each takes only an artifact
# that was on the channel before it first (under the same compat key); --force --reason overrides.
PROTECTED_CHANNELS = frozenset({"prod", "production"})
STAGED_BEFORE = {"prod": "staging", "production": "staging"}
FIRST_CHANNEL = "staging"


def next_channel(current: str | None) -> str | None:
    """Where a passing artifact may go next: staging when it is on no channel, the production
    channel that requires ``current`` first (prod after staging), None past that."""
    if current is None:
        return FIRST_CHANNEL
    return "prod" if STAGED_BEFORE["prod"] == current else None


def staging_refusal(store: Store, artifact_id: str, manifest: Manifest, channel: str,
                    compat_key: str | None = None, trusted: "TrustedKeys | None" = None) -> str | None:
    """Why ``channel`` refuses an artifact that was never on the channel before it (None: it was,
    or the channel has none). Only checked history records count (:func:`checked_history`): a
    record another principal wrote into ``history/`` is no proof."""
    before = STAGED_BEFORE.get(channel)
    if before is None:
        return None
    for key in {manifest.compat_key, compat_key or manifest.compat_key}:
        if any(e.problem is None and e.record.artifact_id == artifact_id
               for e in checked_history(store, manifest.profile_name, before, key, trusted)):
            return None
    return f"it was never on {before!r}: promote it there first (or --force --reason)"


def promote(store: Store, artifact_ref: str, channel: str, *, auth: Authority = Authority(),
            move: ChannelMove = ChannelMove(), retry: CasRetry = CasRetry(), trust_verify_within_s: float = 0.0,
            provenance: ExpectedInputs | None = None) -> ChannelRecord:
    """Promote after the gates (see the module docstring); a byte mismatch quarantines the artifact
    and raises :class:`VerificationError` (exit 4), a refused gate :class:`PromotionRefusedError`.
    ``move``: the reason, a rollout, the ref's compat key, and ``forced`` (``--force``: go past
    refused gates; the record says forced only when a gate refused).
    Every blob is re-hashed unless ``trust_verify_within_s`` (``--trust-verify-within``) allows a
    deep verify that recent; the record says which. ``move.compat_key``: the ref's key when not the
    manifest's (see :func:`promotion_refusals`). ``provenance``: the inputs the artifact's build
    provenance must show (:func:`~buildctl.artifact_store.trust.provenance.provenance_refusals`); the
    production channels get it from :func:`buildctl.steps.promote.promote`."""
    artifact_id = resolve_artifact(store, artifact_ref)
    compat_key = move.compat_key
    if move.forced and not move.reason:
        raise StoreArgumentError("--force needs --reason: a break-glass promotion is recorded with why")
    auth = auth.but(verify_window_s=trust_verify_within_s)
    verified_at = verify_recent_or_quarantine(store, artifact_id, detector=f"promote to {channel}", auth=auth)
    manifest = get_manifest(store, artifact_id)
    reasons = promotion_refusals(store, artifact_id, manifest, auth, compat_key)
    reasons += [r for r in [staging_refusal(store, artifact_id, manifest, channel, compat_key, auth.trusted)] if r]
    if provenance is not None:
        reasons += provenance_refusals(store, artifact_id, manifest, auth, provenance)
    if reasons and not move.forced:
        raise PromotionRefusedError(artifact_id, channel, reasons)
    recorded = move.model_copy(update={"action": "promote", "forced": bool(reasons), "verified_at": verified_at})
    return set_channel(store, artifact_id, manifest, channel, auth=auth, move=recorded, retry=retry)


def _same_key(store: Store, artifact_id: str, compat: str, served: list[ChannelRecord]) -> bool:
    """Whether ``artifact_id`` may serve ``compat``: built for it, or served under it by a checked
    record (an artifact kept across the hard/soft key change, migrate-keys)."""
    return get_manifest(store, artifact_id).compat_key == compat or any(r.artifact_id == artifact_id for r in served)


def rollback(store: Store, profile: str, channel: str, *, auth: Authority = Authority(), to: str | None = None,
             compat_key: str | None = None, reason: str | None = None, trust_verify_within_s: float = 0.0) -> ChannelRecord:
    """Point the channel at an earlier artifact (``to``, default the one before the current),
    recorded as a new, higher history record; its blobs are re-hashed first unless
    ``trust_verify_within_s`` allows a deep verify that recent."""
    auth = auth.but(verify_window_s=trust_verify_within_s)
    keys = [compat_key] if compat_key else channel_compat_keys(store, profile, channel)
    if not keys or (compat_key and read_channel(store, profile, channel, compat_key) is None):
        from buildctl.artifact_store.node.pull import unknown_name

        raise ChannelNotFoundError(profile, channel, keys or ["<none>"], unknown_name(store, profile, channel))
    if len(keys) > 1:
        raise StoreArgumentError(f"channel {channel!r} of {profile!r} has refs for {len(keys)} compat keys; pass --compat-key")
    compat = keys[0]
    current = read_channel(store, profile, channel, compat)
    if current is None:
        raise ChannelNotFoundError(profile, channel, [compat])
    # Only records a reader can stand behind: the ref's own, or signed (with trusted keys) and linked
    # (checked_history); a record another principal wrote into history/ picks nothing.
    served = [e.record for e in checked_history(store, profile, channel, compat, auth.trusted) if e.problem is None]
    if to is not None:
        target = resolve_artifact(store, to)
    else:
        target = None
        # the ref's own (signed) word for the artifact before it first, then the checked records, newest first
        for aid in [current[0].previous] + [r.artifact_id for r in reversed(served)]:
            if aid and aid != current[0].artifact_id and _same_key(store, aid, compat, served):
                target = aid
                break
        if target is None:
            raise ArtifactNotFoundError("<previous>", f"channel {channel!r} has no earlier artifact to roll back to")
    manifest = get_manifest(store, target)
    if manifest.profile_name != profile or not _same_key(store, target, compat, served):
        raise StoreArgumentError(f"artifact {target} is for {manifest.profile_name}/{manifest.compat_key}, not {profile}/{compat}")
    verified_at = verify_recent_or_quarantine(store, target, detector=f"rollback of {channel}", auth=auth)
    return set_channel(store, target, manifest, channel, auth=auth,
                       move=ChannelMove(action="rollback", reason=reason or "rollback", verified_at=verified_at,
                                        compat_key=compat))
