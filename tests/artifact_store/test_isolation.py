"""One malformed record never stalls store-wide maintenance (#29 item 6): gc, scrub and ls report
it with its key and go on."""

from __future__ import annotations

import json

import buildctl.artifact_store as ops
from buildctl.artifact_store.layout import channel_key

from ..support.helpers import overwrite, publish_files, staged


def test_a_malformed_channel_ref_is_reported_and_skipped_by_gc_and_scrub(store, store_uri, tmp_path, draft, cli,
                                                                         s3_env_if_needed):
    good = publish_files(store, tmp_path / "g", draft, {"config.json": b"{}", "rank0.engine": 4096}, seed=1)
    ops.promote(store, staged(store, good), "prod")
    other = publish_files(store, tmp_path / "o", draft, {"config.json": b"[]", "rank0.engine": 4096}, seed=2)
    ops.promote(store, other, "staging")
    overwrite(store, channel_key(draft.profile_name, "staging", draft.compat_key), b'{"seq": "not a record"')
    code, out, err = cli("--store", store_uri, "--json", "gc", "--dry-run", "--keep", "0", "--grace", "0s")
    assert code != 1 and "Traceback" not in err
    assert code in (0, 10), err  # completed (10: with skipped records)
    assert channel_key(draft.profile_name, "staging", draft.compat_key) in out + err
    assert code == 10 and other not in json.loads(out)["removed_artifacts"]  # what the bad ref might guard is kept
    code, out, err = cli("--store", store_uri, "--json", "gc", "--keep", "0", "--grace", "0s")
    assert code == 10 and ops.get_manifest(store, other) and ops.get_manifest(store, good)
    code, out, err = cli("--store", store_uri, "--json", "scrub")
    assert code == 10 and channel_key(draft.profile_name, "staging", draft.compat_key) in out + err, err
    assert good in json.dumps(json.loads(out))
