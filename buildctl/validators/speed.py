"""Speed, side by side: paired repetitions of the same workload on candidate and reference, a
confidence interval per ratio, and a pass / fail / inconclusive verdict.

Metrics follow ``vllm bench serve``: TTFT; TPOT = (latency - TTFT) / (output_len - 1); ITL =
all inter-token gaps; output tokens/s (and per GPU); request throughput.

The unit of measurement is a *pair*: one repetition runs candidate and reference back to back
(A B, then B A on the next, so drift in either direction cancels) and yields one ratio per metric
(throughput, p50 and p99 TTFT, median TPOT). The two halves of a pair share the machine's state,
so the ratio cancels most of it. The gate analyses the pairs' ratios, never pooled samples: the
median ratio with a distribution-free confidence interval (:mod:`buildctl.core.stats`), and a verdict
that is ``pass`` only when the whole interval is on the good side of the threshold, ``fail`` only
when it is wholly on the bad side, and ``inconclusive`` otherwise.

While a level is inconclusive, repetitions are added two at a time (one A B, one B A) up to the
profile's ``max_repetitions`` or ``max_seconds``, both scaled by ``budget_scale`` (the flow's
retry doubles them). Every level is decided on its own: a failed level does not stop the next
from adding repetitions, so a failing attestation names every level the engine fails at, not
only the first (a failing validation takes longer for it, within the same budget). Warm-up
requests run first on each side and are not measured.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from buildctl.engines.backend import Runner, TokenEvent
from buildctl.engines.profile import GATED_METRICS, SpeedGate
from buildctl.core.stats import Interval, Verdict, combine, gate_verdict, median_interval
from buildctl.validators.noise import NoiseProbe


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

    def value(self, metric: str) -> float:
        """This repetition's figure for a gated metric."""
        if metric == "throughput":
            return self.output_tok_s
        if metric == "ttft_p50":
            return percentile(self.ttft_s, 50)
        if metric == "ttft_p99":
            return percentile(self.ttft_s, 99)
        if metric == "tpot_p50":
            return percentile(self.tpot_s, 50)
        raise ValueError(f"unknown metric {metric!r}")


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


def _side(runs: list[RunMetrics], gpus: int) -> dict[str, Any]:
    """One side's figures: the median over repetitions of each repetition's value."""
    def med(f: Callable[[RunMetrics], float]) -> float:
        return statistics.median(f(r) for r in runs)

    tps = [r.output_tok_s for r in runs]
    mean = statistics.fmean(tps)
    return {
        "output_tok_s": med(lambda r: r.output_tok_s),
        "output_tok_s_per_gpu": med(lambda r: r.output_tok_s) / max(1, gpus),
        "request_throughput": med(lambda r: r.request_s),
        "ttft_p50_ms": med(lambda r: percentile(r.ttft_s, 50)) * 1e3,
        "ttft_p99_ms": med(lambda r: percentile(r.ttft_s, 99)) * 1e3,
        "tpot_p50_ms": med(lambda r: percentile(r.tpot_s, 50)) * 1e3,
        "tpot_p99_ms": med(lambda r: percentile(r.tpot_s, 99)) * 1e3,
        "itl_p50_ms": med(lambda r: percentile(r.itl_s, 50)) * 1e3,
        "itl_p99_ms": med(lambda r: percentile(r.itl_s, 99)) * 1e3,
        "output_tok_s_min": min(tps), "output_tok_s_max": max(tps),
        "output_tok_s_cv": (statistics.pstdev(tps) / mean) if mean and len(tps) > 1 else 0.0,
        "repetitions": len(runs),
    }


LABELS = {"throughput": "throughput ratio", "ttft_p50": "p50 TTFT ratio", "ttft_p99": "p99 TTFT ratio",
          "tpot_p50": "TPOT ratio"}


@dataclass
class Ratio:
    """One metric's paired ratios at one level, with interval and verdict."""

    metric: str
    samples: list[float]
    interval: Interval
    threshold: float | None
    bound: str
    verdict: str  # pass | fail | inconclusive | not gated

    def reason(self, concurrency: int) -> str | None:
        if self.verdict in ("pass", "not gated"):
            return None
        op = (">=" if self.bound == "min" else "<=")
        what = "fails" if self.verdict == "fail" else "straddles"
        return (f"concurrency {concurrency}: {LABELS[self.metric]} {self.interval.describe()} {what} "
                f"the gate {op} {self.threshold}" + ("" if self.verdict == "fail" else ": inconclusive"))

    def to_json(self) -> dict[str, Any]:
        iv = self.interval
        return {"metric": self.metric, "median": iv.median, "low": iv.low if iv.bounded else None,
                "high": iv.high if iv.bounded else None, "confidence": iv.confidence,
                "samples": list(self.samples), "threshold": self.threshold, "bound": self.bound,
                "verdict": self.verdict}


def _safe_ratio(a: float, b: float) -> float:
    if b == 0 or math.isnan(a) or math.isnan(b):
        return math.nan if a == 0 or math.isnan(a) or math.isnan(b) else math.inf
    return a / b


@dataclass
class LevelResult:
    concurrency: int
    candidate_runs: list[RunMetrics]
    reference_runs: list[RunMetrics]
    ratios: list[Ratio]
    candidate_gpus: int = 1
    reference_gpus: int = 1

    @property
    def verdict(self) -> Verdict:
        return combine([r.verdict for r in self.ratios if r.verdict != "not gated"])  # type: ignore[misc]

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def repetitions(self) -> int:
        return len(self.candidate_runs)

    @property
    def reasons(self) -> list[str]:
        return [r for r in (x.reason(self.concurrency) for x in self.ratios) if r]

    def ratio(self, metric: str) -> Ratio:
        return next(r for r in self.ratios if r.metric == metric)

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency,
                "candidate": _side(self.candidate_runs, self.candidate_gpus),
                "reference": _side(self.reference_runs, self.reference_gpus),
                "throughput_ratio": self.ratio("throughput").interval.median,
                "p99_ttft_ratio": self.ratio("ttft_p99").interval.median,
                "passed": self.passed, "verdict": self.verdict, "reasons": self.reasons,
                "ratios": [r.to_json() for r in self.ratios]}


def evaluate_level(concurrency: int, candidate_runs: list[RunMetrics], reference_runs: list[RunMetrics],
                   gate: SpeedGate, *, candidate_gpus: int = 1, reference_gpus: int = 1) -> LevelResult:
    """The paired ratios of one level, their intervals and verdicts under ``gate``."""
    thresholds = gate.thresholds_at(concurrency)
    ratios = []
    for metric, field_name, bound in GATED_METRICS:
        samples = [_safe_ratio(c.value(metric), r.value(metric)) for c, r in zip(candidate_runs, reference_runs)]
        iv = median_interval(samples, gate.confidence)
        threshold = thresholds[field_name]
        verdict = "not gated" if threshold is None else gate_verdict(iv, threshold, bound)
        ratios.append(Ratio(metric, samples, iv, threshold, bound, verdict))
    return LevelResult(concurrency, candidate_runs, reference_runs, ratios, candidate_gpus, reference_gpus)


@dataclass
class SpeedReport:
    levels: list[LevelResult]
    gate: dict[str, Any]
    noise: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return combine([lv.verdict for lv in self.levels])

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def reasons(self) -> list[str]:
        return [r for level in self.levels for r in level.reasons]

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "verdict": self.verdict, "gate": self.gate,
                "levels": [lv.to_json() for lv in self.levels], "noise": self.noise or None,
                "budget": self.budget or None}


def gate_record(gate: SpeedGate) -> dict[str, Any]:
    """The gate as the attestation records it."""
    return {"min_throughput_ratio": gate.min_throughput_ratio, "max_p99_ttft_ratio": gate.max_p99_ttft_ratio,
            "max_p50_ttft_ratio": gate.max_p50_ttft_ratio, "max_tpot_ratio": gate.max_tpot_ratio,
            "levels": {c: t.model_dump() for c, t in gate.levels.items()},
            "concurrency": list(gate.concurrency), "input_len": gate.input_len, "output_len": gate.output_len,
            "num_prompts": gate.num_prompts, "repetitions": gate.repetitions,
            "max_repetitions": gate.max_repetitions, "max_seconds": gate.max_seconds,
            "confidence": gate.confidence, "cpu_threads": gate.cpu_threads, "warmup": gate.warmup}


def _pairs(candidate: Runner, reference: Runner, prompts: list[list[int]], gate: SpeedGate, concurrency: int,
           start: int, count: int, on_progress: Callable[[str], None] | None) -> Iterator[tuple[RunMetrics, RunMetrics]]:
    """``count`` paired repetitions, numbered from ``start``: even ones A B, odd ones B A."""
    for rep in range(start, start + count):
        order = [("candidate", candidate), ("reference", reference)]
        if rep % 2:
            order.reverse()
        got: dict[str, RunMetrics] = {}
        for side, runner in order:
            got[side] = run_once(runner, prompts, gate.output_len, concurrency)
        if on_progress:
            c, r = got["candidate"], got["reference"]
            on_progress(f"concurrency {concurrency}, repetition {rep + 1} ({'/'.join(s[0].upper() for s, _ in order)}): "
                        f"candidate {c.output_tok_s:.0f} tok/s, reference {r.output_tok_s:.0f} tok/s, "
                        f"ratio {_safe_ratio(c.output_tok_s, r.output_tok_s):.3f}")
        yield got["candidate"], got["reference"]


def measure(candidate: Runner, reference: Runner, gate: SpeedGate, prompts: list[list[int]], *,
            gpus: tuple[int, int] = (1, 1), budget_scale: float = 1.0,
            on_progress: Callable[[str], None] | None = None,
            clock: Callable[[], float] = time.monotonic) -> SpeedReport:
    """Measure every level with paired repetitions, adding repetitions while a level is
    inconclusive and the budget (``max_repetitions``, ``max_seconds``, times ``budget_scale``) lasts.
    ``gpus``: the candidate's and the reference's GPU counts (per-GPU throughput compares them)."""
    candidate_gpus, reference_gpus = gpus
    max_reps = max(gate.repetitions, math.ceil(gate.max_repetitions * budget_scale))
    max_seconds = gate.max_seconds * budget_scale
    probe = NoiseProbe.start()
    t0 = clock()
    exhausted = False
    levels: list[LevelResult] = []
    for c in gate.concurrency:
        if gate.warmup:
            warm = prompts[: max(gate.warmup, 1)]
            run_once(candidate, warm, gate.output_len, c)
            run_once(reference, warm, gate.output_len, c)
        cand: list[RunMetrics] = []
        ref: list[RunMetrics] = []
        want = gate.repetitions
        while True:
            for a, b in _pairs(candidate, reference, prompts, gate, c, len(cand), want - len(cand), on_progress):
                cand.append(a)
                ref.append(b)
            level = evaluate_level(c, cand, ref, gate, candidate_gpus=candidate_gpus, reference_gpus=reference_gpus)
            if level.verdict != "inconclusive":
                break
            if len(cand) >= max_reps or clock() - t0 >= max_seconds:
                exhausted = True
                break
            want = min(max_reps, len(cand) + 2)
            if on_progress:
                on_progress(f"concurrency {c}: inconclusive after {len(cand)} repetitions "
                            f"({'; '.join(level.reasons)}); adding repetitions")
        levels.append(level)
    return SpeedReport(levels, gate_record(gate), probe.finish(),
                       {"scale": budget_scale, "max_repetitions": max_reps, "max_seconds": max_seconds,
                        "seconds": round(clock() - t0, 3), "exhausted": exhausted})
