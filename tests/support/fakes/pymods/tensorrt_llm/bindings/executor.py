"""Fake ``tensorrt_llm.bindings.executor``: Request, SamplingConfig, OutputConfig, and an executor
that batches in flight and answers one request's step per ``await_responses()``, round robin.

Constructors take only the keywords the runtime fixture lists (a misspelt keyword is a TypeError
here, where pybind11 would raise one too). As the fixture's ``executor.generation_logits`` says
(``tensorrt_llm/runtime/model_runner_cpp.py`` ``_fill_output`` and
``cpp/tensorrt_llm/executor/executorImpl.cpp``, commits in the fixture):

* ``result.generation_logits`` is ``[tokens, num_sequences, vocab]`` in a streamed response (one
  token per response here) and ``[num_sequences, tokens, vocab]`` in a final non-streamed one;
* a request with ``OutputConfig(return_generation_logits=True)`` on an executor whose config did
  not enable ``gather_generation_logits`` fails ("To return generation logits,
  gather_generation_logits must be enabled in ExecutorConfig"), as an error response here. The
  engine's own ``gather_generation_logits`` build flag is accepted instead (whether the real
  executor accepts it is not read from the sources: lenient there)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

_FIXTURE = json.loads((Path(__file__).resolve().parents[4] / "fixtures" / "trtllm" / "1.2.1" / "runtime.json").read_text())
REQUEST_KEYWORDS = set(_FIXTURE["executor"]["request_keywords_used"])
GATHER_ERROR = _FIXTURE["executor"]["generation_logits"]["without_gather"]
OUTPUT_CONFIG_KEYWORDS = set(_FIXTURE["executor"]["output_config_keywords"])


def _only(kind: str, allowed: set[str], kwargs: dict) -> None:
    unknown = set(kwargs) - allowed
    if unknown:
        raise TypeError(f"{kind}(): unexpected keyword argument(s) {sorted(unknown)}")


class SamplingConfig:
    def __init__(self, beam_width: int = 1, top_k: int | None = None, **kwargs) -> None:
        self.beam_width, self.top_k = beam_width, top_k


class OutputConfig:
    def __init__(self, **kwargs) -> None:
        _only("OutputConfig", OUTPUT_CONFIG_KEYWORDS, kwargs)
        self.return_generation_logits = bool(kwargs.get("return_generation_logits"))


class Request:
    def __init__(self, **kwargs) -> None:
        _only("Request", REQUEST_KEYWORDS, kwargs)
        self.input_token_ids = list(kwargs["input_token_ids"])
        self.max_tokens = int(kwargs["max_tokens"])
        self.end_id = kwargs.get("end_id")  # the request ends at the step that generates it
        self.streaming = bool(kwargs.get("streaming", False))
        self.output_config = kwargs.get("output_config") or OutputConfig()
        sampling = kwargs.get("sampling_config")
        if sampling is None or sampling.beam_width != 1 or sampling.top_k != 1:  # stricter: real ones sample
            raise ValueError("the fake executor decodes greedily only: SamplingConfig(beam_width=1, top_k=1)")


@dataclass
class Result:
    is_final: bool
    output_token_ids: list[list[int]]
    sequence_index: int = 0
    generation_logits: object = None


@dataclass
class Response:
    request_id: int
    result: Result
    error_msg: str = ""

    def has_error(self) -> bool:
        return bool(self.error_msg)


@dataclass
class _Live:
    request: Request
    tokens: list[int] = field(default_factory=list)
    logits: list = field(default_factory=list)


class Executor:
    """In-flight batching over a deterministic toy model (``model``: tokens -> next token, logits)."""

    def __init__(self, model, leader: bool, max_batch_size: int, gather_generation_logits: bool = False) -> None:
        self.model, self.leader, self.max_batch_size = model, leader, max_batch_size
        self.gather_generation_logits = gather_generation_logits
        self.live: dict[int, _Live] = {}
        self.next_id = 1
        self.turn = 0
        self.enqueued: list[int] = []

    def can_enqueue_requests(self) -> bool:
        return self.leader

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        if not self.leader:
            raise RuntimeError("only the leader rank can enqueue requests")
        ids = []
        for r in requests:
            if len(self.live) >= self.max_batch_size:
                raise RuntimeError(f"more requests in flight than max_batch_size {self.max_batch_size}")
            self.live[self.next_id] = _Live(r)
            self.enqueued.append(self.next_id)
            ids.append(self.next_id)
            self.next_id += 1
        return ids

    def await_responses(self) -> list[Response]:
        """One decoding step of one in-flight request (round robin), as a streamed response."""
        if not self.live:
            raise RuntimeError("await_responses() with nothing in flight would block forever")
        rids = sorted(self.live)
        rid = rids[self.turn % len(rids)]
        self.turn += 1
        live = self.live[rid]
        want_logits = live.request.output_config.return_generation_logits
        if want_logits and not self.gather_generation_logits:
            del self.live[rid]
            return [Response(rid, Result(True, [[]]), error_msg=GATHER_ERROR)]
        tok, logits = self.model(live.request.input_token_ids + live.tokens)
        live.tokens.append(tok)
        live.logits.append(logits)
        final = len(live.tokens) >= live.request.max_tokens or tok == live.request.end_id
        if final:
            del self.live[rid]
        if not live.request.streaming and not final:
            return self.await_responses()
        if live.request.streaming:  # the new token; logits [tokens, num_sequences, vocab]
            new, gen = [tok], logits[None, None, :]
        else:  # the prompt and the generated tokens (exclude_input_from_output is off); logits [num_sequences, tokens, vocab]
            new, gen = live.request.input_token_ids + live.tokens, torch.stack(live.logits)[None]
        return [Response(rid, Result(final, [new], 0, gen if want_logits else None))]
