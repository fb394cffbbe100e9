"""The images and the compose stack on the real Docker engine (#50): `make images` builds every
image this machine can build from requirements.lock, each image's entrypoint answers `--help` and
its Python imports every module of the code it runs; the stack comes up, runs build -> validate ->
publish -> staging -> pull across its containers, and goes away. `make test-stack` runs these (marker
``stack``); CI does not (docs/deployment.md gives their time). Skipped, with the reason, where there
is no Docker engine; started as root where dockerd is installed but not running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid

import pytest

from ..support.helpers import REPO
from ..support.s3server import free_ports

pytestmark = pytest.mark.stack

IMPORT_ALL = ("import importlib, pkgutil, sys, buildctl\n"
              "allowed = set(sys.argv[1].split(',')) if len(sys.argv) > 1 and sys.argv[1] else set()\n"
              "bad = []\n"
              "for m in pkgutil.walk_packages(buildctl.__path__, 'buildctl.'):\n"
              "    if m.name.endswith('__main__'):\n"
              "        continue  # importing it runs the CLI\n"
              "    try:\n"
              "        importlib.import_module(m.name)\n"
              "    except ModuleNotFoundError as err:\n"
              "        if (err.name or '').split('.')[0] not in allowed:\n"
              "            bad.append(f'{m.name}: {err}')\n"
              "print(len(list(pkgutil.walk_packages(buildctl.__path__, 'buildctl.'))), 'modules')\n"
              "sys.exit('\\n'.join(bad) if bad else 0)\n")


@pytest.fixture(scope="module")
def docker():
    if shutil.which("docker") is None:
        pytest.skip("no Docker engine here (docker is not installed)")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            pytest.skip("no Docker engine running, and dockerd cannot be started here (not root, or not installed)")
        subprocess.Popen(["dockerd"], stdout=open("/tmp/dockerd.log", "ab"), stderr=subprocess.STDOUT,
                         start_new_session=True)
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "dockerd did not come up in 60 s (/tmp/dockerd.log)"
            time.sleep(1)
    return "docker"


@pytest.fixture(scope="module")
def images(docker):
    t0 = time.monotonic()
    r = subprocess.run(["scripts/images.sh"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"make images: {time.monotonic() - t0:.0f} s\n{r.stderr[-1500:]}")
    return {"cpu": "buildctl-cpu:dev", "validator": "buildctl-validator:dev", "builder-python": "buildctl-builder-python:dev"}


@pytest.mark.parametrize("name", ["cpu", "validator", "builder-python"])
def test_each_images_entrypoint_answers_help_and_its_python_imports_every_module(images, name):
    image = images[name]
    r = subprocess.run(["docker", "run", "--rm", image, "--help"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Usage: buildctl" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    # the GPU builder's base (NVIDIA's image) brings torch, TensorRT-LLM and the model stack; on the
    # CPU base only those may be missing
    allowed = "torch,tensorrt_llm,vllm,transformers,tokenizers,safetensors,numpy" if name == "builder-python" else ""
    python = "python3" if name == "builder-python" else "python"
    r = subprocess.run(["docker", "run", "--rm", image, python, "-c", IMPORT_ALL, allowed], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert int(r.stdout.split()[0]) > 100


def test_a_kubernetes_jobs_command_reaches_prefect_flow_run_execute(images):
    """The rendered Job runs `prefect flow-run execute` in the image (its args, through the
    entrypoint): with a made-up flow-run id and no server, Prefect itself answers about the run,
    not a CLI usage error."""
    env = ["-e", f"PREFECT__FLOW_RUN_ID={uuid.uuid4()}", "-e", "PREFECT_API_URL=http://127.0.0.1:9/api"]
    r = subprocess.run(["docker", "run", "--rm", *env, images["builder-python"], "prefect", "flow-run", "execute"],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Usage:" not in out and "No such command" not in out, out[-3000:]
    assert "flow" in out.lower() and ("connect" in out.lower() or "api" in out.lower()), out[-3000:]


def test_the_stack_runs_the_pipeline_across_its_containers(images, tmp_path):
    prefect_port, s3_port = free_ports(2)
    env = {**os.environ, "STACK_PROJECT": f"buildctl-test-{uuid.uuid4().hex[:6]}",
           "BUILDCTL_PREFECT_PORT": str(prefect_port), "BUILDCTL_S3_PORT": str(s3_port)}
    t0 = time.monotonic()
    try:
        up = subprocess.run(["scripts/stack.sh", "up"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-5000:]
        t_up = time.monotonic() - t0
        demo = subprocess.run(["scripts/stack.sh", "demo"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=2400)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-5000:]
        generated = json.loads(demo.stdout)  # generate --json is the only thing on stdout
        assert len(generated["token_ids"]) == 8, generated
        # the artifact is in the stack's SeaweedFS (through its published port, the admin identity),
        # and the node's pull is recorded in the store's inventory
        import boto3

        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3_port}", aws_access_key_id="admin",
                          aws_secret_access_key="admin-secret-change-me", region_name="us-east-1")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="engines", Prefix="buildctl/")["Contents"]]
        assert any(k.startswith("buildctl/manifests/") for k in keys) and any("/staging/" in k for k in keys), keys
        assert any(k.startswith("buildctl/inventory/nodes/") for k in keys), keys
        print(f"stack up {t_up:.0f} s, demo {time.monotonic() - t0 - t_up:.0f} s")
    finally:
        down = subprocess.run(["scripts/stack.sh", "down"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        assert down.returncode == 0, down.stderr[-2000:]
    left = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={env['STACK_PROJECT']}"],
                          capture_output=True, text=True).stdout.split()
    assert not left, left
