"""Speed, side by side: the same workload on candidate and reference, interleaved A B A B.

Metrics follow ``vllm bench serve``: TTFT; TPOT = (latency - TTFT) / (output_len - 1); ITL =
all inter-token gaps pooled; output tokens/s (and per GPU); request throughput. Each is taken
per repetition; the report gives medians, p50/p99 of the pooled per-request values, and the
dispersion (min-max and coefficient of variation) of throughput across repetitions so that a
noisy run is visible. Warm-up requests run first on each side and are not measured.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from buildctl.engines.backend import Runner, TokenEvent
from buildctl.engines.profile import SpeedGate


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class RunMetrics:
    """One side, one concurrency level, one repetition."""

    ttft_s: list[float]
    tpot_s: list[float]
    itl_s: list[float]
    output_tokens: int
    wall_s: float
    requests: int

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else math.inf

    @property
    def request_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else math.inf


def metrics_from_events(events: list[TokenEvent], n_requests: int, wall_s: float) -> RunMetrics:
    starts: dict[int, float] = {}
    tokens: dict[int, list[float]] = {i: [] for i in range(n_requests)}
    for e in events:
        if e.token_id is None:
            starts[e.index] = e.time
        else:
            tokens[e.index].append(e.time)
    ttft, tpot, itl = [], [], []
    total = 0
    for i in range(n_requests):
        times = tokens[i]
        total += len(times)
        if not times or i not in starts:
            continue
        first = times[0] - starts[i]
        ttft.append(first)
        if len(times) > 1:
            tpot.append((times[-1] - starts[i] - first) / (len(times) - 1))
            itl += [b - a for a, b in zip(times, times[1:])]
    return RunMetrics(ttft, tpot, itl, total, wall_s, n_requests)


def run_once(runner: Runner, prompts: list[list[int]], max_tokens: int, concurrency: int) -> RunMetrics:
    t0 = time.perf_counter()
    events = list(runner.stream(prompts, max_tokens, concurrency))
    return metrics_from_events(events, len(prompts), time.perf_counter() - t0)


def _summary(runs: list[RunMetrics], gpus: int) -> dict[str, Any]:
    tps = [r.output_tok_s for r in runs]
    ttft = [x for r in runs for x in r.ttft_s]
    tpot = [x for r in runs for x in r.tpot_s]
    itl = [x for r in runs for x in r.itl_s]
    mean = statistics.fmean(tps)
    return {
        "output_tok_s": statistics.median(tps),
        "output_tok_s_per_gpu": statistics.median(tps) / max(1, gpus),
        "request_throughput": statistics.median([r.request_s for r in runs]),
        "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "tpot_p50_ms": percentile(tpot, 50) * 1e3, "tpot_p99_ms": percentile(tpot, 99) * 1e3,
        "itl_p50_ms": percentile(itl, 50) * 1e3, "itl_p99_ms": percentile(itl, 99) * 1e3,
        "output_tok_s_min": min(tps), "output_tok_s_max": max(tps),
        "output_tok_s_cv": (statistics.pstdev(tps) / mean) if mean and len(tps) > 1 else 0.0,
        "repetitions": len(runs),
    }


@dataclass
class LevelResult:
    concurrency: int
    candidate: dict[str, Any]
    reference: dict[str, Any]
    throughput_ratio: float
    p99_ttft_ratio: float
    passed: bool
    reasons: list[str] = field(default_factory=list)


@dataclass
class SpeedReport:
    levels: list[LevelResult]
    gate: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(level.passed for level in self.levels)

    def reasons(self) -> list[str]:
        return [r for level in self.levels for r in level.reasons]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "gate": self.gate,
                "levels": [{"concurrency": lv.concurrency, "candidate": lv.candidate, "reference": lv.reference,
                            "throughput_ratio": lv.throughput_ratio, "p99_ttft_ratio": lv.p99_ttft_ratio,
                            "passed": lv.passed, "reasons": lv.reasons} for lv in self.levels]}


def measure(candidate: Runner, reference: Runner, gate: SpeedGate, prompts: list[list[int]], *,
            candidate_gpus: int = 1, reference_gpus: int = 1,
            on_progress: Any = None) -> SpeedReport:
    """Run the workload at each concurrency level, interleaving the sides, and apply the gate."""
    levels = []
    for c in gate.concurrency:
        if gate.warmup:
            warm = prompts[: max(gate.warmup, 1)]
            run_once(candidate, warm, gate.output_len, c)
            run_once(reference, warm, gate.output_len, c)
        runs: dict[str, list[RunMetrics]] = {"candidate": [], "reference": []}
        for rep in range(gate.repetitions):
            order = [("candidate", candidate), ("reference", reference)]
            if rep % 2:
                order.reverse()  # A B, B A: drift in either direction cancels
            for side, runner in order:
                runs[side].append(run_once(runner, prompts, gate.output_len, c))
                if on_progress:
                    on_progress(f"concurrency {c}, repetition {rep + 1}/{gate.repetitions}, {side}: "
                                f"{runs[side][-1].output_tok_s:.0f} tok/s")
        cand, ref = _summary(runs["candidate"], candidate_gpus), _summary(runs["reference"], reference_gpus)
        tp_ratio = cand["output_tok_s"] / ref["output_tok_s"] if ref["output_tok_s"] else math.inf
        ttft_ratio = cand["ttft_p99_ms"] / ref["ttft_p99_ms"] if ref["ttft_p99_ms"] else math.inf
        reasons = []
        if tp_ratio < gate.min_throughput_ratio:
            reasons.append(f"concurrency {c}: throughput ratio {tp_ratio:.2f} < {gate.min_throughput_ratio}")
        if ttft_ratio > gate.max_p99_ttft_ratio:
            reasons.append(f"concurrency {c}: p99 TTFT ratio {ttft_ratio:.2f} > {gate.max_p99_ttft_ratio}")
        levels.append(LevelResult(c, cand, ref, tp_ratio, ttft_ratio, not reasons, reasons))
    return SpeedReport(levels, {"min_throughput_ratio": gate.min_throughput_ratio,
                                "max_p99_ttft_ratio": gate.max_p99_ttft_ratio, "concurrency": list(gate.concurrency),
                                "input_len": gate.input_len, "output_len": gate.output_len,
                                "num_prompts": gate.num_prompts, "repetitions": gate.repetitions,
                                "warmup": gate.warmup})
