"""A trtllm-torch bundle of the tiny Llama end to end through the CLI, against the fake LLM API
(which runs the tiny Llama with transformers, so parity against the vLLM reference compares real
outputs): build (once per build key), validate with the warm-start gate recorded in the
attestation, promote, pull and ``node env``. Slow: a vLLM reference validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from ...support.helpers import PROFILES, REPO
from ...support.trtllm_torch_kit import FAKES, torch_host

pytestmark = pytest.mark.slow

QUICK = {"concurrency": [1], "levels": {}, "min_throughput_ratio": 0.05, "max_p99_ttft_ratio": None,
         "num_prompts": 16, "repetitions": 6, "max_repetitions": 6, "max_seconds": 60, "warmup": 0}


def _buildctl(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "buildctl", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env}, cwd=REPO)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("trtllm-torch-e2e")
    doc = yaml.safe_load((PROFILES / "tiny-llama-vllm-cpu.yaml").read_text())
    doc["name"] = "tiny-llama-trtllm-torch-cpu"
    doc["engine"]["backend"] = "trtllm-torch"
    del doc["engine"]["vllm"]
    doc["validation"]["speed"] = {k: v for k, v in {**doc["validation"]["speed"], **QUICK}.items()}
    doc["validation"]["warm_start"] = {"pairs": 1, "max_warm_cold_ratio": 0.75}
    profile = root / "tiny-llama-trtllm-torch-cpu.yaml"
    profile.write_text(yaml.safe_dump(doc))
    fp = torch_host("1.2.1")
    (root / "fp.json").write_text(fp.model_dump_json())
    env = {"BUILDCTL_STORE": f"file://{root / 'store'}", "BUILDCTL_FINGERPRINT_FILE": str(root / "fp.json"),
           "PYTHONPATH": f"{FAKES / 'pymods'}:{REPO}", "FAKE_TRTLLM_VERSION": "1.2.1",
           "FAKE_GPU_NAME": fp.gpus[0].name, "FAKE_GPU_SM": fp.gpus[0].sm,
           "FAKE_TRTLLM_COMPILE_S": "0.1"}  # a cold start compiles and tunes for seconds, as a real one for minutes
    r = _buildctl("--json", "build", str(profile), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    built = json.loads(r.stdout)
    again = _buildctl("--json", "build", str(profile), env=env)  # never twice for one build key
    assert again.returncode == 0 and json.loads(again.stdout)["cache_hit"], again.stderr[-2000:]
    return {"root": root, "profile": profile, "env": env, "artifact_id": built["artifact_id"]}


def test_a_bundle_validates_with_proof_of_use_pulls_and_prints_its_serve_command(bundle):
    aid, env, root = bundle["artifact_id"], bundle["env"], bundle["root"]
    r = _buildctl("--json", "validate", aid, "--profile", str(bundle["profile"]), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    att = json.loads(r.stdout)
    ws = att["warm_start"]
    assert ws["cache_used"] is True and ws["installed_unchanged"] is True, ws
    assert max(ws["warm_s"]) < min(ws["cold_s"]), ws
    assert any("loaded the autotuner file" in c for c in ws["checked"]), ws["checked"]
    assert att["parity"]["identical"] == att["parity"]["prompts"] > 0, att["parity"]
    r = _buildctl("promote", aid, "--channel", "staging", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = _buildctl("--json", "pull", "--profile", "tiny-llama-trtllm-torch-cpu", "--channel", "staging",
                  "--dest", str(root / "node"), env={**env, "BUILDCTL_PROFILE_DIR": str(root)})
    assert r.returncode == 0, r.stderr[-3000:]
    r = _buildctl("node", "env", "--dest", str(root / "node"), env=env)
    assert r.returncode == 0 and "trtllm-serve model --backend pytorch --config config.yaml" in r.stdout, r.stderr
