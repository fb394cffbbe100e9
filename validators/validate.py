"""``validate``: pull an artifact, run it side by side with vLLM, and record an attestation.

1. Pull the artifact into a temp dir with verification (the store's pull code).
2. Load it with its backend, and start the vLLM reference on the same model directory.
3. Compute parity and speed.
4. Write an immutable attestation under the artifact: artifact id, the validating host's
   fingerprint and compat key, vLLM/engine/tool versions, the prompt set's digest, the
   thresholds, every metric and the verdict.

A failing verdict raises :class:`ValidationFailedError` (exit 5) *after* the attestation is
written, so the failure is on record.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import buildctl
from artifact_store.ops import get_manifest, resolve_artifact, utc_now, write_attestation
from artifact_store.pull import install_artifact
from artifact_store.store import Store
from engines.backend import Runner, get_backend
from engines.errors import ProfileError
from engines.fingerprint import Fingerprint, detect
from engines.model import model_digest, resolve_model
from engines.profile import BuildProfile, load_profile, profile_path
from validators.errors import ModelMismatchError, ValidationFailedError, ValidatorProcessError
from validators.parity import ParityReport, check_parity
from validators.prompts import PromptSet, build_prompt_sets, load_prompt_file
from validators.speed import SpeedReport, measure

ATTESTATION_SCHEMA = 1


def find_profile(name: str, expected_hash: str, profile_file: str | Path | None = None) -> BuildProfile:
    """The artifact's profile: ``profile_file``, else ``$BUILDCTL_PROFILE_DIR`` or ``./build_profiles``
    ``/<name>.yaml``. Its build-affecting hash must equal the artifact's (gates may differ)."""
    path = Path(profile_file) if profile_file else profile_path(name)
    profile = load_profile(path)
    if profile.name != name or profile.build_hash() != expected_hash:
        from engines.errors import FieldProblem

        raise ProfileError(str(path), [FieldProblem("", "matches-artifact",
                           f"profile {profile.name} ({profile.build_hash()}) is not the one the artifact was built "
                           f"from ({name}, {expected_hash})")])
    return profile


@dataclass
class ValidationResult:
    artifact_id: str
    attestation_id: str
    attestation: dict[str, Any]
    parity: ParityReport
    speed: SpeedReport

    @property
    def passed(self) -> bool:
        return self.attestation["verdict"] == "pass"


def validate_artifact(
    store: Store,
    artifact_ref: str,
    *,
    profile_file: str | Path | None = None,
    prompts_file: str | Path | None = None,
    fingerprint: Fingerprint | None = None,
    reference: Runner | None = None,
    wrap_candidate: Callable[[Runner], Runner] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> ValidationResult:
    """Validate one artifact on this host and store the attestation. ``reference`` lets a caller
    reuse a running vLLM runner (tests, long-lived validators); ``wrap_candidate`` is a hook for
    fault injection."""
    t0 = time.monotonic()
    artifact_id = resolve_artifact(store, artifact_ref)
    manifest = get_manifest(store, artifact_id)
    profile = find_profile(manifest.profile_name, manifest.profile_hash, profile_file)
    fp = fingerprint or detect()
    model_dir = resolve_model(profile)
    digest = model_digest(model_dir)
    if manifest.model_digest is not None and manifest.model_digest != digest:
        raise ModelMismatchError(artifact_id, manifest.model_digest, digest)
    v = profile.validation
    work = Path(tempfile.mkdtemp(prefix="buildctl-validate-"))
    own_reference = reference is None
    candidate: Runner | None = None
    try:
        say(f"pulling {artifact_id} with verification")
        install_artifact(store, artifact_id, work / "engine")
        candidate = get_backend(manifest.backend).load(work / "engine" / "current")
        if wrap_candidate is not None:
            candidate = wrap_candidate(candidate)
        if reference is None:
            say("starting the vLLM reference")
            from validators.reference import VllmRunner

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
        say(f"parity: {len(prompts.prompts)} prompts, {v.max_tokens} tokens, top-{v.top_logprobs}")
        cand_out = candidate.generate(prompts.prompts, v.max_tokens, v.top_logprobs)
        ref_out = reference.generate(prompts.prompts, v.max_tokens, v.top_logprobs)
        parity = check_parity(ref_out, cand_out, v.parity.min_identical_fraction)
        workload = _speed_workload(model_dir, config, v.speed.input_len, v.speed.num_prompts)
        say(f"speed: concurrency {list(v.speed.concurrency)}, {v.speed.num_prompts} requests, "
            f"{v.speed.input_len} in / {v.speed.output_len} out, {v.speed.repetitions} interleaved repetitions")
        speed = measure(candidate, reference, v.speed, workload, candidate_gpus=profile.engine.world_size,
                        reference_gpus=profile.reference.tensor_parallel_size, on_progress=say)
        reasons = parity.reasons() + speed.reasons()
        verdict = "pass" if not reasons else "fail"
        attestation = {
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
            "parity": parity.to_dict(),
            "speed": speed.to_dict(),
            "duration_s": round(time.monotonic() - t0, 3),
        }
        att_id = write_attestation(store, artifact_id, attestation)
        result = ValidationResult(artifact_id, att_id, attestation, parity, speed)
    finally:
        if candidate is not None:
            candidate.close()
        if own_reference and reference is not None:
            reference.close()
        shutil.rmtree(work, ignore_errors=True)
    if not result.passed:
        raise ValidationFailedError(artifact_id, att_id, attestation["reasons"])
    return result


def _read_config(model_dir: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _speed_workload(model_dir: Path, config: dict[str, Any], input_len: int, n: int) -> list[list[int]]:
    """``n`` fixed-seed prompts of exactly ``input_len`` tokens: the same workload on both sides."""
    import random

    from validators.prompts import SEED, token_source

    source = token_source(model_dir, config.get("vocab_size", 32000), need=input_len * 2 + 1)
    rng = random.Random(SEED + 1)
    return [source[s:s + input_len] for s in (rng.randrange(0, len(source) - input_len) for _ in range(n))]


def validate_in_subprocess(store_uri: str | None, artifact_id: str, *, profile_file: str | None = None,
                           timeout_s: float = 3600) -> dict[str, Any]:
    """Run ``buildctl validate`` in its own process and return the attestation.

    vLLM keeps per-process global state (one engine per process), so long-lived callers (a
    Prefect worker, a test session) validate in a child process. A failing verdict (exit 5) still
    returns its attestation; any other failure raises with the output's tail.
    """
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "buildctl", "--json"]
    if store_uri:
        cmd += ["--store", store_uri]
    cmd += ["validate", artifact_id]
    if profile_file:
        cmd += ["--profile", str(profile_file)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    if r.returncode in (0, 5):
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            pass
    raise ValidatorProcessError(r.returncode, "\n".join(r.stderr.strip().splitlines()[-15:]))
