"""The speed gate: metrics from streamed events, the interval statistics, the three-way verdict and
the adaptive repetitions, on synthetic and scripted runners."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from buildctl.engines.backend import TokenEvent
from buildctl.engines.profile import SpeedGate
from buildctl.core.stats import Interval, combine, gate_verdict, median_interval, min_samples, order_statistic_rank
from buildctl.artifact_store.trust.attestations import SpeedSummary
from buildctl.validators.speed import measure, metrics_from_events, percentile


def test_percentile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 99) == pytest.approx(4.96)
    assert percentile([7.0], 99) == 7.0


def test_metrics_follow_vllm_bench_definitions():
    ev = [TokenEvent(0, None, 10.0), TokenEvent(1, None, 10.0),
          TokenEvent(0, 5, 10.1), TokenEvent(1, 6, 10.3), TokenEvent(0, 5, 10.2), TokenEvent(0, 5, 10.5),
          TokenEvent(1, 6, 10.4)]
    m = metrics_from_events(ev, 2, wall_s=0.5)
    assert m.ttft_s == pytest.approx([0.1, 0.3])
    assert m.tpot_s == pytest.approx([(0.5 - 0.1) / 2, (0.4 - 0.3) / 1])
    assert sorted(m.itl_s) == pytest.approx(sorted([0.1, 0.3, 0.1]))
    assert m.output_tokens == 5 and m.output_tok_s == pytest.approx(10.0) and m.request_s == pytest.approx(4.0)


# --- statistics ------------------------------------------------------------------------------


def test_order_statistic_ranks_match_the_binomial_tables():
    # coverage of [x(k), x(n-k+1)] is 1 - 2 P(Bin(n, 1/2) <= k-1)
    assert order_statistic_rank(5, 0.95) is None  # [min, max] of 5 covers 93.75% only
    assert order_statistic_rank(6, 0.95) == 1  # 96.9%
    assert order_statistic_rank(9, 0.95) == 2  # 1 - 2*10/512 = 96.1%
    assert order_statistic_rank(16, 0.95) == 4  # 1 - 2*697/65536 = 97.9%; k=5 gives 92.3%
    assert order_statistic_rank(20, 0.95) == 6
    assert min_samples(0.95) == 6 and min_samples(0.99) == 8 and min_samples(0.9) == 5


def test_synthetic_paired_sample_gives_the_expected_interval():
    samples = [0.7, 0.3, 1.0, 0.1, 0.5, 0.9, 0.2, 0.6, 0.4, 0.8]  # 0.1..1.0, shuffled
    iv = median_interval(samples, 0.95)
    assert iv == Interval(median=0.55, low=0.2, high=0.9, confidence=0.95, n=10)  # k=2 at n=10
    few = median_interval([1.0, 2.0, 3.0], 0.95)
    assert not few.bounded and few.median == 2.0 and gate_verdict(few, 0.1, "min") == "inconclusive"
    assert not median_interval([], 0.95).bounded


def test_interval_covers_the_true_median_at_its_level():
    # Lognormal ratios with a known median of 1.0; n=10 gives the exact coverage 1 - 2*11/1024 = 97.85%.
    rng = random.Random(7)
    trials, covered = 4000, 0
    for _ in range(trials):
        iv = median_interval([math.exp(rng.gauss(0, 0.3)) for _ in range(10)], 0.95)
        covered += iv.low <= 1.0 <= iv.high
    assert 0.97 <= covered / trials <= 0.987


@pytest.mark.parametrize("low,high,threshold,bound,expected", [
    (1.0, 1.2, 1.0, "min", "pass"),           # low exactly at the minimum: the whole interval is >= it
    (0.99, 1.2, 1.0, "min", "inconclusive"),  # straddles
    (0.8, 1.0, 1.0, "min", "inconclusive"),   # high exactly at the minimum: not wholly below it
    (0.8, 0.99, 1.0, "min", "fail"),
    (0.8, 1.0, 1.0, "max", "pass"),           # high exactly at the maximum
    (0.8, 1.01, 1.0, "max", "inconclusive"),
    (1.0, 1.2, 1.0, "max", "inconclusive"),   # low exactly at the maximum: not wholly above it
    (1.01, 1.2, 1.0, "max", "fail"),
])
def test_verdicts_at_the_boundaries(low, high, threshold, bound, expected):
    assert gate_verdict(Interval((low + high) / 2, low, high, 0.95, 6), threshold, bound) == expected


def test_verdicts_combine_fail_over_inconclusive_over_pass():
    assert combine(["pass", "inconclusive", "fail"]) == "fail"
    assert combine(["pass", "inconclusive"]) == "inconclusive"
    assert combine(["pass", "pass"]) == "pass"
    assert gate_verdict(Interval(math.nan, math.nan, math.nan, 0.95, 6), 1.0, "min") == "inconclusive"


# --- the gate on synthetic runners ----------------------------------------------------------


class Synthetic:
    """A runner whose TTFT on each call is the next value of ``ttfts_s`` (fabricated timestamps,
    no sleeping): the p50 TTFT ratio of every repetition is chosen by the test."""

    name = "synthetic"

    def __init__(self, ttfts_s) -> None:
        self.ttfts = itertools.cycle(ttfts_s) if isinstance(ttfts_s, list) else ttfts_s
        self.calls = 0

    def stream(self, prompts, max_tokens, concurrency):
        self.calls += 1
        ttft = next(self.ttfts)
        for i in range(len(prompts)):
            yield TokenEvent(i, None, 100.0)
            for t in range(max_tokens):
                yield TokenEvent(i, 1, 100.0 + ttft + 0.001 * t)


def ttft_gate(**kw) -> SpeedGate:
    """A gate on p50 TTFT only (throughput and p99 not gated), so synthetic timestamps decide it."""
    return SpeedGate(**{"min_throughput_ratio": 1e-9, "max_p99_ttft_ratio": None, "max_p50_ttft_ratio": 1.0,
                        "concurrency": (1,), "input_len": 4, "output_len": 2, "num_prompts": 3, "repetitions": 6,
                        "max_repetitions": 10, "max_seconds": 1e6, "warmup": 0, **kw})


def cand_ref(cand_ttfts, ref_ttft=0.010):
    return Synthetic([x * ref_ttft for x in cand_ttfts]), Synthetic([ref_ttft])


def test_clear_ratios_decide_after_the_initial_repetitions():
    c, r = cand_ref([0.5])
    rep = measure(c, r, ttft_gate(), [[1]] * 3)
    lv = rep.levels[0]
    assert rep.verdict == "pass" and lv.repetitions == 6 and c.calls == r.calls == 6
    assert lv.ratio("ttft_p50").interval.median == pytest.approx(0.5)
    assert lv.ratio("ttft_p99").verdict == "not gated"
    c, r = cand_ref([2.0])
    rep = measure(c, r, ttft_gate(), [[1]] * 3)
    assert rep.verdict == "fail" and rep.levels[0].repetitions == 6
    assert "p50 TTFT ratio 2.000 [2.000, 2.000] (95%, n=6) fails the gate <= 1.0" in rep.reasons()[0]


def test_an_outlier_is_outvoted_by_added_repetitions():
    # one 1.3 among 0.9s: [min, max] of 6 and 8 straddle 1.0; at 10 pairs the interval drops it
    c, r = cand_ref(iter([1.3] + [0.9] * 40))
    progress = []
    rep = measure(c, r, ttft_gate(), [[1]] * 3, on_progress=progress.append)
    lv = rep.levels[0]
    assert rep.verdict == "pass" and lv.repetitions == 10
    assert lv.ratio("ttft_p50").interval.high == pytest.approx(0.9)
    assert sum("inconclusive after" in m for m in progress) == 2  # after 6 and after 8
    assert not rep.budget["exhausted"]


def test_adaptive_repetitions_stop_when_the_repetition_budget_runs_out():
    c, r = cand_ref([0.8, 1.2])  # ratios alternate around the threshold forever
    rep = measure(c, r, ttft_gate(), [[1]] * 3)
    assert rep.verdict == "inconclusive" and rep.levels[0].repetitions == 10
    assert rep.budget["exhausted"] and rep.budget["max_repetitions"] == 10
    assert "straddles the gate <= 1.0: inconclusive" in rep.reasons()[0]
    c, r = cand_ref([0.8, 1.2])
    doubled = measure(c, r, ttft_gate(), [[1]] * 3, budget_scale=2.0)
    assert doubled.levels[0].repetitions == 20 and doubled.budget["scale"] == 2.0


def test_adaptive_repetitions_stop_when_the_time_budget_runs_out():
    ticks = itertools.count(0, 30.0)  # every clock reading is 30 s later
    c, r = cand_ref([0.8, 1.2])
    rep = measure(c, r, ttft_gate(max_seconds=100, max_repetitions=40, concurrency=(1, 2)), [[1]] * 3,
                  clock=lambda: next(ticks))
    # the first level reads the clock at 30 s (< 100: add 2), then 60, 90, 120: stop; the second
    # level finds the budget spent and stops after its initial repetitions
    assert [lv.repetitions for lv in rep.levels] == [12, 6]
    assert rep.verdict == "inconclusive" and rep.budget["exhausted"]


def test_every_level_is_decided_on_its_own_after_another_fails():
    """A failed level does not leave the later ones undecided: each adds repetitions while it is
    inconclusive, so the attestation says at which levels the engine fails (#31: the 1.5x slowed
    candidate must fail at every level)."""
    # level 1 fails at once; level 2 straddles at 6 and 8 pairs ([0.8, 1.2]) and fails at 10
    c = Synthetic([2.0 * 0.01] * 6 + [0.8 * 0.01] + [1.2 * 0.01] * 30)
    r = Synthetic([0.01])
    rep = measure(c, r, ttft_gate(concurrency=(1, 2)), [[1]] * 3)
    assert [lv.verdict for lv in rep.levels] == ["fail", "fail"]
    assert [lv.repetitions for lv in rep.levels] == [6, 10] and rep.verdict == "fail"
    assert not rep.budget["exhausted"]


def test_the_report_is_a_typed_attestation_section_with_intervals_and_noise():
    c, r = cand_ref([0.5])
    rep = measure(c, r, ttft_gate(levels={1: {"max_p50_ttft_ratio": 0.6}}), [[1]] * 3)
    s = SpeedSummary.model_validate(rep.to_json())
    lv = s.levels[0]
    assert s.verdict == "pass" and lv.verdict == "pass"
    p50 = next(x for x in lv.ratios if x.metric == "ttft_p50")
    assert p50.threshold == 0.6 and p50.low == pytest.approx(0.5) and len(p50.samples) == 6
    assert s.gate.levels == {1: {"min_throughput_ratio": None, "max_p99_ttft_ratio": None,
                                 "max_p50_ttft_ratio": 0.6, "max_tpot_ratio": None}}
    n = s.noise
    assert n is not None and n.cpu_count >= 1 and n.calibration_before_ms > 0 and n.calibration_after_ms > 0


# --- the gate on scripted runners that take real time ---------------------------------------


class Scripted:
    """A runner that streams real wall-clock time: each step takes ``step_s``."""

    name = "scripted"

    def __init__(self, step_s: float, first_s: float = 0.0) -> None:
        self.step_s, self.first_s = step_s, first_s
        self.calls = 0

    def stream(self, prompts, max_tokens, concurrency):
        self.calls += 1
        for w in range(0, len(prompts), concurrency):
            wave = range(w, min(len(prompts), w + concurrency))
            t0 = time.perf_counter()
            for i in wave:
                yield TokenEvent(i, None, t0)
            time.sleep(self.first_s)
            for _ in range(max_tokens):
                time.sleep(self.step_s)
                now = time.perf_counter()
                for i in wave:
                    yield TokenEvent(i, 1, now)


def gate(**kw) -> SpeedGate:
    return SpeedGate(**{"min_throughput_ratio": 0.5, "max_p99_ttft_ratio": None, "max_p50_ttft_ratio": 2.0,
                        "concurrency": (1, 2), "input_len": 4, "output_len": 4, "num_prompts": 4, "repetitions": 6,
                        "max_repetitions": 6, "warmup": 1, **kw})


@pytest.mark.speedgate
def test_the_sides_interleave_a_b_then_b_a():
    a, b = Scripted(0.002), Scripted(0.002)
    order = []
    measure(a, b, gate(min_throughput_ratio=1e-3, max_p50_ttft_ratio=None), [[1]] * 4, on_progress=order.append)
    assert [m.split("(")[1].split(")")[0] for m in order if "repetition" in m][:4] == ["C/R", "R/C", "C/R", "R/C"]
    assert a.calls == b.calls == 2 * (1 + 6)  # warm-up + repetitions, per level


@pytest.mark.speedgate
def test_slow_candidate_fails_throughput_gate():
    rep = measure(Scripted(0.008), Scripted(0.001), gate(max_p50_ttft_ratio=None), [[1]] * 4)
    assert rep.verdict == "fail"
    assert any("throughput ratio" in r for r in rep.reasons())
    assert all(lv.ratio("throughput").interval.high < 0.5 for lv in rep.levels)


@pytest.mark.speedgate
def test_slow_first_token_fails_ttft_gate():
    rep = measure(Scripted(0.001, first_s=0.03), Scripted(0.001), gate(min_throughput_ratio=1e-3), [[1]] * 4)
    assert rep.verdict == "fail" and all("p50 TTFT ratio" in r for r in rep.reasons())
    d = rep.to_json()
    assert d["levels"][0]["candidate"]["ttft_p50_ms"] > d["levels"][0]["reference"]["ttft_p50_ms"]
    assert {"output_tok_s_min", "output_tok_s_max", "output_tok_s_cv", "tpot_p50_ms", "itl_p99_ms",
            "request_throughput", "output_tok_s_per_gpu"} <= set(d["levels"][0]["candidate"])


def test_the_report_states_each_sides_figures_in_milliseconds_and_the_time_spent():
    """Figures of the TailRunner workload (fabricated timestamps, so exact): every request's first
    token 10 ms after its submission, the next 1 ms later. The budget's seconds come from the clock."""


    ticks = iter([0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0, 22.5, 25.0])
    gate = SpeedGate(min_throughput_ratio=1e-9, max_p99_ttft_ratio=1.5, concurrency=(1,), input_len=4, output_len=2,
                     num_prompts=100, repetitions=6, max_repetitions=6, max_seconds=1e6, warmup=0)
    rep = measure(TailRunner(0.010), TailRunner(0.010), gate, [[1]] * 100, clock=lambda: next(ticks))
    side = rep.levels[0].to_json()["candidate"]
    assert side["ttft_p50_ms"] == pytest.approx(10.0) and side["ttft_p99_ms"] == pytest.approx(10.0)
    assert side["tpot_p50_ms"] == pytest.approx(1.0) and side["itl_p50_ms"] == pytest.approx(1.0)
    assert rep.budget["seconds"] == pytest.approx(2.5)  # the first reading after the start, minus the start


class Ramp:
    """Request i: first token (i+1) ms after submission, then a token every (i+1)/10 ms."""

    name = "ramp"

    def stream(self, prompts, max_tokens, concurrency):
        for i in range(len(prompts)):
            yield TokenEvent(i, None, 50.0)
            for t in range(max_tokens):
                yield TokenEvent(i, 1, 50.0 + (i + 1) * 1e-3 + t * (i + 1) * 1e-4)


def test_every_reported_figure_of_a_side_by_hand():
    """Five requests, three tokens each: TTFT 1..5 ms, TPOT and ITL 0.1..0.5 ms; linear-interpolated
    percentiles computed here by hand; the candidate ran on 2 GPUs."""
    gate = SpeedGate(min_throughput_ratio=1e-9, max_p99_ttft_ratio=None, concurrency=(1,), input_len=4, output_len=3,
                     num_prompts=5, repetitions=6, max_repetitions=6, max_seconds=1e6, warmup=0)
    rep = measure(Ramp(), Ramp(), gate, [[1]] * 5, gpus=(2, 1))
    side = rep.levels[0].to_json()["candidate"]
    assert side["ttft_p50_ms"] == pytest.approx(3.0) and side["ttft_p99_ms"] == pytest.approx(4.96)
    assert side["tpot_p50_ms"] == pytest.approx(0.3) and side["tpot_p99_ms"] == pytest.approx(0.496)
    # ITL pools both gaps of every request: [.1, .1, .2, .2, ..., .5, .5]; p99 at index 8.91
    assert side["itl_p50_ms"] == pytest.approx(0.3) and side["itl_p99_ms"] == pytest.approx(0.5)
    assert side["output_tok_s_per_gpu"] == pytest.approx(side["output_tok_s"] / 2)
    assert side["repetitions"] == 6 and side["output_tok_s_min"] <= side["output_tok_s"] <= side["output_tok_s_max"]
    ref = rep.levels[0].to_json()["reference"]
    assert ref["output_tok_s_per_gpu"] == pytest.approx(ref["output_tok_s"])  # 1 GPU by default
    lv = rep.levels[0]
    assert lv.ratio("ttft_p50").interval.median == pytest.approx(1.0) and lv.ratio("tpot_p50").interval.median == pytest.approx(1.0)


def test_safe_ratios_of_zero_and_nan():
    from buildctl.validators.speed import _safe_ratio

    assert _safe_ratio(2.0, 4.0) == 0.5
    assert math.isinf(_safe_ratio(1.0, 0.0)) and math.isnan(_safe_ratio(0.0, 0.0))
    assert math.isnan(_safe_ratio(math.nan, 1.0)) and math.isnan(_safe_ratio(1.0, math.nan))


class Curve:
    """Request i: first token (i+1) ms after submission, token t at t² x (i+1)/10 ms after the first:
    every ITL distinct enough that p98, p99 and p100 differ."""

    name = "curve"

    def __init__(self) -> None:
        self.prompt_counts: list[int] = []

    def stream(self, prompts, max_tokens, concurrency):
        self.prompt_counts.append(len(prompts))
        for i in range(len(prompts)):
            yield TokenEvent(i, None, 50.0)
            for t in range(max_tokens):
                yield TokenEvent(i, 1, 50.0 + (i + 1) * 1e-3 + t * t * (i + 1) * 1e-4)


def curve_gate(**kw) -> SpeedGate:
    return SpeedGate(**{"min_throughput_ratio": 1e-9, "max_p99_ttft_ratio": None, "concurrency": (1,), "input_len": 4,
                        "output_len": 3, "num_prompts": 5, "repetitions": 6, "max_repetitions": 6,
                        "max_seconds": 1e6, "warmup": 0, **kw})


def test_tail_figures_and_defaults_by_hand():
    """ITLs 0.1, 0.3 | 0.2, 0.6 | ... | 0.5, 1.5 ms; TPOT 0.2 (i+1) ms. One GPU a side by default,
    at evaluate_level as at measure."""
    from buildctl.validators.speed import evaluate_level, run_once

    rep = measure(Curve(), Curve(), curve_gate(), [[1]] * 5)
    side = rep.levels[0].to_json()["candidate"]
    assert side["itl_p99_ms"] == pytest.approx(1.473) and side["itl_p50_ms"] == pytest.approx(0.45)
    assert side["tpot_p99_ms"] == pytest.approx(0.992) and side["tpot_p50_ms"] == pytest.approx(0.6)
    assert side["output_tok_s_per_gpu"] == pytest.approx(side["output_tok_s"])
    runs = [run_once(Curve(), [[1]] * 5, 3, 1) for _ in range(6)]
    level = evaluate_level(1, runs, runs, curve_gate())
    assert level.to_json()["candidate"]["output_tok_s_per_gpu"] == pytest.approx(level.to_json()["candidate"]["output_tok_s"])
    assert runs[0].value("tpot_p50") == pytest.approx(0.6e-3) and runs[0].value("ttft_p50") == pytest.approx(3e-3)


def test_the_spread_of_throughput_is_its_coefficient_of_variation():
    from buildctl.validators.speed import RunMetrics, _side

    runs = [RunMetrics([0.1], [0.1], [0.1], output_tokens=n, wall_s=1.0, requests=1) for n in (10, 20, 30)]
    side = _side(runs, 1)
    assert side["output_tok_s_cv"] == pytest.approx(math.sqrt(200 / 3) / 20)
    assert (side["output_tok_s_min"], side["output_tok_s"], side["output_tok_s_max"]) == (10, 20, 30)
    assert _side(runs[:1], 1)["output_tok_s_cv"] == 0.0
    assert _side(runs[:2], 1)["output_tok_s_cv"] == pytest.approx(5 / 15)
    idle = [RunMetrics([], [], [], output_tokens=0, wall_s=1.0, requests=1)] * 2  # no tokens at all: no spread
    assert _side(idle, 1)["output_tok_s_cv"] == 0.0


def test_metrics_skip_requests_without_tokens_and_single_tokens_have_no_tpot():
    ev = [TokenEvent(0, None, 1.0), TokenEvent(1, None, 1.0), TokenEvent(2, None, 1.0),
          TokenEvent(1, 7, 1.5),  # request 0 produced nothing; request 1 one token
          TokenEvent(2, 7, 1.2), TokenEvent(2, 7, 1.4)]
    m = metrics_from_events(ev, 3, wall_s=2.0)
    assert m.ttft_s == pytest.approx([0.5, 0.2]) and m.tpot_s == pytest.approx([0.2]) and m.itl_s == pytest.approx([0.2])
    assert m.output_tokens == 3 and m.request_s == pytest.approx(1.5)
    zero = metrics_from_events([], 1, wall_s=0.0)
    assert math.isinf(zero.output_tok_s) and math.isinf(zero.request_s)


def test_warmup_progress_and_budget_are_reported():
    c, r = Curve(), Curve()
    ticks = itertools.count(0.0, 0.123456)
    progress: list[str] = []
    rep = measure(c, r, curve_gate(warmup=3), [[1]] * 5, budget_scale=2.0, on_progress=progress.append,
                  clock=lambda: next(ticks))
    assert c.prompt_counts[0] == 3 and r.prompt_counts[0] == 3 and c.prompt_counts[1:] == [5] * 6
    one = Curve()
    measure(one, Curve(), curve_gate(warmup=1), [[1]] * 5)
    assert one.prompt_counts[0] == 1
    assert progress[0].startswith("concurrency 1, repetition 1 (C/R): ") and progress[1].startswith(
        "concurrency 1, repetition 2 (R/C): ")
    assert rep.budget == {"scale": 2.0, "max_repetitions": 12, "max_seconds": 2e6, "seconds": 0.123,
                          "exhausted": False}
    assert rep.to_json()["budget"] == rep.budget and rep.to_json()["noise"] == rep.noise


def test_level_and_ratio_records():
    rep = measure(Curve(), Curve(), curve_gate(), [[1]] * 5)
    lv = rep.levels[0]
    assert lv.passed and lv.to_json()["passed"] and lv.verdict == "pass"
    assert rep.passed and rep.verdict == "pass" and rep.to_json()["passed"] is True
    d = lv.ratio("throughput").to_json()
    assert d["low"] == lv.ratio("throughput").interval.low and d["high"] == lv.ratio("throughput").interval.high
    assert d["low"] is not None and d["high"] is not None
    from buildctl.validators.speed import RunMetrics, evaluate_level

    few = [RunMetrics([0.1], [0.1], [0.1], 10, 1.0, 1)] * 3  # too few pairs for an interval
    d = evaluate_level(1, few, few, curve_gate()).ratio("throughput").to_json()
    assert d["low"] is None and d["high"] is None
    refs = rep.levels[0].to_json()["reference"]
    assert refs["output_tok_s_per_gpu"] == pytest.approx(refs["output_tok_s"])
    run = RunMetrics([0.001, 0.002, 0.003, 0.004, 0.005], [0.1], [0.1], 10, 1.0, 5)
    assert run.value("ttft_p99") == pytest.approx(4.96e-3) and run.value("ttft_p50") == pytest.approx(3e-3)


def test_the_time_budget_is_measured_from_the_start_not_from_clock_zero():
    """An inconclusive level on a clock that starts at 1000 s: the time budget (5 s) is not spent
    while the clock stands still, and is spent once exactly 5 s have passed."""
    c, r = cand_ref([1.0, 0.5, 1.5], ref_ttft=0.010)
    still = itertools.repeat(1000.0)
    rep = measure(c, r, ttft_gate(max_repetitions=10, max_seconds=5.0), [[1]] * 3, clock=lambda: next(still))
    assert rep.levels[0].verdict == "inconclusive" and rep.levels[0].repetitions == 10
    assert rep.budget["exhausted"] and rep.budget["seconds"] == 0.0
    c, r = cand_ref([1.0, 0.5, 1.5], ref_ttft=0.010)
    steps = itertools.chain([1000.0], itertools.repeat(1005.0))
    rep = measure(c, r, ttft_gate(max_repetitions=10, max_seconds=5.0), [[1]] * 3, clock=lambda: next(steps))
    assert rep.levels[0].repetitions == 6 and rep.budget["exhausted"]  # stopped by time at exactly 5 s


# --- the speed gate looks at the tail (guard: kills a mutant the suite once let through, #20) ---


class TailRunner:
    """Every request's first token after ``base_s``, except the last ``tail`` requests of each
    run, after ``base_s * factor``: the median request is as fast as the reference's, the tail is not."""

    name = "tail"

    def __init__(self, base_s: float, factor: float = 1.0, tail: int = 0) -> None:
        self.base_s, self.factor, self.tail = base_s, factor, tail

    def stream(self, prompts, max_tokens, concurrency):
        n = len(prompts)
        for i in range(n):
            ttft = self.base_s * (self.factor if i >= n - self.tail else 1.0)
            yield TokenEvent(i, None, 100.0)
            for t in range(max_tokens):
                yield TokenEvent(i, 1, 100.0 + ttft + 0.001 * t)


@pytest.mark.guard
def test_same_median_ten_times_the_p99_fails_the_ttft_gate():
    gate = SpeedGate(min_throughput_ratio=1e-9, max_p99_ttft_ratio=1.5, max_p50_ttft_ratio=1.0, concurrency=(1,),
                     input_len=4, output_len=2, num_prompts=100, repetitions=6, max_repetitions=6, max_seconds=1e6,
                     warmup=0)
    cand, ref = TailRunner(0.010, factor=12.0, tail=3), TailRunner(0.010)
    rep = measure(cand, ref, gate, [[1]] * 100)
    lv = rep.levels[0]
    assert lv.ratio("ttft_p50").interval.median == pytest.approx(1.0)  # the median is the same
    assert lv.ratio("ttft_p99").interval.median > 9.0  # the tail is about 10x
    assert rep.verdict == "fail" and any("p99 TTFT ratio" in r and "fails" in r for r in rep.reasons())
    same = measure(TailRunner(0.010), TailRunner(0.010), gate, [[1]] * 100)
    assert same.verdict == "pass"  # the gate is not failing everything
