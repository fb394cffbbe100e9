"""The trtllm backend around the GPU parts, against fake trtllm-build and converter executables.

These fakes check the exact arguments they receive and can succeed, crash with SIGSEGV, hang,
exit 1 with an error log, or leave an incomplete rank set. Real TensorRT-LLM never ran here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildctl.artifact_store.read import get_manifest
from buildctl.engines.errors import EngineBuildError, HostRequirementsError
from buildctl.engines.profile import load_profile, parse_profile
from buildctl.engines.trtllm.backend import TrtllmBackend, TrtllmTools, build_command, check_complete, convert_command

from ...support.helpers import REPO, settings
from ...support.trtllm_kit import FAKES, calib, fake_tools, h100x8, hf_model, prod  # noqa: F401  (fixtures)


def tools() -> TrtllmTools:
    """The tool paths the settings name (the fake_tools fixture points them at the fakes)."""
    return TrtllmTools.from_settings(settings())


def expected_args(model: Path, ckpt: str, out: str, calib_dir: Path) -> dict:
    return {
        "convert": ["--model_dir", str(model), "--output_dir", ckpt, "--dtype", "bfloat16", "--tp_size", "8",
                    "--pp_size", "1", "--qformat", "fp8", "--calib_dataset", str(calib_dir), "--calib_size", "512",
                    "--kv_cache_dtype", "fp8"],
        "build": ["--checkpoint_dir", ckpt, "--output_dir", out, "--max_batch_size", "256", "--max_input_len", "7168",
                  "--max_seq_len", "8192", "--max_num_tokens", "16384", "--kv_cache_type", "paged",
                  "--gemm_plugin", "disable", "--gpt_attention_plugin", "auto", "--use_paged_context_fmha", "enable",
                  "--use_fp8_context_fmha", "enable", "--remove_input_padding", "enable", "--context_fmha", "enable",
                  "--multiple_profiles", "enable", "--workers", "8"],
    }


def test_commands_map_the_profile(hf_model, fake_tools, prod, calib):
    p = load_profile(prod)
    conv = convert_command(p, hf_model, Path("/w/ckpt"), tools())
    assert conv[0] == sys.executable and conv[1] == str(FAKES / "trtllm/1.2.1/examples/quantization/quantize.py")
    exp = expected_args(hf_model, "/w/ckpt", "/w/engine", calib)
    assert conv[2:] == exp["convert"]
    assert build_command(p, Path("/w/ckpt"), Path("/w/engine"), tools())[1:] == exp["build"]
    plain = parse_profile({"name": "x", "model": {"path": "/m"}, "engine": {"backend": "trtllm", "tp_size": 2}})
    assert "--qformat" not in convert_command(plain, hf_model, Path("/c"), tools())
    assert convert_command(plain, hf_model, Path("/c"), tools())[1].endswith("examples/models/core/llama/convert_checkpoint.py")
    assert "--max_num_tokens" not in build_command(plain, Path("/c"), Path("/o"), tools())


def test_successful_build_checks_exact_arguments(hf_model, fake_tools, prod, calib, tmp_path, monkeypatch):
    out = tmp_path / "out" / "engine"
    out.parent.mkdir()
    # The build's work dir name is random: record the calls once, then re-run with strict expectations.
    res = TrtllmBackend(settings()).build(load_profile(prod), hf_model, out, h100x8(), tmp_path / "build.log")
    assert sorted(res.files) == sorted(["config.json"] + [f"rank{r}.engine" for r in range(8)])
    calls = {t: json.loads((fake_tools / f"{t}.jsonl").read_text().splitlines()[0]) for t in ("convert", "build")}
    ckpt = calls["convert"][calls["convert"].index("--output_dir") + 1]
    engine = calls["build"][calls["build"].index("--output_dir") + 1]
    assert calls == expected_args(hf_model, ckpt, engine, calib)
    assert Path(ckpt).parent == Path(engine).parent and Path(ckpt).parent.parent == out.parent  # same filesystem
    assert not Path(ckpt).parent.exists(), "the build's temp dir is removed"


def test_fake_fails_a_build_given_wrong_arguments(hf_model, fake_tools, prod, tmp_path, monkeypatch):
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"build": ["--checkpoint_dir", "somewhere-else"]}))
    monkeypatch.setenv("FAKE_TRTLLM_EXPECT", str(expect))
    with pytest.raises(EngineBuildError) as exc:
        TrtllmBackend(settings()).build(load_profile(prod), hf_model, tmp_path / "engine", h100x8(), tmp_path / "build.log")
    assert exc.value.kind == "exit" and exc.value.returncode == 3 and "unexpected arguments" in exc.value.log_tail


@pytest.mark.parametrize("mode,kind,needle", [
    ("segv", "crashed", "SIGSEGV"),
    ("hang", "timeout", "timeout"),
    ("exit1", "exit", "out of memory while building rank 3"),
    ("incomplete", "incomplete", "rank7.engine is missing"),
])
def test_failures_map_to_build_failed(hf_model, fake_tools, prod, tmp_path, monkeypatch, mode, kind, needle):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", mode)
    data = json.loads(json.dumps(load_profile(prod).model_dump(mode="json")))
    data["engine"]["build_timeout_s"] = 3
    prof = parse_profile(data)
    out = tmp_path / "out" / "engine"
    out.parent.mkdir()
    log = tmp_path / "build.log"
    with pytest.raises(EngineBuildError) as exc:
        TrtllmBackend(settings()).build(prof, hf_model, out, h100x8(), log)
    err = exc.value
    assert err.kind == kind and needle in str(err)
    assert err.log_path == str(log) and f"[fake build] starting, mode={mode}" in log.read_text()
    if mode == "segv":
        assert err.signal == 11
    if mode == "exit1":
        assert needle in err.log_tail and err.returncode == 1
    assert not out.exists() and list(out.parent.iterdir()) == [], "a failed build leaves nothing that looks like an engine"


def test_incomplete_check_rules(tmp_path):
    d = tmp_path / "e"
    d.mkdir()
    assert check_complete(d, 2) == ["config.json is missing"]
    (d / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"world_size": 2}}}))
    (d / "rank0.engine").write_bytes(b"x")
    (d / "rank1.engine").write_bytes(b"")
    assert check_complete(d, 2) == ["rank1.engine is empty"]
    (d / "rank1.engine").write_bytes(b"y")
    assert check_complete(d, 2) == []
    assert check_complete(d, 4)[0].startswith("config.json maps 2 ranks")


def test_host_checks_before_building(hf_model, fake_tools, prod, tmp_path):
    with pytest.raises(HostRequirementsError) as exc:
        TrtllmBackend(settings()).build(load_profile(prod), hf_model, tmp_path / "e", h100x8(sm="8.0"), tmp_path / "l")
    assert exc.value.unmet == ["GPU SM >= 8.9: this host has SM 8.0"]
    with pytest.raises(HostRequirementsError) as exc:
        TrtllmBackend(settings()).build(load_profile(prod), hf_model, tmp_path / "e", h100x8(gpus=4), tmp_path / "l")
    assert exc.value.unmet == ["GPU count >= tp_size*pp_size = 8: this host has 4"]
    assert not (fake_tools / "build.jsonl").exists() and not (fake_tools / "convert.jsonl").exists(), "no tool ran"


def write_fp(tmp_path: Path, fp: Fingerprint) -> Path:
    f = tmp_path / "fp.json"
    f.write_text(json.dumps(fp.model_dump(mode="json")))
    return f


def test_cli_build_publishes_and_caches(cli, hf_model, fake_tools, prod, tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(write_fp(tmp_path, h100x8())))
    store = tmp_path / "store"
    code, out, err = cli("--store", store, "--json", "build", prod, "--model", hf_model)
    assert code == 0, err
    res = json.loads(out)
    assert not res["cache_hit"]
    from buildctl.artifact_store.backends.store import open_store

    m = get_manifest(open_store(str(store)), res["artifact_id"])
    assert m.backend == "trtllm" and m.build_key == res["build_key"] and m.build_log is not None
    assert len([f for f in m.files if f.path.endswith(".engine")]) == 8
    assert m.compat_key == h100x8().compat_key("trtllm") and m.tool_versions["backend"] == "1.2.1"
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "segv")  # would crash if a builder ran
    code, out, err = cli("--store", store, "--json", "build", prod, "--model", hf_model)
    assert code == 0 and json.loads(out)["cache_hit"] and json.loads(out)["artifact_id"] == res["artifact_id"]
    assert len((fake_tools / "build.jsonl").read_text().splitlines()) == 1, "the cache hit started no builder"


def test_cli_build_failure_exit_7_keeps_log(cli, hf_model, fake_tools, prod, tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(write_fp(tmp_path, h100x8())))
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "exit1")
    store, work = tmp_path / "store", tmp_path / "work"
    code, out, err = cli("--store", store, "build", prod, "--model", hf_model, "--workdir", work)
    assert code == 7
    assert "trtllm build failed (exit)" in err and "out of memory while building rank 3" in err
    kept = [p for p in work.iterdir() if p.name.startswith("buildctl-failed-")]
    assert len(kept) == 1 and "Engine building failed" in kept[0].read_text() and str(kept[0]) in err
    assert not (store / "manifests").exists() or list((store / "manifests").iterdir()) == []


def test_cli_target_mismatch_exit_2(cli, hf_model, fake_tools, prod, tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(write_fp(tmp_path, h100x8())))
    code, _, err = cli("--store", tmp_path / "s", "build", prod, "--model", hf_model,
                       "--target-compat-key", h100x8(sm="8.9").compat_key("trtllm"))
    assert code == 2 and "cannot build for target" in err
    assert not (fake_tools / "convert.jsonl").exists()


def test_trtllm_preflight_deserializes_every_rank(tmp_path):
    d = tmp_path / "engine"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"world_size": 2}}}))
    (d / "rank0.engine").write_bytes(b"plan 0")
    (d / "rank1.engine").write_bytes(b"plan 1")
    env = {**os.environ, "PYTHONPATH": f"{FAKES / 'pymods'}{os.pathsep}{REPO}"}
    ok = subprocess.run([sys.executable, "-m", "buildctl.engines.preflight", "trtllm", str(d)], env=env, capture_output=True,
                        text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    (d / "rank1.engine").write_bytes(b"plan 1 WRONG-DEVICE")
    bad = subprocess.run([sys.executable, "-m", "buildctl.engines.preflight", "trtllm", str(d)], env=env, capture_output=True,
                         text=True, cwd=REPO)
    assert bad.returncode == 2 and "could not deserialize rank1.engine" in bad.stderr
