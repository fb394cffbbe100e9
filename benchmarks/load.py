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
    """The real candidate, ``factor`` times slower in every timed metric: after each event the
    inner runner produces, wait ``factor - 1`` times as long as producing it took, and stamp the
    event when the wait ends. (A fault injected for the speed gate's detection test, never shipped.)"""

    def __init__(self, inner, factor: float) -> None:
        self.inner, self.factor, self.name = inner, factor, f"slowed-{factor:g}x-" + inner.name

    def generate(self, *a, **k):
        return self.inner.generate(*a, **k)

    def stream(self, prompts, max_tokens, concurrency):
        it = iter(self.inner.stream(prompts, max_tokens, concurrency))
        while True:
            t0 = time.perf_counter()
            try:
                ev = next(it)
            except StopIteration:
                return
            time.sleep((time.perf_counter() - t0) * (self.factor - 1))
            yield TokenEvent(ev.index, ev.token_id, time.perf_counter())

    def close(self):
        self.inner.close()
