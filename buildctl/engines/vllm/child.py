"""The vllm backend's child process: one vLLM engine started from a bundle directory.

vLLM keeps per-process global state, so a bundle's engine never shares a process with another
vLLM (the validation reference runs in the validator's process). The parent
(:mod:`buildctl.engines.vllm.bundle`) starts this module with the bundle directory as its
working directory (the model is the relative path ``model``, so vLLM's cache hash holds no
absolute path) and the environment the bundle needs (cache roots, ISA, offline).

``python -m buildctl.engines.vllm.child warm SPEC RESULT``
    The build's compile run: start vLLM compiled, generate over every warm-up shape in SPEC, write
    RESULT (start time, the hash directory vLLM chose, the hashed environment) and shut down.

``python -m buildctl.engines.vllm.child serve SPEC``
    Serve the parent over stdin/stdout, one JSON object per line. The first line out is
    ``{"ready": ...}`` (or ``{"error": ...}``); then each request ``{"op": "generate", ...}``,
    ``{"op": "stream", ...}``, ``{"op": "requests", ...}`` (requests joining and leaving
    mid-run: the staggered parity set), ``{"op": "threads", "n": N}`` (intra-op threads, as the validator
    sets its own for the paired speed gate) or ``{"op": "close"}`` is answered. Stream events are stamped here
    with ``time.perf_counter()`` (CLOCK_MONOTONIC: the parent's clock too), so the pipe's delay
    is not in TTFT. vLLM's own output goes to stderr (the parent's log file); stdout carries the
    protocol only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from buildctl.engines.vllm.runtime import VllmEngine, hashed_environment


def _cache_dir(engine: VllmEngine) -> str | None:
    """The compile-cache directory vLLM chose for this start (its hash directory), if it says."""
    try:
        cfg = engine._engine.vllm_config.compilation_config
    except AttributeError:
        return None
    return str(getattr(cfg, "cache_dir", "") or getattr(cfg, "local_cache_dir", "") or "") or None


def _start(spec: dict[str, Any]) -> VllmEngine:
    return VllmEngine(spec["engine_args"], {}, cpu=bool(spec.get("cpu", True)))


def warm(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    engine = _start(spec)
    try:
        shapes = []
        for batch, length in spec.get("warmup", []):
            t0 = time.monotonic()
            engine.generate([[1 + (i + j) % 97 for j in range(length)] for i in range(batch)], 2, 0)
            shapes.append({"batch": batch, "prompt_len": length, "s": round(time.monotonic() - t0, 3)})
        Path(result_path).write_text(json.dumps({
            "startup_s": round(engine.startup_s, 3), "cache_dir": _cache_dir(engine),
            "hashed_env": hashed_environment(), "vllm": engine.version, "warmup": shapes}))
    finally:
        engine.close()
    return 0


def _send(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def serve(spec_path: str) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed (vLLM, tqdm) goes to the log, never into the protocol
    spec = json.loads(Path(spec_path).read_text())
    try:
        engine = _start(spec)
    except Exception as err:
        _send(proto, {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"})
        return 3
    _send(proto, {"ready": True, "startup_s": round(engine.startup_s, 3), "cache_dir": _cache_dir(engine),
                  "vllm": engine.version, "hashed_env": hashed_environment()})
    try:
        for line in sys.stdin:
            req = json.loads(line)
            op = req.get("op")
            if op == "close":
                break
            if op == "threads":
                from buildctl.engines.threads import set_intra_op_threads

                set_intra_op_threads(int(req["n"]))
                _send(proto, {"threads": int(req["n"])})
            elif op == "generate":
                gens = engine.generate(req["prompts"], req["max_tokens"], req["top_logprobs"])
                _send(proto, {"generations": [{"token_ids": g.token_ids,
                                               "top_logprobs": [[[t, lp] for t, lp in step.items()] for step in g.top_logprobs]}
                                              for g in gens]})
            elif op == "requests":
                from buildctl.engines.batching import Request

                reqs = [Request(r["prompt"], r["max_tokens"], r["arrival"]) for r in req["requests"]]
                gens = engine.generate_requests(reqs, req["top_logprobs"], req["concurrency"])
                _send(proto, {"generations": [{"token_ids": g.token_ids,
                                               "top_logprobs": [[[t, lp] for t, lp in step.items()] for step in g.top_logprobs]}
                                              for g in gens]})
            elif op == "stream":
                for ev in engine.stream(req["prompts"], req["max_tokens"], req["concurrency"]):
                    _send(proto, {"e": [ev.index, ev.token_id, ev.time]})
                _send(proto, {"done": True})
            else:
                _send(proto, {"error": f"unknown op {op!r}"})
    finally:
        engine.close()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "warm":
        return warm(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "serve":
        return serve(argv[1])
    print("usage: python -m buildctl.engines.vllm.child warm SPEC RESULT | serve SPEC", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
