"""Thread pools that an interrupt does not wait for.

``with ThreadPoolExecutor() as pool`` waits for every running task when the block exits, on an
exception too: a Ctrl-C 9 s into a pull exited only when its in-flight downloads had finished.
:func:`interruptible_pool` cancels the queued tasks on any exception and tells the running ones
to stop at their next chunk (:data:`Stop`). On an error it then waits for them (a chunk's time),
so the caller's cleanup does not race a task still writing; on an interrupt (``KeyboardInterrupt``,
SIGTERM's ``Terminated``) it returns at once. The CLI then exits
without joining the threads (``os._exit``), after the caller has removed what it staged: what is
half-written is what a crash leaves, which the store and the install directory already survive.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

Stop = threading.Event


class StoppedError(Exception):
    """A pool task that noticed its pool was stopped (raised in the worker; nobody waits for it)."""


@contextmanager
def interruptible_pool(workers: int, name: str = "buildctl") -> Iterator[tuple[ThreadPoolExecutor, Stop]]:
    """A pool of ``workers`` threads and the event its tasks poll between chunks."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=name)
    try:
        yield pool, stop
    except Exception:
        # An error: the running tasks stop at their next chunk and are waited for, so that the
        # caller's cleanup (removing its staging) does not race a task still writing there.
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    except BaseException:  # an interrupt: return at once (what is half-written, a crash also leaves)
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def check(stop: Stop | None) -> None:
    """In a task: stop here if the pool was stopped."""
    if stop is not None and stop.is_set():
        raise StoppedError("stopped")
