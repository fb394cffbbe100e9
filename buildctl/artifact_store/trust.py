"""Whether a node may trust a channel record: fresh, signed by enough trusted promoter keys,
pointing at a manifest signed by a trusted builder key, and not older than what the node has seen
or than the channel's newest signed history record. Plain checks on values: the caller says what
it has seen."""

from __future__ import annotations

from buildctl.artifact_store.backend import Store
from buildctl.artifact_store.channels import ChannelRecord, history
from buildctl.artifact_store.errors import ExpiredRecordError, RollbackError, SignatureError, StaleRecordError
from buildctl.artifact_store.revocation import with_revocations
from buildctl.artifact_store.signing import TrustedKeys, verify_manifest_signature, verify_signature


def check_fresh(record: ChannelRecord, min_seq: int = 0) -> None:
    """Refuse a record below this node's provisioned floor, or past its expiry (keys or not)."""
    if record.seq < min_seq:  # the floor provisioning pinned for this node (--min-seq)
        raise StaleRecordError(record.channel, record.seq, min_seq, "this node's --min-seq")
    if record.expired():
        raise ExpiredRecordError(record.channel, record.seq, str(record.expires))


def check_trust(store: Store, record: ChannelRecord, trusted: TrustedKeys, *, seen: int = 0,
                artifact_id: str | None = None) -> None:
    """With trusted keys: the channel record must be signed by a trusted promoter key and the
    manifest of ``artifact_id`` (default: the record's) by a trusted builder key, neither revoked
    at the time of the record; and the record must not be older than what this node installed
    (``seen``: the highest sequence of this channel ref the node installed; rollback protection)
    nor than the channel's newest signed history record."""
    trusted = with_revocations(store, trusted)
    verify_signature(f"channel record {record.channel} #{record.seq}", record.signed_bytes(), record.signature, trusted,
                     "promoter", signed_at=record.when)
    k = trusted.threshold(record.channel)
    if k > 1:
        have = record.signers(trusted)
        if len(have) < k and not (record.action != "promote"
                                  and approved_before(store, record, artifact_id or record.artifact_id, trusted, k)):
            raise SignatureError(f"channel record {record.channel} #{record.seq}",
                                 f"{len(have)} of the {k} promoter signatures the channel requires")
    verify_manifest_signature(store, artifact_id or record.artifact_id, trusted)
    if record.seq < seen:
        raise RollbackError(record.channel, record.seq, seen)
    # A node that has installed nothing yet has no 'seen': the channel's create-only history
    # (Object Lock in production) is the witness. A validly signed history record newer than the
    # ref means the ref was replayed or frozen.
    newest = newest_signed_seq(store, record, trusted)
    if newest > record.seq:
        raise StaleRecordError(record.channel, record.seq, newest, "the channel's signed history")


def approved_before(store: Store, record: ChannelRecord, artifact_id: str, trusted: TrustedKeys, k: int) -> bool:
    """Whether an earlier history record with ``k`` promoter signatures moved the channel to
    ``artifact_id``: a rollback, a rollout step or a re-sign may then carry one signature (it
    chooses among artifacts the channel's quorum already approved). A ref that ``migrate-keys``
    started continues the history of its schema-1 key, whose approvals count too."""
    here = history(store, record.profile, record.channel, record.compat_key)
    first = here[0] if here else record
    old = first.migrated_from if first.action == "migrate-keys" else None
    if old is not None and any(
            (r.artifact_id == artifact_id or (r.rollout and r.rollout.target == artifact_id)) and len(r.signers(trusted)) >= k
            for r in history(store, record.profile, record.channel, old)):
        return True
    return any(r.seq < record.seq and (r.artifact_id == artifact_id or (r.rollout and r.rollout.target == artifact_id))
               and len(r.signers(trusted)) >= k
               for r in here)


def newest_signed_seq(store: Store, record: ChannelRecord, trusted: TrustedKeys) -> int:
    """The highest sequence among the channel's history records signed by a trusted promoter key (0: none)."""
    for rec in reversed(history(store, record.profile, record.channel, record.compat_key)):
        try:
            verify_signature(f"channel record {rec.channel} #{rec.seq}", rec.signed_bytes(), rec.signature, trusted,
                             "promoter", signed_at=rec.when)
        except SignatureError:
            continue  # an unsigned or forged history entry proves nothing
        return rec.seq
    return 0


