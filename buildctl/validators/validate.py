"""``validate``: pull an artifact, run it side by side with vLLM, and record an attestation.

1. Pull the artifact into a temp dir with verification (the store's pull code).
2. Load it with its backend, and start the vLLM reference on the same model directory.
3. Compute parity and speed.
4. Write an immutable attestation under the artifact: artifact id, the validating host's
   fingerprint and compat key, vLLM/engine/tool versions, the prompt set's digest, the
   thresholds, every metric and the verdict.

A failing verdict raises :class:`ValidationFailedError` (exit 5) *after* the attestation is
written, so the failure is on record; an inconclusive one (a speed interval straddles its
threshold when the budget ran out) raises its subclass :class:`ValidationInconclusiveError`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import Field

import buildctl
from buildctl.engines.backend import Runner
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile
from buildctl.engines.registry import get_backend
from buildctl.engines.threads import intra_op_threads
from buildctl.core.records import Record
from buildctl.core.settings import Settings
from buildctl.core.stats import combine
from buildctl.artifact_store.trust.attestations import (
    ATTESTATION_SCHEMA,
    Attestation,
    CrossRuntimeParity,
    parity_basis_differences,
    write_attestation,
)
from buildctl.core.digest import digest_json
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.manifest import tree_digest
from buildctl.core.times import utc_now
from buildctl.artifact_store.errors import VerificationError
from buildctl.artifact_store.node.install_dir import install_artifact, local_problems
from buildctl.artifact_store.upkeep.integrity import quarantine_on
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.read import get_manifest
from buildctl.validators.errors import ModelMismatchError, verdict_error
from buildctl.validators.parity import (
    STAGGERED_CONCURRENCY,
    ParityReport,
    check_parity,
    check_staggered,
    staggered_json,
    staggered_requests,
)
from buildctl.validators.prompts import PromptSet, build_prompt_sets, load_prompt_file
from buildctl.validators.speed import SpeedReport, measure


@dataclass
class ValidationResult:
    artifact_id: str
    attestation_id: str
    attestation: Attestation
    parity: ParityReport
    speed: SpeedReport

    @property
    def passed(self) -> bool:
        return self.attestation.passed


class PreferredValidation(Record):
    """A served model's preferred runtime as validated: what a fallback's validation is compared
    with (its attestation records the comparison: :class:`CrossRuntimeParity`)."""

    model: str = Field(..., description="the served model")
    profile: str = Field(..., description="the preferred runtime's profile")
    artifact_id: str = Field(..., description="the preferred artifact")
    key: str = Field(..., description="its attestation's store key")
    attestation: Attestation = Field(..., description="its passing attestation")


class ValidationPlan(Record):
    """What one validation checks: an artifact, the profile and checkpoint it was built from, on
    which host (its fingerprint), with which extra prompts and speed budget."""

    artifact_id: str = Field(..., description="the artifact validated")
    profile: BuildProfile = Field(..., description="its build profile (the gates and the reference)")
    model_dir: Path = Field(..., description="the checkpoint it was built from (the reference serves it)")
    fingerprint: Fingerprint = Field(..., description="this host: the attestation's compat key and soft values")
    prompts_file: str | Path | None = Field(None, description="extra prompts, beside the profile's own")
    speed_budget: float = Field(1.0, gt=0, description="scales the speed gate's repetition and time budget")
    preferred: tuple[PreferredValidation, ...] = Field((), description="for a fallback runtime of served models: "
                                                       "each model's preferred runtime as validated, to compare with")


def run_validation(settings: Settings, store: Store, plan: ValidationPlan, *, auth: Authority = Authority(),
                   reference: Runner | None = None, wrap_candidate: Callable[[Runner], Runner] | None = None,
                   say: Callable[[str], None] = lambda _: None) -> ValidationResult:
    """Validate ``plan.artifact_id`` on this host (``plan.fingerprint``) against the vLLM reference on
    ``plan.model_dir`` and store the attestation. ``reference`` lets a caller reuse a running vLLM
    runner (tests, long-lived validators); ``wrap_candidate`` is a hook for fault injection; ``auth``
    signs the attestation (and any quarantine); ``plan.speed_budget`` scales the speed gate's
    repetition and time budget."""
    artifact_id, profile, model_dir = plan.artifact_id, plan.profile, plan.model_dir
    prompts_file, speed_budget = plan.prompts_file, plan.speed_budget
    t0 = time.monotonic()
    manifest = get_manifest(store, artifact_id)
    fp = plan.fingerprint
    digest = tree_digest(model_dir)
    if manifest.model_digest is not None and manifest.model_digest != digest:
        raise ModelMismatchError(artifact_id, manifest.model_digest, digest)
    v = profile.validation
    work = Path(tempfile.mkdtemp(prefix="buildctl-validate-"))
    own_reference = reference is None
    candidate: Runner | None = None
    try:
        say(f"pulling {artifact_id} with verification")
        try:
            install_artifact(store, artifact_id, work / "engine")
        except VerificationError as err:  # the store's copy is bad: take it out of service
            raise quarantine_on(store, err, detector="validation", auth=auth) from None
        backend = get_backend(manifest.backend, settings)
        candidate = backend.load(work / "engine" / "current")
        warm_start = None
        gate = profile.warm_start_gate
        if gate is not None:  # a bundle: did the runtime use it, and does a warm start beat a cold one?
            say(f"warm start: {gate.pairs} paired cold and warm starts")
            found = backend.warm_start(work / "engine" / "current", candidate, gate.pairs, say)  # type: ignore[attr-defined]
            unchanged = not local_problems(manifest, (work / "engine" / "current").resolve())
            warm_start = {**found, "max_warm_cold_ratio": gate.max_warm_cold_ratio, "installed_unchanged": unchanged,
                          "checked": [*found["checked"], "the installed bundle re-hashed against its manifest after every start"]}
        if wrap_candidate is not None:
            candidate = wrap_candidate(candidate)
        if reference is None and profile.reference.bundle is not None:
            b = profile.reference.bundle
            say(f"starting the vLLM reference compiled, from {b.profile}'s bundle on {b.channel}")
            reference = bundle_reference(settings, store, profile, fp, digest, work / "reference", auth)
        elif reference is None:
            say("starting the vLLM reference")
            from buildctl.validators.reference import VllmRunner

            reference = VllmRunner(model_dir, profile.reference)
        config = _read_config(model_dir)
        prompts = build_prompt_sets(v.prompt_sets, max_input_len=profile.engine.max_input_len,
                                    max_seq_len=min(profile.engine.max_seq_len, profile.reference.max_model_len),
                                    max_tokens=v.max_tokens, vocab_size=config.get("vocab_size", 32000),
                                    model_dir=model_dir)
        if prompts_file or v.prompts_file:
            extra = load_prompt_file(prompts_file or v.prompts_file, model_dir=model_dir,  # type: ignore[arg-type]
                                     limit=profile.engine.max_input_len)
            prompts = PromptSet(prompts.prompts + extra.prompts, prompts.sources + extra.sources, prompts.skipped)
        set_threads = getattr(candidate, "set_threads", None)  # a candidate in its own process (a vllm bundle)
        if set_threads is not None and v.speed.cpu_threads is not None:
            set_threads(v.speed.cpu_threads)
        with intra_op_threads(v.speed.cpu_threads):
            say(f"parity: {len(prompts.prompts)} prompts, {v.max_tokens} tokens, top-{v.top_logprobs}")
            cand_out = candidate.generate(prompts.prompts, v.max_tokens, v.top_logprobs)
            ref_out = reference.generate(prompts.prompts, v.max_tokens, v.top_logprobs)
            parity = check_parity(ref_out, cand_out, v.parity.min_identical_fraction)
            staggered = _staggered(candidate, ref_out, prompts.prompts, v.max_tokens, v.top_logprobs,
                                   v.parity.min_identical_fraction, say)
            workload = _speed_workload(model_dir, config, v.speed.input_len, v.speed.num_prompts)
            say(f"speed: concurrency {list(v.speed.concurrency)}, {v.speed.num_prompts} requests, "
                f"{v.speed.input_len} in / {v.speed.output_len} out, {v.speed.repetitions} paired repetitions "
                f"(up to {v.speed.max_repetitions} x {speed_budget:g} while inconclusive)")
            speed = measure(candidate, reference, v.speed, workload,
                            gpus=(profile.engine.world_size, profile.reference.tensor_parallel_size),
                            budget_scale=speed_budget, on_progress=say)
        parity_passed = parity.passed and all(r.passed for r in staggered.values())
        reasons = parity.reasons() + [f"concurrency {c} (staggered): {r}" for c, rep in staggered.items()
                                      for r in rep.reasons()] + speed.reasons()
        verdicts = ["pass" if parity_passed else "fail", speed.verdict]
        if warm_start is not None:
            from buildctl.artifact_store.trust.attestations import WarmStartRecord

            why = WarmStartRecord.model_validate(warm_start).reasons()
            verdicts.append("fail" if why else "pass")
            reasons += why
        verdict = combine(verdicts)
        attestation = Attestation.model_validate({
            "schema_version": ATTESTATION_SCHEMA,
            "artifact_id": artifact_id,
            "verdict": verdict,
            "reasons": reasons,
            "compat_key": fp.compat_key(manifest.backend),
            "created_at": utc_now(),
            "profile": {"name": profile.name, "build_hash": profile.build_hash()},
            "validator_fingerprint": fp.model_dump(mode="json"),
            "versions": {"buildctl": buildctl.__version__, "vllm": getattr(reference, "version", None),
                         "engine_backend": manifest.backend, "torch": fp.torch_version,
                         "tensorrt_llm": fp.tensorrt_llm_version, "tensorrt": fp.tensorrt_version},
            "model_digest": digest,
            "model_digest_verified": manifest.model_digest is not None,
            "prompt_set": {"digest": prompts.digest(), "count": len(prompts.prompts),
                           "sets": sorted(set(prompts.sources)), "skipped": prompts.skipped},
            "thresholds": {"parity_rule": v.parity.rule, "min_identical_fraction": v.parity.min_identical_fraction,
                           "max_tokens": v.max_tokens, "top_logprobs": v.top_logprobs, **speed.gate},
            "reference_engine_args": profile.reference.model_dump(mode="json"),
            "parity": {**parity.to_json(), "passed": parity_passed,
                       "staggered": [staggered_json(c, r) for c, r in staggered.items()]},
            "speed": speed.to_json(),
            "duration_s": round(time.monotonic() - t0, 3),
            **({"warm_start": warm_start} if warm_start is not None else {}),
            "reference_outputs_digest": digest_json([g.token_ids for g in ref_out]),
        })
        if plan.preferred:
            attestation = Attestation.model_validate({**attestation.model_dump(mode="json"), "cross_runtime": [
                r.model_dump(mode="json") for r in cross_runtime_records(plan.preferred, attestation)]})
            for c in attestation.cross_runtime or ():
                say(f"cross-runtime parity with {c.preferred_profile} ({c.model}): "
                    + ("the same reference, both in parity" if c.passed else "; ".join(c.differences)))
        att_id = write_attestation(store, attestation, signer=auth.signer)
        result = ValidationResult(artifact_id, att_id, attestation, parity, speed)
    finally:
        if candidate is not None:
            candidate.close()
        if own_reference and reference is not None:
            reference.close()
        shutil.rmtree(work, ignore_errors=True)
    if not result.passed:
        raise verdict_error(artifact_id, att_id, attestation)
    return result


def cross_runtime_parity(preferred: PreferredValidation, fallback: Attestation) -> CrossRuntimeParity:
    """The record of a fallback's parity with its served model's preferred runtime."""
    diffs = parity_basis_differences(preferred.attestation, fallback)
    return CrossRuntimeParity(model=preferred.model, preferred_profile=preferred.profile,
                              preferred_artifact=preferred.artifact_id, preferred_attestation=preferred.key,
                              differences=tuple(diffs), passed=not diffs)


def cross_runtime_records(preferred: tuple[PreferredValidation, ...], fallback: Attestation) -> list[CrossRuntimeParity]:
    """One record per served model: the comparison with the first of its preferred validations
    (newest first) that shows the same reference, else with the newest."""
    out: dict[str, CrossRuntimeParity] = {}
    for p in preferred:
        rec = cross_runtime_parity(p, fallback)
        if p.model not in out or (rec.passed and not out[p.model].passed):
            out[p.model] = rec
    return list(out.values())


def bundle_reference(settings: Settings, store: Store, profile: BuildProfile, fp: Fingerprint, model_digest: str,
                     dest: Path, auth: Authority = Authority()) -> Runner:
    """The reference run compiled from a verified vLLM bundle of the same model
    (``reference.bundle``): its channel resolved for this host's vllm compat key, installed with
    every byte verified, its model checked against the one validated, then started as a node
    starts it. Its engine arguments are the bundle's own."""
    from buildctl.artifact_store.node.pull import resolve_channel

    spec = profile.reference.bundle
    assert spec is not None
    rec = resolve_channel(store, spec.profile, spec.channel, [fp.compat_key("vllm")])
    bundle_manifest = get_manifest(store, rec.artifact_id)
    if bundle_manifest.backend != "vllm":
        from buildctl.engines.errors import EngineLoadError

        raise EngineLoadError(f"{spec.profile} on {spec.channel}", f"{rec.artifact_id} is a {bundle_manifest.backend} "
                                                                   "engine, not a vllm bundle (reference.bundle)")
    if bundle_manifest.model_digest != model_digest:
        raise ModelMismatchError(rec.artifact_id, bundle_manifest.model_digest, model_digest)
    try:
        install_artifact(store, rec.artifact_id, dest)
    except VerificationError as err:
        raise quarantine_on(store, err, detector="validation (reference bundle)", auth=auth) from None
    runner = get_backend("vllm", settings).load(dest / "current")
    runner.version = f"{runner.version} compiled, bundle {rec.artifact_id}"  # type: ignore[attr-defined]
    return runner


def _staggered(candidate: Runner, reference: list[Any], prompts: list[list[int]], max_tokens: int, top_logprobs: int,
               min_identical_fraction: float, say: Callable[[str], None]) -> dict[int, ParityReport]:
    """The staggered set at each of :data:`STAGGERED_CONCURRENCY`, for a candidate that batches in
    flight (has ``generate_requests``); none for one that does not."""
    run = getattr(candidate, "generate_requests", None)
    if run is None:
        return {}
    requests = staggered_requests(prompts, max_tokens)
    out = {}
    for c in STAGGERED_CONCURRENCY:
        say(f"parity, staggered: {len(requests)} requests joining and leaving mid-run, {c} in flight")
        out[c] = check_staggered(reference, run(requests, top_logprobs, concurrency=c), requests, min_identical_fraction)
    return out


def _read_config(model_dir: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _speed_workload(model_dir: Path, config: dict[str, Any], input_len: int, n: int) -> list[list[int]]:
    """``n`` fixed-seed prompts of exactly ``input_len`` tokens: the same workload on both sides."""
    import random

    from buildctl.validators.prompts import SEED, token_source

    source = token_source(model_dir, config.get("vocab_size", 32000), need=input_len * 2 + 1)
    rng = random.Random(SEED + 1)
    return [source[s:s + input_len] for s in (rng.randrange(0, len(source) - input_len) for _ in range(n))]
