"""The trtllm backend: the production path, TensorRT-LLM's documented two-step engine build.

1. Convert the HF checkpoint to a TensorRT-LLM checkpoint with tp/pp set there:
   ``convert_checkpoint.py --model_dir --output_dir --dtype --tp_size --pp_size``, or for fp8 the
   ModelOpt path ``quantize.py --qformat fp8 --kv_cache_dtype fp8 --calib_size 512 ...``.
2. ``trtllm-build --checkpoint_dir --output_dir --max_batch_size --max_input_len --max_seq_len
   --max_num_tokens --kv_cache_type --gemm_plugin --gpt_attention_plugin
   --use_paged_context_fmha --use_fp8_context_fmha ... --workers``.

Both run as isolated subprocesses with the profile's timeout. The output must be
``config.json`` plus one non-empty ``rank{r}.engine`` per rank of its mapping, or the build is
incomplete (a half-failed TP build is a known cause of "Failed to deserialize cuda engine").

The scripts are not installed by the wheel; their paths come from the settings
(``BUILDCTL_TRTLLM_CONVERT``, ``BUILDCTL_TRTLLM_QUANTIZE``, ``BUILDCTL_TRTLLM_BUILD``,
``BUILDCTL_TRTLLM_PYTHON``) with defaults for NVIDIA's TensorRT-LLM release container.

Here (no GPU) this module has run only against the fake executables in ``tests/fakes/``; the
runner and the preflight need a GPU and TensorRT-LLM 1.2.x and have not run in this project's CI.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

from buildctl.engines.backend import BuildResult, Generation, TokenEvent
from buildctl.engines.errors import EngineBuildError, EngineLoadError, IncompatibleTargetError
from buildctl.engines.fingerprint import Fingerprint, major
from buildctl.engines.isolate import run_step
from buildctl.engines.profile import FP8_MIN_SM, BuildProfile, EngineSpec, rule_error
from buildctl.settings import Settings

DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def _onoff(flag: bool) -> str:
    return "enable" if flag else "disable"


@dataclass(frozen=True)
class TrtllmTools:
    """Where TensorRT-LLM's scripts and ``trtllm-build`` are (``Settings.trtllm_*``)."""

    convert: str
    quantize: str
    build: str
    python: str

    @classmethod
    def from_settings(cls, settings: Settings) -> "TrtllmTools":
        return cls(convert=settings.trtllm_convert, quantize=settings.trtllm_quantize, build=settings.trtllm_build,
                   python=settings.trtllm_python or sys.executable)


def convert_command(profile: BuildProfile, model_dir: Path, ckpt_dir: Path, tools: TrtllmTools) -> list[str]:
    """The checkpoint conversion (or fp8 quantization) command for ``profile``."""
    e, t = profile.engine, tools
    common = ["--model_dir", str(model_dir), "--output_dir", str(ckpt_dir), "--dtype", DTYPES[profile.model.dtype],
              "--tp_size", str(e.tp_size), "--pp_size", str(e.pp_size)]
    if e.quantization == "fp8":
        cmd = [t.python, t.quantize, *common, "--qformat", "fp8", "--calib_size", "512"]
        if e.kv_cache_dtype == "fp8":
            cmd += ["--kv_cache_dtype", "fp8"]
        return cmd
    if e.quantization == "none":
        cmd = [t.python, t.convert, *common]
        if e.kv_cache_dtype == "int8":
            cmd += ["--int8_kv_cache"]
        return cmd
    # int4_awq, w4a8_awq, int8_sq, int8_wo, int4_wo: ModelOpt's quantize.py names them the same way
    return [t.python, t.quantize, *common, "--qformat", e.quantization, "--calib_size", "512"]


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


def expected_ranks(engine_dir: Path) -> int:
    try:
        config = json.loads((engine_dir / "config.json").read_text())
        mapping = config["pretrained_config"]["mapping"]
        return int(mapping.get("world_size") or int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)))
    except (OSError, ValueError, KeyError, TypeError) as err:
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


class TrtllmBackend:
    name: ClassVar[str] = "trtllm"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tools = TrtllmTools.from_settings(settings)

    @staticmethod
    def tool_version(fingerprint: Fingerprint) -> str | None:
        return fingerprint.tensorrt_llm_version

    @staticmethod
    def compat_fields(fingerprint: Fingerprint) -> dict[str, Any]:
        return {
            "gpu_models": sorted({g.name for g in fingerprint.gpus}),
            "gpu_sm": sorted({g.sm for g in fingerprint.gpus}),
            "tensorrt": fingerprint.tensorrt_version,
            "tensorrt_llm": fingerprint.tensorrt_llm_version,
            "cuda_major": major(fingerprint.cuda_version),
            "driver_branch": major(fingerprint.driver_version),
        }

    @staticmethod
    def recognises(engine_dir: Path) -> bool:
        return (engine_dir / "config.json").is_file() and (engine_dir / "rank0.engine").is_file()

    @staticmethod
    def check_engine_spec(spec: EngineSpec) -> None:
        """trtllm-only rules of a profile's engine section."""
        if spec.aoti is not None:
            raise rule_error("aoti", "aoti-options-aoti-only", "aoti options apply to backend aoti only")

    def build(self, profile: BuildProfile, model_dir: Path, out_dir: Path, fingerprint: Fingerprint,
              log_path: Path, *, model_digest: str | None = None) -> BuildResult:
        e = profile.engine
        if len(fingerprint.gpus) < e.world_size:
            raise IncompatibleTargetError(f"{profile.name} needs {e.world_size} GPUs",
                                          {"gpu_count": (e.world_size, len(fingerprint.gpus))})
        uses_fp8 = e.quantization == "fp8" or e.kv_cache_dtype == "fp8"
        low = [g.sm for g in fingerprint.gpus if int(g.sm.replace(".", "")) < (e.min_sm or (FP8_MIN_SM if uses_fp8 else 0))]
        if low:
            raise IncompatibleTargetError(f"{profile.name} needs SM >= {e.min_sm or FP8_MIN_SM}",
                                          {"gpu_sm": (f">= {e.min_sm or FP8_MIN_SM}", sorted(set(low)))})
        out_dir = Path(out_dir)
        if out_dir.exists():
            raise EngineBuildError("trtllm", "error", f"output directory {out_dir} already exists")
        work = out_dir.parent / f".build-{uuid.uuid4().hex}"
        (work / "tmp").mkdir(parents=True)
        deadline = time.monotonic() + e.build_timeout_s
        env = dict(os.environ)
        env.update({"TMPDIR": str(work / "tmp"), "PYTHONUNBUFFERED": "1"})
        start = time.monotonic()
        try:
            run_step("trtllm", "checkpoint conversion", convert_command(profile, model_dir, work / "ckpt", self.tools),
                     log_path=log_path, timeout_s=max(1.0, deadline - time.monotonic()), env=env,
                     memory_limit_mb=e.build_memory_limit_mb)
            run_step("trtllm", "trtllm-build", build_command(profile, work / "ckpt", work / "engine", self.tools),
                     log_path=log_path, timeout_s=max(1.0, deadline - time.monotonic()), env=env,
                     memory_limit_mb=e.build_memory_limit_mb)
            problems = check_complete(work / "engine", e.world_size)
            if problems:
                from buildctl.engines.isolate import log_tail

                raise EngineBuildError("trtllm", "incomplete", "; ".join(problems), log_path=str(log_path),
                                       log_tail=log_tail(log_path))
            os.rename(work / "engine", out_dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
        return BuildResult(engine_dir=out_dir, files=files, log_path=log_path, wall_s=time.monotonic() - start,
                           tool_versions={"tensorrt_llm": fingerprint.tensorrt_llm_version,
                                          "tensorrt": fingerprint.tensorrt_version})

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
    """Greedy generation through ``tensorrt_llm.runtime.ModelRunner`` (GPU only; world size 1
    in-process, larger TP under ``mpirun -n <world_size>``). Top-k logprobs need an engine
    built with ``--gather_generation_logits``; without it only tokens are compared."""

    name = "trtllm"

    def __init__(self, engine_dir: Path) -> None:
        import tensorrt_llm
        from tensorrt_llm.runtime import ModelRunner

        self.torch = __import__("torch")
        self.runner: Any = ModelRunner.from_dir(engine_dir=str(engine_dir), rank=tensorrt_llm.mpi_rank())

    def _run(self, prompts: list[list[int]], max_tokens: int, streaming: bool, want_logits: bool) -> Any:
        torch = self.torch
        return self.runner.generate(
            batch_input_ids=[torch.tensor(p, dtype=torch.int32) for p in prompts], max_new_tokens=max_tokens,
            end_id=-1, pad_id=0, top_k=1, temperature=1.0, streaming=streaming, return_dict=True,
            output_generation_logits=want_logits,
        )

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        torch = self.torch
        out = self._run(prompts, max_tokens, False, bool(top_logprobs) and self.runner.gather_generation_logits)
        gens = []
        for i, p in enumerate(prompts):
            ids = out["output_ids"][i][0][len(p):len(p) + max_tokens].tolist()
            tops: list[dict[int, float]] = []
            logits = out.get("generation_logits")
            if logits is not None and top_logprobs:
                lp = torch.log_softmax(logits[i][0][:max_tokens].float(), dim=-1)
                vals, idx = torch.topk(lp, top_logprobs, dim=-1)
                for step, tok in enumerate(ids):
                    d = {int(t): float(v) for t, v in zip(idx[step].tolist(), vals[step].tolist())}
                    d.setdefault(int(tok), float(lp[step, tok]))
                    tops.append(d)
            gens.append(Generation(token_ids=[int(t) for t in ids], top_logprobs=tops))
        return gens

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """Waves of ``concurrency`` requests through ModelRunner's streaming generate."""
        clock = time.perf_counter
        for w in range(0, len(prompts), max(1, concurrency)):
            wave = prompts[w:w + max(1, concurrency)]
            t0 = clock()
            for i in range(len(wave)):
                yield TokenEvent(w + i, None, t0)
            seen = [0] * len(wave)
            for out in self._run(wave, max_tokens, True, False):
                now = clock()
                lengths = out.get("sequence_lengths")
                for i, p in enumerate(wave):
                    end = int(lengths[i][0]) if lengths is not None else None
                    ids = out["output_ids"][i][0][len(p):end].tolist()
                    while seen[i] < min(len(ids), max_tokens):
                        yield TokenEvent(w + i, int(ids[seen[i]]), now)
                        seen[i] += 1

    def close(self) -> None:
        self.runner = None
