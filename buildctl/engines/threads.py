"""Intra-op CPU threads of the engines running in this process (torch's OpenMP pool, which both
the aoti engine and the in-process vLLM CPU reference use).

On a shared CPU host, a pool of spin-waiting threads is at the mercy of every other process: one
thread descheduled holds the whole step at its barrier, so a busy neighbour slows a step by an
unpredictable factor. One thread per side slows evenly instead, which the paired speed gate then
cancels (benchmarks/results/speedgate.md). ``torch._C.set_num_threads`` is called directly:
vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op once its engine starts.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` intra-op threads (None: leave the setting alone), then restore it."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch._C.set_num_threads(n)
    try:
        yield
    finally:
        torch._C.set_num_threads(before)


def set_intra_op_threads(n: int) -> None:
    """Set this process's intra-op threads for good (a child process that serves one engine)."""
    import torch

    torch._C.set_num_threads(n)
