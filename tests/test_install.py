"""Installs as a user makes them: the wheel with no extras (a GPU node's agent) next to PyPI's
``validators`` package, then ``buildctl pull`` against a real SeaweedFS store with Prefect absent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.layout import node_key

from .support.helpers import PROFILES, REPO, make_tree, staged, write_attestation

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory) -> Path:
    """``pip install buildctl-*.whl validators`` (no extras) into a fresh venv."""
    root = tmp_path_factory.mktemp("slim")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((root / "dist").glob("buildctl-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    py = root / "venv" / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel), "validators"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return root / "venv"


def run_in(venv: Path, *args, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run from outside the checkout, so the repository's folders cannot shadow installed packages."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**_env(venv), **(env or {})})


def _env(venv: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


def test_pypi_validators_and_buildctl_coexist(slim_venv, tmp_path):
    code = ("import validators, buildctl.validators.parity as parity, buildctl.artifact_store.backends.store as store; "
            "assert validators.email('ops@example.com') is True, 'PyPI validators works'; "
            "assert 'site-packages/validators' in validators.__file__, validators.__file__; "
            "assert callable(parity.check_parity) and callable(store.open_store); "
            "import importlib.util as u; print(sorted(n for n in ('engines', 'flows', 'artifact_store') if u.find_spec(n)))")
    r = run_in(slim_venv, slim_venv / "bin" / "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", "buildctl installs no top-level package but buildctl"


def test_slim_install_pulls_from_seaweedfs_without_prefect(slim_venv, seaweed, s3_env, draft, tmp_path):
    py, exe = slim_venv / "bin" / "python", slim_venv / "bin" / "buildctl"
    r = run_in(slim_venv, py, "-c", "import importlib.util as u; print([m for m in ('prefect', 'torch', 'vllm') "
               "if u.find_spec(m)])", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)

    uri = f"s3://{seaweed.new_bucket()}/fleet"
    store = open_store(uri)
    res = publish_tree(store, make_tree(tmp_path / "engine", {"rank0.engine": 300_000, "config.json": b"{}"}), draft)
    write_attestation(store, res.artifact_id, draft.compat_key)
    promote(store, staged(store, res.artifact_id), "prod")

    # the node is the host the engine was built for: the same fingerprint, saved to a file (a slim
    # install has no torch, so its own aoti compat key differs, as it should)
    (tmp_path / "builder-fp.json").write_text(json.dumps(draft.fingerprint))
    node = tmp_path / "node"
    r = run_in(slim_venv, exe, "--store", uri, "--json", "pull", "--profile", draft.profile_name, "--channel", "prod",
               "--dest", node, "--skip-preflight", cwd=tmp_path,
               env={"BUILDCTL_FINGERPRINT_FILE": str(tmp_path / "builder-fp.json")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["installed"] and out["artifact_id"] == res.artifact_id
    assert (node / "current" / "rank0.engine").read_bytes() == (tmp_path / "engine" / "rank0.engine").read_bytes()

    r = run_in(slim_venv, exe, "--store", uri, "verify", res.artifact_id, "--deep", cwd=tmp_path)
    assert r.returncode == 0 and "re-hashed" in r.stdout, r.stderr
    r = run_in(slim_venv, exe, "--store", uri, "pull", "--profile", "no-such-profile", "--channel", "prod",
               "--dest", node, cwd=tmp_path)
    assert r.returncode == 3 and "'no-such-profile' has no channel" in r.stderr  # names the wrong name

    # node report: recorded in the store's inventory; with no Prefect, no event, and no error
    fp = json.loads(run_in(slim_venv, exe, "--json", "fingerprint", cwd=tmp_path).stdout)
    for driver in ("580.95.05", "590.44.01"):  # a driver branch upgrade under CUDA 13.1
        (tmp_path / "fp.json").write_text(json.dumps({**fp, "driver_version": driver, "gpus": [
            {"name": "NVIDIA H100 80GB HBM3", "sm": "9.0", "memory_mib": 81559}], "cuda_version": "13.1"}))
        r = run_in(slim_venv, exe, "--store", uri, "--json", "node", "report", "--node-id", "gpu-node-1",
                   "--profiles", "tiny-llama-cpu", cwd=tmp_path, env={"BUILDCTL_FINGERPRINT_FILE": str(tmp_path / "fp.json")})
        assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    # a driver-branch upgrade is soft for trtllm (a re-check, no new key), still worth an event
    assert not report["compat_changed"] and not report["event_emitted"]
    assert report["soft_changed"]["trtllm"]["driver_version"] == ["580.95.05", "590.44.01"]
    assert [k for k in store.list("inventory/nodes/")] == [node_key("gpu-node-1")]
    assert PROFILES.is_dir()
