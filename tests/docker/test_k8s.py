"""#30 item 5: the Kubernetes work pool's base job template, rendered without a cluster.

Prefect's own rendering (``apply_values``, the function every worker renders a job template
with; then prefect-kubernetes's ``KubernetesWorkerJobConfiguration`` and its
``prepare_for_flow_run``) of docker/k8s/base-job-template.json with each shipped profile's job
variables (``buildctl.steps.fleet.job_variables``) for a compat key gives a Kubernetes Job that
validates, offline and strictly, against the Kubernetes 1.37 schemas (kubernetes-validate), asks
for the GPUs the profile's build takes, and selects exactly the nodes labelled with the key
(``buildctl node labels``)."""

from __future__ import annotations

import json
import subprocess
import sys
from uuid import uuid4

import pytest

from buildctl.steps import fleet
from buildctl.engines.fingerprint import detect

from ..support.helpers import PROFILES, REPO, settings
from ..support.trtllm_kit import h100x8

TEMPLATE = REPO / "docker" / "k8s" / "base-job-template.json"


def _no_nulls(x):
    """What the API server stores: a null field is an absent one."""
    if isinstance(x, dict):
        return {k: _no_nulls(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_no_nulls(v) for v in x]
    return x


def render(job_variables: dict) -> dict:
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    t = json.loads(TEMPLATE.read_text())
    values = {k: v["default"] for k, v in t["variables"]["properties"].items() if "default" in v}
    values.update({"image": "registry.example.com/buildctl-builder:1.2.1",
                   "env": {"BUILDCTL_STORE": "s3://engines/buildctl"}, **job_variables})
    config = KubernetesWorkerJobConfiguration(**apply_values(t["job_configuration"], values))
    config.prepare_for_flow_run(FlowRun(id=uuid4(), name="a-build", flow_id=uuid4()))
    return _no_nulls(config.job_manifest)


def test_the_committed_template_is_the_generated_one():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "k8s_job_template.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name,gpus", [("llama-3-70b-instruct-fp8-tp8", 8), ("llama-3-8b-instruct-fp8-tp1", 1),
                                       ("tiny-llama-cpu", 0)])
def test_each_shipped_profile_renders_a_valid_job_pinned_to_its_compat_key(name, gpus):
    import kubernetes_validate

    from buildctl.engines.profile import load_profile

    profile = load_profile(PROFILES / f"{name}.yaml")
    fp = h100x8() if profile.engine.backend == "trtllm" else detect()
    key = fp.compat_key(profile.engine.backend)
    variables = fleet.job_variables(settings(), profile, key)
    assert variables["gpus"] == gpus
    job = render(variables)
    kubernetes_validate.validate(job, "1.37.0", strict=True)  # raises, naming the field, if not
    pod = job["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": f"buildctl.io/compat-{profile.engine.backend}", "operator": "In",
                                         "values": [key]}]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    # #50 item 3: resources from the profile, /dev/shm in memory, the volumes, a service account
    n = max(1, gpus)
    res = container["resources"]
    assert res["requests"]["cpu"] == str(4 * n) and res["requests"]["ephemeral-storage"] == f"{50 * n}Gi"
    limit_mb = profile.engine.build_memory_limit_mb
    assert res["requests"]["memory"] == res["limits"]["memory"] == (f"{limit_mb}Mi" if limit_mb else f"{16 * n}Gi")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{8 * n}Gi"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/dev/shm", "/data/models", "/data/calibration", "/etc/buildctl/keys"}
    assert mounts["/data/calibration"]["readOnly"] and mounts["/etc/buildctl/keys"]["readOnly"]
    calibration = profile.engine.calibration
    assert calibration is None or calibration.dataset.startswith("/data/calibration/")  # on the mounted claim
    assert pod["serviceAccountName"] == "buildctl-builder"
    assert {"name": "BUILDCTL_STORE", "value": "s3://engines/buildctl"} in container["env"]
    # the node the job selects is one whose labels `buildctl node labels` prints for that fingerprint
    labels = fleet.node_labels(settings(), fp)
    assert all(labels.get(e["key"]) in e["values"] for e in term["matchExpressions"])


def test_a_job_for_another_compat_key_does_not_select_this_node():
    from buildctl.engines.profile import load_profile

    profile = load_profile(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml")
    here, other = h100x8(), h100x8().model_copy(update={"tensorrt_version": "10.0.0"})
    job = render(fleet.job_variables(settings(), profile, other.compat_key("trtllm")))
    expr = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert here.compat_key("trtllm") not in expr["values"] and other.compat_key("trtllm") in expr["values"]


def test_the_committed_deploy_file_is_the_generated_one():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "k8s_deploy_file.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_the_cluster_manifests_validate_and_the_labeller_writes_nfd_features():
    import kubernetes_validate
    import yaml

    docs = [d for d in yaml.safe_load_all((REPO / "docker" / "k8s" / "cluster.yaml").read_text()) if d]
    for d in docs:
        kubernetes_validate.validate(d, "1.37.0", strict=True)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("ServiceAccount", "buildctl-builder"), ("PersistentVolumeClaim", "buildctl-model-cache"),
            ("PersistentVolumeClaim", "buildctl-calibration"), ("DaemonSet", "buildctl-node-labels"),
            ("Deployment", "buildctl-control-worker")} <= kinds
    t = json.loads(TEMPLATE.read_text())["variables"]["properties"]
    assert {t["model_cache_claim"]["default"], t["calibration_claim"]["default"]} <= {n for k, n in kinds
                                                                                      if k == "PersistentVolumeClaim"}
    assert t["service_account_name"]["default"] in {n for k, n in kinds if k == "ServiceAccount"}
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    script = ds["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "buildctl node labels --nfd" in script and "features.d" in script
    (worker,) = [d for d in docs if d["kind"] == "Deployment"]
    assert "--control-only" in worker["spec"]["template"]["spec"]["containers"][0]["args"]


def _page_block() -> str:
    """docs/kubernetes.md's block marked 'run by the test'."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    after = text.split("(run by the test", 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_pages_setup_runs_as_written_on_a_real_server_and_its_jobs_validate(tmp_path):
    """#50 item 3: the page's pools, limit and deploy on a fresh Prefect server with
    prefect-kubernetes; twice (each step checks first). The build deployment is on the Kubernetes
    pool with its job variables; the pool's stored template, the deployment's and each profile's
    job variables render Jobs that validate strictly."""
    import os
    import kubernetes_validate
    from prefect.utilities.templating import apply_values

    from buildctl.engines.profile import load_profile

    from ..flows.test_prefect_server import api, prefect_client, stop, wait_healthy
    from ..support.s3server import free_ports

    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env=env, cwd=REPO, stdout=open(tmp_path / "server.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, server)
        block = _page_block()
        for _ in range(2):
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env={**env, "PATH": f"{REPO / '.venv' / 'bin'}:{env['PATH']}"},
                               cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        pools = {p["name"]: p for p in api(url, "/work_pools/filter", {})}
        assert pools["buildctl-local"]["type"] == "process" and pools["buildctl-k8s-builds"]["type"] == "kubernetes"
        deployments = {d["name"]: d for d in api(url, "/deployments/filter", {})}
        import yaml

        assert set(deployments) == {d["name"] for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}
        bvp = deployments["build-validate-publish"]
        assert bvp["work_pool_name"] == "buildctl-k8s-builds"
        assert {n for n, d in deployments.items() if d["work_pool_name"] != "buildctl-local"} == {"build-validate-publish"}
        jv = bvp["job_variables"]
        assert jv["image"] == "registry.example.com/buildctl-builder:1.2.1"
        assert jv["env"]["BUILDCTL_STORE"] == "s3://engines/buildctl" and jv["env"]["BUILDCTL_BUILD_LIMIT"] == "buildctl-builds-k8s"
        with prefect_client(url) as c:
            assert c.read_global_concurrency_limit_by_name("buildctl-builds-k8s").limit == 4
        template = pools["buildctl-k8s-builds"]["base_job_template"]
        assert template == json.loads(TEMPLATE.read_text())
        for f in sorted(PROFILES.glob("*.yaml")):
            profile = load_profile(f)
            fp = h100x8() if profile.engine.backend == "trtllm" else detect()
            values = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
            values.update({**jv, **fleet.job_variables(settings(), profile, fp.compat_key(profile.engine.backend))})
            from prefect.client.schemas.objects import FlowRun
            from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

            config = KubernetesWorkerJobConfiguration(**apply_values(template["job_configuration"], values))
            config.prepare_for_flow_run(FlowRun(id=uuid4(), name="a-build", flow_id=uuid4()))
            job = _no_nulls(config.job_manifest)
            kubernetes_validate.validate(job, "1.37.0", strict=True)
            (container,) = job["spec"]["template"]["spec"]["containers"]
            assert container["args"] == ["prefect", "flow-run", "execute"] and container["image"] == jv["image"]
    finally:
        stop(server)
