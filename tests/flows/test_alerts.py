"""#30 item 2: alerts that page, through a real Prefect server and a webhook receiver on 127.0.0.1.

`buildctl alerts install --webhook-url` creates a Custom Webhook block and the named, described
automations; then a failed build, a scrub that finds corruption and a halted rollout each arrive
at the receiver once, with a link to the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from buildctl.artifact_store.channels import ChannelMove
from buildctl.flows.alerts import FLOW_NAMES, alerts

from ..support.helpers import REPO, staged
from ..support.s3server import free_ports
from .test_prefect_server import api, stop, wait_healthy

pytestmark = pytest.mark.slow


def test_flow_names_are_the_deployments_of_prefect_yaml():
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert sorted(FLOW_NAMES) == sorted(d["name"] for d in spec["deployments"])
    assert len({a.name for a in alerts()}) == 6 and all(a.description for a in alerts())


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every JSON body posted to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                n = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(json.loads(self.rfile.read(n) or b"{}"))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def matching(self, text: str) -> list[dict]:
        return [b for b in self.bodies if text in b.get("subject", "")]


def test_a_failed_build_a_corruption_and_a_halted_rollout_each_page_once_with_the_run_link(tmp_path, draft, monkeypatch):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.publish import publish_tree
    from buildctl.artifact_store.read import get_manifest
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves
    from buildctl.flows.build_validate_publish import build_validate_publish
    from buildctl.flows.rollout_channel import rollout_channel
    from buildctl.flows.scrub_store import scrub_store

    from ..support.helpers import make_tree, rot
    from ..steps.test_rollouts import Fleet, publish

    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    receiver = Receiver()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_UI_URL": f"http://127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=open(tmp_path / "server.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, server)
        install = [sys.executable, "-m", "buildctl", "--json", "alerts", "install", "--webhook-url", receiver.url,
                   "--fallback-minutes", "0.2"]
        for want in ("created", "updated"):  # installing again updates, by name
            r = subprocess.run(install, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            assert [x["action"] for x in json.loads(r.stdout)] == [want] * 6
        autos = {a["name"]: a for a in api(url, "/automations/filter", {})}
        assert {a.name for a in alerts()} <= set(autos) and len(autos) == 6
        assert all(autos[a.name]["description"] == a.description for a in alerts(fallback_minutes=0.2))
        r = subprocess.run([sys.executable, "-m", "buildctl", "alerts", "install", "--block", "slack-webhook/none"],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 3 and "no notification block" in r.stderr, r.stderr
        time.sleep(3)  # the server loads the automations

        monkeypatch.chdir(REPO)
        with temporary_settings({PREFECT_API_URL: url}):
            failed = build_validate_publish(profile="tiny-llama-cpu", target_compat_key="aoti-" + "0" * 32,
                                            store="file://" + str(tmp_path / "s0"), return_state=True)  # not this host
            assert failed.is_failed()
            uri = "file://" + str(tmp_path / "s1")
            store = open_store(uri)
            aid = publish_tree(store, make_tree(tmp_path / "t", {"rank0.engine": 20_000}), draft).artifact_id
            rot(store, get_manifest(store, aid).files[0].digest, "flip")
            scrub = scrub_store(store=uri, return_state=True)
            assert scrub.is_failed()

            store2 = open_store("file://" + str(tmp_path / "s2"))
            v1, bad = publish(store2, tmp_path, "v1", draft), publish(store2, tmp_path, "bad", draft, broken=True)
            fleet = Fleet(store2, tmp_path, 10)
            promote(store2, staged(store2, v1), "prod")
            fleet.pull_all()
            promote(store2, staged(store2, bad), "prod",
                    move=ChannelMove(rollout=RolloutPlan(waves=parse_waves("30,100", "0"), bake_s=0)))
            fleet.pull_all()
            rollout = rollout_channel(channel="prod", store=store2.uri, return_state=True)
            (view,) = rollout.result()
            assert view["decision"] == "halt"

            # a node that moves onto its fallback and stays pages once; one that moves back in time does not
            from buildctl.flows.events import emit_runtime_choice

            choice = {"model": "tiny-llama", "runtime": "tiny-llama-vllm-cpu", "rank": 1, "fallback": True,
                      "since": "2026-12-06T00:00:00Z", "why": "fallback #1: tiny-llama-cpu no artifact for compat key k"}
            for node, key in (("stuck-1", "aoti-stuck"), ("stuck-2", "aoti-stuck"), ("healed", "aoti-healed")):
                assert emit_runtime_choice(node, {**choice, "preferred_compat_key": key})
            assert emit_runtime_choice("healed", {**choice, "preferred_compat_key": "aoti-healed",
                                                  "runtime": "tiny-llama-cpu", "rank": 0, "fallback": False})

        runs = {"failed build": (f"run {failed.state_details.flow_run_id}", "build-validate-publish run"),
                "scrub": (str(scrub.state_details.flow_run_id), "scrub-store run"),
                "corrupted": (str(scrub.state_details.flow_run_id), f"artifact {aid} corrupted"),
                "halted": (str(rollout.state_details.flow_run_id), "rollout of tiny-llama-cpu/prod halted")}
        fallback = "tiny-llama on aoti-stuck on its fallback for 0.2 min"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (all(receiver.matching(s) for _, s in runs.values())
                                                   and receiver.matching(fallback)):
            time.sleep(1)
        time.sleep(5)  # any duplicate would have arrived by now
        (tmp_path / "alerts.json").write_text(json.dumps(receiver.bodies, indent=1))  # what the on-call engineer reads
        for what, (run_id, subject) in runs.items():
            got = receiver.matching(subject)
            assert len(got) == 1, (what, subject, receiver.bodies)
            run_id = run_id.removeprefix("run ")
            assert f"/runs/flow-run/{run_id}" in got[0]["body"], (what, got[0])
        assert "IncompatibleTargetError" in receiver.matching("build-validate-publish run")[0]["body"]
        [paged] = receiver.matching(fallback)  # once for its group of two nodes
        assert "serve tiny-llama from tiny-llama-vllm-cpu (fallback #1)" in paged["body"]
        assert not receiver.matching("aoti-healed")  # it moved back within the time
        assert not receiver.matching("rollout-channel run")  # the halting run itself completed
    finally:
        stop(server)
        receiver.server.shutdown()
