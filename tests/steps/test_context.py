"""buildctl.steps.context: one Context per command, its key files read once, its authority handed to
the store."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import buildctl.artifact_store.trust.signing as signing
import buildctl.steps.context as context_mod
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import open_store
from buildctl.steps.context import Context
from buildctl.core.errors import BadInputError

from ..support.helpers import PROFILES, make_tree, settings, write_attestation, staged


@pytest.fixture
def keys(tmp_path, cli):
    d = tmp_path / "keys"
    for role in ("builder", "promoter", "validator"):
        code, _, err = cli("--json", "key", "generate", "--out", d, "--role", role)
        assert code == 0, err
    trusted = tmp_path / "trusted"
    for role in ("builder", "promoter", "validator"):
        (trusted / role).mkdir(parents=True)
        (trusted / role / f"{role}.pub").write_bytes((d / f"{role}.pub").read_bytes())
    return d, trusted


def counting(monkeypatch) -> dict[str, int]:
    """Count reads of key files through the loaders the context uses."""
    calls = {"signing": 0, "trusted": 0}
    real_sk, real_tk = signing.load_signing_key, signing.load_trusted_keys

    def sk(path):
        calls["signing"] += path is not None
        return real_sk(path)

    def tk(path):
        calls["trusted"] += path is not None
        return real_tk(path)

    monkeypatch.setattr(context_mod, "load_signing_key", sk)
    monkeypatch.setattr(context_mod, "load_trusted_keys", tk)
    return calls


def test_a_context_carries_the_settings_authority(keys, tmp_path, monkeypatch):
    d, trusted = keys
    st = settings(store=f"file://{tmp_path / 'store'}", signing_key=str(d / "promoter.key"), trusted_keys=str(trusted),
                  record_ttl_s=60, verify_window_s=5, actor="ci:test")
    ctx = Context.from_settings(st)
    assert ctx.store.uri == f"file://{tmp_path / 'store'}"
    auth = ctx.auth
    assert (auth.who, auth.ttl_s, auth.verify_window_s) == ("ci:test", 60, 5)
    assert auth.signer is not None and auth.signer.key_id == signing.load_signing_key(d / "promoter.key").key_id
    assert auth.trusted is not None and auth.trusted.role_of(auth.signer.key_id) == "promoter"
    other = open_store(f"file://{tmp_path / 'other'}")
    moved = ctx.with_store(other)
    assert moved.store is other and moved.auth is auth and moved.settings is st
    assert Context.from_settings(st, store=other, auth=Authority()).auth == Authority()


def test_a_bad_key_layout_fails_when_the_context_is_made(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "loose.pub").write_text("not a key")
    with pytest.raises(BadInputError):
        Context.from_settings(settings(store=f"file://{tmp_path / 's'}", trusted_keys=str(flat)))


def test_an_anonymous_authority_signs_nothing_and_enforces_nothing():
    a = Authority()
    assert (a.who, a.signer, a.trusted, a.ttl_s) == ("unknown", None, None, None)
    assert a.verify_window_s == 24 * 3600 and a.but(who="x").who == "x" and a.who == "unknown"


def _signed_and_staged(keys, cli, tmp_path, monkeypatch):
    """An engine imported with the builder key, attested (covering this host) by the validator key
    and on staging; the environment then holds the promoter key and the trusted keys."""
    from buildctl.artifact_store.trust.signing import load_signing_key
    from buildctl.artifact_store.read import get_manifest
    from buildctl.engines.fingerprint import detect
    from buildctl.core.times import utc_now

    d, trusted = keys
    store_dir = tmp_path / "store"
    monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(d / "builder.key"))
    code, out, err = cli("--store", store_dir, "--json", "import", make_tree(tmp_path / "t", {"rank0.engine": b"x" * 64}),
                         "--profile", str(PROFILES / "tiny-llama-cpu.yaml"))
    assert code == 0, err
    aid = json.loads(out)["artifact_id"]
    store = open_store(f"file://{store_dir}")
    write_attestation(store, aid, get_manifest(store, aid).compat_key, "pass", utc_now(),
                      signer=load_signing_key(d / "validator.key"), validator=detect())
    staged(store_dir, aid, builder=load_signing_key(d / "builder.key"))
    monkeypatch.setenv("BUILDCTL_SIGNING_KEY", str(d / "promoter.key"))
    monkeypatch.setenv("BUILDCTL_TRUSTED_KEYS", str(trusted))
    return store_dir, aid


def test_a_command_reads_each_key_file_once(keys, cli, tmp_path, monkeypatch):
    """A signed promote and a trusted pull each read their keys once (they were read at every
    store call, twice inside one loop, before the context)."""
    store_dir, aid = _signed_and_staged(keys, cli, tmp_path, monkeypatch)
    calls = counting(monkeypatch)
    code, _, err = cli("--store", store_dir, "--json", "promote", aid, "--channel", "prod")
    assert code == 0, err
    assert calls == {"signing": 1, "trusted": 1}
    monkeypatch.delenv("BUILDCTL_SIGNING_KEY")
    calls = counting(monkeypatch)
    code, out, err = cli("--store", store_dir, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                         "--dest", tmp_path / "node", "--skip-preflight")
    assert code == 0, err
    assert json.loads(out)["artifact_id"] == aid and calls == {"signing": 0, "trusted": 1}


def test_a_signed_promote_and_a_trusted_pull_read_each_object_once(keys, cli, tmp_path, monkeypatch):
    """#51: one load per object per command. The store the command's context opens keeps each
    manifest it verified (content-addressed: a kept copy cannot go stale); the gates, the
    signature check and the install share it. Every other immutable object (attestation,
    provenance, signature, history record) is read once too. Counted at the local store's reads;
    channel refs are mutable and read again where a compare-and-swap decides on them."""
    from buildctl.artifact_store.layout import manifest_key
    from buildctl.artifact_store.backends.local import LocalStore

    store_dir, aid = _signed_and_staged(keys, cli, tmp_path, monkeypatch)
    reads: Counter[str] = Counter()
    real = LocalStore.get_bytes

    def get_bytes(self, key):
        reads[key] += 1
        return real(self, key)

    monkeypatch.setattr(LocalStore, "get_bytes", get_bytes)
    code, _, err = cli("--store", store_dir, "--json", "promote", aid, "--channel", "prod")
    assert code == 0, err
    assert reads[manifest_key(aid)] == 1, reads
    areas = {k.split("/", 1)[0] for k in reads}
    assert {"manifests", "attestations", "provenance"} <= areas, areas
    assert {k: n for k, n in reads.items() if n > 1} == {}
    reads.clear()
    monkeypatch.delenv("BUILDCTL_SIGNING_KEY")
    code, out, err = cli("--store", store_dir, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                         "--dest", tmp_path / "node", "--skip-preflight", "--require-covered")
    assert code == 0 and json.loads(out)["artifact_id"] == aid, err
    assert reads[manifest_key(aid)] == 1, reads
    assert {"manifests", "attestations", "signatures"} <= {k.split("/", 1)[0] for k in reads}
    assert {k: n for k, n in reads.items() if n > 1} == {}


def test_a_covered_pull_with_json_computes_the_coverage_once(keys, cli, tmp_path, monkeypatch):
    """#51: `pull --require-covered --json` checks the coverage before downloading and prints it;
    the check's result is what it prints (it was computed twice)."""
    from buildctl.steps import coverage as coverage_mod, node_agent

    store_dir, aid = _signed_and_staged(keys, cli, tmp_path, monkeypatch)
    code, _, err = cli("--store", store_dir, "--json", "promote", aid, "--channel", "prod")
    assert code == 0, err
    monkeypatch.delenv("BUILDCTL_SIGNING_KEY")
    calls: list[str] = []
    real = coverage_mod.coverage

    def counted(store, artifact_id, *args, **kwargs):
        calls.append(artifact_id)
        return real(store, artifact_id, *args, **kwargs)

    monkeypatch.setattr(coverage_mod, "coverage", counted)
    monkeypatch.setattr(node_agent, "coverage", counted)
    code, out, err = cli("--store", store_dir, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "prod",
                         "--dest", tmp_path / "node", "--skip-preflight", "--require-covered")
    assert code == 0, err
    got = json.loads(out)
    assert got["artifact_id"] == aid and got["coverage"]["covered"] is True
    assert calls == [aid]
