"""Build keys change with each input that changes the engine, one at a time, and with nothing else."""

from __future__ import annotations

import pytest

from buildctl.engines.buildkey import build_key, build_key_for
from buildctl.engines.profile import load_profile

from ..support.helpers import PROFILES
from ..support.trtllm_kit import h100x8


BASE = {"profile_hash": "xxh3-128:" + "1" * 32, "model_digest": "xxh3-128:" + "2" * 32, "compat_key": "aoti-x",
        "version": "2.9.0"}


@pytest.mark.guard
def test_build_key_changes_with_each_input_and_nothing_else():
    base = build_key(**BASE)
    assert build_key(**BASE) == base
    for field, other in (("profile_hash", "xxh3-128:" + "3" * 32), ("model_digest", "xxh3-128:" + "4" * 32),
                         ("compat_key", "aoti-y"), ("version", "2.9.1"), ("version", None)):
        assert build_key(**{**BASE, field: other}) != base, field


@pytest.mark.guard
def test_build_key_for_follows_profile_model_compat_and_tool_version():
    prof = load_profile(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml")
    fp = h100x8()
    base = build_key_for(prof, BASE["model_digest"], fp)
    assert build_key_for(prof, BASE["model_digest"], fp) == base
    other_prof = prof.model_copy(update={"engine": prof.engine.model_copy(update={"max_batch_size": 3})})
    assert build_key_for(other_prof, BASE["model_digest"], fp) != base
    assert build_key_for(prof, "xxh3-128:" + "9" * 32, fp) != base
    for field, value in (("tensorrt_llm_version", "1.2.2"), ("tensorrt_version", "10.14.0"), ("cuda_version", "14.0")):
        assert build_key_for(prof, BASE["model_digest"], fp.model_copy(update={field: value})) != base, field
    # Soft fields (a re-check, not a rebuild) and fields trtllm does not depend on keep the key.
    for field, value in (("driver_version", "999.1"), ("cuda_version", fp.cuda_version.split(".")[0] + ".99"), ("torch_version", "0.0.1"),
                         ("glibc_version", "9.99"), ("compiler_version", "gcc 99.0.0")):
        assert build_key_for(prof, BASE["model_digest"], fp.model_copy(update={field: value})) == base, field


@pytest.mark.guard
def test_a_rebuild_after_a_failed_recheck_has_its_own_key_per_soft_values():
    prof = load_profile(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml")
    fp = h100x8()
    base = build_key_for(prof, BASE["model_digest"], fp)
    rebuild = build_key_for(prof, BASE["model_digest"], fp, rebuild=True)
    assert rebuild != base and build_key_for(prof, BASE["model_digest"], fp, rebuild=True) == rebuild
    newer_driver = fp.model_copy(update={"driver_version": "580.65.06"})
    assert build_key_for(prof, BASE["model_digest"], newer_driver) == base
    assert build_key_for(prof, BASE["model_digest"], newer_driver, rebuild=True) not in (base, rebuild)




def test_an_engine_format_other_than_1_enters_the_key_and_format_1_keys_are_unchanged():
    """aoti's format 2 (prefill and decode graphs, a KV cache) never takes a format-1 artifact as a
    cache hit; trtllm (format 1) and every key written before keep their value."""
    from buildctl.core.digest import digest_json
    from buildctl.engines.fingerprint import detect

    assert build_key(**BASE) == build_key(**BASE, engine_format=1) == digest_json(
        {"profile_hash": BASE["profile_hash"], "model_digest": BASE["model_digest"], "compat_key": BASE["compat_key"],
         "backend_version": BASE["version"]})
    assert build_key(**BASE, engine_format=2) != build_key(**BASE)
    tiny, fp = load_profile(PROFILES / "tiny-llama-cpu.yaml"), detect()
    assert build_key_for(tiny, BASE["model_digest"], fp) == build_key(
        tiny.build_hash(), BASE["model_digest"], fp.compat_key("aoti"), fp.tool_version("aoti"), engine_format=2)
