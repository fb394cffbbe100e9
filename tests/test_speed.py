"""Speed metrics from streamed events, and the gate, on synthetic and scripted runners."""

from __future__ import annotations

import time

import pytest

from buildctl.engines.backend import TokenEvent
from buildctl.engines.profile import SpeedGate
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
    return SpeedGate(**{"min_throughput_ratio": 0.8, "max_p99_ttft_ratio": 2.0, "concurrency": (1, 2),
                        "input_len": 4, "output_len": 4, "num_prompts": 4, "repetitions": 2, "warmup": 1, **kw})


def test_equal_runners_pass_and_the_sides_interleave():
    a, b = Scripted(0.002), Scripted(0.002)
    order = []
    rep = measure(a, b, gate(), [[1]] * 4, on_progress=order.append)
    assert rep.passed
    assert all(0.5 < lv.throughput_ratio < 2.0 for lv in rep.levels)
    sides = [m.split(", ")[2].split(":")[0] for m in order]
    assert sides[:4] == ["candidate", "reference", "reference", "candidate"]
    assert a.calls == b.calls == 2 * (1 + 2)  # warm-up + repetitions, per level


def test_slow_candidate_fails_throughput_gate():
    rep = measure(Scripted(0.008), Scripted(0.001), gate(), [[1]] * 4)
    assert not rep.passed
    assert any("throughput ratio" in r for r in rep.reasons())
    assert all(lv.throughput_ratio < 0.5 for lv in rep.levels)


def test_slow_first_token_fails_ttft_gate():
    rep = measure(Scripted(0.001, first_s=0.03), Scripted(0.001), gate(min_throughput_ratio=0.01), [[1]] * 4)
    assert not rep.passed and all("p99 TTFT ratio" in r for r in rep.reasons())
    d = rep.to_dict()
    assert d["levels"][0]["candidate"]["ttft_p99_ms"] > d["levels"][0]["reference"]["ttft_p99_ms"]
    assert {"output_tok_s_min", "output_tok_s_max", "output_tok_s_cv", "tpot_p50_ms", "itl_p99_ms",
            "request_throughput", "output_tok_s_per_gpu"} <= set(d["levels"][0]["candidate"])
