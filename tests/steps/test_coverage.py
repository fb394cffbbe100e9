"""buildctl.steps.coverage: which soft values an artifact passed validation on, and the key it serves under."""

from __future__ import annotations

import pytest

from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.publish import ManifestDraft
from buildctl.artifact_store.read import get_manifest
from buildctl.steps.coverage import coverage, recheck_needs, serving_key
from buildctl.engines.profile import load_profile

from ..support.helpers import PROFILES, publish_files, write_attestation
from ..support.trtllm_kit import h100x8

PROFILE = load_profile(PROFILES / "llama-3-8b-instruct-fp8-tp1.yaml")
HOST = h100x8()
NEWER_DRIVER = HOST.model_copy(update={"driver_version": "590.44.01"})


@pytest.fixture
def published(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")

    def publish(fp, key=None, seed=0):
        draft = ManifestDraft(profile_name=PROFILE.name, profile_hash=PROFILE.build_hash(), backend="trtllm",
                              compat_key=key or fp.compat_key("trtllm"), fingerprint=fp.model_dump(mode="json"),
                              tool_versions={"backend": fp.tool_version("trtllm")}, model_digest=None, build_key=None)
        return publish_files(store, tmp_path / f"t{seed}", draft, {"config.json": b"{}", "rank0.engine": 512},
                             seed=seed, verdict=None)

    return store, publish


def test_an_attestation_covers_exactly_the_soft_values_it_was_made_on(published):
    store, publish = published
    aid = publish(HOST)
    m = get_manifest(store, aid)
    assert not coverage(store, aid, m, HOST).covered and coverage(store, aid, m, HOST).validated_on == []
    att = write_attestation(store, aid, HOST.compat_key("trtllm"), "pass", validator=HOST)
    cov = coverage(store, aid, m, HOST)
    assert cov.covered and cov.attestation_id == att
    other = coverage(store, aid, m, NEWER_DRIVER)
    assert not other.covered and other.differences == {"driver_version": ("590.44.01", HOST.driver_version)}
    assert "driver_version=590.44.01" in other.describe()
    write_attestation(store, aid, HOST.compat_key("trtllm"), "pass", validator=NEWER_DRIVER)
    assert coverage(store, aid, m, NEWER_DRIVER).covered and coverage(store, aid, m, HOST).covered


def test_a_later_failure_on_the_same_values_uncovers_them(published):
    store, publish = published
    aid = publish(HOST)
    write_attestation(store, aid, HOST.compat_key("trtllm"), "pass", validator=HOST, created_at="2026-12-01T10:00:00Z")
    write_attestation(store, aid, HOST.compat_key("trtllm"), "fail", validator=HOST, created_at="2026-12-01T11:00:00Z")
    assert not coverage(store, aid, get_manifest(store, aid), HOST).covered


def test_records_without_a_validator_fingerprint_or_of_another_key_cover_nothing(published):
    store, publish = published
    aid = publish(HOST)
    write_attestation(store, aid, HOST.compat_key("trtllm"), "pass")  # validator_fingerprint {}
    other_key = HOST.model_copy(update={"tensorrt_llm_version": "1.2.2"})
    write_attestation(store, aid, other_key.compat_key("trtllm"), "pass", validator=other_key)
    assert not coverage(store, aid, get_manifest(store, aid), HOST).covered


def test_a_schema_1_artifact_serves_under_its_new_key_and_its_old_attestation_covers(published):
    store, publish = published
    old_key = HOST.legacy_compat_key("trtllm")
    aid = publish(HOST, key=old_key)
    m = get_manifest(store, aid)
    assert m.compat_key == old_key and serving_key(m) == HOST.compat_key("trtllm")
    write_attestation(store, aid, old_key, "pass", validator=HOST)  # written under the old key
    assert coverage(store, aid, m, HOST).covered


def test_recheck_needs_lists_uncovered_artifacts_and_not_missing_ones(published):
    store, publish = published
    profiles = {PROFILE.name: PROFILE}
    assert recheck_needs(store, HOST, profiles) == []  # nothing for the key: a build, not a re-check
    aid = publish(HOST)
    write_attestation(store, aid, HOST.compat_key("trtllm"), "pass", validator=HOST)
    assert recheck_needs(store, HOST, profiles) == []
    assert recheck_needs(store, NEWER_DRIVER, profiles) == [(PROFILE.name, HOST.compat_key("trtllm"), aid)]


def test_a_long_soft_list_is_summarized_so_the_verdict_fits_a_line():
    from buildctl.steps.coverage import describe_soft

    flags = [f"f{i}" for i in range(21)]
    line = describe_soft({"cpu.flags": flags, "compiler_version": "gcc 12.2.0"})
    assert line.startswith("cpu.flags=[21 values, ") and line.endswith("], compiler_version=gcc 12.2.0") and len(line) < 70
    other = describe_soft({"cpu.flags": flags[:-1] + ["avx512f"]})
    assert other != line.split(", compiler")[0]  # two sets read apart
    assert describe_soft({"cpu.flags": ["a", "b"]}) == "cpu.flags=a,b" and describe_soft({}) == "no soft fields"
