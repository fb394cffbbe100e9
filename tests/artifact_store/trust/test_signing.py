"""Signing (buildctl.artifact_store.trust.signing): the module's rules called directly first (fast;
`make mutants` runs these first), then signed manifests, channel records and attestations end
to end through the CLI, and rollback protection on nodes."""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest

import buildctl.artifact_store.trust.attestations
from buildctl.artifact_store.channels import set_channel
from buildctl.artifact_store.layout import manifest_signature_prefix
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.trust.attestations import list_attestations
from buildctl.core.times import utc_now
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.errors import SignatureError, StoreArgumentError
from buildctl.artifact_store.layout import channel_key, history_key, manifest_key
from buildctl.artifact_store.trust.signing import (
    SigningKey,
    TrustedKeys,
    generate,
    load_signing_key,
    load_trusted_keys,
    promoter_signers,
    sign_manifest,
    verify_manifest_signature,
)
from buildctl.steps.context import authority_of

from ...support.helpers import PROFILES, make_signer, make_tree, overwrite, settings, staged, write_attestation, write_build_provenance

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
    from buildctl.artifact_store.trust.signing import verify_signature

    before = (at - timedelta(microseconds=1)).isoformat().replace("+00:00", "Z")
    assert verify_signature("r", b"record", sig, trusted, "promoter", signed_at=before) == k.key_id
    for when in (at.isoformat(), (at + timedelta(seconds=1)).isoformat(), None):
        with pytest.raises(SignatureError, match="revoked from 2026-06-01T12:00:00\\+00:00 \\(laptop lost\\)"):
            verify_signature("r", b"record", sig, trusted, "promoter", signed_at=when)


def test_a_signer_is_refused_from_the_moment_of_its_revocation_on(monkeypatch):
    """signer_refusal (what a promoter checks before it signs): refused at and after the revocation
    time, accepted before it; without ``now``, the clock decides."""
    from datetime import datetime, timedelta, timezone

    from buildctl.artifact_store.trust.signing import signer_refusal

    k = make_signer()
    at = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
    trusted = TrustedKeys({"promoter": {k.key_id: k.private.public_key()}}, revoked={k.key_id: (at, "laptop lost")})
    refused = "was revoked from 2026-06-01T12:00:00+00:00 (laptop lost)"
    assert signer_refusal(trusted, k.key_id, "promoter", now=at - timedelta(microseconds=1)) is None
    assert signer_refusal(trusted, k.key_id, "promoter", now=at) == refused
    assert signer_refusal(trusted, k.key_id, "promoter", now=at + timedelta(days=1)) == refused
    assert signer_refusal(trusted, k.key_id, "promoter") == refused  # the clock is past 2026-06-01
    later = dataclasses.replace(trusted, revoked={k.key_id: (datetime.now(timezone.utc) + timedelta(hours=1), "rotation")})
    assert signer_refusal(later, k.key_id, "promoter") is None  # a revocation that takes effect in an hour
    assert signer_refusal(trusted, "0" * 16, "promoter") == "is not a trusted key"


@pytest.mark.parametrize("signature", [["key_id", "sig"], "a string", {"key_id": "k", "sig": 7}])
def test_a_signature_that_is_not_an_object_with_a_string_sig_is_malformed(signature):
    from buildctl.artifact_store.trust.signing import verify_signature

    k = make_signer()
    with pytest.raises(SignatureError, match="malformed signature"):
        verify_signature("r", b"record", signature, trust(promoter=[k]), "promoter")


def test_an_unsigned_manifest_names_its_first_three_malformed_signature_files(tmp_path, draft):
    from buildctl.artifact_store.layout import manifest_signature_key

    store = open_store(str(tmp_path / "store"))
    aid = publish_tree(store, make_tree(tmp_path / "a", {"rank0.engine": b"x"}), draft).artifact_id
    bad = [manifest_signature_key(aid, f"{i:016x}") for i in range(5)]
    for key in bad:
        store.put_bytes(key, b"{}")
    with pytest.raises(SignatureError) as err:
        verify_manifest_signature(store, aid, trust(builder=[make_signer()]))
    assert f"unsigned (5 malformed signature file(s), counted as none: {', '.join(bad[:3])})" in str(err.value)


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


TINY = str(PROFILES / "tiny-llama-cpu.yaml")


@pytest.fixture
def keys(tmp_path, cli):
    d = tmp_path / "keys"
    for role, name in (("builder", "builder"), ("promoter", "promoter"), ("validator", "validator"),
                       ("builder", "intruder")):
        code, out, err = cli("--json", "key", "generate", "--out", d, "--role", role, "--name", name)
        assert code == 0, err
        assert json.loads(out)["trust_as"] == f"$BUILDCTL_TRUSTED_KEYS/{role}/{name}.pub"
    trusted = tmp_path / "trusted"
    for role in ("builder", "promoter", "validator"):
        (trusted / role).mkdir(parents=True)
        (trusted / role / f"{role}.pub").write_bytes((d / f"{role}.pub").read_bytes())
    return d, trusted


def test_key_generate(keys, cli):
    d, _ = keys
    assert stat.S_IMODE(os.stat(d / "builder.key").st_mode) == 0o600
    assert (d / "builder.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    code, _, err = cli("key", "generate", "--out", d, "--role", "builder")
    assert code == 2 and "refusing to overwrite" in err
    code, _, err = cli("key", "generate", "--out", d, "--name", "x")
    assert code == 2 and "--role (missing): one of builder, validator, promoter" in err


class Env:
    def __init__(self, monkeypatch, keys):
        self.mp, (self.d, self.trusted) = monkeypatch, keys

    def as_(self, role: str | None, trust: bool = True) -> None:
        if role:
            self.mp.setenv("BUILDCTL_SIGNING_KEY", str(self.d / f"{role}.key"))
        else:
            self.mp.delenv("BUILDCTL_SIGNING_KEY", raising=False)
        if trust:
            self.mp.setenv("BUILDCTL_TRUSTED_KEYS", str(self.trusted))
        else:
            self.mp.delenv("BUILDCTL_TRUSTED_KEYS", raising=False)


def publish(env: Env, cli, store_dir, tree, role="builder") -> str:
    env.as_(role, trust=False)
    code, out, err = cli("--store", store_dir, "--json", "import", tree, "--profile", TINY)
    assert code == 0, err
    aid = json.loads(out)["artifact_id"]
    if role:  # the provenance its build would have written, signed by the same key as its manifest
        write_build_provenance(open_store(str(store_dir)), aid, signer=authority_of(settings()).signer)
    env.as_("validator", trust=False)
    m = get_manifest(open_store(str(store_dir)), aid)
    write_attestation(open_store(str(store_dir)), aid, m.compat_key, "pass", utc_now(), signer=authority_of(settings()).signer)
    return aid


def prod_past_the_provenance_gate(cli, store_dir, aid: str, why: str) -> bool:
    """Promote to prod an artifact whose provenance is signed as its manifest is: the gate refuses
    it (exit 5, ``why``), so it goes by break-glass, and the node's own checks are what is tested."""
    code, _, err = cli("--store", store_dir, "promote", aid, "--channel", "prod")
    assert code == 5 and why in err, err
    return cli("--store", store_dir, "promote", aid, "--channel", "prod", "--force", "--reason", "test the node")[0] == 0


def pull(cli, store_dir, dest):
    return cli("--store", store_dir, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
               "--dest", dest, "--skip-preflight")


def test_signed_chain_end_to_end_and_rollback_protection(keys, cli, tmp_path, monkeypatch):
    env, store_dir, dest = Env(monkeypatch, keys), tmp_path / "store", tmp_path / "node"
    a = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"engine A"}))
    b = publish(env, cli, store_dir, make_tree(tmp_path / "b", {"rank0.engine": b"engine B"}))
    env.as_("promoter")
    staged(store_dir, a)
    assert cli("--store", store_dir, "promote", a, "--channel", "prod")[0] == 0
    code, out, err = pull(cli, store_dir, dest)
    assert code == 0 and json.loads(out)["artifact_id"] == a, err
    env.as_("promoter")
    staged(store_dir, b)
    assert cli("--store", store_dir, "promote", b, "--channel", "prod")[0] == 0
    assert json.loads(pull(cli, store_dir, dest)[1])["artifact_id"] == b

    # an attacker with bucket write access replays the validly signed record #1 into the ref
    store = open_store(str(store_dir))
    m = get_manifest(store, a)
    ref = store.root / channel_key("tiny-llama-cpu", "prod", m.compat_key)
    ref.write_bytes(store.get_bytes(history_key("tiny-llama-cpu", "prod", m.compat_key, 1)))
    code, _, err = pull(cli, store_dir, dest)
    assert code == 4 and "older than #2 already installed" in err
    assert (dest / "current").resolve().name == b[9:]

    # a legitimate rollback is a new, higher, signed record
    env.as_("promoter")
    code, out, err = cli("--store", store_dir, "--json", "history", "--profile", "tiny-llama-cpu", "--channel", "prod")
    ref.write_bytes(store.get_bytes(history_key("tiny-llama-cpu", "prod", m.compat_key, 2)))  # undo the replay
    code, out, err = cli("--store", store_dir, "--json", "rollback", "--profile", "tiny-llama-cpu", "--channel", "prod")
    assert code == 0 and json.loads(out)["seq"] == 3, err
    code, out, err = pull(cli, store_dir, dest)
    assert code == 0 and json.loads(out)["artifact_id"] == a, err


def test_unsigned_and_wrongly_signed_are_refused(keys, cli, tmp_path, monkeypatch):
    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    unsigned = publish(env, cli, store_dir, make_tree(tmp_path / "u", {"rank0.engine": b"unsigned"}), role=None)
    env.as_("promoter")
    staged(store_dir, unsigned)
    assert prod_past_the_provenance_gate(cli, store_dir, unsigned, "provenance signature: unsigned")
    code, _, err = pull(cli, store_dir, tmp_path / "n1")
    assert code == 4 and f"manifest {unsigned}: unsigned" in err
    assert not (tmp_path / "n1" / "current").exists()

    intruded = publish(env, cli, store_dir, make_tree(tmp_path / "i", {"rank0.engine": b"by intruder"}), role="intruder")
    env.as_("promoter")
    staged(store_dir, intruded)
    assert prod_past_the_provenance_gate(cli, store_dir, intruded, "provenance signature: signed by untrusted key")
    code, _, err = pull(cli, store_dir, tmp_path / "n2")
    assert code == 4 and "untrusted key" in err

    good = publish(env, cli, store_dir, make_tree(tmp_path / "g", {"rank0.engine": b"good"}))
    env.as_("intruder")  # a channel record signed by a key nodes do not trust: refused before it is written
    before = cli("--store", store_dir, "--json", "history", "--profile", "tiny-llama-cpu", "--channel", "prod")[1]
    staged(store_dir, good)
    code, _, err = cli("--store", store_dir, "promote", good, "--channel", "prod")
    assert code == 5 and "nodes trust only promoter keys" in err
    assert cli("--store", store_dir, "--json", "history", "--profile", "tiny-llama-cpu", "--channel", "prod")[1] == before
    trusted_dir = os.environ.pop("BUILDCTL_TRUSTED_KEYS")  # an intruder who knows no trusted keys writes anyway
    try:
        staged(store_dir, good)
        assert cli("--store", store_dir, "promote", good, "--channel", "prod")[0] == 0
    finally:
        os.environ["BUILDCTL_TRUSTED_KEYS"] = trusted_dir
    code, _, err = pull(cli, store_dir, tmp_path / "n3")
    assert code == 4 and "channel record prod" in err and "untrusted key" in err

    env.as_("promoter")
    assert cli("--store", store_dir, "promote", good, "--channel", "prod", "--force", "--reason", "re-sign")[0] == 0
    store = open_store(str(store_dir))
    m = get_manifest(store, good)
    ref = store.root / channel_key("tiny-llama-cpu", "prod", m.compat_key)
    rec = json.loads(ref.read_bytes())
    rec["artifact_id"] = intruded  # tamper with a signed record
    ref.write_bytes(json.dumps(rec).encode())
    code, _, err = pull(cli, store_dir, tmp_path / "n4")
    assert code == 4 and "bad signature" in err
    env.as_(None, trust=False)  # without trusted keys, checksums alone cannot tell
    assert pull(cli, store_dir, tmp_path / "n5")[0] == 0


def test_promote_refuses_an_attestation_signed_by_an_untrusted_key(keys, cli, tmp_path, monkeypatch):
    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    env.as_("builder", trust=False)
    code, out, _ = cli("--store", store_dir, "--json", "import", make_tree(tmp_path / "t", {"e": b"x"}), "--profile", TINY)
    aid = json.loads(out)["artifact_id"]
    store = open_store(str(store_dir))
    env.as_("intruder", trust=False)
    write_attestation(store, aid, get_manifest(store, aid).compat_key, "pass", utc_now(),
                      signer=authority_of(settings()).signer)
    env.as_("promoter")
    staged(store_dir, aid)
    code, _, err = cli("--store", store_dir, "promote", aid, "--channel", "prod")
    assert code == 5 and "attestation signature: signed by untrusted key" in err


def test_gc_removes_an_unreferenced_artifacts_signatures(keys, cli, tmp_path, monkeypatch):
    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    aid = publish(env, cli, store_dir, make_tree(tmp_path / "x", {"rank0.engine": b"unreferenced"}))
    store = open_store(str(store_dir))
    assert list(store.list(manifest_signature_prefix(aid)))
    code, out, _ = cli("--store", store_dir, "--json", "gc", "--keep", "0", "--grace", "0")
    assert code == 0 and json.loads(out)["removed_artifacts"] == [aid]
    assert list(store.list(manifest_signature_prefix(aid))) == [] and list_attestations(store, aid) == []


def test_a_fresh_node_refuses_a_replayed_record_and_one_below_its_min_seq(keys, cli, tmp_path, monkeypatch):
    """A node that never installed from the channel has no sequence of its own to compare with:
    the channel's signed, create-only history is the witness, and --min-seq the provisioned floor."""
    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    a = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"engine A"}))
    b = publish(env, cli, store_dir, make_tree(tmp_path / "b", {"rank0.engine": b"engine B"}))
    env.as_("promoter")
    staged(store_dir, a)
    assert cli("--store", store_dir, "promote", a, "--channel", "prod")[0] == 0
    staged(store_dir, b)
    assert cli("--store", store_dir, "promote", b, "--channel", "prod")[0] == 0
    store = open_store(str(store_dir))
    m = get_manifest(store, a)
    ref = store.root / channel_key("tiny-llama-cpu", "prod", m.compat_key)
    ref.write_bytes(store.get_bytes(history_key("tiny-llama-cpu", "prod", m.compat_key, 1)))  # the replay
    code, _, err = pull(cli, store_dir, tmp_path / "fresh")
    assert code == 4 and "record #1 is stale: the channel's signed history says #2" in err, err
    assert not (tmp_path / "fresh" / "current").exists()
    ref.write_bytes(store.get_bytes(history_key("tiny-llama-cpu", "prod", m.compat_key, 2)))  # undo
    code, out, err = pull(cli, store_dir, tmp_path / "fresh")
    assert code == 0 and json.loads(out)["artifact_id"] == b, err
    code, _, err = cli("--store", store_dir, "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                       "--dest", tmp_path / "new", "--skip-preflight", "--min-seq", "3")
    assert code == 4 and "record #2 is stale: this node's --min-seq says #3" in err, err


def test_a_fresh_node_refuses_an_expired_record_until_it_is_re_signed(keys, cli, tmp_path, monkeypatch):
    """Signed records expire (TUF's timestamp role): a frozen channel (the attacker keeps serving
    the last record) is refused once it expires; the resign step writes a fresh, higher record;
    and a replay of the older record stays refused."""
    import time

    from buildctl.steps.context import Context
    from buildctl.steps.rollouts import resign_due

    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    a = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"engine A"}))
    env.as_("promoter")
    monkeypatch.setenv("BUILDCTL_RECORD_TTL_S", "1")
    staged(store_dir, a)
    code, out, err = cli("--store", store_dir, "--json", "promote", a, "--channel", "prod")
    assert code == 0, err
    rec = json.loads(out)
    assert rec["expires"] > rec["when"]
    time.sleep(1.2)  # the channel is frozen: nobody re-signs it
    code, _, err = pull(cli, store_dir, tmp_path / "fresh")
    assert code == 4 and f"record #1 expired at {rec['expires']}" in err, err
    assert not (tmp_path / "fresh" / "current").exists()

    monkeypatch.setenv("BUILDCTL_RECORD_TTL_S", "3600")
    st = settings(store=str(store_dir))
    store = open_store(str(store_dir))
    new = next(r for r in resign_due(Context.from_settings(st, store=store), margin_s=600) if r.channel == "prod")
    assert new.seq == 2 and new.action == "resign" and new.artifact_id == a and new.previous is None  # content kept
    assert resign_due(Context.from_settings(st, store=store), margin_s=600) == []  # fresh for another hour: nothing due
    code, out, err = pull(cli, store_dir, tmp_path / "fresh")
    assert code == 0 and json.loads(out)["seq"] == 2, err

    m = get_manifest(store, a)
    ref = store.root / channel_key("tiny-llama-cpu", "prod", m.compat_key)
    ref.write_bytes(store.get_bytes(history_key("tiny-llama-cpu", "prod", m.compat_key, 1)))  # the replay
    code, _, err = pull(cli, store_dir, tmp_path / "fresh2")
    assert code == 4 and "record #1 expired" in err, err  # the replayed record is refused (and it is stale too)
    assert not (tmp_path / "fresh2" / "current").exists()


def test_key_files_are_checked_and_ids_are_16_hex(tmp_path, cli, monkeypatch):
    """What the mutation run found unchecked: a nested output directory is created, a garbage or
    non-Ed25519 key file is bad input (exit 2) naming the file, and a key id is 16 hex digits."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

    code, out, err = cli("--json", "key", "generate", "--out", tmp_path / "a" / "b", "--role", "promoter")
    assert code == 0, err
    kid = json.loads(out)["key_id"]
    assert len(kid) == 16 and int(kid, 16) >= 0
    (tmp_path / "garbage.key").write_bytes(b"not a key")
    monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(tmp_path / "garbage.key"))
    code, _, err = cli("--store", tmp_path / "s", "import", make_tree(tmp_path / "t", {"e": b"x"}), "--profile", TINY)
    assert code == 2 and "cannot load signing key" in err and "garbage.key" in err
    ec = generate_private_key(SECP256R1()).private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption())
    (tmp_path / "ec.key").write_bytes(ec)
    monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(tmp_path / "ec.key"))
    code, _, err = cli("--store", tmp_path / "s", "import", make_tree(tmp_path / "t2", {"e": b"y"}), "--profile", TINY)
    assert code == 2 and "is not an Ed25519 private key" in err


def test_trust_is_by_role_a_builder_cannot_vouch_for_its_own_engine(keys, cli, tmp_path, monkeypatch):
    """#21's scenario: the builder key signs the manifest and also a passing attestation; with
    role directories the attestation does not count and promote exits 5 naming the role. A
    manifest signed by the validator or the promoter instead of a builder is refused by pull."""
    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    aid = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"built"}))
    store = open_store(str(store_dir))
    m = get_manifest(store, aid)
    env.as_("builder", trust=False)  # the builder also writes a passing attestation, signed with its own key
    write_attestation(store, aid, m.compat_key, "pass", "2099-01-01T00:00:00.000000Z", signer=authority_of(settings()).signer)
    env.as_("promoter")
    staged(store_dir, aid)
    code, _, err = cli("--store", store_dir, "promote", aid, "--channel", "prod")
    assert code == 5 and "signed by the builder key" in err and "only with a validator signature" in err, err

    for role in ("validator", "promoter"):  # a manifest signed by a key of another role
        other = publish(env, cli, store_dir, make_tree(tmp_path / role, {"rank0.engine": role.encode()}), role=role)
        env.as_("promoter")
        staged(store_dir, other)
        assert prod_past_the_provenance_gate(cli, store_dir, other, f"provenance signature: signed by the {role} key")
        code, _, err = pull(cli, store_dir, tmp_path / f"node-{role}")
        assert code == 4 and f"signed by the {role} key" in err and "only with a builder signature" in err, err


def test_trusted_key_layout_is_checked(keys, cli, tmp_path, monkeypatch):
    d, trusted = keys
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in ("builder", "promoter"):
        (flat / f"{name}.pub").write_bytes((d / f"{name}.pub").read_bytes())
    monkeypatch.setenv("BUILDCTL_TRUSTED_KEYS", str(flat))
    code, _, err = cli("--store", tmp_path / "s", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                       "--dest", tmp_path / "n", "--skip-preflight")
    assert code == 2 and "builder.pub, promoter.pub at the top level" in err and f"{flat}/builder/" in err
    assert "To migrate a flat layout: mkdir -p" in err
    both = tmp_path / "both"
    for role in ("builder", "promoter"):
        (both / role).mkdir(parents=True)
        (both / role / "k.pub").write_bytes((d / "builder.pub").read_bytes())
    monkeypatch.setenv("BUILDCTL_TRUSTED_KEYS", str(both))
    code, _, err = cli("--store", tmp_path / "s", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                       "--dest", tmp_path / "n", "--skip-preflight")
    assert code == 2 and "is in both builder/ and promoter/" in err
    (tmp_path / "odd" / "signers").mkdir(parents=True)
    monkeypatch.setenv("BUILDCTL_TRUSTED_KEYS", str(tmp_path / "odd"))
    code, _, err = cli("--store", tmp_path / "s", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                       "--dest", tmp_path / "n", "--skip-preflight")
    assert code == 2 and "unknown role directories signers" in err


def test_a_pass_whose_own_figures_fail_is_refused(tmp_path, cli, draft):
    """promote recomputes the verdict from the attestation's recorded samples, per-prompt parity
    and thresholds: a `pass` whose figures fail (or that carries no evidence) does not count."""
    from ...support.helpers import attestation

    store = open_store(str(tmp_path / "store"))
    aid = publish_tree(store, make_tree(tmp_path / "t", {"e": b"x"}), draft).artifact_id
    good = attestation(aid, draft.compat_key, "pass")
    slow = good.model_copy(update={"speed": good.speed.model_copy(update={"levels": (good.speed.levels[0].model_copy(
        update={"ratios": (good.speed.levels[0].ratios[0].model_copy(update={"samples": (0.1,) * 6}),
                           good.speed.levels[0].ratios[1])}),)})})
    wrong = good.model_copy(update={"parity": good.parity.model_copy(update={"per_prompt": (
        good.parity.per_prompt[0].model_copy(update={"status": "failed", "position": 3}),)})})
    lax = good.model_copy(update={"speed": good.speed.model_copy(update={"levels": (good.speed.levels[0].model_copy(
        update={"ratios": (good.speed.levels[0].ratios[0].model_copy(update={"threshold": 0.01}),
                           good.speed.levels[0].ratios[1])}),)})})
    bare = attestation(aid, draft.compat_key, "pass", schema_version=1)
    for i, (att, why) in enumerate(((slow, "throughput 0.100 [0.100, 0.100]"), (wrong, "prompts [0] diverged"),
                                    (lax, "gated at 0.2 but the record has threshold 0.01"),
                                    (bare, "schema-1 attestation"))):
        buildctl.artifact_store.trust.attestations.write_attestation(store, att.model_copy(update={"created_at": f"2099-01-01T00:00:0{i}.000000Z"}))
        staged(store, aid)
        code, _, err = cli("--store", store.uri, "promote", aid, "--channel", "prod")
        assert code == 5 and "says pass but its recorded figures give fail" in err and why in err, (why, err)
    buildctl.artifact_store.trust.attestations.write_attestation(store, good.model_copy(update={"created_at": "2099-01-01T00:00:09.000000Z"}))
    staged(store, aid)
    assert cli("--store", store.uri, "promote", aid, "--channel", "prod")[0] == 0


def test_a_revoked_keys_later_signatures_are_refused(keys, cli, tmp_path, monkeypatch):
    """The builder key leaks: a promoter revokes it. What it signed before the revocation still
    counts; a manifest it signs afterwards is refused by pull (exit 4). A revocation signed by a
    key that is not a promoter's revokes nothing."""
    import time

    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    before = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"before the leak"}))
    from buildctl.artifact_store.trust.signing import load_signing_key

    builder_id = load_signing_key(keys[0] / "builder.key").key_id
    env.as_("validator")  # not a promoter: its revocation would count for nothing, so it is refused
    code, _, err = cli("--store", store_dir, "key", "revoke", builder_id, "--reason", "a validator tries")
    assert code == 5 and "is a validator key" in err and "promoter" in err, err
    assert list(open_store(str(store_dir)).list("revocations/")) == []  # nothing written
    env.as_("promoter")
    staged(store_dir, before)
    assert cli("--store", store_dir, "promote", before, "--channel", "prod")[0] == 0
    assert pull(cli, store_dir, tmp_path / "n0")[0] == 0  # the validator's "revocation" revoked nothing
    time.sleep(0.01)
    code, out, err = cli("--store", store_dir, "--json", "key", "revoke", builder_id, "--reason", "leaked in a CI log")
    assert code == 0 and json.loads(out)["key_id"] == builder_id, err
    code, _, err = cli("--store", store_dir, "key", "revoke", builder_id, "--reason", "again")
    assert code == 2 and "already revoked" in err, err  # a no-op revocation is an error
    time.sleep(0.01)
    after = publish(env, cli, store_dir, make_tree(tmp_path / "b", {"rank0.engine": b"after the leak"}))
    env.as_("promoter")
    staged(store_dir, after)
    assert prod_past_the_provenance_gate(cli, store_dir, after, f"provenance signature: signed by key {builder_id}, revoked")
    code, _, err = pull(cli, store_dir, tmp_path / "n1")
    assert code == 4 and f"signed by key {builder_id}, revoked from" in err and "leaked in a CI log" in err, err
    code, _, err = cli("--store", store_dir, "rollback", "--profile", "tiny-llama-cpu", "--channel", "prod")
    assert code == 0, err
    code, out, err = pull(cli, store_dir, tmp_path / "n2")
    assert code == 0 and json.loads(out)["artifact_id"] == before, err  # signed before the revocation: still good
    code, _, err = cli("--store", store_dir, "key", "revoke", "nothex", "--reason", "x")
    assert code == 2


def test_a_two_of_n_prod_promotion_is_pending_with_one_signature_and_completes_with_two(keys, cli, tmp_path,
                                                                                       monkeypatch):
    d, trusted = keys
    code, _, err = cli("key", "generate", "--out", d, "--role", "promoter", "--name", "promoter2")
    assert code == 0, err
    (trusted / "promoter" / "promoter2.pub").write_bytes((d / "promoter2.pub").read_bytes())
    (trusted / "thresholds.json").write_text(json.dumps({"channels": {"prod": 2}}))
    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    a = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"engine A"}))
    b = publish(env, cli, store_dir, make_tree(tmp_path / "b", {"rank0.engine": b"engine B"}))
    env.as_("promoter")
    staged(store_dir, a)
    code, out, err = cli("--store", store_dir, "--json", "promote", a, "--channel", "prod")
    got = json.loads(out)
    assert code == 0 and got["pending"] and (got["signatures"], got["required"], got["missing"]) == (1, 2, 1), err
    assert pull(cli, store_dir, tmp_path / "n0")[0] == 3  # nothing on the channel yet
    code, out, err = cli("--store", store_dir, "promote", a, "--channel", "prod")  # the same key again
    assert code == 0 and "1 of 2 promoter signatures, 1 still missing" in out, err
    monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(d / "promoter2.key"))
    code, out, err = cli("--store", store_dir, "--json", "promote", a, "--channel", "prod")
    assert code == 0 and "pending" not in json.loads(out) and len(json.loads(out)["cosignatures"]) == 1, err
    code, out, err = pull(cli, store_dir, tmp_path / "n1")
    assert code == 0 and json.loads(out)["artifact_id"] == a, err

    # one promoter key alone writes a record straight into the ref: nodes refuse it
    store = open_store(str(store_dir))
    m = get_manifest(store, b)
    env.as_("promoter")
    forged = set_channel(store, b, m, "prod", auth=Authority(who="one promoter", signer=authority_of(settings()).signer))
    assert forged.cosignatures is None
    code, _, err = pull(cli, store_dir, tmp_path / "n2")
    assert code == 4 and "1 of the 2 promoter signatures the channel requires" in err, err
    # a rollback by one promoter to what the quorum approved before is accepted
    code, _, err = cli("--store", store_dir, "rollback", "--profile", "tiny-llama-cpu", "--channel", "prod", "--to", a)
    assert code == 0, err
    code, out, err = pull(cli, store_dir, tmp_path / "n3")
    assert code == 0 and json.loads(out)["artifact_id"] == a, err
    (trusted / "thresholds.json").write_text(json.dumps({"channels": {"prod": 3}}))
    code, _, err = pull(cli, store_dir, tmp_path / "n4")
    assert code == 2 and "prod needs 3 promoter signatures but only 2 promoter key(s)" in err


@pytest.mark.parametrize("body", [b"\x00not json", b"[1, 2]", b'{"key_id": 7}', b'"a string"', b"{}"])
def test_a_malformed_signature_file_is_refused_with_exit_4_not_1(keys, cli, tmp_path, monkeypatch, body):
    """#29 item 7: a manifest signature file that is not JSON, or JSON of the wrong shape, gave exit 1
    and a Python exception name. It counts as no signature: pull refuses the manifest (exit 4),
    naming the file, and a good signature beside it still counts."""
    from buildctl.artifact_store.layout import manifest_signature_key

    env, store_dir = Env(monkeypatch, keys), tmp_path / "store"
    aid = publish(env, cli, store_dir, make_tree(tmp_path / "a", {"rank0.engine": b"signed"}))
    env.as_("promoter")
    staged(store_dir, aid)
    assert cli("--store", store_dir, "promote", aid, "--channel", "prod")[0] == 0
    store = open_store(str(store_dir))
    (good_key,) = list(store.list(manifest_signature_prefix(aid)))
    store.put_bytes(manifest_signature_key(aid, "0" * 16), body)  # beside the good one: it still counts
    code, out, err = pull(cli, store_dir, tmp_path / "n0")
    assert code == 0, err
    overwrite(store, good_key, body)  # now the only one, and malformed
    code, _, err = pull(cli, store_dir, tmp_path / "n1")
    assert code == 4 and "malformed signature" in err and "Traceback" not in err, err
