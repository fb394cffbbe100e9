"""The trtllm-torch bundle against the strict fake LLM API of 1.2.1 and 1.4.0rc1
(tests/support/fakes/pymods/tensorrt_llm/llmapi.py): the layout per release, the device and version
check upstream lacks (every cache kind, every field), damaged, extra and missing caches, the proof
of use, and ``node env``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildctl.core.settings import Settings
from buildctl.engines.errors import EngineBuildError, EngineLoadError, IncompatibleTargetError, ProfileError
from buildctl.engines.trtllm_torch.backend import (AUTOTUNER_METADATA, CACHE_KINDS, RELEASES, TrtllmTorchBackend,
                                                   cache_environment, cache_evidence, cache_files, read_record)

from ...support.helpers import REPO
from ...support.trtllm_torch_kit import FAKES, checkpoint, release, small_profile, torch_host, use_host  # noqa: F401


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One bundle per release, built by the fake on its H100."""
    out = {}
    root = tmp_path_factory.mktemp("trtllm-torch")
    for version in RELEASES:
        with pytest.MonkeyPatch.context() as mp:
            fp = torch_host(version)
            use_host(mp, root, fp)
            d = root / version
            TrtllmTorchBackend(Settings()).build(small_profile(), checkpoint(root / f"model-{version}"), d / "bundle", fp,
                                                 d / "build.log")
            out[version] = d
    return out


@pytest.fixture
def bundle(built, release, tmp_path, monkeypatch) -> Path:
    """A copy of ``release``'s bundle, with this test's host set to the one it was built on."""
    d = tmp_path / "bundle"
    shutil.copytree(built[release] / "bundle", d)
    use_host(monkeypatch, tmp_path, torch_host(release))
    return d


def test_each_release_lays_out_its_own_caches(bundle, release, built):
    rec = read_record(bundle)
    rel = RELEASES[release]
    assert set(rec["caches"]) == set(rel.kinds)
    tuner = sorted(p.name for p in (bundle / "caches" / "autotuner").iterdir())
    log = (built[release] / "build.log").read_text()
    if release == "1.2.1":
        assert tuner == ["cache.rank0.json"] and "trtllm_deep_gemm" not in rec["caches"]
        assert set(json.loads((bundle / "caches/autotuner/cache.rank0.json").read_text())) == {"metadata", "cache_data"}
    else:
        assert tuner == ["cache.json"] and "trtllm_deep_gemm" in rec["caches"]
        assert set(json.loads((bundle / "caches/autotuner/cache.json").read_text())) == {"metadata", "rank_0"}
    assert "[Autotuner] Autotuning process starts" in log and "[Autotuner] Saving cache to" in log
    plan_env = cache_environment(rel, Path("/c"))
    assert ("TRTLLM_CACHE_DIR" in plan_env) == (release != "1.2.1")
    assert plan_env["TLLM_AUTOTUNER_CACHE_PATH"] == "/c/autotuner/cache.json"
    assert (bundle / "config.yaml").is_file() and rec["llm_args"]["max_num_tokens"] == 64


def _changed(fp, path):
    """``fp`` with the field at ``path`` changed."""
    if path.startswith("gpus."):
        attr = path.split(".", 1)[1]
        g = fp.gpus[0].model_copy(update={attr: "NVIDIA H200" if attr == "name" else "10.0"})
        return fp.model_copy(update={"gpus": (g,)})
    cur = getattr(fp, path)
    return fp.model_copy(update={path: f"{cur}.9" if cur else "9.9"})


KIND_FIELDS = [(kind, path) for kind, (_var, paths) in CACHE_KINDS.items() for path in paths]


@pytest.mark.parametrize("kind,path", KIND_FIELDS, ids=[f"{k}-{p}" for k, p in KIND_FIELDS])
def test_a_cache_made_for_another_device_or_version_is_refused_naming_the_cache_and_field(built, kind, path, tmp_path,
                                                                                         monkeypatch):
    version = "1.4.0rc1"  # it has every kind
    d = tmp_path / "bundle"
    shutil.copytree(built[version] / "bundle", d)
    use_host(monkeypatch, tmp_path, _changed(torch_host(version), path))
    with pytest.raises(IncompatibleTargetError) as err:
        TrtllmTorchBackend(Settings()).load(d)
    label = f"autotuner.{next(k for k, v in AUTOTUNER_METADATA.items() if v == path)}" if kind == "autotuner" else f"{kind}.{path}"
    assert label in err.value.differences, err.value.differences


def test_the_autotuner_files_own_metadata_is_checked_where_upstream_overwrites_it(bundle, release, tmp_path):
    """The record says H100, the file was tuned on an H200 (a cache copied in by hand): the fake
    runtime, like upstream, loads it without a word; buildctl refuses it."""
    f = next((bundle / "caches" / "autotuner").iterdir())
    data = json.loads(f.read_text())
    data["metadata"]["device_name"] = "NVIDIA H200"
    f.write_text(json.dumps(data))
    with pytest.raises(IncompatibleTargetError) as err:
        TrtllmTorchBackend(Settings()).load(bundle)
    assert err.value.differences == {"autotuner.device_name": ("NVIDIA H200", "NVIDIA H100 80GB HBM3")}
    # upstream's behaviour, as the fake keeps it: the file loads and its metadata replaces the live one
    code = ("from tensorrt_llm import LLM; LLM(model='model', max_num_tokens=64, enable_autotuner=True)")
    caches = tmp_path / "c"
    shutil.copytree(bundle / "caches", caches)
    r = subprocess.run([sys.executable, "-c", code], cwd=bundle, capture_output=True, text=True,
                       env={**os.environ, "TLLM_AUTOTUNER_CACHE_PATH": str(caches / "autotuner" / "cache.json")})
    assert r.returncode == 0 and "[Autotuner] Loading cache from" in r.stderr, r.stderr


@pytest.mark.parametrize("damage,why", [
    ("no-autotuner", "autotuner cache caches/autotuner/cache"),
    ("bad-autotuner", "does not parse"),
    ("list-autotuner", "is not a JSON object"),
    ("missing-cache", "caches/triton is missing"),
    ("extra-cache", "caches/stray: not a cache the record lists"),
    ("no-config", "config.yaml is missing"),
])
def test_a_damaged_bundle_is_refused_before_the_runtime_starts(bundle, damage, why):
    tuner = next((bundle / "caches" / "autotuner").iterdir())
    if damage == "no-autotuner":
        tuner.unlink()
    elif damage == "bad-autotuner":
        tuner.write_text("{not json")
    elif damage == "list-autotuner":
        tuner.write_text("[1, 2]")
    elif damage == "missing-cache":
        shutil.rmtree(bundle / "caches" / "triton")
    elif damage == "extra-cache":
        (bundle / "caches" / "stray").mkdir()
        (bundle / "caches" / "stray" / "k.bin").write_bytes(b"x")
    else:
        (bundle / "config.yaml").unlink()
    with pytest.raises(EngineLoadError) as err:
        TrtllmTorchBackend(Settings()).load(bundle)
    assert why in str(err.value)


def test_a_warm_start_uses_the_caches_and_a_cold_one_says_what_it_did_not_use(bundle):
    backend = TrtllmTorchBackend(Settings())
    warm = backend.load(bundle)
    try:
        assert warm.evidence == {"cache_used": True, "reason": None, "new_files": 0}
        gens = warm.generate([[1, 2, 3]], max_tokens=3, top_logprobs=2)
        assert len(gens[0].token_ids) == 3 and len(gens[0].top_logprobs[0]) == 2
    finally:
        warm.close()
    cold = backend.load(bundle, cold=True)
    try:
        assert not cold.evidence["cache_used"]
        assert "did not load the autotuner cache" in cold.evidence["reason"]
        assert "JIT-compiled" in cold.evidence["reason"]
    finally:
        cold.close()
    found = backend.warm_start(bundle, backend.load(bundle), pairs=1)
    assert found["cache_used"] and len(found["cold_s"]) == len(found["warm_s"]) == 1


def test_the_evidence_counts_new_tuning_entries_and_new_kernels(bundle, tmp_path):
    rec = read_record(bundle)
    caches = tmp_path / "c"
    shutil.copytree(bundle / "caches", caches)
    before = cache_files(caches)
    log = "[TRT-LLM] [I] [Autotuner] Loading cache from x"
    assert cache_evidence(rec, caches, before, log)["cache_used"]
    (caches / "triton" / "new").mkdir()
    (caches / "triton" / "new" / "k.bin").write_bytes(b"k")
    tuner = next((caches / "autotuner").iterdir())
    data = json.loads(tuner.read_text())
    section = "cache_data" if "cache_data" in data else "rank_0"
    data[section]["('op', 'R', 0, ((9999, 1),))"] = {"runner_id": 0, "tactic": 1, "min_time": 1.0}
    tuner.write_text(json.dumps(data))
    ev = cache_evidence(rec, caches, before, log)
    assert not ev["cache_used"] and "tuned 1 new" in ev["reason"] and "1 new file(s) in triton" in ev["reason"]


def test_a_build_whose_runtime_saw_another_gpu_fails_and_leaves_nothing(tmp_path, monkeypatch):
    fp = torch_host("1.2.1")
    use_host(monkeypatch, tmp_path, fp, gpu=("NVIDIA H200", "9.0"))
    with pytest.raises(EngineBuildError) as err:
        TrtllmTorchBackend(Settings()).build(small_profile(), checkpoint(tmp_path / "m"), tmp_path / "out", fp,
                                             tmp_path / "log")
    assert "autotuner.device_name" in str(err.value) and err.value.kind == "incomplete"
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".build-*"))


def test_profile_rules_and_requirements(tmp_path, monkeypatch):
    with pytest.raises(ProfileError, match="trtllm-torch-quantization"):
        small_profile(quantization="int4_awq")
    with pytest.raises(ProfileError, match="vllm-options-vllm-only"):
        small_profile(vllm={"device": "cpu"})
    b = TrtllmTorchBackend(Settings())
    assert b.unmet_requirements(small_profile(), torch_host("1.3.0")) == [
        "TensorRT-LLM 1.3.0: buildctl knows the cache layouts of 1.2.1, 1.4.0rc1 only"]
    assert "2 GPU(s)" in b.unmet_requirements(small_profile(tp_size=2), torch_host())[0]
    use_host(monkeypatch, tmp_path, torch_host())
    with pytest.raises(EngineBuildError, match="ModelOpt FP8 checkpoint"):
        b.build(small_profile(quantization="fp8"), checkpoint(tmp_path / "m"), tmp_path / "o", torch_host(), tmp_path / "l")


def test_the_8b_fp8_profile_is_a_trtllm_torch_profile_for_one_gpu():
    from buildctl.engines.profile import load_profile

    p = load_profile(REPO / "build_profiles" / "llama-3-8b-instruct-fp8-trtllm-torch.yaml")
    assert (p.engine.backend, p.engine.quantization, p.engine.world_size) == ("trtllm-torch", "fp8", 1)
    assert TrtllmTorchBackend.gpus_needed(p) == 1


def test_node_env_prints_the_environment_and_the_trtllm_serve_command(bundle, release, tmp_path, cli, monkeypatch):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import install_artifact
    from buildctl.steps.build import manifest_draft

    from ...support.helpers import publish_files

    store = open_store(str(tmp_path / "store"))
    fp = torch_host(release)
    aid = publish_files(store, bundle, manifest_draft(small_profile(), fp))
    install_artifact(store, aid, tmp_path / "node")
    code, out, err = cli("node", "env", "--dest", str(tmp_path / "node"))
    assert code == 0, err
    assert "trtllm-serve model --backend pytorch --config config.yaml" in out
    assert "export TLLM_AUTOTUNER_CACHE_PATH=" in out and ("TRTLLM_CACHE_DIR" in out) == (release != "1.2.1")
    assert out.startswith(f"# trtllm-torch bundle {aid}")
    # an extra file in an installed cache (a runtime that wrote into the install) is refused, exit 4
    current = (tmp_path / "node" / "current").resolve()
    (current / "caches" / "triton").chmod(0o755)
    (current / "caches" / "triton" / "stray.bin").write_bytes(b"x")
    code, out, err = cli("node", "env", "--dest", str(tmp_path / "node"))
    assert code == 4 and "stray.bin" in err, (code, err)
    (current / "caches" / "triton" / "stray.bin").unlink()
    # the node's device changed since the install: refused naming the cache and field, exit 2
    use_host(monkeypatch, tmp_path, _changed(fp, "gpus.name"))
    code, out, err = cli("node", "env", "--dest", str(tmp_path / "node"))
    assert code == 2 and "autotuner.device_name" in err, (code, err)


def test_the_warm_start_gate_and_its_record_belong_to_trtllm_torch_bundles_too():
    """Proof of use is part of the attestation: a trtllm-torch attestation without the start-up
    check, or whose warm starts did not use the caches, fails when promote recomputes it."""
    from buildctl.artifact_store.trust.attestations import Attestation, recomputed_verdict

    from ...support.helpers import attestation

    assert small_profile().warm_start_gate is not None
    data = attestation("xxh3-128:" + "1" * 32, "trtllm-torch-" + "2" * 32, "pass").model_dump(mode="json")
    data["versions"]["engine_backend"] = "trtllm-torch"
    verdict, why = recomputed_verdict(Attestation.model_validate(data))
    assert verdict == "fail" and "a trtllm-torch bundle's attestation without the start-up check" in why[-1]
    from buildctl.engines.registry import BUNDLE_BACKENDS

    for b in BUNDLE_BACKENDS:  # the store's own list of bundle backends is the registry's
        other = {**data, "versions": {**data["versions"], "engine_backend": b}}
        assert recomputed_verdict(Attestation.model_validate(other))[0] == "fail", b
    data["warm_start"] = {"cache_used": False, "reason": "the autotuner tuned 3 new entr(ies)", "cold_s": [9.0],
                          "warm_s": [1.0], "max_warm_cold_ratio": 0.7, "installed_unchanged": True, "checked": ["x"]}
    verdict, why = recomputed_verdict(Attestation.model_validate(data))
    assert verdict == "fail" and "cache not used: the autotuner tuned 3 new" in why[-1]
    data["warm_start"]["cache_used"], data["warm_start"]["reason"] = True, None
    assert recomputed_verdict(Attestation.model_validate(data)) == ("pass", [])


def test_fingerprint_json_lists_the_backend_with_its_fields(cli, tmp_path, monkeypatch):
    use_host(monkeypatch, tmp_path, torch_host("1.4.0rc1"))
    code, out, err = cli("fingerprint", "--json")
    assert code == 0, err
    listed = json.loads(out)["backends"]["trtllm-torch"]
    assert listed["compat_key"] == torch_host("1.4.0rc1").compat_key("trtllm-torch")
    assert {"tensorrt_llm_version", "gpus.name", "gpus.sm", "triton_version"} <= set(listed["hard"])
    assert listed["soft"] == ["driver_version", "glibc_version"] and listed["floors"]


def _tuned_on_an_h200(built, dest: Path) -> Path:
    """A copy of the 1.2.1 bundle whose record says H100 but whose autotuner file says H200 (a
    cache copied in by hand): the store's bytes would verify, so only the cache check stops it."""
    shutil.copytree(built["1.2.1"] / "bundle", dest)
    tuner = dest / "caches" / "autotuner" / "cache.rank0.json"
    data = json.loads(tuner.read_text())
    data["metadata"]["device_name"] = "NVIDIA H200"
    tuner.write_text(json.dumps(data))
    return dest


def test_pull_refuses_a_bundle_whose_autotuner_cache_is_another_gpus_and_keeps_current(built, tmp_path, cli,
                                                                                        monkeypatch):
    """A published bundle whose record says H100 but whose autotuner file was tuned on an H200 (a
    cache copied in by hand before import): the store's bytes verify, so only the cache check
    stops it. The preflight refuses it (exit 8, naming the field) and ``current`` stays."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import current_artifact
    from buildctl.artifact_store.promotion import promote
    from buildctl.engines.profile import load_profile
    from buildctl.steps.build import manifest_draft

    from ...support.helpers import PROFILES, publish_files, staged, write_attestation

    fp = torch_host("1.2.1")
    use_host(monkeypatch, tmp_path, fp)
    profile = load_profile(PROFILES / "llama-3-8b-instruct-fp8-trtllm-torch.yaml")
    store = open_store(f"file://{tmp_path / 'store'}")
    good, bad = tmp_path / "good", _tuned_on_an_h200(built, tmp_path / "bad")
    shutil.copytree(built["1.2.1"] / "bundle", good)
    args = ("--store", store.uri, "pull", "--profile", profile.name, "--channel", "prod", "--dest", tmp_path / "node")
    aids = []
    for tree, seed in ((good, 0), (bad, 1)):
        aid = publish_files(store, tree, manifest_draft(profile, fp), verdict=None)
        write_attestation(store, aid, fp.compat_key("trtllm-torch"), "pass", validator=fp)
        promote(store, staged(store, aid), "prod")
        aids.append(aid)
        code, out, err = cli(*args)
        if seed == 0:
            assert code == 0, (out, err)
    assert code == 8 and "autotuner.device_name" in err and "NVIDIA H200" in err, (code, err)
    assert current_artifact(tmp_path / "node") == aids[0]
    # staged offline (bytes only), then activated: the activation's preflight refuses it the same way
    code, out, err = cli(*args[:-2], "--dest", tmp_path / "staged", "--stage-only")
    assert code == 0, err
    code, out, err = cli("--store", store.uri, "node", "activate", "--profile", profile.name, "--dest", tmp_path / "staged")
    assert code == 8 and "autotuner.device_name" in err, (code, err)
    assert current_artifact(tmp_path / "staged") is None


def test_import_refuses_a_bundle_whose_autotuner_cache_is_another_gpus_and_publishes_nothing(built, tmp_path, cli,
                                                                                             monkeypatch):
    """The same hand-copied H200 autotuner file, caught before it is published: ``buildctl import``
    checks each cache against the builder's fingerprint (exit 2, naming the field), as pull does."""
    fp = torch_host("1.2.1")
    use_host(monkeypatch, tmp_path, fp)
    bad = _tuned_on_an_h200(built, tmp_path / "bad")
    profile = REPO / "build_profiles" / "llama-3-8b-instruct-fp8-trtllm-torch.yaml"
    store = tmp_path / "store"
    code, out, err = cli("--store", store, "import", bad, "--profile", profile)
    assert code == 2 and "autotuner.device_name" in err and "NVIDIA H200" in err, (code, err)
    assert not (store / "manifests").exists() or not any((store / "manifests").iterdir())
    code, out, err = cli("--store", store, "import", built["1.2.1"] / "bundle", "--profile", profile)
    assert code == 0, err
