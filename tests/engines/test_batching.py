"""buildctl.engines.batching: in-flight batching over a runner-owned, compacted KV cache.

A fake model whose next token is a position-weighted sum of every token before it, read back
from the cache, makes any cache mix-up (a slot moved wrong, a stale position attended) change
the output. The real tiny Llama's two graphs then meet Hugging Face's full recompute."""

from __future__ import annotations

import random

import pytest
import torch

from buildctl.engines.batching import ContinuousBatcher, Request
from buildctl.engines.errors import GenerationRequestError

V = 97


class SumModel:
    """Next token = sum over positions t of (t + 1) * token_t, mod V, from the cache's keys."""

    layers, kv_heads, head_dim = 1, 1, 1

    def __init__(self) -> None:
        self.decode_batches: list[int] = []

    @staticmethod
    def _logprobs(targets: torch.Tensor) -> torch.Tensor:
        return -(torch.arange(V).unsqueeze(0) - targets.unsqueeze(1)).abs().float()

    def prefill(self, ids, last):
        n, s = ids.shape
        weights = torch.arange(1, s + 1).unsqueeze(0) * (torch.arange(s).unsqueeze(0) <= last.unsqueeze(1))
        kv = ids.float().view(1, 1, n, 1, s, 1).expand(1, 2, n, 1, s, 1).clone()
        return self._logprobs((ids * weights).sum(1) % V), kv

    def decode(self, tokens, positions, mask, cache):
        self.decode_batches.append(tokens.shape[0])
        keys = cache[0, 0, :, 0, :, 0]  # [B, T]
        t = torch.arange(keys.shape[1]).unsqueeze(0)
        past = ((t + 1) * keys * (mask == 0)).sum(1).round().long()
        nxt = (past + (positions + 1) * tokens) % V
        new = tokens.float().view(1, 1, -1, 1, 1).expand(1, 2, -1, 1, 1).clone()
        return self._logprobs(nxt), new


def solo(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        tok = sum((i + 1) * x for i, x in enumerate(seq)) % V
        out.append(tok)
        seq.append(tok)
    return out


def staggered(rng: random.Random, count: int, max_seq: int, max_arrival: int = 12) -> list[Request]:
    reqs = []
    for _ in range(count):
        length = rng.randint(1, max_seq // 2)
        reqs.append(Request([rng.randrange(V) for _ in range(length)], rng.randint(1, max_seq - length),
                            arrival=rng.randint(0, max_arrival)))
    return reqs


@pytest.mark.parametrize("concurrency", [5, 17])
def test_staggered_requests_join_and_leave_and_each_equals_its_solo_output(concurrency):
    """Different lengths and max_tokens (many of 1: done right after prefill), arrivals mid-run."""
    rng = random.Random(concurrency)
    for _ in range(20):
        reqs = staggered(rng, 48, 64)
        for r in reqs[::5]:
            object.__setattr__(r, "max_tokens", 1)
        model = SumModel()
        out = ContinuousBatcher(model, max_batch=concurrency, max_seq=64, prefill_tokens=48).run(reqs)
        assert [g.token_ids for g in out] == [solo(r.prompt, r.max_tokens) for r in reqs]
        assert max(model.decode_batches) <= concurrency


def test_the_edge_cases_of_the_cache():
    max_seq = 32
    reqs = [
        Request([7], 5),  # a 1-token prompt
        Request(list(range(1, 28)), 5),  # the longest prompt that leaves room for 5 tokens
        Request([3, 4], max_seq - 2),  # generation up to max_seq_len
        Request([9, 9, 9], 1),  # ends right after its prefill, with others live
        *[Request([i % V, (i * 7) % V], 3 + i % 4) for i in range(12)],  # more requests than slots
    ]
    model = SumModel()
    out = ContinuousBatcher(model, max_batch=4, max_seq=max_seq).run(reqs, top_logprobs=3)
    assert [g.token_ids for g in out] == [solo(r.prompt, r.max_tokens) for r in reqs]
    assert all(len(g.top_logprobs) == r.max_tokens and all(len(d) == 3 for d in g.top_logprobs)
               for g, r in zip(out, reqs))
    assert max(model.decode_batches) <= 4


def test_a_request_that_does_not_fit_is_refused_before_anything_runs():
    b = ContinuousBatcher(SumModel(), max_batch=2, max_seq=8)
    for bad in (Request([], 1), Request([1, 2], 0), Request([1] * 6, 3)):
        with pytest.raises(GenerationRequestError):
            b.run([Request([1], 1), bad])


def test_concurrency_keeps_that_many_in_flight_and_the_next_arrives_when_one_leaves():
    events: list[tuple[int, int | None]] = []
    reqs = [Request([i + 1], 2 + i % 3) for i in range(10)]
    out = ContinuousBatcher(SumModel(), max_batch=8, max_seq=16).run(
        reqs, concurrency=3, on_event=lambda i, tok, t: events.append((i, tok)))
    assert [g.token_ids for g in out] == [solo(r.prompt, r.max_tokens) for r in reqs]
    produced = [0] * len(reqs)
    flying = most = 0
    for i, tok in events:
        if tok is None:
            flying += 1
            most = max(most, flying)
        else:
            produced[i] += 1
            flying -= produced[i] == reqs[i].max_tokens
    assert most == 3
    assert [i for i, tok in events if tok is None] == list(range(10))  # arrivals in order


def test_the_cache_is_sized_from_the_profile():
    assert ContinuousBatcher.cache_bytes(2, 2, 32, 32, 256) == 2 * 2 * 32 * 2 * 256 * 32 * 4
    b = ContinuousBatcher(SumModel(), max_batch=3, max_seq=10)
    assert tuple(b.cache.shape) == (1, 2, 3, 1, 10, 1)


@pytest.fixture(scope="module")
def llama():
    from buildctl.steps import profiles
    from buildctl.engines.aoti.kv_llama import EagerKVModel
    from buildctl.engines.profile import load_profile

    from ..support.helpers import PROFILES, settings

    model_dir = profiles.resolve_model(settings(), load_profile(PROFILES / "tiny-llama-cpu.yaml"))
    return model_dir, EagerKVModel(str(model_dir))


def test_the_llama_graphs_meet_hugging_faces_full_recompute_on_a_staggered_set(llama):
    from transformers import AutoModelForCausalLM

    model_dir, kv = llama
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(3)
    reqs = [Request([rng.randrange(4, 1024) for _ in range(rng.randint(1, 40))], rng.randint(1, 16),
                    arrival=rng.randint(0, 8)) for _ in range(16)]
    out = ContinuousBatcher(kv, max_batch=5, max_seq=128, prefill_tokens=64).run(reqs, top_logprobs=5)
    worst = 0.0
    with torch.no_grad():
        for r, g in zip(reqs, out):
            ids = torch.tensor([r.prompt])
            for step in range(r.max_tokens):
                lp = torch.log_softmax(hf(input_ids=ids, use_cache=False).logits[0, -1].float(), -1)
                assert g.token_ids[step] == int(lp.argmax()), (r, step)
                worst = max([worst] + [abs(float(lp[t]) - v) for t, v in g.top_logprobs[step].items()])
                ids = torch.cat([ids, torch.tensor([[g.token_ids[step]]])], 1)
    assert worst <= 1e-4, worst


def test_an_unsupported_architecture_is_named():
    from buildctl.engines.aoti.kv_llama import check_supported

    assert check_supported({"architectures": ["LlamaForCausalLM"], "hidden_act": "silu"}) == []
    problems = check_supported({"architectures": ["MistralForCausalLM"], "rope_scaling": {"rope_type": "yarn"},
                                "attention_bias": True})
    assert problems == ["architecture MistralForCausalLM is not one of LlamaForCausalLM",
                        "rope scaling 'yarn' is not supported", "attention_bias is not supported"]


def test_the_aoti_build_refuses_another_architecture_before_compiling(tmp_path, monkeypatch):
    import json

    from buildctl.engines.aoti.backend import AotiBackend
    from buildctl.engines.errors import EngineBuildError
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile

    from ..support.helpers import PROFILES, settings

    def no_step(*a, **k):
        raise AssertionError("the compile step ran")

    monkeypatch.setattr("buildctl.engines.aoti.backend.run_step", no_step)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "hidden_act": "gelu_new"}))
    with pytest.raises(EngineBuildError) as exc:
        AotiBackend(settings()).build(load_profile(PROFILES / "tiny-llama-cpu.yaml"), model, tmp_path / "out", detect(),
                                      tmp_path / "build.log")
    assert str(exc.value).endswith("aoti builds Llama-family checkpoints only: architecture GPT2LMHeadModel is not one "
                                   "of LlamaForCausalLM; hidden_act 'gelu_new' is not supported")
