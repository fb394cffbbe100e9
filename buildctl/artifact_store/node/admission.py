"""Whether a node may trust a channel record: fresh, signed by enough trusted promoter keys,
pointing at a manifest signed by a trusted builder key, and not older than what the node has seen
or than the channel's newest signed history record. Plain checks on values: the caller says what
it has seen."""

from __future__ import annotations

from pydantic import Field

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json, digest_bytes, hex_of
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import ChannelRecord, history_after, read_history_record
from buildctl.artifact_store.layout import history_key, history_prefix
from buildctl.artifact_store.errors import ExpiredRecordError, RollbackError, SignatureError, StaleRecordError
from buildctl.artifact_store.trust.revocation import revocation_keys, with_revocations
from buildctl.artifact_store.trust.signing import TrustedKeys, verify_manifest_signature, verify_signature


def check_fresh(record: ChannelRecord, min_seq: int = 0) -> None:
    """Refuse a record below this node's provisioned floor, or past its expiry (keys or not)."""
    if record.seq < min_seq:  # the floor provisioning pinned for this node (--min-seq)
        raise StaleRecordError(record.channel, record.seq, min_seq, "this node's --min-seq")
    if record.expired():
        raise ExpiredRecordError(record.channel, record.seq, str(record.expires))


class VerifiedRef(Record):
    """What one full trust check of a channel record covered: the record's bytes, the artifact it
    gave this node, the node's trusted keys and the store's revocation list. A node keeps it (in
    its directory) after installing; while a poll finds all four unchanged, the signatures are not
    checked again (the ref's bytes are compared by digest, not by the server's version token)."""

    ref: str = Field(..., description="profile/channel/compat key")
    record_digest: str = Field(..., description="Digest of the record's canonical bytes.")
    artifact_id: str = Field(..., description="The artifact the record gave this node.")
    trusted_keys: str = Field(..., description="Digest of the node's trusted keys, roles and thresholds.")
    revocations: tuple[str, ...] = Field(..., description="The revocation records' keys at the check.")


def trusted_keys_digest(trusted: TrustedKeys) -> str:
    """A digest of what a node trusts: key ids by role (a key id is its public key's digest), the
    channel thresholds and the revocations it was given."""
    return hex_of(digest_bytes(canonical_json({
        "roles": {role: sorted(keys) for role, keys in sorted(trusted.by_role.items())},
        "thresholds": dict(sorted(trusted.thresholds.items())),
        "revoked": {kid: [at.isoformat(), why] for kid, (at, why) in sorted(trusted.revoked.items())}})))


def check_trust(store: Store, record: ChannelRecord, trusted: TrustedKeys, *, seen: int = 0,
                artifact_id: str | None = None, known: VerifiedRef | None = None) -> VerifiedRef:
    """With trusted keys: the channel record must be signed by a trusted promoter key and the
    manifest of ``artifact_id`` (default: the record's) by a trusted builder key, neither revoked
    at the time of the record; and the record must not be older than what this node installed
    (``seen``: the highest sequence of this channel ref the node installed; rollback protection)
    nor than the channel's newest signed history record. Returns what it checked; ``known``: what
    this node checked before. When nothing changed (same record bytes, artifact, keys and
    revocation list) the signatures are not checked again, and a poll costs the ref's GET, one
    LIST of revocations and one LIST of newer history records."""
    aid = artifact_id or record.artifact_id
    rev_keys = revocation_keys(store)
    proof = VerifiedRef(ref=f"{record.profile}/{record.channel}/{record.compat_key}",
                        record_digest=hex_of(digest_bytes(record.to_bytes())), artifact_id=aid,
                        trusted_keys=trusted_keys_digest(trusted), revocations=tuple(rev_keys))
    effective = None if known == proof else with_revocations(store, trusted, rev_keys)
    if effective is not None:
        _check_signatures(store, record, effective, aid)
    if record.seq < seen:
        raise RollbackError(record.channel, record.seq, seen)
    # A node that has installed nothing yet has no 'seen': the channel's create-only history
    # (Object Lock in production) is the witness. A validly signed history record newer than the
    # ref means the ref was replayed or frozen.
    newer = list(history_after(store, record))  # normally none
    if newer and effective is None:
        effective = with_revocations(store, trusted, rev_keys)
    newest = _newest_signed(newer, effective or trusted)
    if newest > record.seq:
        raise StaleRecordError(record.channel, record.seq, newest, "the channel's signed history")
    return proof


def _check_signatures(store: Store, record: ChannelRecord, trusted: TrustedKeys, artifact_id: str) -> None:
    verify_signature(f"channel record {record.channel} #{record.seq}", record.signed_bytes(), record.signature, trusted,
                     "promoter", signed_at=record.when)
    k = trusted.threshold(record.channel)
    if k > 1:
        have = record.signers(trusted)
        if len(have) < k and not (record.action != "promote"
                                  and approved_before(store, record, artifact_id, trusted, k)):
            raise SignatureError(f"channel record {record.channel} #{record.seq}",
                                 f"{len(have)} of the {k} promoter signatures the channel requires")
    verify_manifest_signature(store, artifact_id, trusted)


def approved_before(store: Store, record: ChannelRecord, artifact_id: str, trusted: TrustedKeys, k: int) -> bool:
    """Whether an earlier history record with ``k`` promoter signatures moved the channel to
    ``artifact_id``: a rollback, a rollout step or a re-sign may then carry one signature (it
    chooses among artifacts the channel's quorum already approved). A ref that ``migrate-keys``
    started continues the history of its schema-1 key, whose approvals count too. Read newest
    first and stopped at the first approval: a rollout step finds its start a few records back."""
    def approves(r: ChannelRecord) -> bool:
        return ((r.artifact_id == artifact_id or (r.rollout is not None and r.rollout.target == artifact_id))
                and len(r.signers(trusted)) >= k)

    keys = list(store.list(history_prefix(record.profile, record.channel, record.compat_key)))
    below = history_key(record.profile, record.channel, record.compat_key, record.seq)
    if any(approves(read_history_record(store, key)) for key in reversed(keys) if key < below):
        return True
    first = read_history_record(store, keys[0]) if keys else record
    old = first.migrated_from if first.action == "migrate-keys" else None
    return old is not None and any(
        approves(read_history_record(store, key))
        for key in reversed(list(store.list(history_prefix(record.profile, record.channel, old)))))


def _newest_signed(records: list[ChannelRecord], trusted: TrustedKeys) -> int:
    for rec in records:  # newest first
        try:
            verify_signature(f"channel record {rec.channel} #{rec.seq}", rec.signed_bytes(), rec.signature, trusted,
                             "promoter", signed_at=rec.when)
        except SignatureError:
            continue  # an unsigned or forged history entry proves nothing
        return rec.seq
    return 0
