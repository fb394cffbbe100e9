"""Attestations: the typed record of one validation, stored immutably under its artifact.

The validators produce an :class:`Attestation`; the store writes it create-only (signed when a
key is given), and promote, the flows and the CLI read it back as the same model. Nothing reads
an attestation as a dict by string keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json, digest_bytes
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.trust.binding import manifest_blake3
from buildctl.artifact_store.errors import CorruptObjectError
from buildctl.artifact_store.layout import attestation_key, attestation_prefix, timed_record_names_its_bytes
from buildctl.artifact_store.trust.signing import SigningKey

# Schema 2 (paired ratios with intervals, an inconclusive verdict, the noise record) adds fields
# only: schema-1 records still read, their new fields at their defaults.
ATTESTATION_SCHEMA = 2


class ProfileRef(Record):
    """The profile an attestation validated against."""

    name: str = Field(..., description="Profile name.")
    build_hash: str = Field(..., description="The profile's build-affecting hash.")


class PromptSetInfo(Record):
    """Which prompts ran."""

    digest: str = Field(..., description="Digest of every prompt's token ids, in order.")
    count: int = Field(..., ge=0, description="How many prompts.")
    sets: tuple[str, ...] = Field(..., description="The prompt sets and files they came from.")
    skipped: tuple[str, ...] = Field((), description="Prompt sets skipped because they do not fit the engine's limits.")


class PromptParityRecord(Record):
    """One prompt's comparison (vLLM's check_logprobs_close rule)."""

    index: int = Field(..., description="Prompt index.")
    status: Literal["identical", "close", "failed"] = Field(..., description="identical, close (diverged inside the top-k) or failed.")
    compared: int = Field(..., description="Positions compared.")
    position: int | None = Field(None, description="First divergence, if any.")
    reference_token: int | None = Field(None, description="The reference's token at the divergence.")
    candidate_token: int | None = Field(None, description="The candidate's token at the divergence.")
    max_abs_logprob_diff: float = Field(0.0, description="Largest |logprob difference| over the common prefix.")


class StaggeredParity(Record):
    """Parity of one in-flight batching run: requests with their own ``max_tokens`` arriving
    mid-run, each compared with the same prompt's solo reference output (its first ``max_tokens``
    tokens: greedy decoding), by the same rule."""

    concurrency: int = Field(..., ge=1, description="Requests in flight at most.")
    prompts: int = Field(..., ge=0, description="Requests compared.")
    identical: int = Field(..., ge=0, description="Requests with identical tokens.")
    close: int = Field(..., ge=0, description="Requests that diverged inside the top-k.")
    failed: int = Field(..., ge=0, description="Requests that diverged outside the top-k.")
    max_abs_logprob_diff: float = Field(..., description="Largest |logprob difference| over all requests.")
    per_prompt: tuple[PromptParityRecord, ...] = Field((), description="Each request's comparison (index: the prompt's).")


class ParitySummary(Record):
    """Output parity against the vLLM reference."""

    passed: bool = Field(..., description="Whether parity passed.")
    prompts: int = Field(..., ge=0, description="Prompts compared.")
    identical: int = Field(..., ge=0, description="Prompts with identical tokens.")
    close: int = Field(..., ge=0, description="Prompts that diverged inside the top-k.")
    failed: int = Field(..., ge=0, description="Prompts that diverged outside the top-k.")
    identical_fraction: float = Field(..., description="identical / prompts.")
    min_identical_fraction: float = Field(..., description="The profile's required identical fraction.")
    max_abs_logprob_diff: float = Field(..., description="Largest |logprob difference| over all prompts.")
    per_prompt: tuple[PromptParityRecord, ...] = Field((), description="Each prompt's comparison.")
    staggered: tuple[StaggeredParity, ...] = Field((), description="In-flight batching runs (engines that batch in "
                                                   "flight; absent before aoti format 2).")


class SideSpeed(Record):
    """One side's speed at one concurrency level: each figure is the median over repetitions of that
    repetition's value (schema 1: percentiles of all repetitions' requests pooled)."""

    output_tok_s: float = Field(..., description="Median output tokens/s.")
    output_tok_s_per_gpu: float = Field(..., description="Median output tokens/s per GPU.")
    request_throughput: float = Field(..., description="Median requests/s.")
    ttft_p50_ms: float = Field(..., description="Median time to first token, ms.")
    ttft_p99_ms: float = Field(..., description="p99 time to first token, ms.")
    tpot_p50_ms: float = Field(..., description="Median time per output token, ms.")
    tpot_p99_ms: float = Field(..., description="p99 time per output token, ms.")
    itl_p50_ms: float = Field(..., description="Median inter-token latency, ms.")
    itl_p99_ms: float = Field(..., description="p99 inter-token latency, ms.")
    output_tok_s_min: float = Field(..., description="Lowest repetition's tokens/s.")
    output_tok_s_max: float = Field(..., description="Highest repetition's tokens/s.")
    output_tok_s_cv: float = Field(..., description="Coefficient of variation of tokens/s across repetitions.")
    repetitions: int = Field(..., ge=0, description="Repetitions measured.")


class RatioEstimate(Record):
    """One metric's candidate/reference ratio: the median of the paired repetitions' ratios, its
    order-statistic confidence interval and, where gated, its verdict."""

    metric: Literal["throughput", "ttft_p50", "ttft_p99", "tpot_p50"] = Field(..., description="The metric compared.")
    median: float = Field(..., description="Median of the paired ratios.")
    low: float | None = Field(..., description="Interval's low end (null: too few repetitions for the level).")
    high: float | None = Field(..., description="Interval's high end (null: too few repetitions for the level).")
    confidence: float = Field(..., description="The interval's confidence level.")
    samples: tuple[float, ...] = Field(..., description="Each repetition's paired ratio, in measurement order.")
    threshold: float | None = Field(None, description="The gate's threshold; null when not gated.")
    bound: Literal["min", "max"] = Field(..., description="min: the ratio must be at least the threshold; max: at most.")
    verdict: Literal["pass", "fail", "inconclusive", "not gated"] = Field(..., description="This metric's verdict.")


class SpeedLevel(Record):
    """Candidate and reference side by side at one concurrency level."""

    concurrency: int = Field(..., ge=1, description="Requests in flight.")
    candidate: SideSpeed = Field(..., description="The engine under test.")
    reference: SideSpeed = Field(..., description="The vLLM reference.")
    throughput_ratio: float = Field(..., description="Median paired candidate / reference output tokens/s.")
    p99_ttft_ratio: float = Field(..., description="Median paired candidate / reference p99 TTFT.")
    passed: bool = Field(..., description="Whether this level passed the gate.")
    reasons: tuple[str, ...] = Field((), description="Why it failed or is inconclusive, if it is.")
    verdict: Literal["pass", "fail", "inconclusive"] | None = Field(None, description="The level's verdict (schema 1: see passed).")
    ratios: tuple[RatioEstimate, ...] = Field((), description="Each metric's paired ratio with its interval (schema >= 2).")


class NoiseRecord(Record):
    """What the machine was doing while speed was measured."""

    cpu_count: int = Field(..., ge=1, description="Logical CPUs.")
    load_avg_1m_before: float | None = Field(..., description="1-minute load average before measuring.")
    load_avg_1m_after: float | None = Field(..., description="1-minute load average after measuring.")
    cpu_steal_fraction: float | None = Field(..., description="CPU time stolen by the hypervisor while measuring; null: unreadable.")
    calibration_before_ms: float = Field(..., description="A fixed calibration loop's time before measuring.")
    calibration_after_ms: float = Field(..., description="The same loop's time after measuring.")


class SpeedBudget(Record):
    """How much measuring the verdict took, against the profile's budget."""

    scale: float = Field(..., gt=0, description="Budget multiplier of this run (2 on the flow's retry).")
    max_repetitions: int = Field(..., description="Most repetitions per level allowed.")
    max_seconds: float = Field(..., description="Wall-clock budget for added repetitions.")
    seconds: float = Field(..., description="Wall-clock time the speed measurement took.")
    exhausted: bool = Field(..., description="Whether a level stopped inconclusive because the budget ran out.")


class SpeedGateRecord(Record):
    """The speed gate as it was applied."""

    min_throughput_ratio: float = Field(..., description="Lowest allowed throughput ratio.")
    max_p99_ttft_ratio: float | None = Field(..., description="Highest allowed p99 TTFT ratio; null: not gated.")
    max_p50_ttft_ratio: float | None = Field(None, description="Highest allowed p50 TTFT ratio; null: not gated.")
    max_tpot_ratio: float | None = Field(None, description="Highest allowed median TPOT ratio; null: not gated.")
    levels: dict[int, dict[str, float | None]] = Field(default_factory=dict, description="Per-concurrency threshold overrides.")
    concurrency: tuple[int, ...] = Field(..., description="Concurrency levels measured.")
    input_len: int = Field(..., description="Prompt length of the speed workload.")
    output_len: int = Field(..., description="Output length of the speed workload.")
    num_prompts: int = Field(..., description="Requests per repetition.")
    repetitions: int = Field(..., description="Paired repetitions before the first verdict.")
    max_repetitions: int | None = Field(None, description="Most paired repetitions per level (schema >= 2).")
    max_seconds: float | None = Field(None, description="Budget for added repetitions (schema >= 2).")
    confidence: float | None = Field(None, description="Confidence level of the intervals (schema >= 2).")
    cpu_threads: int | None = Field(None, description="Intra-op CPU threads while measuring; null: the default.")
    warmup: int = Field(..., description="Unmeasured warm-up requests per side and level.")


class SpeedSummary(Record):
    """Speed against the vLLM reference."""

    passed: bool = Field(..., description="Whether every level passed.")
    gate: SpeedGateRecord = Field(..., description="The gate applied.")
    levels: tuple[SpeedLevel, ...] = Field(..., description="One entry per concurrency level.")
    verdict: Literal["pass", "fail", "inconclusive"] | None = Field(None, description="Speed verdict over all levels (schema 1: see passed).")
    noise: NoiseRecord | None = Field(None, description="What the machine was doing while measuring (schema >= 2).")
    budget: SpeedBudget | None = Field(None, description="The measuring budget and its use (schema >= 2).")


class Thresholds(SpeedGateRecord):
    """Every threshold the verdict was computed with."""

    parity_rule: str = Field(..., description="The parity rule (vLLM's check_logprobs_close).")
    min_identical_fraction: float = Field(..., description="Required fraction of identical prompts.")
    max_tokens: int = Field(..., description="Tokens generated per parity prompt.")
    top_logprobs: int = Field(..., description="Top-k logprobs compared.")


class WarmStartRecord(Record):
    """A bundle's start-up check (vllm, trtllm-torch): whether the runtime used the bundle's
    caches, and engine-ready times cold (empty caches) and warm (the bundle) in interleaved pairs."""

    cache_used: bool = Field(..., description="Every warm start compiled nothing: no new compile-cache hash folder, no new kernel file.")
    reason: str | None = Field(None, description="Why the cache was not used, as the first warm start that missed says.")
    cold_s: tuple[float, ...] = Field(..., min_length=1, description="Engine-ready seconds of each cold start (empty cache).")
    warm_s: tuple[float, ...] = Field(..., min_length=1, description="Engine-ready seconds of each warm start (a scratch copy of the bundle's caches).")
    max_warm_cold_ratio: float = Field(..., gt=0, description="The gate: highest allowed median warm / median cold.")
    installed_unchanged: bool = Field(..., description="The installed bundle still matched its manifest, byte for byte, after every start.")
    checked: tuple[str, ...] = Field(..., description="What was checked, in words.")

    @property
    def ratio(self) -> float:
        from statistics import median

        return median(self.warm_s) / median(self.cold_s)

    def reasons(self) -> list[str]:
        """Why the start-up check fails (empty: it passes)."""
        out = []
        if not self.cache_used:
            out.append(f"warm start: cache not used: {self.reason or 'no reason recorded'}")
        if not self.installed_unchanged:
            out.append("warm start: the installed bundle changed while vLLM ran from it")
        if self.ratio > self.max_warm_cold_ratio:
            out.append(f"warm start: warm/cold engine-ready time {self.ratio:.2f} is over {self.max_warm_cold_ratio}")
        return out


class CrossRuntimeParity(Record):
    """A fallback runtime's parity with a served model's preferred runtime: both validated against
    the same vLLM reference (the same weights, prompts and reference outputs), both in parity with
    it. A node re-reads the preferred attestation named here and recomputes this before it runs the
    fallback (:func:`parity_basis_differences`)."""

    model: str = Field(..., description="The served model.")
    preferred_profile: str = Field(..., description="Its preferred runtime's profile.")
    preferred_artifact: str = Field(..., description="The preferred artifact whose attestation was compared.")
    preferred_attestation: str = Field(..., description="That attestation's store key (immutable: named by its bytes).")
    differences: tuple[str, ...] = Field((), description="What differs between the two validations (empty: the same reference).")
    passed: bool = Field(..., description="No differences, and both sides passed parity.")


class Attestation(Record):
    """The immutable record of one validation of one artifact on one host."""

    schema_version: Literal[1, 2] = Field(ATTESTATION_SCHEMA, description="Attestation schema version.")
    artifact_id: str = Field(..., description="The artifact validated.")
    manifest_blake3: str | None = Field(None, description="BLAKE3-256 of the artifact's manifest bytes (binds the signature to them); absent in attestations written before BLAKE3.")
    verdict: Literal["pass", "fail", "inconclusive"] = Field(..., description="pass, fail, or inconclusive (a speed interval straddles a threshold).")
    reasons: tuple[str, ...] = Field((), description="Every reason for a fail or an inconclusive verdict.")
    compat_key: str = Field(..., description="The validating host's compat key for the artifact's backend.")
    created_at: str = Field(..., description="UTC ISO-8601 time of the validation.")
    profile: ProfileRef = Field(..., description="The profile validated against.")
    validator_fingerprint: dict[str, Any] = Field(..., description="The validating host's full fingerprint.")
    versions: dict[str, str | None] = Field(..., description="buildctl, vLLM, backend and tool versions.")
    model_digest: str = Field(..., description="Digest of the checkpoint the reference ran.")
    model_digest_verified: bool = Field(..., description="Whether the manifest recorded a model digest to compare with.")
    prompt_set: PromptSetInfo = Field(..., description="The prompts that ran.")
    thresholds: Thresholds = Field(..., description="The thresholds applied.")
    reference_engine_args: dict[str, Any] = Field(..., description="The vLLM reference's engine arguments.")
    parity: ParitySummary = Field(..., description="Output parity.")
    speed: SpeedSummary = Field(..., description="Speed side by side.")
    duration_s: float = Field(..., ge=0, description="How long the validation took.")
    warm_start: WarmStartRecord | None = Field(None, description="vllm and trtllm-torch bundles: the start-up check (absent for other backends).")
    reference_outputs_digest: str | None = Field(None, description="Digest of the reference's greedy token ids for every parity prompt, in order: two validations with the same one compared against the same reference outputs. Absent before served models.")
    cross_runtime: tuple[CrossRuntimeParity, ...] | None = Field(None, description="For a fallback runtime of a served model: its parity with the preferred runtime's validation. Absent when the profile is no fallback, or before served models.")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def content(self) -> dict[str, Any]:
        """The JSON content without the signature (what is signed); an unset ``manifest_blake3`` is left
        out, as in records written before it."""
        unset = {name for name in ("manifest_blake3", "warm_start", "reference_outputs_digest", "cross_runtime")
                 if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude={"signature"} | unset)


@dataclass(frozen=True)
class StoredAttestation:
    """An attestation as stored: its id (digest of the stored bytes), key and signed bytes."""

    attestation_id: str
    key: str
    attestation: Attestation
    signed_bytes: bytes  # canonical JSON of the stored record without its signature


def write_attestation(store: Store, attestation: Attestation, *, signer: SigningKey | None = None) -> str:
    """Store an attestation (create-only) under its artifact, signed by ``signer``; returns its id.
    It carries the BLAKE3 of the manifest bytes as stored, when the caller set none."""
    if attestation.manifest_blake3 is None:
        attestation = attestation.model_copy(update={"manifest_blake3": manifest_blake3(store, attestation.artifact_id)})
    content = attestation.content()
    if signer is not None:
        content["signature"] = signer.sign(canonical_json(content))
    body = canonical_json(content)
    att_id = digest_bytes(body)
    store.put_bytes(attestation_key(attestation.artifact_id, attestation.created_at, att_id), body)
    return att_id


def list_attestations(store: Store, artifact_id: str) -> list[StoredAttestation]:
    """Every attestation of an artifact, oldest first (keys sort by creation time)."""
    return [parse_attestation(store.get_bytes(key), key) for key in store.list(attestation_prefix(artifact_id))]


def parse_attestation(body: bytes, key: str) -> StoredAttestation:
    """One stored attestation; :class:`CorruptObjectError` if its bytes do not match their name or
    are no attestation."""
    att_id = digest_bytes(body)
    if not timed_record_names_its_bytes(key, att_id):
        raise CorruptObjectError(key, "attestation bytes do not match their name")
    try:
        raw = json.loads(body)
        att = Attestation.model_validate(raw)
    except (ValueError, ValidationError) as err:
        raise CorruptObjectError(key, f"not a valid attestation: {str(err).splitlines()[0]}") from None
    signed = canonical_json({k: v for k, v in raw.items() if k != "signature"})
    return StoredAttestation(att_id, key, att, signed)


def latest_attestation(store: Store, artifact_id: str, compat_key: str | Iterable[str]) -> StoredAttestation | None:
    """The newest attestation of an artifact made on a host with ``compat_key`` (or any of several)."""
    keys = {compat_key} if isinstance(compat_key, str) else set(compat_key)
    matching = [a for a in list_attestations(store, artifact_id) if a.attestation.compat_key in keys]
    return matching[-1] if matching else None


def parity_basis_differences(preferred: Attestation, fallback: Attestation) -> list[str]:
    """Why two validations are not evidence about the same outputs (empty: they are): the
    checkpoint, the prompts, the tokens and top-k compared, or the reference's own outputs differ,
    or either side did not pass parity. A validation without the reference outputs' digest (made
    before served models) cannot show it."""
    out = []
    for what, a, b in (("model digest", preferred.model_digest, fallback.model_digest),
                       ("prompt set", preferred.prompt_set.digest, fallback.prompt_set.digest),
                       ("max_tokens", preferred.thresholds.max_tokens, fallback.thresholds.max_tokens),
                       ("top_logprobs", preferred.thresholds.top_logprobs, fallback.thresholds.top_logprobs)):
        if a != b:
            out.append(f"{what}: {a} vs {b}")
    a, b = preferred.reference_outputs_digest, fallback.reference_outputs_digest
    if a is None or b is None:
        out.append("reference outputs: not recorded by " + " and ".join(
            n for n, d in (("the preferred validation", a), ("the fallback validation", b)) if d is None) + "; revalidate")
    elif a != b:
        out.append(f"reference outputs: {a} vs {b} (not the same vLLM reference)")
    for side, att in (("preferred", preferred), ("fallback", fallback)):
        if not att.parity.passed:
            out.append(f"the {side} runtime did not pass parity ({att.artifact_id})")
    return out


# --- the verdict, recomputed from the recorded figures ------------------------------------------

_GATE_KEYS = {"throughput": "min_throughput_ratio", "ttft_p99": "max_p99_ttft_ratio",
              "ttft_p50": "max_p50_ttft_ratio", "tpot_p50": "max_tpot_ratio"}


def recomputed_verdict(att: Attestation) -> tuple[str, list[str]]:
    """The verdict the attestation's own figures give under the thresholds it records, and why
    (promote trusts this, not the ``verdict`` field). A record without the evidence (schema 1, no
    per-prompt parity, no paired samples) cannot pass."""
    from buildctl.core.stats import combine, gate_verdict, median_interval

    reasons: list[str] = []
    if att.schema_version < 2:
        return "fail", ["schema-1 attestation: no paired samples to recompute the speed verdict from; revalidate"]
    t, p = att.thresholds, att.parity
    verdicts: list[str] = []
    if p.prompts == 0 or len(p.per_prompt) != p.prompts:
        verdicts.append("fail")
        reasons.append(f"parity: {len(p.per_prompt)} per-prompt records for {p.prompts} prompts")
    else:
        failed = [x.index for x in p.per_prompt if x.status == "failed"]
        identical = sum(x.status == "identical" for x in p.per_prompt) / p.prompts
        if failed:
            reasons.append(f"parity: prompts {failed[:5]} diverged outside the top-k")
        if identical < t.min_identical_fraction:
            reasons.append(f"parity: {identical:.0%} identical, the thresholds require {t.min_identical_fraction:.0%}")
        verdicts.append("fail" if failed or identical < t.min_identical_fraction else "pass")
    for st in p.staggered:
        records = [x for x in st.per_prompt if x.status == "failed"]
        identical = sum(x.status == "identical" for x in st.per_prompt) / max(1, len(st.per_prompt))
        if st.prompts == 0 or len(st.per_prompt) != st.prompts:
            reasons.append(f"parity at concurrency {st.concurrency} (staggered): {len(st.per_prompt)} records for "
                           f"{st.prompts} requests")
        if records:
            reasons.append(f"parity at concurrency {st.concurrency} (staggered): prompts "
                           f"{[x.index for x in records][:5]} diverged outside the top-k")
        if identical < t.min_identical_fraction:
            reasons.append(f"parity at concurrency {st.concurrency} (staggered): {identical:.0%} identical, the "
                           f"thresholds require {t.min_identical_fraction:.0%}")
        bad = st.prompts == 0 or len(st.per_prompt) != st.prompts or records or identical < t.min_identical_fraction
        verdicts.append("fail" if bad else "pass")
    levels = {lv.concurrency: lv for lv in att.speed.levels}
    for c in t.concurrency:
        lv = levels.get(c)
        if lv is None:
            verdicts.append("fail")
            reasons.append(f"speed: no measurement at concurrency {c}")
            continue
        ratios = {r.metric: r for r in lv.ratios}
        for metric, key in _GATE_KEYS.items():
            over = t.levels.get(c, {})  # a level's own threshold wins where it sets one (SpeedGate.thresholds_at)
            gated = over[key] if over.get(key) is not None else getattr(t, key)
            r = ratios.get(metric)
            if gated is None:
                continue
            if r is None or r.threshold != gated or not r.samples:
                verdicts.append("fail")
                reasons.append(f"speed c={c}: {metric} is gated at {gated} but the record has "
                               + ("no samples" if r is None or not r.samples else f"threshold {r.threshold}"))
                continue
            iv = median_interval(list(r.samples), r.confidence)
            v = gate_verdict(iv, gated, r.bound)
            verdicts.append(v)
            if v != "pass":
                reasons.append(f"speed c={c}: {metric} {iv.describe()} gives {v} against {gated}")
    # the bundle backends (buildctl.engines.registry.BUNDLE_BACKENDS; the store imports no engine module)
    if att.warm_start is None and att.versions.get("engine_backend") in ("vllm", "trtllm-torch"):
        verdicts.append("fail")
        reasons.append(f"warm start: a {att.versions['engine_backend']} bundle's attestation without the start-up check; "
                       "revalidate")
    if att.warm_start is not None:
        why = att.warm_start.reasons()
        reasons += why
        verdicts.append("fail" if why else "pass")
    return combine(verdicts), reasons  # type: ignore[arg-type]
