"""Output parity, as vLLM's ``check_logprobs_close`` (tests/models/utils.py) defines it.

Per prompt, tokens must be equal up to the first divergence. At the first divergence, each
side's token must be in the other side's top-k logprobs, and comparison of that sequence stops
there. Pure functions over :class:`engines.backend.Generation`.

The staggered set (:func:`staggered_requests`) exercises in-flight batching: the parity prompts
again, each with its own ``max_tokens`` and an arrival step, so requests join and leave mid-run
(some right after their prefill). Each output must equal the same prompt's solo reference
output cut to its ``max_tokens`` (greedy decoding: a shorter run is a prefix of a longer one), by
the same rule (:func:`check_staggered`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from buildctl.engines.backend import Generation
from buildctl.engines.batching import Request

Status = Literal["identical", "close", "failed"]


@dataclass(frozen=True)
class PromptParity:
    """The comparison of one prompt's outputs."""

    index: int
    status: Status
    compared: int  # positions compared
    position: int | None = None  # first divergence
    reference_token: int | None = None
    candidate_token: int | None = None
    max_abs_logprob_diff: float = 0.0  # over the common prefix, tokens in both top-k

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def to_json(self) -> dict:
        return asdict(self)


def compare(index: int, reference: Generation, candidate: Generation) -> PromptParity:
    """Compare one prompt's greedy outputs by vLLM's rule."""
    n = min(len(reference.token_ids), len(candidate.token_ids))
    max_diff = 0.0
    for pos in range(n):
        r_tok, c_tok = reference.token_ids[pos], candidate.token_ids[pos]
        r_top = reference.top_logprobs[pos] if pos < len(reference.top_logprobs) else {}
        c_top = candidate.top_logprobs[pos] if pos < len(candidate.top_logprobs) else {}
        if r_tok != c_tok:
            close = r_tok in c_top and c_tok in r_top
            return PromptParity(index, "close" if close else "failed", pos + 1, pos, r_tok, c_tok, max_diff)
        for t in r_top.keys() & c_top.keys():
            max_diff = max(max_diff, abs(r_top[t] - c_top[t]))
    if len(reference.token_ids) != len(candidate.token_ids):
        return PromptParity(index, "failed", n, n, None, None, max_diff)
    return PromptParity(index, "identical", n, None, None, None, max_diff)


@dataclass(frozen=True)
class ParityReport:
    prompts: list[PromptParity]
    min_identical_fraction: float

    @property
    def identical_fraction(self) -> float:
        return sum(p.status == "identical" for p in self.prompts) / max(1, len(self.prompts))

    @property
    def max_abs_logprob_diff(self) -> float:
        return max((p.max_abs_logprob_diff for p in self.prompts), default=0.0)

    @property
    def failed(self) -> list[PromptParity]:
        return [p for p in self.prompts if not p.passed]

    @property
    def passed(self) -> bool:
        return not self.failed and self.identical_fraction >= self.min_identical_fraction

    def reasons(self) -> list[str]:
        out = [f"prompt {p.index} diverged at position {p.position} (reference {p.reference_token}, candidate "
               f"{p.candidate_token}) outside the top-k" for p in self.failed]
        if self.identical_fraction < self.min_identical_fraction:
            out.append(f"only {self.identical_fraction:.0%} of prompts identical, profile requires "
                       f"{self.min_identical_fraction:.0%}")
        return out

    def to_json(self) -> dict:
        return {"passed": self.passed, "prompts": len(self.prompts),
                "identical": sum(p.status == "identical" for p in self.prompts),
                "close": sum(p.status == "close" for p in self.prompts), "failed": len(self.failed),
                "identical_fraction": self.identical_fraction, "min_identical_fraction": self.min_identical_fraction,
                "max_abs_logprob_diff": self.max_abs_logprob_diff, "per_prompt": [p.to_json() for p in self.prompts]}


def check_parity(reference: list[Generation], candidate: list[Generation], min_identical_fraction: float = 0.0) -> ParityReport:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference outputs but {len(candidate)} candidate outputs")
    return ParityReport([compare(i, r, c) for i, (r, c) in enumerate(zip(reference, candidate))], min_identical_fraction)


# The two concurrencies of the staggered set: a few requests in flight, and more than the parity
# set's prompts of one kind, so slots free up and fill at every step.
STAGGERED_CONCURRENCY = (5, 17)


def staggered_requests(prompts: list[list[int]], max_tokens: int) -> list[Request]:
    """Each prompt with its own ``max_tokens`` (1, 2, a quarter, a half and all of ``max_tokens``,
    in turn, none past ``max_tokens``) and an arrival step spread over the first 13 decode steps."""
    lengths = [min(n, max_tokens) for n in (1, 2, max(1, max_tokens // 4), max(1, max_tokens // 2), max_tokens)]
    return [Request(list(p), lengths[i % len(lengths)], arrival=(i * 7) % 13) for i, p in enumerate(prompts)]


def check_staggered(reference: list[Generation], candidate: list[Generation], requests: list[Request],
                    min_identical_fraction: float = 0.0) -> ParityReport:
    """Each request's output against its prompt's reference output cut to the request's ``max_tokens``."""
    expected = [Generation(r.token_ids[:q.max_tokens], r.top_logprobs[:q.max_tokens]) for r, q in zip(reference, requests)]
    return check_parity(expected, candidate, min_identical_fraction)


def staggered_json(concurrency: int, report: ParityReport) -> dict:
    """The attestation's record of one staggered run."""
    full = report.to_json()
    return {"concurrency": concurrency, **{k: full[k] for k in ("prompts", "identical", "close", "failed",
                                                               "max_abs_logprob_diff", "per_prompt")}}
