"""Many store requests at once, and one large prefix listed as ranges at once.

A LIST is sequential within one prefix (each page of 1,000 keys starts where the last ended), and
a fleet-wide operation makes many small independent requests (a channel ref, a manifest, a ref's
markers). One after another they cost their latencies added up: at 100,000 nodes on SeaweedFS a
rollout tick took 17.5 s in 218 requests. Here they run :data:`LIST_WORKERS` at a time:

* :func:`map_bounded`: one function over many items (the refs of a tick, the manifests a
  reconcile reads), results in the items' order;
* :func:`list_ranges`: one prefix as several key ranges, each listed from its own ``start_after``
  and stopped at its end (``Store.list`` reads pages as the caller reads keys), so a prefix of
  100,000 markers is 16 runs of about 6 pages instead of one of 100. A prefix of up to 2,000
  keys costs the pages it did. The ranges cover every key whatever the bounds: the first goes
  on from the first page and the last runs to the prefix's end. Only a store
  that says ``ranged_lists = True`` (S3, where a LIST waits on the network) is listed in ranges;
  a local directory is walked once, which is faster than walking it in 16 pieces.

The pool is :func:`buildctl.artifact_store.backends.pools.interruptible_pool`: an interrupt does not wait
for requests in flight.
"""

from __future__ import annotations

from itertools import islice
from typing import Callable, Iterable, TypeVar

from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.backends.pools import interruptible_pool

LIST_WORKERS = 16  # requests in flight at once (S3: one connection each; the client pools 84)
HEX = "0123456789abcdef"
PAGE = 1000  # keys in one S3 LIST page
PLAIN_PAGES = 2  # pages read plainly before the rest is split: at most 16 extra requests, only past 2,000 keys

T = TypeVar("T")
R = TypeVar("R")


def map_bounded(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` with up to ``workers`` (default :data:`LIST_WORKERS`) calls at
    once; the first error raised is raised here (the calls not yet started are cancelled)."""
    items = list(items)
    workers = workers or LIST_WORKERS
    if len(items) <= 1 or workers <= 1:
        return [fn(x) for x in items]
    with interruptible_pool(min(workers, len(items)), "buildctl-list") as (pool, _stop):
        return list(pool.map(fn, items))


def hex_bounds(prefix: str) -> list[str]:
    """Bounds that split keys whose next character after ``prefix`` is a hex digit into 16 ranges
    (``prefix0…`` up to ``prefix1``, then ``prefix1…``, …): for keys that go on with a digest.

    A bound must not be a whole path segment of a key: SeaweedFS (not S3) skips the folder
    ``p/a/`` when ``StartAfter`` is ``p/a``, and would lose its keys. A digest segment is 32
    characters or more, so a bound one character into it never is one."""
    return [prefix + c for c in HEX[1:]]


def list_ranges(store: Store, prefix: str, bounds: Iterable[str], workers: int | None = None) -> list[str]:
    """Every key under ``prefix``, in order. The first :data:`PLAIN_PAGES` pages are read plainly,
    so a prefix that fits in them costs what a plain LIST costs (ranges cost a request each, even
    a nearly empty one). The rest is listed as the ranges (last key read, b1], (b1, b2], …,
    (bn, …) at once, over the bounds above the last key read.
    Bounds outside the prefix are ignored; on a store without ``ranged_lists`` it is one plain LIST."""
    keys = store.list(prefix)
    if not getattr(store, "ranged_lists", False):
        return list(keys)
    first = list(islice(keys, PLAIN_PAGES * PAGE))
    if len(first) < PLAIN_PAGES * PAGE:
        return first
    cuts = sorted({b for b in bounds if b.startswith(prefix) and b > first[-1]})

    def one(i: int) -> list[str]:
        end = cuts[i] if i < len(cuts) else None
        out = []
        for key in keys if i == 0 else store.list(prefix, start_after=cuts[i - 1]):  # the first range goes on from page 1
            if end is not None and key > end:
                break
            out.append(key)
        return out

    return first + [key for part in map_bounded(one, range(len(cuts) + 1), workers) for key in part]
