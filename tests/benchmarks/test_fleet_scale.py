"""The fleet-scale benchmark's seeding and measurement, at a size a test can afford."""

from __future__ import annotations

from benchmarks import fleet_scale
from buildctl.artifact_store.backend import open_store
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
