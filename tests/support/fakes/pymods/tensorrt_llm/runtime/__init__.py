"""Fake ``tensorrt_llm.runtime`` (tests only), behaving as ``tests/support/fixtures/trtllm/1.2.1/runtime.json``
(read from tensorrt_llm/runtime/model_runner_cpp.py) says the real one does:

* ``output_ids`` is (batch, 1, max_seq_len): the prompt, the generated tokens, then ``end_id``
  padding; while streaming, each yielded output holds the whole buffer so far;
* ``sequence_lengths`` only with ``output_sequence_lengths=True``;
* ``generation_logits`` only when the engine was built with ``gather_generation_logits`` or the
  call asks with ``output_generation_logits=True``;
* ``generate`` returns ``[]`` on a non-leader rank;
* a TP/PP engine loads only when the MPI world matches it, or in orchestrator mode;
* keywords outside the fixture's lists are a TypeError (the real ``generate`` swallows unknown
  ``**kwargs`` silently: stricter here, so a misspelt option fails a test instead of doing nothing);
* decoding is greedy only: ``top_k`` other than 1 (sampling) or a beam width other than 1 is a
  ValueError here (the real runtime would sample or search beams; buildctl's parity needs greedy);
* a sequence ends at the step that generates ``end_id`` (the end token is kept here; whether the
  real runtime counts it in ``sequence_lengths`` is not modelled: buildctl passes ``end_id=-1``,
  which no token equals, so its requests never end early, and a test checks that they do not).

``ModelRunner`` is the Python runner: every rank must run under MPI for a TP/PP engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tensorrt_llm import mpi_rank, mpi_world_size
from tensorrt_llm.bindings.executor import Executor

_FIXTURE = json.loads((Path(__file__).resolve().parents[4] / "fixtures" / "trtllm" / "1.2.1" / "runtime.json").read_text())
FROM_DIR = set(_FIXTURE["from_dir"]["keywords"])
GENERATE = set(_FIXTURE["generate"]["keywords"]) | set(_FIXTURE["generate"]["sampling_kwargs"])
LOADED: list[dict] = []  # from_dir calls seen, for tests


def toy_model(vocab: int):
    """Deterministic greedy toy: the next token and the logits row it is the argmax of."""

    def step(seq: list[int]) -> tuple[int, torch.Tensor]:
        tok = (31 * seq[-1] + 17 * len(seq) + 7) % vocab
        logits = torch.tensor([((i * 13 + len(seq)) % 7) / 10.0 for i in range(vocab)])
        logits[tok] = 12.0
        return tok, logits

    return step


def _check(kind: str, allowed: set[str], kwargs: dict) -> None:
    unknown = set(kwargs) - allowed
    if unknown:
        raise TypeError(f"{kind}() got unexpected keyword argument(s) {sorted(unknown)}")


class ModelRunnerCpp:
    def __init__(self, config: dict, leader: bool, gather_generation_logits: bool = False) -> None:
        build = config["build_config"]
        self.max_batch_size = int(build["max_batch_size"])
        self.max_seq_len = int(build["max_seq_len"])
        self.gather_generation_logits = bool(build.get("gather_generation_logits"))  # the engine's (model config)
        self.model = toy_model(int(config["pretrained_config"].get("vocab_size", 1024)))
        # ExecutorConfig(gather_generation_logits=...) from from_dir's keyword, or the engine's flag
        self.executor = Executor(self.model, leader, self.max_batch_size,
                                 gather_generation_logits or self.gather_generation_logits)

    @classmethod
    def from_dir(cls, engine_dir: str, **kwargs) -> "ModelRunnerCpp":
        _check("from_dir", FROM_DIR, kwargs)
        config = json.loads((Path(engine_dir) / "config.json").read_text())
        world = int(config["pretrained_config"]["mapping"]["world_size"])
        LOADED.append({"engine_dir": engine_dir, **kwargs})
        if kwargs.get("is_orchestrator_mode"):
            if mpi_world_size() != 1:
                raise RuntimeError("orchestrator mode needs an MPI world size of 1")
            if world > 1 and len(kwargs.get("device_ids") or []) != world:
                raise RuntimeError(f"orchestrator mode needs device_ids for all {world} ranks")
            return cls(config, leader=True, gather_generation_logits=bool(kwargs.get("gather_generation_logits")))
        if mpi_world_size() != world:
            raise RuntimeError(f"[TensorRT-LLM][ERROR] MPI world size {mpi_world_size()} does not match the engine's "
                               f"tp*pp = {world}")
        if kwargs.get("rank", 0) != mpi_rank():
            raise AssertionError("rank == world_config.rank")
        return cls(config, leader=mpi_rank() == 0, gather_generation_logits=bool(kwargs.get("gather_generation_logits")))

    def generate(self, batch_input_ids, **kwargs):
        _check("generate", GENERATE, kwargs)
        if not self.executor.can_enqueue_requests():
            return []
        if kwargs.get("top_k") != 1:  # stricter than the real runtime, which would sample
            raise ValueError(f"the fake runtime decodes greedily only (top_k=1), got top_k={kwargs.get('top_k')!r}")
        prompts = [t.tolist() for t in batch_input_ids]
        if len(prompts) > self.max_batch_size:
            raise RuntimeError(f"Input batch size ({len(prompts)}) exceeds the engine or specified limit ({self.max_batch_size})")
        n = int(kwargs.get("max_new_tokens", 1))
        if max(map(len, prompts)) + n > self.max_seq_len:
            raise RuntimeError("Maximum input length + maximum new tokens exceeds the engine limit")
        end_id = kwargs.get("end_id")
        want_logits = self.gather_generation_logits or bool(kwargs.get("output_generation_logits"))
        if want_logits and not self.executor.gather_generation_logits:  # the executor's error response, raised
            from tensorrt_llm.bindings.executor import GATHER_ERROR

            raise RuntimeError(GATHER_ERROR)
        if kwargs.get("streaming"):
            return self._stream(prompts, n, end_id, want_logits, kwargs)
        seqs, logits = [], []
        for p in prompts:
            seq, rows = list(p), []
            for _ in range(n):
                tok, row = self.model(seq)
                seq.append(tok)
                rows.append(row)
                if tok == end_id:
                    break
            seqs.append(seq)
            logits.append(torch.stack(rows + [rows[-1]] * (n - len(rows))))
        return self._output(seqs, end_id, kwargs, torch.stack(logits)[:, None] if want_logits else None)

    def _stream(self, prompts, n, end_id, want_logits, kwargs):
        seqs = [list(p) for p in prompts]
        ended = [False] * len(seqs)
        for _ in range(n):
            rows = []
            for k, seq in enumerate(seqs):
                tok, row = self.model(seq)
                if not ended[k]:
                    seq.append(tok)
                    ended[k] = tok == end_id
                rows.append(row)
            yield self._output(seqs, end_id, kwargs, torch.stack(rows)[:, None, None] if want_logits else None)

    def _output(self, seqs, end_id, kwargs, logits):
        pad = -1 if end_id is None else end_id
        ids = torch.tensor([[s + [pad] * (self.max_seq_len - len(s))] for s in seqs], dtype=torch.int32)
        if not kwargs.get("return_dict"):
            return ids
        out = {"output_ids": ids}
        if kwargs.get("output_sequence_lengths"):
            out["sequence_lengths"] = torch.tensor([[len(s)] for s in seqs], dtype=torch.int32)
        if logits is not None:
            out["generation_logits"] = logits
        return out


class ModelRunner(ModelRunnerCpp):
    """The Python session runner: no orchestrator mode; a TP/PP engine needs every rank under MPI."""

    @classmethod
    def from_dir(cls, engine_dir: str, **kwargs) -> "ModelRunner":
        if kwargs.pop("is_orchestrator_mode", False):
            raise TypeError("ModelRunner.from_dir() has no is_orchestrator_mode")
        return super().from_dir(engine_dir, **kwargs)
