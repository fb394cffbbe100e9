"""Whether a node may trust a channel record (buildctl.artifact_store.node.admission): freshness, rollback
protection against the sequence the node has seen, the signed history, k-of-n quorums. Called
directly on a local store; fast."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from buildctl.artifact_store.gc import gc
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.channels import ChannelMove, resign, set_channel
from buildctl.core.times import parse_utc
from buildctl.artifact_store.errors import (
    ExpiredRecordError,
    RollbackError,
    SignatureError,
    StaleRecordError,
)
from buildctl.artifact_store.layout import channel_key, history_key
from buildctl.artifact_store.node.install_dir import channel_ref, current_artifact, installed_seqs
from buildctl.artifact_store.node.pull import pull
from buildctl.artifact_store.node.admission import check_fresh, check_trust
from buildctl.artifact_store.trust.signing import TrustedKeys
from buildctl.artifact_store.trust.authority import Authority

from ...support.helpers import make_signer
from buildctl.artifact_store.node.pull import resolve_channel
from buildctl.artifact_store.gc import GcPolicy
from buildctl.artifact_store.channels import history

MiB = 1024 * 1024
P = "tiny-llama-cpu"



def test_check_fresh_floor_and_expiry(node_env):
    store, (a, *_), _, draft = node_env
    m = get_manifest(store, a)
    rec = set_channel(store, a, m, "prod", auth=Authority(signer=make_signer(), ttl_s=60))
    check_fresh(rec, min_seq=1)
    with pytest.raises(StaleRecordError):
        check_fresh(rec, min_seq=2)
    old = rec.model_copy(update={"expires": (parse_utc(rec.when) - timedelta(seconds=1)).isoformat()})
    with pytest.raises(ExpiredRecordError):
        check_fresh(old)


def test_pull_records_the_seq_and_refuses_older_records(signed_env):
    store, (a, b, *_), dest, trusted, p1, _ = signed_env
    m = get_manifest(store, a)
    set_channel(store, a, m, "prod", auth=Authority(signer=p1))
    r = pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    assert r.installed and r.record.seq == 1
    assert installed_seqs(dest) == {f"{P}/prod/{m.compat_key}": 1}
    assert (dest / "current" / "tok" / "a" / "merges.txt").read_bytes() == b"a b"
    again = pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))  # the same record again: fine
    assert not again.installed
    rec2 = set_channel(store, b, m, "prod", auth=Authority(signer=p1))
    pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    set_channel(store, ids_c := signed_env[1][2], m, "prod", auth=Authority(signer=p1))
    pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    assert len(list((dest / "versions").iterdir())) == 2 and current_artifact(dest) == ids_c  # keep 2 by default
    set_channel(store, b, m, "prod", auth=Authority(signer=p1))
    pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    old = history(store, P, "prod", m.compat_key)[0]
    with pytest.raises(RollbackError):
        check_trust(store, old, trusted, seen=installed_seqs(dest)[channel_ref(old)])
    with pytest.raises(RollbackError):
        check_trust(store, rec2, trusted, seen=installed_seqs(dest)[channel_ref(rec2)])
    last = history(store, P, "prod", m.compat_key)[-1]
    check_trust(store, last, trusted, seen=installed_seqs(dest)[channel_ref(last)])  # the same seq again: fine


def test_a_fresh_node_refuses_a_ref_behind_the_signed_history(signed_env, tmp_path):
    store, (a, b, c, _), dest, trusted, p1, _ = signed_env
    m = get_manifest(store, a)
    r1 = set_channel(store, a, m, "prod", auth=Authority(signer=p1))
    set_channel(store, b, m, "prod", auth=Authority(signer=p1))
    with pytest.raises(StaleRecordError):
        check_trust(store, r1, trusted)
    # an unsigned (forged) history entry above proves nothing: the newest *signed* one counts
    forged = r1.model_copy(update={"seq": 9, "signature": None})
    store.put_bytes(history_key(P, "prod", m.compat_key, 9), forged.to_bytes())
    rec2 = history(store, P, "prod", m.compat_key)[1]
    check_trust(store, rec2, trusted)
    with pytest.raises(StaleRecordError):  # the forged #9 does not hide the signed #2 either
        check_trust(store, r1, trusted)


def test_k_of_n_records_and_what_one_signature_may_still_do(signed_env, tmp_path):
    store, (a, b, c, _), dest, trusted, p1, p2 = signed_env
    trusted2 = TrustedKeys(trusted.by_role, thresholds={"prod": 2})
    m = get_manifest(store, a)
    set_channel(store, a, m, "prod", auth=Authority(signer=p1, trusted=trusted2), move=ChannelMove(action="rollback"))
    with pytest.raises(SignatureError, match="1 of the 2 promoter signatures"):
        check_trust(store, history(store, P, "prod", m.compat_key)[0], trusted2)
    set_channel(store, b, m, "prod", auth=Authority(signer=p1, trusted=trusted2))
    two = set_channel(store, b, m, "prod", auth=Authority(signer=p2, trusted=trusted2))
    check_trust(store, two, trusted2)
    # a single-signature rollback to b is accepted: b was approved by the quorum before
    set_channel(store, c, m, "prod", auth=Authority(signer=p1, trusted=trusted2), move=ChannelMove(action="rollback"))
    back = set_channel(store, b, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                       move=ChannelMove(action="rollback"))
    check_trust(store, back, trusted2)
    # ... but not to c, which only ever had one signature, nor as a promotion
    to_c = set_channel(store, c, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                       move=ChannelMove(action="rollback"))
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, to_c, trusted2)
    assert json.loads(to_c.to_bytes())["action"] == "rollback"


def test_a_quorum_approved_rollout_does_not_approve_a_rollback_elsewhere(signed_env, tmp_path):
    """k-of-n: a single-signature record may point only at an artifact a quorum record moved the
    channel to (or rolled out); a quorum-approved rollout of b approves b, not c."""
    from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves

    store, (a, b, c, _), dest, trusted, p1, p2 = signed_env
    trusted2 = TrustedKeys(trusted.by_role, thresholds={"prod": 2})
    m = get_manifest(store, a)
    set_channel(store, a, m, "prod", auth=Authority(signer=p1, trusted=trusted2), move=ChannelMove(action="rollback"))
    plan = RolloutPlan(waves=parse_waves("10,100", None), bake_s=0)
    set_channel(store, b, m, "prod", auth=Authority(signer=p1, trusted=trusted2), move=ChannelMove(rollout=plan))
    started = set_channel(store, b, m, "prod", auth=Authority(signer=p2, trusted=trusted2),
                          move=ChannelMove(rollout=plan))
    assert started.rollout is not None and len(started.signers(trusted2)) == 2
    to_c = set_channel(store, c, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                       move=ChannelMove(action="rollback"))
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, to_c, trusted2)
    to_b = set_channel(store, b, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                       move=ChannelMove(action="rollback"))
    check_trust(store, to_b, trusted2)


def test_a_migrated_ref_counts_its_old_keys_quorum_and_nothing_else(signed_env):
    """k-of-n: the first record under a new compat key, written by migrate-keys with one
    signature, is trusted when the old key's quorum approved its artifact; a migrate-keys record
    naming an artifact the old key's quorum never approved is not."""
    store, (a, b, c, _), dest, trusted, p1, p2 = signed_env
    trusted2 = TrustedKeys(trusted.by_role, thresholds={"prod": 2})
    m = get_manifest(store, a)
    set_channel(store, a, m, "prod", auth=Authority(signer=p1, trusted=trusted2))
    set_channel(store, a, m, "prod", auth=Authority(signer=p2, trusted=trusted2))  # a: 2 of 2 under the old key
    moved = set_channel(store, a, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                        move=ChannelMove(action="migrate-keys", compat_key="new-key", migrated_from=m.compat_key))
    assert moved.compat_key == "new-key" and moved.seq == 1
    check_trust(store, moved, trusted2)
    forged = set_channel(store, c, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                         move=ChannelMove(action="migrate-keys", compat_key="other-key", migrated_from=m.compat_key))
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, forged, trusted2)
    unnamed = set_channel(store, a, m, "prod", auth=Authority(signer=p1, trusted=trusted2),
                          move=ChannelMove(action="migrate-keys", compat_key="third-key"))  # no old key named
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, unnamed, trusted2)
    # a later one-signature record under the new key (a re-sign) still finds the old key's quorum,
    # through the migrate-keys record that starts the new key's history
    later = resign(store, moved, auth=Authority(signer=p1, trusted=trusted2))
    assert later.compat_key == "new-key" and later.seq == 2
    check_trust(store, later, trusted2)


def _long_history(store, aid, m, p1, n):
    """``n`` records on prod, all to ``aid`` (re-signs, as a year of them would leave)."""
    rec = set_channel(store, aid, m, "prod", auth=Authority(signer=p1))
    for _ in range(n - 1):
        rec = resign(store, rec, auth=Authority(signer=p1))
    return rec


def test_a_poll_of_an_unchanged_ref_makes_three_requests_however_long_its_history(signed_env):
    """Issue 32: a node that verified a ref and installed its artifact polls with the ref's GET,
    one LIST of revocations and one LIST of history records newer than the ref (none), at
    H = 1,000 as at H = 3; a new record, a new revocation or other trusted keys check again."""
    from benchmarks.counting import CountingStore
    from buildctl.artifact_store.trust.revocation import revoke

    store, (a, b, *_), dest, trusted, p1, p2 = signed_env
    m = get_manifest(store, a)
    _long_history(store, a, m, p1, 1000)
    counting = CountingStore(store)
    first = pull(counting, resolve_channel(counting, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    assert first.installed and first.record.seq == 1000
    for _ in range(2):
        counting.reset()
        again = pull(counting, resolve_channel(counting, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
        assert not again.installed and counting.total() == 3, counting.counts
        assert counting.counts == {"get_ref": 1, "list": 2}
    # A replayed or frozen ref is still refused: a signed record newer than it is found.
    ref = channel_key(P, "prod", m.compat_key)
    frozen = store.get_ref(ref)[0]
    newer = resign(store, first.record, auth=Authority(signer=p1))
    assert newer.seq == 1001 and store.cas(ref, frozen, store.get_ref(ref)[1])  # the ref frozen back at #1000
    with pytest.raises(StaleRecordError, match="1001"):
        pull(counting, resolve_channel(counting, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    assert store.cas(ref, newer.to_bytes(), store.get_ref(ref)[1])
    # Other trusted keys check the signatures again: p1 is not among them, refused.
    other = TrustedKeys({"builder": trusted.by_role["builder"], "promoter": {p2.key_id: p2.private.public_key()}})
    with pytest.raises(SignatureError):
        pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=other))
    assert pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted)).record.seq == 1001  # verified and kept
    # A revocation written since checks them again too: p1 revoked from before #1001, refused.
    revoke(store, p1.key_id, "leaked", auth=Authority(signer=p2, trusted=trusted), revoked_at=first.record.when)
    with pytest.raises(SignatureError, match="revoked"):
        pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))


def counting_gets(store) -> list[str]:
    """The keys ``store.get_bytes`` reads from now on (appended as they are read)."""
    reads: list[str] = []
    real = store.get_bytes

    def get(key: str) -> bytes:
        reads.append(key)
        return real(key)

    store.get_bytes = get
    return reads


def test_history_compaction_keeps_decisions_and_the_replay_protection(signed_env, cli):
    """#32's retention: gc compacts re-sign records behind each ref's newest --keep-history records.
    A replay of a compacted record is still refused by a fresh node (the newest signed records are
    kept), and on a 2-of-n channel a one-signature rollback to an artifact the quorum approved
    behind the compacted records is still accepted (promote records are never compacted)."""
    from buildctl.artifact_store.channels import history, read_channel

    store, (a, b, c, _), dest, trusted, p1, p2 = signed_env
    trusted2 = TrustedKeys(trusted.by_role, thresholds={"prod": 2})
    one, two = Authority(signer=p1, trusted=trusted2), Authority(signer=p2, trusted=trusted2)
    m = get_manifest(store, a)
    key = m.compat_key

    def resigns(n: int) -> None:
        for _ in range(n):
            resign(store, read_channel(store, P, "prod", key)[0], auth=one)

    set_channel(store, a, m, "prod", auth=one)
    set_channel(store, a, m, "prod", auth=two)  # #1: the quorum approves a
    resigns(6)  # #2-#7
    set_channel(store, b, m, "prod", auth=one)
    set_channel(store, b, m, "prod", auth=two)  # #8: and b
    resigns(6)  # #9-#14
    replay = store.get_bytes(history_key(P, "prod", key, 3))
    reads = counting_gets(store)
    gc(store, GcPolicy(keep=100, keep_history=2, grace_s=0, delete_window_s=0, compact_history=False), dry_run=True)
    without = list(reads)
    reads.clear()
    plan = gc(store, GcPolicy(keep=100, keep_history=2, grace_s=0, delete_window_s=0), dry_run=True)
    # it says how many records a real run would examine (#1-#12), from LISTs: it reads no record
    # more than a dry run without compaction does
    assert reads == without and plan.history_examined == 12 and plan.to_json()["history_examined"] == 12
    assert plan.compacted_history == [] and len(history(store, P, "prod", key)) == 14  # a dry run removes nothing
    code, out, err = cli("--store", store.uri, "gc", "--keep", "100", "--keep-history", "2", "--grace", "0s", "--dry-run")
    assert code == 0 and "would examine 12 channel history record(s)" in out, (out, err)
    reads.clear()
    done = gc(store, GcPolicy(keep=100, keep_history=2, grace_s=0, delete_window_s=0))
    assert done.compacted_history == [history_key(P, "prod", key, s) for s in (*range(2, 8), *range(9, 13))]
    assert done.history_examined == 12
    assert not done.not_removed
    assert [(r.seq, r.action) for r in history(store, P, "prod", key)] == [
        (1, "promote"), (8, "promote"), (13, "resign"), (14, "resign")]
    resigns(3)  # #15-#17: the next gc reads only the records past its mark (#13-#15), not #1 or #8 again
    reads.clear()
    again = gc(store, GcPolicy(keep=100, keep_history=2, grace_s=0, delete_window_s=0))
    assert again.compacted_history == [history_key(P, "prod", key, s) for s in (13, 14, 15)]
    assert again.history_examined == 3
    assert sorted(k for k in reads if k.startswith("history/")) == [history_key(P, "prod", key, s) for s in (13, 14, 15, 16, 17)]
    assert len(list(store.list("index/history-compacted/"))) == 1  # one mark per ref: the older one is removed

    # the replayed (compacted) #3 in the ref: a fresh node refuses it, the signed #17 is its witness
    (store.root / channel_key(P, "prod", key)).write_bytes(replay)
    with pytest.raises(StaleRecordError, match="#3 is stale: the channel's signed history says #17"):
        check_trust(store, read_channel(store, P, "prod", key)[0], trusted2)
    (store.root / channel_key(P, "prod", key)).write_bytes(store.get_bytes(history_key(P, "prod", key, 17)))
    # a one-signature rollback to a, approved at #1 behind thirteen compacted records, still counts
    back = set_channel(store, a, m, "prod", auth=one, move=ChannelMove(action="rollback"))
    check_trust(store, back, trusted2)
    to_c = set_channel(store, c, m, "prod", auth=one, move=ChannelMove(action="rollback"))  # c was never approved
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, to_c, trusted2)
    code, out, err = cli("--store", store.uri, "gc", "--keep", "100", "--keep-history", "0", "--grace", "0s",
                         "--no-compact-history", "--dry-run")
    assert code == 0 and "compact" not in out, err


def test_a_newer_history_record_by_a_revoked_key_proves_nothing_on_any_path(signed_env):
    """A stolen, revoked promoter key can write a history record newer than the ref, but its
    signature does not count: the ref is not stale, whether the node checks it for the first time
    or polls it unchanged (the store's revocations apply on both paths). And an unchanged poll
    with a revocation in the store still lists twice and reads no revocation record."""
    from benchmarks.counting import CountingStore
    from buildctl.artifact_store.trust.revocation import revoke

    store, (a, *_), _, trusted, p1, p2 = signed_env
    m = get_manifest(store, a)
    rec = set_channel(store, a, m, "prod", auth=Authority(signer=p2))
    revoke(store, p1.key_id, "stolen", auth=Authority(signer=p2, trusted=trusted))
    known = check_trust(store, rec, trusted)
    counting = CountingStore(store)
    assert check_trust(counting, rec, trusted, known=known) == known
    assert counting.counts == {"list": 2}, counting.counts  # revocations and newer history; the revocation is not read
    ref = channel_key(P, "prod", m.compat_key)
    frozen = store.get_ref(ref)[0]
    forged = resign(store, rec, auth=Authority(signer=p1))  # signed after p1's revocation
    assert forged.seq == 2 and store.cas(ref, frozen, store.get_ref(ref)[1])  # the ref back at #1
    assert check_trust(store, rec, trusted) == known  # first check: #2 proves nothing
    assert check_trust(store, rec, trusted, known=known) == known  # an unchanged poll: the same
    assert store.cas(ref, forged.to_bytes(), store.get_ref(ref)[1])
    fresh = resign(store, forged, auth=Authority(signer=p2))  # a record by a good key does count
    assert fresh.seq == 3 and store.cas(ref, frozen, store.get_ref(ref)[1])
    for k in (None, known):
        with pytest.raises(StaleRecordError, match=str(fresh.seq)):
            check_trust(store, rec, trusted, known=k)


def test_a_verified_ref_is_frozen(signed_env):
    from pydantic import ValidationError

    store, (a, *_), _, trusted, p1, _ = signed_env
    proof = check_trust(store, set_channel(store, a, get_manifest(store, a), "prod", auth=Authority(signer=p1)), trusted)
    with pytest.raises(ValidationError):
        proof.artifact_id = "xxh3-128:" + "0" * 32


def test_a_trust_proof_that_cannot_be_kept_costs_nothing_but_the_next_full_check(signed_env, monkeypatch):
    """Writing the verified-ref proof fails (a full disk, a read-only state file): the pull has
    installed and verified, so it succeeds; the next pull checks trust in full again."""
    import buildctl.artifact_store.node.pull as pull_module
    from buildctl.artifact_store.node.install_dir import verified_refs

    store, (a, *_), dest, trusted, p1, _ = signed_env
    m = get_manifest(store, a)
    set_channel(store, a, m, "prod", auth=Authority(signer=p1))

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pull_module, "record_verified", full)
    r = pull(store, resolve_channel(store, P, 'prod', [m.compat_key]), dest, auth=Authority(trusted=trusted))
    assert r.installed and current_artifact(dest) == a and verified_refs(dest) == {}
