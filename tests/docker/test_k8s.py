"""#30 item 5: the Kubernetes work pool's base job template, rendered without a cluster.

Prefect's own rendering (``apply_values``, the function every worker renders a job template
with; then prefect-kubernetes's ``KubernetesWorkerJobConfiguration`` and its
``prepare_for_flow_run``) of docker/k8s/base-job-template.json with each shipped profile's job
variables (``buildctl.fleet.job_variables``) for a compat key gives a Kubernetes Job that
validates, offline and strictly, against the Kubernetes 1.37 schemas (kubernetes-validate), asks
for the GPUs the profile's build takes, and selects exactly the nodes labelled with the key
(``buildctl node labels``)."""

from __future__ import annotations

import json
import subprocess
import sys
from uuid import uuid4

import pytest

from buildctl import fleet
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
