"""Test-only load and slowness, shared by the speed-gate benchmark and the test suite: busy-loop
processes (one per core) and a runner wrapper that makes the real candidate a fixed factor slower.
Nothing in buildctl imports this module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from buildctl.engines.backend import TokenEvent


@contextmanager
def busy_loops(n: int | None = None) -> Iterator[list[int]]:
    """``n`` (default: one per core) busy-looping processes for the body; killed after it."""
    count = n if n is not None else (os.cpu_count() or 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
             for _ in range(count)]
    try:
        time.sleep(0.2)  # let them reach the loop
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


class SlowedRunner:
    """The real candidate, ``factor`` times slower in every timed metric: each event the inner
    runner produces is held until ``factor`` times the inner runner's own time so far has passed
    since the stream began, and stamped then. The wait spins on the clock: ``time.sleep`` cannot
    wait tens of microseconds (a decode step here) and oversleeps by about 60 us, which made a
    "1.5x" candidate about 2.5x slower at c=1. (A fault injected for the speed gate's detection
    test, never shipped.)"""

    def __init__(self, inner, factor: float) -> None:
        self.inner, self.factor, self.name = inner, factor, f"slowed-{factor:g}x-" + inner.name

    def generate(self, *a, **k):
        return self.inner.generate(*a, **k)

    def stream(self, prompts, max_tokens, concurrency):
        clock = time.perf_counter
        it = iter(self.inner.stream(prompts, max_tokens, concurrency))
        start, spent = clock(), 0.0  # spent: the inner runner's time, without the waits
        while True:
            t0 = clock()
            try:
                ev = next(it)
            except StopIteration:
                return
            spent += clock() - t0
            due = start + self.factor * spent
            while clock() < due:
                pass
            yield TokenEvent(ev.index, ev.token_id, clock())

    def close(self):
        self.inner.close()
