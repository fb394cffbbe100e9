"""The trtllm backend's own rules, called directly: release table lookup, engine-directory checks,
recorded quantization, and every requirement a build host must meet (each alone, so one check
dropped or loosened fails here). Fast; `make mutants` runs these first for buildctl/engines/trtllm/backend.py."""

from __future__ import annotations

import json
import os

from pathlib import Path

import pytest

from buildctl.engines.errors import EngineLoadError, HostRequirementsError, ProfileError
from buildctl.engines.profile import load_profile
from buildctl.engines.trtllm.backend import (
    RELEASES,
    TrtllmBackend,
    TrtllmTools,
    calibrates,
    check_complete,
    check_quantization,
    convert_command,
    engine_config,
    expected_ranks,
    release_for,
)

from ...support.fakes.contract import parser as contract_parser
from ...support.helpers import PROFILES, settings
from ...support.trtllm_kit import FAKES, calib, fake_tools, h100x8, profile_yaml, use_release  # noqa: F401


def test_release_lookup_is_by_major_minor():
    assert release_for("1.2.1") is RELEASES[0] and release_for("1.2.0rc3") is RELEASES[0]
    assert release_for("0.16.0") is RELEASES[1]
    assert release_for("1.3.0") is None and release_for(None) is None and release_for("") is None


def test_tools_follow_the_release_installed_on_the_host(monkeypatch):
    use_release(monkeypatch, "1.2.1")
    backend = TrtllmBackend(settings())
    assert backend.tools(h100x8(version="0.16")).release is RELEASES[1]
    assert backend.tools(h100x8()).release is RELEASES[0] and backend.tools().release is RELEASES[0]


def test_tool_paths_are_frozen_and_an_unknown_installed_release_is_named(monkeypatch, tmp_path, calib):
    import dataclasses

    use_release(monkeypatch, "1.2.1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrtllmTools.from_settings(settings()).build = "/bin/true"  # type: ignore[misc]
    fp = h100x8().model_copy(update={"tensorrt_llm_version": "1.4.0"})
    unmet = TrtllmBackend(settings()).unmet_requirements(load_profile(profile_yaml(tmp_path, calib)), fp)
    assert unmet[-1] == "a TensorRT-LLM release buildctl drives (1.2, 0.16): 1.4.0 is not one"


def test_explicit_tool_paths_win_over_the_release_layout(monkeypatch):
    use_release(monkeypatch, "1.2.1")
    t = TrtllmTools.from_settings(settings())
    assert t.convert.endswith("examples/models/core/llama/convert_checkpoint.py") and t.release is RELEASES[0]
    assert TrtllmTools.from_settings(settings(), "0.16.0").convert.endswith("examples/llama/convert_checkpoint.py")
    assert TrtllmTools.from_settings(settings(), "9.9").release is RELEASES[0]  # unknown: the newest layout
    monkeypatch.setenv("BUILDCTL_TRTLLM_CONVERT", "/opt/convert.py")
    monkeypatch.setenv("BUILDCTL_TRTLLM_QUANTIZE", "/opt/quantize.py")
    t = TrtllmTools.from_settings(settings())
    assert (t.convert, t.quantize) == ("/opt/convert.py", "/opt/quantize.py")


def engine(tmp_path, mapping=None, ranks=(0,), quant=None, sizes=None):
    d = tmp_path / f"engine{len(list(tmp_path.glob('engine*')))}"
    d.mkdir()
    cfg = {"pretrained_config": {"mapping": mapping if mapping is not None else {"world_size": len(ranks)}}}
    if quant is not None:
        cfg["pretrained_config"]["quantization"] = quant
    (d / "config.json").write_text(json.dumps(cfg))
    for r in ranks:
        (d / f"rank{r}.engine").write_bytes(b"x" * (sizes or {}).get(r, 4))
    return d


def test_check_complete_names_every_missing_or_empty_rank(tmp_path):
    assert check_complete(engine(tmp_path, ranks=(0, 1)), 2) == []
    d = engine(tmp_path, mapping={"world_size": 4}, ranks=(0, 1), sizes={1: 0})
    assert check_complete(d, 2) == ["config.json maps 4 ranks, the profile asks for tp*pp = 2", "rank1.engine is empty",
                                    "rank2.engine is missing", "rank3.engine is missing"]
    assert check_complete(engine(tmp_path, mapping={"world_size": 1}, ranks=(0,)), 3)[1:] == [
        "rank1.engine is missing", "rank2.engine is missing"]
    (d / "config.json").unlink()
    assert check_complete(d, 2) == ["config.json is missing"]
    (d / "config.json").write_text("[]")
    assert check_complete(d, 2) == ["config.json is unreadable: not a JSON object"]


def test_ranks_come_from_world_size_or_tp_times_pp(tmp_path):
    assert expected_ranks(engine(tmp_path, mapping={"tp_size": 2, "pp_size": 3})) == 6
    assert expected_ranks(engine(tmp_path, mapping={"tp_size": 4})) == 4
    assert expected_ranks(engine(tmp_path, mapping={})) == 1
    assert expected_ranks(engine(tmp_path, mapping={"world_size": 8, "tp_size": 2})) == 8
    for bad in ({"world_size": "x"}, [], None):
        d = engine(tmp_path, mapping={})
        (d / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": bad}}))
        with pytest.raises(EngineLoadError, match="no readable pretrained_config.mapping"):
            expected_ranks(d)
    (d / "config.json").write_text("{broken")
    with pytest.raises(EngineLoadError, match="config.json is unreadable"):
        engine_config(d)


NO_FP8_PLUGINS = {"gemm_plugin": "auto", "use_fp8_context_fmha": False}


def no_fp8(**engine_kw):
    """Engine overrides for an unquantized variant of the shipped fp8 profile."""
    import yaml

    from ...support.trtllm_kit import PROD_SOURCE

    plugins = {**yaml.safe_load(PROD_SOURCE.read_text())["engine"]["plugins"], **NO_FP8_PLUGINS}
    return {"quantization": "none", "min_sm": None, "plugins": plugins, **engine_kw}


def spec(tmp_path, calib_dir, **engine_kw):
    return load_profile(profile_yaml(tmp_path, calib_dir, **engine_kw)).engine


def test_recorded_quantization_must_match_the_profile(tmp_path, calib):
    fp8 = spec(tmp_path, calib)  # the shipped 70B profile: fp8 weights, fp8 KV cache
    assert (fp8.quantization, fp8.kv_cache_dtype) == ("fp8", "fp8")
    ok = engine(tmp_path, quant={"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"})
    assert check_quantization(ok, fp8) == []
    dropped = engine(tmp_path, quant={"quant_algo": None, "kv_cache_quant_algo": None})
    assert check_quantization(dropped, fp8) == [
        "config.json records kv_cache_quant_algo None, the profile's kv_cache_dtype fp8 needs FP8",
        "config.json records quant_algo None, the profile asks for FP8"]
    plain = spec(tmp_path, calib, **no_fp8(kv_cache_dtype="auto"))
    assert check_quantization(engine(tmp_path), plain) == []
    assert check_quantization(engine(tmp_path, quant={"quant_algo": ""}), plain) == []
    assert check_quantization(engine(tmp_path, quant={"quant_algo": "W8A16"}), plain) == [
        "config.json records quant_algo W8A16, the profile asks for none"]
    int8kv = spec(tmp_path, calib, **no_fp8(kv_cache_dtype="int8"))
    assert check_quantization(engine(tmp_path, quant={"kv_cache_quant_algo": "INT8"}), int8kv) == []
    broken = engine(tmp_path)
    (broken / "config.json").write_text("7")
    assert check_quantization(broken, plain) == ["config.json is unreadable: not a JSON object"]


def test_what_calibrates():
    from types import SimpleNamespace as S

    assert calibrates(S(quantization="fp8", kv_cache_dtype="auto"))
    assert calibrates(S(quantization="none", kv_cache_dtype="int8"))
    assert not calibrates(S(quantization="none", kv_cache_dtype="fp8"))
    assert not calibrates(S(quantization="none", kv_cache_dtype="auto"))


def test_a_host_that_meets_every_requirement(tmp_path, calib, fake_tools):
    backend = TrtllmBackend(settings())
    assert backend.unmet_requirements(load_profile(profile_yaml(tmp_path, calib)), h100x8()) == []


@pytest.mark.parametrize("case,expected", [
    ("gpus", "GPU count >= tp_size*pp_size = 8: this host has 7"),
    ("sm", "GPU SM >= 8.9 (fp8): this host has SM 8.6"),
    ("min_sm", "GPU SM >= 9.0: this host has SM 8.9"),
    ("fp8_kv_only", "GPU SM >= 8.9 (fp8): this host has SM 8.0"),
    ("missing", "TensorRT-LLM 1.2.1 (pinned) importable: not installed on this host"),
    ("other", "TensorRT-LLM 1.2.1 (pinned, BUILDCTL_TRTLLM_VERSION) importable: this host has 0.16.0"),
    ("unknown", "a TensorRT-LLM release buildctl drives (1.2, 0.16): 1.3.0 is not one"),
    ("script", "converter script present: "),
    ("build", "trtllm-build executable: /nonexistent/trtllm-build is not found"),
    ("calibration", " is a local directory (builds never download)"),
])
def test_each_unmet_requirement_alone(tmp_path, calib, fake_tools, monkeypatch, case, expected):
    fp, engine_kw = h100x8(), {}
    if case == "gpus":
        fp = h100x8(gpus=7)
    elif case == "sm":
        fp, engine_kw = h100x8(sm="8.6"), {"min_sm": None}
    elif case == "min_sm":
        fp, engine_kw = h100x8(sm="8.9"), {"min_sm": 90}
    elif case == "fp8_kv_only":
        fp, engine_kw = h100x8(sm="8.0"), no_fp8(kv_cache_dtype="fp8")
    elif case == "missing":
        fp = fp.model_copy(update={"tensorrt_llm_version": None})
    elif case == "other":
        fp = fp.model_copy(update={"tensorrt_llm_version": "0.16.0"})
    elif case == "unknown":
        monkeypatch.setenv("BUILDCTL_TRTLLM_VERSION", "1.3.0")
        fp = fp.model_copy(update={"tensorrt_llm_version": "1.3.0"})
    elif case == "script":
        monkeypatch.setenv("BUILDCTL_TRTLLM_EXAMPLES", str(tmp_path / "nowhere"))
    elif case == "build":
        monkeypatch.setenv("BUILDCTL_TRTLLM_BUILD", "/nonexistent/trtllm-build")
    elif case == "calibration":
        calib = tmp_path / "no-such-calibration"
    unmet = TrtllmBackend(settings()).unmet_requirements(load_profile(profile_yaml(tmp_path, calib, **engine_kw)), fp)
    assert len(unmet) == 1 and expected in unmet[0], unmet


def test_sm_floors_come_from_fp8_only(tmp_path, calib, fake_tools):
    """An unquantized profile needs no particular SM; fp8 weights alone (KV cache auto) need 8.9."""
    import dataclasses

    plain = load_profile(profile_yaml(tmp_path, calib, **no_fp8(kv_cache_dtype="auto")))
    assert TrtllmBackend(settings()).unmet_requirements(plain, h100x8(sm="8.0")) == []
    weights_only = load_profile(profile_yaml(tmp_path, calib, kv_cache_dtype="auto", min_sm=None))
    assert TrtllmBackend(settings()).unmet_requirements(weights_only, h100x8(sm="8.6")) == [
        "GPU SM >= 8.9 (fp8): this host has SM 8.6"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RELEASES[0].series = "9.9"  # type: ignore[misc]


def test_an_fp8_kv_cache_without_quantization_on_a_release_without_the_flag(tmp_path, calib, monkeypatch):
    use_release(monkeypatch, "0.16")
    p = load_profile(profile_yaml(tmp_path, calib, **no_fp8(kv_cache_dtype="fp8")))
    unmet = TrtllmBackend(settings()).unmet_requirements(p, h100x8(version="0.16"))
    assert len(unmet) == 1 and "convert_checkpoint.py has no fp8 KV-cache flag (it has: --int8_kv_cache)" in unmet[0]


def test_engine_directories_are_recognised_by_config_and_rank0(tmp_path):
    d = engine(tmp_path)
    assert TrtllmBackend.recognises(d)
    os.unlink(d / "rank0.engine")
    assert not TrtllmBackend.recognises(d)


# --- trtllm checkpoint argv, exactly (guard: kills a mutant the suite once let through, #20) ---


QUANTS = ("none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo")
KVS = ("auto", "fp8", "int8", "fp16", "bf16")
PY, EX, CALIB = "/usr/bin/python3", "/app/tensorrt_llm/examples", "/data/calibration/cnn_dailymail"
COMMON = ["--model_dir", "/m", "--output_dir", "/c", "--dtype", "float16", "--tp_size", "1", "--pp_size", "1"]


def expected_argv(series: str, q: str, kv: str) -> list[str] | str:
    """By hand, from the fixtures' facts: which script, which flags (or why it is refused)."""
    if kv in ("fp16", "bf16"):
        return "profile"  # the KV cache follows the model dtype unless quantized: refused at load
    convert = f"{EX}/models/core/llama/convert_checkpoint.py" if series == "1.2" else f"{EX}/llama/convert_checkpoint.py"
    if q == "none":
        argv = [PY, convert, *COMMON]
        if kv == "fp8":
            if series == "0.16":
                return "host"  # 0.16's converter has no fp8 KV flag
            argv.append("--fp8_kv_cache")
        if kv == "int8":
            argv += ["--int8_kv_cache", "--calib_dataset", CALIB]
            if series == "1.2":
                argv += ["--calib_size", "64"]
        return argv
    argv = [PY, f"{EX}/quantization/quantize.py", *COMMON, "--qformat", q, "--calib_dataset", CALIB, "--calib_size", "64"]
    if kv in ("fp8", "int8"):
        argv += ["--kv_cache_dtype", kv]
    return argv


@pytest.mark.guard
@pytest.mark.parametrize("series", [r.series for r in RELEASES])
@pytest.mark.parametrize("q", QUANTS)
@pytest.mark.parametrize("kv", KVS)
def test_checkpoint_argv_for_every_quantization_and_kv_dtype(tmp_path, series, q, kv):
    import yaml

    data = yaml.safe_load((PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml").read_text())
    data["model"]["dtype"] = "float16"
    data["engine"].update({"quantization": q, "kv_cache_dtype": kv, "tp_size": 1, "pp_size": 1,
                           "calibration": {"dataset": CALIB, "size": 64}})
    if q != "fp8":  # fp8 context FMHA needs fp8 quantization
        data["engine"]["plugins"] = {**(data["engine"].get("plugins") or {}), "use_fp8_context_fmha": False}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    want = expected_argv(series, q, kv)
    if want == "profile":
        with pytest.raises(ProfileError, match=f"kv_cache_dtype '{kv}' with quantization '{q}'.*trtllm-kv-cache-dtype"):
            load_profile(path)
        return
    prof = load_profile(path)
    release = next(r for r in RELEASES if r.series == series)
    tools = TrtllmTools(convert=f"{EX}/{release.convert_script}", quantize=f"{EX}/{release.quantize_script}",
                       build="trtllm-build", python=PY, release=release)
    if want == "host":
        with pytest.raises(HostRequirementsError, match="no fp8 KV-cache flag"):
            convert_command(prof, Path("/m"), Path("/c"), tools)
        return
    got = convert_command(prof, Path("/m"), Path("/c"), tools)
    assert got == want
    # and the release's own argument parser (the contract fixture) accepts it
    version = "1.2.1" if series == "1.2" else "0.16"
    tool = "convert_checkpoint" if q == "none" else "quantize"
    contract_parser(version, tool).parse_args(got[2:])


def test_trtllm_build_keys_are_the_ones_published_before_engine_formats_existed():
    """trtllm engines are format 1, so their build keys carry no format field: a fleet's published
    trtllm artifacts stay cache hits (a format of 0 or 2 would rebuild every engine)."""
    from buildctl.core.digest import digest_json
    from buildctl.engines.buildkey import build_key_for

    prof, fp, model = load_profile(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml"), h100x8(), "xxh3-128:" + "2" * 32
    assert build_key_for(prof, model, fp) == digest_json({
        "profile_hash": prof.build_hash(), "model_digest": model, "compat_key": fp.compat_key("trtllm"),
        "backend_version": fp.tensorrt_llm_version})
