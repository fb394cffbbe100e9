"""Install, switch back and the node-side refusals (buildctl.artifact_store.pull), called directly on a
local store: fast, and `make mutants` runs these first for the module. The fault cases on both
stores are in test_pull.py and tests/faults/."""

from __future__ import annotations

import errno
import json
import os
import stat
from datetime import timedelta

import pytest

import buildctl.artifact_store as ops
import buildctl.artifact_store.download as download_mod
from buildctl.artifact_store.backend import open_store
from buildctl.artifact_store.channels import set_channel
from buildctl.times import parse_utc
from buildctl.artifact_store.errors import (
    ExpiredRecordError,
    InstallError,
    PreflightError,
    RollbackError,
    SignatureError,
    StaleRecordError,
    VerificationError,
)
from buildctl.artifact_store.layout import blob_key, history_key
from buildctl.artifact_store.install_dir import (
    channel_ref,
    current_artifact,
    health_marks,
    install_artifact,
    installed_seqs,
    mark_health,
    previous_artifact,
    switch_back,
)
from buildctl.artifact_store.pull import pull
from buildctl.artifact_store.trust import check_fresh, check_trust
from buildctl.artifact_store.signing import TrustedKeys, sign_manifest
from buildctl.artifact_store.authority import Authority

from ..support.helpers import RangedStore as Ranged, make_signer, make_tree, write_attestation

MiB = 1024 * 1024
P = "tiny-llama-cpu"



@pytest.fixture
def env(tmp_path, draft):
    store = open_store(f"file://{tmp_path / 'store'}")
    ids = []
    for i in range(4):
        root = make_tree(tmp_path / f"t{i}", {"config.json": f"{i}".encode(), "run.sh": b"#!/bin/sh\n",
                                             "rank0.engine": 20_000 + i, "tok/a/vocab.json": b"{}",
                                             "tok/a/merges.txt": b"a b"}, seed=i)
        os.chmod(root / "run.sh", 0o755)
        aid = ops.publish_tree(store, root, draft).artifact_id
        write_attestation(store, aid, draft.compat_key, "pass")
        ids.append(aid)
    return store, ids, tmp_path / "deep" / "er" / "node", draft


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_install_sets_modes_and_reports_bytes_and_previous(env):
    store, (a, b, *_), dest, _ = env
    r = install_artifact(store, a, dest)
    assert r.installed and r.previous is None and r.bytes == ops.get_manifest(store, a).total_size
    assert mode(dest / "current" / "run.sh") == 0o555 and mode(dest / "current" / "config.json") == 0o444
    again = install_artifact(store, a, dest)
    assert not again.installed and again.bytes == 0 and again.previous == a
    r2 = install_artifact(store, b, dest)
    assert (r2.previous, current_artifact(dest), previous_artifact(dest)) == (a, b, a)
    back = install_artifact(store, a, dest)  # the older install of a is replaced by a fresh one
    assert back.installed and (current_artifact(dest), previous_artifact(dest)) == (a, b)


def test_no_current_or_previous_on_a_fresh_or_broken_node(env, tmp_path):
    store, (a, *_), dest, _ = env
    assert current_artifact(tmp_path / "none") is None and previous_artifact(tmp_path / "none") is None
    install_artifact(store, a, dest)
    assert previous_artifact(dest) is None
    os.symlink("versions/gone", dest / "previous")
    assert previous_artifact(dest) is None


def test_by_default_two_versions_stay_and_files_download_even_with_zero_workers(env):
    store, ids, dest, _ = env
    for aid in ids:
        install_artifact(store, aid, dest, workers=0)
    assert len(list((dest / "versions").iterdir())) == 2 and current_artifact(dest) == ids[-1]


@pytest.mark.parametrize("keep,left", [(2, 2), (3, 3), (4, 4)])
def test_prune_keeps_current_previous_and_the_newest_others(env, keep, left):
    store, ids, dest, _ = env
    for aid in ids:
        install_artifact(store, aid, dest, keep=keep)
    names = {p.name for p in (dest / "versions").iterdir()}
    assert names == {aid.removeprefix("xxh3-128:") for aid in ids[-left:]}  # current, previous, then the newest


def test_switch_back_restores_current_and_previous(env):
    store, (a, b, c, _), dest, _ = env
    first = install_artifact(store, a, dest, keep=3)
    assert switch_back(dest, first) is None and not os.path.lexists(dest / "current")
    install_artifact(store, a, dest, keep=3)
    install_artifact(store, b, dest, keep=3)
    res = install_artifact(store, c, dest, keep=3)
    assert switch_back(dest, res) == b
    assert (current_artifact(dest), previous_artifact(dest)) == (b, a)
    res = install_artifact(store, c, dest, keep=2)  # keep 2: a is pruned
    assert switch_back(dest, res) == b and not os.path.lexists(dest / "previous")
    res = install_artifact(store, c, dest)
    install_artifact(store, a, dest)  # something else went in meanwhile: left alone
    assert switch_back(dest, res) == a and current_artifact(dest) == a


def big(store, tmp_path, draft, executable=False) -> str:
    root = make_tree(tmp_path / "big", {"rank0.engine": 3 * MiB + 5})
    if executable:
        os.chmod(root / "rank0.engine", 0o755)
    return ops.publish_tree(store, root, draft).artifact_id


def test_ranged_install_checks_size_and_presence(env, tmp_path):
    store, _, dest, draft = env
    aid = big(store, tmp_path, draft)
    with pytest.raises(VerificationError) as exc:
        install_artifact(Ranged(store, short_from=2 * MiB), aid, dest)
    (p,) = exc.value.problems
    assert (p.kind, p.expected, p.actual) == ("size", 3 * MiB + 5, 2 * MiB + MiB // 4)
    with pytest.raises(VerificationError) as exc:
        install_artifact(Ranged(store, vanish=True), aid, dest)
    assert exc.value.problems[0].kind == "missing" and "disappeared" in exc.value.problems[0].actual
    r = install_artifact(Ranged(store), aid, dest)
    assert r.installed and mode(dest / "current" / "rank0.engine") == 0o444
    exe = big(store, tmp_path / "x", draft, executable=True)
    install_artifact(Ranged(store), exe, dest)
    assert mode(dest / "current" / "rank0.engine") == 0o555


def test_a_blob_longer_than_its_entry_is_cut_short(env):
    store, (a, *_), dest, _ = env
    entry = next(f for f in ops.get_manifest(store, a).files if f.path == "rank0.engine")
    p = store.root / blob_key(entry.digest)
    os.chmod(p, 0o644)
    p.write_bytes(p.read_bytes() + b"x" * 100_000)
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, a, dest)
    assert [(x.path, x.kind, x.actual) for x in exc.value.problems] == [("rank0.engine", "size", f">{entry.size}")]


@pytest.mark.parametrize("code,raised", [(errno.ENOSPC, InstallError), (errno.EROFS, InstallError),
                                         (errno.EPERM, PermissionError)])
def test_write_errors_while_installing(env, monkeypatch, code, raised):
    store, (a, b, *_), dest, _ = env
    install_artifact(store, a, dest)
    real = open

    def failing(path, mode="r", *args, **kw):
        if "x" in mode:
            raise OSError(code, os.strerror(code), str(path)) if code != errno.EPERM else PermissionError(code, "no")
        return real(path, mode, *args, **kw)

    monkeypatch.setattr(download_mod, "open", failing, raising=False)
    with pytest.raises(raised) as exc:
        install_artifact(store, b, dest)
    if raised is InstallError:
        assert f"{os.strerror(code)} while writing {dest}/.staging-" in str(exc.value)
    assert current_artifact(dest) == a and not list(dest.glob(".staging-*"))


def test_a_preflight_that_fails_installs_nothing(env):
    store, (a, b, *_), dest, _ = env
    install_artifact(store, a, dest)

    def refuse(manifest, staging):
        raise RuntimeError("engine does not load")

    with pytest.raises(PreflightError, match="RuntimeError: engine does not load"):
        install_artifact(store, b, dest, preflight=refuse)
    assert current_artifact(dest) == a and not list(dest.glob(".staging-*"))


def test_state_and_health_files_survive_garbage(tmp_path):
    dest = tmp_path / "node"
    dest.mkdir()
    assert installed_seqs(dest) == {} and health_marks(dest) == {}
    (dest / ".buildctl-state.json").write_text("[1, 2]")
    (dest / ".buildctl-health.json").write_text('{"a": "not a dict", "b": {"status": "healthy"}}')
    assert installed_seqs(dest) == {} and health_marks(dest) == {"b": {"status": "healthy"}}
    (dest / ".buildctl-state.json").write_text("{broken")
    (dest / ".buildctl-health.json").write_text("[]")
    assert installed_seqs(dest) == {} and health_marks(dest) == {}
    mark_health(dest, "x", "failed", "2026-01-01T00:00:00Z")
    mark_health(dest, "y", "healthy", "2026-01-01T00:00:01Z", "ok")
    assert health_marks(dest) == {"x": {"status": "failed", "when": "2026-01-01T00:00:00Z", "detail": ""},
                                  "y": {"status": "healthy", "when": "2026-01-01T00:00:01Z", "detail": "ok"}}


def test_check_fresh_floor_and_expiry(env):
    store, (a, *_), _, draft = env
    m = ops.get_manifest(store, a)
    rec = set_channel(store, a, m, "prod", auth=Authority(signer=make_signer(), ttl_s=60))
    check_fresh(rec, min_seq=1)
    with pytest.raises(StaleRecordError):
        check_fresh(rec, min_seq=2)
    old = rec.model_copy(update={"expires": (parse_utc(rec.when) - timedelta(seconds=1)).isoformat()})
    with pytest.raises(ExpiredRecordError):
        check_fresh(old)


@pytest.fixture
def signed(env):
    store, ids, dest, draft = env
    builder, p1, p2 = make_signer(), make_signer(), make_signer()
    for aid in ids:
        sign_manifest(store, aid, builder)
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()},
                           "promoter": {k.key_id: k.private.public_key() for k in (p1, p2)}})
    return store, ids, dest, trusted, p1, p2


def test_pull_records_the_seq_and_refuses_older_records(signed):
    store, (a, b, *_), dest, trusted, p1, _ = signed
    m = ops.get_manifest(store, a)
    set_channel(store, a, m, "prod", auth=Authority(signer=p1))
    r = pull(store, P, "prod", dest, [m.compat_key], trusted=trusted)
    assert r.installed and r.record.seq == 1
    assert installed_seqs(dest) == {f"{P}/prod/{m.compat_key}": 1}
    assert (dest / "current" / "tok" / "a" / "merges.txt").read_bytes() == b"a b"
    again = pull(store, P, "prod", dest, [m.compat_key], trusted=trusted)  # the same record again: fine
    assert not again.installed
    rec2 = set_channel(store, b, m, "prod", auth=Authority(signer=p1))
    pull(store, P, "prod", dest, [m.compat_key], trusted=trusted)
    set_channel(store, ids_c := signed[1][2], m, "prod", auth=Authority(signer=p1))
    pull(store, P, "prod", dest, [m.compat_key], trusted=trusted)
    assert len(list((dest / "versions").iterdir())) == 2 and current_artifact(dest) == ids_c  # keep 2 by default
    set_channel(store, b, m, "prod", auth=Authority(signer=p1))
    pull(store, P, "prod", dest, [m.compat_key], trusted=trusted)
    old = ops.history(store, P, "prod", m.compat_key)[0]
    with pytest.raises(RollbackError):
        check_trust(store, old, trusted, seen=installed_seqs(dest)[channel_ref(old)])
    with pytest.raises(RollbackError):
        check_trust(store, rec2, trusted, seen=installed_seqs(dest)[channel_ref(rec2)])
    last = ops.history(store, P, "prod", m.compat_key)[-1]
    check_trust(store, last, trusted, seen=installed_seqs(dest)[channel_ref(last)])  # the same seq again: fine


def test_a_fresh_node_refuses_a_ref_behind_the_signed_history(signed, tmp_path):
    store, (a, b, c, _), dest, trusted, p1, _ = signed
    m = ops.get_manifest(store, a)
    r1 = set_channel(store, a, m, "prod", auth=Authority(signer=p1))
    set_channel(store, b, m, "prod", auth=Authority(signer=p1))
    with pytest.raises(StaleRecordError):
        check_trust(store, r1, trusted)
    # an unsigned (forged) history entry above proves nothing: the newest *signed* one counts
    forged = r1.model_copy(update={"seq": 9, "signature": None})
    store.put_bytes(history_key(P, "prod", m.compat_key, 9), forged.to_bytes())
    rec2 = ops.history(store, P, "prod", m.compat_key)[1]
    check_trust(store, rec2, trusted)
    with pytest.raises(StaleRecordError):  # the forged #9 does not hide the signed #2 either
        check_trust(store, r1, trusted)


def test_k_of_n_records_and_what_one_signature_may_still_do(signed, tmp_path):
    store, (a, b, c, _), dest, trusted, p1, p2 = signed
    trusted2 = TrustedKeys(trusted.by_role, thresholds={"prod": 2})
    m = ops.get_manifest(store, a)
    set_channel(store, a, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    with pytest.raises(SignatureError, match="1 of the 2 promoter signatures"):
        check_trust(store, ops.history(store, P, "prod", m.compat_key)[0], trusted2)
    set_channel(store, b, m, "prod", auth=Authority(signer=p1, trusted=trusted2))
    two = set_channel(store, b, m, "prod", auth=Authority(signer=p2, trusted=trusted2))
    check_trust(store, two, trusted2)
    # a single-signature rollback to b is accepted: b was approved by the quorum before
    set_channel(store, c, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    back = set_channel(store, b, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    check_trust(store, back, trusted2)
    # ... but not to c, which only ever had one signature, nor as a promotion
    to_c = set_channel(store, c, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, to_c, trusted2)
    assert json.loads(to_c.to_bytes())["action"] == "rollback"


def test_a_quorum_approved_rollout_does_not_approve_a_rollback_elsewhere(signed, tmp_path):
    """k-of-n: a single-signature record may point only at an artifact a quorum record moved the
    channel to (or rolled out); a quorum-approved rollout of b approves b, not c."""
    from buildctl.artifact_store.rollout import RolloutPlan, parse_waves

    store, (a, b, c, _), dest, trusted, p1, p2 = signed
    trusted2 = TrustedKeys(trusted.by_role, thresholds={"prod": 2})
    m = ops.get_manifest(store, a)
    set_channel(store, a, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    plan = RolloutPlan(waves=parse_waves("10,100", None), bake_s=0)
    set_channel(store, b, m, "prod", rollout=plan, auth=Authority(signer=p1, trusted=trusted2))
    started = set_channel(store, b, m, "prod", rollout=plan, auth=Authority(signer=p2, trusted=trusted2))
    assert started.rollout is not None and len(started.signers(trusted2)) == 2
    to_c = set_channel(store, c, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    with pytest.raises(SignatureError, match="1 of the 2"):
        check_trust(store, to_c, trusted2)
    to_b = set_channel(store, b, m, "prod", action="rollback", auth=Authority(signer=p1, trusted=trusted2))
    check_trust(store, to_b, trusted2)
