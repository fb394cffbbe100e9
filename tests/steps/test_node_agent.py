"""buildctl.steps.node_agent before and after an upgrade: ``pull --require-covered``, ``pull
--for-upgrade TARGET --stage-only`` and ``node activate``, with fingerprint files standing in for
the host before and after, and engine-like trees (no preflight: stage and activate load nothing)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from buildctl.steps import node_agent
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.node.install_dir import current_artifact, local_problems, staged_engines
from buildctl.artifact_store.channels import set_channel
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.publish import ManifestDraft
from buildctl.artifact_store.trust.signing import TrustedKeys, sign_manifest
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.errors import SignatureError, VerificationError
from buildctl.steps.context import Context
from buildctl.engines.fingerprint import UpgradeTarget

from ..support.helpers import make_signer, publish_files, settings, write_attestation, staged
from ..support.s3server import free_ports
from ..support.trtllm_kit import h100x8
from buildctl.artifact_store.node.pull import PullOptions

PROFILE = "llama-3-8b-instruct-fp8-tp1"
BEFORE = h100x8()
AFTER = BEFORE.model_copy(update={"tensorrt_llm_version": "1.2.2", "tensorrt_version": "10.14.1.48"})  # hard


def publish_for(store, tmp_path: Path, fp, seed: int, size: int = 4096) -> str:
    draft = ManifestDraft(profile_name=PROFILE, profile_hash="xxh3-128:" + "0" * 32, backend="trtllm",
                          compat_key=fp.compat_key("trtllm"), fingerprint=fp.model_dump(mode="json"),
                          tool_versions={"backend": fp.tool_version("trtllm")}, model_digest=None, build_key=None)
    aid = publish_files(store, tmp_path / f"tree{seed}", draft, {"config.json": f"{seed}".encode(),
                                                                "rank0.engine": size}, seed=seed, verdict=None)
    write_attestation(store, aid, fp.compat_key("trtllm"), "pass", validator=fp)
    return aid


@pytest.fixture
def fleet_store(tmp_path, monkeypatch):
    """A store with prod for the host before (A) and after (B) the upgrade; the node's
    fingerprint file says 'before'; A is installed."""
    store = open_store(f"file://{tmp_path / 'store'}")
    a = publish_for(store, tmp_path, BEFORE, 1)
    b = publish_for(store, tmp_path, AFTER, 2, size=3 * 1024 * 1024)
    for aid in (a, b):
        promote(store, staged(store, aid), "prod")
    fp_file = tmp_path / "fp.json"
    fp_file.write_text(json.dumps(BEFORE.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp_file))
    monkeypatch.setenv("BUILDCTL_STORE", store.uri)
    target = tmp_path / "target.yaml"
    target.write_text('tensorrt_llm_version: "1.2.2"\ntensorrt_version: "10.14.1.48"\n')
    dest = tmp_path / "node"
    ctx = Context.from_settings(settings(), store=store)
    node_agent.pull(ctx.with_fingerprint(BEFORE), PROFILE, 'prod', dest, PullOptions(skip_preflight=True, health_check=False))
    assert current_artifact(dest) == a
    return {"store": store, "a": a, "b": b, "fp_file": fp_file, "target": target, "dest": dest, "ctx": ctx}


def unreachable(monkeypatch) -> None:
    """Point the store at an S3 endpoint nothing listens on."""
    (port,) = free_ports(1)
    monkeypatch.setenv("BUILDCTL_STORE", "s3://gone/buildctl")
    monkeypatch.setenv("BUILDCTL_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")


def test_stage_only_leaves_current_untouched_and_activate_swaps_offline_in_under_a_second(fleet_store, cli,
                                                                                         monkeypatch):
    f = fleet_store
    before = os.readlink(f["dest"] / "current")
    code, out, err = cli("--json", "pull", "--profile", PROFILE, "--channel", "prod", "--dest", f["dest"],
                         "--for-upgrade", f["target"], "--stage-only")
    assert code == 0, err
    staged = json.loads(out)
    assert staged["artifact_id"] == f["b"] and staged["downloaded"] and staged["coverage"]["covered"]
    assert staged["compat_key"] == AFTER.compat_key("trtllm")
    assert os.readlink(f["dest"] / "current") == before and current_artifact(f["dest"]) == f["a"]  # untouched
    assert (f["dest"] / "versions" / f["b"].split(":")[1] / "rank0.engine").stat().st_size == 3 * 1024 * 1024

    # the upgrade happens; the store is gone
    f["fp_file"].write_text(json.dumps(AFTER.model_dump(mode="json")))
    unreachable(monkeypatch)
    ctx = Context.from_settings(settings())
    t0 = time.monotonic()
    got = node_agent.activate(ctx, PROFILE, f["dest"], skip_preflight=True)
    took = time.monotonic() - t0
    assert got.staged is not None and got.result.installed and took < 1.0, took
    assert current_artifact(f["dest"]) == f["b"] and got.result.previous == f["a"]
    assert os.readlink(f["dest"] / "previous") == before  # instant rollback target
    assert staged_engines(f["dest"]) == []
    code, out, err = cli("--json", "node", "activate", "--profile", PROFILE, "--dest", f["dest"])
    assert code == 9 and "cannot reach" in err  # nothing staged any more: it pulls, and the store is gone
    assert current_artifact(f["dest"]) == f["b"]


def test_activate_with_nothing_staged_and_the_store_unreachable_exits_9_and_keeps_current(fleet_store, cli,
                                                                                         monkeypatch):
    f = fleet_store
    unreachable(monkeypatch)
    before = os.readlink(f["dest"] / "current")
    code, _, err = cli("node", "activate", "--profile", PROFILE, "--dest", f["dest"])
    assert code == 9 and "store s3://gone/buildctl" in err
    assert os.readlink(f["dest"] / "current") == before


def test_for_upgrade_without_stage_only_is_refused(fleet_store, cli):
    f = fleet_store
    code, _, err = cli("pull", "--profile", PROFILE, "--channel", "prod", "--dest", f["dest"],
                       "--for-upgrade", f["target"])
    assert code == 2 and "--stage-only" in err


def test_activation_rehashes_an_old_staging_and_refuses_damaged_bytes(fleet_store, monkeypatch):
    f = fleet_store
    node_agent.stage(f['ctx'].with_fingerprint(BEFORE), PROFILE, 'prod', f['dest'], UpgradeTarget(tensorrt_llm_version='1.2.2', tensorrt_version='10.14.1.48'))
    engine = f["dest"] / "versions" / f["b"].split(":")[1] / "rank0.engine"
    os.chmod(engine, 0o644)
    data = bytearray(engine.read_bytes())
    data[100] ^= 1
    engine.write_bytes(bytes(data))
    c = f["ctx"]
    no_window = Context(c.settings, c.store, c.auth.but(verify_window_s=0))  # the staging's verify is too old
    with pytest.raises(VerificationError) as err:
        node_agent.activate(no_window, PROFILE, f["dest"], fingerprint=AFTER)
    assert [p.path for p in err.value.problems] == ["rank0.engine"]
    assert current_artifact(f["dest"]) == f["a"]


def test_a_signed_staging_activates_offline_and_a_tampered_one_does_not(fleet_store, tmp_path):
    f = fleet_store
    builder, promoter = make_signer(), make_signer()
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()},
                           "promoter": {promoter.key_id: promoter.private.public_key()}})
    sign_manifest(f["store"], f["b"], builder)
    auth = Authority(signer=promoter, trusted=trusted)
    set_channel(f["store"], f["b"], get_manifest(f["store"], f["b"]), "prod", auth=auth)  # a signed record (#2)
    ctx = Context(f["ctx"].settings, f["store"], auth)
    target = UpgradeTarget(tensorrt_llm_version="1.2.2", tensorrt_version="10.14.1.48")
    node_agent.stage(ctx.with_fingerprint(BEFORE), PROFILE, 'prod', f['dest'], target)
    (entry_file,) = (f["dest"] / ".buildctl-staged").glob("*.json")
    good = entry_file.read_text()
    entry = json.loads(good)
    entry["record"]["artifact_id"] = f["a"]  # point the signed record elsewhere
    entry_file.write_text(json.dumps(entry))
    with pytest.raises(SignatureError):
        node_agent.activate(ctx, PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
    assert current_artifact(f["dest"]) == f["a"]
    unsigned = json.loads(good)
    unsigned["manifest_signatures"] = []  # the manifest's builder signature stripped
    entry_file.write_text(json.dumps(unsigned))
    with pytest.raises(SignatureError, match="unsigned"):
        node_agent.activate(ctx, PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
    entry_file.write_text(good)
    got = node_agent.activate(ctx, PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
    assert got.staged is not None and current_artifact(f["dest"]) == f["b"]


def test_pull_reports_coverage_and_require_covered_refuses_before_downloading(fleet_store, cli, tmp_path):
    f = fleet_store
    newer_driver = BEFORE.model_copy(update={"driver_version": "590.44.01"})  # soft: same key, not validated there
    f["fp_file"].write_text(json.dumps(newer_driver.model_dump(mode="json")))
    dest = tmp_path / "other-node"
    code, _, err = cli("pull", "--profile", PROFILE, "--channel", "prod", "--dest", dest, "--skip-preflight",
                       "--require-covered")
    assert code == 5 and "not validated on this host's soft values" in err and "driver_version=590.44.01" in err
    assert not (dest / "versions").exists() or not any((dest / "versions").iterdir())
    code, out, err = cli("--json", "pull", "--profile", PROFILE, "--channel", "prod", "--dest", dest,
                         "--skip-preflight")
    assert code == 0, err
    cov = json.loads(out)["coverage"]
    assert cov["covered"] is False and cov["differences"] == {"driver_version": ["590.44.01", BEFORE.driver_version]}
    f["fp_file"].write_text(json.dumps(BEFORE.model_dump(mode="json")))
    code, out, err = cli("--json", "pull", "--profile", PROFILE, "--channel", "prod", "--dest", tmp_path / "n3",
                         "--skip-preflight", "--require-covered")
    assert code == 0 and json.loads(out)["coverage"]["covered"], err


def test_a_node_that_staged_an_engine_restores_its_rotted_manifest(fleet_store, cli):
    """#29 item 3: a node's staged engine keeps the manifest's bytes; `repair --from DIR` puts a
    rotted manifest back from there when the store's own copies are gone (the id proves them)."""
    from buildctl.artifact_store.layout import IDENTITY_INDEX
    from buildctl.artifact_store.read import verify

    from ..support.helpers import overwrite, rot_manifest

    f = fleet_store
    code, _, err = cli("--json", "pull", "--profile", PROFILE, "--channel", "prod", "--dest", f["dest"],
                       "--for-upgrade", f["target"], "--stage-only")
    assert code == 0, err
    store = f["store"]
    for key in store.list(IDENTITY_INDEX):
        overwrite(store, key, b"{}")
    rot_manifest(store, f["b"])
    code, out, err = cli("--json", "repair", f["b"], "--from", f["dest"])
    assert code == 0, err
    assert verify(store, f["b"], deep=True)


# --- #48 items 1-3: activate verifies what it swaps in ------------------------------------------

TARGET = UpgradeTarget(tensorrt_llm_version="1.2.2", tensorrt_version="10.14.1.48")


def _damage(engine_dir: Path, kind: str, tmp_path: Path) -> None:
    """Damage a staged engine on the node's disk, as a flaky disk or a careless operator would."""
    import shutil

    for root, dirs, files in os.walk(engine_dir):
        os.chmod(root, 0o755)
        for n in files:
            os.chmod(os.path.join(root, n), 0o644)
    big = engine_dir / "rank0.engine"
    if kind in ("flip", "flip-keep-mtime"):
        st = big.stat()
        data = bytearray(big.read_bytes())
        data[len(data) // 2] ^= 0x40
        big.write_bytes(bytes(data))
        if kind == "flip-keep-mtime":
            os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif kind == "truncate":
        os.truncate(big, big.stat().st_size // 2)
    elif kind == "delete":
        big.unlink()
    elif kind == "empty-dir":
        for p in engine_dir.iterdir():
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    elif kind == "add-file":
        (engine_dir / "extra.bin").write_bytes(b"not in the manifest")
    elif kind == "file-symlink":  # the same bytes, but through a link out of the tree
        copy = tmp_path / "elsewhere.engine"
        shutil.copyfile(big, copy)
        big.unlink()
        os.symlink(copy, big)
    elif kind == "dir-symlink":
        copy = tmp_path / "elsewhere-lora"
        shutil.copytree(engine_dir / "lora", copy)
        shutil.rmtree(engine_dir / "lora")
        os.symlink(copy, engine_dir / "lora")
    else:
        raise AssertionError(kind)


@pytest.fixture
def staged_b(tmp_path, monkeypatch):
    """A node with A current and B (with a nested folder) staged for after the upgrade."""
    store = open_store(f"file://{tmp_path / 'store'}")
    a = publish_for(store, tmp_path, BEFORE, 1)
    draft = ManifestDraft(profile_name=PROFILE, profile_hash="xxh3-128:" + "0" * 32, backend="trtllm",
                          compat_key=AFTER.compat_key("trtllm"), fingerprint=AFTER.model_dump(mode="json"),
                          tool_versions={"backend": AFTER.tool_version("trtllm")}, model_digest=None, build_key=None)
    b = publish_files(store, tmp_path / "treeb", draft, {"config.json": b"{}", "rank0.engine": 256 * 1024,
                                                          "lora/adapter.bin": 4096}, seed=7, verdict=None)
    write_attestation(store, b, AFTER.compat_key("trtllm"), "pass", validator=AFTER)
    for aid in (a, b):
        promote(store, staged(store, aid), "prod")
    fp_file = tmp_path / "fp.json"
    fp_file.write_text(json.dumps(AFTER.model_dump(mode="json")))
    monkeypatch.setenv("BUILDCTL_FINGERPRINT_FILE", str(fp_file))
    monkeypatch.setenv("BUILDCTL_STORE", store.uri)
    dest = tmp_path / "node"
    ctx = Context.from_settings(settings(), store=store)
    node_agent.pull(ctx.with_fingerprint(BEFORE), PROFILE, 'prod', dest, PullOptions(skip_preflight=True, health_check=False))
    node_agent.stage(ctx.with_fingerprint(BEFORE), PROFILE, 'prod', dest, TARGET)
    return {"store": store, "a": a, "b": b, "dest": dest, "ctx": ctx,
            "engine": dest / "versions" / b.split(":")[1]}


DAMAGE = ["flip", "flip-keep-mtime", "truncate", "delete", "empty-dir", "add-file", "file-symlink", "dir-symlink"]


@pytest.mark.parametrize("window", [3600.0, 0.0])
@pytest.mark.parametrize("kind", DAMAGE)
def test_activate_refuses_every_kind_of_damage_to_the_staged_engine(staged_b, tmp_path, kind, window):
    """#48 item 1: inside the verify window and past it, a damaged staged tree never reaches current."""
    f = staged_b
    _damage(f["engine"], kind, tmp_path)
    c = f["ctx"]
    ctx = Context(c.settings, c.store, c.auth.but(verify_window_s=window))
    before = os.readlink(f["dest"] / "current")
    with pytest.raises(VerificationError):
        node_agent.activate(ctx, PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
    assert os.readlink(f["dest"] / "current") == before and current_artifact(f["dest"]) == f["a"]


def test_activate_of_a_damaged_staging_exits_4_on_the_cli(staged_b, tmp_path, cli):
    f = staged_b
    _damage(f["engine"], "add-file", tmp_path)
    code, _, err = cli("node", "activate", "--profile", PROFILE, "--dest", f["dest"], "--skip-preflight")
    assert code == 4 and "extra.bin" in err, err
    assert current_artifact(f["dest"]) == f["a"]


def test_activate_preflights_before_the_swap(staged_b, monkeypatch):
    """#48 item 1: the staged engine is test-loaded before current moves, as pull does."""
    from buildctl.artifact_store.errors import PreflightError

    f = staged_b
    with pytest.raises(PreflightError):  # trtllm cannot load on this CPU host: refused, current kept
        node_agent.activate(f["ctx"], PROFILE, f["dest"], fingerprint=AFTER)
    assert current_artifact(f["dest"]) == f["a"]
    seen = []
    monkeypatch.setattr(node_agent, "preflight_for", lambda st: lambda m, p: seen.append(p))
    got = node_agent.activate(f["ctx"], PROFILE, f["dest"], fingerprint=AFTER)
    assert seen == [f["engine"]] and current_artifact(f["dest"]) == f["b"] and got.result.installed


def test_activate_refuses_an_engine_quarantined_after_staging(staged_b, cli, monkeypatch):
    """#48 item 2: a quarantine recorded after staging is honoured when the store answers, and an
    unreachable store is said, not hidden."""
    from buildctl.artifact_store.quarantine import quarantine

    f = staged_b
    quarantine(f["store"], f["b"], "bad on another node", auth=Authority())
    code, _, err = cli("node", "activate", "--profile", PROFILE, "--dest", f["dest"], "--skip-preflight")
    assert code == 5 and "quarantined" in err, err
    assert current_artifact(f["dest"]) == f["a"]
    unreachable(monkeypatch)
    code, out, err = cli("--json", "node", "activate", "--profile", PROFILE, "--dest", f["dest"], "--skip-preflight")
    assert code == 0, err
    got = json.loads(out)
    assert got["activated"] and got["quarantine_checked"] is False
    assert "could not check" in err and "quarantine" in err


def test_activate_without_channel_takes_only_a_prod_staging(staged_b, tmp_path, cli):
    """#48 item 3: an engine staged from staging never reaches a node that activates prod (the default)."""
    f = staged_b
    store = f["store"]
    draft = ManifestDraft(profile_name=PROFILE, profile_hash="xxh3-128:" + "0" * 32, backend="trtllm",
                          compat_key=AFTER.compat_key("trtllm"), fingerprint=AFTER.model_dump(mode="json"),
                          tool_versions={"backend": AFTER.tool_version("trtllm")}, model_digest=None, build_key=None)
    c = publish_files(store, tmp_path / "treec", draft, {"config.json": b"{\"c\": 1}", "rank0.engine": 1024},
                      seed=9, verdict=None)
    staged(store, c)  # on staging only, newer seq than anything on prod
    # drop the prod staging so that only the staging one is on disk
    for p in (f["dest"] / ".buildctl-staged").glob("*--prod--*.json"):
        p.unlink()
    code, out, err = cli("pull", "--profile", PROFILE, "--channel", "staging", "--dest", f["dest"],
                         "--for-upgrade", _target_file(tmp_path), "--stage-only")
    assert code == 0, err
    assert "--channel staging" in out  # the hint names the channel it staged from
    got = node_agent.activate(f["ctx"], PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
    assert got.result.artifact_id != c and current_artifact(f["dest"]) == f["b"]  # pulled prod instead
    assert got.staged is None


def _target_file(tmp_path: Path) -> Path:
    t = tmp_path / "target.yaml"
    t.write_text('tensorrt_llm_version: "1.2.2"\ntensorrt_version: "10.14.1.48"\n')
    return t


def test_staging_again_rehashes_the_engine_already_there_instead_of_downloading(staged_b):
    s = staged_b
    again = node_agent.stage(s['ctx'].with_fingerprint(BEFORE), PROFILE, 'prod', s['dest'], TARGET)
    assert not again.downloaded and again.entry.artifact_id == s["b"]
    with open(s["engine"] / "rank0.engine", "r+b") as f:  # damaged: downloaded again
        os.chmod(s["engine"] / "rank0.engine", 0o644)
        f.write(b"X")
    fixed = node_agent.stage(s['ctx'].with_fingerprint(BEFORE), PROFILE, 'prod', s['dest'], TARGET)
    assert fixed.downloaded and not local_problems(get_manifest(s["store"], s["b"]), s["engine"])


def _flip_only(path: Path) -> None:
    """Flip one byte of ``path`` and touch nothing else (every other file keeps its stat)."""
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_flipped_file_after_untouched_ones_is_rehashed_inside_the_window(staged_b):
    """Files whose stat is unchanged are skipped one by one; the damaged one after them is still
    re-hashed and refused."""
    f = staged_b
    _flip_only(f["engine"] / "rank0.engine")  # config.json and lora/ sort before it, their stat unchanged
    with pytest.raises(VerificationError, match="rank0.engine"):
        node_agent.activate(f["ctx"], PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
    assert current_artifact(f["dest"]) == f["a"]


@pytest.mark.parametrize("window,refused", [(3600.0, False), (0.0, True)])
def test_recorded_stats_are_trusted_inside_the_window_only(staged_b, window, refused):
    """Damage that the stat cannot see (the staged entry's stats taken after it): inside the
    verify window the recorded stat is trusted, as documented; past it every byte is re-hashed."""
    from buildctl.artifact_store.node.install_dir import STAGED_DIR, file_stats

    f = staged_b
    _flip_only(f["engine"] / "rank0.engine")
    (entry_file,) = (f["dest"] / STAGED_DIR).glob("*.json")
    entry = json.loads(entry_file.read_text())
    entry["stats"] = file_stats(get_manifest(f["store"], f["b"]), f["engine"])
    entry_file.write_text(json.dumps(entry))
    c = f["ctx"]
    ctx = Context(c.settings, c.store, c.auth.but(verify_window_s=window))
    if refused:
        with pytest.raises(VerificationError, match="rank0.engine"):
            node_agent.activate(ctx, PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
        assert current_artifact(f["dest"]) == f["a"]
    else:
        node_agent.activate(ctx, PROFILE, f["dest"], fingerprint=AFTER, skip_preflight=True)
        assert current_artifact(f["dest"]) == f["b"]
