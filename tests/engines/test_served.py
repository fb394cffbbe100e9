"""Served-model files: the shipped one loads, and every malformed one is refused field by field (exit 2)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from buildctl.engines.errors import ServedModelError, ServedModelNotFoundError
from buildctl.engines.served import load_served_model
from buildctl.steps.profiles import load_profiles, served_model_by_name, served_models

from ..support.helpers import PROFILES, settings


@pytest.fixture
def profile_dir(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped profiles and served models, as BUILDCTL_PROFILE_DIR."""
    d = tmp_path / "profiles"
    shutil.copytree(PROFILES, d)
    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(d))
    return d


def write_model(profile_dir: Path, doc, name: str = "m") -> Path:
    p = profile_dir / "models" / f"{name}.yaml"
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


def problems(profile_dir: Path, doc, name: str = "m") -> list[tuple[str, str]]:
    with pytest.raises(ServedModelError) as err:
        served_model_by_name(settings(), name)
    assert str(err.value).startswith(str(profile_dir / "models" / f"{name}.yaml"))
    return [(p.path, p.rule) for p in err.value.problems]


def test_the_shipped_served_model_loads_with_the_engine_first_and_the_bundle_second():
    model = served_model_by_name(settings(), "tiny-llama")
    assert model.runtimes == ("tiny-llama-cpu", "tiny-llama-vllm-cpu") and model.preferred == "tiny-llama-cpu"
    profiles = load_profiles(settings())
    assert [profiles[r].engine.backend for r in model.runtimes] == ["aoti", "vllm"]
    assert [m.name for m in served_models(settings())] == ["tiny-llama"]
    assert "models" not in profiles  # a served model is not a profile: the profile loader never reads the folder


@pytest.mark.parametrize("doc, expect", [
    ({"name": "m", "runtimes": []}, [("runtimes", "at-least-one-runtime")]),
    ({"name": "m"}, [("runtimes", "missing")]),
    ({"name": "m", "runtimes": ["tiny-llama-cpu", "no-such-profile"]}, [("runtimes.1", "runtime-is-a-profile")]),
    ({"name": "m", "runtimes": ["tiny-llama-cpu", "tiny-llama-cpu"]}, [("runtimes.1", "runtime-once")]),
    ({"name": "m", "runtimes": ["tiny-llama-cpu", "llama-3-8b-instruct-fp8-tp1"]},
     [("runtimes.1", "same-weights"), ("runtimes.1", "same-prompts"), ("runtimes.1", "same-prompts")]),
    ({"name": "m", "runtimes": ["tiny-llama-cpu"], "extra": 1}, [("extra", "extra_forbidden")]),
    ({"name": "m", "runtimes": ["tiny-llama-cpu"], "max_fallback_minutes": 0}, [("max_fallback_minutes", "greater_than")]),
    ({"name": "m", "runtimes": ["tiny-llama-cpu"], "engine": {"backend": "aoti"}}, [("engine", "not-a-profile")]),
    ({"name": "other", "runtimes": ["tiny-llama-cpu"]}, [("name", "name-is-file-name")]),
    ("name: m\nruntimes: [a\n", [("", "yaml-syntax")]),
    ("- a list\n", [("", "mapping")]),
])
def test_a_malformed_served_model_names_its_field_and_rule(profile_dir, doc, expect):
    write_model(profile_dir, doc)
    assert problems(profile_dir, doc) == expect


def test_runtimes_compared_on_other_prompts_are_refused(profile_dir):
    bundle = yaml.safe_load((profile_dir / "tiny-llama-vllm-cpu.yaml").read_text())
    bundle["validation"]["max_tokens"] = 16
    (profile_dir / "tiny-llama-vllm-cpu.yaml").write_text(yaml.safe_dump(bundle))
    write_model(profile_dir, {"name": "m", "runtimes": ["tiny-llama-cpu", "tiny-llama-vllm-cpu"]})
    with pytest.raises(ServedModelError) as err:
        served_model_by_name(settings(), "m")
    assert [(p.path, p.rule) for p in err.value.problems] == [("runtimes.1", "same-prompts")]
    assert "validation.max_tokens: 32 vs 16" in str(err.value)


def test_a_missing_served_model_lists_those_that_exist(profile_dir):
    with pytest.raises(ServedModelNotFoundError) as err:
        served_model_by_name(settings(), "tiny-lama")
    assert "tiny-lama.yaml" in str(err.value) and "served models: tiny-llama" in str(err.value)
    with pytest.raises(ServedModelNotFoundError):
        load_served_model(profile_dir / "models" / "nope.yaml", {})


def test_the_cli_exits_2_on_a_malformed_file_and_3_on_an_unknown_name_without_a_traceback(profile_dir, cli, tmp_path):
    write_model(profile_dir, {"name": "m", "runtimes": ["tiny-llama-cpu", "no-such-profile"]})
    code, _, err = cli("pull", "--model", "m", "--channel", "prod", "--dest", tmp_path / "node")
    assert code == 2 and "runtimes.1: no build profile 'no-such-profile'" in err and "Traceback" not in err
    code, _, err = cli("worth", "--model", "nope")
    assert code == 3 and "served model not found" in err and "Traceback" not in err
    code, _, err = cli("pull", "--model", "m", "--profile", "tiny-llama-cpu", "--channel", "prod", "--dest", tmp_path)
    assert code == 2 and "exactly one of --profile" in err


def test_the_fallback_alert_takes_the_smallest_max_fallback_minutes_and_refuses_a_malformed_file(profile_dir):
    from buildctl.steps.profiles import fallback_alert_minutes

    assert fallback_alert_minutes(settings()) == 240  # the shipped tiny-llama.yaml
    write_model(profile_dir, {"name": "m", "runtimes": ["tiny-llama-cpu"], "max_fallback_minutes": 30})
    assert fallback_alert_minutes(settings()) == 30
    write_model(profile_dir, {"name": "m", "runtimes": []})
    with pytest.raises(ServedModelError):  # never armed with a value nobody configured
        fallback_alert_minutes(settings())
    shutil.rmtree(profile_dir / "models")
    assert fallback_alert_minutes(settings()) == 240
