"""One malformed record never stalls store-wide maintenance (#29 item 6): gc, scrub and ls report
it with its key and go on."""

from __future__ import annotations

import json

from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.layout import channel_key

from ..support.helpers import overwrite, publish_files, staged


def test_a_malformed_channel_ref_is_reported_and_skipped_by_gc_and_scrub(store, store_uri, tmp_path, draft, cli,
                                                                         s3_env_if_needed):
    good = publish_files(store, tmp_path / "g", draft, {"config.json": b"{}", "rank0.engine": 4096}, seed=1)
    promote(store, staged(store, good), "prod")
    other = publish_files(store, tmp_path / "o", draft, {"config.json": b"[]", "rank0.engine": 4096}, seed=2)
    promote(store, other, "staging")
    overwrite(store, channel_key(draft.profile_name, "staging", draft.compat_key), b'{"seq": "not a record"')
    code, out, err = cli("--store", store_uri, "--json", "gc", "--dry-run", "--keep", "0", "--grace", "0s")
    assert code != 1 and "Traceback" not in err
    assert code in (0, 10), err  # completed (10: with skipped records)
    assert channel_key(draft.profile_name, "staging", draft.compat_key) in out + err
    assert code == 10 and other not in json.loads(out)["removed_artifacts"]  # what the bad ref might guard is kept
    code, out, err = cli("--store", store_uri, "--json", "gc", "--keep", "0", "--grace", "0s")
    assert code == 10 and get_manifest(store, other) and get_manifest(store, good)
    code, out, err = cli("--store", store_uri, "--json", "scrub")
    assert code == 10 and channel_key(draft.profile_name, "staging", draft.compat_key) in out + err, err
    assert good in json.dumps(json.loads(out))


def test_a_malformed_quarantine_record_is_reported_and_its_artifact_treated_as_quarantined(
        store, store_uri, tmp_path, draft, cli, s3_env_if_needed):
    """One malformed quarantine record made gc, scrub and ls fail store-wide (exit 4). Now each
    lists the others, names the record (exit 10), and treats that artifact as quarantined: gc
    keeps it (its retention runs from now), scrub does not call it ok, ls marks it."""
    from buildctl.artifact_store.trust.authority import Authority
    from buildctl.artifact_store.quarantine import quarantine

    bad = publish_files(store, tmp_path / "b", draft, {"config.json": b"{}", "rank0.engine": 4096}, seed=1)
    fine = publish_files(store, tmp_path / "f", draft, {"config.json": b"[]", "rank0.engine": 4096}, seed=2)
    key, _ = quarantine(store, bad, "suspect", auth=Authority(who="test"))
    overwrite(store, key, b'{"action": "lift"')  # truncated: it cannot say which it was
    code, out, err = cli("--store", store_uri, "--json", "ls")
    assert code == 10 and key in err, err
    rows = {r["artifact_id"]: r for r in json.loads(out)}
    assert rows[bad]["quarantined"] and not rows[fine]["quarantined"]
    code, out, err = cli("--store", store_uri, "--json", "gc", "--keep", "0", "--grace", "0s",
                         "--quarantine-retention", "0s")
    assert code == 10 and key in out + err, err
    assert bad not in json.loads(out)["removed_artifacts"] and fine in json.loads(out)["removed_artifacts"]
    assert get_manifest(store, bad)
    code, out, err = cli("--store", store_uri, "--json", "scrub")
    assert code == 10 and key in out + err, err
    assert [r["status"] for r in json.loads(out)["artifacts"] if r["artifact_id"] == bad] in ([], ["quarantined"])


def test_a_malformed_node_record_is_reported_and_what_it_names_is_kept(store, store_uri, tmp_path, draft, cli,
                                                                      s3_env_if_needed):
    """A malformed inventory record made gc fail with exit 1 (a pydantic traceback name). Now gc
    names it (exit 10) and keeps every artifact its bytes still name; the fleet plan passes over it."""
    from buildctl.steps import fleet
    from buildctl.artifact_store.layout import node_key

    ran = publish_files(store, tmp_path / "r", draft, {"config.json": b"{}", "rank0.engine": 4096}, seed=1)
    loose = publish_files(store, tmp_path / "l", draft, {"config.json": b"[]", "rank0.engine": 4096}, seed=2)
    store.cas(node_key("gpu-1"), json.dumps({"node_id": "gpu-1", "engines": [{"current": ran}]}).encode(), None)
    code, out, err = cli("--store", store_uri, "--json", "gc", "--keep", "0", "--grace", "0s")
    assert code == 10 and node_key("gpu-1") in out + err, err
    removed = json.loads(out)["removed_artifacts"]
    assert ran not in removed and loose in removed
    skipped: list = []
    assert fleet.fleet_plan(store, {}, None, skipped) == [] and skipped[0][0] == node_key("gpu-1")
