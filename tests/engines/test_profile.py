from __future__ import annotations


import pytest
import yaml

from buildctl.engines.errors import ProfileError
from buildctl.engines.profile import HASH_EXCLUDED_FIELDS, BuildProfile, load_profile, load_profile_text, parse_profile

from ..support.helpers import PROFILES

ALL = sorted(PROFILES.glob("*.yaml"))


def base() -> dict:
    return yaml.safe_load((PROFILES / "tiny-llama-cpu.yaml").read_text())


def prod() -> dict:
    return yaml.safe_load((PROFILES / "llama-3-70b-instruct-fp8-tp8.yaml").read_text())


def set_path(data: dict, dotted: str, value) -> dict:
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return data


def problems(data, source="x.yaml") -> list[tuple[str, str]]:
    with pytest.raises(ProfileError) as exc:
        parse_profile(data, source)
    assert exc.value.source == source
    return [(p.path, p.rule) for p in exc.value.problems]


def test_shipped_profiles_load():
    assert len(ALL) == 5
    names = {load_profile(p).name for p in ALL}
    assert names == {"llama-3-70b-instruct-fp8-tp8", "llama-3-8b-instruct-fp8-tp1", "llama-3-8b-instruct-fp8-trtllm-torch", "tiny-llama-cpu", "tiny-llama-vllm-cpu"}


def test_production_profile_matches_the_fleet():
    p = load_profile(PROFILES / "llama-3-70b-instruct-fp8-tp8.yaml")
    assert (p.engine.backend, p.engine.quantization, p.engine.tp_size, p.engine.max_seq_len) == ("trtllm", "fp8", 8, 8192)
    assert p.engine.resolved_plugins.kv_cache_type == "paged"
    r = p.reference
    assert (r.tensor_parallel_size, r.gpu_memory_utilization, r.max_model_len, r.block_size) == (8, 0.92, 8192, 16)
    assert (r.enable_prefix_caching, r.max_num_seqs, r.kv_cache_dtype) == (True, 256, "fp8")


def test_models_are_frozen():
    p = parse_profile(base())
    with pytest.raises(Exception):
        p.name = "other"  # type: ignore[misc]


def test_unknown_key_names_the_path():
    assert problems(set_path(base(), "engine.max_sequence_len", 10)) == [("engine.max_sequence_len", "extra_forbidden")]


def test_wrong_type_names_the_path():
    assert problems(set_path(base(), "engine.max_batch_size", "eight")) == [("engine.max_batch_size", "int_parsing")]


def test_max_input_len_above_max_seq_len():
    data = set_path(base(), "engine.max_input_len", 4096)
    assert problems(data) == [("engine.max_input_len", "max_input_len<=max_seq_len")]


def test_fp8_on_aoti_is_refused():
    assert problems(set_path(base(), "engine.quantization", "fp8")) == [("engine.quantization", "aoti-no-quantization")]


def test_fp8_needs_sm89():
    assert problems(set_path(prod(), "engine.min_sm", 80)) == [("engine.min_sm", "fp8-needs-sm89")]


def test_aoti_is_single_rank():
    assert problems(set_path(base(), "engine.tp_size", 2)) == [("engine.tp_size", "aoti-single-rank")]


def test_fp8_context_fmha_needs_fp8():
    data = set_path(prod(), "engine.quantization", "none")
    data["engine"]["kv_cache_dtype"] = "auto"
    assert problems(data) == [("engine.plugins.use_fp8_context_fmha", "fp8-context-fmha-needs-fp8")]


def test_exactly_one_model_source():
    data = set_path(base(), "model.path", "/models/x")
    assert problems(data) == [("model.path", "model-source")]


def test_speed_gate_statistics_rules():
    # too few pairs for the interval's level (6 for 95%, 8 for 99%)
    assert problems(set_path(base(), "validation.speed.repetitions", 5)) == [
        ("validation.speed.repetitions", "repetitions-for-confidence")]
    data = set_path(base(), "validation.speed.confidence", 0.99)
    assert problems(data) == [("validation.speed.repetitions", "repetitions-for-confidence")]
    assert parse_profile(set_path(data, "validation.speed.repetitions", 8)).validation.speed.repetitions == 8
    assert problems(set_path(base(), "validation.speed.max_repetitions", 4)) == [
        ("validation.speed.max_repetitions", "max_repetitions>=repetitions")]
    # p99 of fewer than 100 requests is one sample
    assert problems(set_path(base(), "validation.speed.num_prompts", 99)) == [
        ("validation.speed.num_prompts", "p99-needs-100-requests")]
    data = set_path(base(), "validation.speed.num_prompts", 20)
    data = set_path(data, "validation.speed.max_p99_ttft_ratio", None)
    data["validation"]["speed"]["levels"] = {1: {"min_throughput_ratio": 0.5}, 4: {"max_p50_ttft_ratio": 2.0}}
    assert parse_profile(data).validation.speed.num_prompts == 20  # p99 not gated anywhere: fewer requests are fine
    data["validation"]["speed"]["levels"][8] = {"min_throughput_ratio": 0.5}
    assert problems(data) == [("validation.speed.levels", "levels-are-measured")]


def test_speed_thresholds_per_level_override_the_defaults():
    data = set_path(base(), "validation.speed.levels", {1: {"min_throughput_ratio": 0.75}, 4: {"max_p99_ttft_ratio": 1.5}})
    data = set_path(set_path(data, "validation.speed.min_throughput_ratio", 1.2), "validation.speed.max_p99_ttft_ratio", 1.0)
    gate = parse_profile(data).validation.speed
    assert gate.thresholds_at(1)["min_throughput_ratio"] == 0.75 and gate.thresholds_at(4)["min_throughput_ratio"] == 1.2
    assert gate.thresholds_at(4)["max_p99_ttft_ratio"] == 1.5 and gate.thresholds_at(1)["max_p99_ttft_ratio"] == 1.0
    assert gate.thresholds_at(4)["max_tpot_ratio"] is None


def test_production_speed_gates_keep_the_seeds_scale():
    for name in ("llama-3-8b-instruct-fp8-tp1", "llama-3-70b-instruct-fp8-tp8"):
        gate = load_profile(PROFILES / f"{name}.yaml").validation.speed
        assert gate.concurrency == (1, 16, 64, 256)
        assert all(gate.thresholds_at(c)["min_throughput_ratio"] == 1.0 and gate.thresholds_at(c)["max_p99_ttft_ratio"] == 1.0
                   for c in gate.concurrency)


def test_bad_name():
    assert problems(set_path(base(), "name", "Tiny_Llama")) == [("name", "string_pattern_mismatch")]


def test_yaml_syntax_error_names_line():
    with pytest.raises(ProfileError) as exc:
        load_profile_text("name: x\nengine: [unclosed\n", "broken.yaml")
    (p,) = exc.value.problems
    assert p.rule == "yaml-syntax" and "line" in p.message
    assert str(exc.value).startswith("broken.yaml:")


def test_not_a_mapping():
    assert problems(["a", "b"]) == [("", "mapping")]


# --- the build-affecting hash ---------------------------------------------------------------

AFFECTING = [
    ("engine.max_seq_len", 4096),
    ("engine.max_batch_size", 64),
    ("engine.max_input_len", 512),
    ("engine.aoti.cpu_isa", "avx512"),
    ("model.dtype", "bfloat16"),
]
EXCLUDED = [
    ("name", "another-name"),
    ("model.tiny.seed", 7),
    ("engine.build_timeout_s", 5),
    ("reference.max_num_seqs", 3),
    ("validation.max_tokens", 8),
    ("validation.speed.min_throughput_ratio", 0.5),
]


@pytest.mark.parametrize("path,value", AFFECTING)
def test_build_affecting_change_changes_hash(path, value):
    before = parse_profile(base()).build_hash()
    after = parse_profile(set_path(base(), path, value)).build_hash()
    assert before != after


@pytest.mark.parametrize("path,value", EXCLUDED)
def test_excluded_change_keeps_hash(path, value):
    before = parse_profile(base()).build_hash()
    after = parse_profile(set_path(base(), path, value)).build_hash()
    assert before == after


def test_trtllm_hash_rules():
    h = parse_profile(prod()).build_hash()
    assert parse_profile(set_path(prod(), "engine.plugins.workers", 2)).build_hash() == h
    assert parse_profile(set_path(prod(), "model.uri", "s3://elsewhere/x")).build_hash() == h
    assert parse_profile(set_path(prod(), "engine.plugins.multiple_profiles", False)).build_hash() != h
    assert parse_profile(set_path(prod(), "engine.tp_size", 4) | {"reference": prod()["reference"]}).build_hash() != h


def test_omitted_defaults_hash_like_written_defaults():
    data = base()
    del data["engine"]["aoti"]
    assert parse_profile(data).build_hash() == parse_profile(base()).build_hash()


def test_every_exclusion_is_a_real_field():
    import typing

    for dotted, why in HASH_EXCLUDED_FIELDS.items():
        assert why, dotted
        model = BuildProfile
        for part in dotted.split("."):
            assert part in model.model_fields, dotted
            ann = model.model_fields[part].annotation
            subs = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and hasattr(a, "model_fields")]
            model = subs[0] if subs else None


def test_hash_format():
    h = parse_profile(base()).build_hash()
    assert h.startswith("xxh3-128:") and len(h) == len("xxh3-128:") + 32


def test_every_field_has_a_description():
    def walk(model):
        for name, f in model.model_fields.items():
            assert f.description, f"{model.__name__}.{name} has no description"
            ann = f.annotation
            for sub in getattr(ann, "__args__", ()) + (ann,):
                if isinstance(sub, type) and hasattr(sub, "model_fields"):
                    walk(sub)

    walk(BuildProfile)


def test_every_cpu_isa_a_profile_can_name_has_its_compile_environment():
    from typing import get_args

    from buildctl.engines.profile import ISA_ENV, AotiOptions, VllmOptions

    for options in (AotiOptions, VllmOptions):
        named = set(get_args(options.model_fields["cpu_isa"].annotation))
        assert named and named <= set(ISA_ENV), (options.__name__, named - set(ISA_ENV))
