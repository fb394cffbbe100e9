"""The trtllm-torch backend's child process: TensorRT-LLM's LLM API started from a bundle directory,
in the interpreter that has TensorRT-LLM (``trtllm_python``), with the bundle as working directory
(the model is the relative path ``model``) and the cache variables the parent sets.

``python -m buildctl.engines.trtllm_torch.child warm SPEC RESULT``
    The build's warm-up run: start the LLM (the autotuner tunes and saves TLLM_AUTOTUNER_CACHE_PATH,
    the JIT caches fill), generate over every warm-up shape, write RESULT and shut down.

``python -m buildctl.engines.trtllm_torch.child serve SPEC``
    Serve the parent over stdin/stdout, one JSON object per line: ``{"ready": ...}`` first, then
    ``{"op": "generate", ...}`` and ``{"op": "close"}`` are answered. TensorRT-LLM's own log goes to
    stderr (the parent's log file, which the proof of use reads).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _start(llm_args: dict[str, Any]) -> tuple[Any, float]:
    from tensorrt_llm import LLM

    t0 = time.perf_counter()
    llm = LLM(model="model", tokenizer="model", **llm_args)
    return llm, time.perf_counter() - t0


def _generate(llm: Any, prompts: list[list[int]], max_tokens: int, top_logprobs: int) -> list[dict[str, Any]]:
    from tensorrt_llm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, top_k=1, logprobs=top_logprobs or None)
    out = []
    for result in llm.generate(prompts, sampling_params=params):
        seq = result.outputs[0]
        steps = [sorted(((int(t), float(getattr(lp, "logprob", lp))) for t, lp in step.items()), key=lambda p: -p[1])
                 for step in (seq.logprobs or [])]
        out.append({"token_ids": [int(t) for t in seq.token_ids], "top_logprobs": steps})
    return out


def warm(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    llm, startup = _start(spec["llm_args"])
    try:
        for batch, length in spec["warmup"]:
            _generate(llm, [[1 + (i + j) % 7 for j in range(length)] for i in range(batch)], 4, 0)
    finally:
        llm.shutdown()
    Path(result_path).write_text(json.dumps({"startup_s": round(startup, 3), "warmup": spec["warmup"]}))
    return 0


def serve(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = sys.stdout

    def send(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        llm, startup = _start(spec["llm_args"])
    except Exception as err:  # the parent reports it, with the log tail
        send({"error": f"{type(err).__name__}: {err}"})
        return 1
    send({"ready": True, "startup_s": round(startup, 3)})
    try:
        for line in sys.stdin:
            req = json.loads(line)
            if req.get("op") == "close":
                return 0
            try:
                send({"generations": _generate(llm, req["prompts"], int(req["max_tokens"]), int(req["top_logprobs"]))})
            except Exception as err:
                send({"error": f"{type(err).__name__}: {err}"})
    finally:
        llm.shutdown()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "warm":
        return warm(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "serve":
        return serve(argv[1])
    print("usage: python -m buildctl.engines.trtllm_torch.child warm SPEC RESULT | serve SPEC", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
