"""When an artifact rots in the store: deep checks at the gates, quarantine, recovery, repair and
scrub, on both stores, with the corruption made the way a disk or a bad copy makes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.channels import ChannelMove, history
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest, verify
from buildctl.artifact_store.trust.attestations import list_attestations
from buildctl.artifact_store.trust.authority import Authority
from buildctl.steps.context import Context
from buildctl.artifact_store.layout import node_key
from buildctl.artifact_store.channels import read_channel

from ..support.helpers import PROFILES, make_tree, publish_files, rot, settings, staged
from ..support.trtllm_kit import calib, fake_tools, h100x8, hf_model, prod  # noqa: F401  (fixtures)

KINDS = ("flip", "truncate", "missing")


def digest_of(store, aid: str, path: str) -> str:
    return next(f.digest for f in get_manifest(store, aid).files if f.path == path)


def published(store, root: Path, draft, content: bytes | int = 200_000, seed: int = 0) -> str:
    return publish_files(store, root, draft, {"config.json": b"{}", "rank0.engine": content}, seed=seed)


def j(result) -> dict:
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("kind", KINDS)
def test_promote_refuses_a_rotted_artifact_and_quarantines_it(store, store_uri, draft, tmp_path, cli, kind,
                                                             s3_env_if_needed):
    aid = published(store, tmp_path / "a", draft)
    rot(store, digest_of(store, aid, "rank0.engine"), kind)
    staged(store_uri, aid)
    code, _, err = cli("--store", store_uri, "promote", aid, "--channel", "prod")
    assert code == 4 and "rank0.engine" in err and "quarantined: quarantine/" in err, err
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key) is None
    shown = j(cli("--store", store_uri, "--json", "show", aid))
    assert shown["quarantined"] and "promote to prod" in shown["quarantine"][-1]["reason"]
    assert any("rank0.engine" in p for p in shown["quarantine"][-1]["problems"])
    listed = j(cli("--store", store_uri, "--json", "ls"))
    assert [a["quarantined"] for a in listed] == [True]
    code, _, err = cli("--store", store_uri, "promote", aid, "--channel", "prod", "--force", "--reason", "try anyway")
    assert code == 5 and "is quarantined (quarantine/" in err


def test_promote_trusts_a_recent_deep_verify_only_when_asked_and_records_it(store, draft, tmp_path):
    aid = published(store, tmp_path / "a", draft)
    first = promote(store, aid, "staging", auth=Authority(verify_window_s=3600))
    assert first.verified_at is not None and first.verify_window_s == 0  # the gate re-hashed: the default
    again = promote(store, staged(store, aid), "prod", trust_verify_within_s=3600)
    assert again.verified_at == first.verified_at and again.verify_window_s == 3600  # trusted, as asked
    fresh = promote(store, aid, "canary", auth=Authority(verify_window_s=3600))
    assert fresh.verified_at > first.verified_at  # the settings' window is not an opt-in: re-hashed


def test_pull_refuses_a_quarantined_artifact_the_channel_points_at(store, store_uri, draft, tmp_path, cli,
                                                                   s3_env_if_needed):
    v1 = published(store, tmp_path / "v1", draft, seed=1)
    promote(store, staged(store, v1), "prod")
    node = tmp_path / "node"
    args = ("--store", store_uri, "--json", "pull", "--profile", draft.profile_name, "--channel", "prod", "--dest", node,
            "--skip-preflight", "--node-id", "gpu-node-3")
    assert j(cli(*args))["artifact_id"] == v1
    v2 = published(store, tmp_path / "v2", draft, seed=2)
    promote(store, staged(store, v2), "prod")
    code, _, err = cli("--store", store_uri, "quarantine", v2, "--reason", "segfaults over 4096 tokens (INC-7)")
    assert code == 0, err
    code, _, err = cli(*args)
    assert code == 5 and "is quarantined" in err and "INC-7" in err and "current engine stays" in err
    assert (node / "current").resolve().name == v1[len("xxh3-128:"):]
    record = json.loads(store.get_bytes(node_key("gpu-node-3")))
    (failure,) = record["pull_failures"]
    assert failure["artifact_id"] == v2 and failure["error"].startswith("QuarantinedError")


def test_a_rotted_blob_makes_the_pull_fail_and_the_node_report_it(store, store_uri, draft, tmp_path, cli,
                                                                  s3_env_if_needed):
    aid = published(store, tmp_path / "a", draft)
    promote(store, staged(store, aid), "prod")
    rot(store, digest_of(store, aid, "rank0.engine"), "flip")
    code, _, err = cli("--store", store_uri, "pull", "--profile", draft.profile_name, "--channel", "prod",
                       "--dest", tmp_path / "node", "--skip-preflight", "--node-id", "gpu-node-4")
    assert code == 4 and "rank0.engine: digest mismatch" in err and f"recorded in {node_key('gpu-node-4')}" in err
    (failure,) = json.loads(store.get_bytes(node_key("gpu-node-4")))["pull_failures"]
    assert failure["files"] == ["rank0.engine"] and failure["channel"] == "prod"


@pytest.mark.parametrize("kind", KINDS)
def test_recovery_rolls_the_channel_back_and_names_the_rebuild(store, store_uri, draft, tmp_path, cli, kind,
                                                               s3_env_if_needed):
    good = published(store, tmp_path / "good", draft, seed=1)
    promote(store, staged(store, good), "prod")
    bad = published(store, tmp_path / "bad", draft, seed=2)
    promote(store, staged(store, bad), "prod")
    rot(store, digest_of(store, bad, "rank0.engine"), kind)
    rep = j(cli("--store", store_uri, "--json", "heal", bad))
    assert not rep["store_copy_ok"] and rep["quarantine_record"].startswith("quarantine/")
    chan = next(c for c in rep["channels"] if c["channel"] == "prod")  # staging had it too
    assert chan["rolled_back_to"] == good and chan["seq"] == 3
    assert rep["rebuild"] == [{"profile": draft.profile_name, "compat_key": draft.compat_key}]
    last = history(store, draft.profile_name, "prod", draft.compat_key)[-1]
    assert last.action == "rollback" and last.artifact_id == good and f"quarantine of {bad}" in last.reason


def test_recovery_skips_earlier_artifacts_that_are_bad_or_unvalidated(store, draft, tmp_path):
    from buildctl.steps.healing import recover_channels

    oldest = published(store, tmp_path / "o", draft, seed=1)
    promote(store, staged(store, oldest), "prod")
    rotten = published(store, tmp_path / "r", draft, seed=2)
    promote(store, staged(store, rotten), "prod")
    newest = published(store, tmp_path / "n", draft, seed=3)
    promote(store, staged(store, newest), "prod")
    rot(store, digest_of(store, rotten, "rank0.engine"), "flip")
    from buildctl.artifact_store.quarantine import quarantine

    quarantine(store, newest, "bad engine", auth=Authority(who="test"))
    rec = next(r for r in recover_channels(Context.from_settings(settings(), store=store), newest) if r.channel == "prod")
    assert rec.rolled_back_to == oldest  # the rotten one in between deep-failed and was quarantined too
    from buildctl.artifact_store.quarantine import active_quarantine

    assert active_quarantine(store, rotten) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_repair_from_a_node_versions_dir_restores_the_same_artifact(store, store_uri, draft, tmp_path, cli, kind,
                                                                    s3_env_if_needed):
    aid = published(store, tmp_path / "a", draft)
    promote(store, staged(store, aid), "prod")
    node = tmp_path / "node"
    assert j(cli("--store", store_uri, "--json", "pull", "--profile", draft.profile_name, "--channel", "prod",
                 "--dest", node, "--skip-preflight"))["installed"]
    rot(store, digest_of(store, aid, "rank0.engine"), kind)
    code, _, err = cli("--store", store_uri, "verify", aid, "--deep")
    assert code == 4 and "rank0.engine" in err
    assert j(cli("--store", store_uri, "--json", "show", aid))["quarantined"]
    versions = node / "versions" / aid[len("xxh3-128:"):]
    rep = j(cli("--store", store_uri, "--json", "repair", aid, "--from", versions))
    assert rep["replaced"] == ["rank0.engine"] and rep["healthy"] and rep["lift_record"].startswith("quarantine/")
    assert j(cli("--store", store_uri, "--json", "verify", aid, "--deep"))["ok"]
    shown = j(cli("--store", store_uri, "--json", "show", aid))
    assert not shown["quarantined"] and [q["action"] for q in shown["quarantine"]] == ["quarantine", "lift"]
    assert j(cli("--store", store_uri, "--json", "pull", "--profile", draft.profile_name, "--channel", "prod",
                 "--dest", tmp_path / "node2", "--skip-preflight"))["artifact_id"] == aid


def test_repair_from_another_store_and_refuses_a_wrong_copy(store, store_uri, draft, tmp_path, cli, s3_env_if_needed):
    mirror = open_store(str(tmp_path / "mirror"))  # a second store holding the same files (blobs)
    tree = make_tree(tmp_path / "a", {"config.json": b"{}", "rank0.engine": 100_000})
    aid = publish_tree(store, tree, draft).artifact_id
    publish_tree(mirror, tree, draft)
    rot(store, digest_of(store, aid, "rank0.engine"), "flip")
    uri = store_uri
    wrong = make_tree(tmp_path / "wrong", {"config.json": b"{}", "rank0.engine": 100_000}, seed=9)
    code, out, err = cli("--store", uri, "--json", "repair", aid, "--from", wrong)
    assert code == 4 and "rank0.engine" in err  # a copy whose digest differs is never uploaded
    rep = j(cli("--store", uri, "--json", "repair", aid, "--from", mirror.uri))
    assert rep["replaced"] == ["rank0.engine"] and rep["healthy"]


def test_a_bad_node_copy_does_not_quarantine_a_good_artifact(store, store_uri, draft, tmp_path, cli,
                                                             s3_env_if_needed):
    aid = published(store, tmp_path / "a", draft)
    promote(store, staged(store, aid), "prod")
    rep = j(cli("--store", store_uri, "--json", "heal", aid))
    assert rep["store_copy_ok"] and rep["channels"] == [] and rep["quarantine_record"] is None
    assert not j(cli("--store", store_uri, "--json", "show", aid))["quarantined"]


def test_scrub_checks_channel_artifacts_first_and_quarantines_failures(store, store_uri, draft, tmp_path, cli,
                                                                       s3_env_if_needed):
    referenced = published(store, tmp_path / "r", draft, seed=1)
    promote(store, staged(store, referenced), "prod")
    loose = [published(store, tmp_path / f"l{i}", draft, seed=10 + i) for i in range(3)]
    rot(store, digest_of(store, loose[1], "rank0.engine"), "truncate")
    code, out, err = cli("--store", store_uri, "--json", "scrub")
    assert code == 4 and loose[1] in err
    rows = json.loads(out)["artifacts"]
    assert rows[0]["artifact_id"] == referenced and rows[0]["channels"]
    status = {r["artifact_id"]: r["status"] for r in rows}
    assert status == {referenced: "ok", loose[0]: "ok", loose[1]: "corrupt", loose[2]: "ok"}
    again = json.loads(cli("--store", store_uri, "--json", "scrub", "--channels-only")[1])["artifacts"]
    assert [r["artifact_id"] for r in again] == [referenced]
    budget = json.loads(cli("--store", store_uri, "--json", "scrub", "--budget-gib", "0.0003")[1])["artifacts"]
    assert [r["status"] for r in budget].count("skipped") >= 1 and budget[0]["status"] == "ok"
    assert {r["artifact_id"]: r["status"] for r in budget}[loose[1]] == "quarantined"


def test_build_key_generations_follow_quarantine(store, draft, tmp_path):
    from buildctl.artifact_store.publish import build_key_owners, claim_build_key, lookup_build_key
    from buildctl.artifact_store.quarantine import lift, quarantine

    key = "xxh3-128:" + "b" * 32
    a = published(store, tmp_path / "a", draft, seed=1)
    b = published(store, tmp_path / "b", draft, seed=2)
    assert claim_build_key(store, key, a) == a and claim_build_key(store, key, b) == a
    quarantine(store, a, "rotted", auth=Authority(who="test"))
    assert lookup_build_key(store, key) is None
    assert claim_build_key(store, key, b) == b and lookup_build_key(store, key) == b
    assert [o for _, o in build_key_owners(store, key)] == [a, b]
    lift(store, a, "repaired", auth=Authority(who="test"))
    assert lookup_build_key(store, key) == a  # the oldest generation in service


@pytest.mark.parametrize("kind", KINDS)
def test_cache_check_quarantines_a_rotted_hit_and_rebuilds(store_uri, hf_model, fake_tools, prod, tmp_path, monkeypatch,  # noqa: F811
                                                           cli, kind, s3_env_if_needed):
    fp = tmp_path / "fp.json"
    fp.write_text(json.dumps(h100x8().model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp))
    build = ("--store", store_uri, "--json", "build", prod, "--model", hf_model)
    first = j(cli(*build))
    store = open_store(store_uri)
    rot(store, digest_of(store, first["artifact_id"], "rank3.engine"), kind)
    second = j(cli(*build))
    assert not second["cache_hit"], "a rotted cached artifact is no hit"
    from buildctl.artifact_store.quarantine import quarantine_records

    records = [r.action for _, r in quarantine_records(store, first["artifact_id"])]
    assert records[0] == "quarantine"
    verify(store, second["artifact_id"], deep=True)  # the rebuild is whole
    if second["artifact_id"] == first["artifact_id"]:  # identical bytes: the rebuild put the blob back
        assert records == ["quarantine", "lift"]
    third = j(cli(*build))
    assert third["cache_hit"] and third["artifact_id"] == second["artifact_id"]
    assert len((fake_tools / "build.jsonl").read_text().splitlines()) == 2, "the third build was a cache hit"


@pytest.mark.slow
def test_validation_quarantines_an_artifact_whose_store_copy_is_bad(tmp_path, draft):
    """The validator pulls the artifact with verification first: bad bytes quarantine it before
    any engine or reference runs (the reference given here would fail if it were used)."""
    from buildctl.steps import validate
    from buildctl.artifact_store.errors import VerificationError
    from buildctl.artifact_store.quarantine import active_quarantine

    store = open_store(str(tmp_path / "store"))
    aid = publish_tree(store, make_tree(tmp_path / "e", {"engine.json": b"{}", "model.pt2": 50_000}), draft).artifact_id
    rot(store, digest_of(store, aid, "model.pt2"), "flip")
    with pytest.raises(VerificationError) as exc:
        validate.validate(Context.from_settings(settings(), store=store), aid, profile_path=PROFILES / "tiny-llama-cpu.yaml",
                                   reference=object())
    assert "model.pt2" in str(exc.value) and exc.value.quarantine_key
    assert "validation" in active_quarantine(store, aid)[1].reason
    assert list_attestations(store, aid) == []


def test_scrub_and_heal_restore_a_rotted_manifest_from_its_identity_copy(store, store_uri, draft, tmp_path, cli,
                                                                          s3_env_if_needed):
    """One digit flipped inside the manifest prod points at (#29: scrub exited 0 and skipped it,
    heal and repair exited 4). The identity index holds a byte-identical copy; the id proves it."""
    from ..support.helpers import rot_manifest

    aid = published(store, tmp_path / "a", draft, seed=1)
    promote(store, staged(store, aid), "prod")
    rot_manifest(store, aid)
    code, out, err = cli("--store", store_uri, "--json", "scrub")
    assert code == 0, err
    rows = json.loads(out)["artifacts"]
    fixed = [r for r in rows if r["artifact_id"] == aid and r["status"] == "repaired"]
    assert fixed and "restored from index/identity/" in fixed[0]["problems"][0], rows
    assert verify(store, aid, deep=True) is not None  # whole again, blobs and manifest
    rot_manifest(store, aid)
    code, out, err = cli("--store", store_uri, "--json", "heal", aid)
    assert code == 0, err
    assert "restored from index/identity/" in json.dumps(json.loads(out)) and verify(store, aid, deep=True)


def test_a_node_directory_with_the_engine_installed_restores_its_rotted_manifest(store, store_uri, draft, tmp_path,
                                                                                 cli, s3_env_if_needed):
    """#29 item 3: a pull keeps the installed engine's manifest bytes beside `versions/`, so
    `repair`/`heal --from DIR` put a rotted manifest back from a node that merely installed it
    (not only from one that staged it) when the store's own copies are gone."""
    from buildctl.artifact_store.layout import IDENTITY_INDEX

    from ..support.helpers import overwrite, rot_manifest

    aid = published(store, tmp_path / "a", draft, seed=1)
    promote(store, staged(store, aid), "prod")
    node = tmp_path / "node"
    code, _, err = cli("--store", store_uri, "--json", "pull", "--profile", draft.profile_name, "--channel", "prod", "--dest",
                       node, "--skip-preflight")
    assert code == 0, err
    for key in store.list(IDENTITY_INDEX):
        overwrite(store, key, b"{}")
    rot_manifest(store, aid)
    code, out, err = cli("--store", store_uri, "--json", "repair", aid, "--from", node)
    assert code == 0, err
    assert verify(store, aid, deep=True) is not None
    rot_manifest(store, aid)
    code, out, err = cli("--store", store_uri, "--json", "heal", aid, "--from", node)
    assert code == 0, err
    assert f"restored from {node}" in json.dumps(json.loads(out)) and verify(store, aid, deep=True)


def test_heal_and_repair_restore_a_rotted_manifest_from_another_store_or_a_node(store, store_uri, draft, tmp_path, cli,
                                                                               s3_env_if_needed):
    """#29 item 3: with its identity copy gone too, a rotted manifest comes back from any store or
    node directory that holds the same bytes (`--from`); the id proves which bytes are right."""
    from buildctl.artifact_store.layout import IDENTITY_INDEX, manifest_key

    from ..support.helpers import overwrite, rot_manifest

    aid = published(store, tmp_path / "a", draft, seed=1)
    mirror = open_store(f"file://{tmp_path / 'mirror'}")
    mirror.put_bytes(manifest_key(aid), store.get_bytes(manifest_key(aid)))
    for key in store.list(IDENTITY_INDEX):
        overwrite(store, key, b"{}")  # the store's own copy is no good either
    rot_manifest(store, aid)
    code, out, err = cli("--store", store_uri, "--json", "heal", aid)
    assert code == 4, err  # nothing here to restore it from
    code, out, err = cli("--store", store_uri, "--json", "heal", aid, "--from", mirror.uri)
    assert code == 0, err
    assert f"restored from {mirror.uri}" in json.dumps(json.loads(out)) and verify(store, aid, deep=True)
    rot_manifest(store, aid)
    code, _, err = cli("--store", store_uri, "--json", "repair", aid, "--from", mirror.uri)
    assert code == 0 and verify(store, aid, deep=True), err


@pytest.mark.parametrize("channels_only", [False, True])
def test_scrub_fails_when_a_channel_points_at_an_artifact_whose_manifest_is_gone(store, store_uri, draft, tmp_path,
                                                                                cli, s3_env_if_needed, channels_only):
    """#48 item 7: every node fails to pull such a channel; scrub says so (exit 4) and names the
    channel, and restores the manifest when a copy that hashes to the id is left."""
    from buildctl.artifact_store.layout import IDENTITY_INDEX, manifest_key

    aid = published(store, tmp_path / "a", draft, seed=1)
    promote(store, staged(store, aid), "prod")
    store.delete(manifest_key(aid))
    for key in list(store.list(IDENTITY_INDEX)):
        store.delete(key)  # no copy left to restore it from
    args = ["--store", store_uri, "--json", "scrub"] + (["--channels-only"] if channels_only else [])
    code, out, err = cli(*args)
    assert code == 4, (code, err)
    (row,) = [r for r in json.loads(out)["artifacts"] if r["artifact_id"] == aid]
    assert row["status"] == "corrupt" and "manifest: missing" in row["problems"][0] and row["bytes"] == 0
    assert json.loads(out)["checked_bytes"] == 0  # nothing was read to find it
    assert any("prod" in c for c in row["channels"]), row


# --- bad arguments and dead ends, each alone (`make mutants` sees these) ---------------------------


def test_quarantine_needs_a_reason_and_scrub_a_fraction(store, draft, tmp_path):
    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.steps.healing import quarantine, scrub

    ctx = Context.from_settings(settings(), store=store)
    aid = published(store, tmp_path / "a", draft)
    with pytest.raises(StoreArgumentError, match="--reason must say why"):
        quarantine(ctx, aid, "  ")
    for bad in (0, -0.5, 1.01):
        with pytest.raises(StoreArgumentError, match="a fraction in"):
            scrub(ctx, sample=bad)
    assert quarantine(ctx, aid, "bad engine")[0] == aid


def test_recovery_with_no_earlier_artifact_that_qualifies_rolls_nothing_back(store, draft, tmp_path):
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.quarantine import quarantine
    from buildctl.steps.healing import recover_channels

    unvalidated = publish_files(store, tmp_path / "u", draft, {"rank0.engine": 1000}, seed=5, verdict=None)
    promote(store, staged(store, unvalidated), "prod", move=ChannelMove(forced=True, reason="test: no attestation"))
    only = published(store, tmp_path / "o", draft, seed=6)
    promote(store, staged(store, only), "prod")
    quarantine(store, only, "bad engine", auth=Authority(who="test"))
    got = {r.channel: r for r in recover_channels(Context.from_settings(settings(), store=store), only)}
    assert got["prod"].rolled_back_to is None and got["prod"].detail == "no earlier artifact deep-verifies and qualifies"
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key)[0].artifact_id == only
    assert got["staging"].rolled_back_to == unvalidated  # staging takes an artifact without a passing attestation


# --- scrub's arithmetic and heal's branches, each alone on a local store (`make mutants` sees these) ---


@pytest.fixture
def local(tmp_path):
    return open_store(str(tmp_path / "store"))


def _ctx(store) -> Context:
    return Context.from_settings(settings(), store=store)


def _same_size(store, ids: list[str]) -> int:
    (size,) = {get_manifest(store, a).total_size for a in ids}
    return size


@pytest.mark.parametrize("slack, verified", [(0, 2), (-1, 1)])
def test_scrub_spends_its_budget_to_the_byte(local, draft, tmp_path, slack, verified):
    """A budget of exactly two artifacts' bytes checks two; one byte less checks one."""
    from buildctl.steps.healing import scrub

    ids = [published(local, tmp_path / f"a{i}", draft, seed=i) for i in range(3)]
    size = _same_size(local, ids)
    report = scrub(_ctx(local), budget_bytes=2 * size + slack, seed=0)
    statuses = [r.status for r in report.rows]
    assert statuses.count("ok") == verified and statuses.count("skipped") == 3 - verified, statuses
    assert report.checked_bytes == verified * size


@pytest.mark.parametrize("sample, checked", [(1.0, 4), (0.5, 2), (0.25, 1), (0.1, 1)])
def test_scrub_samples_a_rounded_fraction_of_the_rest_and_at_least_one(local, draft, tmp_path, sample, checked):
    """By default (no --channels-only) the artifacts no channel points at are sampled too."""
    from buildctl.steps.healing import scrub

    ids = [published(local, tmp_path / f"a{i}", draft, seed=i) for i in range(4)]
    report = scrub(_ctx(local), sample=sample, seed=7)
    assert len(report.rows) == checked and {r.status for r in report.rows} == {"ok"}
    assert {r.artifact_id for r in report.rows} <= set(ids)
    assert report.checked_bytes == checked * _same_size(local, ids)


def test_scrub_passes_over_a_quarantined_artifact_and_checks_the_rest(local, draft, tmp_path):
    from buildctl.artifact_store.quarantine import quarantine
    from buildctl.steps.healing import scrub

    held = published(local, tmp_path / "q", draft, seed=1)
    promote(local, staged(local, held), "prod")  # a channel points at it: checked first
    others = [published(local, tmp_path / f"o{i}", draft, seed=2 + i) for i in range(3)]
    quarantine(local, held, "INC-9", auth=Authority(who="test"))
    report = scrub(_ctx(local))
    assert report.rows[0].artifact_id == held
    assert {r.artifact_id: r.status for r in report.rows} == {held: "quarantined"} | {o: "ok" for o in others}
    assert report.checked_bytes == 3 * _same_size(local, others)  # a quarantined artifact is not counted


def test_scrub_finds_a_rotted_manifest_listed_after_good_ones_and_counts_no_bytes_for_it(local, draft, tmp_path):
    from buildctl.artifact_store.layout import IDENTITY_INDEX
    from buildctl.steps.healing import scrub

    from ..support.helpers import rot_manifest

    ids = sorted(published(local, tmp_path / f"a{i}", draft, seed=i) for i in range(3))
    bad = ids[-1]  # listed last: the good manifests come first
    size = _same_size(local, ids)
    for key in list(local.list(IDENTITY_INDEX)):
        local.delete(key)  # no copy to restore it from
    rot_manifest(local, bad)
    report = scrub(_ctx(local))
    (row,) = [r for r in report.rows if r.artifact_id == bad]
    assert row.status == "corrupt" and row.bytes == 0 and row.problems[0].startswith("manifest: "), row
    assert report.failed and report.checked_bytes == 2 * size


def test_scrub_reports_a_forged_history_record_while_another_ref_turns_malformed(local, draft, tmp_path, monkeypatch):
    """The prod ref is garbled by a writer between scrub's listing and its read of the chain
    (check_records names such a ref); the staging chain after it is still checked."""
    from buildctl.steps import healing
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.layout import channel_key, history_key

    from ..support.helpers import forged_history_record

    P, compat = draft.profile_name, draft.compat_key
    a0 = published(local, tmp_path / "a0", draft, seed=1)
    a1 = published(local, tmp_path / "a1", draft, seed=2)
    promote(local, staged(local, a0), "prod")
    ref = read_channel(local, P, "staging", compat)[0]
    squatted = history_key(P, "staging", compat, 2)
    local.put_bytes(squatted, forged_history_record(ref, 2, a1, a0))
    real = healing.checked_history

    def garbled_meanwhile(store, profile, channel, *args, **kw):
        if channel == "prod":
            key = channel_key(profile, channel, compat)
            assert store.cas(key, b'{"seq": 0}', store.get_ref(key)[1])
        return real(store, profile, channel, *args, **kw)

    monkeypatch.setattr(healing, "checked_history", garbled_meanwhile)
    report = healing.scrub(_ctx(local), channels_only=True)
    assert [k for k, _ in report.history] == [squatted] and report.failed


def test_heal_of_an_already_quarantined_artifact_keeps_its_record_and_names_its_reason(local, draft, tmp_path):
    from buildctl.artifact_store.quarantine import quarantine
    from buildctl.steps.healing import heal_artifact

    good = published(local, tmp_path / "g", draft, seed=1)
    promote(local, staged(local, good), "prod")
    bad = published(local, tmp_path / "b", draft, seed=2)
    promote(local, staged(local, bad), "prod")
    key, _ = quarantine(local, bad, "segfaults (INC-9)", problems=["rank0.engine: 4 bytes differ"],
                        auth=Authority(who="test"))
    report = heal_artifact(_ctx(local), bad)
    assert report.quarantine_key == key and report.problems == ["rank0.engine: 4 bytes differ"]
    assert not report.store_copy_ok and report.rebuild == [(draft.profile_name, draft.compat_key)]
    assert next(r for r in report.recoveries if r.channel == "prod").rolled_back_to == good
    last = history(local, draft.profile_name, "prod", draft.compat_key)[-1]
    assert last.reason == f"quarantine of {bad}: segfaults (INC-9)"


def test_heal_whose_repair_makes_the_artifact_whole_names_no_rebuild(local, draft, tmp_path):
    from buildctl.steps.healing import heal_artifact

    mirror = open_store(str(tmp_path / "mirror"))
    tree = make_tree(tmp_path / "a", {"config.json": b"{}", "rank0.engine": 100_000})
    aid = publish_tree(local, tree, draft).artifact_id
    publish_tree(mirror, tree, draft)
    rot(local, digest_of(local, aid, "rank0.engine"), "flip")
    report = heal_artifact(_ctx(local), aid, repair_source=mirror.uri)
    assert report.repair.healthy and report.repair.replaced == ["rank0.engine"] and report.rebuild == []


def test_recovery_passes_over_an_unvalidated_artifact_to_an_older_validated_one(local, draft, tmp_path):
    from buildctl.artifact_store.quarantine import quarantine
    from buildctl.steps.healing import recover_channels

    validated = published(local, tmp_path / "v", draft, seed=1)
    promote(local, staged(local, validated), "prod")
    unvalidated = publish_files(local, tmp_path / "u", draft, {"rank0.engine": 1000}, seed=5, verdict=None)
    promote(local, staged(local, unvalidated), "prod", move=ChannelMove(forced=True, reason="test: no attestation"))
    newest = published(local, tmp_path / "n", draft, seed=3)
    promote(local, staged(local, newest), "prod")
    quarantine(local, newest, "bad engine", auth=Authority(who="test"))
    got = {r.channel: r for r in recover_channels(_ctx(local), newest)}
    assert got["prod"].rolled_back_to == validated  # prod needs a passing attestation for the key
