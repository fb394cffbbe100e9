"""The node index (buildctl/steps/node_index.py): markers written with each node record, rebuilt from the
records, checked and repaired by scrub, and the fleet-wide commands that LIST them instead of
reading every node record. Every test runs on the local store and on SeaweedFS."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from benchmarks.counting import CountingStore
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.read import get_manifest
from buildctl.steps import fleet
from buildctl.steps import node_index
from buildctl.steps import rollouts
from buildctl.artifact_store.channels import ChannelMove, read_channel
from buildctl.artifact_store.gc import gc
from buildctl.artifact_store.fleet.inventory import EngineState, read_node
from buildctl.artifact_store.layout import NODE_INDEX, NODE_INDEX_META, NODES, PAIR_INDEX, node_key, scope_prefix, status_prefix
from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves, wave_bucket
from buildctl.steps.context import Context
from buildctl.engines.fingerprint import detect
from buildctl.engines.profile import load_profile
from buildctl.steps.healing import scrub
from buildctl.core.times import utc_now

from ..support.helpers import PROFILES, settings, staged
from .test_rollouts import PROFILE, Fleet, _fail_on_node, publish
from buildctl.artifact_store.gc import GcPolicy

N = 1100  # nodes in the request-count test: more than one S3 list page of each marker kind


def markers(store) -> set[str]:
    return {k for k in store.list(NODE_INDEX) if k != NODE_INDEX_META}


def answers(store, profiles) -> dict:
    """What the fleet-wide commands say about the store: rollout status, the reconcile plan, gc's
    dry-run decisions."""
    views = [{k: v for k, v in view.to_json().items() if k not in ("bake_left_s", "why")}  # both say the time left
             for view in rollouts.status(store, PROFILE, "prod")]
    return {"status": views,
            "plan": [(n.profile, n.compat_key, n.nodes) for n in fleet.fleet_plan(store, profiles)],
            "gc": sorted((d.artifact_id, tuple(d.protected_by)) for d in gc(store, GcPolicy(grace_s=0), dry_run=True, now=datetime(2030, 1, 1, tzinfo=timezone.utc)).decisions)}


def rollout_in_flight(store, tmp_path, draft, n=40) -> tuple[Fleet, object, list[str]]:
    """v1 on prod everywhere, v2 rolling out (25%, then 100%), two late nodes failed on it."""
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    nodes = Fleet(store, tmp_path, n)
    promote(store, staged(store, v1), "prod")
    nodes.pull_all()
    rec = promote(store, staged(store, v2), "prod",
                  move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("25,100", "0,5%"), bake_s=600)))
    nodes.pull_all()
    late = [x for x in nodes.ids if wave_bucket(PROFILE, "prod", x) >= 25]
    return nodes, rec, late


def test_a_migrated_store_answers_every_fleet_command_the_same_and_the_rebuilt_index_equals_the_incremental_one(
        store, tmp_path, draft):
    profiles = {PROFILE: load_profile(PROFILES / f"{PROFILE}.yaml")}
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft)
    rollouts.rollout_step(store, PROFILE, "prod", draft.compat_key, "advance",
                          basis=rollouts.StepBasis(expect_seq=rec.seq))
    for x in late[:2]:
        _fail_on_node(nodes, x)
    assert not node_index.index_built(store)
    before = answers(store, profiles)  # read from the records: the index is not built yet
    incremental = markers(store)  # every record write also wrote its markers
    assert any(k.startswith(f"{NODE_INDEX}status/") and k.endswith(".failed") for k in incremental)
    assert {node_index.node_of_marker(k) for k in incremental} == set(nodes.ids)

    pairs = set(store.list(PAIR_INDEX))
    assert len(pairs) == 2  # v1 and v2, written at publish
    for key in incremental | pairs:  # a store written before the index: records, no markers
        store.delete(key)
    report = node_index.rebuild(store)
    assert report.repaired and report.ready and report.nodes == 40 and report.stale == []
    assert markers(store) == incremental and set(store.list(PAIR_INDEX)) == pairs
    assert len(report.missing) == len(incremental) + len(pairs)
    assert node_index.rebuild(store, repair=False).ok

    counted = CountingStore(store)
    after = answers(counted, profiles)
    assert after == before
    assert counted.by_area[("get_ref", "inventory")] == 0 and counted.by_area[("get_bytes", "inventory")] == 0


def test_scrub_finds_a_lost_and_a_stale_marker_and_repairs_both(store, tmp_path, draft, cli):
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=12)
    node_index.rebuild(store)
    lost = f"{scope_prefix(PROFILE, 'aoti', draft.compat_key)}{nodes.ids[3]}"
    stale = f"{status_prefix(PROFILE, 'prod', rec.artifact_id)}{nodes.ids[5]}.failed"
    assert lost in markers(store) and stale not in markers(store)
    store.delete(lost)
    store.put_bytes(stale, b"")
    code, out, err = cli("--store", store.uri, "--json", "index", "check")
    assert code == 4, err
    found = json.loads(out)
    assert found["missing"] == [lost] and found["stale"] == [stale] and not found["ok"]
    assert "1 missing and 1 stale" in err and "index rebuild" in err
    report = scrub(Context.from_settings(settings(), store=store), channels_only=True)
    assert report.node_index.missing == [lost] and report.node_index.stale == [stale]
    assert lost in markers(store) and stale not in markers(store)
    code, out, err = cli("--store", store.uri, "index", "check")
    assert code == 0 and "0 missing, 0 stale" in out, err


def test_an_extra_failed_marker_does_not_halt_a_rollout_and_a_real_failure_does(store, tmp_path, draft):
    """An update interrupted between its markers and its record leaves extra markers: a rollout
    halts only on failures the nodes' own records confirm."""
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=40)
    canaries = [x for x in nodes.ids if x not in late]
    assert canaries
    for x in canaries:  # healthy on v2 by their records; a crashed update's markers say failed
        store.put_bytes(f"{status_prefix(PROFILE, 'prod', rec.artifact_id)}{x}.failed", b"")
    later = datetime.now(timezone.utc) + timedelta(seconds=601)
    v = rollouts.view(store, rec, now=later)  # two states each: read, healthy
    assert v.decision == "advance" and v.waves[0].failed == 0 and v.waves[0].healthy == len(canaries)
    store.delete(f"{status_prefix(PROFILE, 'prod', rec.artifact_id)}{canaries[0]}.healthy")  # a stale index:
    v = rollouts.view(store, rec, now=later)  # its markers say only failed; the halt is checked in its record
    assert v.decision == "advance" and v.waves[0].failed == 0
    state = read_node(store, canaries[0])[0].engine(PROFILE, "prod")  # its later smoke check fails
    fleet.record_engine_state(store, canaries[0], detect(), state.model_copy(update={"status": "failed"}))
    v = rollouts.view(store, rec, now=later)
    assert v.decision == "halt" and v.waves[0].failed_nodes == (canaries[0],)


# On S3 the 1,100 node records take 85 s of SeaweedFS on 2 cores, the longest fast test by far:
# that case runs with the slow tests; the local store keeps the request counts in `make test`.
@pytest.mark.parametrize("store_uri", ["local", pytest.param("s3", marks=pytest.mark.slow)], indirect=True)
def test_fleet_commands_list_markers_instead_of_reading_each_node(store, tmp_path, draft):
    """At 1,100 nodes (two list pages): rollout status of one ref, the tick, the reconcile plan's demand and gc's
    node protections make a handful of requests, none of them a node record's GET."""
    v1 = publish(store, tmp_path, "v1", draft)
    rec = promote(store, staged(store, v1), "prod")
    node_index.rebuild(store)
    fp, when = detect(), utc_now()

    def report(i: int) -> None:  # each node through the real write path, 8 at a time
        state = EngineState(profile=PROFILE, channel="prod", compat_key=draft.compat_key, artifact_id=v1, seq=rec.seq,
                            status="healthy" if i % 3 else "installed", current=v1, when=when)
        fleet.record_engine_state(store, f"n{i:05d}", fp, state)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(report, range(N)))
    v2 = publish(store, tmp_path, "v2", draft)
    promote(store, staged(store, v2), "prod",
            move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("10,100", "1%"), bake_s=0)))
    counted = CountingStore(store)
    (v,) = rollouts.status(counted, PROFILE, "prod", draft.compat_key)
    assert v.waves[-1].nodes == N and v.waves[-1].pending == N
    assert counted.total() <= 10, counted.counts
    counted.reset()
    profiles = {PROFILE: load_profile(PROFILES / f"{PROFILE}.yaml")}
    fleet.fleet_plan(counted, profiles)
    assert counted.by_area[("list", "inventory")] == 2  # 1,100 demand markers: two pages
    assert counted.by_area[("get_ref", "inventory")] == 0
    counted.reset()
    decisions = gc(counted, GcPolicy(grace_s=0), dry_run=True).decisions
    assert any(f"held by {N} node(s)" in why for d in decisions for why in d.protected_by)
    # 2,200 held markers: three pages on the local store; on S3 two pages, then the rest as up to 16
    # key ranges at once (listing.list_ranges), each a request even when it is empty.
    assert counted.by_area[("get_ref", "inventory")] == 0
    assert counted.by_area[("list", "inventory")] <= (4 + 16 if store.uri.startswith("s3://") else 4)
    assert len(list(store.list(NODES))) == N
    got = read_node(store, "n00000")
    assert got is not None and node_index.node_markers(got[0]) <= markers(store)


def test_a_node_that_only_pulled_the_profile_on_another_channel_is_outside_the_rollouts_scope(store, tmp_path, draft):
    """nodes_in_scope: a node serves the profile, or pulled it on this very channel. A node that
    pulled it on staging only is not one of prod's, from the records or from the index."""
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=8)
    state = read_node(store, nodes.ids[0])[0].engine(PROFILE, "prod")
    fleet.report_node(store, "staging-only", detect(), [])  # serves nothing
    fleet.record_engine_state(store, "staging-only", detect(), state.model_copy(update={"channel": "staging"}))
    node_index.rebuild(store)
    from_index = rollouts.view(store, rec)
    from_records = rollouts.view(store, rec, nodes=[r for r in [read_node(store, n)[0] for n in nodes.ids + ["staging-only"]]])
    assert from_index.waves[-1].nodes == from_records.waves[-1].nodes == 8


class _CrashAt:
    """A store that dies at the first call of ``method`` (as a killed node would)."""

    class Crash(Exception):
        pass

    def __init__(self, inner, method: str) -> None:
        self.inner, self.method = inner, method

    def __getattr__(self, name):
        if name == self.method:
            def crash(*args, **kwargs):
                raise self.Crash(name)
            return crash
        return getattr(self.inner, name)


def test_a_node_update_killed_before_or_after_its_record_leaves_extra_markers_never_missing_ones(store, tmp_path, draft):
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=12)
    node_index.rebuild(store)
    node = next(x for x in nodes.ids if x not in late)  # a canary: healthy on the rollout's target
    old = read_node(store, node)[0]
    state = old.engine(PROFILE, "prod")
    failed = state.model_copy(update={"status": "failed"})
    new_marker = f"{status_prefix(PROFILE, 'prod', state.artifact_id)}{node}.failed"
    old_marker = f"{status_prefix(PROFILE, 'prod', state.artifact_id)}{node}.{state.status}"
    assert old_marker in markers(store) and new_marker not in markers(store)
    with pytest.raises(_CrashAt.Crash):  # killed at the record's compare-and-swap: the record is the old one
        fleet.record_engine_state(_CrashAt(store, "cas"), node, detect(), failed)
    assert read_node(store, node)[0] == old
    assert {new_marker, old_marker} <= markers(store)  # the new marker is already there: an extra one
    report = node_index.rebuild(store, repair=False)
    assert report.missing == [] and report.stale == [new_marker]
    with pytest.raises(_CrashAt.Crash):  # killed after the record, before the stale marker's delete
        fleet.record_engine_state(_CrashAt(store, "delete"), node, detect(), failed)
    assert read_node(store, node)[0].engine(PROFILE, "prod").status == "failed"
    report = node_index.rebuild(store, repair=False)
    assert report.missing == [] and report.stale == [old_marker]
    assert old.engine(PROFILE, "prod").artifact_id == rec.artifact_id
    v = rollouts.view(store, rec)  # two states (healthy, failed): the node is read, and counts as the record says
    assert v.waves[0].failed_nodes == (node,) and v.decision == "halt"


class _InFlight:
    """A store whose every request takes 5 ms, counting how many are in flight at once."""

    ranged_lists = True

    def __init__(self, inner) -> None:
        import threading

        self.inner, self.now, self.most, self._lock = inner, 0, 0, threading.Lock()

    def _enter(self) -> None:
        import time

        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.005)
        with self._lock:
            self.now -= 1

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self._enter()
            return attr(*args, **kwargs)

        return call

    def list(self, prefix, start_after=None):
        self._enter()
        yield from self.inner.list(prefix, start_after=start_after)


def test_fleet_commands_overlap_their_requests_and_answer_as_one_at_a_time(tmp_path, monkeypatch):
    """The tick, the reconcile plan and gc's dry run send their independent requests at once (the
    refs, the manifests, the history records, a large prefix's ranges) and say exactly what they
    say one request at a time."""
    from benchmarks import fleet_scale
    from buildctl.artifact_store.backends import listing

    store = open_store(str(tmp_path / "store"))
    profiles, keys, ctx = fleet_scale.seed(store, tmp_path / "seed", 300)
    monkeypatch.setattr(listing, "PAGE", 20)  # 300 demand and 600 held markers: the ranged path
    now = datetime.now(timezone.utc)

    def run(s) -> dict:
        views = rollouts.tick(ctx.with_store(s), channel="prod", profile=fleet_scale.PROFILE, now=now)
        return {"tick": [{k: v for k, v in view.to_json().items() if k != "bake_left_s"} for view in views],
                "plan": [(n.profile, n.compat_key, n.nodes) for n in fleet.fleet_plan(s, profiles)],
                "demand": node_index.demand_counts(s, fleet_scale.PROFILE, "aoti"),
                "gc": sorted((d.artifact_id, tuple(d.protected_by)) for d in gc(s, GcPolicy(grace_s=0), dry_run=True, now=now).decisions)}

    monkeypatch.setattr(listing, "LIST_WORKERS", 1)
    one = _InFlight(store)
    one.ranged_lists = False
    sequential = run(one)
    assert one.most == 1
    monkeypatch.setattr(listing, "LIST_WORKERS", 16)
    for name, op in (("tick", lambda s: rollouts.tick(ctx.with_store(s), channel="prod", profile=fleet_scale.PROFILE, now=now)),
                     ("plan", lambda s: fleet.fleet_plan(s, profiles)),
                     ("gc", lambda s: gc(s, GcPolicy(grace_s=0), dry_run=True, now=now))):
        wrapped = _InFlight(store)
        op(wrapped)
        assert wrapped.most >= 4, name
    assert run(_InFlight(store)) == sequential
    assert sum(sequential["demand"].values()) == 300 and len(sequential["tick"]) == fleet_scale.KEYS


@pytest.mark.parametrize("leaf", ["garbage", "{node}.bogus", "{node}.", ".failed"])
def test_a_malformed_status_marker_is_skipped_and_reported_and_a_failed_canary_still_halts(store, tmp_path, draft,
                                                                                         cli, leaf):
    """#48 item 5: any node role can write a status marker; a malformed one is passed over and
    listed (rollout status exits 10), never fatal, and a real failure still halts the rollout."""
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=40)
    canaries = [x for x in nodes.ids if x not in late]
    bad = f"{status_prefix(PROFILE, 'prod', rec.artifact_id)}{leaf.format(node=canaries[0])}"
    store.put_bytes(bad, b"")
    state = read_node(store, canaries[1])[0].engine(PROFILE, "prod")  # a canary whose smoke check fails
    fleet.record_engine_state(store, canaries[1], detect(), state.model_copy(update={"status": "failed"}))
    code, out, err = cli("--store", store.uri, "--json", "rollout", "status", "--profile", PROFILE, "--channel", "prod")
    assert code == 10, err
    assert bad in err and json.loads(out)[0]["waves"][0]["failed_nodes"] == [canaries[1]]
    later = datetime.now(timezone.utc) + timedelta(seconds=601)
    (v,) = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod", now=later)
    assert v.decision == "halt" and v.applied is not None
    assert f"(1 malformed status marker(s) passed over, their nodes' records read: {bad})" in v.why


def test_several_malformed_markers_are_named_by_the_first(store, tmp_path, draft):
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=40)
    prefix = status_prefix(PROFILE, "prod", rec.artifact_id)
    bad = [f"{prefix}a-garbage", f"{prefix}b-garbage"]
    for k in bad:
        store.put_bytes(k, b"")
    later = datetime.now(timezone.utc) + timedelta(seconds=601)
    (v,) = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod", now=later)
    assert f"(2 malformed status marker(s) passed over, their nodes' records read: {bad[0]}, ...)" in v.why, v.why


def test_a_node_whose_markers_outlive_its_record_is_not_counted(store, tmp_path, draft):
    """A node record deleted with its markers left behind (a node taken out of the fleet by hand):
    the view reads the record, finds none and counts the node nowhere; nothing fails."""
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=40)
    canaries = [x for x in nodes.ids if x not in late]
    gone = canaries[0]
    store.delete(node_key(gone))
    bad = f"{status_prefix(PROFILE, 'prod', rec.artifact_id)}{gone}.bogus"  # its status unsure: its record is read
    store.put_bytes(bad, b"")
    v = rollouts.view(store, rec)
    assert gone not in v.waves[0].failed_nodes and v.waves[0].nodes == len(canaries) - 1, v.to_json()


@pytest.mark.parametrize("state", ["failed", "healthy"])
def test_a_rebuild_between_a_nodes_marker_writes_and_its_record_swap_loses_no_marker(store, tmp_path, draft, state):
    """#48 item 6: `index rebuild` (and so scrub) running while a node updates its record: the
    markers of the update in flight were taken for stale and deleted, and the update never wrote
    them again (gc then removed a current engine; the tick advanced past a failed node)."""
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=40)
    canary = next(x for x in nodes.ids if x not in late)
    before = read_node(store, canary)[0].engine(PROFILE, "prod")
    real_cas = store.cas
    raced = []

    def cas_after_a_rebuild(key, data, expected):
        if key.startswith(NODES) and not raced:
            raced.append(node_index.rebuild(store))  # between the marker writes and the swap
        return real_cas(key, data, expected)

    store.cas = cas_after_a_rebuild
    try:
        fleet.record_engine_state(store, canary, detect(), before.model_copy(update={"status": state}))
    finally:
        store.cas = real_cas
    assert raced
    after = read_node(store, canary)[0]
    listed = set(store.list(NODE_INDEX))
    assert node_index.node_markers(after) <= listed, node_index.node_markers(after) - listed
    assert node_index.rebuild(store, repair=False).ok
    if state == "failed":
        later = datetime.now(timezone.utc) + timedelta(seconds=601)
        v = rollouts.view(store, read_channel(store, PROFILE, "prod", draft.compat_key)[0], now=later)
        assert v.decision == "halt" and canary in v.waves[0].failed_nodes


# --- each marker rule and the rebuild's dead ends alone (`make mutants` sees them) ------------------


def test_markers_take_the_records_key_the_fingerprints_and_pulled_profiles():
    from buildctl.artifact_store.fleet.inventory import NodeRecord
    from buildctl.artifact_store.layout import pulled_scope_prefix

    fp = detect()
    old = "aoti-" + "0" * 32  # a key the record was written under, no longer the fingerprint's
    engine = EngineState(profile="other-profile", channel="staging", compat_key=fp.compat_key("aoti"),
                         artifact_id="xxh3-128:" + "1" * 32, seq=1, status="healthy", current="xxh3-128:" + "1" * 32,
                         when="2026-12-01T00:00:00Z")
    rec = NodeRecord(node_id="n1", fingerprint=fp.model_dump(mode="json"), compat_keys={"aoti": old},
                     profiles=(PROFILE,), reported_at="2026-12-01T00:00:00Z", engines=(engine,))
    got = node_index.node_markers(rec)
    assert f"{scope_prefix(PROFILE, 'aoti', old)}n1" in got  # the record's own key
    assert f"{scope_prefix(PROFILE, 'aoti', fp.compat_key('aoti'))}n1" in got  # and the fingerprint's
    assert f"{pulled_scope_prefix('other-profile', 'staging', 'aoti', fp.compat_key('aoti'))}n1" in got
    from buildctl.artifact_store.layout import demand_prefix

    assert f"{demand_prefix(PROFILE, 'aoti')}{fp.compat_key('aoti')}/n1" in got  # demand: the fingerprint's key now
    assert f"{demand_prefix(PROFILE, 'aoti')}{old}/n1" not in got
    assert node_index.node_of_marker(f"{status_prefix(PROFILE, 'prod', 'xxh3-128:' + '1' * 32)}gpu.node.7.failed") == "gpu.node.7"
    bare = NodeRecord(node_id="n2", fingerprint={}, compat_keys={"aoti": old}, profiles=(PROFILE,),
                      reported_at="2026-12-01T00:00:00Z")  # no fingerprint: the record's keys alone
    assert {k for k in node_index.node_markers(bare) if "/scope/" in k} == {f"{scope_prefix(PROFILE, 'aoti', old)}n2"}


def test_an_index_report_is_ok_only_with_nothing_missing_and_nothing_stale():
    assert node_index.IndexReport().ok
    assert not node_index.IndexReport(missing=["a"]).ok and not node_index.IndexReport(stale=["b"]).ok


def test_a_rebuild_drops_the_markers_of_a_node_whose_record_is_gone_and_keeps_pairs_whose_manifest_is_there(
        store, tmp_path, draft, monkeypatch):
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=8)
    gone = nodes.ids[0]
    store.delete(node_key(gone))
    from buildctl.artifact_store.layout import pair_key

    dead = pair_key(PROFILE, "0" * 16, "xxh3-128:" + "d" * 32)  # a publish that died before its manifest
    store.put_bytes(dead, b"")
    monkeypatch.setattr(node_index, "list_artifacts", lambda _store: [])  # every pair marker looks stale
    deleted: list[str] = []
    real_delete = store.delete
    monkeypatch.setattr(store, "delete", lambda key: deleted.append(key) or real_delete(key))
    report = node_index.rebuild(store)
    assert report.stale and all(node_index.node_of_marker(k) == gone for k in report.stale if k != dead)
    assert dead in report.stale and dead not in set(store.list(PAIR_INDEX))  # no manifest: deleted, not put back
    assert not [k for k in store.list(NODE_INDEX) if k != NODE_INDEX_META and node_index.node_of_marker(k) == gone]
    assert list(store.list(PAIR_INDEX))  # their manifests exist: confirmed not stale, kept
    assert [k for k in deleted if k.startswith(PAIR_INDEX)] == [dead]  # never deleted, even for a moment


def test_a_node_with_two_engine_states_is_unsure_and_a_refusal_is_not_one():
    assert node_index.state_of({"healthy"}) == "healthy"
    assert node_index.state_of({"healthy", "refused"}) == "healthy"
    assert node_index.state_of({"healthy", "failed"}) is None  # an interrupted update: read the record
    assert node_index.state_of({"installed", "healthy", "failed"}) is None
    assert node_index.state_of({"healthy", node_index.UNREADABLE}) is None


def test_a_malformed_status_marker_makes_only_a_node_it_can_name_unsure(store):
    aid = "xxh3-128:" + "a" * 32
    prefix = status_prefix(PROFILE, "prod", aid)
    for leaf in ("n1.bogus", ".failed", "garbage", "n3.healthy", "n4."):
        store.put_bytes(prefix + leaf, b"")
    skipped: list = []
    got = node_index.status_states(store, PROFILE, "prod", aid, skipped)
    assert got == {"n1": {node_index.UNREADABLE}, "n3": {"healthy"}, "n4": {node_index.UNREADABLE}}, got
    assert sorted(k for k, _ in skipped) == sorted(prefix + x for x in ("n1.bogus", ".failed", "garbage", "n4."))


def test_a_check_without_repair_repairs_nothing_and_says_so(store, tmp_path, draft):
    node_index.rebuild(store)
    rollout_in_flight(store, tmp_path, draft, n=4)
    lost = next(k for k in store.list(NODE_INDEX) if k != NODE_INDEX_META)
    store.delete(lost)
    report = node_index.rebuild(store, repair=False)
    assert report.missing == [lost] and not report.repaired and lost not in set(store.list(NODE_INDEX))
    assert node_index.rebuild(store).repaired and lost in set(store.list(NODE_INDEX))


def test_a_marker_deleted_as_stale_is_put_back_when_its_node_swaps_its_record_in_meanwhile(store, tmp_path, draft):
    """The rebuild's last step alone: a node's record is away while the index is listed and its
    markers confirmed stale; the node writes it again before the rebuild reads once more, so each
    deleted marker its record implies is put back."""
    node_index.rebuild(store)
    nodes, _, _ = rollout_in_flight(store, tmp_path, draft, n=4)
    node = nodes.ids[0]
    saved = store.get_bytes(node_key(node))
    implied = node_index.node_markers(read_node(store, node)[0])
    store.delete(node_key(node))  # away: every marker of the node looks stale
    real_delete = store.delete
    back: list[str] = []

    def delete_then_the_node_writes_again(key):
        real_delete(key)
        if key.startswith(NODE_INDEX) and not back:
            back.append(key)
            store.put_bytes(node_key(node), saved)

    store.delete = delete_then_the_node_writes_again
    try:
        report = node_index.rebuild(store)
    finally:
        store.delete = real_delete
    assert back and report.stale == []
    assert implied <= set(store.list(NODE_INDEX)), implied - set(store.list(NODE_INDEX))


def test_a_wave_moves_on_only_when_its_nodes_records_say_so_not_its_markers(store, tmp_path, draft):
    """#48 item 6: the tick re-reads the records of the wave it would advance: a canary whose
    record says failed, while the index holds a healthy marker for it (written by any node role,
    or left by an interrupted update), halts the rollout instead of advancing it."""
    node_index.rebuild(store)
    nodes, rec, late = rollout_in_flight(store, tmp_path, draft, n=40)
    canary = next(x for x in nodes.ids if x not in late)
    state = read_node(store, canary)[0].engine(PROFILE, "prod")
    fleet.record_engine_state(store, canary, detect(), state.model_copy(update={"status": "failed"}))
    prefix = status_prefix(PROFILE, "prod", rec.artifact_id)
    for k in [k for k in store.list(prefix) if k.startswith(f"{prefix}{canary}.")]:
        store.delete(k)
    store.put_bytes(f"{prefix}{canary}.healthy", b"")  # the index says healthy; the record says failed
    later = datetime.now(timezone.utc) + timedelta(seconds=601)
    seen = rollouts.view(store, read_channel(store, PROFILE, "prod", draft.compat_key)[0], now=later)
    assert seen.decision == "halt", seen.why  # the view reads the wave's records as the tick does
    (v,) = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod", now=later)
    assert v.decision == "halt" and canary in v.waves[0].failed_nodes and v.applied is not None, (v.decision, v.why)
    assert read_channel(store, PROFILE, "prod", draft.compat_key)[0].artifact_id == rec.rollout.base  # rolled back


@pytest.mark.parametrize("dry_run", [True, False])
def test_gc_reads_the_node_records_before_it_removes_what_no_held_marker_names(store, tmp_path, draft, dry_run):
    """#48: a held marker that went missing (deleted by a principal, or lost) must not make gc
    remove a node's rollback target: before it removes anything, gc reads the node records, keeps
    what they hold and names the missing markers."""
    from buildctl.artifact_store.layout import HELD_INDEX, hex_of

    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    nodes = Fleet(store, tmp_path, 2)
    promote(store, staged(store, v1), "prod")
    nodes.pull_all()
    promote(store, staged(store, v2), "prod")
    nodes.pull_all()  # v1 is each node's previous: its rollback target
    node_index.rebuild(store)
    lost = [k for k in store.list(HELD_INDEX) if k.startswith(f"{HELD_INDEX}{hex_of(v1)}/")]
    assert len(lost) == 2  # previous, on each node
    for key in lost:
        store.delete(key)
    res = gc(store, GcPolicy(keep=0, keep_history=0, grace_s=0), dry_run=dry_run, now=datetime(2030, 1, 1, tzinfo=timezone.utc))
    kept = {d.artifact_id: d.protected_by for d in res.decisions}
    assert v1 not in res.removed_artifacts and v2 not in res.removed_artifacts
    assert any("held by 2 node(s)" in why and "no held marker" in why for why in kept[v1]), kept[v1]
    assert res.index_missing == [v1] and res.to_json()["index_missing"] == [v1]
    assert get_manifest(store, v1) is not None
