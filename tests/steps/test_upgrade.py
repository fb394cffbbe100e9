"""buildctl.steps.upgrade: the upgrade plan, the ready gate and migrate-keys, on a store written by the
code before compat keys split into hard and soft fields (tests/support/fixtures/legacy_store,
made by make_legacy_store.py from commit 3565518) and on fleets of fingerprint files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from buildctl.steps import fleet
from buildctl.steps import build, host, profiles, promote
from buildctl.steps import upgrade
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.channels import channel_compat_keys, history, read_channel
from buildctl.artifact_store.promotion import rollback
from buildctl.artifact_store.node.pull import pull, resolve_channel
from buildctl.steps.context import Context
from buildctl.engines.fingerprint import Fingerprint, GpuInfo, UpgradeTarget

from ..support.helpers import PROFILES, REPO, settings, staged

LEGACY = REPO / "tests/support/fixtures/legacy_store"
TRT = "llama-3-8b-instruct-fp8-tp1"
CPU = "tiny-llama-cpu"


@pytest.fixture
def legacy(tmp_path, monkeypatch) -> dict:
    """A copy of the legacy store (tests write to it), its hosts and artifacts, and the profiles
    it was built from: the repository's, with the tiny profile as it was then (before the aoti
    engine's format 2 raised its batch size and levels, which changes its build hash)."""
    profiles = tmp_path / "profiles"
    shutil.copytree(PROFILES, profiles)
    shutil.copy(REPO / "tests/support/fixtures/legacy_profiles/tiny-llama-cpu.yaml", profiles / "tiny-llama-cpu.yaml")
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(profiles))
    root = tmp_path / "store"
    shutil.copytree(LEGACY, root)
    info = json.loads((root / "FINGERPRINTS.json").read_text())
    (root / "FINGERPRINTS.json").unlink()
    store = open_store("file://" + str(root))
    hosts = {k: Fingerprint.model_validate(info[k]) for k in ("cpu", "h100", "l40s")}
    return {"store": store, "ctx": Context.from_settings(settings(), store=store), "hosts": hosts,
            "old_keys": info["keys"], "artifacts": info["artifacts"], "uri": store.uri}


def channels_of(store) -> list[tuple[str, str, str]]:
    out = []
    for profile in (CPU, TRT):
        for ch in ("staging", "prod"):
            out += [(profile, ch, k) for k in channel_compat_keys(store, profile, ch)]
    return sorted(out)


# (profile, channel, host) for every ref of the legacy store
REFS = [(CPU, "staging", "cpu"), (CPU, "prod", "cpu"), (TRT, "staging", "h100"), (TRT, "prod", "h100"),
        (TRT, "staging", "l40s")]


def test_every_channel_of_an_old_store_still_resolves_for_its_nodes(legacy, tmp_path):
    store = legacy["store"]
    for profile, ch, hostname in REFS:
        fp = legacy["hosts"][hostname]
        rec = resolve_channel(store, profile, ch, host.host_compat_keys(fp))
        assert rec.compat_key == legacy["old_keys"][hostname] != fp.compat_key(rec.compat_key.split("-")[0])
        assert rec.artifact_id == legacy["artifacts"][hostname]
    # a real pull of an old ref: downloaded, verified, installed
    res = pull(store, resolve_channel(store, TRT, 'prod', host.host_compat_keys(legacy['hosts']['h100'])), tmp_path / 'node')
    assert res.installed and res.artifact_id == legacy["artifacts"]["h100"]


def test_migrate_keys_is_a_dry_run_by_default_and_then_repoints_every_ref(legacy, cli):
    store = legacy["store"]
    before = channels_of(store)
    code, out, err = cli("--store", legacy["uri"], "--json", "migrate-keys")
    assert code == 0, err
    dry = json.loads(out)
    assert not dry["applied"] and len(dry["moves"]) == 5 and {m["action"] for m in dry["moves"]} == {"re-point"}
    assert channels_of(store) == before  # nothing written

    code, out, err = cli("--store", legacy["uri"], "--json", "migrate-keys", "--apply")
    assert code == 0, err
    for profile, ch, hostname in REFS:
        fp = legacy["hosts"][hostname]
        backend = "aoti" if profile == CPU else "trtllm"
        new = read_channel(store, profile, ch, fp.compat_key(backend))
        assert new is not None and new[0].artifact_id == legacy["artifacts"][hostname]
        assert new[0].action == "migrate-keys" and new[0].migrated_from == legacy["old_keys"][hostname]
        assert legacy["old_keys"][hostname] in new[0].reason
        assert read_channel(store, profile, ch, legacy["old_keys"][hostname]) is not None  # the old ref stays
        # nodes of this version now resolve the new key first
        assert resolve_channel(store, profile, ch, host.host_compat_keys(fp)).compat_key == fp.compat_key(backend)
        assert [r.seq for r in history(store, profile, ch, fp.compat_key(backend))] == [1]

    code, out, _ = cli("--store", legacy["uri"], "--json", "migrate-keys", "--apply")
    assert {m["action"] for m in json.loads(out)["moves"]} == {"already there"}  # idempotent
    assert len(channels_of(store)) == 2 * len(before)  # each old ref beside its new one


def test_an_old_artifact_promotes_and_rolls_back_under_its_new_key(legacy):
    store, ctx = legacy["store"], legacy["ctx"]
    l40s = legacy["hosts"]["l40s"]
    rec = promote.promote(ctx, legacy["artifacts"]["l40s"], "prod")  # its attestation is under the old key
    assert rec.compat_key == l40s.compat_key("trtllm") and rec.artifact_id == legacy["artifacts"]["l40s"]
    upgrade.migrate_keys(ctx, apply=True)
    h100_key = legacy["hosts"]["h100"].compat_key("trtllm")
    back = rollback(store, TRT, "prod", compat_key=h100_key, to=legacy["artifacts"]["h100"])  # served there (migrated)
    assert back.compat_key == h100_key and back.seq == 2


def test_the_fleet_plan_builds_nothing_for_nodes_an_old_artifact_serves(legacy):
    by_name = profiles.load_profiles(settings())
    assert fleet.fleet_plan(legacy["store"], by_name) == []
    node = fleet.report_node(legacy["store"], "gpu-a-1", legacy["hosts"]["h100"], [TRT])
    assert not node.compat_changed and not node.soft_changed  # schema-1 keys on record are not a change


# --- the plan ----------------------------------------------------------------------------------


def target(**fields) -> UpgradeTarget:
    return UpgradeTarget.model_validate(fields)


def states(p) -> dict[str, dict[str, str]]:
    return p.to_json()["nodes"]


def test_a_mixed_fleet_gives_the_right_plan_table(legacy):
    store, ctx = legacy["store"], legacy["ctx"]
    by_name = profiles.load_profiles(settings())
    l40s = legacy["hosts"]["l40s"]
    fleet.report_node(store, "gpu-b-1", l40s, [TRT])
    a100 = l40s.model_copy(update={"gpus": (GpuInfo(name="NVIDIA A100-SXM4-80GB", sm="8.0", memory_mib=81920),)})
    fleet.report_node(store, "gpu-c-1", a100, [TRT])

    # A driver-branch upgrade: soft for trtllm. H100 on prod: its artifact exists for the (same)
    # key but was validated on 550 -> re-check. L40S: staging only, nothing on prod, artifact
    # exists -> re-check. A100: no artifact -> build. The CPU node: aoti does not care -> ready.
    p = upgrade.plan(ctx, target(driver_version="560.35.03"), by_name)
    assert states(p) == {"gpu-a-1": {TRT: "re-check"}, "gpu-a-2": {TRT: "re-check"}, "gpu-b-1": {TRT: "re-check"},
                         "gpu-c-1": {TRT: "build"}, "cpu-1": {CPU: "ready"}}
    h100 = next(g for g in p.groups if g.nodes == ["gpu-a-1", "gpu-a-2"])
    assert h100.artifact_id == legacy["artifacts"]["h100"] and "driver_version=560.35.03" in h100.detail
    assert h100.compat_key == legacy["hosts"]["h100"].compat_key("trtllm")  # the key did not change
    rows = {(r["gpu model"], r["state"]): r["nodes"] for r in p.table()}
    assert rows == {("NVIDIA H100 80GB HBM3", "re-check"): 2, ("NVIDIA L40S", "re-check"): 1,
                    ("NVIDIA A100-SXM4-80GB", "build"): 1, ("CPU x86-64-v3", "ready"): 1}
    assert p.counts() == {"ready": 1, "re-check": 3, "build": 1}

    # A field no backend's engines depend on: every node whose channel covers it is ready.
    assert states(upgrade.plan(ctx, target(torch_version="2.8.0"), by_name, nodes_glob="gpu-a-*")) == {
        "gpu-a-1": {TRT: "ready"}, "gpu-a-2": {TRT: "ready"}}
    # A TensorRT-LLM upgrade: hard, a new key with no artifact.
    assert {s[TRT] for n, s in states(upgrade.plan(ctx, target(tensorrt_llm_version="1.2.2"), by_name)).items()
            if n.startswith("gpu")} == {"build"}
    # A key no worker serves is blocked, naming its queue.
    served = {legacy["hosts"]["h100"].compat_key("trtllm")}
    blocked = upgrade.plan(ctx, target(driver_version="560.35.03"), by_name, served=served)
    c = next(g for g in blocked.groups if g.nodes == ["gpu-c-1"])
    assert c.state == "blocked" and f"no worker serves queue {a100.compat_key('trtllm')}" in c.detail
    # #48 item 13: a re-check goes to the queue of its key and the projected soft values, which only a
    # worker that has them polls: a worker of the key alone would vouch for a driver it does not run.
    h100_key = legacy["hosts"]["h100"].compat_key("trtllm")
    soft_queue = fleet.recheck_queue_for(h100_key, h100.projected.soft_fields("trtllm"))
    assert h100.queue == soft_queue and h100.to_json()["queue"] == soft_queue
    a1 = next(g for g in blocked.groups if g.nodes == ["gpu-a-1", "gpu-a-2"])
    assert a1.state == "blocked" and f"no worker serves queue {soft_queue} (needed to re-check)" in a1.detail
    assert a1.queue == soft_queue and "driver_version=560.35.03" in a1.detail
    served_soft = upgrade.plan(ctx, target(driver_version="560.35.03"), by_name, served=served | {soft_queue})
    assert states(served_soft)["gpu-a-1"] == {TRT: "re-check"}
    # Below a floor: CUDA 12 needs a 525 driver.
    low = upgrade.plan(ctx, target(driver_version="520.61.05"), by_name, nodes_glob="gpu-a-1")
    assert low.groups[0].state == "blocked" and "CUDA 12 needs driver >= 525.60.13" in low.groups[0].detail


def test_a_staging_artifact_that_covers_the_target_is_to_promote(legacy):
    by_name = profiles.load_profiles(settings())
    fleet.report_node(legacy["store"], "gpu-b-1", legacy["hosts"]["l40s"], [TRT])
    p = upgrade.plan(legacy["ctx"], target(torch_version="2.8.0"), by_name, nodes_glob="gpu-b-*")
    (g,) = p.groups
    assert g.state == "promote" and f"buildctl promote {legacy['artifacts']['l40s']} --channel prod" in g.detail
    assert upgrade.plan(legacy["ctx"], target(torch_version="2.8.0"), by_name, nodes_glob="gpu-b-*",
                        channel="staging").groups[0].state == "ready"


# --- the CLI: exit codes and bad input ---------------------------------------------------------


def write_target(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "target.yaml"
    f.write_text(text)
    return f


def test_upgrade_ready_gives_its_exit_codes(legacy, cli, tmp_path):
    soft = write_target(tmp_path, 'driver_version: "560.35.03"\n')
    same = tmp_path / "same.yaml"
    same.write_text("torch_version: 2.8.0\n")
    base = ("--store", legacy["uri"])
    code, out, err = cli(*base, "upgrade", "ready", "--node", "gpu-a-1", "--to", same)
    assert code == 0, err
    assert f"gpu-a-1 {TRT}: ready" in out
    code, out, err = cli(*base, "upgrade", "ready", "--node", "gpu-a-1", "--to", soft)
    assert code == 5 and "not ready for the upgrade" in err and "re-check" in err
    code, out, err = cli(*base, "--json", "upgrade", "ready", "--node", "gpu-a-1", "--to", soft)
    assert code == 5 and json.loads(out)["ready"] is False
    code, _, err = cli(*base, "upgrade", "ready", "--node", "no-such-node", "--to", soft)
    assert code == 3 and "no-such-node" in err


@pytest.mark.parametrize("text,named", [
    ('driver_verison: "580.65.06"\n', "driver_verison"),
    ("cpu: {isa: x86-64-v3}\n", "cpu.isa"),
    ("gpus: 3\n", "gpus"),
    ("- a list\n", "not a mapping"),
])
def test_a_target_with_an_unknown_field_exits_2_naming_it(legacy, cli, tmp_path, text, named):
    f = write_target(tmp_path, text)
    code, _, err = cli("--store", legacy["uri"], "upgrade", "plan", "--to", f)
    assert code == 2 and named in err and "invalid upgrade target" in err


def test_upgrade_plan_prints_the_table_and_json(legacy, cli, tmp_path):
    f = write_target(tmp_path, 'driver_version: "560.35.03"\n')
    code, out, err = cli("--store", legacy["uri"], "upgrade", "plan", "--to", f)
    assert code == 0, err
    assert "re-check" in out and "NVIDIA H100 80GB HBM3" in out and "2 re-check" in out
    code, out, _ = cli("--store", legacy["uri"], "--json", "upgrade", "plan", "--to", f, "--channel", "staging")
    data = json.loads(out)
    assert data["channel"] == "staging" and data["target"] == {"driver_version": "560.35.03"}
    assert data["nodes"]["cpu-1"] == {CPU: "ready"}


def test_profiles_are_the_repositorys():
    assert (PROFILES / f"{TRT}.yaml").is_file() and (PROFILES / f"{CPU}.yaml").is_file()


# --- prepare on the tiny profile: a soft change re-checks, a failed re-check rebuilds, a hard
# change builds (fingerprint files stand in for the host after the upgrade) ----------------------


@pytest.fixture
def tiny_fleet(tiny_build, quick_profiles, tmp_path, monkeypatch):
    """A fresh store with the tiny engine on prod, validated (an attestation) on this host as it
    is, and two nodes of this host reporting; the profile directory validates in seconds."""
    from buildctl.artifact_store.promotion import promote
    from buildctl.engines.fingerprint import detect

    from ..support.helpers import write_attestation

    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(quick_profiles))
    store = open_store(f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("BUILDCTL_STORE", store.uri)
    here = detect()
    ctx = Context.from_settings(settings(), store=store)
    res = build.import_engine(ctx, tiny_build["engine"], tiny_build["profile"], here,
                                 model_digest=tiny_build["outcome"].model_digest)
    write_attestation(store, res.artifact_id, here.compat_key("aoti"), "pass", validator=here)
    promote(store, staged(store, res.artifact_id), "prod")
    for node in ("cpu-1", "cpu-2"):
        fleet.report_node(store, node, here, [CPU])
    return {"store": store, "ctx": ctx, "here": here, "artifact": res.artifact_id, "tmp": tmp_path,
            "profiles": profiles.load_profiles(settings())}


def host_file(tmp_path: Path, fp: Fingerprint, monkeypatch) -> Fingerprint:
    f = tmp_path / "host-after.json"
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
    return fp


@pytest.mark.slow  # a real aoti build and a validation against vLLM: end to end
def test_a_soft_change_rechecks_and_passes_with_no_build(tiny_fleet, monkeypatch):
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.artifact_store.read import list_artifacts

    t = tiny_fleet
    soft = target(compiler_version="gcc 13.2.0")  # soft for aoti: the package needs the C++ runtime only
    after = host_file(t["tmp"], soft.apply(t["here"]), monkeypatch)
    assert after.compat_key("aoti") == t["here"].compat_key("aoti")
    ctx = Context.from_settings(settings(), store=t["store"])
    assert states(upgrade.plan(ctx, soft, t["profiles"])) == {"cpu-1": {CPU: "re-check"}, "cpu-2": {CPU: "re-check"}}
    done, after_plan = upgrade.prepare(ctx, soft, t["profiles"])
    assert [(d.action, d.artifact_id) for d in done] == [("re-checked", t["artifact"])]
    assert len(list_artifacts(t["store"])) == 1  # no build
    atts = [a.attestation for a in list_attestations(t["store"], t["artifact"])]
    assert len(atts) == 2 and atts[-1].passed and atts[-1].validator_fingerprint["compiler_version"] == "gcc 13.2.0"
    assert after_plan.counts() == {"ready": 2}
    upgrade.ready(ctx, "cpu-1", soft, t["profiles"])  # the gate opens
    prod = read_channel(t["store"], CPU, "prod", t["here"].compat_key("aoti"))[0]
    assert prod.seq == 1 and prod.artifact_id == t["artifact"]  # a re-check moves no channel


def passing_then(verdicts: list[str], store, validator):
    """``validate`` as prepare calls it, judged by ``verdicts`` in turn (the validator itself is
    tested in tests/validators): each call writes an attestation of the next verdict for the
    artifact, made on ``validator``, and raises like the real one on a fail."""
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.validators.errors import verdict_error

    from ..support.helpers import write_attestation

    calls = []

    def judge(ctx, aid, *, fingerprint=None, say=None, **_):
        verdict = verdicts[len(calls)]
        calls.append(aid)
        att_id = write_attestation(store, aid, validator.compat_key("aoti"), verdict, validator=validator)
        stored = next(a for a in list_attestations(store, aid) if a.attestation_id == att_id)
        if verdict != "pass":
            raise verdict_error(aid, att_id, stored.attestation)
        return stored

    return judge, calls


@pytest.mark.slow
def test_a_recheck_that_fails_rebuilds_and_a_hard_change_builds(tiny_fleet, monkeypatch):
    from buildctl.artifact_store.read import get_manifest, list_artifacts
    from buildctl.engines.buildkey import build_key_for

    t = tiny_fleet
    soft = target(compiler_version="gcc 13.2.0")
    after = host_file(t["tmp"], soft.apply(t["here"]), monkeypatch)
    judge, calls = passing_then(["fail", "pass"], t["store"], after)
    monkeypatch.setattr(upgrade, "validate", judge)
    ctx = Context.from_settings(settings(), store=t["store"])
    done, plan_after = upgrade.prepare(ctx, soft, t["profiles"])
    (d,) = done
    assert d.action == "rebuilt" and d.artifact_id != t["artifact"] and "re-check failed" in d.detail
    assert calls == [t["artifact"], d.artifact_id]
    m = get_manifest(t["store"], d.artifact_id)
    profile = t["profiles"][CPU]
    assert m.build_key == build_key_for(profile, m.model_digest, after, rebuild=True) != build_key_for(
        profile, m.model_digest, after)
    assert read_channel(t["store"], CPU, "staging", after.compat_key("aoti"))[0].artifact_id == d.artifact_id
    assert d.promote_commands == [f"buildctl promote {d.artifact_id} --channel prod"]  # prod stays CI's
    assert plan_after.counts() == {"promote": 2}
    assert len(list_artifacts(t["store"])) == 2

    hard = target(torch_version="2.99.0")  # hard for aoti: a new key with no artifact
    newer = host_file(t["tmp"], hard.apply(t["here"]), monkeypatch)
    judge, calls = passing_then(["pass"], t["store"], newer)
    monkeypatch.setattr(upgrade, "validate", judge)
    assert {s[CPU] for s in states(upgrade.plan(ctx, hard, t["profiles"])).values()} == {"build"}
    done, plan_after = upgrade.prepare(ctx, hard, t["profiles"], channel="staging")
    (d,) = done
    assert d.action == "built" and d.compat_key == newer.compat_key("aoti") and "built in" in d.detail
    assert plan_after.counts() == {"ready": 2}


# --- served models: swap, fallback or idle per node group ----------------------------------------


def served_fleet(tmp_path, engine_for_new: bool, bundle_for_new: bool):
    """Three nodes on the old host that serve the tiny Llama's engine; the upgrade moves them to
    the new host. The engine was built (600 s, provenance) and validated for the old key; the bundle
    and the engine for the new key as asked."""
    from .test_runtimes import BUNDLE, ENGINE, NEW, OLD, Fleet
    from ..support.helpers import write_build_provenance
    from buildctl.core.times import now_utc
    from datetime import timedelta

    f = Fleet(tmp_path)
    t0 = now_utc()
    old = f.publish(ENGINE, OLD)
    write_build_provenance(f.store, old, started_on=t0.isoformat(), finished_on=(t0 + timedelta(seconds=600)).isoformat())
    if engine_for_new:
        f.publish(ENGINE, NEW)
    if bundle_for_new:
        f.publish(BUNDLE, NEW)
    for n in ("n1", "n2", "n3"):
        fleet.report_node(f.store, n, OLD, [ENGINE])
    target = UpgradeTarget(torch_version=NEW.torch_version)
    return f, upgrade.plan(f.ctx, target, profiles.load_profiles(settings()), channel="staging")


@pytest.mark.parametrize("engine, bundle, outcome, runtime", [
    (True, True, "swap", "tiny-llama-cpu"),
    (False, True, "fallback", "tiny-llama-vllm-cpu"),
    (False, False, "idle", None),
])
def test_a_served_models_node_group_swaps_falls_back_or_idles_with_its_node_minutes(tmp_path, engine, bundle,
                                                                                      outcome, runtime):
    _, p = served_fleet(tmp_path, engine, bundle)
    [s] = p.served
    assert (s.model, s.outcome, s.runtime, sorted(s.group.nodes)) == ("tiny-llama", outcome, runtime, ["n1", "n2", "n3"])
    swap = upgrade.SWAP_MINUTES
    if outcome == "swap":
        assert s.node_minutes_without == pytest.approx(3 * swap) and s.node_minutes_on_fallback == 0
        return
    # the engine is a build for the new key: the last build (600 s, provenance) and validation (1 s) on record
    assert s.group.state == "build" and s.ready_minutes == pytest.approx((600 + 1) / 60)
    if outcome == "fallback":
        assert s.node_minutes_without == pytest.approx(3 * 2 * swap)
        assert s.node_minutes_on_fallback == pytest.approx(3 * 601 / 60)
    else:
        assert s.node_minutes_without == pytest.approx(3 * (601 / 60 + swap))
        assert "no fallback is ready" in s.detail and "tiny-llama-vllm-cpu: build" in s.detail
    j = p.to_json()["served"][0]
    assert j["outcome"] == outcome and j["node_minutes_without_runtime"] == round(s.node_minutes_without, 2)


def test_a_bundle_without_cross_runtime_parity_is_no_fallback_in_the_plan(tmp_path):
    from .test_runtimes import BUNDLE, NEW

    f, _ = served_fleet(tmp_path, False, False)
    f.publish(BUNDLE, NEW, cross=[])
    [s] = upgrade.plan(f.ctx, UpgradeTarget(torch_version=NEW.torch_version), profiles.load_profiles(settings()),
                       channel="staging").served
    assert s.outcome == "idle" and "records no parity with tiny-llama-cpu" in s.detail


def test_upgrade_plan_prints_the_served_model_table(tmp_path, cli, monkeypatch):
    from .test_runtimes import NEW

    f, _ = served_fleet(tmp_path, False, True)
    target = tmp_path / "target.yaml"
    target.write_text(f"torch_version: '{NEW.torch_version}'\n")
    monkeypatch.setenv("BUILDCTL_STORE", f.store.uri)
    code, out, err = cli("upgrade", "plan", "--to", target, "--channel", "staging")
    assert code == 0, err
    assert "served models" in out and "fallback" in out and "tiny-llama-vllm-cpu" in out


@pytest.mark.parametrize("engine, bundle, outcome", [(True, True, "swap"), (False, True, "fallback"),
                                                      (False, False, "idle")])
def test_one_upgraded_nodes_outcome_is_its_groups_in_the_plan(tmp_path, engine, bundle, outcome, monkeypatch):
    """The driver-upgrade flow's step (node_outcomes) decides as upgrade plan does for its group."""
    import logging

    from .test_runtimes import NEW
    from buildctl.flows.on_driver_upgrade import _served_outcomes
    from buildctl.flows.summary import RunReport

    f, p = served_fleet(tmp_path, engine, bundle)
    known = profiles.load_profiles(settings())
    # the node serves only the engine's profile: the bundle counts all the same
    [one], problems = upgrade.node_outcomes(f.ctx, "n1", NEW, known, ["tiny-llama-cpu"], channel="staging")
    [group] = p.served
    assert problems == [] and (one.outcome, one.runtime, one.group.nodes) == (group.outcome, group.runtime, ["n1"])
    assert one.outcome == outcome
    report = RunReport(title="t")
    monkeypatch.setattr("buildctl.flows.on_driver_upgrade.DEFAULT_CHANNEL", "staging")  # the fleet here is on staging
    _served_outcomes(report, logging.getLogger("t"), f.ctx, "n1", NEW, known, ["tiny-llama-cpu"])
    [(key, line)] = report.rows
    assert key == "serves tiny-llama" and line.startswith(f"{outcome} on staging: ")
    assert {"swap": "swaps to it", "fallback": "moves it to tiny-llama-vllm-cpu now, and back to tiny-llama-cpu",
            "idle": "nothing to serve until tiny-llama-cpu is rebuilt"}[outcome] in line
