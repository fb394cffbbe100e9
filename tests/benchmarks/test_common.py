"""The benchmark helpers every claim rests on: interleaving, medians, per-round ratios."""

from __future__ import annotations

from benchmarks.common import fmt_spread, interleaved, round_ratios, spread


def test_interleaved_alternates_the_order_and_times_every_round():
    calls: list[str] = []
    times = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "c": lambda: calls.append("c")},
                        reps=4, before=lambda name: calls.append("before " + name))
    assert [c for c in calls if not c.startswith("before")] == list("abccbaabccba")
    assert calls[:2] == ["before a", "a"]
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}


def test_spread_and_round_ratios():
    assert spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert spread([4.0, 1.0, 2.0, 3.0]) == (2.5, 1.0, 4.0)
    assert fmt_spread([1.0, 2.0, 4.0]) == "2.00 (1.00-4.00)"
    times = {"ours": [1.0, 3.0], "x": [2.0, 1.0], "y": [4.0, 2.0]}
    assert round_ratios(times, "ours", ["x", "y"]) == [0.5, 3.0], "each round against that round's fastest"
