"""`buildctl export-signature` (#33 item 3): an OpenSSF Model Signing bundle that the
``model-signing`` package's own verifier (1.1.1, public-key mode) accepts for an installed engine,
and refuses after one flipped byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.node.install_dir import install_artifact
from buildctl.artifact_store.quarantine import quarantine

from ...support.helpers import make_signer, make_tree, publish_files, publish_schema1


def _verify(engine: Path, bundle: Path, pub: Path) -> None:
    """model-signing's public-key verification, as its API documents it (hashing guessed from the bundle)."""
    from model_signing import verifying

    verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(engine, bundle)


def _verify_cli(engine: Path, bundle: Path, pub: Path) -> subprocess.CompletedProcess:
    """model-signing's own command line, as a user types it."""
    return subprocess.run([sys.executable, "-m", "model_signing", "verify", "key", "--signature", str(bundle),
                           "--public_key", str(pub), str(engine)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def export_key(tmp_path, cli):
    code, out, err = cli("--json", "key", "generate", "--out", tmp_path / "keys", "--role", "promoter", "--ecdsa-p256")
    assert code == 0, err
    info = json.loads(out)
    assert info["algorithm"] == "ecdsa-p256"
    return Path(info["private_key"]), Path(info["public_key"])


def _installed(store, tmp_path, draft) -> tuple[str, Path]:
    files = {"config.json": b'{"a": 1}', "rank0.engine": 3 * 1024 * 1024 + 5, "lora/adapter.bin": 4096}
    aid = publish_files(store, tmp_path / "tree", draft, files, seed=3, auth=Authority(signer=make_signer()))
    node = tmp_path / "node"
    install_artifact(store, aid, node)
    return aid, (node / "current").resolve()  # model-signing refuses a model path that is a symlink


def test_an_installed_engine_verifies_with_model_signing_and_not_after_one_flipped_byte(store, tmp_path, draft,
                                                                                           cli, export_key):
    key, pub = export_key
    aid, engine = _installed(store, tmp_path, draft)
    bundle = tmp_path / "model.sig"
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", bundle)
    assert code == 0, err
    _verify(engine, bundle, pub)
    doc = json.loads(bundle.read_text())
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    # the signed digests are the manifest's BLAKE3, not a second read of the engine
    from base64 import b64decode

    from buildctl.artifact_store.read import get_manifest

    stmt = json.loads(b64decode(doc["dsseEnvelope"]["payload"]))
    assert {r["name"]: r["digest"] for r in stmt["predicate"]["resources"]} == {
        f.path: f.blake3.split(":")[1] for f in get_manifest(store, aid).files}
    # a symlink in the engine directory is not followed by the verifier
    assert stmt["predicate"]["serialization"] == {"method": "files", "hash_type": "blake3", "allow_symlinks": False}
    assert stmt["subject"][0]["name"] == f"{draft.profile_name}-{aid.split(':')[1][:12]}"  # the default name
    # one flipped byte in the installed engine: refused, naming the file
    target = engine / "rank0.engine"
    data = bytearray(target.read_bytes())
    data[1_000_000] ^= 0x01
    target.chmod(0o644)
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="rank0.engine"):
        _verify(engine, bundle, pub)


def test_the_sha256_form_verifies_with_model_signings_own_command(store, tmp_path, draft, cli, export_key):
    """model-signing 1.1.1's `verify key` command re-hashes with SHA-256 whatever the bundle says;
    --sha256-from signs SHA-256 read from an installed copy, each file checked against the manifest."""
    key, pub = export_key
    aid, engine = _installed(store, tmp_path, draft)
    blake = tmp_path / "blake3.sig"
    assert cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", blake)[0] == 0
    res = _verify_cli(engine, blake, pub)
    assert res.returncode == 1 and "Hash mismatch" in res.stderr  # the command's limit, shown
    sha = tmp_path / "sha256.sig"
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", sha, "--sha256-from", engine)
    assert code == 0, err
    res = _verify_cli(engine, sha, pub)
    assert res.returncode == 0 and "Verification succeeded" in res.stdout, res.stderr
    _verify(engine, sha, pub)
    target = engine / "config.json"
    target.chmod(0o644)
    target.write_bytes(b'{"a": 2}')
    assert _verify_cli(engine, sha, pub).returncode == 1
    # and a copy that is not the manifest's bytes is never signed
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", tmp_path / "x.sig",
                       "--sha256-from", engine)
    assert code == 4 and "config.json: digest mismatch" in err, err
    assert not (tmp_path / "x.sig").exists()


def test_export_signature_refuses_what_it_must_not_sign(store, tmp_path, draft, cli, export_key):
    key, _ = export_key
    old = publish_schema1(store, make_tree(tmp_path / "old", {"rank0.engine": 5000}), draft)
    code, _, err = cli("--store", store.uri, "export-signature", old, "--key", key, "--out", tmp_path / "a.sig")
    assert code == 4 and "rehash" in err, err  # xxh3 only: nothing cryptographic to sign
    ed25519 = tmp_path / "ed"
    assert cli("key", "generate", "--out", ed25519, "--role", "promoter")[0] == 0
    aid = publish_files(store, tmp_path / "new", draft, {"rank0.engine": 6000})
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", ed25519 / "promoter.key",
                       "--out", tmp_path / "b.sig")
    assert code == 2 and "not an ECDSA P-256" in err, err
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--out", tmp_path / "c.sig")
    assert code == 2 and "BUILDCTL_EXPORT_KEY" in err, err
    code, _, err = cli("key", "generate", "--out", tmp_path / "v", "--role", "validator", "--ecdsa-p256")
    assert code == 2 and "the promoter's" in err, err
    quarantine(store, aid, "rotted", problems=["rank0.engine: digest mismatch"], auth=Authority())
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", tmp_path / "d.sig")
    assert code == 5 and "quarantined" in err, err
    assert not any((tmp_path / f"{n}.sig").exists() for n in "abcd")


def test_a_copy_missing_files_is_refused_naming_each(store, tmp_path, draft, cli, export_key):
    key, _ = export_key
    aid, engine = _installed(store, tmp_path, draft)
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(engine, copy)
    (copy / "config.json").unlink()
    (copy / "lora" / "adapter.bin").unlink()
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", tmp_path / "m.sig",
                       "--sha256-from", copy, "--model-name", "llama-prod")
    assert code == 4 and err.count("No such file or directory") == 2, err
    assert f"{copy / 'config.json'}: No such file or directory" in err, err  # the reason, not the errno repr
    assert f"{copy / 'lora' / 'adapter.bin'}: No such file or directory" in err, err
    code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", key, "--out", tmp_path / "n.sig",
                       "--model-name", "llama-prod")
    assert code == 0, err
    from base64 import b64decode

    stmt = json.loads(b64decode(json.loads((tmp_path / "n.sig").read_text())["dsseEnvelope"]["payload"]))
    assert stmt["subject"][0]["name"] == "llama-prod"


def test_an_export_key_that_cannot_be_loaded_is_an_argument_error(store, tmp_path, draft, cli):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    aid = publish_files(store, tmp_path / "a", draft, {"rank0.engine": 6000})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    locked = tmp_path / "locked.pem"
    locked.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    for path in (tmp_path / "absent.pem", garbage, locked):  # OSError, ValueError, TypeError (a password is needed)
        code, _, err = cli("--store", store.uri, "export-signature", aid, "--key", path, "--out", tmp_path / "x.sig")
        assert code == 2 and f"cannot load export key {path}" in err, (path, err)
    assert not (tmp_path / "x.sig").exists()
