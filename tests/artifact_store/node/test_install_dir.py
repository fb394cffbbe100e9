"""The install directory (buildctl.artifact_store.node.install_dir) and the verified download under it
(buildctl.artifact_store.node.download), called directly on a local store: modes, current/previous,
pruning, switch back, ranged and cut-short blobs, write errors, preflight, the state and health
files. Fast; `make mutants` runs these first. The fault cases on both stores are in test_pull.py
and tests/faults/."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest
import buildctl.artifact_store.node.download as download_mod
from buildctl.artifact_store.errors import InstallError, PreflightError, VerificationError
from buildctl.artifact_store.layout import blob_key
from buildctl.artifact_store.node.install_dir import (
    InstallOptions,
    current_artifact,
    health_marks,
    install_artifact,
    installed_seqs,
    mark_health,
    previous_artifact,
    switch_back,
)

from ...support.helpers import RangedStore as Ranged, make_tree, staged

MiB = 1024 * 1024
P = "tiny-llama-cpu"



def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_install_sets_modes_and_reports_bytes_and_previous(node_env):
    store, (a, b, *_), dest, _ = node_env
    r = install_artifact(store, a, dest)
    assert r.installed and r.previous is None and r.bytes == get_manifest(store, a).total_size
    assert mode(dest / "current" / "run.sh") == 0o555 and mode(dest / "current" / "config.json") == 0o444
    again = install_artifact(store, a, dest)
    assert not again.installed and again.bytes == 0 and again.previous == a
    r2 = install_artifact(store, b, dest)
    assert (r2.previous, current_artifact(dest), previous_artifact(dest)) == (a, b, a)
    back = install_artifact(store, a, dest)  # the older install of a is replaced by a fresh one
    assert back.installed and (current_artifact(dest), previous_artifact(dest)) == (a, b)


def test_no_current_or_previous_on_a_fresh_or_broken_node(node_env, tmp_path):
    store, (a, *_), dest, _ = node_env
    assert current_artifact(tmp_path / "none") is None and previous_artifact(tmp_path / "none") is None
    install_artifact(store, a, dest)
    assert previous_artifact(dest) is None
    os.symlink("versions/gone", dest / "previous")
    assert previous_artifact(dest) is None


def test_by_default_two_versions_stay_and_files_download_even_with_zero_workers(node_env):
    store, ids, dest, _ = node_env
    for aid in ids:
        install_artifact(store, aid, dest, options=InstallOptions(workers=0))
    assert len(list((dest / "versions").iterdir())) == 2 and current_artifact(dest) == ids[-1]


@pytest.mark.parametrize("keep,left", [(2, 2), (3, 3), (4, 4)])
def test_prune_keeps_current_previous_and_the_newest_others(node_env, keep, left):
    store, ids, dest, _ = node_env
    for aid in ids:
        install_artifact(store, aid, dest, options=InstallOptions(keep=keep))
    names = {p.name for p in (dest / "versions").iterdir()}
    assert names == {aid.removeprefix("xxh3-128:") for aid in ids[-left:]}  # current, previous, then the newest


def test_switch_back_restores_current_and_previous(node_env):
    store, (a, b, c, _), dest, _ = node_env
    first = install_artifact(store, a, dest, options=InstallOptions(keep=3))
    assert switch_back(dest, first) is None and not os.path.lexists(dest / "current")
    install_artifact(store, a, dest, options=InstallOptions(keep=3))
    install_artifact(store, b, dest, options=InstallOptions(keep=3))
    res = install_artifact(store, c, dest, options=InstallOptions(keep=3))
    assert switch_back(dest, res) == b
    assert (current_artifact(dest), previous_artifact(dest)) == (b, a)
    res = install_artifact(store, c, dest, options=InstallOptions(keep=2))  # keep 2: a is pruned
    assert switch_back(dest, res) == b and not os.path.lexists(dest / "previous")
    res = install_artifact(store, c, dest)
    install_artifact(store, a, dest)  # something else went in meanwhile: left alone
    assert switch_back(dest, res) == a and current_artifact(dest) == a


def big(store, tmp_path, draft, executable=False) -> str:
    root = make_tree(tmp_path / "big", {"rank0.engine": 3 * MiB + 5})
    if executable:
        os.chmod(root / "rank0.engine", 0o755)
    return publish_tree(store, root, draft).artifact_id


def test_ranged_install_checks_size_and_presence(node_env, tmp_path):
    store, _, dest, draft = node_env
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


def test_a_blob_longer_than_its_entry_is_cut_short(node_env):
    store, (a, *_), dest, _ = node_env
    entry = next(f for f in get_manifest(store, a).files if f.path == "rank0.engine")
    p = store.root / blob_key(entry.digest)
    os.chmod(p, 0o644)
    p.write_bytes(p.read_bytes() + b"x" * 100_000)
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, a, dest)
    assert [(x.path, x.kind, x.actual) for x in exc.value.problems] == [("rank0.engine", "size", f">{entry.size}")]


@pytest.mark.parametrize("code,raised", [(errno.ENOSPC, InstallError), (errno.EROFS, InstallError),
                                         (errno.EPERM, InstallError), (errno.EACCES, InstallError)])
def test_write_errors_while_installing(node_env, monkeypatch, code, raised):
    store, (a, b, *_), dest, _ = node_env
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
        where = f" {dest}/.staging-" if code != errno.EPERM else ""  # the EPERM here carries no file name
        assert f"{os.strerror(code)} while writing{where}" in str(exc.value)
    assert current_artifact(dest) == a and not list(dest.glob(".staging-*"))


def test_a_destination_that_cannot_be_written_is_a_clear_error(node_env, tmp_path, monkeypatch, cli):
    """#29 item 7: `pull --dest` an existing file, a path under a file, or a read-only mount gave
    exit 1 and a Python exception name. Each is an InstallError (exit 12) with one line."""
    from pathlib import Path

    store, (a, *_), dest, draft = node_env
    (tmp_path / "a-file").write_text("x")
    for bad, why in ((tmp_path / "a-file", "is a file, not a directory"),
                     (tmp_path / "a-file" / "sub", "Not a directory")):
        with pytest.raises(InstallError, match=why):
            install_artifact(store, a, bad)
        assert (tmp_path / "a-file").read_text() == "x"
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kw):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kw)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(InstallError, match="Read-only file system"):
        install_artifact(store, a, tmp_path / "ro" / "node")
    monkeypatch.undo()
    staged(store, a)
    code, _, err = cli("--store", store.uri, "pull", "--profile", draft.profile_name, "--channel", "staging",
                       "--dest", tmp_path / "a-file", "--skip-preflight")
    assert code == 12 and "is a file, not a directory" in err and len(err.strip().splitlines()) == 1, err


def test_a_preflight_that_fails_installs_nothing(node_env):
    store, (a, b, *_), dest, _ = node_env
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
