"""Write docker/k8s/base-job-template.json: prefect-kubernetes's default base job template with what a
buildctl build pool adds (``--check``: fail if the committed file differs).

* variables ``gpus``, ``backend`` and ``compat_key``, which a parent flow sets per run through
  ``job_variables`` (:func:`buildctl.steps.fleet.job_variables`: the GPUs the profile's build takes,
  its backend, the target compat key);
* a required node affinity on the label ``buildctl.io/compat-<backend>`` = the compat key, which
  ``buildctl node labels`` prints for a node (run in the builder image on it), so a build pod
  lands only on a node whose GPU, driver and toolchain make that key;
* ``nvidia.com/gpu`` limits of ``gpus`` and the toleration of the NVIDIA device plugin's taint;
* requests of 4 CPUs and 16 GiB by default (a build compiles), which a parent flow sets per run
  from the profile (:func:`buildctl.steps.fleet.job_variables`), with ``ephemeral_storage`` (request
  and limit: the build's work directory and its engine before publish);
* a memory-backed ``/dev/shm`` of ``shm_size`` (NCCL and the calibration's data loaders need more
  than the container runtime's 64 MiB);
* volumes: the model cache (a PersistentVolumeClaim at /data/models, ``BUILDCTL_MODEL_CACHE``),
  the calibration data (a claim, read-only, at /data/calibration: the paths the profiles name)
  and the signing keys (a Secret, read-only, at /etc/buildctl/keys), each named by a variable;
* the service account ``buildctl-builder`` by default (its IAM role for S3 through IRSA:
  docker/k8s/cluster.yaml);
* ``completions`` and ``parallelism`` moved from the pod spec, where prefect-kubernetes 0.7.11's
  default puts them, to the Job spec, where Kubernetes reads them (the strict schema check in
  tests/docker/test_k8s.py refuses the pod-spec placement).

    python scripts/k8s_job_template.py [--check]
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docker" / "k8s" / "base-job-template.json"


def template() -> dict:
    from prefect_kubernetes.worker import KubernetesWorker

    t = copy.deepcopy(KubernetesWorker.get_default_base_job_template())
    props = t["variables"]["properties"]
    props["gpus"] = {"type": "integer", "minimum": 0, "maximum": 64, "default": 0, "title": "GPUs",
                     "description": "nvidia.com/gpu the build takes (set per run from the profile)."}
    props["backend"] = {"type": "string", "default": "trtllm", "title": "Backend",
                        "description": "The engine backend: the node label is buildctl.io/compat-<backend>."}
    props["compat_key"] = {"type": "string", "default": "unset", "title": "Compat key",
                           "description": "The compat key the build targets (set per run); only nodes labelled "
                                          "with it run the pod."}
    for name, default in (("cpu_request", "4"), ("memory_request", "16Gi")):  # a build compiles: not a tiny pod
        props[name]["default"] = default
    props["service_account_name"]["default"] = "buildctl-builder"
    for name, default, what in (
            ("ephemeral_storage", "50Gi", "Ephemeral storage the build takes (request and limit; set per run)."),
            ("shm_size", "8Gi", "Size of the memory-backed /dev/shm (set per run from the GPUs)."),
            ("model_cache_claim", "buildctl-model-cache", "PersistentVolumeClaim mounted at /data/models."),
            ("calibration_claim", "buildctl-calibration", "PersistentVolumeClaim mounted read-only at /data/calibration."),
            ("signing_secret", "buildctl-signing-key", "Secret mounted read-only at /etc/buildctl/keys.")):
        props[name] = {"type": "string", "default": default, "title": name.replace("_", " ").capitalize(),
                       "description": what}
    job_spec = t["job_configuration"]["job_manifest"]["spec"]
    spec = job_spec["template"]["spec"]
    for field in ("completions", "parallelism"):  # Job fields that Prefect's default puts in the pod spec
        job_spec[field] = spec.pop(field)
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "buildctl.io/compat-{{ backend }}", "operator": "In",
                               "values": ["{{ compat_key }}"]}]}]}}}
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (container,) = spec["containers"]
    container["resources"]["limits"]["nvidia.com/gpu"] = "{{ gpus }}"
    container["resources"]["limits"]["ephemeral-storage"] = "{{ ephemeral_storage }}"
    container["resources"]["requests"]["ephemeral-storage"] = "{{ ephemeral_storage }}"
    container["volumeMounts"] = [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "model-cache", "mountPath": "/data/models"},
        {"name": "calibration", "mountPath": "/data/calibration", "readOnly": True},
        {"name": "signing-key", "mountPath": "/etc/buildctl/keys", "readOnly": True}]
    spec["volumes"] = [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "{{ shm_size }}"}},
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": "{{ model_cache_claim }}"}},
        {"name": "calibration", "persistentVolumeClaim": {"claimName": "{{ calibration_claim }}", "readOnly": True}},
        {"name": "signing-key", "secret": {"secretName": "{{ signing_secret }}", "defaultMode": 0o440}}]
    return t


def main(argv: list[str]) -> int:
    text = json.dumps(template(), indent=2, sort_keys=True) + "\n"
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            sys.stderr.write(f"{OUT} is stale: run python scripts/k8s_job_template.py\n")
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
