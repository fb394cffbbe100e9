"""A store written before BLAKE3 keeps serving, and ``buildctl rehash`` upgrades its artifacts
(buildctl.artifact_store.upkeep.rehash). The old artifacts are written as the old code wrote them
(:func:`publish_schema1`), and so are their channel records (no ``manifest_blake3``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from buildctl.artifact_store.channels import read_channel
from buildctl.artifact_store.promotion import promote, rollback
from buildctl.artifact_store.read import get_manifest, verify
import buildctl.artifact_store.channels as channels_mod
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.errors import CryptoRequiredError, VerificationError
from buildctl.artifact_store.gc import gc
from buildctl.artifact_store.node.install_dir import activate_staged, current_artifact, stage_artifact
from buildctl.artifact_store.layout import blob_key, manifest_key
from buildctl.artifact_store.promotion import promotion_refusals
from buildctl.artifact_store.node.pull import pull
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.upkeep.rehash import rehash, successors
from buildctl.artifact_store.trust.signing import TrustedKeys, verify_manifest_signature
from buildctl.core.times import utc_now

from ...support.helpers import make_signer, make_tree, publish_schema1, rot, write_attestation
from buildctl.artifact_store.node.pull import resolve_channel


@pytest.fixture
def old_store(store, tmp_path, draft, monkeypatch):
    """Two schema 1 artifacts, signed and validated, on staging (both, one after the other) and prod
    (the first), every record written without a manifest BLAKE3."""
    builder, promoter, validator = make_signer(), make_signer(), make_signer()
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()},
                           "promoter": {promoter.key_id: promoter.private.public_key()},
                           "validator": {validator.key_id: validator.private.public_key()}})
    ids = []
    for i in range(2):
        root = make_tree(tmp_path / f"t{i}", {"config.json": f"{i}".encode(), "rank0.engine": 30_000 + i}, seed=i)
        aid = publish_schema1(store, root, draft, signer=builder)
        write_attestation(store, aid, draft.compat_key, "pass", signer=validator)
        ids.append(aid)
    with monkeypatch.context() as m:
        m.setattr(channels_mod, "manifest_blake3", lambda store, a: None)  # the promote of before
        for aid in ids:
            promote(store, aid, "staging", auth=Authority(signer=promoter, trusted=trusted))
        promote(store, ids[0], "prod", auth=Authority(signer=promoter, trusted=trusted))
    return store, ids, trusted, builder, promoter


def test_an_old_store_keeps_serving_every_channel(old_store, tmp_path, draft, cli, store_uri, s3_env_if_needed):
    store, (a, b), trusted, _, promoter = old_store
    P, K = draft.profile_name, [draft.compat_key]
    for channel, want in (("staging", b), ("prod", a)):
        rec = read_channel(store, P, channel, draft.compat_key)[0]
        assert rec.manifest_blake3 is None  # as written before BLAKE3
        dest = tmp_path / channel
        got = pull(store, resolve_channel(store, P, channel, K), dest, auth=Authority(trusted=trusted))
        assert got.installed and current_artifact(dest) == want
        assert not pull(store, resolve_channel(store, P, channel, K), dest, auth=Authority(trusted=trusted)).installed  # the next poll: current
        assert verify(store, want, deep=True).schema_version == 1
    # staged and activated offline, as a driver upgrade does
    rec = read_channel(store, P, "prod", draft.compat_key)[0]
    entry, _ = stage_artifact(store, rec, a, tmp_path / "staged", when=utc_now())
    res = activate_staged(tmp_path / 'staged', entry, auth=Authority(trusted=trusted, verify_window_s=3600), now=datetime.now(timezone.utc))
    assert res.installed and current_artifact(tmp_path / "staged") == a
    # a rollback and a new promotion of an old artifact still work; the new record binds its manifest
    rec = promote(store, b, "prod", auth=Authority(signer=promoter, trusted=trusted))
    assert rec.bound(b) is not None
    assert current_artifact(tmp_path / "prod") == a and pull(store, resolve_channel(store, P, 'prod', K), tmp_path / 'prod', auth=Authority(trusted=trusted)).installed
    rollback(store, P, "prod", auth=Authority(signer=promoter), reason="test")
    assert gc(store, dry_run=True).removed_artifacts == []
    # and the CLI says what they are
    code, out, _ = cli("--store", store_uri, "show", a)
    assert code == 0 and "xxh3-128 ONLY (schema 1)" in out
    code, out, err = cli("--store", store_uri, "verify", a, "--deep", "--require-crypto")
    assert code == 4 and "--require-crypto" in err and "buildctl rehash" in err
    with pytest.raises(CryptoRequiredError):
        pull(store, resolve_channel(store, P, 'staging', K), tmp_path / 'strict', auth=Authority(trusted=trusted, require_crypto=True))


def test_rehash_publishes_a_signed_blake3_manifest_linked_to_the_old_one(old_store, tmp_path, draft):
    store, (a, b), trusted, builder, promoter = old_store
    res = rehash(store, a, auth=Authority(signer=builder))
    new = get_manifest(store, res.new)
    old = get_manifest(store, a)
    assert res.new != a and not res.existed and new.crypto and new.rehashed_from == a
    assert new.same_files(old) and all(f.blake3 for f in new.files) and successors(store, a) == [res.new]
    assert verify_manifest_signature(store, res.new, trusted) == builder.key_id
    assert rehash(store, a, auth=Authority(signer=builder)).new == res.new  # again: the same artifact
    assert rehash(store, res.new).new == res.new  # a schema 2 artifact: nothing to do
    # the old validation counts for it (the same files), so it promotes through staging to prod
    assert promotion_refusals(store, res.new, new, Authority(trusted=trusted)) == []
    auth = Authority(signer=promoter, trusted=trusted)
    promote(store, res.new, "staging", auth=auth)
    rec = promote(store, res.new, "prod", auth=auth)
    assert rec.bound(res.new) is not None
    got = pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), tmp_path / 'node', auth=Authority(trusted=trusted, require_crypto=True))
    assert got.installed and got.artifact_id == res.new


def test_rehash_of_a_damaged_artifact_refuses_and_quarantines_it(old_store, draft):
    store, (a, _), _, builder, _ = old_store
    digest = next(e.digest for e in get_manifest(store, a).files if e.path == "rank0.engine")
    rot(store, digest, "flip")
    with pytest.raises(VerificationError) as exc:
        rehash(store, a, auth=Authority(signer=builder))
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "digest")]
    assert active_quarantine(store, a) is not None and successors(store, a) == []
    assert store.stat(blob_key(digest)) is not None and store.stat(manifest_key(a)) is not None
