from __future__ import annotations

import json

import pytest

from buildctl.engines.profile import TinyModel
from buildctl.engines.tiny import ARCH, make_tiny, recipe_key
from buildctl.artifact_store.manifest import tree_digest as model_digest


def test_recipe_key_depends_on_parameters():
    assert recipe_key(TinyModel(seed=0)) != recipe_key(TinyModel(seed=1))
    assert recipe_key(TinyModel(train_steps=10)) != recipe_key(TinyModel(train_steps=11))
    assert recipe_key(TinyModel()) == recipe_key(TinyModel())


@pytest.mark.slow
def test_make_tiny_is_a_real_deterministic_checkpoint(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("BUILDCTL_CACHE_DIR", str(tmp_path / "cache"))  # the CLI below reads it
    spec = TinyModel(seed=3, train_steps=5)
    a = make_tiny(spec, tmp_path / "cache")
    digest = model_digest(a)
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == ARCH["vocab_size"]
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= {p.name for p in a.iterdir()}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a)
    assert len(tok) == ARCH["vocab_size"]
    assert all(isinstance(tok.decode([i]), str) for i in range(ARCH["vocab_size"]))
    # a second request is the cache; a rebuild from scratch is byte-identical
    assert make_tiny(spec, tmp_path / "cache") == a
    assert model_digest(make_tiny(spec, tmp_path / "cache2")) == digest
    code, out, err = cli("--json", "model", "make-tiny", tmp_path / "copy", "--seed", "3", "--train-steps", "5")
    assert code == 0, err
    assert json.loads(out)["model_digest"] == digest
    code, _, err = cli("model", "make-tiny", tmp_path / "copy", "--seed", "3", "--train-steps", "5")
    assert code == 2 and "not empty" in err
