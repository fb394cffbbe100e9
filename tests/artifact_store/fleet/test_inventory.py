"""Node records under hashed shard prefixes (#32): ``inventory/nodes/<2 hex>/<id>.json``, with the
records written before the shards still read, and moved by the node's next write."""

from __future__ import annotations

from buildctl.steps import fleet
from buildctl.artifact_store.fleet.inventory import NodeRecord, read_inventory, read_node
from buildctl.artifact_store.layout import NODES, legacy_node_key, node_key, node_shard
from buildctl.core.digest import canonical_json
from buildctl.engines.fingerprint import detect


def _legacy(store, node_id: str, profiles=("p",)) -> None:
    """A node record as buildctl wrote it before the shards."""
    rec = NodeRecord(node_id=node_id, fingerprint={}, compat_keys={"aoti": "k"}, profiles=profiles,
                     reported_at="2026-12-01T00:00:00Z")
    assert store.cas(legacy_node_key(node_id), canonical_json(rec.model_dump(mode="json")), None)


def test_records_spread_over_256_shards():
    shards = {node_shard(f"gpu-node-{i:05d}") for i in range(5000)}
    assert len(shards) == 256 and all(len(s) == 2 for s in shards)
    assert node_key("gpu-1") == f"{NODES}{node_shard('gpu-1')}/gpu-1.json"


def test_a_store_written_before_the_shards_is_read_and_moved_by_each_nodes_next_report(store):
    for i in range(3):
        _legacy(store, f"old-{i}")
    assert read_node(store, "old-0")[0].node_id == "old-0"  # found at its legacy key
    assert sorted(n.node_id for n in read_inventory(store)) == ["old-0", "old-1", "old-2"]
    res = fleet.report_node(store, "old-0", detect(), ["p"])
    assert res.previous is not None and res.previous.node_id == "old-0"  # the old record was the current one
    assert res.record.reports == res.previous.reports + 1  # carried over from the legacy record
    assert store.get_ref(node_key("old-0")) is not None
    assert store.get_ref(legacy_node_key("old-0")) is None  # this writer may delete: the copy is gone
    fleet.report_node(store, "new-0", detect(), ["p"])
    assert store.get_ref(legacy_node_key("new-0")) is None and store.get_ref(node_key("new-0")) is not None
    assert sorted(n.node_id for n in read_inventory(store)) == ["new-0", "old-0", "old-1", "old-2"]


def test_a_legacy_copy_the_writer_may_not_delete_is_shadowed(store, monkeypatch):
    """The node role may not delete node records: after a move the legacy copy stays, and readers
    take the shard's record, once."""
    _legacy(store, "gpu-7", profiles=("before",))
    real = store.delete

    def refuse(key: str) -> None:
        if key.startswith(NODES):
            from buildctl.artifact_store.errors import StoreUnavailableError

            raise StoreUnavailableError(store.uri, f"delete {key}: credentials refused (AccessDenied)")
        real(key)

    monkeypatch.setattr(store, "delete", refuse)
    fleet.report_node(store, "gpu-7", detect(), ["after"])
    assert store.get_ref(legacy_node_key("gpu-7")) is not None  # left behind
    (only,) = read_inventory(store)
    assert only.profiles == ("after",) and read_node(store, "gpu-7")[0].profiles == ("after",)
    fleet.report_node(store, "gpu-7", detect(), ["again"])  # later writes go to the shard only
    now = read_node(store, "gpu-7")[0]
    assert now.profiles == ("again",) and now.reports == only.reports + 1  # read back from the shard, not the copy


# --- malformed input, each alone (`make mutants` sees these) ---------------------------------------


def test_a_malformed_node_record_is_an_error_or_skipped_naming_its_artifacts(store):
    import pytest

    from buildctl.artifact_store.errors import CorruptObjectError

    _legacy(store, "good")
    body = b'{"node_id": "bad", "engines": [{"artifact_id": "xxh3-128:' + b"a" * 32 + b'"'
    assert store.cas(node_key("bad"), body, None)
    with pytest.raises(CorruptObjectError, match="malformed node record"):
        read_node(store, "bad")
    with pytest.raises(CorruptObjectError, match="malformed node record"):
        read_inventory(store)
    skipped, named = [], set()
    assert [n.node_id for n in read_inventory(store, skipped, named)] == ["good"]
    assert skipped == [(node_key("bad"), "malformed node record")] and named == {"xxh3-128:" + "a" * 32}
    assert read_node(store, "nobody") is None


def test_node_ids_are_checked():
    import pytest

    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.artifact_store.fleet.inventory import check_node_id

    check_node_id("gpu-node_1.a")
    for bad in ("", "-lead", "a/b", "a b", "x" * 254):
        with pytest.raises(StoreArgumentError, match="bad node id"):
            check_node_id(bad)


def test_an_update_that_keeps_losing_its_compare_and_swap_gives_up(store, monkeypatch):
    import pytest

    from buildctl.artifact_store.fleet import inventory
    from buildctl.artifact_store.errors import CasConflictError

    monkeypatch.setattr(store, "cas", lambda *_a: False)
    monkeypatch.setattr(inventory.time, "sleep", lambda _s: None)
    rec = NodeRecord(node_id="n1", fingerprint={}, compat_keys={}, profiles=("p",), reported_at="2026-12-01T00:00:00Z")
    with pytest.raises(CasConflictError):
        inventory.update_node(store, "n1", lambda _cur: rec, attempts=3)


def test_a_held_marker_that_does_not_parse_is_skipped(store):
    from buildctl.artifact_store.fleet.inventory import held_markers, read_held
    from buildctl.artifact_store.layout import HELD_INDEX

    rec = NodeRecord(node_id="n1", fingerprint={}, compat_keys={}, profiles=("p",), reported_at="2026-12-01T00:00:00Z")
    assert held_markers(rec) == set()
    from buildctl.artifact_store.layout import held_key

    art = "xxh3-128:00" + "1" * 30
    store.put_bytes(f"{HELD_INDEX}00{'0' * 30}/no-dot-here", b"")  # sorts before the good marker
    store.put_bytes(held_key(art, "n1", "current"), b"")
    assert read_held(store) == {art: {"current": {"n1"}}}


def test_a_record_deleted_between_the_listing_and_its_read_is_passed_over(store, monkeypatch):
    for i in range(3):
        _legacy(store, f"n{i}")
    real = store.get_ref
    monkeypatch.setattr(store, "get_ref", lambda key: None if key == legacy_node_key("n0") else real(key))
    assert sorted(n.node_id for n in read_inventory(store)) == ["n1", "n2"]


# --- each rule of the records alone (`make mutants` sees them) ----------------------------------------


def test_the_records_are_frozen():
    import pydantic
    import pytest

    from buildctl.artifact_store.fleet.inventory import EngineState, PullFailure

    failure = PullFailure(artifact_id="a", profile="p", channel="prod", compat_key="k", error="E: x", when="t")
    state = EngineState(profile="p", channel="prod", compat_key="k", artifact_id="a", seq=1, status="healthy",
                        current="a", when="t")
    rec = NodeRecord(node_id="n1", fingerprint={}, compat_keys={}, reported_at="t")
    for obj, field in ((failure, "error"), (state, "status"), (rec, "node_id")):
        with pytest.raises(pydantic.ValidationError, match="frozen"):
            setattr(obj, field, "changed")


def test_a_record_written_before_the_report_count_existed_reads_as_one_report():
    rec = NodeRecord.model_validate({"node_id": "n1", "fingerprint": {}, "compat_keys": {}, "reported_at": "t"})
    assert rec.reports == 1


def test_a_node_keeps_its_ten_latest_refused_pulls_newest_last(store):
    from buildctl.artifact_store.fleet.inventory import MAX_PULL_FAILURES, PullFailure

    fp = detect()
    fleet.report_node(store, "n1", fp, ["p"])
    for i in range(12):
        fleet.record_pull_failure(store, "n1", fp, PullFailure(artifact_id=f"a{i}", profile="p", channel="prod",
                                                               compat_key="k", error="E: x", when="t"))
    kept = [f.artifact_id for f in read_node(store, "n1")[0].pull_failures]
    assert MAX_PULL_FAILURES == 10 and kept == [f"a{i}" for i in range(2, 12)]


def test_the_token_read_node_returns_is_the_one_a_compare_and_swap_needs(store):
    fleet.report_node(store, "n1", detect(), ["p"])
    rec, token = read_node(store, "n1")
    assert isinstance(token, str)
    changed = rec.model_copy(update={"reports": rec.reports + 1})
    assert store.cas(node_key("n1"), canonical_json(changed.model_dump(mode="json")), token)
    assert read_node(store, "n1")[0].reports == rec.reports + 1


def test_a_gc_protection_names_its_holders_and_counts_only_those_past_the_examples():
    from buildctl.artifact_store.fleet.inventory import EngineState, node_protections

    def node(i):
        e = EngineState(profile="p", channel="prod", compat_key="k", artifact_id="a", seq=1, status="healthy",
                        current="a", when="t")
        return NodeRecord(node_id=f"n{i}", fingerprint={}, compat_keys={}, reported_at="t", engines=(e,))

    (three,) = node_protections([node(i) for i in range(3)], examples=3)
    assert three[1].endswith(": n0, n1, n2") and "more" not in three[1], three
    (four,) = node_protections([node(i) for i in range(4)], examples=3)
    assert four[1].endswith(": n0, n1, n2 and 1 more"), four
