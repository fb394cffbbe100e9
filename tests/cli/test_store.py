"""The store commands through the CLI, on both backends, with the documented exit codes."""

from __future__ import annotations

import json
import os
import unicodedata

import pytest

from buildctl.artifact_store.publish import ManifestDraft, publish_tree
from buildctl.artifact_store.layout import blob_key

from ..support.helpers import PROFILES, make_tree, write_attestation

TINY = str(PROFILES / "tiny-llama-cpu.yaml")


def j(cli, *args):
    code, out, err = cli(*args)
    assert code == 0, err
    return json.loads(out)


def test_walkthrough(cli, store, store_uri, engine_tree, tmp_path):
    S = ("--store", store_uri)
    first = j(cli, *S, "--json", "import", engine_tree, "--profile", TINY)
    again = j(cli, *S, "import", engine_tree, "--profile", TINY, "--json")
    aid = first["artifact_id"]
    assert again["artifact_id"] == aid and again["uploaded_blobs"] == 0 and again["existed"]
    assert first["uploaded_blobs"] == 5

    listing = j(cli, *S, "--json", "ls", "--profile", "tiny-llama-cpu")
    assert [a["artifact_id"] for a in listing] == [aid]
    assert j(cli, *S, "--json", "ls", "--profile", "other") == []
    shown = j(cli, *S, "--json", "show", aid[9:21])
    assert shown["artifact_id"] == aid and len(shown["manifest"]["files"]) == 5
    assert j(cli, *S, "--json", "verify", aid, "--deep")["ok"]

    code, _, err = cli(*S, "promote", aid, "--channel", "staging")
    assert code == 5 and "no validation attestation" in err
    code, _, err = cli(*S, "promote", aid, "--channel", "staging", "--force")
    assert code == 2 and "--reason" in err

    compat = shown["manifest"]["compat_key"]
    write_attestation(store, aid, compat, "fail", "2026-01-01T00:00:00.000000Z")
    code, _, err = cli(*S, "promote", aid, "--channel", "staging")
    assert code == 5 and "did not pass" in err
    write_attestation(store, aid, compat, "pass", "2026-01-02T00:00:00.000000Z")
    rec = j(cli, *S, "--json", "promote", aid, "--channel", "staging")
    assert rec["seq"] == 1 and rec["artifact_id"] == aid and not rec["forced"]

    dest = tmp_path / "node"
    # the imported tree is no real aoti engine: the preflight load refuses it, nothing is installed
    code, _, err = cli(*S, "pull", "--profile", "tiny-llama-cpu", "--channel", "staging", "--dest", dest)
    assert code == 8 and "failed its preflight load" in err and not (dest / "current").exists()
    P = "--skip-preflight"
    pulled = j(cli, *S, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "staging", "--dest", dest, P)
    assert pulled["installed"] and (dest / "current" / "rank0.engine").read_bytes() == (engine_tree / "rank0.engine").read_bytes()
    assert os.access(dest / "current" / "bin/run.sh", os.X_OK)
    assert not j(cli, *S, "--json", "pull", "--profile", "tiny-llama-cpu", "--channel", "staging", "--dest", dest, P)["installed"]
    code, out, _ = cli(*S, "pull", "--profile", "tiny-llama-cpu", "--channel", "staging", "--dest", dest, P)
    assert code == 0 and "already installed" in out

    second = j(cli, *S, "--json", "import", make_tree(tmp_path / "v2", {"rank0.engine": 999}), "--profile", TINY)["artifact_id"]
    forced = j(cli, *S, "--json", "promote", second, "--channel", "staging", "--force", "--reason", "hotfix INC-1")
    assert forced["forced"] and forced["reason"] == "hotfix INC-1" and forced["previous"] == aid
    back = j(cli, *S, "--json", "rollback", "--profile", "tiny-llama-cpu", "--channel", "staging")
    assert back["artifact_id"] == aid and back["seq"] == 3 and back["action"] == "rollback"
    hist = j(cli, *S, "--json", "history", "--profile", "tiny-llama-cpu", "--channel", "staging")
    assert [(h["seq"], h["artifact_id"]) for h in hist] == [(1, aid), (2, second), (3, aid)]

    code, _, _ = cli(*S, "history", "--profile", "tiny-llama-cpu", "--channel", "nope")
    assert code == 3
    code, _, err = cli(*S, "pull", "--profile", "tiny-llama-cpu", "--channel", "prod", "--dest", dest)
    assert code == 3 and "has no channel 'prod'" in err and "its channels: staging" in err  # names the wrong name

    # gc: `second` is no channel's now, but staging's history names it (a rollback target): kept by default
    dry = j(cli, *S, "--json", "gc", "--dry-run")
    assert dry["removed_artifacts"] == []
    why = {a["artifact_id"]: a["protected_by"] for a in dry["artifacts"]}
    assert any(w.startswith("history staging #2") for w in why[second]), why[second]
    # with no history kept, no grace and --keep 0 it goes, the referenced one stays
    dry = j(cli, *S, "--json", "gc", "--keep", "0", "--keep-history", "0", "--grace", "0", "--dry-run")
    assert dry["removed_artifacts"] == [second]
    assert j(cli, *S, "--json", "show", second)["artifact_id"] == second
    done = j(cli, *S, "--json", "gc", "--keep", "0", "--keep-history", "0", "--grace", "0")
    assert done["removed_artifacts"] == [second] and done["removed_blobs"] == 1, done
    code, _, _ = cli(*S, "show", second)
    assert code == 3
    assert j(cli, *S, "--json", "verify", aid, "--deep")["ok"]


def test_verify_names_bad_files(cli, store, store_uri, engine_tree):
    res = publish_tree(store, engine_tree, ManifestDraft(
        profile_name="tiny-llama-cpu", profile_hash="xxh3-128:" + "1" * 32, backend="aoti", compat_key="aoti-x",
        fingerprint={}))
    m = res.manifest
    rank0 = next(f for f in m.files if f.path == "rank0.engine")
    lora = next(f for f in m.files if f.path == "lora/adapter.bin")
    from ..artifact_store.node.test_pull import overwrite

    data = bytearray(store.get_bytes(blob_key(rank0.digest)))
    data[12345] ^= 1
    overwrite(store, blob_key(rank0.digest), bytes(data))
    overwrite(store, blob_key(lora.digest), None)
    code, _, err = cli("--store", store_uri, "verify", res.artifact_id)
    assert code == 4 and "lora/adapter.bin: missing" in err and "rank0.engine" not in err
    code, _, err = cli("--store", store_uri, "verify", res.artifact_id, "--deep")
    assert code == 4 and "lora/adapter.bin: missing" in err and "rank0.engine: digest mismatch" in err


@pytest.mark.parametrize("kind", ["symlink-out", "symlink-in", "fifo", "empty-dir", "non-nfc", "case-dup"])
def test_unsafe_import_sources_refused(cli, tmp_path, kind):
    root = make_tree(tmp_path / "src", {"config.json": b"{}"})
    if kind == "symlink-out":
        (root / "evil").symlink_to("/etc")
    elif kind == "symlink-in":
        (root / "alias.json").symlink_to(root / "config.json")
    elif kind == "fifo":
        os.mkfifo(root / "pipe")
    elif kind == "empty-dir":
        (root / "lora").mkdir()
    elif kind == "non-nfc":
        (root / unicodedata.normalize("NFD", "é.bin")).write_bytes(b"x")
    elif kind == "case-dup":
        (root / "Config.json").write_bytes(b"{}")
    store_dir = tmp_path / "store"
    code, _, err = cli("--store", store_dir, "import", root, "--profile", TINY)
    assert code == 2, err
    assert "refusing" in err
    written = [p for p in store_dir.rglob("*") if p.is_file() and ".locks" not in p.parts] if store_dir.exists() else []
    assert written == []


def test_unknown_artifact_and_bad_store(cli, tmp_path):
    code, _, err = cli("--store", tmp_path / "s", "show", "0123456789abcdef")
    assert code == 3
    code, _, err = cli("--store", "ftp://x/y", "ls")
    assert code == 2 and "unsupported scheme" in err
    code, _, err = cli("--store", tmp_path / "s", "promote", "0123456789abcdef", "--channel", "Bad Name")
    assert code == 3  # the artifact is looked up first


# --- #48 item 12: names that are not checked -------------------------------------------------------

def _one_promoted(store_uri, tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store

    from ..support.helpers import publish_files, staged

    store = open_store(store_uri)
    aid = publish_files(store, tmp_path / "t", draft, {"config.json": b"{}", "rank0.engine": 1024}, seed=3)
    staged(store, aid)
    return store, aid


def test_promote_to_a_channel_outside_the_known_set_needs_new_channel(store_uri, tmp_path, draft, cli,
                                                                      s3_env_if_needed, monkeypatch):
    store, aid = _one_promoted(store_uri, tmp_path, draft)
    monkeypatch.setenv("BUILDCTL_REQUIRE_PROVENANCE", "0")
    code, _, err = cli("--store", store_uri, "promote", aid, "--channel", "prdo")
    assert code == 2 and "'prdo'" in err and "staging, prod" in err and "--new-channel" in err, err
    assert not list(store.list("channels/" + draft.profile_name + "/prdo/"))
    code, _, err = cli("--store", store_uri, "promote", aid, "--channel", "canary", "--new-channel")
    assert code == 0, err
    code, _, err = cli("--store", store_uri, "promote", aid, "--channel", "canary")  # it exists now
    assert code == 0, err
    monkeypatch.setenv("BUILDCTL_CHANNELS", '["staging", "canary2", "prod"]')
    code, _, err = cli("--store", store_uri, "promote", aid, "--channel", "canary2")
    assert code == 0, err


def test_a_pull_miss_names_the_wrong_name(store_uri, tmp_path, draft, cli, s3_env_if_needed):
    store, aid = _one_promoted(store_uri, tmp_path, draft)
    dest = tmp_path / "node"
    code, _, err = cli("--store", store_uri, "pull", "--profile", draft.profile_name, "--channel", "stagin",
                       "--dest", dest, "--skip-preflight")
    assert code == 3 and "no channel 'stagin'" in err and "its channels: staging" in err, err
    code, _, err = cli("--store", store_uri, "pull", "--profile", "tiny-lama-cpu", "--channel", "staging",
                       "--dest", dest, "--skip-preflight")
    assert code == 3 and "'tiny-lama-cpu' has no channel" in err and draft.profile_name in err, err
    code, _, err = cli("--store", store_uri, "history", "--profile", draft.profile_name, "--channel", "stagin")
    assert code == 3 and "its channels: staging" in err, err


@pytest.mark.parametrize("command", [["ls"], ["pull", "--profile", "p", "--channel", "prod", "--dest", "{tmp}/n",
                                              "--skip-preflight"]])
def test_a_store_that_does_not_exist_is_an_error(tmp_path, cli, command):
    for store in (tmp_path / "missing", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        code, _, err = cli("--store", f"file://{store}", *[a.format(tmp=tmp_path) for a in command])
        if command == ["ls"] and store.name == "empty":
            assert code == 0, err  # an existing store with nothing in it lists nothing
            continue
        assert code == 3 and "does not exist" in err, (store, err)


@pytest.mark.parametrize("command", [["ls"], ["pull", "--profile", "p", "--channel", "prod", "--dest", "{tmp}/n",
                                              "--skip-preflight"], ["scrub"], ["gc", "--dry-run"]])
def test_an_s3_store_whose_bucket_does_not_exist_is_an_error(tmp_path, cli, seaweed, s3_env, command):
    """As a local folder that is not there: exit 3 naming the store, not the S3 error code (exit 9,
    'store unavailable', which would send the operator after credentials or the network)."""
    args = [a.format(tmp=tmp_path) for a in command]
    code, _, err = cli("--store", "s3://no-such-bucket-48/buildctl", *args)
    assert code == 3 and "store s3://no-such-bucket-48/buildctl does not exist" in err, err
    assert len(err.strip().splitlines()) == 1, err
    empty = f"s3://{seaweed.new_bucket()}/buildctl"  # a bucket with nothing under the prefix: an empty store
    code, _, err = cli("--store", empty, *args)
    assert code == (3 if command[0] == "pull" else 0), err


def test_node_report_refuses_an_unknown_profile_and_lists_the_known(tmp_path, cli, monkeypatch):
    from ..support.helpers import PROFILES

    monkeypatch.setenv("BUILDCTL_PROFILE_DIR", str(PROFILES))
    code, _, err = cli("--store", f"file://{tmp_path / 'store'}", "node", "report", "--node-id", "n1",
                       "--profiles", "tiny-lama-cpu", "--no-event")
    assert code == 3 and "tiny-lama-cpu" in err and "tiny-llama-cpu" in err, err
