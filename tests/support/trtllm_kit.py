"""Test kit for the trtllm backend: the contract fakes as settings, realistic fingerprints from the
release stacks in ``tests/support/fixtures/trtllm/<version>/stack.json``, and the production profile with a
local calibration directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from buildctl.engines.fingerprint import CpuInfo, Fingerprint, GpuInfo

from ..support.helpers import PROFILES, REPO

FAKES = REPO / "tests" / "support" / "fakes"
CONTRACTS = REPO / "tests" / "support" / "fixtures" / "trtllm"
PROD_SOURCE = PROFILES / "llama-3-70b-instruct-fp8-tp8.yaml"


def stack(version: str = "1.2.1") -> dict:
    """The software a TensorRT-LLM release ships with (CUDA, TensorRT, torch) and a driver for it."""
    return json.loads((CONTRACTS / version / "stack.json").read_text())


def h100x8(sm: str = "9.0", version: str = "1.2.1", gpus: int = 8) -> Fingerprint:
    s = stack(version)
    return Fingerprint(
        gpus=(GpuInfo(name="NVIDIA H100 80GB HBM3", sm=sm, memory_mib=81559),) * gpus,
        driver_version=s["driver"], cuda_version=s["cuda"], tensorrt_version=s["tensorrt"],
        tensorrt_llm_version=s["tensorrt_llm"], torch_version=s["torch"],
        cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v4"),
        platform="linux-x86_64", glibc_version="2.35", compiler_version="gcc 11.4.0")


def use_release(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """Point the settings at the fake tools laid out as ``version`` lays them out."""
    monkeypatch.setenv("BUILDCTL_TRTLLM_BUILD", str(FAKES / "trtllm-build"))
    monkeypatch.setenv("BUILDCTL_TRTLLM_EXAMPLES", str(FAKES / "trtllm" / version / "examples"))
    monkeypatch.setenv("BUILDCTL_TRTLLM_VERSION", stack(version)["tensorrt_llm"])
    monkeypatch.setenv("FAKE_TRTLLM_VERSION", version)


@pytest.fixture
def fake_tools(monkeypatch, tmp_path):
    """The 1.2.1 fakes; returns the directory where each tool records the argv it got."""
    use_release(monkeypatch, "1.2.1")
    monkeypatch.setenv("FAKE_TRTLLM_RECORD", str(tmp_path / "calls"))
    return tmp_path / "calls"


@pytest.fixture
def calib(tmp_path) -> Path:
    d = tmp_path / "calibration"
    d.mkdir()
    (d / "calib.jsonl").write_text('{"text": "local calibration text"}\n')
    return d


def profile_yaml(tmp_path: Path, calib: Path, source: Path = PROD_SOURCE, **engine: object) -> Path:
    """A copy of a shipped profile with the calibration set at ``calib`` and ``engine`` overrides."""
    data = yaml.safe_load(source.read_text())
    if "calibration" in data["engine"]:
        data["engine"]["calibration"]["dataset"] = str(calib)
    data["engine"].update(engine)
    out = tmp_path / source.name
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.fixture
def prod(tmp_path, calib) -> Path:
    """The 70B fp8 TP8 profile, calibrating from a local directory that exists."""
    return profile_yaml(tmp_path, calib)


@pytest.fixture
def hf_model(tmp_path) -> Path:
    d = tmp_path / "Meta-Llama-3-70B-Instruct"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "vocab_size": 1024}')
    (d / "model.safetensors").write_bytes(b"weights")
    return d
