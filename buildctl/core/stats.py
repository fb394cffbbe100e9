"""Statistics of the speed gate: a distribution-free interval for the median paired ratio, and the
three-way verdict it supports.

Each repetition of the speed workload runs candidate and reference back to back and yields one
ratio per metric (candidate / reference). Ratios from one pair share the machine's state at that
moment, so they are the quantity analysed; the spread between repetitions is what the interval
reflects.

The interval is the classic order-statistic (sign-test) confidence interval for a median: with
``n`` ratios sorted, ``[x(k), x(n-k+1)]`` covers the true median with probability
``1 - 2 * P(Binomial(n, 1/2) <= k - 1)``, whatever the ratios' distribution. ``k`` is the largest
index that keeps that coverage at or above the requested level. Below a minimum sample size no
``k`` does (``min_samples``): the interval is unbounded and the verdict inconclusive.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["pass", "fail", "inconclusive"]


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(0, min(k, n) + 1)) / 2 ** n


def order_statistic_rank(n: int, confidence: float) -> int | None:
    """The largest ``k`` (1-based) whose interval ``[x(k), x(n-k+1)]`` has coverage >= ``confidence``;
    None when even ``[min, max]`` falls short."""
    alpha = 1.0 - confidence
    best = None
    for k in range(1, n // 2 + 1):
        if 2 * _binom_cdf_half(k - 1, n) <= alpha + 1e-12:
            best = k
        else:
            break
    return best


def min_samples(confidence: float) -> int:
    """The fewest ratios for which the order-statistic interval reaches ``confidence``
    (6 for 95%, 8 for 99%)."""
    n = 1
    while order_statistic_rank(n, confidence) is None:
        n += 1
    return n


@dataclass(frozen=True)
class Interval:
    """The median of ``n`` paired ratios and its distribution-free confidence interval."""

    median: float
    low: float
    high: float
    confidence: float
    n: int

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def describe(self) -> str:
        if not self.bounded:
            return f"{self.median:.3f} (n={self.n}: too few repetitions for a {self.confidence:.0%} interval)"
        return f"{self.median:.3f} [{self.low:.3f}, {self.high:.3f}] ({self.confidence:.0%}, n={self.n})"


def median_interval(samples: list[float], confidence: float) -> Interval:
    """The median of ``samples`` and its order-statistic interval at ``confidence``."""
    if not samples:
        return Interval(math.nan, -math.inf, math.inf, confidence, 0)
    xs = sorted(samples)
    n = len(xs)
    k = order_statistic_rank(n, confidence)
    if k is None:
        return Interval(statistics.median(xs), -math.inf, math.inf, confidence, n)
    return Interval(statistics.median(xs), xs[k - 1], xs[n - k], confidence, n)


def gate_verdict(interval: Interval, threshold: float, bound: Literal["min", "max"]) -> Verdict:
    """``pass`` when the whole interval is on the good side of ``threshold``, ``fail`` when the whole
    interval is on the bad side, ``inconclusive`` when it straddles it. ``bound="min"``: the ratio
    must be at least ``threshold``; ``"max"``: at most."""
    lo, hi = interval.low, interval.high
    if math.isnan(interval.median):
        return "inconclusive"
    if bound == "min":
        if lo >= threshold:
            return "pass"
        return "fail" if hi < threshold else "inconclusive"
    if hi <= threshold:
        return "pass"
    return "fail" if lo > threshold else "inconclusive"


def combine(verdicts: list[Verdict]) -> Verdict:
    """Any fail fails; otherwise any inconclusive is inconclusive; otherwise pass."""
    if "fail" in verdicts:
        return "fail"
    return "inconclusive" if "inconclusive" in verdicts else "pass"
