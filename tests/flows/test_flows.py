"""Prefect flows against a real Prefect API (prefect_test_harness), on the real tiny pipeline."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import yaml
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.read import get_manifest, list_artifacts
from buildctl.artifact_store.channels import ChannelMove, read_channel

from ..support.helpers import REPO, settings, staged

pytestmark = pytest.mark.slow


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # flows find build_profiles/<name>.yaml relative to the checkout


def run_async(coro):
    return asyncio.run(coro)


def ensure_limit(name: str, limit: int) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    async def go():
        async with get_client() as c:
            try:
                await c.delete_global_concurrency_limit_by_name(name)
            except Exception:
                pass
            await c.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))

    run_async(go())


def wait_events(prefix: str, want: int = 1, timeout: float = 120) -> list[dict]:
    """The events whose name starts with ``prefix`` on the test API, once ``want`` have arrived
    (the server persists them in batches)."""
    import json
    import urllib.request

    from prefect.settings import PREFECT_API_URL

    deadline = time.monotonic() + timeout
    got: list[dict] = []
    while time.monotonic() < deadline:
        req = urllib.request.Request(PREFECT_API_URL.value() + "/events/filter", method="POST",
                                     data=json.dumps({"filter": {"event": {"prefix": [prefix]}}, "limit": 50}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            got = json.loads(r.read())["events"]
        if len(got) >= want:
            return got
        time.sleep(0.5)
    return got


def run_logs(flow_run_id) -> list[str]:
    """The messages a flow run logged to the test API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def go():
        async with get_client() as c:
            return await c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))

    deadline = time.monotonic() + 30  # logs reach the API in batches
    while not (got := [log.message for log in run_async(go())]) or not any("Finished in state" in m for m in got):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return got


def read_artifact(key: str):
    from prefect.artifacts import Artifact

    return Artifact.get(key)


def test_build_validate_publish_end_to_end_then_cache_hit(prefect_api, in_repo, quick_profiles, tmp_path, monkeypatch):
    from buildctl.flows.common import artifact_key
    from buildctl.flows.build_validate_publish import build_validate_publish

    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(quick_profiles))  # the flow, not the speed gate, is tested here
    monkeypatch.setenv("BUILDCTL_BUILD_LIMIT", "test-builds")
    ensure_limit("test-builds", 1)
    store = "file://" + str(tmp_path / "store")
    first = build_validate_publish(profile="tiny-llama-cpu", store=store, promote_to="staging")
    assert not first["cache_hit"] and first["verdict"] == "pass" and first["promoted"]["channel"] == "staging"
    key = artifact_key("bvp", "tiny-llama-cpu", first["compat_key"][:24])
    table = read_artifact(key + "-validation")
    summary = read_artifact(key + "-summary")
    assert table is not None and "output tok/s @ c=4" in str(table.data) and "interval" in str(table.data)
    assert first["attestation_id"] in table.description  # the table names its attestation
    md = summary.data
    assert summary is not None and first["artifact_id"] in md and "| field | value |" in md
    assert "| build | built in " in md and "torch" in md and first["attestation_id"] in md
    assert "| trigger | started by hand" in md and "| promoted | `staging` #" in md
    assert f"buildctl promote {first['artifact_id']} --channel prod" in md
    log = read_artifact(key + "-build-log").data  # #30: the build log, on the run's page
    assert "in the store with the artifact: `file://" in log and "/blobs/" in log and "Last lines:" in log
    assert len(log.split("Last lines:")[1].strip("`\n ")) > 0  # the build's own output
    second = build_validate_publish(profile="tiny-llama-cpu", store=store)
    assert second["cache_hit"] and second["artifact_id"] == first["artifact_id"] and second["attestation_reused"]
    md = read_artifact(key + "-summary").data
    assert "cache hit, no builder ran (built " in md and "validated earlier and reused: not re-run" in md
    assert "reused from an earlier validation" in read_artifact(key + "-validation").description


def test_production_channels_are_refused_by_the_flow(prefect_api, in_repo):
    from buildctl.flows.build_validate_publish import build_validate_publish

    from prefect.exceptions import ParameterTypeError

    from buildctl.core.errors import BadInputError
    from buildctl.steps.promote import check_automatic_promotion

    with pytest.raises(ParameterTypeError, match="promote_to"):  # refused by its type, before the run starts
        build_validate_publish(profile="tiny-llama-cpu", promote_to="prod")
    with pytest.raises(BadInputError):  # and by the step itself, whoever calls it
        check_automatic_promotion("prod")


def test_build_slots_honour_the_limit_and_are_strict(prefect_api, monkeypatch):
    from prefect import flow

    from buildctl.flows.build_validate_publish import build_slot

    monkeypatch.setenv("BUILDCTL_BUILD_LIMIT", "slot-test")
    ensure_limit("slot-test", 1)
    spans: list[tuple[float, float]] = []

    def hold():
        with build_slot(settings()):
            start = time.monotonic()
            time.sleep(0.6)
            spans.append((start, time.monotonic()))

    @flow
    def two_builds():
        threads = [threading.Thread(target=hold) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    two_builds()
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1 - 0.05, f"builds overlapped: {spans}"
    monkeypatch.setenv("BUILDCTL_BUILD_LIMIT", "no-such-limit")
    with pytest.raises(Exception) as exc:
        with build_slot(settings()):
            pass
    assert "no-such-limit" in str(exc.value) or "not found" in str(exc.value).lower()


def test_driver_upgrade_trigger_creates_a_run_with_mapped_parameters(prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.events import DeploymentEventTrigger

    from buildctl.engines.fingerprint import detect
    from buildctl.flows.events import emit_driver_upgraded
    from buildctl.flows.on_driver_upgrade import on_driver_upgrade

    spec = next(d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
                if d["name"] == "on-driver-upgrade")
    trig = spec["triggers"][0]
    trigger = DeploymentEventTrigger(expect=set(trig["expect"]), match=trig["match"], parameters=trig["parameters"])
    deployment_id = on_driver_upgrade.to_deployment(name="on-driver-upgrade", triggers=[trigger]).apply()
    time.sleep(2)  # the automation is loaded by the server's triggers service
    fp = detect().model_dump(mode="json")
    emit_driver_upgraded("gpu-node-7", {"node_id": "gpu-node-7", "old_fingerprint": None, "new_fingerprint": fp,
                                        "profiles": ["tiny-llama-cpu"]})

    async def runs():
        async with get_client() as c:
            from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

            return await c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))

    deadline = time.monotonic() + 30
    found = []
    while time.monotonic() < deadline and not found:
        found = run_async(runs())
        time.sleep(0.5)
    assert found, "the event did not create a flow run"
    params = found[0].parameters
    assert params["node_id"] == "gpu-node-7" and params["profiles"] == ["tiny-llama-cpu"]
    assert params["fingerprint"] == fp  # templated parameters arrive typed


def test_scrub_store_flow_quarantines_and_emits_an_event_per_corrupt_artifact(prefect_api, tmp_path, draft):
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.flows.scrub_store import scrub_store
    from buildctl.artifact_store.quarantine import active_quarantine

    from ..support.helpers import make_tree, rot

    uri = "file://" + str(tmp_path / "store")
    store = open_store(uri)
    ids = [publish_tree(store, make_tree(tmp_path / f"t{i}", {"rank0.engine": 20_000}, seed=i), draft).artifact_id
           for i in range(3)]
    digest = get_manifest(store, ids[1]).files[0].digest
    rot(store, digest, "flip")
    state = scrub_store(store=uri, return_state=True)
    assert state.is_failed() and ids[1] in state.message, state.message  # #30: it used to end Completed
    logs = run_logs(state.state_details.flow_run_id)
    assert any(ids[1] in m for m in logs) and not any("Traceback" in m for m in logs), logs  # the cause, in one line
    assert active_quarantine(store, ids[1]) is not None and active_quarantine(store, ids[0]) is None
    rows = read_artifact("scrub-store").data  # the whole scrub ran before the run failed
    assert all(i in str(rows) for i in ids) and "corrupt" in str(rows)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (mine := [e for e in wait_events("buildctl.artifact.corrupted")
                                                        if e["resource"]["prefect.resource.name"] in ids]):
        time.sleep(0.5)
    assert [e["resource"]["prefect.resource.name"] for e in mine] == [ids[1]]
    result = scrub_store(store=uri)  # quarantined now: nothing new is corrupt, the run completes
    assert result["corrupt"] == [] and {r["status"] for r in result["rows"]} == {"ok", "quarantined"}


@pytest.mark.parametrize("second", ["pass", "inconclusive", "fail"])
def test_an_inconclusive_validation_is_retried_once_with_double_the_budget(prefect_api, in_repo, tiny_build,
                                                                          monkeypatch, second):
    """The flow's retry rule, with the validation child replaced by recorded verdicts (the real
    child's inconclusive path is tested in test_validate). Each verdict emits its own event, with
    the verdict as a resource label (#30: an inconclusive one emitted `validated`), and a pass
    also `promotable`, naming the next channel."""
    import buildctl.flows.build_validate_publish as fp
    from buildctl.steps.validate_process import ValidationOutcome
    from buildctl.core.errors import BuildctlError
    from buildctl.validators.errors import ValidationInconclusiveError

    from ..support.helpers import attestation

    calls = []

    def fake_child(settings, artifact_id, *, speed_budget=1.0, **_):
        calls.append(speed_budget)
        verdict = "inconclusive" if len(calls) == 1 else second
        return ValidationOutcome(f"att-{len(calls)}", attestation(artifact_id, "ck", verdict))

    monkeypatch.setattr(fp, "validate_in_subprocess", fake_child)
    state = fp.build_validate_publish(profile="tiny-llama-cpu", store=tiny_build["uri"], revalidate=True,
                                      return_state=True)
    if second == "pass":
        out = state.result()
        assert out["verdict"] == "pass" and out["attestation_id"] == "att-2"
    else:
        assert state.is_failed()
        with pytest.raises(ValidationInconclusiveError if second == "inconclusive" else BuildctlError):
            state.result()
    assert calls == [1.0, 2.0]  # once, then once more with twice the budget; never a third time
    run = f"prefect.flow-run.{state.state_details.flow_run_id}"
    want = {"pass": ["buildctl.artifact.promotable", "buildctl.artifact.validated"],
            "inconclusive": ["buildctl.artifact.inconclusive"],
            "fail": ["buildctl.artifact.validation-failed"]}[second]
    deadline = time.monotonic() + 60
    mine: list = []
    while time.monotonic() < deadline and len(mine) < len(want):
        mine = [e for e in wait_events("buildctl.artifact.", 0)
                if any(r["prefect.resource.id"] == run for r in e["related"])]
        time.sleep(0.5)
    assert sorted(e["event"] for e in mine) == want, [e["event"] for e in mine]
    assert {e["resource"]["buildctl.verdict"] for e in mine} == {second}
    if second == "pass":
        (promotable,) = [e for e in mine if e["event"].endswith("promotable")]
        assert promotable["resource"]["buildctl.next-channel"] == "staging"  # on no channel yet


def test_prefect_deploy_never_prompts_for_schedules():
    """Prefect's own `prefect deploy` step, as in an interactive terminal: a deployment without a
    `schedules` key is asked about schedules; every deployment in prefect.yaml states them."""
    from prefect.cli.deploy._schedules import _construct_schedules

    class NoPrompts:
        def __getattr__(self, name):
            raise AssertionError(f"prefect deploy would prompt (console.{name})")

    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    assert len(deployments) == 9
    for d in deployments:
        assert "schedules" in d, f"{d['name']}: no schedules key, so `prefect deploy` asks"
        got = _construct_schedules(d, {}, console=NoPrompts(), is_interactive=lambda: True)
        assert len(got) == len(d["schedules"])
    # the check bites: with no key, Prefect asks (on our console, or on stdin, which pytest refuses)
    with pytest.raises((AssertionError, OSError), match="would prompt|reading from stdin"):
        _construct_schedules({"name": "x"}, {}, console=NoPrompts(), is_interactive=lambda: True)


def test_a_failed_run_has_a_summary_with_the_cause_and_a_readable_name(prefect_api, in_repo, tmp_path, monkeypatch):
    """A mistyped profile is refused by the parameter's type before the run starts (#30); a
    profile the worker's profile directory lacks fails in the run, with a summary naming it."""
    import shutil

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ParameterTypeError

    from buildctl.engines.errors import ProfileNotFoundError
    from buildctl.flows.common import artifact_key
    from buildctl.flows.build_validate_publish import build_validate_publish

    from ..support.helpers import PROFILES

    with pytest.raises(ParameterTypeError, match="profile"):
        build_validate_publish(profile="no-such-profile")
    only = tmp_path / "profiles"
    only.mkdir()
    shutil.copy(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml", only)
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(only))  # this worker has one profile, not the one asked for
    state = build_validate_publish(profile="tiny-llama-cpu", return_state=True)
    assert state.is_failed()
    with pytest.raises(ProfileNotFoundError) as exc:
        state.result()
    assert "profiles that exist: llama-3-8b-instruct-fp8-tp1" in str(exc.value)
    md = read_artifact(artifact_key("bvp", "tiny-llama-cpu", "this-host") + "-summary").data
    assert "**FAILED at step `plan`:**" in md and "build profile not found" in md and "Traceback" not in md
    assert "`ProfileNotFoundError`" in md and "run again with profile one of: llama-3-8b" in md

    async def name():
        async with get_client() as c:
            return (await c.read_flow_run(state.state_details.flow_run_id)).name

    assert run_async(name()) == "tiny-llama-cpu@this-host by hand"


def test_rollout_channel_flow_takes_a_healthy_rollout_to_100_percent(prefect_api, tmp_path, draft):
    """Simulated nodes pull between runs of the rollout-channel flow: each run advances one wave
    (bake 0, no failures) until the last completes; a second rollout whose canary fails is halted
    by the flow and the channel rolled back."""
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.flows.common import artifact_key
    from buildctl.flows.rollout_channel import rollout_channel
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import history, read_channel
    from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves, wave_bucket

    from ..steps.test_rollouts import PROFILE, Fleet, publish

    store = open_store("file://" + str(tmp_path / "store"))
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    fleet = Fleet(store, tmp_path, 20)
    promote(store, staged(store, v1), "prod")
    fleet.pull_all()
    promote(store, staged(store, v2), "prod",
            move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("5,30,100", "0"), bake_s=0)))
    decisions, shares = [], []
    for _ in range(5):
        assert fleet.pull_all() == {}
        shares.append(sum(a == v2 for a in fleet.current().values()) / len(fleet.ids))
        (view,) = rollout_channel(channel="prod", store=store.uri)
        decisions.append(view["decision"])
        if view["decision"] == "complete":
            break
    assert decisions == ["advance", "advance", "complete"]
    assert shares[0] <= shares[1] <= shares[2] == 1.0 and shares[0] < 1.0
    recs = history(store, PROFILE, "prod", draft.compat_key)
    assert [r.action for r in recs] == ["promote", "promote", "advance", "advance", "complete"]
    assert recs[-1].rollout.state == "completed" and recs[-1].artifact_id == v2
    assert fleet.pull_all() == {} and set(fleet.current().values()) == {v2}
    table = read_artifact(artifact_key("rollout", "prod"))
    assert table is not None and "complete" in str(table.data)

    bad = publish(store, tmp_path, "bad", draft, broken=True)
    promote(store, staged(store, bad), "prod",
            move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("30,100", "0"), bake_s=0)))
    canaries = sorted(n for n in fleet.ids if wave_bucket(PROFILE, "prod", n) < 30)
    assert sorted(fleet.pull_all()) == canaries
    (view,) = rollout_channel(channel="prod", store=store.uri)
    assert view["decision"] == "halt" and view["applied_seq"] is not None
    now = read_channel(store, PROFILE, "prod", draft.compat_key)[0]
    assert now.artifact_id == v2 and now.action == "rollback" and list(now.rollout.failed_nodes) == canaries


def test_rollout_channel_runs_every_five_minutes_only_while_a_rollout_is_live(prefect_api, tmp_path, draft,
                                                                             monkeypatch):
    """#50: a quiet rollout-channel. Deployed with prefect.yaml's schedules (as flows.serve does),
    a run that finds no live rollout turns the 5-minute schedule off (the hourly sweep stays), a
    run during one turns it back on, and a run for one profile leaves it alone."""
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves
    from buildctl.flows.rollout_channel import WHILE_ROLLING_OUT, rollout_channel
    from buildctl.flows.setup import deployment_schedules
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.steps.rollouts import rollout_step
    from prefect.client.orchestration import get_client

    from ..steps.test_rollouts import PROFILE, Fleet, publish

    dep_id = rollout_channel.to_deployment(name="rollout-channel", parameters={"channel": "prod"},
                                           schedules=deployment_schedules("rollout-channel")).apply()
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", str(dep_id))

    def active() -> dict[str, bool]:
        with get_client(sync_client=True) as client:
            return {s.slug: s.active for s in client.read_deployment(dep_id).schedules}

    assert active() == {WHILE_ROLLING_OUT: True, "hourly-sweep": True}  # as deployed
    store = open_store("file://" + str(tmp_path / "store"))
    v1, v2 = publish(store, tmp_path, "v1", draft), publish(store, tmp_path, "v2", draft)
    fleet = Fleet(store, tmp_path, 4)
    promote(store, staged(store, v1), "prod")
    fleet.pull_all()
    assert rollout_channel(channel="prod", store=store.uri) == []
    assert active() == {WHILE_ROLLING_OUT: False, "hourly-sweep": True}  # nothing live: quiet
    promote(store, staged(store, v2), "prod",
            move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("50,100", "0"), bake_s=3600)))
    rollout_channel(channel="prod", store=store.uri, profile=PROFILE)
    assert active()[WHILE_ROLLING_OUT] is False  # one profile's run does not know the others'
    (view,) = rollout_channel(channel="prod", store=store.uri)
    assert view["decision"] == "wait" and active()[WHILE_ROLLING_OUT] is True  # live: every 5 minutes
    rollout_step(store, PROFILE, "prod", draft.compat_key, "abort", auth=Authority(who="test"), reason="test")
    assert rollout_channel(channel="prod", store=store.uri) == []
    assert active()[WHILE_ROLLING_OUT] is False


def test_resign_channels_flow_re_signs_what_is_due(prefect_api, tmp_path, draft, monkeypatch):
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.flows.resign_channels import resign_channels
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.artifact_store.trust.signing import generate, load_signing_key

    from ..steps.test_rollouts import publish

    store = open_store("file://" + str(tmp_path / "store"))
    a = publish(store, tmp_path, "a", draft)
    promote(store, staged(store, a), "prod")  # unsigned: no expiry, so due
    monkeypatch.delenv("BUILDCTL_SIGNING_KEY", raising=False)
    with pytest.raises(StoreArgumentError, match="needs a signing key"):
        resign_channels(store=store.uri)
    key, _, key_id = generate(tmp_path / "keys", "ci")
    monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(key))
    got = next(g for g in resign_channels(store=store.uri) if g["channel"] == "prod")  # staging's is due too
    assert got["seq"] == 2 and got["expires"]
    rec = read_channel(store, draft.profile_name, "prod", draft.compat_key)[0]
    assert rec.signature["key_id"] == key_id == load_signing_key(key).key_id and rec.action == "resign"
    assert resign_channels(store=store.uri) == []  # a week of validity left: nothing due


def test_gc_store_flow_publishes_the_dry_run_then_removes(prefect_api, tmp_path, draft):
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.flows.gc_store import gc_store
    from buildctl.artifact_store.backends.store import open_store

    from ..steps.test_rollouts import publish

    store = open_store("file://" + str(tmp_path / "store"))
    old, new = publish(store, tmp_path, "old", draft), publish(store, tmp_path, "new", draft)
    promote(store, staged(store, new), "prod")
    planned = gc_store(store=store.uri, keep=0, keep_history=0, grace_s=0, dry_run_only=True)
    assert planned["planned"] == [old] and get_manifest(store, old)  # a dry run removes nothing
    plan = read_artifact("gc-store-plan")
    rows = {r["artifact"]: r for r in plan.data} if isinstance(plan.data, list) else None
    assert plan is not None and old in str(plan.data) and "channel prod #1 points at it" in str(plan.data), rows
    done = gc_store(store=store.uri, keep=0, keep_history=0, grace_s=0)
    assert done["removed"] == [old] and [a for a, _ in list_artifacts(store)] == [new]
    assert "removed **1** artifacts" in read_artifact("gc-store-result").data


def test_served_deployments_get_the_triggers_of_prefect_yaml():
    """``flows.serve`` reads each deployment's triggers from the repository's prefect.yaml (found
    from the package's own location, which moved once and lost it)."""
    from buildctl.flows.setup import deployment_triggers

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    with_triggers = {d["name"]: len(d["triggers"]) for d in spec if d.get("triggers")}
    assert {"on-driver-upgrade", "heal-artifact", "rollout-channel"} <= set(with_triggers)
    for name, n in with_triggers.items():
        got = deployment_triggers(name)
        assert len(got) == n and all(t.expect for t in got), name


def test_a_cache_hit_on_new_soft_values_is_rechecked_not_rebuilt(prefect_api, in_repo, quick_profiles, tiny_build,
                                                                  tmp_path, monkeypatch):
    """The worker's compiler changed (soft for aoti): the build key is the same, so the run takes
    the cache hit, sees the artifact is not validated on these soft values and re-checks it; the
    summary says so and no builder runs."""
    import json

    from buildctl.steps import build
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.read import list_artifacts
    from buildctl.steps.context import Context
    from buildctl.engines.fingerprint import detect
    from buildctl.flows.build_validate_publish import build_validate_publish
    from buildctl.flows.common import artifact_key

    from ..support.helpers import write_attestation

    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(quick_profiles))
    monkeypatch.setenv("BUILDCTL_BUILD_LIMIT", "test-builds")
    ensure_limit("test-builds", 1)
    store = open_store("file://" + str(tmp_path / "store"))
    here = detect()
    res = build.import_engine(Context.from_settings(settings(), store=store), tiny_build["engine"],
                                 tiny_build["profile"], here, model_digest=tiny_build["outcome"].model_digest)
    write_attestation(store, res.artifact_id, here.compat_key("aoti"), "pass", validator=here)
    after = here.model_copy(update={"compiler_version": "gcc 13.2.0"})
    f = tmp_path / "after.json"
    f.write_text(json.dumps(after.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
    out = build_validate_publish(profile="tiny-llama-cpu", store=store.uri)
    assert out["cache_hit"] and out["rechecked"] and out["recheck_passed"] and out["artifact_id"] == res.artifact_id
    assert not out["attestation_reused"] and len(list_artifacts(store)) == 1
    atts = list_attestations(store, res.artifact_id)
    assert atts[-1].attestation.validator_fingerprint["compiler_version"] == "gcc 13.2.0" and atts[-1].attestation.passed
    md = read_artifact(artifact_key("bvp", "tiny-llama-cpu", out["compat_key"][:24]) + "-summary").data
    assert "| re-check | re-checked on " in md and "compiler_version=gcc 13.2.0" in md and ", no rebuild (" in md
    again = build_validate_publish(profile="tiny-llama-cpu", store=store.uri)  # now covered: reused
    assert again["attestation_reused"] and not again["rechecked"]


# --- #48 item 13: a re-check that nobody with the node's soft values ran never ends green ----------

def test_a_recheck_on_a_worker_with_other_soft_values_refuses_at_once(prefect_api, in_repo, quick_profiles,
                                                                      tiny_build, tmp_path, monkeypatch):
    """Any worker of the compat key may take a build, but a re-check carries the node's soft values:
    a worker whose own differ refuses it (no attestation written, nothing reused), naming the queue
    it belongs on; on a worker with those values it validates there and covers the node."""
    import json

    from buildctl.steps import fleet
    from buildctl.steps import build
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.steps.context import Context
    from buildctl.steps.coverage import coverage
    from buildctl.engines.errors import WrongRecheckWorkerError
    from buildctl.engines.fingerprint import detect
    from buildctl.flows.build_validate_publish import build_validate_publish
    from buildctl.artifact_store.read import get_manifest

    from ..support.helpers import write_attestation

    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(quick_profiles))
    monkeypatch.setenv("BUILDCTL_BUILD_LIMIT", "test-builds")
    ensure_limit("test-builds", 1)
    store = open_store("file://" + str(tmp_path / "store"))
    worker = detect()
    res = build.import_engine(Context.from_settings(settings(), store=store), tiny_build["engine"],
                                 tiny_build["profile"], worker, model_digest=tiny_build["outcome"].model_digest)
    write_attestation(store, res.artifact_id, worker.compat_key("aoti"), "pass", validator=worker)  # the worker's own
    node = worker.model_copy(update={"compiler_version": "gcc 13.2.0"})  # soft for aoti: same compat key
    assert node.compat_key("aoti") == worker.compat_key("aoti")
    before = len(list_attestations(store, res.artifact_id))
    trigger = {"kind": "driver-upgrade", "node_id": "n1", "recheck": True, "soft": node.soft_fields("aoti")}
    with pytest.raises(WrongRecheckWorkerError) as err:  # this worker is still on the old compiler
        build_validate_publish(profile="tiny-llama-cpu", store=store.uri, trigger=trigger)
    assert fleet.recheck_queue_for(node.compat_key("aoti"), node.soft_fields("aoti")) in str(err.value)
    assert "compiler_version=gcc 13.2.0" in str(err.value)
    assert len(list_attestations(store, res.artifact_id)) == before  # it vouched for nothing
    f = tmp_path / "node.json"
    f.write_text(json.dumps(node.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))  # a worker that has the node's values
    out = build_validate_publish(profile="tiny-llama-cpu", store=store.uri, trigger=trigger)
    assert out["rechecked"] and out["recheck_passed"]
    assert coverage(store, res.artifact_id, get_manifest(store, res.artifact_id), node).covered


def test_a_driver_upgrade_whose_recheck_did_not_cover_the_node_fails_naming_the_worker_it_needs(
        prefect_api, in_repo, quick_profiles, tmp_path, monkeypatch):
    """The re-check ran, but not on the node's soft values: the driver-upgrade run ends Failed (the
    run-failed alert pages), says which worker and queue it needs, and recommends no promotion."""
    import json

    from prefect.artifacts import Artifact

    from buildctl.steps import fleet
    from buildctl.engines.fingerprint import detect
    from buildctl.flows import on_driver_upgrade as odu
    from buildctl.flows.common import artifact_key

    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(quick_profiles))
    node = detect().model_copy(update={"compiler_version": "gcc 13.2.0"})
    key = node.compat_key("aoti")
    started = []
    monkeypatch.setattr(odu, "recheck_needs", lambda s, fp, known: [("tiny-llama-cpu", key, "xxh3-128:" + "a" * 32)])

    def start(settings, pairs, trigger, promote_to, queues=None, triggers=None):
        started.append((queues, triggers))
        return [{"profile": p, "compat_key": k, "flow_run_id": "00000000-0000-0000-0000-000000000000",
                 "work_queue": q, "state": "Completed"} for (p, k, _), q in zip(pairs, queues)]

    monkeypatch.setattr(odu, "start_builds", start)
    monkeypatch.setattr(odu, "wait_for_children", lambda started, wait_s: [])
    monkeypatch.setattr(odu, "run_seconds", lambda run_id: 12.0)
    monkeypatch.setattr(odu, "recheck_outcome", lambda *a, **k: "re-check did not cover compiler_version=gcc 13.2.0 "
                                                                 "(12 s): it did not pass here")
    monkeypatch.setattr(odu, "reconcile_fleet", lambda **kw: pytest.fail("no reconcile after an uncovered re-check"))
    state = odu.on_driver_upgrade(node_id="n1", fingerprint=node.model_dump(mode="json"), profiles=["tiny-llama-cpu"],
                                  store="file://" + str(tmp_path / "store"), return_state=True)
    assert state.is_failed(), state
    queue = fleet.recheck_queue_for(key, node.soft_fields("aoti"))
    (queues, triggers), = started
    assert queues == [queue] and triggers[0]["soft"] == node.soft_fields("aoti") and triggers[0]["recheck"]
    assert queue in state.message and "compiler_version=gcc 13.2.0" in state.message
    md = Artifact.get(artifact_key("driver-upgrade", "n1")).data
    assert "FAILED" in md and queue in md and "buildctl worker start" in md and "promote" not in md.split("**Next:**")[1]
