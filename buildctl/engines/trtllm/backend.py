"""The trtllm backend: the production path, TensorRT-LLM's documented two-step engine build.

1. Convert the HF checkpoint to a TensorRT-LLM checkpoint with tp/pp set there:
   ``convert_checkpoint.py --model_dir --output_dir --dtype --tp_size --pp_size`` (an int8 or fp8
   KV cache by the converter's own flag), or for quantization ModelOpt's ``quantize.py --qformat
   Q --calib_dataset DIR --calib_size N [--kv_cache_dtype K]``. Calibration data is always a local
   directory: both scripts default to downloading cnn_dailymail from a model hub.
2. ``trtllm-build --checkpoint_dir --output_dir --max_batch_size --max_input_len --max_seq_len
   --max_num_tokens --kv_cache_type --gemm_plugin --gpt_attention_plugin
   --use_paged_context_fmha --use_fp8_context_fmha ... --workers``.

Both run as isolated subprocesses with the profile's timeout and memory limit. The output must be
``config.json`` plus one non-empty ``rank{r}.engine`` per rank of its mapping, with the
quantization the profile asked for, or the build is refused (a half-failed TP build is a known
cause of "Failed to deserialize cuda engine"; a dropped KV-cache flag builds a different engine).

What differs between releases (where the converter lives, which KV-cache flags it has) is in
:data:`RELEASES`, taken from TensorRT-LLM's sources at those releases; ``tests/support/fixtures/trtllm/``
holds the flags, engine layout and runtime API read from those sources, with file and commit, and
the fakes in ``tests/support/fakes/`` enforce them. Nothing here has run against real TensorRT-LLM.

Generation uses the C++ runner (``ModelRunnerCpp``, the executor): top-k logprobs from the
generation logits the runtime returns when asked (``output_generation_logits``), streaming and the
speed workload through the executor's in-flight batching, and TP/PP > 1 in orchestrator mode (this
process leads; the executor starts one worker per rank).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

from buildctl.engines.backend import BuildResult, Generation, TokenEvent
from buildctl.engines.batching import Request
from buildctl.engines.errors import EngineBuildError, EngineLoadError, HostRequirementsError
from buildctl.engines.compat import CUDA_DRIVER_FLOORS, CompatField, Floor, major, version_tuple
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.isolate import log_tail, run_step
from buildctl.engines.profile import FP8_MIN_SM, BuildProfile, EngineSpec, rule_error
from buildctl.core.settings import Settings

DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
# The checkpoint's quantization record (config.json pretrained_config.quantization) per profile value.
KV_QUANT_ALGO = {"fp8": "FP8", "int8": "INT8"}


# What a TensorRT-LLM engine is bound to, and how hard (docs/upgrades.md explains each).
COMPAT_FIELDS: tuple[CompatField, ...] = (
    CompatField("gpus.sm", "hard", "TensorRT: 'The engine plan file is generated on an incompatible device, "
                "expecting compute 8.6 got compute 8.0, please rebuild'"),
    CompatField("tensorrt_version", "hard", "TensorRT: 'The engine plan file is not compatible with this version of "
                "TensorRT, expecting library version 9.2.0.4 got 9.2.0.5, please rebuild'; 'Serialization assertion "
                "stdVersionRead == kSERIALIZATION_VERSION failed'"),
    CompatField("tensorrt_llm_version", "hard", "TensorRT-LLM plugins register per release: 'getPluginCreator could "
                "not find plugin'"),
    CompatField("cuda_version", "hard", "TensorRT and TensorRT-LLM ship per CUDA major (tensorrt-cu12, tensorrt-cu13); "
                "CUDA compatibility guide: binary compatibility holds within a major only", part="major"),
    CompatField("platform", "hard", "TensorRT support matrix: 'Serialized engines are not portable across platforms'"),
    CompatField("gpus.name", "soft", "TensorRT: 'Using an engine plan file across different models of devices is not "
                "recommended and is likely to affect performance or even cause errors'"),
    CompatField("driver_version", "soft", "the driver is a floor for the CUDA runtime, not part of the plan; one "
                "upstream report links a driver update to a broken engine (NVIDIA/TensorRT-LLM#2455)"),
    CompatField("cuda_version", "soft", "CUDA compatibility guide: minor version compatibility within a major "
                "(kernels may pick other code paths)"),
)

FLOORS: tuple[Floor, ...] = CUDA_DRIVER_FLOORS  # the driver >= the CUDA runtime's minimum (shared: compat.py)


def _onoff(flag: bool) -> str:
    return "enable" if flag else "disable"


@dataclass(frozen=True)
class TrtllmRelease:
    """What buildctl relies on that differs between TensorRT-LLM releases.

    From the sources named in ``tests/support/fixtures/trtllm/<version>/`` (tests check this table
    against them)."""

    series: str
    convert_script: str  # under the examples directory
    quantize_script: str
    converter_kv_flags: Mapping[str, str] = field(default_factory=dict)  # KV dtype -> convert_checkpoint.py flag
    converter_calib_size: bool = False  # convert_checkpoint.py has --calib_size


RELEASES: tuple[TrtllmRelease, ...] = (
    # examples/models/core/llama/convert_checkpoint.py @fd96a08; examples/quantization/quantize.py @c8c6df08
    TrtllmRelease("1.2", "models/core/llama/convert_checkpoint.py", "quantization/quantize.py",
                  {"int8": "--int8_kv_cache", "fp8": "--fp8_kv_cache"}, converter_calib_size=True),
    # examples/llama/convert_checkpoint.py @05316d3: --int8_kv_cache only, no --calib_size
    TrtllmRelease("0.16", "llama/convert_checkpoint.py", "quantization/quantize.py", {"int8": "--int8_kv_cache"}),
)


def release_for(version: str | None) -> TrtllmRelease | None:
    """The release table entry for an installed version (matched on major.minor)."""
    if not version:
        return None
    series = ".".join(version.split(".")[:2])
    return next((r for r in RELEASES if r.series == series), None)


def calibrates(spec: EngineSpec) -> bool:
    """Whether the checkpoint step reads calibration data: any quantization, or an int8 KV cache."""
    return spec.quantization != "none" or spec.kv_cache_dtype == "int8"


@dataclass(frozen=True)
class TrtllmTools:
    """Where TensorRT-LLM's scripts and ``trtllm-build`` are, for one release."""

    convert: str
    quantize: str
    build: str
    python: str
    release: TrtllmRelease

    @classmethod
    def from_settings(cls, settings: Settings, version: str | None = None) -> "TrtllmTools":
        """Paths for ``version`` (default: the pinned ``settings.trtllm_version``); explicit
        ``trtllm_convert``/``trtllm_quantize`` settings win over the release's layout."""
        release = release_for(version or settings.trtllm_version) or RELEASES[0]
        examples = Path(settings.trtllm_examples)
        return cls(convert=settings.trtllm_convert or str(examples / release.convert_script),
                   quantize=settings.trtllm_quantize or str(examples / release.quantize_script),
                   build=settings.trtllm_build, python=settings.trtllm_python or sys.executable, release=release)


def convert_command(profile: BuildProfile, model_dir: Path, ckpt_dir: Path, tools: TrtllmTools) -> list[str]:
    """The checkpoint conversion (or quantization) command for ``profile``."""
    e, t = profile.engine, tools
    common = ["--model_dir", str(model_dir), "--output_dir", str(ckpt_dir), "--dtype", DTYPES[profile.model.dtype],
              "--tp_size", str(e.tp_size), "--pp_size", str(e.pp_size)]
    calib = e.calibration
    if e.quantization == "none":
        cmd = [t.python, t.convert, *common]
        if e.kv_cache_dtype in KV_QUANT_ALGO:
            flag = t.release.converter_kv_flags.get(e.kv_cache_dtype)
            if flag is None:
                raise unsupported_kv(e, t.release)
            cmd.append(flag)
        if calibrates(e) and calib is not None:
            cmd += ["--calib_dataset", calib.dataset]
            if t.release.converter_calib_size:
                cmd += ["--calib_size", str(calib.size)]
        return cmd
    # fp8, int4_awq, w4a8_awq, int8_sq, int8_wo, int4_wo: ModelOpt's quantize.py names them the same way
    cmd = [t.python, t.quantize, *common, "--qformat", e.quantization]
    if calib is not None:
        cmd += ["--calib_dataset", calib.dataset, "--calib_size", str(calib.size)]
    if e.kv_cache_dtype in KV_QUANT_ALGO:
        cmd += ["--kv_cache_dtype", e.kv_cache_dtype]
    return cmd


def unsupported_kv(spec: EngineSpec, release: TrtllmRelease) -> HostRequirementsError:
    return HostRequirementsError("this profile", [
        f"engine.kv_cache_dtype {spec.kv_cache_dtype} with engine.quantization none: TensorRT-LLM {release.series}'s "
        f"convert_checkpoint.py has no {spec.kv_cache_dtype} KV-cache flag (it has: "
        f"{', '.join(release.converter_kv_flags.values()) or 'none'}); quantize with quantize.py "
        f"(engine.quantization) or use another release"])


def build_command(profile: BuildProfile, ckpt_dir: Path, out_dir: Path, tools: TrtllmTools) -> list[str]:
    """The ``trtllm-build`` command for ``profile``."""
    e, p = profile.engine, profile.engine.resolved_plugins
    cmd = [tools.build, "--checkpoint_dir", str(ckpt_dir), "--output_dir", str(out_dir),
           "--max_batch_size", str(e.max_batch_size), "--max_input_len", str(e.max_input_len),
           "--max_seq_len", str(e.max_seq_len)]
    if e.max_num_tokens is not None:
        cmd += ["--max_num_tokens", str(e.max_num_tokens)]
    cmd += ["--kv_cache_type", p.kv_cache_type,
            "--gemm_plugin", p.gemm_plugin,
            "--gpt_attention_plugin", p.gpt_attention_plugin,
            "--use_paged_context_fmha", _onoff(p.use_paged_context_fmha),
            "--use_fp8_context_fmha", _onoff(p.use_fp8_context_fmha),
            "--remove_input_padding", _onoff(p.remove_input_padding),
            "--context_fmha", _onoff(p.context_fmha),
            "--multiple_profiles", _onoff(p.multiple_profiles),
            "--workers", str(p.workers)]
    return cmd


def engine_config(engine_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((engine_dir / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        return config
    except (OSError, ValueError) as err:
        raise EngineLoadError(str(engine_dir), f"config.json is unreadable: {err}") from None


def expected_ranks(engine_dir: Path) -> int:
    try:
        mapping = engine_config(engine_dir)["pretrained_config"]["mapping"]
        return int(mapping.get("world_size") or int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise EngineLoadError(str(engine_dir), f"config.json has no readable pretrained_config.mapping: {err}") from None


def check_complete(engine_dir: Path, world_size: int) -> list[str]:
    """Problems that make an engine directory incomplete (empty list: complete)."""
    if not (engine_dir / "config.json").is_file():
        return ["config.json is missing"]
    try:
        ranks = expected_ranks(engine_dir)
    except EngineLoadError as err:
        return [err.detail]
    problems = []
    if ranks != world_size:
        problems.append(f"config.json maps {ranks} ranks, the profile asks for tp*pp = {world_size}")
    for r in range(max(ranks, world_size)):
        f = engine_dir / f"rank{r}.engine"
        if not f.is_file():
            problems.append(f"rank{r}.engine is missing")
        elif f.stat().st_size == 0:
            problems.append(f"rank{r}.engine is empty")
    return problems


def check_quantization(engine_dir: Path, spec: EngineSpec) -> list[str]:
    """Where the engine's recorded quantization differs from what the profile (and so its build
    hash) claims: a flag the tools ignored or a path that dropped it."""
    try:
        quant = engine_config(engine_dir).get("pretrained_config", {}).get("quantization") or {}
    except EngineLoadError as err:
        return [err.detail]
    problems = []
    want_kv = KV_QUANT_ALGO.get(spec.kv_cache_dtype)
    if quant.get("kv_cache_quant_algo") != want_kv:
        problems.append(f"config.json records kv_cache_quant_algo {quant.get('kv_cache_quant_algo')}, the profile's "
                        f"kv_cache_dtype {spec.kv_cache_dtype} needs {want_kv}")
    if spec.quantization == "fp8" and quant.get("quant_algo") != "FP8":
        problems.append(f"config.json records quant_algo {quant.get('quant_algo')}, the profile asks for FP8")
    if spec.quantization == "none" and quant.get("quant_algo") not in (None, ""):
        problems.append(f"config.json records quant_algo {quant.get('quant_algo')}, the profile asks for none")
    return problems


class TrtllmBackend:
    name: ClassVar[str] = "trtllm"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def tools(self, fingerprint: Fingerprint | None = None) -> TrtllmTools:
        """The tool paths for the release installed on ``fingerprint``'s host (default: pinned)."""
        return TrtllmTools.from_settings(self.settings, fingerprint.tensorrt_llm_version if fingerprint else None)

    @staticmethod
    def tool_version(fingerprint: Fingerprint) -> str | None:
        return fingerprint.tensorrt_llm_version

    @staticmethod
    def gpus_needed(profile: BuildProfile) -> int:
        return profile.engine.world_size  # trtllm-build builds every rank on its own GPU

    compat: ClassVar[tuple[CompatField, ...]] = COMPAT_FIELDS
    floors: ClassVar[tuple[Floor, ...]] = FLOORS
    engine_format: ClassVar[int] = 1
    records_host: ClassVar[bool] = False  # the plans record nothing of the host

    @staticmethod
    def legacy_compat_fields(fingerprint: Fingerprint) -> dict[str, Any]:
        """The fields of schema-1 compat keys (before the hard/soft split), exactly as they were."""
        return {
            "gpu_models": sorted({g.name for g in fingerprint.gpus}),
            "gpu_sm": sorted({g.sm for g in fingerprint.gpus}),
            "tensorrt": fingerprint.tensorrt_version,
            "tensorrt_llm": fingerprint.tensorrt_llm_version,
            "cuda_major": major(fingerprint.cuda_version),
            "driver_branch": major(fingerprint.driver_version),
            "platform": fingerprint.platform,
        }

    @staticmethod
    def recognises(engine_dir: Path) -> bool:
        return (engine_dir / "config.json").is_file() and (engine_dir / "rank0.engine").is_file()

    @staticmethod
    def check_engine_spec(spec: EngineSpec) -> None:
        """trtllm-only rules of a profile's engine section."""
        if spec.aoti is not None:
            raise rule_error("aoti", "aoti-options-aoti-only", "aoti options apply to backend aoti only")
        if spec.vllm is not None:
            raise rule_error("vllm", "vllm-options-vllm-only", "vllm options apply to backend vllm only")
        if spec.kv_cache_dtype in ("fp16", "bf16"):
            raise rule_error("kv_cache_dtype", "trtllm-kv-cache-dtype",
                             "kv_cache_dtype {k!r} with quantization {q!r}: TensorRT-LLM's KV cache follows the model "
                             "dtype unless quantized; use auto, fp8 or int8", k=spec.kv_cache_dtype, q=spec.quantization)
        if calibrates(spec) and spec.calibration is None:
            raise rule_error("calibration", "calibration-required",
                             "quantization {q!r} with kv_cache_dtype {k!r} calibrates: set calibration.dataset to a local "
                             "directory (TensorRT-LLM's scripts would download cnn_dailymail from a model hub)",
                             q=spec.quantization, k=spec.kv_cache_dtype)

    def unmet_requirements(self, profile: BuildProfile, fingerprint: Fingerprint) -> list[str]:
        """Every reason this host cannot build ``profile``: checked before any download or build."""
        e = profile.engine
        unmet = []
        if len(fingerprint.gpus) < e.world_size:
            unmet.append(f"GPU count >= tp_size*pp_size = {e.world_size}: this host has {len(fingerprint.gpus)}")
        uses_fp8 = e.quantization == "fp8" or e.kv_cache_dtype == "fp8"
        min_sm = e.min_sm or (FP8_MIN_SM if uses_fp8 else 0)
        low = sorted({g.sm for g in fingerprint.gpus if int(g.sm.replace(".", "")) < min_sm})
        if low:
            unmet.append(f"GPU SM >= {min_sm / 10:.1f}" + (" (fp8)" if uses_fp8 and not e.min_sm else "")
                         + f": this host has SM {', '.join(low)}")
        pinned, installed = self.settings.trtllm_version, fingerprint.tensorrt_llm_version
        if installed is None:
            unmet.append(f"TensorRT-LLM {pinned} (pinned) importable: not installed on this host")
        elif installed != pinned:
            unmet.append(f"TensorRT-LLM {pinned} (pinned, BUILDCTL_TRTLLM_VERSION) importable: this host has {installed}")
        release = release_for(installed or pinned)
        if release is None:
            unmet.append(f"a TensorRT-LLM release buildctl drives ({', '.join(r.series for r in RELEASES)}): "
                         f"{installed or pinned} is not one")
            return unmet
        tools = self.tools(fingerprint)
        script, layout = ((tools.convert, release.convert_script) if e.quantization == "none"
                          else (tools.quantize, release.quantize_script))
        if not Path(script).is_file():
            unmet.append(f"converter script present: {script} does not exist (TensorRT-LLM {release.series} keeps it at "
                         f"examples/{layout})")
        if shutil.which(tools.build) is None:
            unmet.append(f"trtllm-build executable: {tools.build} is not found")
        if e.quantization == "none" and e.kv_cache_dtype in KV_QUANT_ALGO and e.kv_cache_dtype not in release.converter_kv_flags:
            unmet += unsupported_kv(e, release).unmet
        if calibrates(e) and e.calibration is not None and not Path(e.calibration.dataset).is_dir():
            unmet.append(f"calibration dataset {e.calibration.dataset} is a local directory (builds never download)")
        return unmet

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path, *, model_digest: str | None = None) -> BuildResult:
        e = profile.engine
        unmet = self.unmet_requirements(profile, fingerprint)
        if unmet:
            raise HostRequirementsError(profile.name, unmet)
        tools = self.tools(fingerprint)
        out_dir = Path(out_dir)
        if out_dir.exists():
            raise EngineBuildError("trtllm", "error", f"output directory {out_dir} already exists")
        work = out_dir.parent / f".build-{uuid.uuid4().hex}"
        (work / "tmp").mkdir(parents=True)
        deadline = time.monotonic() + e.build_timeout_s
        env = dict(os.environ)
        # Offline: the checkpoint step must not reach a model hub (calibration data is local).
        env.update({"TMPDIR": str(work / "tmp"), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        start = time.monotonic()
        try:
            commands = (tuple(convert_command(profile, model_dir, work / "ckpt", tools)),
                        tuple(build_command(profile, work / "ckpt", work / "engine", tools)))
            run_step("trtllm", "checkpoint conversion", commands[0],
                     log_path=log_path, timeout_s=max(1.0, deadline - time.monotonic()), env=env,
                     memory_limit_mb=e.build_memory_limit_mb)
            run_step("trtllm", "trtllm-build", commands[1],
                     log_path=log_path, timeout_s=max(1.0, deadline - time.monotonic()), env=env,
                     memory_limit_mb=e.build_memory_limit_mb)
            problems = check_complete(work / "engine", e.world_size) or check_quantization(work / "engine", e)
            if problems:
                raise EngineBuildError("trtllm", "incomplete", "; ".join(problems), log_path=str(log_path),
                                       log_tail=log_tail(log_path))
            os.rename(work / "engine", out_dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
        return BuildResult(engine_dir=out_dir, files=files, log_path=log_path, wall_s=time.monotonic() - start,
                           tool_versions={"tensorrt_llm": fingerprint.tensorrt_llm_version,
                                          "tensorrt": fingerprint.tensorrt_version},
                           commands=commands)

    def check_tree(self, engine_dir: Path, fingerprint: Fingerprint) -> None:
        """Nothing to check without TensorRT: the plans record nothing of the host they were built on."""

    def preflight(self, engine_dir: Path) -> None:
        """Deserialize every rank's plan with TensorRT's runtime: the only compatibility check TensorRT has."""
        engine_dir = Path(engine_dir)
        ranks = expected_ranks(engine_dir)
        import tensorrt as trt  # GPU hosts only
        import tensorrt_llm  # noqa: F401  (registers the TensorRT-LLM plugins the plans reference)

        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        for r in range(ranks):
            plan = (engine_dir / f"rank{r}.engine").read_bytes()
            engine = runtime.deserialize_cuda_engine(plan)
            if engine is None:
                raise EngineLoadError(str(engine_dir), f"TensorRT could not deserialize rank{r}.engine on this host")
            del engine

    def load(self, engine_dir: Path) -> "TrtllmRunner":
        return TrtllmRunner(Path(engine_dir))


class TrtllmRunner:
    """Greedy generation through TensorRT-LLM's C++ runner (``ModelRunnerCpp``; GPU only).

    * World size 1 runs in this process. TP/PP > 1 runs in orchestrator mode: this process is the
      only MPI rank and leads, the executor starts one ``executorWorker`` per GPU (``device_ids``);
      so every result comes from the leader, never ``[]`` from a non-leader rank.
    * Top-k logprobs: log_softmax of the generation logits, which the runtime returns only when
      asked (``output_generation_logits``, with ``gather_generation_logits`` on the executor).
      Cost: a float copy of the vocabulary per generated token and sequence to the host (128k vocab:
      512 KiB per token), so only parity runs ask; the speed workload never does.
    * Streaming (the speed workload) submits requests to the executor as earlier ones finish, so
      the engine batches in flight, as vLLM does, at the same concurrency; tokens are the deltas
      of each streamed response.
    * The staggered parity set (:meth:`generate_requests`) goes through the same executor path,
      each request with its own ``max_tokens`` and arrival, with the streamed generation logits.
    """

    name = "trtllm"

    def __init__(self, engine_dir: Path) -> None:
        from tensorrt_llm.runtime import ModelRunnerCpp

        self.torch = __import__("torch")
        self.world_size = expected_ranks(engine_dir)
        kwargs: dict[str, Any] = {"rank": 0, "gather_generation_logits": True}
        if self.world_size > 1:
            kwargs.update(is_orchestrator_mode=True, device_ids=list(range(self.world_size)))
        try:
            self.runner: Any = ModelRunnerCpp.from_dir(str(engine_dir), **kwargs)
        except (RuntimeError, ValueError, AssertionError) as err:
            raise EngineLoadError(str(engine_dir), f"ModelRunnerCpp could not load the engine: {err}") from None
        self.max_batch_size = int(self.runner.max_batch_size)

    @staticmethod
    def _not_leader() -> EngineLoadError:
        return EngineLoadError("trtllm", "the runner returned no output: this process is not the leader rank "
                               "(run TP/PP engines in orchestrator mode, not under mpirun)")

    def _leader_output(self, out: Any) -> Any:
        if isinstance(out, list) and not out:  # ModelRunnerCpp.generate on a non-leader rank
            raise self._not_leader()
        return out

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        torch = self.torch
        gens: list[Generation] = []
        for b in range(0, len(prompts), self.max_batch_size):
            batch = prompts[b:b + self.max_batch_size]
            out = self._leader_output(self.runner.generate(
                [torch.tensor(p, dtype=torch.int32) for p in batch], max_new_tokens=max_tokens, end_id=-1, pad_id=0,
                top_k=1, temperature=1.0, streaming=False, return_dict=True, output_sequence_lengths=True,
                output_generation_logits=bool(top_logprobs)))
            for i, p in enumerate(batch):
                end = int(out["sequence_lengths"][i][0])  # output_ids holds the prompt, then end_id padding
                ids = [int(t) for t in out["output_ids"][i][0][len(p):end].tolist()][:max_tokens]
                tops: list[dict[int, float]] = []
                if top_logprobs:
                    logits = out.get("generation_logits")
                    if logits is None:
                        raise self._no_logits("output_generation_logits")
                    tops = self._tops(logits[i][0][:len(ids)], ids, top_logprobs)
                gens.append(Generation(token_ids=ids, top_logprobs=tops))
        return gens

    @staticmethod
    def _no_logits(asked: str) -> EngineLoadError:
        return EngineLoadError("trtllm", f"the runtime returned no generation_logits although asked ({asked})")

    def _tops(self, logits: Any, ids: list[int], k: int) -> list[dict[int, float]]:
        """Per generated token, the top-``k`` ``{token: logprob}`` (the token itself always
        included): log_softmax over the vocabulary of that step's logits ``[steps, vocab]``."""
        lp = self.torch.log_softmax(logits.float(), dim=-1)
        vals, idx = self.torch.topk(lp, k, dim=-1)
        tops = []
        for step, tok in enumerate(ids):
            d = {int(t): float(v) for t, v in zip(idx[step].tolist(), vals[step].tolist())}
            d.setdefault(tok, float(lp[step, tok]))
            tops.append(d)
        return tops

    def _request(self, prompt: list[int], max_tokens: int, logits: bool) -> Any:
        from tensorrt_llm.bindings import executor as trtllm

        return trtllm.Request(input_token_ids=list(prompt), max_tokens=max_tokens, end_id=-1, pad_id=0,
                              sampling_config=trtllm.SamplingConfig(beam_width=1, top_k=1), streaming=True,
                              output_config=trtllm.OutputConfig(return_generation_logits=logits))

    def generate_requests(self, requests: list[Request], top_logprobs: int,
                          concurrency: int | None = None) -> list[Generation]:
        """Each request with its own ``max_tokens`` through the executor's in-flight batching
        (the staggered parity set): at most ``concurrency`` (and ``max_batch_size``) in flight,
        request ``i`` enqueued no earlier than step ``arrival`` (one ``await_responses()`` is a
        step), so requests join and leave a running batch. Streamed: each response carries its new
        tokens and, when asked, their logits as ``[tokens, num_sequences, vocab]`` (the executor's
        streaming layout, ``tensorrt_llm/runtime/model_runner_cpp.py`` ``_fill_output``)."""
        executor = self.runner.executor
        if not executor.can_enqueue_requests():
            raise self._not_leader()
        limit = max(1, min(self.max_batch_size, concurrency or self.max_batch_size))
        waiting = deque(sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i)))
        in_flight: dict[int, int] = {}
        out = [Generation(token_ids=[], top_logprobs=[]) for _ in requests]
        step = 0
        while waiting or in_flight:
            if not in_flight:  # nothing runs until the next arrival: skip to it
                step = max(step, requests[waiting[0]].arrival)
            while waiting and len(in_flight) < limit and requests[waiting[0]].arrival <= step:
                i = waiting.popleft()
                (rid,) = executor.enqueue_requests([self._request(requests[i].prompt, requests[i].max_tokens,
                                                                  bool(top_logprobs))])
                in_flight[rid] = i
            for response in executor.await_responses():
                if response.has_error():
                    raise EngineLoadError("trtllm", f"request failed in the executor: {response.error_msg}")
                i = in_flight[response.request_id]
                gen, want = out[i], requests[i].max_tokens
                new = [int(t) for t in response.result.output_token_ids[0]][:want - len(gen.token_ids)]
                if top_logprobs and new:
                    logits = response.result.generation_logits
                    if logits is None:
                        raise self._no_logits("OutputConfig(return_generation_logits=True)")
                    gen.top_logprobs += self._tops(logits[:len(new), 0, :], new, top_logprobs)
                gen.token_ids += new
                if response.result.is_final:
                    del in_flight[response.request_id]
            step += 1
        return out

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """At most ``concurrency`` requests in flight on the executor; a new one is enqueued as
        soon as one finishes (in-flight batching, like vLLM's continuous batching)."""
        clock = time.perf_counter
        executor = self.runner.executor
        if not executor.can_enqueue_requests():
            raise self._not_leader()
        pending = deque(enumerate(prompts))
        in_flight: dict[int, int] = {}
        produced: dict[int, int] = {}

        def submit() -> TokenEvent:
            index, prompt = pending.popleft()
            request = self._request(prompt, max_tokens, False)
            t = clock()
            (rid,) = executor.enqueue_requests([request])
            in_flight[rid], produced[index] = index, 0
            return TokenEvent(index, None, t)

        while pending and len(in_flight) < max(1, concurrency):
            yield submit()
        while in_flight:
            for response in executor.await_responses():
                now = clock()
                if response.has_error():
                    raise EngineLoadError("trtllm", f"request failed in the executor: {response.error_msg}")
                index = in_flight[response.request_id]
                for tok in response.result.output_token_ids[0]:
                    if produced[index] < max_tokens:
                        produced[index] += 1
                        yield TokenEvent(index, int(tok), now)
                if response.result.is_final:
                    del in_flight[response.request_id]
                    if pending:
                        yield submit()

    def close(self) -> None:
        self.runner = None
