"""In-flight (continuous) batching over a KV cache that the runner owns.

The model is two functions (:class:`KVModel`): ``prefill`` runs whole prompts and returns the
next token's log-probabilities and every position's keys and values; ``decode`` runs one new
token per live request against the cache and returns its log-probabilities and its own key and
value. :class:`ContinuousBatcher` schedules requests over them the way serving engines do
(vLLM's scheduler, TensorRT-LLM's in-flight batching):

* each step first **admits** waiting requests into free cache slots, within a prefill token
  budget, and prefills them together (that yields each one's first token);
* then runs **one decode step for every live request**;
* a request **leaves** as soon as it has its tokens, even right after its prefill, and a waiting
  one takes its slot at the next step.

**Compacted slots.** Live requests occupy slots ``0..B-1`` of the cache
``[layers, 2, max_batch, kv_heads, max_seq, head_dim]``, so a decode step reads the slice
``[:, :, :B, :, :T]`` (``T`` the longest live length) instead of gathering rows. When a request
leaves, the request in the last live slot moves into its hole. Slots are freed from the highest
index down, so the slot that moves in is always one that stays. A decode step's new keys and
values are written with one index assignment at each slot's own position.

The cache's positions past a request's length may hold stale values (a right-padded prefill, a
previous occupant): the decode mask (``0`` before the request's length, ``-inf`` from it on)
keeps them out of attention, and the next token's key overwrites them.

Requests arrive at decode steps (``Request.arrival``), so a test can make them join and leave
mid-run deterministically; with ``concurrency``, at most that many are in flight and the next
one arrives when one finishes (a closed-loop client, as ``vllm bench serve --max-concurrency``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

from buildctl.engines.backend import Generation
from buildctl.engines.errors import GenerationRequestError

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Request:
    """One generation request: greedy, exactly ``max_tokens`` new tokens (end-of-sequence is not a
    stop, as with vLLM's ``ignore_eos``), admitted no earlier than decode step ``arrival``."""

    prompt: list[int]
    max_tokens: int
    arrival: int = 0


class KVModel(Protocol):
    """The two graphs of a KV-cache engine (eager modules or AOTInductor packages)."""

    layers: int
    kv_heads: int
    head_dim: int

    def prefill(self, ids: Any, last: Any) -> tuple[Any, Any]:
        """``ids`` [n, S] right-padded, ``last`` [n] each row's last prompt position: the next
        token's log-probabilities [n, V] and the keys and values [layers, 2, n, kv_heads, S, head_dim]."""
        ...

    def decode(self, tokens: Any, positions: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        """``tokens``/``positions`` [B], ``mask`` [B, T] additive, ``cache`` [layers, 2, B, kv_heads, T, head_dim]:
        log-probabilities [B, V] and the new token's keys and values [layers, 2, B, kv_heads, head_dim]."""
        ...


EventFn = Callable[[int, "int | None", float], None]


class ContinuousBatcher:
    """Greedy generation with in-flight batching over a runner-owned KV cache (see the module)."""

    def __init__(self, model: KVModel, *, max_batch: int, max_seq: int, prefill_tokens: int | None = None) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.max_batch = max_batch
        self.max_seq = max_seq
        self.prefill_tokens = prefill_tokens or max_seq
        self.cache = torch.zeros((model.layers, 2, max_batch, model.kv_heads, max_seq, model.head_dim),
                                 dtype=torch.float32)

    @staticmethod
    def cache_bytes(layers: int, kv_heads: int, head_dim: int, max_batch: int, max_seq: int, itemsize: int = 4) -> int:
        """The cache's size: keys and values of every layer, slot and position."""
        return layers * 2 * max_batch * kv_heads * max_seq * head_dim * itemsize

    def check(self, requests: list[Request]) -> None:
        for r in requests:
            if len(r.prompt) < 1 or r.max_tokens < 1 or len(r.prompt) + r.max_tokens > self.max_seq:
                raise GenerationRequestError(f"prompt of {len(r.prompt)} tokens + {r.max_tokens} new tokens does not "
                                             f"fit max_seq_len {self.max_seq}")

    def run(self, requests: list[Request], top_logprobs: int = 0, *, concurrency: int | None = None,
            on_event: EventFn | None = None) -> list[Generation]:
        """Generate every request; ``on_event(index, token_or_None, perf_counter)`` sees each
        arrival (``None``) and each token as it is produced."""
        out = [Generation(token_ids=[], top_logprobs=[]) for _ in requests]
        for event in self.events(requests, out, top_logprobs, concurrency=concurrency):
            if on_event is not None:
                on_event(*event)
        return out

    def events(self, requests: list[Request], out: list[Generation], top_logprobs: int = 0, *,
               concurrency: int | None = None) -> Iterator[tuple[int, int | None, float]]:
        """Generate every request into ``out`` (one empty :class:`Generation` each), yielding
        ``(index, token_or_None, perf_counter)`` for each arrival and token, stamped when it
        happened, after each step: a consumer that pauses pauses the engine (as a slow client does)."""
        torch = self.torch
        self.check(requests)
        clock = time.perf_counter
        limit = min(self.max_batch, concurrency or self.max_batch)
        happened: list[tuple[int, int | None, float]] = []
        on_event = happened.append
        waiting = deque(sorted(range(len(requests)), key=lambda i: (requests[i].arrival, i)))
        arrived: set[int] = set()  # arrived, not yet admitted
        flight = [0]  # arrived and not finished
        live: list[int] = []  # request index in each occupied slot, slots 0..len(live)-1
        pos: list[int] = []  # the position the slot's next token goes to (= its length so far)
        last: list[int] = []  # the slot's last token
        step = 0

        def arrive() -> None:  # closed loop: a request arrives when there is room in flight for it
            now = clock()
            for i in waiting:
                if requests[i].arrival > step or flight[0] >= limit:
                    break
                if i not in arrived:
                    arrived.add(i)
                    flight[0] += 1
                    on_event((i, None, now))

        def emit(indices: list[int], logprobs: Any) -> list[int]:
            """Take each row's greedy token (and top-k), one batched call for all rows."""
            toks = torch.argmax(logprobs, dim=-1).tolist()
            tops: list[dict[int, float]] = []
            if top_logprobs:
                vals, idx = torch.topk(logprobs, top_logprobs, dim=-1)
                chosen = logprobs.gather(1, torch.tensor(toks).unsqueeze(1)).squeeze(1).tolist()
                for t, v, tok, c in zip(idx.tolist(), vals.tolist(), toks, chosen):
                    d = dict(zip(t, v))
                    d.setdefault(tok, c)
                    tops.append(d)
            now = clock()
            for row, i in enumerate(indices):
                out[i].token_ids.append(toks[row])
                if top_logprobs:
                    out[i].top_logprobs.append(tops[row])
                on_event((i, toks[row], now))
            return toks

        def leave() -> None:
            """Free the slots of finished requests, highest first: the last live slot moves into each hole."""
            finished = [s for s, i in enumerate(live) if len(out[i].token_ids) == requests[i].max_tokens]
            for s in sorted(finished, reverse=True):
                e = len(live) - 1
                if s != e:
                    self.cache[:, :, s, :, :pos[e]] = self.cache[:, :, e, :, :pos[e]]
                    live[s], pos[s], last[s] = live[e], pos[e], last[e]
                live.pop()
                pos.pop()
                last.pop()
                flight[0] -= 1

        with torch.no_grad():
            while waiting or live:
                arrive()
                yield from happened
                happened.clear()
                admitted: list[int] = []
                budget = self.prefill_tokens
                while (waiting and waiting[0] in arrived and len(live) + len(admitted) < self.max_batch
                       and (not admitted or len(requests[waiting[0]].prompt) <= budget)):
                    i = waiting.popleft()
                    arrived.discard(i)
                    admitted.append(i)
                    budget -= len(requests[i].prompt)
                if admitted:
                    self._prefill(admitted, requests, live, pos, last, emit)
                    leave()  # a request of one token is done after its prefill
                    yield from happened
                    happened.clear()
                if not live:
                    if waiting and not arrived:  # nothing in flight: skip to the next arrival
                        step = max(step, requests[waiting[0]].arrival)
                    continue
                n = len(live)
                width = max(2, max(pos))  # the export's dynamic length starts at 2
                positions = torch.tensor(pos, dtype=torch.long)
                mask = torch.where(torch.arange(width).unsqueeze(0) < positions.unsqueeze(1), 0.0, NEG_INF)
                logprobs, new = self.model.decode(torch.tensor(last, dtype=torch.long), positions, mask,
                                                  self.cache[:, :, :n, :, :width])
                self.cache[:, :, torch.arange(n), :, positions] = new.permute(2, 0, 1, 3, 4)
                last[:] = emit(live, logprobs)
                for s in range(n):
                    pos[s] += 1
                leave()
                step += 1
                yield from happened
                happened.clear()

    def _prefill(self, admitted: list[int], requests: list[Request], live: list[int], pos: list[int],
                 last: list[int], emit: Callable[[list[int], Any], list[int]]) -> None:
        torch = self.torch
        lengths = [len(requests[i].prompt) for i in admitted]
        width = max(2, max(lengths))  # right padding; the export's dynamic length starts at 2
        ids = torch.zeros((len(admitted), width), dtype=torch.long)
        for row, i in enumerate(admitted):
            ids[row, :lengths[row]] = torch.tensor(requests[i].prompt, dtype=torch.long)
        logprobs, kv = self.model.prefill(ids, torch.tensor([n - 1 for n in lengths], dtype=torch.long))
        base = len(live)
        self.cache[:, :, base:base + len(admitted), :, :width] = kv
        live.extend(admitted)
        pos.extend(lengths)
        last.extend(emit(admitted, logprobs))
