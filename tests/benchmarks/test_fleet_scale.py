"""The fleet-scale benchmark's seeding and measurement, at a size a test can afford."""

from __future__ import annotations

from benchmarks import fleet_scale
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.layout import NODE_INDEX_META, NODES


def test_the_seeded_store_answers_both_modes_alike_and_the_index_makes_fewer_requests(tmp_path):
    store = open_store(str(tmp_path / "store"))
    profiles, keys, ctx = fleet_scale.seed(store, tmp_path / "seed", 1200)
    assert len(keys) == fleet_scale.KEYS and len(list(store.list(NODES))) == 1200
    ops = fleet_scale.operations(ctx, profiles, keys)
    answers = {}
    for mode in ("records", "index"):
        if mode == "records":
            meta = store.get_bytes(NODE_INDEX_META)
            store.delete(NODE_INDEX_META)
        else:
            store.put_bytes(NODE_INDEX_META, meta)
        status = ops["rollout status --compat-key"](store)
        answers[mode] = [{k: v for k, v in view.to_json().items() if k not in ("bake_left_s", "why")} for view in status]
    assert answers["records"] == answers["index"]
    (view,) = answers["index"]
    assert view["waves"][-1]["nodes"] == 1200 // fleet_scale.KEYS and view["state"] == "active"
    res = fleet_scale.measure(store, ops, reps=2)
    assert store.stat(NODE_INDEX_META) is not None  # put back after the records mode
    for op in fleet_scale.OPERATIONS:
        assert res[op]["records"]["requests"] > 1200 and res[op]["records"]["requests"] > 5 * res[op]["index"]["requests"], op
        assert len(res[op]["index"]["seconds"]) == 2
    assert fleet_scale.growth({1000: 1000.0, 10000: 10000.0}) == "N^1.00"
    assert fleet_scale.growth({1000: 6.0, 100000: 6.0}) == "N^0.00"


def test_counting_store_bills_the_pages_a_caller_reads(tmp_path):
    """As S3 would: one page when reading starts, one more past each 1,000 keys; a caller that
    stops early (a ranged listing) pays only what it read."""
    from benchmarks.counting import CountingStore

    store = open_store(str(tmp_path / "store"))
    for i in range(2001):
        store.put_bytes(f"m/{i:05d}", b"")
    counted = CountingStore(store)
    listed = counted.list("m/")
    assert counted.total() == 0
    assert [next(listed) for _ in range(1000)][-1] == "m/00999" and counted.total() == 1
    next(listed)
    assert counted.total() == 2
    counted.reset()
    assert len(list(counted.list("m/"))) == 2001 and counted.total() == 3
    counted.reset()
    assert list(counted.list("none/")) == [] and counted.total() == 1


def test_a_seeded_store_in_the_work_folder_is_measured_again_without_seeding(tmp_path, monkeypatch):
    calls = []
    real = fleet_scale.seed
    monkeypatch.setattr(fleet_scale, "seed", lambda *a: calls.append(a) or real(*a))
    first = fleet_scale.seeded_store(tmp_path, "local", 30, None)
    again = fleet_scale.seeded_store(tmp_path, "local", 30, None)
    assert len(calls) == 1
    assert again[1] == first[1] and again[3].uri == first[3].uri and again[4] == first[4]
    assert len(list(again[3].list(NODES))) == 30
