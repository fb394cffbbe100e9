"""Channel moves (buildctl.artifact_store.channels) called directly on a local store: compare-and-swap
with retries, expiry, k-of-n pending promotions, idempotence, rollout steps, rollback and
re-signing. Fast; `make mutants` runs these first for the module."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest

import buildctl.artifact_store.trust.attestations
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.channels import (
    CasRetry,
    ChannelMove,
    ChannelRecord,
    checked_history,
    move_channel,
    pending_promotion,
    read_channel,
    resign,
    set_channel,
)
from buildctl.core.times import parse_utc
from buildctl.artifact_store.promotion import rollback
from buildctl.steps.rollouts import StepBasis, rollout_step
from buildctl.artifact_store.errors import (
    ArtifactNotFoundError,
    CasConflictError,
    ChannelNotFoundError,
    HistoryConflictError,
    RolloutInProgressError,
    RolloutStateError,
    StoreArgumentError,
    CorruptObjectError,
)
from buildctl.artifact_store.layout import channel_key, history_key, pending_key
from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves
from buildctl.artifact_store.trust.signing import SigningKey, TrustedKeys
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.channels import history

from ..support.helpers import forged_history_record, make_signer, make_tree, write_attestation, staged

P = "tiny-llama-cpu"



def promoters(*keys: SigningKey, prod: int = 2) -> TrustedKeys:
    return TrustedKeys({"promoter": {k.key_id: k.private.public_key() for k in keys}}, thresholds={"prod": prod})


@pytest.fixture
def env(tmp_path, draft):
    store = open_store(f"file://{tmp_path / 'store'}")
    ids = []
    for i in range(3):
        aid = publish_tree(store, make_tree(tmp_path / f"t{i}", {"config.json": f"{i}".encode()}), draft).artifact_id
        write_attestation(store, aid, draft.compat_key, "pass")
        ids.append(aid)
    return store, ids, get_manifest(store, ids[0]), draft.compat_key


def fields(aid: str) -> dict:
    return {"artifact_id": aid}


def test_moves_number_records_and_name_the_previous_artifact(env):
    store, (a, b, _), m, compat = env
    r1 = set_channel(store, a, m, "prod", auth=Authority(who="ci"))
    r2 = set_channel(store, b, m, "prod", auth=Authority(who="ci"))
    assert (r1.seq, r1.previous, r2.seq, r2.previous) == (1, None, 2, a)
    assert [r.seq for r in history(store, P, "prod", compat)] == [1, 2]
    assert read_channel(store, P, "prod", compat)[0] == r2
    assert set_channel(store, b, m, "prod", auth=Authority(who="ci")) == r2  # the same promotion again: no new record


def test_a_record_names_the_verify_window_only_with_the_verify_it_relied_on(env):
    """The authority's verify window goes into a record with the deep verify the move relied on,
    and only then (a move that relied on none names no window)."""
    store, (a, b, _), m, compat = env
    auth = Authority(who="ci", verify_window_s=60)
    plain = set_channel(store, a, m, "prod", auth=auth)
    assert (plain.verified_at, plain.verify_window_s) == (None, None)
    checked = set_channel(store, b, m, "prod", auth=auth, move=ChannelMove(verified_at="2026-01-01T00:00:00.000000Z"))
    assert (checked.verified_at, checked.verify_window_s) == ("2026-01-01T00:00:00.000000Z", 60)


@pytest.mark.parametrize("bad", ["Prod", "-x", "x-", "a_b", "", "a" * 64])
def test_bad_channel_names_are_refused(env, bad):
    store, (a, *_), m, _ = env
    with pytest.raises(StoreArgumentError, match="bad channel name"):
        set_channel(store, a, m, bad)


def test_a_channel_name_of_63_characters_is_accepted(env):
    store, (a, *_), m, _ = env
    assert set_channel(store, a, m, "a" * 63).seq == 1


class Contended:
    """A store whose first ``losses`` compare-and-swaps lose to another writer."""

    def __init__(self, store, losses: int) -> None:
        self._store, self.losses = store, losses

    def __getattr__(self, name):
        return getattr(self._store, name)

    def cas(self, key, data, expected):
        if self.losses > 0:
            self.losses -= 1
            return False
        return self._store.cas(key, data, expected)


def test_lost_swaps_are_retried_with_growing_jittered_waits(env, monkeypatch):
    import buildctl.artifact_store.channels as channels_mod

    store, (a, *_), m, compat = env
    ranges: list[tuple[float, float]] = []

    def uniform(lo, hi):
        ranges.append((lo, hi))
        return hi

    monkeypatch.setattr(channels_mod.random, "uniform", uniform)
    waits: list[float] = []
    rec = move_channel(Contended(store, 8), P, "prod", compat, lambda cur: fields(a),
                       retry=CasRetry(sleep=waits.append))
    assert rec.seq == 1 and len(waits) == 8
    expected = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0]  # full jitter up to 10 ms x 2^attempt, capped at 1 s
    assert ranges == [(0, w) for w in expected] and waits == expected
    with pytest.raises(CasConflictError) as exc:
        move_channel(Contended(store, 100), P, "prod", compat, lambda cur: fields(a),
                     retry=CasRetry(sleep=waits.append))
    assert exc.value.attempts == 30  # the default
    with pytest.raises(CasConflictError) as exc:
        set_channel(Contended(store, 100), a, m, "staging", retry=CasRetry(sleep=waits.append))
    assert exc.value.attempts == 30


def test_a_move_that_makes_nothing(env):
    store, (a, *_), _, compat = env
    with pytest.raises(ChannelNotFoundError):
        move_channel(store, P, "prod", compat, lambda cur: None)
    first = move_channel(store, P, "prod", compat, lambda cur: fields(a))
    assert move_channel(store, P, "prod", compat, lambda cur: None) == first


def test_signed_records_expire_ttl_after_they_are_written(env):
    store, (a, b, _), m, compat = env
    k = make_signer()
    rec = set_channel(store, a, m, "prod", auth=Authority(signer=k, ttl_s=3600))
    assert parse_utc(rec.expires) - parse_utc(rec.when) == timedelta(hours=1)
    assert not rec.expired() and rec.expired(parse_utc(rec.expires)) and not rec.expired(
        parse_utc(rec.expires) - timedelta(microseconds=1))
    assert set_channel(store, b, m, "prod", auth=Authority(ttl_s=3600)).expires is None  # unsigned: no expiry


def test_two_of_n_waits_pending_then_moves_with_the_second_signature(env):
    store, (a, b, _), m, compat = env
    k1, k2, k3 = make_signer(), make_signer(), make_signer()
    trusted = promoters(k1, k2, k3)
    set_channel(store, a, m, "prod", auth=Authority(signer=k1, trusted=trusted),
                move=ChannelMove(action="rollback"))  # a first record, 1 signature
    with pytest.raises(StoreArgumentError, match="needs 2 promoter signatures"):
        set_channel(store, b, m, "prod", auth=Authority(trusted=trusted))
    pend = set_channel(store, b, m, "prod", auth=Authority(signer=k1, trusted=trusted))
    assert pend.signers(trusted) == {k1.key_id} and pending_promotion(store, P, "prod", compat) == pend
    assert read_channel(store, P, "prod", compat)[0].artifact_id == a  # not moved yet
    assert set_channel(store, b, m, "prod", auth=Authority(signer=k1, trusted=trusted)) == pend  # the same key twice counts once
    done = set_channel(store, b, m, "prod", auth=Authority(signer=k2, trusted=trusted))
    assert done.signers(trusted) == {k1.key_id, k2.key_id} and done.seq == 2
    assert read_channel(store, P, "prod", compat)[0] == done
    assert store.get_ref(pending_key(P, "prod", compat)) is None
    assert store.get_bytes(history_key(P, "prod", compat, 2)) == done.to_bytes()


def test_a_different_proposal_replaces_the_pending_one(env):
    store, (a, b, c), m, compat = env
    k1, k2 = make_signer(), make_signer()
    trusted = promoters(k1, k2)
    set_channel(store, a, m, "prod", auth=Authority(signer=k1, trusted=trusted), move=ChannelMove(action="rollback"))
    set_channel(store, b, m, "prod", auth=Authority(signer=k1, trusted=trusted))
    other = set_channel(store, c, m, "prod", auth=Authority(signer=k2, trusted=trusted))
    assert other.artifact_id == c and other.signers(trusted) == {k2.key_id}
    assert pending_promotion(store, P, "prod", compat).artifact_id == c


def test_a_staging_promotion_needs_one_signature(env):
    store, (a, *_), m, compat = env
    k1 = make_signer()
    rec = set_channel(store, a, m, "staging", auth=Authority(signer=k1, trusted=promoters(k1, make_signer())))
    assert read_channel(store, P, "staging", compat)[0] == rec


def start_rollout(env, waves="1,50,100", failures=None):
    store, (a, b, _), m, compat = env
    set_channel(store, a, m, "prod")
    plan = RolloutPlan(waves=parse_waves(waves, failures), bake_s=60)
    return set_channel(store, b, m, "prod", move=ChannelMove(rollout=plan))


def test_a_rollout_needs_a_base_and_a_new_artifact(env):
    store, (a, *_), m, _ = env
    plan = RolloutPlan(waves=parse_waves("10,100", None), bake_s=0)
    with pytest.raises(StoreArgumentError, match="no artifact yet"):
        set_channel(store, a, m, "prod", move=ChannelMove(rollout=plan))
    set_channel(store, a, m, "prod")
    with pytest.raises(StoreArgumentError, match="nothing to roll out"):
        set_channel(store, a, m, "prod", move=ChannelMove(rollout=plan))


def test_rollout_steps_advance_then_complete(env):
    store, (a, b, c), m, compat = env
    rec = start_rollout(env)
    assert (rec.rollout.base, rec.rollout.target, rec.rollout.wave, rec.rollout.state) == (a, b, 0, "active")
    with pytest.raises(RolloutInProgressError):
        set_channel(store, c, m, "prod")  # a live rollout is not replaced by a promotion
    with pytest.raises(RolloutStateError, match="wave 1 of 3"):
        rollout_step(store, P, "prod", compat, "complete")
    assert rollout_step(store, P, "prod", compat, "advance").rollout.wave == 1
    last = rollout_step(store, P, "prod", compat, "advance")
    assert last.rollout.wave == 2 and last.action == "advance" and last.artifact_id == b
    assert last.forced is False  # a rollout step overrides no gate
    with pytest.raises(RolloutStateError, match="last wave"):
        rollout_step(store, P, "prod", compat, "advance")
    done = rollout_step(store, P, "prod", compat, "complete")
    assert done.rollout.state == "completed" and done.artifact_id == b and done.previous == a
    with pytest.raises(RolloutStateError, match="no rollout in progress \\(the last one is completed\\)"):
        rollout_step(store, P, "prod", compat, "advance")
    assert set_channel(store, c, m, "prod").artifact_id == c  # a finished rollout no longer blocks


def test_pause_resume_and_halt_back_to_the_base(env):
    store, (a, b, _), m, compat = env
    rec = start_rollout(env)
    paused = rollout_step(store, P, "prod", compat, "pause", reason="look")
    assert paused.rollout.state == "paused" and paused.seq == rec.seq + 1
    assert rollout_step(store, P, "prod", compat, "pause") == paused  # already paused
    with pytest.raises(RolloutStateError, match="resume it first"):
        rollout_step(store, P, "prod", compat, "advance")
    resumed = rollout_step(store, P, "prod", compat, "resume")
    assert resumed.rollout.state == "active" and rollout_step(store, P, "prod", compat, "resume") == resumed
    with pytest.raises(CasConflictError) as exc:
        rollout_step(store, P, "prod", compat, "halt", basis=StepBasis(expect_seq=rec.seq))  # decided on an older record
    assert exc.value.attempts == 1  # not retried: the decision must be made again
    halted = rollout_step(store, P, "prod", compat, "halt",
                          basis=StepBasis(expect_seq=resumed.seq, failed_nodes=("n1",)))
    assert (halted.artifact_id, halted.previous, halted.action) == (a, b, "rollback")
    assert halted.rollout.state == "halted" and halted.rollout.failed_nodes == ("n1",)
    assert halted.reason == "rollout halted"


def test_abort_and_a_rollback_end_a_rollout(env):
    store, (a, b, _), m, compat = env
    start_rollout(env)
    aborted = rollout_step(store, P, "prod", compat, "abort")
    assert aborted.rollout.state == "aborted" and aborted.artifact_id == a
    rec = set_channel(store, b, m, "prod",
                      move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("10,100", None), bake_s=0)))
    back = rollback(store, P, "prod", to=a, reason="bad canary")
    assert back.rollout.state == "aborted" and back.artifact_id == a and back.seq == rec.seq + 1


def test_rollout_steps_on_a_missing_channel_or_unknown_step(env):
    store, _, _, compat = env
    with pytest.raises(StoreArgumentError, match="unknown rollout step"):
        rollout_step(store, P, "prod", compat, "skip")
    with pytest.raises(ChannelNotFoundError):
        rollout_step(store, P, "prod", compat, "advance")


def test_rollback_to_the_previous_artifact_or_a_named_one(env):
    store, (a, b, c), m, compat = env
    for x in (a, b, c):
        set_channel(store, x, m, "prod")
    back = rollback(store, P, "prod")
    assert (back.artifact_id, back.action, back.reason, back.seq) == (b, "rollback", "rollback", 4)
    assert rollback(store, P, "prod", to=c, compat_key=compat).artifact_id == c
    with pytest.raises(ChannelNotFoundError):
        rollback(store, P, "staging")
    with pytest.raises(ChannelNotFoundError):
        rollback(store, P, "prod", compat_key="other-key")
    set_channel(store, a, m, "staging")
    with pytest.raises(ArtifactNotFoundError, match="no earlier artifact"):
        rollback(store, P, "staging")


def test_resign_rewrites_the_current_record_only(env):
    store, (a, b, _), m, compat = env
    k = make_signer()
    rec = set_channel(store, a, m, "prod", auth=Authority(signer=k, ttl_s=60), move=ChannelMove(reason="first"))
    again = resign(store, rec, auth=Authority(who="timer", signer=k, ttl_s=7200))
    assert (again.seq, again.artifact_id, again.action, again.previous) == (2, a, "resign", rec.previous)
    assert again.reason == "re-signed #1 before it expires" and parse_utc(again.expires) > parse_utc(rec.expires)
    assert resign(store, rec, auth=Authority(who="timer", signer=k, ttl_s=7200)) == again  # #1 is no longer current: left alone


def test_history_includes_a_record_whose_history_write_was_lost(env):
    store, (a, b, _), m, compat = env
    set_channel(store, a, m, "prod")
    r2 = set_channel(store, b, m, "prod")
    store.delete(history_key(P, "prod", compat, 2))
    assert [r.seq for r in history(store, P, "prod", compat)] == [1, 2]
    assert [r.seq for r in history(store, P, "prod")] == [1, 2]
    assert store.get_bytes(history_key(P, "prod", compat, 2)) == r2.to_bytes()  # settled again


def test_history_pages_by_limit_and_since_seq_and_reads_only_what_it_returns(env, cli):
    from benchmarks.counting import CountingStore

    store, (a, b, _), m, compat = env
    for aid in (a, b, a, b, a):
        set_channel(store, aid, m, "prod")
    counting = CountingStore(store)
    assert [r.seq for r in history(counting, P, "prod", compat, limit=2)] == [4, 5]
    assert counting.by_area[("get_bytes", "history")] == 2
    counting.reset()
    assert [r.seq for r in history(counting, P, "prod", compat, since_seq=3)] == [4, 5]
    assert counting.by_area[("get_bytes", "history")] == 2
    assert [r.seq for r in history(store, P, "prod", since_seq=1, limit=3)] == [3, 4, 5]  # every compat key
    assert history(store, P, "prod", compat, since_seq=5) == []
    code, out, err = cli("--store", store.uri, "--json", "history", "--profile", P, "--channel", "prod",
                         "--limit", "1")
    assert code == 0, err
    assert [r["seq"] for r in __import__("json").loads(out)] == [5]
    code, out, err = cli("--store", store.uri, "--json", "history", "--profile", P, "--channel", "prod",
                         "--since-seq", "5")
    assert code == 0 and __import__("json").loads(out) == [], err


def test_records_leave_unset_optional_fields_out_of_their_bytes(env):
    from pydantic import ValidationError

    store, (a, *_), m, compat = env
    rec = set_channel(store, a, m, "prod")
    with pytest.raises(ValidationError):
        rec.seq = 7  # records are frozen
    body = rec.body()
    assert not {"rollout", "expires", "cosignatures"} & set(body)
    assert ChannelRecord.model_validate_json(store.get_bytes(channel_key(P, "prod", compat))) == rec


# --- the promote gate and rollback, called directly ------------------------------------------------


def test_promote_refuses_a_pass_whose_figures_fail_and_records_force_only_when_it_overrode(env):
    from buildctl.artifact_store.errors import PromotionRefusedError

    from ..support.helpers import attestation

    store, (a, b, _), m, compat = env
    good = attestation(b, compat, "pass")
    slow = good.model_copy(update={"created_at": "2099-01-01T00:00:00.000000Z", "speed": good.speed.model_copy(update={
        "levels": (good.speed.levels[0].model_copy(update={"ratios": (
            good.speed.levels[0].ratios[0].model_copy(update={"samples": (0.1,) * 6}),
            good.speed.levels[0].ratios[1])}),)})})
    buildctl.artifact_store.trust.attestations.write_attestation(store, slow)
    with pytest.raises(PromotionRefusedError) as exc:
        promote(store, staged(store, b), "prod")
    assert any("says pass but its recorded figures give fail: " in r for r in exc.value.reasons)
    plain = promote(store, staged(store, a), "prod", move=ChannelMove(forced=True, reason="nothing to override"))
    assert plain.forced is False  # the gates passed: nothing was forced
    forced = promote(store, staged(store, b), "prod", move=ChannelMove(forced=True, reason="known slow; hotfix"))
    assert forced.forced is True and forced.reason == "known slow; hotfix"


def test_promote_with_trusted_keys_refuses_an_unsigned_attestation(env):
    from buildctl.artifact_store.errors import PromotionRefusedError

    store, (a, *_), _, _ = env
    k = make_signer()
    trusted = TrustedKeys({"promoter": {k.key_id: k.private.public_key()}})
    with pytest.raises(PromotionRefusedError) as exc:
        promote(store, staged(store, a), "prod", auth=Authority(signer=k, trusted=trusted))
    assert any(r.startswith("attestation signature: unsigned") for r in exc.value.reasons)


def test_a_co_signature_that_races_another_is_merged_not_lost(env):
    """Two promoters sign the same 2-of-n move at once: the second's swap of the pending proposal
    loses to the first's, looks again, and adds its signature to the proposal that won."""
    store, (a, b, _), m, compat = env
    k1, k2 = make_signer(), make_signer()
    trusted = promoters(k1, k2)
    set_channel(store, a, m, "prod", auth=Authority(signer=k1, trusted=trusted), move=ChannelMove(action="rollback"))

    class Racing:
        def __init__(self) -> None:
            self.raced = False

        def __getattr__(self, name):
            return getattr(store, name)

        def cas(self, key, data, expected):
            if key == pending_key(P, "prod", compat) and not self.raced:
                self.raced = True
                set_channel(store, b, m, "prod", auth=Authority(signer=k1, trusted=trusted))  # k1's proposal lands first
                return False
            return store.cas(key, data, expected)

    done = set_channel(Racing(), b, m, "prod", auth=Authority(signer=k2, trusted=trusted))
    assert done.signers(trusted) == {k1.key_id, k2.key_id}
    assert read_channel(store, P, "prod", compat)[0] == done


def test_rollback_refuses_another_profiles_artifact_and_an_ambiguous_channel(env, tmp_path, draft):
    store, (a, b, _), m, compat = env
    set_channel(store, a, m, "prod")
    set_channel(store, b, m, "prod")
    other = dataclasses.replace(draft, profile_name="other-profile")
    foreign = publish_tree(store, make_tree(tmp_path / "f", {"config.json": b"foreign"}), other).artifact_id
    with pytest.raises(StoreArgumentError, match="is for other-profile/"):
        rollback(store, P, "prod", to=foreign)
    elsewhere = get_manifest(store, a).model_copy(update={"compat_key": "aoti-elsewhere"})
    set_channel(store, a, elsewhere, "prod")  # a second compat key on the same channel
    with pytest.raises(StoreArgumentError, match="refs for 2 compat keys; pass --compat-key"):
        rollback(store, P, "prod")
    assert rollback(store, P, "prod", compat_key=compat).artifact_id == a


def test_channel_lookups_defaults_and_record_rules(env):
    from pydantic import ValidationError

    from buildctl.artifact_store.channels import channels_pointing_at, history

    store, (a, b, c), m, compat = env
    rec = set_channel(store, a, m, "prod")
    assert rec.forced is False and rec.action == "promote"  # set_channel's defaults
    set_channel(store, b, m, "staging")
    assert [(r.channel, r.artifact_id) for r in channels_pointing_at(store, a)] == [("prod", a)]
    assert channels_pointing_at(store, c) == []
    assert history(store, P, "prod", "no-such-key") == []
    with pytest.raises(ChannelNotFoundError) as exc:
        rollback(store, P, "canary")
    assert exc.value.compat_keys == ["<none>"]
    with pytest.raises(ValidationError):
        ChannelRecord.model_validate(rec.model_dump() | {"seq": 0})  # sequences start at 1
    with pytest.raises(StoreArgumentError, match="--force needs --reason"):
        promote(store, staged(store, b), "prod", move=ChannelMove(forced=True))


def test_promote_retries_30_times_by_default(env, monkeypatch):
    import buildctl.artifact_store.channels as channels_mod

    monkeypatch.setattr(channels_mod.random, "uniform", lambda lo, hi: 0.0)  # no waiting between attempts
    store, (a, *_), _, _ = env
    with pytest.raises(CasConflictError) as exc:
        promote(Contended(store, 1000), staged(store, a), "prod")
    assert exc.value.attempts == 30


def test_history_on_a_read_only_store_still_reports_the_unsettled_record(env):
    store, (a, b, _), m, compat = env
    set_channel(store, a, m, "prod")
    r2 = set_channel(store, b, m, "prod")
    store.delete(history_key(P, "prod", compat, 2))

    class ReadOnly:
        def __getattr__(self, name):
            return getattr(store, name)

        def put_bytes(self, key, data):
            from buildctl.artifact_store.errors import StoreUnavailableError

            raise StoreUnavailableError(store.uri, "read-only credentials")

    from buildctl.artifact_store.channels import history

    assert [r.seq for r in history(ReadOnly(), P, "prod", compat)] == [1, 2]
    assert store.stat(history_key(P, "prod", compat, 2)) is None and r2.seq == 2


def test_a_malformed_channel_ref_is_a_corrupt_object(env):
    from buildctl.artifact_store.errors import CorruptObjectError

    store, _, _, compat = env
    store.cas(channel_key(P, "prod", compat), b'{"seq": 0}', None)
    with pytest.raises(CorruptObjectError, match="malformed channel record: "):
        read_channel(store, P, "prod", compat)


# --- #48 item 4: history that readers verify and writers confirm ---------------------------------

@pytest.fixture
def two_keys(store, tmp_path, draft):
    """Three artifacts of key A and one of key B in one store (local or S3)."""
    a_ids, b_id = [], None
    for i in range(3):
        aid = publish_tree(store, make_tree(tmp_path / f"a{i}", {"config.json": f"a{i}".encode()}), draft).artifact_id
        write_attestation(store, aid, draft.compat_key, "pass")
        a_ids.append(aid)
    other = dataclasses.replace(draft, compat_key="aoti-" + "b" * 32)
    b_id = publish_tree(store, make_tree(tmp_path / "b", {"config.json": b"b"}), other).artifact_id
    write_attestation(store, b_id, other.compat_key, "pass")
    return store, a_ids, b_id, draft.compat_key


def test_a_promote_whose_history_slot_was_squatted_fails_before_moving_the_ref(two_keys, cli):
    store, (a0, a1, _), b, compat = two_keys
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    store.put_bytes(history_key(P, "prod", compat, 2), forged_history_record(r1, 2, b, a0))
    with pytest.raises(HistoryConflictError) as err:
        set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))
    assert history_key(P, "prod", compat, 2) in str(err.value)
    assert read_channel(store, P, "prod", compat)[0] == r1  # the ref did not move
    code, out, err = cli("--store", store.uri, "--json", "scrub", "--channels-only")
    assert code == 4 and history_key(P, "prod", compat, 2) in out + err, (out, err)


def test_a_writer_whose_history_put_lost_after_its_swap_says_so(two_keys, monkeypatch):
    """The squatter writes between the writer's check and its create-only put: the ref moved, and
    the writer fails loudly naming the key instead of exiting 0."""
    from buildctl.artifact_store import channels

    store, (a0, a1, _), b, compat = two_keys
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    real_cas = store.cas

    def cas_then_squat(key, data, expected):
        ok = real_cas(key, data, expected)
        if ok and key == channel_key(P, "prod", compat):
            store.put_bytes(history_key(P, "prod", compat, 2), forged_history_record(r1, 2, b, a0))
        return ok

    monkeypatch.setattr(store, "cas", cas_then_squat)
    with pytest.raises(HistoryConflictError, match="moved"):
        set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))


def test_rollback_skips_a_forged_record_and_history_marks_it(two_keys, cli):
    """A store written before the writers checked: the real #2 was lost to a squatter's record of
    key B. Rollback picks the last signed, linked record of key A; `history` marks the forged one."""
    store, (a0, a1, a2), b, compat = two_keys
    k = make_signer()
    trusted = TrustedKeys({"promoter": {k.key_id: k.private.public_key()}})
    auth = Authority(who="ci", signer=k, trusted=trusted)
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=auth)
    store.put_bytes(history_key(P, "prod", compat, 2), forged_history_record(r1, 2, b, a0))
    ref = ChannelRecord(**{**r1.model_dump(), "seq": 2, "artifact_id": a1, "previous": a0, "signature": None})
    ref = ref.model_copy(update={"signature": k.sign(ref.signed_bytes())})
    assert store.cas(channel_key(P, "prod", compat), ref.to_bytes(), store.get_ref(channel_key(P, "prod", compat))[1])
    set_channel(store, a2, get_manifest(store, a2), "prod", auth=auth)  # #3 (its #2 is the ref's record)
    rec = rollback(store, P, "prod", auth=auth)
    assert rec.artifact_id == a1 and rec.compat_key == compat  # not B
    shown = [r for r in checked_history(store, P, "prod", compat, trusted)]
    bad = [e for e in shown if e.problem]
    assert [e.key for e in bad] == [history_key(P, "prod", compat, 2)] and "signed" in bad[0].problem
    code, out, err = cli("--store", store.uri, "--json", "history", "--profile", P, "--channel", "prod")
    rows = json.loads(out)
    assert any(r.get("problem") and r["artifact_id"] == b for r in rows), rows


def test_rollback_never_picks_an_artifact_of_another_compat_key_from_history(two_keys):
    """Without trusted keys a forged record cannot be told by its signature: its compat key and
    its link still give it away."""
    store, (a0, a1, _), b, compat = two_keys
    set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    r2 = set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))
    # a squatter's record ahead of the ref, naming B
    store.put_bytes(history_key(P, "prod", compat, 3), forged_history_record(r2, 3, b, a1))
    with pytest.raises(StoreArgumentError):
        rollback(store, P, "prod", auth=Authority(who="ci"), to=b)
    # a rollback is never blocked by a squatter: it moves, to A's previous, and says its record is not there
    with pytest.raises(HistoryConflictError, match="the ref moved"):
        rollback(store, P, "prod", auth=Authority(who="ci"), to=None)
    assert read_channel(store, P, "prod", compat)[0].artifact_id == a0
    shown = checked_history(store, P, "prod", compat)
    assert [e.record.artifact_id for e in shown if e.problem is None] == [a0, a1, a0]  # the ref's own #3


# --- readers of malformed, misplaced and unlinked records (each alone; `make mutants` sees them) ---


def test_a_record_binds_only_well_formed_manifest_hashes():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="manifest_blake3 maps xxh3-128 artifact ids"):
        ChannelRecord.model_validate({"profile": P, "channel": "prod", "compat_key": "aoti-" + "a" * 32, "seq": 1,
                                      "artifact_id": "xxh3-128:" + "1" * 32, "who": "ci", "when": "2026-12-05T00:00:00Z",
                                      "manifest_blake3": {"xxh3-128:" + "1" * 32: "md5:00"}})


def test_history_raises_on_a_malformed_record_or_ref_or_lists_it_as_skipped(two_keys):
    from buildctl.artifact_store.channels import all_channel_records, history

    store, (a0, a1, a2), _b, compat = two_keys
    for a in (a0, a1, a2):
        set_channel(store, a, get_manifest(store, a), "prod", auth=Authority(who="ci"))
    bad = history_key(P, "prod", compat, 1)
    store.delete(bad)
    store.put_bytes(bad, b"{not json")
    with pytest.raises(CorruptObjectError):
        history(store, P, "prod", compat)
    skipped: list = []
    assert [r.seq for r in history(store, P, "prod", compat, skipped)] == [2, 3] and [k for k, _ in skipped] == [bad]
    skipped = []  # the records after the malformed one are read too
    assert [e.record.seq for e in checked_history(store, P, "prod", compat, skipped=skipped)] == [2, 3]
    assert [k for k, _ in skipped] == [bad]
    with pytest.raises(CorruptObjectError):
        checked_history(store, P, "prod", compat)
    ref = channel_key(P, "prod", compat)
    assert store.cas(ref, b"[]", store.get_ref(ref)[1])  # a malformed ref
    skipped = []
    assert [r.seq for r in history(store, P, "prod", None, skipped)] == [2, 3]
    assert ref in [k for k, _ in skipped]
    with pytest.raises(CorruptObjectError):
        all_channel_records(store)
    skipped = []
    assert all_channel_records(store, skipped) == [] and [k for k, _ in skipped] == [ref]


def test_a_misplaced_or_unlinked_record_is_marked_and_record_problems_agree(two_keys):
    from buildctl.artifact_store.channels import history, record_problems

    store, (a0, a1, a2), b, compat = two_keys
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))
    set_channel(store, a2, get_manifest(store, a2), "prod", auth=Authority(who="ci"))
    # #1 replaced by a record of another artifact: #2's previous no longer names it
    k1 = history_key(P, "prod", compat, 1)
    store.delete(k1)
    store.put_bytes(k1, forged_history_record(r1, 1, b, None))
    checked = {e.record.seq: e.problem for e in checked_history(store, P, "prod", compat)}
    assert checked[1] is not None and checked[1].startswith("broken link: #2 names")
    assert checked[2] is None and checked[3] is None
    problems = record_problems(store, history(store, P, "prod", compat))
    assert list(problems) == [(compat, 1)] and problems[(compat, 1)].startswith("broken link")
    # a record in another's slot: it claims seq 5
    k2 = history_key(P, "prod", compat, 2)
    two = store.get_bytes(k2)
    store.delete(k2)
    store.put_bytes(k2, forged_history_record(ChannelRecord.model_validate_json(two), 5, a1, a0))
    checked = {e.key: e.problem for e in checked_history(store, P, "prod", compat)}
    assert checked[k2].startswith("misplaced: it claims")


def test_record_problems_check_links_alone_where_the_ref_is_malformed(two_keys):
    from buildctl.artifact_store.channels import history, record_problems

    store, (a0, a1, _), b, compat = two_keys
    set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    r2 = set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))
    records = history(store, P, "prod", compat)
    ref = channel_key(P, "prod", compat)
    assert store.cas(ref, b"[]", store.get_ref(ref)[1])
    assert record_problems(store, records) == {}  # no ref to be ahead of; the links hold
    k = make_signer()  # with trusted keys too: no readable ref, so no signed channel to hold them to
    assert record_problems(store, records, TrustedKeys({"promoter": {k.key_id: k.private.public_key()}})) == {}
    ahead = r2.model_copy(update={"seq": 3, "previous": b})
    got = record_problems(store, [*records, ahead])  # still no ref: not "ahead", but the links are judged
    assert list(got) == [(compat, 2)] and got[(compat, 2)].startswith("broken link: #3 names")


def test_record_problems_mark_an_unsigned_record_on_a_signed_channel(two_keys):
    from buildctl.artifact_store.channels import history, record_problems

    store, (a0, a1, _), b, compat = two_keys
    k = make_signer()
    trusted = TrustedKeys({"promoter": {k.key_id: k.private.public_key()}})
    auth = Authority(who="ci", signer=k, trusted=trusted)
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=auth)
    set_channel(store, a1, get_manifest(store, a1), "prod", auth=auth)
    unsigned = r1.model_copy(update={"signature": None})
    problems = record_problems(store, [unsigned, *history(store, P, "prod", compat)[1:]], trusted)
    assert problems == {(compat, 1): "not signed by a trusted promoter key"}


def test_resign_needs_a_signing_key(two_keys):
    from buildctl.artifact_store.channels import resign

    store, (a0, *_), _b, _compat = two_keys
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    with pytest.raises(StoreArgumentError, match="re-signing needs a signing key"):
        resign(store, r1, auth=Authority(who="ci"))


def test_history_without_its_ref_is_all_ahead_of_ref_zero(two_keys):
    store, (a0, *_), _b, compat = two_keys
    set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    store.delete(channel_key(P, "prod", compat))  # the ref gone, its history left
    (e,) = checked_history(store, P, "prod", compat)
    assert e.problem == "ahead of the ref (#0): written before the ref reached it"


def test_a_first_promotion_whose_slot_one_was_squatted_fails_before_writing_the_ref(two_keys):
    store, (a0, a1, _), b, compat = two_keys
    r = ChannelRecord.model_validate({"profile": P, "channel": "prod", "compat_key": compat, "seq": 1, "artifact_id": b,
                                      "who": "mallory", "when": "2026-12-05T00:00:00Z"})
    store.put_bytes(history_key(P, "prod", compat, 1), r.to_bytes())
    with pytest.raises(HistoryConflictError):
        set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    assert read_channel(store, P, "prod", compat) is None


def test_history_reads_from_seq_one_and_limits_per_key(two_keys):
    from buildctl.artifact_store.channels import history

    store, (a0, a1, a2), _b, compat = two_keys
    for a in (a0, a1, a2):
        set_channel(store, a, get_manifest(store, a), "prod", auth=Authority(who="ci"))
    assert [r.seq for r in history(store, P, "prod", compat)] == [1, 2, 3]
    assert [r.seq for r in history(store, P, "prod", compat, limit=2)] == [2, 3]
    assert [r.seq for r in history(store, P, "prod", compat, limit=1)] == [3]
    assert [r.seq for r in history(store, P, "prod", compat, since_seq=1)] == [2, 3]
    store.delete(history_key(P, "prod", compat, 3))  # the newest only in the ref (its writer died before history)
    assert [r.seq for r in history(store, P, "prod", compat, limit=1)] == [3]


def test_history_reads_every_key_past_a_malformed_ref(two_keys):
    """The ref of one compat key is malformed; the other key's ref, a record ahead of its history
    (its promoter died before writing it), is still read."""
    from buildctl.artifact_store.channels import history

    store, (a0, a1, _), b, compat = two_keys
    other = "aoti-" + "b" * 32
    set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    set_channel(store, b, get_manifest(store, b), "prod", auth=Authority(who="ci"), move=ChannelMove(compat_key=other))
    set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))
    keys = sorted([compat, other])
    bad, good = keys[0], keys[1]
    ref = channel_key(P, "prod", bad)
    assert store.cas(ref, b"[]", store.get_ref(ref)[1])
    last = read_channel(store, P, "prod", good)[0]
    store.delete(history_key(P, "prod", good, last.seq))  # the good key's newest record only in its ref
    skipped: list = []
    got = [(r.compat_key, r.seq) for r in history(store, P, "prod", None, skipped)]
    assert (good, last.seq) in got and [k for k, _ in skipped] == [ref]


def test_records_ahead_of_the_ref_name_its_seq_and_the_refs_own_record_comes_first(two_keys):
    from buildctl.artifact_store.channels import history, record_problems

    store, (a0, a1, _), b, compat = two_keys
    r1 = set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    r2 = set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="ci"))
    store.put_bytes(history_key(P, "prod", compat, 3), forged_history_record(r2, 3, b, a1))
    checked = checked_history(store, P, "prod", compat)
    ahead = next(e for e in checked if e.record.seq == 3)
    assert ahead.problem == "ahead of the ref (#2): written before the ref reached it"
    got = record_problems(store, [*history(store, P, "prod", compat)])
    assert got[(compat, 3)] == "ahead of the ref (#2): written before the ref reached it"
    # a stranger in the ref's slot: the ref's own record first, the stranger after it
    k2 = history_key(P, "prod", compat, 2)
    store.delete(k2)
    store.put_bytes(k2, forged_history_record(r2, 2, b, a0))
    same = [(e.record.artifact_id, e.problem is None) for e in checked_history(store, P, "prod", compat)
            if e.record.seq == 2]
    assert same == [(a1, True), (b, False)]


def test_a_history_limit_counts_per_compat_key(two_keys):
    from buildctl.artifact_store.channels import history

    store, (a0, a1, _), b, compat = two_keys
    other = "aoti-" + "b" * 32
    for a in (a0, a1):
        set_channel(store, a, get_manifest(store, a), "prod", auth=Authority(who="ci"))
    store, (a0, a1, a2), b, compat = two_keys
    for x in (b, a2):  # two records under the other key too (set_channel takes the key it is given)
        set_channel(store, x, get_manifest(store, x), "prod", auth=Authority(who="ci"),
                    move=ChannelMove(compat_key=other))
    got = sorted((r.compat_key, r.seq) for r in history(store, P, "prod", None, limit=1))
    assert got == sorted([(compat, 2), (other, 2)])
    got = sorted((r.compat_key, r.seq) for r in history(store, P, "prod", None, limit=2))
    assert got == sorted([(compat, 1), (compat, 2), (other, 1), (other, 2)])


def test_a_promoter_that_finds_its_slot_taken_by_a_move_meanwhile_decides_again(two_keys, monkeypatch):
    """Between reading the ref and checking its next history slot, another promoter moved the ref
    and wrote that slot: this promoter reads the ref again and moves it one further."""
    store, (a0, a1, a2), _b, compat = two_keys
    set_channel(store, a0, get_manifest(store, a0), "prod", auth=Authority(who="ci"))
    real_stat = store.stat
    raced = []

    def stat(key):
        if key == history_key(P, "prod", compat, 2) and not raced:
            raced.append(None)  # the other promoter's own check of this slot passes through
            raced[0] = set_channel(store, a1, get_manifest(store, a1), "prod", auth=Authority(who="other"))
        return real_stat(key)

    monkeypatch.setattr(store, "stat", stat)
    rec = set_channel(store, a2, get_manifest(store, a2), "prod", auth=Authority(who="ci"))
    assert raced and raced[0].seq == 2 and (rec.seq, rec.artifact_id, rec.previous) == (3, a2, a1)
