"""What the machine was doing while speed was measured: load average, CPU steal and a fixed
calibration loop timed before and after. Recorded in the attestation so that a noisy run reads as
noisy (a calibration that slowed down, a load above the core count, steal on a shared VM)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def calibration_ms(rounds: int = 3) -> float:
    """Best-of-``rounds`` time of a fixed pure-Python loop (about 10 ms on a quiet 2020s core)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        acc = 0
        for i in range(200_000):
            acc += i * i
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies from /proc/stat's aggregate line; None where unreadable."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    values = [int(v) for v in first[1:]]
    return values[7], sum(values[:8])


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


@dataclass
class NoiseProbe:
    """Started before the measurement, finished after it."""

    load_before: float | None
    calibration_before_ms: float
    cpu_before: tuple[int, int] | None

    @classmethod
    def start(cls) -> "NoiseProbe":
        return cls(_load(), round(calibration_ms(), 3), _cpu_times())

    def finish(self) -> dict[str, Any]:
        after = _cpu_times()
        steal = None
        if self.cpu_before is not None and after is not None and after[1] > self.cpu_before[1]:
            steal = round((after[0] - self.cpu_before[0]) / (after[1] - self.cpu_before[1]), 4)
        return {"cpu_count": os.cpu_count() or 1, "load_avg_1m_before": self.load_before,
                "load_avg_1m_after": _load(), "cpu_steal_fraction": steal,
                "calibration_before_ms": self.calibration_before_ms, "calibration_after_ms": round(calibration_ms(), 3)}
