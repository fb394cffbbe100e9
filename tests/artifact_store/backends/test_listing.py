"""Bounded concurrency and ranged listings (buildctl/artifact_store/backends/listing.py), on both stores."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from buildctl.artifact_store.backends import listing
from buildctl.artifact_store.backends.listing import hex_bounds, list_ranges, map_bounded


def _put_all(store, keys):
    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(lambda k: store.put_bytes(k, b""), keys))


@pytest.fixture
def ranged(store, monkeypatch):
    """The store listed in ranges (the local one too), with pages of 4 keys, so a few dozen keys
    take the ranged path."""
    monkeypatch.setattr(listing, "PAGE", 4)
    monkeypatch.setattr(store, "ranged_lists", True, raising=False)
    return store


def test_list_ranges_returns_exactly_the_plain_listing(ranged):
    """Every key once, in order, whatever the bounds: bounds equal to keys, between them, before
    and after all of them, outside the prefix, and keys that do not go on with hex."""
    rng = random.Random(7)
    prefix = "inventory/index/held/"
    keys = [f"{prefix}{rng.choice('0123456789abcdef')}{rng.randrange(16**6):06x}/n{i}.current" for i in range(60)]
    keys += [f"{prefix}-odd/n1.current", f"{prefix}zz/n2.current", f"{prefix}f", f"{prefix}1"]  # outside the hex split
    _put_all(ranged, keys + ["inventory/index/other/x", "inventory/index/hel"])
    plain = list(ranged.list(prefix))
    assert plain == sorted(keys)
    for bounds in (hex_bounds(prefix), [], [f"{prefix}1", keys[5], keys[5], "elsewhere/", prefix],
                   sorted(keys)[::3], [f"{prefix}{c}" for c in "!-05~"]):
        assert list_ranges(ranged, prefix, bounds) == plain, bounds
    assert list_ranges(ranged, "inventory/index/none/", hex_bounds("inventory/index/none/")) == []


def test_a_short_prefix_costs_a_plain_listing(ranged):
    """Up to PLAIN_PAGES pages, the ranges are not used: no request is spent on them."""
    prefix = "inventory/index/demand/p/aoti/"
    keys = [f"{prefix}aoti-{c}{i}/n{i}" for i, c in enumerate("0123456789abcdef" * 2)][:2 * 4 - 1]
    _put_all(ranged, keys)
    calls = []
    real = ranged.list
    ranged.list = lambda p, start_after=None: (calls.append(start_after), real(p, start_after=start_after))[1]
    assert list_ranges(ranged, prefix, hex_bounds(f"{prefix}aoti-")) == sorted(keys)
    assert calls == [None]
    more = [f"{prefix}aoti-{c}0/late" for c in "9abcdef"]
    _put_all(ranged, more)
    calls.clear()
    assert list_ranges(ranged, prefix, hex_bounds(f"{prefix}aoti-")) == sorted(keys + more)
    assert calls[0] is None and len(calls) > 1  # past two pages: the rest in ranges, each from its bound


def test_a_store_without_ranged_lists_is_listed_once(store, monkeypatch):
    monkeypatch.setattr(listing, "PAGE", 2)
    monkeypatch.setattr(store, "ranged_lists", False, raising=False)
    _put_all(store, [f"p/{c}" for c in "0123456789abcdef"])
    calls = []
    real = store.list
    store.list = lambda p, start_after=None: (calls.append(start_after), real(p, start_after=start_after))[1]
    assert list_ranges(store, "p/", hex_bounds("p/")) == [f"p/{c}" for c in "0123456789abcdef"]
    assert calls == [None]


def test_map_bounded_keeps_order_overlaps_calls_and_raises_the_first_error():
    in_flight, most, lock = 0, 0, threading.Lock()

    def slow(x: int) -> int:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.02)
        with lock:
            in_flight -= 1
        return x * x

    assert map_bounded(slow, range(40), workers=4) == [x * x for x in range(40)]
    assert 2 <= most <= 4  # overlapped, and never more than the bound
    assert map_bounded(slow, [3]) == [9] and map_bounded(slow, []) == []

    def boom(x: int) -> int:
        if x == 5:
            raise ValueError("five")
        return x

    with pytest.raises(ValueError, match="five"):
        map_bounded(boom, range(20), workers=3)


def test_each_range_stops_reading_at_its_bound(ranged):
    """A range reads at most one key past its bound (the one that ends it): the ranges together
    read about the prefix once, not once per range (on S3 each page read past a bound is a request)."""
    prefix = "inventory/index/held/"
    keys = [f"{prefix}{c}{i:031x}/n.current" for c in "0123456789abcdef" for i in range(3)]
    _put_all(ranged, keys)
    read = []
    real = ranged.list

    def counting(p, start_after=None):
        for key in real(p, start_after=start_after):
            read.append(key)
            yield key

    ranged.list = counting
    assert list_ranges(ranged, prefix, hex_bounds(prefix)) == sorted(keys)
    assert len(read) <= len(keys) + 16, len(read)
