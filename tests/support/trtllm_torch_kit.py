"""Test kit for the trtllm-torch backend: a host as the fake LLM API sees it (one H100 by default,
a TensorRT-LLM release of :data:`RELEASES`), a tiny checkpoint and a small profile. The 1.4.0rc1
host differs from 1.2.1's in the TensorRT-LLM version only: the candidate's stack is not pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile, parse_profile
from buildctl.engines.trtllm_torch.backend import RELEASES

from .helpers import REPO
from .trtllm_kit import h100x8

FAKES = REPO / "tests" / "support" / "fakes"


def torch_host(version: str = "1.2.1", **over) -> Fingerprint:
    fp = h100x8(gpus=1).model_copy(update={"tensorrt_llm_version": version, "triton_version": "3.5.0",
                                           "flashinfer_version": "0.5.3", "deep_gemm_version": "2.1.0"})
    return fp.model_copy(update=over)


def use_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fp: Fingerprint, *, gpu: tuple[str, str] | None = None) -> Path:
    """This process and its children see ``fp`` (the settings' fingerprint file) and the fake LLM
    API of its release; ``gpu``: what the fake's torch.cuda says, when it is not ``fp``'s GPU."""
    path = tmp_path / f"fingerprint-{fp.digest()[:12]}.json"
    path.write_text(fp.model_dump_json())
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(path))
    monkeypatch.setenv("FAKE_TRTLLM_VERSION", str(fp.tensorrt_llm_version))
    monkeypatch.setenv("PYTHONPATH", f"{FAKES / 'pymods'}:{REPO}")
    name, sm = gpu or (fp.gpus[0].name, fp.gpus[0].sm)
    monkeypatch.setenv("FAKE_GPU_NAME", name)
    monkeypatch.setenv("FAKE_GPU_SM", sm)
    return path


def checkpoint(root: Path, *, fp8: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 64}))
    if fp8:
        (root / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    return root


def small_profile(**engine) -> BuildProfile:
    return parse_profile({"name": "tiny-trtllm-torch", "model": {"uri": "s3://models/tiny", "dtype": "bfloat16"},
                          "engine": {"backend": "trtllm-torch", "max_batch_size": 4, "max_input_len": 1024,
                                     "max_seq_len": 2048, "max_num_tokens": 64, **engine}})


@pytest.fixture(params=sorted(RELEASES))
def release(request) -> str:
    return request.param
