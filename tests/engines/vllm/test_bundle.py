"""The vllm backend (buildctl.engines.vllm.bundle) without starting vLLM: its compat key from the
facts, the cache-use evidence, the serving plan, the bundle record, the profile rules and the
attestation's warm-start gate. The end-to-end tests that build and start vLLM are in
tests/engines/vllm/test_bundle_e2e.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildctl.engines.errors import EngineLoadError, IncompatibleTargetError
from buildctl.engines.fingerprint import CpuInfo, Fingerprint
from buildctl.engines.profile import ProfileError, build_affecting_fields, load_profile, parse_profile
from buildctl.engines.vllm.bundle import (
    BUNDLE_FORMAT,
    VllmBackend,
    cache_evidence,
    cache_files,
    check_compat,
    engine_arguments,
    hash_dirs,
    read_record,
    serving_plan,
    warmup_shapes,
)

from ...support.helpers import PROFILES, attestation

FLAGS_V4 = ("avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl", "bmi1", "bmi2", "f16c", "fma")
PROFILE = load_profile(PROFILES / "tiny-llama-vllm-cpu.yaml")


def host(**over) -> Fingerprint:
    base = dict(torch_version="2.13.0+cpu", vllm_version="0.32.0", platform="linux-x86_64", glibc_version="2.36",
                compiler_version="gcc 12.2.0", cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=FLAGS_V4))
    return Fingerprint(**{**base, **over})


def test_the_compat_key_takes_the_isa_level_not_the_exact_flags():
    """Kernels are compiled for a fixed x86-64 level (TORCHINDUCTOR_CPP_MARCH), so two hosts of one
    level with other flag sets share a bundle (a soft change: re-check); another level does not."""
    a = host()
    other_flags = host(cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=(*FLAGS_V4, "amx_tile", "avx512_bf16")))
    v3 = host(cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v3", flags=("avx", "avx2", "bmi1", "bmi2", "f16c", "fma")))
    assert a.compat_key("vllm") == other_flags.compat_key("vllm") != v3.compat_key("vllm")
    assert a.soft_fields("vllm")["cpu.flags"] != other_flags.soft_fields("vllm")["cpu.flags"]
    assert a.compat_differences(v3, "vllm") == {"cpu.isa_level": ("x86-64-v4", "x86-64-v3")}


@pytest.mark.parametrize("field,value", [("vllm_version", "0.33.0"), ("torch_version", "2.14.0+cpu"),
                                         ("triton_version", "3.6.0"), ("flashinfer_version", "0.6.0"),
                                         ("deep_gemm_version", "2.1.0"), ("platform", "linux-aarch64")])
def test_each_hard_field_changes_the_key_and_soft_ones_do_not(field, value):
    assert host(**{field: value}).compat_key("vllm") != host().compat_key("vllm")
    assert host(compiler_version="gcc 13.1.0", glibc_version="2.40").compat_key("vllm") == host().compat_key("vllm")


def test_the_fingerprint_digest_of_a_host_without_the_new_runtimes_is_the_one_recorded_before():
    """The runtime versions added with the vllm backend enter the digest only when set."""
    from buildctl.core.digest import digest_json

    fp = host(vllm_version=None)
    before = fp.model_dump(mode="json", exclude={"sources", "vllm_version", "triton_version", "flashinfer_version",
                                                 "deep_gemm_version"})
    assert fp.digest() == digest_json(before) and host().digest() != fp.digest()


def test_a_bundle_built_for_another_key_is_refused_naming_the_field(tmp_path):
    record = {"compat_key": host().compat_key("vllm"), "compat_fields": host().compat_fields("vllm")}
    check_compat(tmp_path, record, host())
    with pytest.raises(IncompatibleTargetError) as exc:
        check_compat(tmp_path, record, host(vllm_version="0.33.0"))
    assert "vllm_version" in str(exc.value)


def _caches(root: Path, hash_dir: str = "abc123", files: dict[str, bytes] | None = None) -> Path:
    base = root / "vllm" / "torch_compile_cache" / "torch_aot_compile" / hash_dir
    for rel, data in (files or {"inductor_cache/24/k1.so": b"kernel", "inductor_cache/24/k1.cpp": b"src",
                               "rank_0_0/model": b"aot"}).items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(data)
    return root


def test_a_start_that_compiled_nothing_used_the_cache(tmp_path):
    caches = _caches(tmp_path / "c")
    record = {"hash_dirs": hash_dirs(caches)}
    assert record["hash_dirs"] == ["vllm/torch_compile_cache/torch_aot_compile/abc123"]
    before = cache_files(caches)
    # what every warm start writes again: the AOT model file, an AOTAutograd entry, locks, model info
    base = caches / record["hash_dirs"][0]
    (base / "rank_0_0" / "model").write_bytes(b"rewritten")
    for rel in ("inductor_cache/aotautograd/x/y", "inductor_cache/locks/k1.lock"):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(b"")
    (caches / "vllm" / "modelinfos").mkdir()
    (caches / "vllm" / "modelinfos" / "llama.json").write_bytes(b"{}")
    assert cache_evidence(record, caches, before) == {"cache_used": True, "reason": None, "new_hash_dirs": [],
                                                      "new_files": 0, "differs": []}


def test_a_new_hash_folder_or_a_new_kernel_is_a_miss_that_says_why(tmp_path):
    caches = _caches(tmp_path / "c")
    record = {"hash_dirs": hash_dirs(caches)}
    before = cache_files(caches)
    (caches / record["hash_dirs"][0] / "inductor_cache" / "9z").mkdir()
    (caches / record["hash_dirs"][0] / "inductor_cache" / "9z" / "k2.so").write_bytes(b"new")
    ev = cache_evidence(record, caches, before)
    assert not ev["cache_used"] and ev["reason"] == "vLLM compiled 1 new file(s) (k2.so)" and ev["new_files"] == 1
    _caches(caches.parent / "c", hash_dir="def456")
    ev = cache_evidence(record, caches, before)
    assert not ev["cache_used"] and ev["new_hash_dirs"] == ["vllm/torch_compile_cache/torch_aot_compile/def456"]
    assert ev["reason"].startswith("vLLM hashed this start to def456, not the bundle's abc123: an engine argument")


def test_a_miss_names_the_engine_argument_and_the_hashed_variable_that_differ_from_the_build(tmp_path):
    """#49: "cache not used" says which engine argument or hashed environment variable of this start
    differs from the bundle's record (the cache roots differ on every start and are not named)."""
    caches = _caches(tmp_path / "c")
    record = {"hash_dirs": hash_dirs(caches), "engine_args": {"model": "model", "max_num_seqs": 4, "dtype": "float32"},
              "hashed_env": {"VLLM_CACHE_ROOT": "/build/caches/vllm", "VLLM_USE_V1": "1"}}
    before = cache_files(caches)
    _caches(caches.parent / "c", hash_dir="def456")
    started = {"engine_args": {"model": "model", "max_num_seqs": 8, "dtype": "float32"},
               "hashed_env": {"VLLM_CACHE_ROOT": "/tmp/scratch/vllm", "VLLM_USE_V1": "1", "VLLM_FUSED_MOE_CHUNK": "64"}}
    ev = cache_evidence(record, caches, before, started=started)
    assert not ev["cache_used"] and ev["differs"] == ["engine argument max_num_seqs: 4 at build, 8 here",
                                                       "VLLM_FUSED_MOE_CHUNK: unset at build, 64 here"]
    assert ev["reason"].startswith("vLLM hashed this start to def456, not the bundle's abc123: engine argument "
                                   "max_num_seqs: 4 at build, 8 here; VLLM_FUSED_MOE_CHUNK: unset at build, 64 here")
    same = cache_evidence(record, caches, before, started={"engine_args": record["engine_args"],
                                                           "hashed_env": {"VLLM_USE_V1": "1"}})
    assert same["differs"] == [] and "the model path or vLLM's own state differs" in same["reason"]  # no arg, no var


def test_the_serving_plan_runs_from_the_bundle_with_a_relative_model_and_the_scratch_caches(tmp_path):
    record = {"env": {"TORCHINDUCTOR_CPP_MARCH": "x86-64-v3", "ATEN_CPU_CAPABILITY": "avx2"},
              "engine_args": engine_arguments(PROFILE, cpu=True)}
    plan = serving_plan(tmp_path / "bundle", record, tmp_path / "scratch")
    assert plan["cwd"] == str(tmp_path / "bundle") and plan["engine_args"]["model"] == "model"
    assert plan["env"]["VLLM_CACHE_ROOT"] == str(tmp_path / "scratch" / "vllm")
    assert plan["env"]["TRITON_CACHE_DIR"] == str(tmp_path / "scratch" / "triton")
    assert plan["env"]["TORCHINDUCTOR_CPP_MARCH"] == "x86-64-v3"
    cmd = plan["command"]
    assert cmd[:5] == ["vllm", "serve", "model", "--tokenizer", "model"]
    assert "--no-enforce-eager" in cmd and cmd[cmd.index("--max-num-seqs") + 1] == "32"
    assert engine_arguments(PROFILE, cpu=True)["distributed_executor_backend"] == "uni"
    assert "distributed_executor_backend" not in engine_arguments(PROFILE, cpu=False)


def test_warmup_covers_one_request_a_full_batch_and_the_longest_prompt():
    assert warmup_shapes(PROFILE) == [(1, 8), (1, 1024), (32, 8)]


def _bundle(tmp_path, record: dict | str | None) -> Path:
    d = tmp_path / "b"
    (d / "model").mkdir(parents=True)
    (d / "model" / "config.json").write_text("{}")
    if record is not None:
        (d / "bundle.json").write_text(record if isinstance(record, str) else json.dumps(record))
    return d


@pytest.mark.parametrize("record,why", [(None, "bundle.json is missing"), ("{", "bundle.json unreadable"),
                                        ({"format": 99, "backend": "vllm"}, "not a vllm bundle record"),
                                        ({"format": BUNDLE_FORMAT, "backend": "aoti"}, "not a vllm bundle record")])
def test_a_bad_bundle_record_is_refused_before_vllm_starts(tmp_path, record, why):
    with pytest.raises(EngineLoadError, match=why):
        read_record(_bundle(tmp_path, record))
    assert VllmBackend.recognises(_bundle(tmp_path / "x", {"format": 1, "backend": "vllm"}))
    assert not VllmBackend.recognises(tmp_path / "nothing")


def test_a_bundle_without_its_model_is_refused(tmp_path):
    d = _bundle(tmp_path, {"format": BUNDLE_FORMAT, "backend": "vllm"})
    (d / "model" / "config.json").unlink()
    with pytest.raises(EngineLoadError, match="model/config.json is missing"):
        read_record(d)


def _profile(**engine) -> dict:
    return {"name": "x", "model": {"tiny": {}}, "engine": {"backend": "vllm", **engine}}


@pytest.mark.parametrize("engine,rule", [({"quantization": "fp8"}, "vllm-no-quantization"),
                                         ({"aoti": {}}, "aoti-options-aoti-only"),
                                         ({"tp_size": 2}, "vllm-single-rank")])
def test_profile_rules_of_the_vllm_engine(engine, rule):
    with pytest.raises(ProfileError) as exc:
        parse_profile(_profile(**engine))
    assert rule in [p.rule for p in exc.value.problems]


def test_warm_start_gates_and_vllm_options_belong_to_the_vllm_backend_only():
    aoti = {"name": "x", "model": {"tiny": {}}, "engine": {"backend": "aoti"}}
    with pytest.raises(ProfileError) as exc:
        parse_profile({**aoti, "validation": {"warm_start": {}}})
    assert "warm-start-bundles-only" in [p.rule for p in exc.value.problems]
    with pytest.raises(ProfileError) as exc:
        parse_profile({**aoti, "engine": {"backend": "aoti", "vllm": {}}})
    assert "vllm-options-vllm-only" in [p.rule for p in exc.value.problems]
    assert parse_profile(aoti).warm_start_gate is None and PROFILE.warm_start_gate.max_warm_cold_ratio == 0.75
    assert "vllm" not in build_affecting_fields(load_profile(PROFILES / "tiny-llama-cpu.yaml"))["engine"]
    assert build_affecting_fields(PROFILE)["engine"]["vllm"]["cpu_isa"] == "avx2"


def test_requirements_name_what_this_host_lacks():
    b = VllmBackend.__new__(VllmBackend)
    assert b.unmet_requirements(PROFILE, host()) == []
    assert "not installed" in b.unmet_requirements(PROFILE, host(vllm_version=None))[0]
    v2 = host(cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v2", flags=("sse4_2",)))
    assert "x86-64-v3 CPU or better" in b.unmet_requirements(PROFILE, v2)[0]
    assert VllmBackend.gpus_needed(PROFILE) == 0


def _warm_attestation(**ws):
    from buildctl.artifact_store.trust.attestations import Attestation

    data = attestation("xxh3-128:" + "1" * 32, "vllm-" + "2" * 32, "pass").model_dump(mode="json")
    data["versions"]["engine_backend"] = "vllm"
    if ws:
        data["warm_start"] = {"cache_used": True, "reason": None, "cold_s": [20.0, 22.0], "warm_s": [8.0, 9.0],
                              "max_warm_cold_ratio": 0.7, "installed_unchanged": True, "checked": ["x"], **ws}
    return Attestation.model_validate(data)


@pytest.mark.parametrize("ws,reason", [({"cache_used": False, "reason": "vLLM compiled 3 new file(s)"},
                                        "warm start: cache not used: vLLM compiled 3 new file(s)"),
                                       ({"warm_s": [19.0, 21.0]}, "warm/cold engine-ready time 0.95 is over 0.7"),
                                       ({"installed_unchanged": False}, "the installed bundle changed")])
def test_promote_recomputes_the_warm_start_gate(ws, reason):
    from buildctl.artifact_store.trust.attestations import recomputed_verdict
    from buildctl.validators.render import headline

    assert recomputed_verdict(_warm_attestation(cache_used=True)) == ("pass", [])
    verdict, why = recomputed_verdict(_warm_attestation(**ws))
    assert verdict == "fail" and any(reason in w for w in why), why
    assert recomputed_verdict(_warm_attestation())[0] == "fail"  # a bundle's attestation without the check
    line = dict(headline(_warm_attestation(cache_used=True)))["warm start"]
    assert line.startswith("pass: cache used; engine ready warm 8.5 s vs cold 21.0 s (ratio 0.40")


def test_a_node_with_other_cpu_flags_shares_the_key_and_is_refused_as_not_covered(tmp_path, cli, monkeypatch):
    """Another flag set of the same level is the same compat key, so the node finds the bundle; its
    attestation does not cover those flags, so `pull --require-covered` refuses it (exit 5, the
    documented gate-refused code) and names cpu.flags: re-check it before it serves."""
    import dataclasses

    from buildctl.artifact_store.backends.store import open_store
    from buildctl.steps.build import manifest_draft

    from ...support.helpers import publish_files, staged, write_attestation

    built_on = host()
    store = open_store(f"file://{tmp_path / 'store'}")
    draft = dataclasses.replace(manifest_draft(PROFILE, built_on), backend="vllm")
    aid = publish_files(store, tmp_path / "b", draft, {"bundle.json": b"{}", "model/config.json": b"{}"}, verdict=None)
    write_attestation(store, aid, built_on.compat_key("vllm"), "pass", validator=built_on)
    from buildctl.artifact_store.promotion import promote

    promote(store, staged(store, aid), "prod")
    node = host(cpu=CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=(*FLAGS_V4, "amx_tile")))
    fp_file = tmp_path / "node.json"
    fp_file.write_text(json.dumps(node.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp_file))
    args = ("--store", store.uri, "pull", "--profile", PROFILE.name, "--channel", "prod", "--skip-preflight")
    code, out, err = cli(*args, "--dest", tmp_path / "n1", "--require-covered")
    assert code == 5 and "cpu.flags" in err and "not validated on this host's soft values" in err, (out, err)
    code, out, err = cli(*args, "--dest", tmp_path / "n2")  # without the flag: installed, it is the same key
    assert code == 0, err


def test_an_upgrade_of_a_vllm_node_rechecks_soft_changes_builds_hard_ones_and_stages_offline(tmp_path, cli, monkeypatch):
    """#49 item 6 for the upgrade path, with a synthetic bundle (no vLLM start: --skip-preflight):
    a soft change (other CPU flags, another compiler) is a re-check of the bundle that serves the
    node, a hard one (another vLLM) a build; the bundle stages before the upgrade and activates
    after it with no store."""
    import dataclasses

    from buildctl.steps import fleet
    pass
    from buildctl.steps import upgrade
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.promotion import promote
    from buildctl.steps.context import Context
    from buildctl.engines.fingerprint import UpgradeTarget
    from buildctl.steps.build import manifest_draft

    from ...support.helpers import publish_files, settings, staged, write_attestation

    node = host()
    store = open_store(f"file://{tmp_path / 'store'}")
    draft = dataclasses.replace(manifest_draft(PROFILE, node), backend="vllm")
    aid = publish_files(store, tmp_path / "b", draft, {"bundle.json": b"{}", "model/config.json": b"{}"}, verdict=None)
    write_attestation(store, aid, node.compat_key("vllm"), "pass", validator=node)
    promote(store, staged(store, aid), "prod")
    fleet.report_node(store, "cpu-v-1", node, [PROFILE.name])
    ctx = Context.from_settings(settings(), store=store)
    profiles = {PROFILE.name: PROFILE}

    def state(**fields):
        p = upgrade.plan(ctx, UpgradeTarget.model_validate(fields), profiles)
        (g,) = p.groups
        return g.state, g.artifact_id

    flags = {"cpu": {"flags": [*FLAGS_V4, "amx_tile"]}}
    assert state(**flags) == ("re-check", aid)
    assert state(compiler_version="gcc 13.2.0") == ("re-check", aid)
    assert state(vllm_version="0.33.0")[0] == "build"
    fp_file, target = tmp_path / "node.json", tmp_path / "target.yaml"
    fp_file.write_text(json.dumps(node.model_dump(mode="json")))
    target.write_text("cpu:\n  flags: [" + ", ".join([*FLAGS_V4, "amx_tile"]) + "]\n")
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp_file))
    dest = tmp_path / "node"
    base = ("--store", store.uri)
    assert cli(*base, "pull", "--profile", PROFILE.name, "--channel", "prod", "--dest", dest, "--skip-preflight")[0] == 0
    code, out, err = cli(*base, "pull", "--profile", PROFILE.name, "--channel", "prod", "--dest", dest,
                         "--for-upgrade", target, "--stage-only")
    assert code == 0, err
    after = node.model_copy(update={"cpu": CpuInfo(machine="x86_64", isa_level="x86-64-v4", flags=(*FLAGS_V4, "amx_tile"))})
    fp_file.write_text(json.dumps(after.model_dump(mode="json")))
    code, out, err = cli("--store", f"file://{tmp_path / 'gone'}", "node", "activate", "--profile", PROFILE.name,
                         "--dest", dest, "--skip-preflight")
    assert code == 0, err  # the same key: the bundle already current, activated offline
