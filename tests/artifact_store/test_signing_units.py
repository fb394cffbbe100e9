"""The signing module's rules, called directly (fast; `make mutants` runs these first)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from buildctl.artifact_store.backend import open_store
from buildctl.artifact_store.errors import SignatureError, StoreArgumentError
from buildctl.artifact_store.layout import manifest_key
from buildctl.artifact_store.signing import (
    SigningKey,
    TrustedKeys,
    generate,
    load_signing_key,
    load_trusted_keys,
    promoter_signers,
    sign_manifest,
    verify_manifest_signature,
)

from ..support.helpers import make_signer



def trust(**roles: list[SigningKey]) -> TrustedKeys:
    return TrustedKeys({r: {k.key_id: k.private.public_key() for k in keys} for r, keys in roles.items()})


def trust_dir(tmp_path, promoters: int = 2):
    d = tmp_path / "trusted"
    for i in range(promoters):
        _, pub, _ = generate(tmp_path / "gen", f"p{i}")
        (d / "promoter").mkdir(parents=True, exist_ok=True)
        (d / "promoter" / pub.name).write_bytes(pub.read_bytes())
    return d


def test_default_threshold_is_one_signature():
    assert TrustedKeys({}).threshold("prod") == 1
    assert TrustedKeys({}, thresholds={"prod": 2}).threshold("prod") == 2


@pytest.mark.parametrize("body,why", [
    ("{not json", "ValueError"),
    ('{"other": 1}', "KeyError"),
    ('{"channels": ["prod"]}', "AttributeError"),
    ('{"channels": {"prod": null}}', "TypeError"),
    ('{"channels": {"prod": "two"}}', "ValueError"),
])
def test_a_malformed_thresholds_file_is_a_clear_error(tmp_path, body, why):
    d = trust_dir(tmp_path)
    (d / "thresholds.json").write_text(body)
    with pytest.raises(StoreArgumentError, match=r'expected \{"channels": \{"prod": 2\}\}'):
        load_trusted_keys(d)


def test_an_unreadable_thresholds_file_is_a_clear_error(tmp_path):
    d = trust_dir(tmp_path)
    (d / "thresholds.json").mkdir()  # reading it raises IsADirectoryError, an OSError
    with pytest.raises(StoreArgumentError, match="expected"):
        load_trusted_keys(d)


def test_thresholds_must_be_at_least_one(tmp_path):
    d = trust_dir(tmp_path)
    (d / "thresholds.json").write_text('{"channels": {"prod": 1, "staging": 2}}')
    assert load_trusted_keys(d).thresholds == {"prod": 1, "staging": 2}
    (d / "thresholds.json").write_text('{"channels": {"prod": 0}}')
    with pytest.raises(StoreArgumentError, match=r"at least 1 \(prod\)"):
        load_trusted_keys(d)


def test_promoter_signers_skips_signatures_that_do_not_verify():
    a, b, outsider = make_signer(), make_signer(), make_signer()
    trusted = trust(promoter=[a, b])
    data = b"record"
    sigs = [outsider.sign(data), None, a.sign(b"other bytes"), a.sign(data), b.sign(data), b.sign(data)]
    assert promoter_signers(data, sigs, trusted, None) == {a.key_id, b.key_id}
    assert promoter_signers(data, sigs[:3], trusted, None) == set()


def test_sign_manifest_signs_the_given_bytes_or_the_stored_manifest(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    aid = "xxh3-128:" + "ab" * 16
    body = json.dumps({"created_at": "2026-01-01T00:00:00Z"}).encode()
    store.put_bytes(manifest_key(aid), body)
    k = make_signer()
    trusted = trust(builder=[k])
    assert sign_manifest(store, aid, k) == k.key_id  # reads the stored manifest
    assert verify_manifest_signature(store, aid, trusted) == k.key_id
    other = "xxh3-128:" + "cd" * 16
    store.put_bytes(manifest_key(other), body)
    k2 = make_signer()
    sign_manifest(store, other, k2, body=b"bytes that are not the manifest")  # signs what it is given
    with pytest.raises(SignatureError, match="bad signature"):
        verify_manifest_signature(store, other, trust(builder=[k2]))


def test_keys_and_trust_are_frozen(tmp_path):
    k = make_signer()
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.key_id = "0" * 16  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        trust(builder=[k]).by_role = {}  # type: ignore[misc]


def test_generated_key_loads_and_matches_its_id(tmp_path):
    key_path, pub_path, kid = generate(tmp_path, "k")
    loaded = load_signing_key(key_path)
    assert loaded is not None and loaded.key_id == kid and len(kid) == 16
    assert load_signing_key(None) is None


def test_a_revoked_key_counts_only_on_records_made_before_its_revocation():
    from datetime import datetime, timedelta, timezone

    k = make_signer()
    at = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
    trusted = TrustedKeys({"promoter": {k.key_id: k.private.public_key()}}, revoked={k.key_id: (at, "laptop lost")})
    sig = k.sign(b"record")
    from buildctl.artifact_store.signing import verify_signature

    before = (at - timedelta(microseconds=1)).isoformat().replace("+00:00", "Z")
    assert verify_signature("r", b"record", sig, trusted, "promoter", signed_at=before) == k.key_id
    for when in (at.isoformat(), (at + timedelta(seconds=1)).isoformat(), None):
        with pytest.raises(SignatureError, match="revoked from 2026-06-01T12:00:00\\+00:00 \\(laptop lost\\)"):
            verify_signature("r", b"record", sig, trusted, "promoter", signed_at=when)


def test_generate_refuses_when_either_file_exists(tmp_path):
    (tmp_path / "k.pub").write_text("")
    with pytest.raises(StoreArgumentError, match="refusing to overwrite"):
        generate(tmp_path, "k")
    (tmp_path / "j.key").write_text("")
    with pytest.raises(StoreArgumentError, match="refusing to overwrite"):
        generate(tmp_path, "j")


def test_a_trusted_key_that_is_not_a_key(tmp_path):
    d = trust_dir(tmp_path, promoters=1)
    (d / "builder").mkdir()
    (d / "builder" / "bad.pub").write_text("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n")
    with pytest.raises(StoreArgumentError, match="cannot load trusted key .*bad.pub"):
        load_trusted_keys(d)
