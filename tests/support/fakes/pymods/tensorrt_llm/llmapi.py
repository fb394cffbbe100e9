"""Fake ``tensorrt_llm.LLM`` (the LLM API on the PyTorch backend), tests only. It keeps the start-up
state of the release it acts as (``FAKE_TRTLLM_VERSION``: 1.2.1 or 1.4.0rc1) the way the upstream
sources say the real one does:

* **Autotuner** (tensorrt_llm/_torch/autotuner.py; model_engine.py reads TLLM_AUTOTUNER_CACHE_PATH):
  - 1.2.1 (b35ac1b64368513d215c57d2ed01d62d910df8da): ``autotune(cache_path, rank)`` loads
    ``<stem>.rank<R>.json`` when it exists, logs ``[Autotuner] Loading cache from ...``, and still
    enters tuning mode unless ``cache_path`` itself exists (it never does: only rank files are
    written), so every start logs ``Autotuning process starts`` and profiles only the shapes the
    loaded cache misses; at the end it saves the rank file again. The file is
    ``{metadata: {lib_version, creation_timestamp, device_name, device_capability}, cache_data}``.
  - 1.4.0rc1 (a later autotuner.py: ``save_cache(file_path, rank)`` under ``fcntl.flock``): one file
    ``{metadata, rank_<R>: {...}}``; an existing file is loaded and not tuned again.
  - Both: loading **overwrites** the live metadata with the file's (``_deserialize_metadata``) and
    checks nothing, so a cache from another GPU loads silently (the gap buildctl closes).
* **JIT caches**: each variable of the release (1.4.0rc1 adds TRTLLM_DG_CACHE_DIR and the unified
  root TRTLLM_CACHE_DIR of tensorrt_llm/_bootstrap.py at fc4436a44e5af0e268b6d490467f8bdc34ee5930,
  which ``os.environ.setdefault``\\s every cache variable) gets kernels under a folder hashed from
  the release and the SM, as Triton and Inductor key theirs; a kernel already there is not compiled
  again. Triton's kernels carry a metadata JSON with ``target.arch``.
* Keyword arguments outside the fields buildctl's LLM-API YAML uses are refused (LlmArgs is a
  pydantic model that forbids extra fields).
* The GPU is ``FAKE_GPU_NAME`` / ``FAKE_GPU_SM`` (what torch.cuda would say; default an H100).
* Generation: greedy with logprobs. A checkpoint with weights (the tiny Llama) is run with
  transformers in float32 on CPU, so a validation against the vLLM reference compares real
  outputs; a checkpoint without weights (a bare config.json) gets a deterministic toy.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import tensorrt_llm

FIELDS = {"backend", "tokenizer", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_num_tokens",
          "max_seq_len", "enable_autotuner", "kv_cache_config", "cuda_graph_config"}
UNIFIED = {"TLLM_AUTOTUNER_CACHE_PATH": "autotuner/cache.json", "TORCHINDUCTOR_CACHE_DIR": "inductor",
           "TRITON_CACHE_DIR": "triton", "TORCH_EXTENSIONS_DIR": "torch_extensions",
           "FLASHINFER_WORKSPACE_BASE": "flashinfer", "CUTE_DSL_CACHE_DIR": "cute_dsl", "DG_JIT_CACHE_DIR": "deep_gemm",
           "TRTLLM_DG_CACHE_DIR": "trtllm_deep_gemm", "CUDA_CACHE_PATH": "cuda"}
JIT_1_2_1 = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE",
             "CUTE_DSL_CACHE_DIR", "DG_JIT_CACHE_DIR", "CUDA_CACHE_PATH")
JIT_1_4 = (*JIT_1_2_1, "TRTLLM_DG_CACHE_DIR")
OPS = ("trtllm::fp8_gemm", "trtllm::fused_qkv", "trtllm::attention")
COMPILE_S = float(os.environ.get("FAKE_TRTLLM_COMPILE_S", "0.01"))  # per JIT kernel (half per tuned entry)


def log(msg: str) -> None:
    print(f"[TRT-LLM] [I] {msg}", file=sys.stderr, flush=True)


def setup_unified_cache() -> None:
    root = os.environ.get("TRTLLM_CACHE_DIR")
    if root:
        for name, sub in UNIFIED.items():
            os.environ.setdefault(name, os.path.join(os.path.expanduser(root), sub))


def device() -> tuple[str, list[int]]:
    major, _, minor = os.environ.get("FAKE_GPU_SM", "9.0").partition(".")
    return os.environ.get("FAKE_GPU_NAME", "NVIDIA H100 80GB HBM3"), [int(major), int(minor or 0)]


class SamplingParams:
    def __init__(self, *, max_tokens: int, top_k: int | None = None, logprobs: int | None = None, **kw):
        if kw:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {sorted(kw)}")
        if top_k not in (None, 1):
            raise ValueError("fake: greedy decoding only (top_k 1)")
        self.max_tokens, self.logprobs = max_tokens, logprobs


class Logprob:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


class _Seq:
    def __init__(self, token_ids, logprobs):
        self.token_ids, self.logprobs = token_ids, logprobs


class _Result:
    def __init__(self, seq):
        self.outputs = [seq]


class LLM:
    def __init__(self, model: str, **kwargs) -> None:
        extra = set(kwargs) - FIELDS
        if extra:
            raise ValueError(f"1 validation error for TorchLlmArgs: extra fields not permitted: {sorted(extra)}")
        cfg = Path(model) / "config.json"
        if not cfg.is_file():
            raise FileNotFoundError(f"{cfg} not found")
        self.vocab = int(json.loads(cfg.read_text()).get("vocab_size", 256))
        self.hf = None
        if any(Path(model).glob("*.safetensors")) and (Path(model) / "model.safetensors").stat().st_size > 1024:
            import torch
            from transformers import AutoModelForCausalLM

            self.hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
        self.args = kwargs
        self.version = tensorrt_llm.__version__
        self.name, self.cap = device()
        log(f"TensorRT LLM version: {self.version}")
        self._jit()
        if kwargs.get("enable_autotuner", True):
            self._autotune(os.environ.get("TLLM_AUTOTUNER_CACHE_PATH"), rank=0)

    # -- the JIT caches --
    def _jit(self) -> None:
        for var in (JIT_1_2_1 if self.version == "1.2.1" else JIT_1_4):
            root = os.environ.get(var)
            if not root:
                continue
            h = hashlib.sha256(f"{var}|{self.version}|{self.cap}|{self.args.get('max_num_tokens')}".encode()).hexdigest()[:16]
            d = Path(root) / h
            for k in range(2):
                kernel = d / f"kernel_{k}.bin"
                if kernel.exists():
                    continue
                d.mkdir(parents=True, exist_ok=True)
                time.sleep(COMPILE_S)
                kernel.write_bytes(hashlib.sha256(f"{h}{k}".encode()).digest() * 8)
                if var == "TRITON_CACHE_DIR":
                    (d / f"kernel_{k}.json").write_text(json.dumps({"name": f"kernel_{k}", "target": {
                        "backend": "cuda", "arch": self.cap[0] * 10 + self.cap[1], "warp_size": 32}}))
                log(f"JIT compiled {kernel}")

    # -- the autotuner --
    def _buckets(self) -> list[int]:
        top, out, b = int(self.args.get("max_num_tokens") or 8), [], 1
        while b < top:
            out.append(b)
            b *= 2
        return out + [top]

    def _autotune(self, cache_path: str | None, rank: int) -> None:
        meta = {"lib_version": self.version, "creation_timestamp": time.time(), "device_name": self.name,
                "device_capability": self.cap}
        cache: dict[str, dict] = {}
        tune = True
        path = None
        if cache_path is not None:
            if self.version == "1.2.1":
                path = Path(os.path.splitext(cache_path)[0] + f".rank{rank}.json")
                tune = not os.path.exists(cache_path)
                if path.exists():
                    log(f"[Autotuner] Loading cache from {path}")
                    data = json.loads(path.read_text())
                    meta, cache = data["metadata"], dict(data["cache_data"])  # overwritten, never checked
            else:
                path = Path(cache_path)
                if path.exists():
                    log(f"[Autotuner] Loading cache from {path}")
                    data = json.loads(path.read_text())
                    meta, cache = data["metadata"], dict(data[f"rank_{rank}"])
                    tune = False
        if tune:
            log("[Autotuner] Autotuning process starts ...")
            for op in OPS:
                for m in self._buckets():
                    key = str((op, "Runner", 0, ((m, 4096),)))
                    if key not in cache:
                        time.sleep(COMPILE_S / 2)
                        cache[key] = {"runner_id": 0, "tactic": m % 5, "min_time": 0.01 * m}
            log("[Autotuner] Autotuning process ends")
        if path is not None:
            log(f"[Autotuner] Saving cache to {path}")
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.version == "1.2.1":
                path.write_text(json.dumps({"metadata": meta, "cache_data": cache}, indent=2))
            else:
                data = json.loads(path.read_text()) if path.exists() else {"metadata": meta}
                data[f"rank_{rank}"] = cache
                path.write_text(json.dumps(data, indent=2))

    # -- generation --
    def _step(self, seq: list[int]) -> tuple[int, list[float]]:
        tok = (31 * seq[-1] + 17 * len(seq) + 7) % self.vocab
        logits = [((i * 13 + len(seq)) % 7) / 10.0 for i in range(self.vocab)]
        logits[tok] = 12.0
        z = math.log(sum(math.exp(x) for x in logits))
        return tok, [x - z for x in logits]

    def _generate_hf(self, prompt: list[int], params: SamplingParams):
        import torch

        ids, past, toks, lps = torch.tensor([prompt]), None, [], []
        with torch.no_grad():
            for _ in range(params.max_tokens):
                out = self.hf(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                tok = int(torch.argmax(logp))
                toks.append(tok)
                if params.logprobs:
                    top = torch.topk(logp, params.logprobs)
                    lps.append({int(i): Logprob(float(v)) for v, i in zip(top.values, top.indices)})
                ids = torch.tensor([[tok]])
        return _Result(_Seq(toks, lps or None))

    def generate(self, prompts, sampling_params: SamplingParams):
        if self.hf is not None:
            return [self._generate_hf(list(p), sampling_params) for p in prompts]
        out = []
        for p in prompts:
            seq, toks, lps = list(p), [], []
            for _ in range(sampling_params.max_tokens):
                tok, logp = self._step(seq)
                seq.append(tok)
                toks.append(tok)
                if sampling_params.logprobs:
                    top = sorted(range(self.vocab), key=lambda i: -logp[i])[:sampling_params.logprobs]
                    lps.append({i: Logprob(logp[i]) for i in top})
            out.append(_Result(_Seq(toks, lps or None)))
        return out

    def shutdown(self) -> None:
        pass
