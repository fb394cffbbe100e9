"""Fleet inventory and the reconcile plan (pure)."""

from __future__ import annotations

import random
import time

from buildctl.steps import fleet
from buildctl.engines.fingerprint import detect


def synthetic_fleet(n_nodes: int, n_fps: int, n_profiles: int, seed: int = 7):
    rng = random.Random(seed)
    fps = [{"trtllm": f"trtllm-{i:032x}", "aoti": f"aoti-{i % 5:032x}"} for i in range(n_fps)]
    profiles = {f"profile-{j}": ("trtllm" if j % 4 else "aoti") for j in range(n_profiles)}
    names = sorted(profiles)
    nodes = [(rng.sample(names, rng.randint(1, 3)), fps[rng.randrange(n_fps)]) for _ in range(n_nodes)]
    return nodes, profiles


def brute_force(nodes, profiles, have):
    pairs = {(p, keys[profiles[p]]) for ps, keys in nodes for p in ps}
    return sorted(pairs - have)


def test_plan_builds_exactly_the_missing_distinct_pairs():
    nodes, profiles = synthetic_fleet(10_000, 50, 20)
    everything = brute_force(nodes, profiles, set())
    have = set(random.Random(1).sample(everything, len(everything) // 3))
    t0 = time.perf_counter()
    plan = fleet.plan_builds(nodes, profiles, have)
    elapsed = time.perf_counter() - t0
    assert [(n.profile, n.compat_key) for n in plan] == brute_force(nodes, profiles, have)
    assert len(plan) == len(everything) - len(have) > 0
    # each pair once, with the number of nodes waiting for it
    assert sum(n.nodes for n in plan) == sum(1 for ps, keys in nodes for p in ps if (p, keys[profiles[p]]) not in have)
    assert elapsed < 5.0


def test_plan_filters_and_unknown_profiles():
    nodes = [(["a", "b", "ghost"], {"trtllm": "t1", "aoti": "c1"}), (["a"], {"trtllm": "t2", "aoti": "c1"})]
    plan = fleet.plan_builds(nodes, {"a": "trtllm", "b": "aoti"}, {("a", "t2")})
    assert [(n.profile, n.compat_key, n.nodes) for n in plan] == [("a", "t1", 1), ("b", "c1", 1)]
    assert [n.profile for n in fleet.plan_builds(nodes, {"a": "trtllm", "b": "aoti"}, set(), ["b"])] == ["b"]


def test_report_node_cas_and_compat_change(store):
    fp = detect()
    first = fleet.report_node(store, "gpu-node-1", fp, ["tiny-llama-cpu"])
    assert first.previous is None and not first.compat_changed and first.record.reports == 1
    same = fleet.report_node(store, "gpu-node-1", fp, ["tiny-llama-cpu"])
    assert not same.compat_changed and same.record.reports == 2
    upgraded = fp.model_copy(update={"torch_version": "9.9.9"})
    changed = fleet.report_node(store, "gpu-node-1", upgraded, ["tiny-llama-cpu"])
    assert changed.compat_changed and changed.previous.compat_keys["aoti"] == fp.compat_key("aoti")
    payload = fleet.event_payload(changed)
    assert payload["old_fingerprint"]["torch_version"] == fp.torch_version
    assert payload["new_fingerprint"]["torch_version"] == "9.9.9" and payload["profiles"] == ["tiny-llama-cpu"]
    assert [n.node_id for n in fleet.read_inventory(store)] == ["gpu-node-1"]


def test_node_report_cli(cli, tmp_path, monkeypatch):
    import json

    store = tmp_path / "store"
    (tmp_path / "no-profiles").mkdir()  # a node without the profile directory records the names as given
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(tmp_path / "no-profiles"))
    code, out, err = cli("--store", store, "--json", "node", "report", "--node-id", "n1", "--profiles", "a,b",
                         "--profiles", "c")
    assert code == 0, err
    res = json.loads(out)
    assert res["first_report"] and res["profiles"] == ["a", "b", "c"] and not res["event_emitted"]
    code, _, err = cli("--store", store, "node", "report", "--node-id", "../evil")
    assert code == 2


def test_worker_start_serves_exactly_this_hosts_compat_keys(cli, tmp_path, monkeypatch):
    """`buildctl worker start` picks the queues from the host's fingerprint: another toolchain,
    another queue; a host without a backend's build tool serves none of its queues."""
    import json

    from buildctl.engines.fingerprint import detect

    fp = detect().model_copy(update={"vllm_version": None})  # no vLLM either: no vllm queue (a host with it below)
    f = tmp_path / "fp.json"
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
    code, out, err = cli("--json", "worker", "start", "--pool", "gpu-pool", "--dry-run")
    assert code == 0, err
    got = json.loads(out)
    assert got["by_backend"] == {"aoti": fp.compat_key("aoti")}  # no tensorrt_llm here: no trtllm queue
    with_vllm = fp.model_copy(update={"vllm_version": "0.32.0"})
    f.write_text(json.dumps(with_vllm.model_dump(mode="json")))
    code, out, err = cli("--json", "worker", "start", "--pool", "gpu-pool", "--dry-run")
    assert code == 0 and json.loads(out)["by_backend"] == {"aoti": fp.compat_key("aoti"),
                                                           "vllm": with_vllm.compat_key("vllm")}, err
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    recheck = got["rechecks_by_backend"]["aoti"]
    assert got["queues"] == [fp.compat_key("aoti"), recheck, "default"] and recheck.startswith(fp.compat_key("aoti"))
    assert got["command"][1:] == ["-m", "prefect", "worker", "start", "--pool", "gpu-pool",
                                  *[x for q in got["queues"] for x in ("--work-queue", q)], "--name", got["name"]]
    assert got["name"].endswith(fp.compat_key("aoti")[:24])  # named after the host and its key
    assert fp.compat_key("aoti") in got["descriptions"][fp.compat_key("aoti")]
    other = fp.model_copy(update={"torch_version": "9.8.0"})  # a hard aoti field
    f.write_text(json.dumps(other.model_dump(mode="json")))
    code, out, _ = cli("--json", "worker", "start", "--pool", "gpu-pool", "--dry-run", "--builds-only")
    assert json.loads(out)["queues"][0] == other.compat_key("aoti") != fp.compat_key("aoti")
    assert json.loads(out)["queues"][1:] == [json.loads(out)["rechecks_by_backend"]["aoti"]]
    # a control worker (builds run as Kubernetes Jobs): 'default' only, never a build queue
    code, out, _ = cli("--json", "worker", "start", "--pool", "buildctl-local", "--dry-run", "--control-only")
    assert code == 0 and json.loads(out)["queues"] == ["default"] and json.loads(out)["by_backend"] == {}
    code, _, err = cli("worker", "start", "--pool", "p", "--dry-run", "--control-only", "--builds-only")
    assert code == 2 and "exclude each other" in err
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    code, _, err = cli("worker", "queues", "--pool", "gpu-pool")
    assert code == 2 and "PREFECT_API_URL" in err


def reporting_node(cli, tmp_path, monkeypatch, node_id: str):
    """A node serving the tiny profile whose fingerprint file (this host's) it has reported once:
    (fingerprint, its file, the report command's arguments)."""
    fp = detect()
    f = tmp_path / "fp.json"
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
    store = "file://" + str(tmp_path / "store")
    report = ("--store", store, "--json", "node", "report", "--node-id", node_id, "--profiles", "tiny-llama-cpu")
    f.write_text(fp.model_dump_json())
    assert cli(*report)[0] == 0
    return fp, f, report


def test_node_report_counts_only_changes_to_backends_its_profiles_use(cli, tmp_path, monkeypatch):
    """A CPU node serving the tiny (aoti) profile: a new TensorRT-LLM there is no upgrade of its
    engines, so no driver-upgrade event; a new torch is (#29: it emitted for any backend)."""
    import json

    fp, f, report = reporting_node(cli, tmp_path, monkeypatch, "cpu-1")
    f.write_text(fp.model_copy(update={"tensorrt_llm_version": "1.2.1", "driver_version": "580.65.06"}).model_dump_json())
    code, out, err = cli(*report)
    assert code == 0, err
    got = json.loads(out)
    assert got["upgraded"] is False and got["event_emitted"] is False
    f.write_text(fp.model_copy(update={"tensorrt_llm_version": "1.2.1", "driver_version": "580.65.06",
                                       "torch_version": "9.9.0"}).model_dump_json())
    got = json.loads(cli(*report)[1])
    assert got["upgraded"] is True and got["compat_changed"] is True and got["backends"] == ["aoti"]


def test_an_undelivered_driver_upgrade_event_stays_pending_and_is_re_sent(cli, tmp_path, monkeypatch, prefect_api):
    """#29 8c: with the Prefect API down, the report said "emitted" and exited 0, and the next one
    said "unchanged": the upgrade was lost. Now the owed event is marked in the inventory, the
    report exits 11, and the next report (nothing else changed) delivers it and clears the mark."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.fleet.inventory import read_node

    from ..support.s3server import free_ports

    fp, f, report = reporting_node(cli, tmp_path, monkeypatch, "cpu-9")
    store = report[1]
    f.write_text(fp.model_copy(update={"torch_version": "9.9.0"}).model_dump_json())
    (dead,) = free_ports(1)
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{dead}/api"}):
        code, out, err = cli(*report)
    assert code == 11, err
    assert json.loads(out)["event_pending"] is True and "not delivered" in err and "re-sends it" in err
    rec = read_node(open_store(store), "cpu-9")[0]
    assert rec.event_pending is not None and rec.event_pending.payload["new_compat_keys"] == rec.compat_keys
    code, out, err = cli(*report)  # the API is back; the fingerprint did not change again
    assert code == 0, err
    got = json.loads(out)
    assert got["upgraded"] is False and got["event_resent"] is True and got["event_id"]
    assert read_node(open_store(store), "cpu-9")[0].event_pending is None

    async def delivered():
        async with get_client() as c:
            page = await c.read_events(filter=EventFilter(event=EventNameFilter(name=["buildctl.node.driver-upgraded"])), limit=50)
            return [str(e.id) for e in page.events]

    import asyncio
    import time

    deadline = time.monotonic() + 20
    while got["event_id"] not in asyncio.run(delivered()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert got["event_id"] in asyncio.run(delivered())
    assert json.loads(cli(*report)[1])["event_emitted"] is False  # delivered once, not again


def test_the_plan_builds_again_where_the_only_artifact_failed_or_is_quarantined(tmp_path):
    """#29: any artifact of the current build hash counted as built, so a failed or inconclusive
    one was never retried. Counted now: passed and not quarantined, or still within its validation
    window (just published, no verdict yet)."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.publish import ManifestDraft
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.artifact_store.quarantine import quarantine
    from buildctl.engines.profile import load_profile

    from ..support.helpers import PROFILES, publish_files, write_attestation

    store = open_store(f"file://{tmp_path / 'store'}")
    fp = detect()
    profile = load_profile(PROFILES / "tiny-llama-cpu.yaml")
    fleet.report_node(store, "cpu-1", fp, [profile.name])
    profiles = {profile.name: profile}
    draft = ManifestDraft(profile_name=profile.name, profile_hash=profile.build_hash(), backend="aoti",
                          compat_key=fp.compat_key("aoti"), fingerprint=fp.model_dump(mode="json"),
                          tool_versions={"backend": fp.tool_version("aoti")}, model_digest=None, build_key=None)
    aid = publish_files(store, tmp_path / "t", draft, {"model.pt2": 2048, "engine.json": b"{}"}, verdict=None)
    assert fleet.fleet_plan(store, profiles) == []  # just published: its validation is still to come
    write_attestation(store, aid, fp.compat_key("aoti"), "fail", validator=fp)
    (need,) = fleet.fleet_plan(store, profiles)
    assert (need.profile, need.compat_key) == (profile.name, fp.compat_key("aoti"))
    write_attestation(store, aid, fp.compat_key("aoti"), "pass", validator=fp)
    assert fleet.fleet_plan(store, profiles) == []
    quarantine(store, aid, "rotted", auth=Authority())
    assert [n.profile for n in fleet.fleet_plan(store, profiles)] == [profile.name]


def test_node_labels_are_valid_kubernetes_labels_naming_the_compat_key(cli, tmp_path, monkeypatch):
    """`buildctl node labels`: the compat key of each backend this runtime can build for (what a
    build Job's affinity selects), and each hard field, all valid Kubernetes label keys and values."""
    import json
    import re

    from buildctl.engines.fingerprint import detect

    fp = detect().model_copy(update={"torch_version": "2.13.0+cpu (a local build)"})
    f = tmp_path / "fp.json"
    f.write_text(fp.model_dump_json())
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
    # #50 item 3: with GPU profiles in the profile directory, a runtime with no GPU says so (exit 2)
    code, out, err = cli("--json", "node", "labels")
    assert code == 2 and out == "" and "no GPU or no build tool for trtllm" in err and "llama-3-8b-instruct-fp8-tp1" in err
    import shutil

    from ..support.helpers import PROFILES

    cpu_only = tmp_path / "profiles"
    cpu_only.mkdir()
    shutil.copy(PROFILES / "tiny-llama-cpu.yaml", cpu_only)
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(cpu_only))
    code, out, err = cli("--json", "node", "labels")
    assert code == 0, err
    labels = json.loads(out)
    assert labels["buildctl.io/compat-aoti"] == fp.compat_key("aoti") and "buildctl.io/compat-trtllm" not in labels
    value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    name = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
    for k, v in labels.items():
        prefix, _, n = k.partition("/")
        assert prefix == "buildctl.io" and name.match(n) and value.match(v) and len(v) <= 63, (k, v)
    assert labels["buildctl.io/aoti.torch_version"] == "2.13.0-cpu--a-local-build"
    code, out, _ = cli("node", "labels", "--node", "gpu-7")
    assert code == 0 and out.startswith("kubectl label node gpu-7 --overwrite buildctl.io/")
    code, out, _ = cli("node", "labels", "--nfd")  # a Node Feature Discovery feature file
    assert code == 0 and dict(line.split("=", 1) for line in out.splitlines()) == labels


def test_a_worker_polls_the_recheck_queue_of_its_own_soft_values(cli, tmp_path, monkeypatch):
    """#48 item 13: re-checks of a driver upgrade go to ``<key>-soft-<hash of the soft values>``;
    a worker polls its own, so two workers of one key with different drivers take different ones."""
    import json

    from buildctl.engines.fingerprint import detect

    queues = {}
    for name, compiler in (("old", "gcc 12.2.0"), ("new", "gcc 13.2.0")):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(detect().model_copy(update={"compiler_version": compiler}).model_dump(mode="json")))
        monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(f))
        code, out, err = cli("--json", "worker", "start", "--pool", "p", "--dry-run")
        assert code == 0, err
        got = json.loads(out)
        queues[name] = got["rechecks_by_backend"]["aoti"]
        assert got["by_backend"]["aoti"] in got["queues"] and queues[name] in got["queues"]
    assert queues["old"] != queues["new"] and queues["old"].split("-soft-")[0] == queues["new"].split("-soft-")[0]


# --- where a build run started by hand goes (#50 item 4) ---------------------------------------------


def test_a_hand_started_run_goes_to_its_targets_queue_or_to_each_live_queue_of_its_backend():
    import pytest

    from buildctl.engines.errors import UnroutableBuildError
    from buildctl.steps.fleet import hand_started_queues

    a, b, t = "aoti-" + "a" * 32, "aoti-" + "b" * 32, "trtllm-" + "c" * 32
    queues = [(a, True), (b, False), (f"{a}-soft-0123456789ab", True), (t, True), ("default", True),
              ("aoti-nobody", True)]
    assert hand_started_queues("p", "aoti", "pool", b, queues, "why") == [b]  # its target, served or not
    assert hand_started_queues("p", "aoti", "pool", None, queues, "why") == [a]  # live compat-key queues only
    assert hand_started_queues("p", "trtllm", "pool", None, queues, "why") == [t]
    with pytest.raises(UnroutableBuildError) as exc:
        hand_started_queues("llama", "vllm", "gpu", None, queues, "no GPU")
    msg = str(exc.value)
    assert "cannot build llama (no GPU)" in msg and "buildctl worker start --pool gpu" in msg and "\n" not in msg
    from buildctl.cli.main import exit_code_for

    assert exit_code_for(exc.value) == 2
