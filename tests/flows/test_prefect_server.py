"""From a driver upgrade to a completed rebuild, through a real Prefect server on 127.0.0.1.

``prefect server start`` on loopback; ``python -m buildctl.flows.serve`` serving the deployments with the
trigger from prefect.yaml; ``buildctl node report`` after the node's fingerprint file changes;
the build-validate-publish run the trigger leads to must reach Completed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from buildctl.engines.fingerprint import detect
from buildctl.artifact_store.trust.authority import Authority
from buildctl.steps.context import Context
from buildctl.artifact_store.layout import node_key
from buildctl.artifact_store.backends.store import open_store

from ..support.helpers import REPO, checkout_like, rot, run_docs_block
from ..support.s3server import free_ports

pytestmark = pytest.mark.slow


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("prefect server did not become healthy")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _answer(req: urllib.request.Request | str):
    """The server's JSON answer; a 503 (a busy SQLite server) is asked again, as Prefect's client does."""
    import urllib.error

    for attempt in range(6):
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            if err.code != 503 or attempt == 5:
                raise
            time.sleep(1 + attempt)


def api(url: str, path: str, body: dict) -> list:
    return _answer(urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                          headers={"Content-Type": "application/json"}))


def test_driver_upgrade_to_completed_rebuild(tmp_path, quick_profiles):
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    home = tmp_path / "prefect-home"
    fp_file = tmp_path / "node-fingerprint.json"
    fp_file.write_text(json.dumps(detect().model_dump(mode="json")))
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_RUNNER_POLL_FREQUENCY": "1", "BUILDCTL_FINGERPRINT_FILE": str(fp_file),
           "BUILDCTL_STORE": "file://" + str(tmp_path / "store"), "BUILDCTL_BUILD_LIMIT": "e2e-builds",
           "BUILDCTL_PROFILE_DIR": str(quick_profiles),  # the orchestration is tested here, not the speed gate
           "PYTHONUNBUFFERED": "1"}
    server_log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=server_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    served = None
    try:
        wait_healthy(url, server)
        serve_log = open(tmp_path / "serve.log", "wb")
        served = subprocess.Popen([sys.executable, "-m", "buildctl.flows.serve"], env=env, cwd=REPO, stdout=serve_log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            deps = api(url, "/deployments/filter", {})
            if {d["name"] for d in deps} >= {"on-driver-upgrade", "build-validate-publish"}:
                break
            time.sleep(1)
        else:
            raise AssertionError("deployments were not served: " + (tmp_path / "serve.log").read_text()[-2000:])
        time.sleep(3)  # the trigger's automation is loaded by the server

        report = [sys.executable, "-m", "buildctl", "--json", "node", "report", "--node-id", "gpu-node-1",
                  "--profiles", "tiny-llama-cpu"]
        first = json.loads(subprocess.run(report, env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout)
        assert first["first_report"] and not first["event_emitted"]
        upgraded = detect().model_copy(update={"torch_version": "2.99.0"})  # a new torch on the node: a hard aoti field
        fp_file.write_text(json.dumps(upgraded.model_dump(mode="json")))
        second = json.loads(subprocess.run(report, env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout)
        assert second["compat_changed"] and second["event_emitted"]

        deadline = time.monotonic() + 420
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            runs = api(url, "/flow_runs/filter", {})
            states = {f"{r['name']}:{r.get('deployment_id')}": r["state_type"] for r in runs}
            bvp = [r for r in runs if r["parameters"].get("target_compat_key") == upgraded.compat_key("aoti")]
            final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
            trigger_runs = [r for r in runs if r["parameters"].get("node_id") == "gpu-node-1"]
            # The parent waits for its child, so it finishes a moment after it: wait for both.
            if bvp and bvp[0]["state_type"] in final and trigger_runs and trigger_runs[0]["state_type"] in final:
                break
            if any(r["state_type"] in final[1:] for r in trigger_runs):
                break  # the triggered run failed: no rebuild will come
            time.sleep(2)
        assert bvp, f"no rebuild run was started: {states}\n" + (tmp_path / "serve.log").read_text()[-3000:]
        assert bvp[0]["state_type"] == "COMPLETED", (tmp_path / "serve.log").read_text()[-4000:]
        assert trigger_runs and trigger_runs[0]["state_type"] == "COMPLETED"
        assert bvp[0]["name"] == f"tiny-llama-cpu@{upgraded.compat_key('aoti')[:13]}… build"
        assert trigger_runs[0]["name"] == "driver-upgrade gpu-node-1"
        (summary,) = api(url, "/artifacts/latest/filter", {"artifacts": {"key": {"any_": ["driver-upgrade-gpu-node-1"]}}})
        md = summary["data"]  # #30: the driver-upgrade run's own summary: what it found, did, and what is next
        assert "| aoti compat key |" in md and upgraded.compat_key("aoti") in md and "| build tiny-llama-cpu |" in md, md
        assert "buildctl history --profile tiny-llama-cpu --channel staging" in md
        the_event_feed_links_the_upgrade_to_its_run_and_artifact(url, bvp[0]["id"])
        a_failing_child_fails_its_parents(url, env, tmp_path)
        heal_through_the_automation(url, env, tmp_path, upgraded.compat_key("aoti"))
        rollout_halted_through_the_automation(url, env, tmp_path, upgraded.compat_key("aoti"))
        stop(server)  # #50 item 6: `kill %1 %2` stops the server first; serve then ends within 10 s
        served.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        served.wait(timeout=30)
        took = time.monotonic() - t0
        tail = (tmp_path / "serve.log").read_text()[-3000:]
        assert took < 10 and served.returncode == 0, (took, served.returncode, tail)
        assert "Traceback" not in tail.split("SIGTERM received", 1)[-1], tail
        served = None
    finally:
        if served is not None:
            stop(served)
        stop(server)


def the_event_feed_links_the_upgrade_to_its_run_and_artifact(url: str, bvp_run_id: str) -> None:
    """The build run emitted buildctl.artifact.validated; Prefect relates it to the run, and the
    run's trigger relates it to the node whose report started it."""
    deadline = time.monotonic() + 60  # the server persists events in batches
    events: dict = {"events": []}
    while time.monotonic() < deadline and not events["events"]:
        events = api(url, "/events/filter", {"filter": {"event": {"prefix": ["buildctl.artifact.validated"]}}, "limit": 10})
        time.sleep(1)
    (ev,) = events["events"]
    related = {r["prefect.resource.id"] for r in ev["related"]}
    assert f"prefect.flow-run.{bvp_run_id}" in related and "buildctl.node.gpu-node-1" in related
    assert "buildctl.profile.tiny-llama-cpu" in related and ev["resource"]["prefect.resource.id"].startswith("buildctl.artifact.")
    upgrade = api(url, "/events/filter", {"filter": {"event": {"prefix": ["buildctl.node.driver-upgraded"]}}, "limit": 10})
    assert any(r["prefect.resource.id"] == "buildctl.profile.tiny-llama-cpu" for r in upgrade["events"][0]["related"])


def a_failing_child_fails_its_parents(url: str, env: dict, tmp_path) -> None:
    """Node 2 upgrades to a toolchain no worker here has: its build fails (the serving host's compat
    key differs), and so do the reconcile and on-driver-upgrade runs above it, each with a summary
    that names the cause."""
    from buildctl.flows.common import artifact_key

    fp2 = tmp_path / "node2.json"
    node2 = {**env, "BUILDCTL_FINGERPRINT_FILE": str(fp2)}
    report = [sys.executable, "-m", "buildctl", "node", "report", "--node-id", "gpu-node-2", "--profiles", "tiny-llama-cpu"]
    fp2.write_text(json.dumps(detect().model_copy(update={"torch_version": "2.97.0"}).model_dump(mode="json")))
    subprocess.run(report, env=node2, cwd=REPO, capture_output=True, text=True, check=True)
    new = detect().model_copy(update={"torch_version": "2.98.0"})
    fp2.write_text(json.dumps(new.model_dump(mode="json")))
    r = subprocess.run(report, env=node2, cwd=REPO, capture_output=True, text=True, check=True)
    old_key = detect().model_copy(update={"torch_version": "2.97.0"}).compat_key("aoti")
    assert f"aoti: {old_key} -> {new.compat_key('aoti')}" in r.stdout
    assert "torch_version: 2.97.0 -> 2.98.0" in r.stdout  # the hard field that differs
    assert "Still processing" not in r.stdout + r.stderr
    final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        listed = api(url, "/flow_runs/filter", {})
        runs = {x["name"]: x for x in listed}
        upgrade = runs.get("driver-upgrade gpu-node-2")
        if upgrade and upgrade["state_type"] in final:
            break
        time.sleep(2)
    key = new.compat_key("aoti")
    bvp = runs[f"tiny-llama-cpu@{key[:13]}… build"]
    assert bvp["state_type"] == "FAILED"
    assert sorted(x["state_type"] for x in listed if x["name"] == "reconcile tiny-llama-cpu") == ["COMPLETED", "FAILED"]
    assert upgrade["state_type"] == "FAILED", upgrade["state"]
    summary = api(url, "/artifacts/filter", {"artifacts": {"key": {"any_": [artifact_key("bvp", "tiny-llama-cpu", key[:24]) + "-summary"]}}})
    md = summary[0]["data"]
    assert "**FAILED at step `plan`:**" in md and "`IncompatibleTargetError`" in md and "gpu-node-2" in md
    assert "Traceback" not in md and "buildctl worker start" in md


def heal_through_the_automation(url: str, env: dict, tmp_path, compat_key: str) -> None:
    """The rebuilt artifact rots in the store; a node's pull of it fails and emits
    buildctl.node.pull-failed; the heal-artifact automation quarantines it and, in that one run,
    rebuilds, validates and promotes a good artifact to staging."""
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.read import get_manifest, list_artifacts
    from buildctl.artifact_store.trust.attestations import latest_attestation
    from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
    from buildctl.artifact_store.quarantine import active_quarantine

    store = open_store(env["BUILDCTL_STORE"])
    (aid,) = [a for a, m in list_artifacts(store) if m.compat_key == compat_key]
    cli = [sys.executable, "-m", "buildctl"]
    r = subprocess.run([*cli, "promote", aid, "--channel", "staging"], env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    blob = next(f for f in get_manifest(store, aid).files if f.path == "prefill.pt2")
    rot(store, blob.digest, "flip")  # 4 bytes flipped in the middle, the size kept
    t0 = time.monotonic()
    r = subprocess.run([*cli, "pull", "--profile", "tiny-llama-cpu", "--channel", "staging", "--dest",
                        str(tmp_path / "node"), "--node-id", "gpu-node-1"], env=env, cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 4 and "prefill.pt2: digest mismatch" in r.stderr, r.stderr
    assert "emitted buildctl.node.pull-failed" in r.stderr, r.stderr
    deadline = time.monotonic() + 420
    heal = []
    while time.monotonic() < deadline:
        heal = [x for x in api(url, "/flow_runs/filter", {}) if x["parameters"].get("artifact_id") == aid]
        if heal and heal[0]["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(2)
    assert heal, "the pull-failed event started no heal-artifact run: " + (tmp_path / "serve.log").read_text()[-3000:]
    assert heal[0]["state_type"] == "COMPLETED", (tmp_path / "serve.log").read_text()[-4000:]
    assert heal[0]["parameters"]["node_id"] == "gpu-node-1"
    assert active_quarantine(store, aid) is not None
    rec = read_channel(store, "tiny-llama-cpu", "staging", compat_key)[0]
    assert rec.artifact_id != aid and active_quarantine(store, rec.artifact_id) is None
    verify_deep_or_quarantine(store, rec.artifact_id, detector="test", auth=Authority(who="test"))  # staging is on bytes that verify
    att = latest_attestation(store, rec.artifact_id, compat_key)
    assert att is not None and att.attestation.passed  # the rebuild was validated
    node = json.loads(store.get_bytes(node_key("gpu-node-1")))
    assert node["pull_failures"][-1]["artifact_id"] == aid
    (tmp_path / "time-to-recovery.txt").write_text(f"{time.monotonic() - t0:.1f}\n")


def rollout_halted_through_the_automation(url: str, env: dict, tmp_path, compat_key: str) -> None:
    """A rollout to prod whose canary fails its smoke check: the node switches back, reports
    `failed` and emits buildctl.node.engine-health; the rollout-channel automation halts the
    rollout at once (no scheduled run needed) and rolls prod back, naming the node."""
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.read import get_manifest, list_artifacts
    from buildctl.artifact_store.trust.attestations import latest_attestation

    from ..support.helpers import staged, write_attestation

    store = open_store(env["BUILDCTL_STORE"])
    cli = [sys.executable, "-m", "buildctl"]
    good = read_channel(store, "tiny-llama-cpu", "staging", compat_key)[0].artifact_id
    r = subprocess.run([*cli, "promote", good, "--channel", "prod"], env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    node = tmp_path / "rollout-node"
    pull = [*cli, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod", "--dest", str(node),
            "--node-id", "gpu-node-1", "--health-cmd", 'test ! -e "$1/BROKEN"']
    r = subprocess.run(pull, env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["health"] == "healthy", r.stderr
    broken = tmp_path / "broken-engine"
    subprocess.run(["cp", "-r", str(node / "current") + "/.", str(broken)], check=True)
    (broken / "BROKEN").write_text("segfaults past 4096 tokens")
    m = get_manifest(store, good)
    imp = subprocess.run([*cli, "--json", "import", str(broken), "--profile", str(REPO / "build_profiles" / "tiny-llama-cpu.yaml"),
                          "--model-digest", m.model_digest or ""], env=env, cwd=REPO, capture_output=True, text=True)
    assert imp.returncode == 0, imp.stderr
    bad = json.loads(imp.stdout)["artifact_id"]
    write_attestation(store, bad, compat_key, "pass")
    staged(store, bad)
    r = subprocess.run([*cli, "promote", bad, "--channel", "prod", "--rollout", "100", "--bake", "1h"], env=env,
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and "rollout started" in r.stdout, r.stderr
    r = subprocess.run(pull, env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 8 and "switched back" in r.stderr, r.stderr
    deadline = time.monotonic() + 180
    rec = None
    while time.monotonic() < deadline:
        rec = read_channel(store, "tiny-llama-cpu", "prod", compat_key)[0]
        if rec.action == "rollback":
            break
        time.sleep(2)
    runs = [x for x in api(url, "/flow_runs/filter", {}) if x["name"].startswith("rollout ")]
    assert rec is not None and rec.action == "rollback", (runs, (tmp_path / "serve.log").read_text()[-3000:])
    assert rec.artifact_id == good and rec.rollout.state == "halted" and rec.rollout.failed_nodes == ("gpu-node-1",)
    assert any(r["parameters"].get("node_id") == "gpu-node-1" for r in runs), runs  # the engine-health trigger's
    deadline, started = time.monotonic() + 60, []  # the server persists events in batches
    while time.monotonic() < deadline and not started:
        started = api(url, "/events/filter", {"filter": {"event": {"prefix": ["buildctl.rollout.started"]}},
                                              "limit": 5})["events"]
        time.sleep(0 if started else 2)
    assert [e["payload"]["artifact_id"] for e in started] == [bad]  # the promote told the deployment
    deadline = time.monotonic() + 60  # the server persists events in batches
    statuses: list = []
    while time.monotonic() < deadline and "failed" not in statuses:
        health = api(url, "/events/filter", {"filter": {"event": {"prefix": ["buildctl.node.engine-health"]}}, "limit": 20})
        statuses = [e["payload"].get("status") for e in health["events"]]
        time.sleep(1)
    assert "failed" in statuses and "healthy" in statuses, statuses


def _published_as_built_on(store, tiny_build, fp) -> str:
    """The tiny engine published with a manifest for host ``fp``, unattested: the stand-in for the
    same build on another host (``import`` refuses this host's engine for another compat key)."""
    from buildctl.steps.build import manifest_draft

    from ..support.helpers import publish_files

    return publish_files(store, tiny_build["engine"], manifest_draft(
        tiny_build["profile"], fp, model_digest=tiny_build["outcome"].model_digest), verdict=None)


def test_builds_are_routed_to_workers_of_their_compat_key(tmp_path, tiny_build, quick_profiles):
    """Two workers started with `buildctl worker start` on hosts with different compat keys, the
    deployments from prefect.yaml (`prefect deploy --all`, no prompt), and three builds: each of the
    first two lands on the matching worker and completes (a worker of the other key would fail it
    with IncompatibleTargetError); the third, for a key no worker serves, waits."""
    from buildctl.artifact_store.backends.store import open_store

    from ..support.helpers import write_attestation

    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    store_uri = "file://" + str(tmp_path / "store")
    store = open_store(store_uri)
    fps = {name: detect().model_copy(update={"torch_version": f"2.{v}.0"})
           for name, v in (("a", 91), ("b", 92), ("c", 93))}
    keys = {name: fp.compat_key("aoti") for name, fp in fps.items()}
    imported = {}
    for name in ("a", "b"):  # each key already has a validated artifact: the runs are cache hits
        aid = _published_as_built_on(store, tiny_build, fps[name])
        write_attestation(store, aid, keys[name], "pass", validator=fps[name])
        imported[name] = aid
    res_a = imported["a"]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "BUILDCTL_STORE": store_uri, "BUILDCTL_REPO": str(REPO), "PYTHONUNBUFFERED": "1",
           "BUILDCTL_PROFILE_DIR": str(quick_profiles)}  # routing is tested here, not the speed gate
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=open(tmp_path / "server.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    workers = []
    try:
        wait_healthy(url, server)
        deploy_to_local_pool(env)  # the heal's rebuild takes a build slot, strictly
        for name in ("a", "b"):  # a also serves 'default' (the control flows)
            workers.append(start_worker(tmp_path, env, name, fps[name], builds_only=name == "b"))
        runs = {name: create_run(url, "build-validate-publish/build-validate-publish",
                                 {"profile": "tiny-llama-cpu", "target_compat_key": keys[name], "store": store_uri},
                                 keys[name]) for name in ("a", "b", "c")}
        deadline = time.monotonic() + 300
        states: dict[str, dict] = {}
        while time.monotonic() < deadline:
            states = {n: run_state(url, rid) for n, rid in runs.items()}
            if all(states[n]["state_type"] in ("COMPLETED", "FAILED", "CRASHED") for n in ("a", "b")):
                break
            time.sleep(2)
        logs = "".join((tmp_path / f"worker-{n}.log").read_text()[-1500:] for n in ("a", "b"))
        for n in ("a", "b"):
            assert states[n]["state_type"] == "COMPLETED", (n, states[n]["state"], logs)
            assert states[n]["work_queue_name"] == keys[n]
        assert states["c"]["state_type"] == "SCHEDULED" and states["c"]["work_queue_name"] == keys["c"]
        assert not [x for x in api(url, "/flow_runs/filter", {}) if x["state_type"] in ("FAILED", "CRASHED")]
        q = subprocess.run([sys.executable, "-m", "buildctl", "--json", "worker", "queues", "--pool", "buildctl-local"],
                           env=env, cwd=REPO, capture_output=True, text=True, check=True)
        polled = {row["queue"]: row["last_polled"] for row in json.loads(q.stdout)}
        assert polled[keys["a"]] and polled[keys["b"]] and polled[keys["c"]] is None  # nobody polls c's queue
        hand_started_runs_are_routed(url, tmp_path, keys)
        heal_rebuilds_on_the_matching_worker(url, store, env, tmp_path, res_a, keys["a"])
        prepare_upgrade_readies_a_two_fingerprint_fleet(url, env, tmp_path, tiny_build, fps, keys)
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait(timeout=10)
        stop(server)


def hand_started_runs_are_routed(url: str, tmp_path, keys: dict) -> None:
    """#50 item 4: runs started by hand land on 'default', which worker a polls. One for b's key is
    sent to b's queue and completes there; one for a GPU profile, which no worker here can build and
    no trtllm queue serves, fails at once on a, naming the command, and starts nothing."""
    routed = create_run(url, "build-validate-publish/build-validate-publish",
                        {"profile": "tiny-llama-cpu", "target_compat_key": keys["b"]})
    gpu = create_run(url, "build-validate-publish/build-validate-publish", {"profile": "llama-3-8b-instruct-fp8-tp1"})
    states = {rid: wait_final(url, rid, 300) for rid in (routed, gpu)}
    logs = (tmp_path / "worker-a.log").read_text()[-3000:]
    assert states[routed]["state_type"] == "COMPLETED" and states[routed]["work_queue_name"] == "default", (
        states[routed], logs)
    children = [x for x in api(url, "/flow_runs/filter", {}) if (x["parameters"].get("trigger") or {}).get("kind") == "by-hand"]
    assert [(c["work_queue_name"], c["state_type"]) for c in children] == [(keys["b"], "COMPLETED")], children
    assert states[gpu]["state_type"] == "FAILED", (states[gpu], logs)
    with prefect_client(url) as c:
        message = c.read_flow_run(gpu).state.message or ""
    assert "cannot build llama-3-8b-instruct-fp8-tp1" in message and "buildctl worker start --pool buildctl-local" in message
    assert "\n" not in message.strip() and "Traceback" not in message, message
    # #50 item 5: an expected failure on a worker is logged as one line, with no traceback
    logs = [x["message"] for x in api(url, "/logs/filter", {"logs": {"flow_run_id": {"any_": [gpu]}}})]
    assert logs and not [m for m in logs if "Traceback" in m], logs
    assert any("UnroutableBuildError: this worker cannot build" in m for m in logs), logs


def deploy_to_local_pool(env: dict) -> None:
    """The README's pool setup on the server ``env`` names: pool ``buildctl-local``, the build limit
    (one slot) and every deployment of prefect.yaml (`prefect deploy --all`, no prompt)."""
    prefect = [sys.executable, "-m", "prefect"]
    subprocess.run([*prefect, "work-pool", "create", "buildctl-local", "--type", "process"], env=env, cwd=REPO,
                   check=True, capture_output=True)
    subprocess.run([*prefect, "gcl", "create", "buildctl-builds", "--limit", "1"], env=env, cwd=REPO,
                   check=True, capture_output=True)
    r = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], env=env, cwd=REPO, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def start_worker(tmp_path, env: dict, name: str, fp, *, builds_only: bool) -> subprocess.Popen:
    """`buildctl worker start` on pool buildctl-local as a host with fingerprint ``fp`` (a file),
    logging to ``worker-NAME.log``."""
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    only = ["--builds-only"] if builds_only else []
    return subprocess.Popen([sys.executable, "-m", "buildctl", "worker", "start", "--pool", "buildctl-local", *only,
                             "--name", f"worker-{name}"], env={**env, "BUILDCTL_FINGERPRINT_FILE": str(f)}, cwd=REPO,
                            stdout=open(tmp_path / f"worker-{name}.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def heal_rebuilds_on_the_matching_worker(url: str, store, env: dict, tmp_path, artifact_id: str, key: str) -> None:
    """Artifact a rots; a heal-artifact run (on 'default', which worker a serves) quarantines it and
    starts its rebuild on a's compat-key queue, waits for it, and reports what staging points at."""
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.read import get_manifest, list_artifacts
    from buildctl.artifact_store.trust.attestations import latest_attestation
    from buildctl.artifact_store.quarantine import active_quarantine

    blob = next(f for f in get_manifest(store, artifact_id).files if f.path == "prefill.pt2")
    rot(store, blob.digest, "flip")
    heal_id = create_run(url, "heal-artifact/heal-artifact", {"artifact_id": artifact_id, "store": env["BUILDCTL_STORE"]})
    deadline = time.monotonic() + 420
    heal = {}
    while time.monotonic() < deadline:
        heal = run_state(url, heal_id)
        if heal["state_type"] in ("COMPLETED", "FAILED", "CRASHED"):
            break
        time.sleep(2)
    logs = (tmp_path / "worker-a.log").read_text()[-3000:]
    assert heal["state_type"] == "COMPLETED", (heal["state"], logs)
    children = [x for x in api(url, "/flow_runs/filter", {}) if x.get("parent_task_run_id")
                and x["parameters"].get("target_compat_key") == key and x["parameters"].get("promote_to") == "staging"]
    assert children and children[0]["work_queue_name"] == key and children[0]["state_type"] == "COMPLETED"
    assert active_quarantine(store, artifact_id) is not None
    rec = read_channel(store, "tiny-llama-cpu", "staging", key)[0]
    assert rec.artifact_id != artifact_id and active_quarantine(store, rec.artifact_id) is None
    from buildctl.flows.common import artifact_key

    (summary,) = api(url, "/artifacts/latest/filter", {"artifacts": {"key": {"any_": [
        artifact_key("heal", artifact_id.removeprefix("xxh3-128:")[:16])]}}})  # #30: the heal's own summary
    md = summary["data"]
    assert "| found |" in md and "prefill.pt2" in md and "| quarantined |" in md and rec.artifact_id in md, md
    assert f"buildctl promote {rec.artifact_id} --channel prod" in md


def prepare_upgrade_readies_a_two_fingerprint_fleet(url: str, env: dict, tmp_path, tiny_build, fps: dict,
                                                   keys: dict) -> None:
    """A second store: nodes of fingerprints a and b on gcc 11 (the upgrade brings the workers'
    compiler), each key with an engine on staging; a's was validated on gcc 11 only, b's on the
    workers' compiler too. prepare-upgrade finds b ready and plans a re-check for a only, starts
    one run on the queue of a's key and the target's soft values, worker a re-checks (the imported engine does not load for its claimed
    torch: the re-check fails) and rebuilds, and the run ends with every node ready and the plan
    table; a target whose key no worker serves is blocked and fails naming the queue. (One
    rebuild, not two: the first part already routes a run to each key's queue, and a second
    rebuild with its validation doubled this test's time past CI's budget.)"""
    from buildctl.steps import fleet
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.promotion import promote

    from ..support.helpers import write_attestation

    store2 = open_store("file://" + str(tmp_path / "store2"))
    gcc = fps["a"].compiler_version
    for name in ("a", "b"):
        before = fps[name].model_copy(update={"compiler_version": "gcc 11.4.0"})
        aid = _published_as_built_on(store2, tiny_build, before)
        write_attestation(store2, aid, keys[name], "pass", validator=before)
        if name == "b":
            write_attestation(store2, aid, keys[name], "pass", validator=fps[name])
        promote(store2, aid, "staging")
        fleet.report_node(store2, f"node-{name}", before, ["tiny-llama-cpu"])
    run = create_run(url, "prepare-upgrade/prepare-upgrade", {"target": {"compiler_version": gcc}, "channel": "staging",
                                                             "store": store2.uri})
    state = wait_final(url, run, 600)
    logs = "".join((tmp_path / f"worker-{n}.log").read_text()[-2000:] for n in ("a", "b"))
    assert state["state_type"] == "COMPLETED", (state["state"], logs)
    children = [x for x in api(url, "/flow_runs/filter", {}) if x.get("parent_task_run_id")
                and x["parameters"].get("store") == store2.uri]
    # #48 item 13: the re-check goes to a's key and the target's soft values, which worker a (on the
    # target compiler) polls; a worker of the key on another compiler would refuse it.
    assert [c["work_queue_name"] for c in children] == [fleet.recheck_queue_for(keys["a"], fps["a"].soft_fields("aoti"))]
    assert children[0]["parameters"]["trigger"]["soft"] == fps["a"].soft_fields("aoti")
    assert all(c["state_type"] == "COMPLETED" for c in children)
    (table,) = api(url, "/artifacts/latest/filter", {"artifacts": {"key": {"any_": ["prepare-upgrade-staging"]}}})
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert {r["state"] for r in rows} == {"ready"} and sum(r["nodes"] for r in rows) == 2, rows
    summaries = [a["data"] for a in api(url, "/artifacts/filter", {"artifacts": {"type": {"any_": ["markdown"]}}})]
    assert any("re-check failed (it did not load here" in md and "rebuilt" in md for md in summaries)
    (prep,) = api(url, "/artifacts/latest/filter", {"artifacts": {"key": {"any_": ["prepare-upgrade-staging-summary"]}}})
    assert "| after | 2 |" in prep["data"] and "{'" not in prep["data"], prep["data"]  # #50: a table, no dict dump
    assert "**Next:** every group is ready on staging: upgrade the nodes" in prep["data"], prep["data"]

    blocked = create_run(url, "prepare-upgrade/prepare-upgrade", {"target": {"torch_version": "2.77.0"},
                                                                 "channel": "staging", "store": store2.uri})
    state = wait_final(url, blocked, 120)
    key = fps["a"].model_copy(update={"torch_version": "2.77.0"}).compat_key("aoti")
    assert state["state_type"] == "FAILED" and f"no worker serves queue {key}" in state["state"], state


def wait_final(url: str, run_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    state: dict = {}
    while time.monotonic() < deadline:
        state = run_state(url, run_id)
        if state["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state
        time.sleep(2)
    return state


def api_get(url: str, path: str):
    return _answer(url + path)


def prefect_client(url: str):
    """Prefect's own client on the test's server: it retries the 503s a busy SQLite server answers."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        return get_client(sync_client=True)


def create_run(url: str, deployment: str, parameters: dict, work_queue_name: str | None = None) -> str:
    with prefect_client(url) as c:
        dep = c.read_deployment_by_name(deployment)
        return str(c.create_flow_run_from_deployment(dep.id, parameters=parameters, work_queue_name=work_queue_name).id)


def run_state(url: str, run_id: str) -> dict:
    with prefect_client(url) as c:
        r = c.read_flow_run(run_id)
        return {"state_type": r.state_type.value if r.state_type else None, "state": str(r.state),
                "work_queue_name": r.work_queue_name}


def test_a_scheduled_deployment_gets_runs_from_the_server_scheduler(tmp_path):
    """A real ``prefect server`` from the locked install: a deployment with a schedule gets
    Scheduled runs from the server's own scheduler service. With SQLAlchemy 2.1 (which Prefect
    3.7.7 allows) the scheduler fails every pass with "Can't evaluate bulk DML statement" and no
    scheduled deployment, resign-channels included, ever gets a run."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1"}
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                   str(port)], env=env, cwd=tmp_path, stdout=server_log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_healthy(url, server)
        flow_id = api(url, "/flows/", {"name": "scheduler-check"})["id"]
        dep = api(url, "/deployments/", {"name": "every-hour", "flow_id": flow_id,
                                         "schedules": [{"schedule": {"interval": 3600}, "active": True}]})
        runs: list = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not runs:
            time.sleep(1)
            runs = api(url, "/flow_runs/filter", {"deployments": {"id": {"any_": [dep["id"]]}}})
        log = log_path.read_text(errors="replace")
        assert runs, "the scheduler created no run in 60 s:\n" + log[-3000:]
        assert {r["state"]["type"] for r in runs} == {"SCHEDULED"}
        assert "bulk DML" not in log and "InvalidRequestError" not in log, log[-3000:]
    finally:
        stop(server)


def test_the_work_pool_quick_start_completes_as_written(tmp_path):
    """#30: docs/prefect.md's work-pool block, run by bash as written on a fresh server (only the
    port differs: 4200 may be taken here), in a directory holding what a checkout holds: the
    reconcile it ends with must complete, and its build must have completed on this host's
    compat-key queue, created by ``buildctl worker start``. Before #30 the worker's poll of a
    queue that did not exist got a 404 and it served nothing: the build sat Late."""
    import re

    text = (REPO / "docs" / "prefect.md").read_text()
    section = text.split("### Work pools on a fresh server\n", 1)[1].split("\n### ", 1)[0]
    (block,) = re.findall(r"^```bash\n(.*?)^```$", section, re.S | re.M)
    work = checkout_like(tmp_path / "checkout")
    out = run_docs_block(block, work, 900, ".prefect-worker.log")
    worker_log = (work / ".prefect-worker.log").read_text(errors="replace")
    key = detect().compat_key("aoti")
    assert f"polls {key}" in worker_log and "(created)" in worker_log, worker_log[-2000:]
    assert re.search(r"Flow run .* entered state 'Completed'|Completed", out), out[-2000:]
    assert f"tiny-llama-cpu@{key[:13]}" in worker_log, worker_log[-3000:]  # the build ran on this worker


@pytest.mark.slow
def test_a_driver_upgrade_recheck_goes_to_the_worker_with_the_nodes_soft_values(tmp_path, tiny_build, quick_profiles):
    """#48 item 13, on a real server: two workers of one compat key, on gcc 12 and gcc 13 (soft for
    aoti). A node upgraded to gcc 13 reports: its re-check lands on the gcc 13 worker's re-check
    queue, is validated there, and covers the node. A node upgraded to a compiler no worker has
    gets a run that pages: its re-check waits on its queue and the driver-upgrade run ends Failed
    naming that queue."""
    from buildctl.steps import fleet
    from buildctl.steps import build
    from buildctl.artifact_store.trust.attestations import list_attestations
    from buildctl.artifact_store.backends.store import open_store

    from ..support.helpers import settings, write_attestation

    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    store_uri = "file://" + str(tmp_path / "store")
    store = open_store(store_uri)
    base = detect()
    fps = {"old": base.model_copy(update={"compiler_version": "gcc 12.9.0"}),
           "new": base.model_copy(update={"compiler_version": "gcc 13.2.0"})}
    key = base.compat_key("aoti")
    assert {fp.compat_key("aoti") for fp in fps.values()} == {key}
    res = build.import_engine(Context.from_settings(settings(), store=store), tiny_build["engine"],
                                 tiny_build["profile"], fps["old"], model_digest=tiny_build["outcome"].model_digest)
    write_attestation(store, res.artifact_id, key, "pass", validator=fps["old"])
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "BUILDCTL_STORE": store_uri, "BUILDCTL_REPO": str(REPO), "PYTHONUNBUFFERED": "1",
           "BUILDCTL_PROFILE_DIR": str(quick_profiles)}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=open(tmp_path / "server.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    workers = []
    try:
        wait_healthy(url, server)
        deploy_to_local_pool(env)
        for name, fp in fps.items():  # old also serves 'default' (the control flows)
            workers.append(start_worker(tmp_path, env, name, fp, builds_only=name == "new"))

        def upgrade(node_id: str, after, wait_s: float) -> tuple[dict, list[dict]]:
            rid = create_run(url, "on-driver-upgrade/on-driver-upgrade",
                             {"node_id": node_id, "fingerprint": after.model_dump(mode="json"),
                              "old_fingerprint": fps["old"].model_dump(mode="json"), "profiles": ["tiny-llama-cpu"],
                              "store": store_uri, "wait_s": wait_s})
            deadline = time.monotonic() + 420
            st = {}
            while time.monotonic() < deadline:
                st = run_state(url, rid)
                if st["state_type"] in ("COMPLETED", "FAILED", "CRASHED"):
                    break
                time.sleep(2)
            children = [x for x in api(url, "/flow_runs/filter", {}) if x["parameters"].get("trigger", {}).get("node_id")
                        == node_id and x["parameters"]["trigger"].get("recheck")]
            return st, children

        st, children = upgrade("node-gcc13", fps["new"], 300)
        logs = "".join((tmp_path / f"worker-{n}.log").read_text()[-1500:] for n in fps)
        assert st["state_type"] == "COMPLETED", (st, logs)
        (child,) = children
        assert child["work_queue_name"] == fleet.recheck_queue_for(key, fps["new"].soft_fields("aoti")) != key
        assert child["state_type"] == "COMPLETED"
        on = [a.attestation.validator_fingerprint["compiler_version"] for a in list_attestations(store, res.artifact_id)]
        assert "gcc 13.2.0" in on  # validated on the worker with the node's compiler

        nobody = base.model_copy(update={"compiler_version": "gcc 14.1.0"})
        st, children = upgrade("node-gcc14", nobody, 30)
        queue = fleet.recheck_queue_for(key, nobody.soft_fields("aoti"))
        assert st["state_type"] == "FAILED" and queue in st["state"], st
        (child,) = children
        assert child["work_queue_name"] == queue and child["state_type"] == "SCHEDULED"  # waits, Late: pages too
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait(timeout=10)
        stop(server)


def test_build_validate_publish_of_a_vllm_bundle_completes_on_its_compat_key_worker(tmp_path):
    """#49: the flow builds the tiny vllm profile's bundle on the worker of this host's vllm compat
    key, validates it (the warm-start check in the summary) and publishes it; a quick speed section
    (validation is not in the build hash) keeps this to the orchestration."""
    import yaml

    from ..support.helpers import PROFILES

    import shutil

    profiles = tmp_path / "profiles"  # every shipped profile: the deployments' parameter schema lists them
    shutil.copytree(PROFILES, profiles)
    doc = yaml.safe_load((PROFILES / "tiny-llama-vllm-cpu.yaml").read_text())
    doc["validation"]["speed"].update({"concurrency": [1], "levels": {}, "min_throughput_ratio": 0.05,
                                       "max_p99_ttft_ratio": None, "num_prompts": 16, "repetitions": 6,
                                       "max_repetitions": 6, "max_seconds": 60, "warmup": 0})
    doc["validation"]["warm_start"]["pairs"] = 1
    (profiles / "tiny-llama-vllm-cpu.yaml").write_text(yaml.safe_dump(doc))
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    store_uri = "file://" + str(tmp_path / "store")
    fp = detect()
    key = fp.compat_key("vllm")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "BUILDCTL_STORE": store_uri, "BUILDCTL_REPO": str(REPO), "PYTHONUNBUFFERED": "1",
           "BUILDCTL_PROFILE_DIR": str(profiles)}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=open(tmp_path / "server.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        wait_healthy(url, server)
        deploy_to_local_pool(env)
        worker = start_worker(tmp_path, env, "v", fp, builds_only=True)
        run_id = create_run(url, "build-validate-publish/build-validate-publish",
                            {"profile": "tiny-llama-vllm-cpu", "target_compat_key": key, "store": store_uri}, key)
        deadline = time.monotonic() + 900
        state: dict = {}
        while time.monotonic() < deadline:
            state = run_state(url, run_id)
            if state["state_type"] in ("COMPLETED", "FAILED", "CRASHED"):
                break
            time.sleep(3)
        log = (tmp_path / "worker-v.log").read_text()[-3000:]
        assert state["state_type"] == "COMPLETED", (state.get("state"), log)
        assert state["work_queue_name"] == key
        summaries = [a["data"] for a in api(url, "/artifacts/filter", {"artifacts": {"type": {"any_": ["markdown"]}}})]
        md = next(s for s in summaries if "tiny-llama-vllm-cpu" in s and "warm start" in s)
        assert "pass: cache used; engine ready warm" in md, md[-2000:]
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        stop(server)
