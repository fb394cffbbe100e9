"""Rollouts with a real store and simulated nodes: wave buckets, per-node resolution, the node
agent's smoke check and switch-back, and the decisions that advance, complete or halt a rollout.
(The rollout-channel flow itself runs in tests/flows/test_flows.py against a real Prefect API.)"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.read import get_manifest
from buildctl.core.times import utc_now
from buildctl.steps import rollouts
from buildctl.engines.fingerprint import detect
from buildctl.artifact_store.fleet.inventory import read_node
from buildctl.steps import node_agent
from buildctl.artifact_store.channels import ChannelMove, history, read_channel
from buildctl.artifact_store.errors import EngineUnhealthyError, RolloutInProgressError, RolloutStateError, StoreArgumentError
from buildctl.artifact_store.node.install_dir import current_artifact, previous_artifact
from buildctl.artifact_store.node.pull import pull
from buildctl.artifact_store.fleet.waves import RolloutPlan, in_wave, parse_waves, wave_bucket
from buildctl.steps.context import Context

from ..support.helpers import publish_files, settings, staged
from buildctl.artifact_store.node.pull import PullOptions
from buildctl.artifact_store.node.pull import resolve_channel

PROFILE = "tiny-llama-cpu"
# Fails on an engine that ships a file named BROKEN: the operator's health command, as a node runs it.
HEALTH = 'test ! -e "$1/BROKEN"'


def rollout_in(spec: str, canary: str | None, bake_s: int) -> ChannelMove:
    """A promotion that starts a rollout in ``spec``'s waves."""
    return ChannelMove(rollout=RolloutPlan(waves=parse_waves(spec, canary), bake_s=bake_s))


def publish(store, tmp_path: Path, name: str, draft, broken: bool = False) -> str:
    files: dict[str, bytes | int] = {"config.json": name.encode(), "rank0.engine": 2048}
    if broken:
        files["BROKEN"] = b"segfaults past 4096 tokens"
    return publish_files(store, tmp_path / name, draft, files, seed=len(name))


class Fleet:
    """Simulated nodes: each has a node id, its own fingerprint file and its own install directory."""

    def __init__(self, store, tmp_path: Path, n: int) -> None:
        self.store, self.root = store, tmp_path / "fleet"
        self.ids = [f"gpu-node-{i:03d}" for i in range(n)]
        fp = detect()
        for node in self.ids:
            (self.root / node).mkdir(parents=True)
            (self.root / node / "fingerprint.json").write_text(fp.model_dump_json())

    def dest(self, node: str) -> Path:
        return self.root / node / "engines"

    def pull(self, node: str, health_cmd: str = HEALTH):
        st = settings(fingerprint_file=self.root / node / "fingerprint.json", store=self.store.uri)
        return node_agent.pull(Context.from_settings(st, store=self.store), PROFILE, 'prod', self.dest(node), PullOptions(node_id=node, health_cmd=health_cmd, skip_preflight=True))

    def pull_all(self) -> dict[str, str]:
        failed = {}
        for node in self.ids:
            try:
                self.pull(node)
            except EngineUnhealthyError as err:
                failed[node] = err.detail
        return failed

    def current(self) -> dict[str, str | None]:
        return {n: current_artifact(self.dest(n)) for n in self.ids}


def test_wave_buckets_are_stable_uniform_and_nested():
    ids = [f"node-{i}" for i in range(10_000)]
    buckets = [wave_bucket(PROFILE, "prod", n) for n in ids]
    assert buckets == [wave_bucket(PROFILE, "prod", n) for n in ids]  # stable
    assert all(0 <= b < 100 for b in buckets)
    for pct in (1, 10, 50):
        share = sum(b < pct for b in buckets) / len(ids)
        assert abs(share - pct / 100) < 0.01 + pct / 1000, (pct, share)  # uniform enough: 10k draws
    for n in ids[:500]:  # a canary is in every later wave
        assert not in_wave(PROFILE, "prod", n, 1) or in_wave(PROFILE, "prod", n, 10)
    assert in_wave(PROFILE, "prod", None, 100) and not in_wave(PROFILE, "prod", None, 50)
    other = [wave_bucket(PROFILE, "staging", n) for n in ids[:1000]]
    assert other != buckets[:1000]  # each channel has its own canaries


def test_rollout_arguments():
    waves = parse_waves("1,10,50,100", "0,1%,2%,2%")
    assert [(w.percent, w.max_failures) for w in waves] == [(1, "0"), (10, "1%"), (50, "2%"), (100, "2%")]
    assert [w.allowed_failures(n) for w, n in zip(waves, (3, 150, 49, 1000))] == [0, 1, 0, 20]
    assert [w.max_failures for w in parse_waves("5,100", "2")] == ["2", "2"]
    for bad in ("10,5,100", "1,10,50", "0,100", "1,x,100"):
        with pytest.raises(StoreArgumentError):
            parse_waves(bad, None)
    with pytest.raises(StoreArgumentError, match="3 values for 2 waves"):
        parse_waves("50,100", "0,1,2")
    with pytest.raises(StoreArgumentError, match="a count like 1"):
        parse_waves("50,100", "1.5")


def test_canary_wave_gets_the_new_engine_and_the_rest_keep_the_old(store, tmp_path, draft, cli):
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    fleet = Fleet(store, tmp_path, 24)
    promote(store, staged(store, v1), "prod")
    assert fleet.pull_all() == {} and set(fleet.current().values()) == {v1}
    plan = RolloutPlan(waves=parse_waves("20,100", "0"), bake_s=3600)
    rec = promote(store, staged(store, v2), "prod", move=ChannelMove(rollout=plan))
    assert rec.rollout.base == v1 and rec.rollout.target == v2 and rec.artifact_id == v2 and rec.previous == v1
    canaries = {n for n in fleet.ids if wave_bucket(PROFILE, "prod", n) < 20}
    assert 0 < len(canaries) < len(fleet.ids)  # the node ids were chosen so that the wave splits them
    assert fleet.pull_all() == {}
    assert fleet.current() == {n: (v2 if n in canaries else v1) for n in fleet.ids}
    # a node without an id is in no partial wave
    plain = pull(store, resolve_channel(store, PROFILE, 'prod', [draft.compat_key]), tmp_path / 'anonymous')
    assert plain.artifact_id == v1

    code, out, err = cli("--store", store.uri, "--json", "rollout", "status", "--profile", PROFILE, "--channel", "prod")
    assert code == 0, err
    (view,) = json.loads(out)
    assert view["state"] == "active" and view["wave"] == 1 and view["decision"] == "wait"
    first, last = view["waves"]
    assert (first["nodes"], first["healthy"], first["failed"], first["state"]) == (len(canaries), len(canaries), 0, "current")
    assert (last["nodes"], last["healthy"], last["pending"], last["state"]) == (24, len(canaries), 24 - len(canaries), "waiting")
    code, out, _ = cli("--store", store.uri, "rollout", "status", "--profile", PROFILE, "--channel", "prod")
    assert code == 0 and "baking" in out and "not reported" in out

    # a new promotion would abandon the rollout: refused; a plain promote after it ends is a 100% flip
    with pytest.raises(RolloutInProgressError):
        promote(store, staged(store, v1), "prod")
    code, _, err = cli("--store", store.uri, "promote", v1, "--channel", "prod")
    assert code == 6 and "rollout abort" in err
    for step, state in (("pause", "paused"), ("resume", "active")):
        code, out, err = cli("--store", store.uri, "--json", "rollout", step, "--profile", PROFILE, "--channel", "prod")
        assert code == 0 and json.loads(out)[0]["rollout"]["state"] == state, err
    code, _, err = cli("--store", store.uri, "rollout", "resume", "--profile", PROFILE, "--channel", "prod",
                       "--compat-key", "aoti-none")
    assert code == 3, err  # no such channel ref
    code, out, err = cli("--store", store.uri, "--json", "rollout", "abort", "--profile", PROFILE, "--channel", "prod",
                         "--reason", "testing abort")
    assert code == 0 and json.loads(out)[0]["artifact_id"] == v1, err
    assert fleet.pull_all() == {} and set(fleet.current().values()) == {v1}
    assert promote(store, staged(store, v2), "prod").rollout is None
    assert fleet.pull_all() == {} and set(fleet.current().values()) == {v2}


def test_a_failing_canary_halts_the_rollout_and_rolls_the_channel_back(store, tmp_path, draft):
    v1, bad = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "bad", draft, broken=True)
    fleet = Fleet(store, tmp_path, 30)
    promote(store, staged(store, v1), "prod")
    fleet.pull_all()
    rec = promote(store, staged(store, bad), "prod", move=rollout_in("10,50,100", "0", 0))
    canaries = sorted(n for n in fleet.ids if wave_bucket(PROFILE, "prod", n) < 10)
    assert canaries
    failed = fleet.pull_all()
    assert sorted(failed) == canaries and all("health command exit 1" in d for d in failed.values())
    assert set(fleet.current().values()) == {v1}  # each canary switched itself back
    for n in canaries:
        state = read_node(store, n)[0].engine(PROFILE, "prod")
        assert (state.artifact_id, state.status, state.current) == (bad, "failed", v1)

    (v,) = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod")
    assert v.decision == "halt" and v.applied is not None
    now = read_channel(store, PROFILE, "prod", draft.compat_key)[0]
    assert now.seq == rec.seq + 1 and now.artifact_id == v1 and now.previous == bad and now.action == "rollback"
    assert now.rollout.state == "halted" and list(now.rollout.failed_nodes) == canaries
    assert all(n in now.reason for n in canaries) and "budget 0" in now.reason
    assert [r.action for r in history(store, PROFILE, "prod", draft.compat_key)] == ["promote", "promote", "rollback"]
    assert fleet.pull_all() == {} and set(fleet.current().values()) == {v1}
    assert rollouts.tick(Context.from_settings(settings(), store=store), channel="prod") == []  # nothing live to decide


def test_decisions_wait_bake_advance_complete_and_halt_when_paused(store, tmp_path, draft):
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    fleet = Fleet(store, tmp_path, 40)
    promote(store, staged(store, v1), "prod")
    rec = promote(store, staged(store, v2), "prod", move=rollout_in("25,100", "0,5%", 600))
    fleet.pull_all()
    now = datetime.now(timezone.utc)
    assert rollouts.view(store, rec, now=now).decision == "wait"  # baking
    later = now + timedelta(seconds=601)
    v = rollouts.view(store, rec, now=later)
    assert v.decision == "advance" and v.waves[0].healthy == v.waves[0].nodes > 0
    assert [r.decision for r in rollouts.tick(Context.from_settings(settings(), store=store), channel="prod", now=later)] == ["advance"]
    wave2 = read_channel(store, PROFILE, "prod", draft.compat_key)[0]
    assert wave2.action == "advance" and wave2.rollout.wave == 1
    rollouts.rollout_step(store, PROFILE, "prod", draft.compat_key, "pause")
    paused = read_channel(store, PROFILE, "prod", draft.compat_key)[0]
    much_later = later + timedelta(seconds=3600)
    # wave 2 (100%, budget 5% of 40 = 2): two nodes fail their smoke checks, within budget
    late = [n for n in fleet.ids if wave_bucket(PROFILE, "prod", n) >= 25]
    for n in late[:2]:
        _fail_on_node(fleet, n)
    for n in late[3:]:
        fleet.pull(n)
    v = rollouts.view(store, paused, now=much_later)
    assert v.decision == "wait" and "paused" in v.why  # baked and within budget, but paused
    assert (v.waves[1].failed, v.waves[1].allowed, v.waves[1].pending) == (2, 2, 1)
    _fail_on_node(fleet, late[2])  # a third: over budget halts, paused or not
    v = rollouts.view(store, paused, now=much_later)
    assert v.decision == "halt" and v.waves[1].failed == 3
    assert [r.decision for r in rollouts.tick(Context.from_settings(settings(), store=store), channel="prod", now=much_later)] == ["halt"]
    ended = read_channel(store, PROFILE, "prod", draft.compat_key)[0]
    assert ended.artifact_id == v1 and ended.rollout.state == "halted" and set(ended.rollout.failed_nodes) == set(late[:3])
    with pytest.raises(RolloutStateError, match="no rollout in progress"):
        rollouts.rollout_step(store, PROFILE, "prod", draft.compat_key, "resume")


def _fail_on_node(fleet: Fleet, node: str) -> None:
    with pytest.raises(EngineUnhealthyError):
        fleet.pull(node, health_cmd="exit 3")
    assert read_node(fleet.store, node)[0].engine(PROFILE, "prod").status == "failed"


def test_a_nodes_failed_smoke_check_switches_it_back_to_previous(store, tmp_path, draft, cli):
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft, broken=True)
    v0 = publish(store, tmp_path, "v0", draft)
    fleet = Fleet(store, tmp_path, 1)
    (node,) = fleet.ids
    dest = fleet.dest(node)
    for a in (v0, v1):
        promote(store, staged(store, a), "prod")
        fleet.pull(node)
    assert (current_artifact(dest), previous_artifact(dest)) == (v1, v0)
    reported = read_node(store, node)[0].engine(PROFILE, "prod")
    assert (reported.current, reported.previous, reported.status) == (v1, v0, "healthy")  # what gc keeps for it
    promote(store, staged(store, v2), "prod")  # a plain promotion: every node at once
    fp = tmp_path / "fleet" / node / "fingerprint.json"
    code, out, err = cli("--store", store.uri, "pull", "--profile", PROFILE, "--channel", "prod", "--dest", dest,
                         "--node-id", node, "--health-cmd", HEALTH, "--skip-preflight", "--keep", "3")
    assert code == 8, (out, err)
    assert "failed its smoke check on this node, switched back (current is " + v1 in err
    assert current_artifact(dest) == v1 and previous_artifact(dest) == v0  # both links as they were
    state = read_node(store, node)[0].engine(PROFILE, "prod")
    assert (state.artifact_id, state.status, state.current) == (v2, "failed", v1)
    # the node does not install it again by itself
    code, _, err = cli("--store", store.uri, "pull", "--profile", PROFILE, "--channel", "prod", "--dest", dest,
                       "--node-id", node, "--health-cmd", HEALTH, "--skip-preflight")
    assert code == 8 and "not installing it again" in err and current_artifact(dest) == v1
    # --retry-failed tries once more (and the engine is still broken)
    code, _, err = cli("--store", store.uri, "pull", "--profile", PROFILE, "--channel", "prod", "--dest", dest,
                       "--node-id", node, "--health-cmd", HEALTH, "--skip-preflight", "--retry-failed")
    assert code == 8 and "switched back" in err and current_artifact(dest) == v1
    assert fp.exists()


@pytest.mark.slow  # a real aoti build (two graphs, about a minute): end to end
def test_the_default_smoke_check_loads_a_real_engine_and_generates(tiny_build, tmp_path):
    """Without --health-cmd the node loads the installed aoti engine and generates tokens; an
    engine whose package is damaged after install fails, and the node switches back."""
    store, aid = tiny_build["store"], tiny_build["outcome"].artifact_id
    promote(store, aid, "smoke", move=ChannelMove(forced=True, reason="test channel"))
    st = settings(store=store.uri)
    dest = tmp_path / "node"
    got = node_agent.pull(Context.from_settings(st, store=store), tiny_build['profile'].name, 'smoke', dest, PullOptions(node_id='cpu-node-1'))
    assert got.state is not None and got.state.status == "healthy" and current_artifact(dest) == aid
    assert read_node(store, "cpu-node-1")[0].engine(tiny_build["profile"].name, "smoke").status == "healthy"


def test_a_canary_that_refuses_a_rotted_target_counts_as_failed(store, tmp_path, draft, cli, s3_env_if_needed):
    """A pull that refuses the new artifact (its bytes rotted: exit 4) is recorded against the
    artifact the node was given, not the channel's base, and the rollout counts the node failed."""
    from ..support.helpers import rot

    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    promote(store, staged(store, v1), "prod")
    promote(store, staged(store, v2), "prod", move=rollout_in("50,100", "0", 0))
    canary = next(f"n{i}" for i in range(100) if wave_bucket(PROFILE, "prod", f"n{i}") < 50)
    rot(store, next(f.digest for f in get_manifest(store, v2).files if f.path == "rank0.engine"), "flip")
    code, _, err = cli("--store", store.uri, "pull", "--profile", PROFILE, "--channel", "prod", "--dest",
                       tmp_path / canary, "--node-id", canary, "--skip-preflight")
    assert code == 4 and "rank0.engine: digest mismatch" in err, err
    (failure,) = read_node(store, canary)[0].pull_failures
    assert failure.artifact_id == v2
    (v,) = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod")
    assert v.decision == "halt" and v.waves[0].failed_nodes == (canary,)


def test_only_refusals_about_the_artifact_count_as_failures():
    from buildctl.artifact_store.fleet.inventory import NodeRecord, PullFailure

    def node(error: str) -> NodeRecord:
        f = PullFailure(artifact_id="xxh3-128:" + "2" * 32, profile=PROFILE, channel="prod", compat_key="k",
                        error=error, when=utc_now())
        return NodeRecord(node_id="n", fingerprint={}, compat_keys={"aoti": "k"}, profiles=(PROFILE,),
                          reported_at=utc_now(), pull_failures=(f,))

    target = "xxh3-128:" + "2" * 32
    for error, status in (("VerificationError: rank0.engine: digest mismatch", "failed"),
                          ("QuarantinedError: artifact is quarantined", "failed"),
                          ("SignatureError: manifest xxh3-128:22: unsigned", "failed"),
                          ("SignatureError: channel record prod #3: signed by untrusted key", "pending"),
                          ("ExpiredRecordError: channel prod record #3 expired", "pending"),
                          ("StaleRecordError: channel prod record #2 is stale", "pending")):
        assert rollouts.node_status(node(error), PROFILE, "prod", target) == status, error
    assert rollouts.node_status(node("VerificationError: x"), PROFILE, "staging", target) == "pending"


def test_a_node_is_in_scope_under_its_new_key_its_schema_1_key_and_the_key_on_record():
    """Across the hard/soft key change a node resolves its new key first and its schema-1 key
    after, so a rollout on either ref counts it, whichever key its inventory record holds."""
    from buildctl.artifact_store.fleet.inventory import NodeRecord

    from ..support.trtllm_kit import h100x8

    fp = h100x8()
    old = NodeRecord(node_id="n1", fingerprint=fp.model_dump(mode="json"), profiles=("p",),
                     compat_keys={"trtllm": fp.legacy_compat_key("trtllm")}, reported_at="2026-12-01T00:00:00Z")
    for key in (fp.compat_key("trtllm"), fp.legacy_compat_key("trtllm")):
        assert rollouts.nodes_in_scope([old], "p", "prod", "trtllm", key) == [old]
    other = h100x8(sm="8.9")
    assert rollouts.nodes_in_scope([old], "p", "prod", "trtllm", other.compat_key("trtllm")) == []
    assert rollouts.nodes_in_scope([old], "q", "prod", "trtllm", fp.compat_key("trtllm")) == []


# --- what a view says, exactly (each figure and label; guards for mutants the suite let live) -----


def _node(node_id: str, key: str, profile: str = PROFILE, status: str | None = None, target: str | None = None,
          rec=None):
    from buildctl.artifact_store.fleet.inventory import EngineState, NodeRecord

    engines = ()
    if status is not None:
        engines = (EngineState(profile=profile, channel="prod", compat_key=key, artifact_id=target, seq=rec.seq,
                               status=status, current=target, when="2026-12-01T00:00:00Z"),)
    return NodeRecord(node_id=node_id, fingerprint={}, compat_keys={"aoti": key}, profiles=(profile,),
                      reported_at="2026-12-01T00:00:00Z", engines=engines)


def test_a_views_labels_counts_and_json_are_exact(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store

    store = open_store(f"file://{tmp_path / 'store'}")
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    promote(store, staged(store, v1), "prod")
    rec = promote(store, staged(store, v2), "prod", move=rollout_in("50,100", "1", 600))
    key = draft.compat_key
    ids = [f"n{i:03d}" for i in range(40)]
    first = [n for n in ids if wave_bucket(PROFILE, "prod", n) < 50]
    assert len(first) >= 6
    states = ["healthy"] * 3 + ["failed", "installed"] + [None] * (len(first) - 5)
    nodes = [_node(n, key, status=s, target=v2, rec=rec) for n, s in zip(first, states)]
    nodes += [_node(n, key) for n in ids if n not in first]
    started = datetime.fromisoformat(rec.rollout.wave_started_at.replace("Z", "+00:00"))
    now = started + timedelta(seconds=0.87655)  # 599.12345 s of bake left
    v = rollouts.decide(rec, nodes, now)
    assert rollouts.view(store, rec, nodes, now).why == v.why  # the nodes given, not the store's (it has none)
    pending = len(first) - 4
    assert v.decision == "wait" and v.why == (f"wave 1 (50%): baking, 599s left; 3 healthy, 1 failed, "
                                              f"{pending} not reported of {len(first)}")
    assert v.waves[0].done == 4 and v.waves[1].done == 4  # healthy + failed
    j = v.to_json()
    assert j["wave"] == 1 and [w["wave"] for w in j["waves"]] == [1, 2] and j["waves"][0]["done"] == 4
    assert j["bake_left_s"] == 599.123 and j["waves"][0]["allowed"] == 1
    baked = rollouts.decide(rec, nodes, started + timedelta(seconds=601))
    assert baked.decision == "advance" and baked.why == f"wave 1 (50%) baked with 1 failure(s) of {len(first)} (budget 1): on to 100%"
    last = rollouts.rollout_step(store, PROFILE, "prod", key, "advance")
    assert [w.state for w in rollouts.decide(last, nodes, now).waves] == ["done", "current"]  # wave 1 is behind it
    done = rollouts.decide(last, nodes, datetime.now(timezone.utc) + timedelta(seconds=601))
    assert done.decision == "complete" and done.why.startswith("wave 2 (100%) baked with 1 failure(s)")
    none = rollouts.decide(promote(store, v1, "staging"), nodes, now)
    assert none.decision == "none" and none.to_json()["bake_left_s"] == 0.0 and none.to_json()["wave"] is None


def test_scope_needs_the_profile_or_an_engine_of_it_and_the_key():
    nodes = [_node("serves", "k1"), _node("other-profile", "k1", profile="p2"), _node("other-key", "k2")]
    assert [n.node_id for n in rollouts.nodes_in_scope(nodes, PROFILE, "prod", "aoti", "k1")] == ["serves"]


def test_tick_decides_every_live_rollout_past_channels_without_one(tmp_path, draft):
    """Refs are taken in (profile, key) order: a ref without a rollout before a live one is skipped, not the end."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import set_channel

    store = open_store(f"file://{tmp_path / 'store'}")
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    m = get_manifest(store, v1)
    set_channel(store, v1, m, "prod", move=ChannelMove(compat_key="aaa-first"))  # no rollout, sorts first
    promote(store, staged(store, v1), "prod")
    promote(store, staged(store, v2), "prod", move=rollout_in("50,100", "0", 0))
    views = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod")
    assert [(v.record.compat_key, v.decision) for v in views] == [(draft.compat_key, "advance")]


def test_tick_keeps_each_decided_waves_count_in_the_record_it_writes(tmp_path, draft, cli):
    """#32: the per-wave summary. Each advance, complete or halt the tick writes carries what it
    counted in the wave it decided on; `rollout status` shows them from the ref alone, and a record
    without summaries keeps its bytes (its signature)."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.fleet.inventory import update_node
    from buildctl.artifact_store.fleet.waves import Rollout

    store = open_store(f"file://{tmp_path / 'store'}")
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    promote(store, staged(store, v1), "prod")
    rec = promote(store, staged(store, v2), "prod", move=rollout_in("50,100", "1", 0))
    assert "summaries" not in rec.body()["rollout"]  # unset: left out of the signed bytes
    key = draft.compat_key
    ids = [f"n{i:03d}" for i in range(20)]
    first = [n for n in ids if wave_bucket(PROFILE, "prod", n) < 50]
    for n in ids:  # the first wave: one failure, the rest healthy; the others have not pulled
        status = ("failed" if n == first[0] else "healthy") if n in first else None
        update_node(store, n, lambda _, n=n, status=status: _node(n, key, status=status, target=v2, rec=rec))
    ctx = Context.from_settings(settings(), store=store)
    (v,) = rollouts.tick(ctx, channel="prod")
    assert v.decision == "advance"
    (s1,) = v.applied.rollout.summaries
    assert (s1.wave, s1.percent, s1.decision, s1.nodes, s1.healthy, s1.failed, s1.pending, s1.allowed) == (
        0, 50.0, "advance", len(first), len(first) - 1, 1, 0, 1)
    (v,) = rollouts.tick(ctx, channel="prod")
    assert v.decision == "complete"
    now = read_channel(store, PROFILE, "prod", key)[0]
    assert [(s.wave, s.decision, s.nodes, s.pending) for s in now.rollout.summaries] == [
        (0, "advance", len(first), 0), (1, "complete", len(ids), len(ids) - len(first))]
    code, out, err = cli("--store", store.uri, "rollout", "status", "--profile", PROFILE, "--channel", "prod")
    assert code == 0, err
    assert f"wave 1 (50%) advance at {s1.at}: {len(first) - 1} healthy, 1 failed (budget 1), 0 not reported of {len(first)}" in out
    assert f"wave 2 (100%) complete at" in out
    # a rollout record written before summaries parses and dumps to the same bytes
    old = {k: v for k, v in rec.rollout.model_dump(mode="json").items()}
    assert Rollout.model_validate(old).model_dump(mode="json") == old and "summaries" not in old


def test_control_acts_on_live_rollouts_only_and_names_the_key_it_was_given(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import set_channel

    store = open_store(f"file://{tmp_path / 'store'}")
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    set_channel(store, v1, get_manifest(store, v1), "prod",
                move=ChannelMove(compat_key="aaa-plain"))  # a ref without a rollout
    promote(store, staged(store, v1), "prod")
    promote(store, staged(store, v2), "prod", move=rollout_in("50,100", "0", 0))
    ctx = Context.from_settings(settings(), store=store)
    (paused,) = rollouts.control(ctx, "pause", PROFILE, "prod")
    assert paused.compat_key == draft.compat_key and paused.rollout.state == "paused"
    rollouts.control(ctx, "abort", PROFILE, "prod")  # ended: not live any more
    with pytest.raises(StoreArgumentError, match=rf"no rollout in progress on prod of {PROFILE} \[{draft.compat_key}\]"):
        rollouts.control(ctx, "resume", PROFILE, "prod", draft.compat_key)


def test_resign_refuses_a_margin_equal_to_the_record_lifetime(tmp_path):
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.artifact_store.backends.store import open_store

    from ..support.helpers import make_signer

    store = open_store(f"file://{tmp_path / 'store'}")
    st = settings(record_ttl_s=3600)
    ctx = Context(st, store, Authority(signer=make_signer(), ttl_s=3600))
    with pytest.raises(StoreArgumentError, match="is not below the record lifetime"):
        rollouts.resign_due(ctx, margin_s=3600)
    assert rollouts.resign_due(ctx, margin_s=3599) == []


def test_the_next_wave_named_is_the_next_one_and_baking_ends_exactly(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store

    store = open_store(f"file://{tmp_path / 'store'}")
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    promote(store, staged(store, v1), "prod")
    rec = promote(store, staged(store, v2), "prod", move=rollout_in("10,50,100", "0", 600))
    started = datetime.fromisoformat(rec.rollout.wave_started_at.replace("Z", "+00:00"))
    almost = rollouts.decide(rec, [], started + timedelta(seconds=599.5))
    assert almost.decision == "wait" and almost.bake_left_s == pytest.approx(0.5)
    baked = rollouts.decide(rec, [], started + timedelta(seconds=600.5))
    assert baked.decision == "advance" and baked.why.endswith("on to 50%") and baked.to_json()["bake_left_s"] == 0.0
    paused = rollouts.rollout_step(store, PROFILE, "prod", draft.compat_key, "pause")
    view = rollouts.decide(paused, [], started + timedelta(seconds=700))
    assert view.decision == "wait" and view.bake_left_s == 0.0  # baked: nothing left, not less than nothing


def test_a_channel_that_moved_while_tick_decided_is_decided_again_next_time(tmp_path, draft, monkeypatch):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.errors import CasConflictError

    store = open_store(f"file://{tmp_path / 'store'}")
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    promote(store, staged(store, v1), "prod")
    promote(store, staged(store, v2), "prod", move=rollout_in("50,100", "0", 0))

    def moved(*a, **k):
        raise CasConflictError("channels/x", 1)

    monkeypatch.setattr(rollouts, "rollout_step", moved)
    (v,) = rollouts.tick(Context.from_settings(settings(), store=store), channel="prod")
    assert v.decision == "advance" and v.applied is None
    assert v.why.endswith("(the channel moved meanwhile; decided again next time)")


def test_status_of_a_channel_with_no_refs_names_it_and_wave_counts_are_values(tmp_path):
    import dataclasses

    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.errors import ChannelNotFoundError

    from buildctl.artifact_store.errors import StoreNotFoundError

    store = open_store(f"file://{tmp_path / 'store'}")
    with pytest.raises(StoreNotFoundError):  # nothing at all there: the store is what is wrong
        rollouts.status(store, PROFILE, "prod")
    store.put_bytes("keys/revocations/x.json", b"{}")
    with pytest.raises(ChannelNotFoundError, match=f"{PROFILE}' has no channel in store") as err:
        rollouts.status(store, PROFILE, "prod")
    assert err.value.compat_keys == ["<any>"]
    w = rollouts.WaveCount(0, 10.0, "0", 0, 1, 1, 0, 0, 0, (), "current")
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.failed = 3  # type: ignore[misc]


def test_status_passes_over_a_malformed_ref_and_reads_the_ones_after_it(store, tmp_path, draft):
    """One bad channel ref costs its own view, not the channel's: with ``skipped`` the malformed
    ref is listed there and every other key's ref is still read (it sorts after the bad one);
    without ``skipped`` it raises."""
    import dataclasses

    from buildctl.artifact_store.errors import CorruptObjectError
    from buildctl.artifact_store.layout import channel_key

    keys = ["aoti-" + "1" * 32, "aoti-" + "2" * 32, "aoti-" + "3" * 32]
    for i, key in enumerate(keys):
        aid = publish(store, tmp_path, f"k{i}", dataclasses.replace(draft, compat_key=key))
        promote(store, staged(store, aid), "prod")
    bad = channel_key(draft.profile_name, "prod", keys[0])
    assert store.cas(bad, b"{not a record", store.get_ref(bad)[1])
    skipped: list[tuple[str, str]] = []
    views = rollouts.status(store, draft.profile_name, "prod", skipped=skipped)
    assert [v.record.compat_key for v in views] == keys[1:]
    assert [k for k, _ in skipped] == [bad]
    with pytest.raises(CorruptObjectError):
        rollouts.status(store, draft.profile_name, "prod")


def test_resign_due_re_signs_only_what_is_due_and_leaves_a_record_that_moved(tmp_path, draft, monkeypatch):
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.artifact_store.backends.store import open_store

    from ..support.helpers import make_signer

    store = open_store(f"file://{tmp_path / 'store'}")
    signer = make_signer()
    v1 = publish(store, tmp_path, "v1", draft)
    promote(store, staged(store, v1), "prod", auth=Authority(signer=signer, ttl_s=3600))  # fresh for an hour
    st_rec = promote(store, v1, "staging", auth=Authority(signer=signer, ttl_s=60))  # due within the margin
    ctx = Context(settings(record_ttl_s=3600), store, Authority(signer=signer, ttl_s=3600))
    real = rollouts.read_channel
    monkeypatch.setattr(rollouts, "read_channel", lambda *a: (lambda got: (got[0].model_copy(update={"seq": got[0].seq + 1}),
                                                                          got[1]) if got else got)(real(*a)))
    assert rollouts.resign_due(ctx, margin_s=600) == []  # staging moved meanwhile: left alone
    monkeypatch.setattr(rollouts, "read_channel", real)
    (new,) = rollouts.resign_due(ctx, margin_s=600)  # prod (listed first) is not due; staging is
    assert (new.channel, new.seq, new.action) == ("staging", st_rec.seq + 1, "resign")
    from buildctl.core.times import parse_utc

    prod_rec = rollouts.read_channel(store, PROFILE, "prod", draft.compat_key)[0]
    at_edge = parse_utc(prod_rec.expires) - timedelta(seconds=600)  # prod expires exactly at the horizon: due
    assert [r.channel for r in rollouts.resign_due(ctx, margin_s=600, now=at_edge)] == ["prod"]
