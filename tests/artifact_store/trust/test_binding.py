"""Content bound by BLAKE3-256 (buildctl.artifact_store.trust.binding, docs/threat-model.md): an attacker
who can write a blob cannot satisfy a signed manifest with other bytes.

The attack is real, not stubbed: :func:`xxh3_collision` builds two different files with one
xxh3-128 digest, and the attacker's file is written over the signed artifact's blob, as a
principal with store write access (a compromised builder, a repair role, a pull-through cache) can.
"""

from __future__ import annotations

import pytest
import xxhash

from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.trust.attestations import list_attestations
import buildctl.artifact_store.channels as channels_mod
from buildctl.artifact_store.trust.attestations import write_attestation
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.trust.binding import check_bound, manifest_blake3
from buildctl.artifact_store.channels import read_channel, set_channel
from buildctl.artifact_store.errors import CorruptObjectError, CryptoRequiredError, VerificationError
from buildctl.artifact_store.node.install_dir import current_artifact
from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
from buildctl.artifact_store.layout import blob_key, channel_key
from buildctl.artifact_store.promotion import promotion_refusals
from buildctl.artifact_store.node.pull import pull
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.upkeep.repair import repair, tree_source
from buildctl.artifact_store.trust.signing import TrustedKeys
from buildctl.core.digest import crypto_bytes, digest_bytes

from ...support.helpers import attestation, make_signer, make_tree, overwrite, publish_schema1, xxh3_collision
from buildctl.artifact_store.node.pull import resolve_channel


def test_the_constructed_pair_has_one_xxh3_128_and_two_blake3_digests():
    a, b = xxh3_collision()
    assert a != b and len(a) == len(b)
    assert xxhash.xxh3_128_hexdigest(a) == xxhash.xxh3_128_hexdigest(b)
    assert digest_bytes(a) == digest_bytes(b) and crypto_bytes(a) != crypto_bytes(b)
    a2, b2 = xxh3_collision(50_000, seed=7)  # any size past the short-input paths, any content
    assert digest_bytes(a2) == digest_bytes(b2) != digest_bytes(a)


def _keys():
    builder, promoter = make_signer(), make_signer()
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()},
                           "promoter": {promoter.key_id: promoter.private.public_key()}})
    return builder, promoter, trusted


def _signed(store, tmp_path, draft, *, schema1: bool = False):
    """A signed artifact whose engine file is one half of a colliding pair, on a signed prod ref.
    Returns (artifact, the attacker's bytes, the honest bytes, trusted keys, promoter)."""
    good, evil = xxh3_collision(40_000)
    root = make_tree(tmp_path / "engine", {"config.json": b'{"a": 1}', "rank0.engine": good})
    builder, promoter, trusted = _keys()
    if schema1:
        aid = publish_schema1(store, root, draft, signer=builder)
    else:
        aid = publish_tree(store, root, draft, auth=Authority(signer=builder)).artifact_id
    set_channel(store, aid, get_manifest(store, aid), "prod", auth=Authority(signer=promoter))
    return aid, evil, good, trusted, promoter


def test_a_node_with_trusted_keys_refuses_a_colliding_blob_by_blake3(store, tmp_path, draft):
    aid, evil, good, trusted, _ = _signed(store, tmp_path, draft)
    m = get_manifest(store, aid)
    entry = next(e for e in m.files if e.path == "rank0.engine")
    assert m.crypto and entry.digest == digest_bytes(evil)  # the attacker's bytes pass every xxh3 check
    overwrite(store, blob_key(entry.digest), evil)
    dest = tmp_path / "node"
    with pytest.raises(VerificationError) as exc:
        pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), dest, auth=Authority(trusted=trusted))
    assert [(p.path, p.kind, p.expected) for p in exc.value.problems] == [("rank0.engine", "blake3", entry.blake3)]
    assert "blake3 mismatch" in str(exc.value) and current_artifact(dest) is None
    # the store's own deep check finds it too, by BLAKE3 (xxh3 alone passes), and quarantines it
    with pytest.raises(VerificationError) as exc:
        verify_deep_or_quarantine(store, aid, detector="scrub", auth=Authority())
    assert exc.value.problems[0].kind == "blake3" and active_quarantine(store, aid) is not None
    # the honest bytes, whose BLAKE3 proves them, are put back by a repair: then it serves again
    fixed = repair(store, aid, tree_source(tmp_path / "engine"), auth=Authority())
    assert fixed.replaced == ["rank0.engine"] and fixed.healthy
    got = pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), dest, auth=Authority(trusted=trusted))
    assert got.installed and (dest / "current" / "rank0.engine").read_bytes() == good


def test_a_schema_1_artifact_falls_to_the_collision_and_require_crypto_refuses_it(store, tmp_path, draft):
    aid, evil, _, trusted, _ = _signed(store, tmp_path, draft, schema1=True)
    m = get_manifest(store, aid)
    assert not m.crypto
    overwrite(store, blob_key(next(e.digest for e in m.files if e.path == "rank0.engine")), evil)
    # Why BLAKE3 is needed: with xxh3-128 only, a signed manifest and a trusted node install the
    # attacker's bytes.
    old = tmp_path / "old-node"
    assert pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), old, auth=Authority(trusted=trusted)).installed
    assert (old / "current" / "rank0.engine").read_bytes() == evil
    dest = tmp_path / "node"
    with pytest.raises(CryptoRequiredError, match="schema 1.*xxh3-128 digests only.*buildctl rehash"):
        pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), dest, auth=Authority(trusted=trusted, require_crypto=True))
    assert current_artifact(dest) is None and not (dest / "versions").exists() or not any((dest / "versions").iterdir())
    # an engine already current is held to the policy too (from the manifest kept beside it)
    with pytest.raises(CryptoRequiredError):
        pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), old, auth=Authority(trusted=trusted, require_crypto=True))


def test_a_channel_record_binds_the_manifest_bytes_and_a_record_binding_other_bytes_is_refused(store, tmp_path, draft):
    aid, _, _, trusted, promoter = _signed(store, tmp_path, draft)
    rec, token = read_channel(store, draft.profile_name, "prod", draft.compat_key)
    assert rec.manifest_blake3 == {aid: manifest_blake3(store, aid)} and rec.bound(aid).startswith("blake3:")
    # A promoter-signed record that binds other manifest bytes to the id (what a colliding
    # manifest would need): the manifest store's xxh3 check passes, the BLAKE3 one refuses.
    forged = rec.model_copy(update={"manifest_blake3": {aid: "blake3:" + "0" * 64}, "signature": None})
    forged = forged.model_copy(update={"signature": promoter.sign(forged.signed_bytes())})
    assert store.cas(channel_key(draft.profile_name, "prod", draft.compat_key), forged.to_bytes(), token)
    with pytest.raises(CorruptObjectError, match="other bytes with the same xxh3-128 id"):
        pull(store, resolve_channel(store, draft.profile_name, 'prod', [draft.compat_key]), tmp_path / 'node', auth=Authority(trusted=trusted))


def test_require_crypto_refuses_a_record_written_before_blake3(store, tmp_path, draft, monkeypatch):
    aid, _, _, trusted, promoter = _signed(store, tmp_path, draft)
    monkeypatch.setattr(channels_mod, "manifest_blake3", lambda store, a: None)  # what a pre-BLAKE3 promote wrote
    rec = set_channel(store, aid, get_manifest(store, aid), "canary", auth=Authority(signer=promoter))
    monkeypatch.undo()
    assert rec.manifest_blake3 is None and b"manifest_blake3" not in rec.to_bytes()
    assert pull(store, resolve_channel(store, draft.profile_name, 'canary', [draft.compat_key]), tmp_path / 'a', auth=Authority(trusted=trusted)).installed
    with pytest.raises(CryptoRequiredError, match="carries no BLAKE3 of its manifest"):
        pull(store, resolve_channel(store, draft.profile_name, 'canary', [draft.compat_key]), tmp_path / 'b', auth=Authority(trusted=trusted, require_crypto=True))


def test_an_attestation_binds_the_manifest_bytes_it_validated(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store

    store = open_store(f"file://{tmp_path / 'store'}")
    aid = publish_tree(store, make_tree(tmp_path / "t", {"a": b"1"}), draft).artifact_id
    m = get_manifest(store, aid)
    write_attestation(store, attestation(aid, draft.compat_key))
    stored = list_attestations(store, aid)[-1]
    assert stored.attestation.manifest_blake3 == manifest_blake3(store, aid)
    assert promotion_refusals(store, aid, m, Authority()) == []
    write_attestation(store, attestation(aid, draft.compat_key, manifest_blake3="blake3:" + "e" * 64))
    assert any("not evidence for these bytes" in r for r in promotion_refusals(store, aid, m, Authority()))


def test_quarantine_records_carry_the_manifest_blake3_and_old_ones_keep_their_bytes(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.quarantine import QuarantineRecord, quarantine

    store = open_store(f"file://{tmp_path / 'store'}")
    aid = publish_tree(store, make_tree(tmp_path / "t", {"a": b"1"}), draft).artifact_id
    signer = make_signer()
    _, rec = quarantine(store, aid, "test", auth=Authority(signer=signer))
    assert rec.manifest_blake3 == manifest_blake3(store, aid)
    old = QuarantineRecord(artifact_id=aid, action="lift", reason="r", who="w", when="2026-01-01T00:00:00Z")
    assert b"manifest_blake3" not in old.signed_bytes()  # a record written before it signs the same bytes


def test_check_bound_passes_the_bytes_a_record_binds(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.read import get_manifest_and_bytes

    store = open_store(f"file://{tmp_path / 'store'}")
    aid = publish_tree(store, make_tree(tmp_path / "t", {"a": b"1"}), draft).artifact_id
    m, body = get_manifest_and_bytes(store, aid)
    check_bound(aid, body, m, crypto_bytes(body), require_crypto=True)
    check_bound(aid, body, m, None, require_crypto=False)
    with pytest.raises(CorruptObjectError):
        check_bound(aid, body, m, crypto_bytes(body + b" "), require_crypto=False)
