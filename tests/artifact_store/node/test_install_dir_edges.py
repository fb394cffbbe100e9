"""The install directory's edges, each called directly and fast: the lock, leftovers of a killed
install, the link swaps and their undo, atomic writes, quiet cleanups, kept manifests, pruning,
staged entries and the tree check. The crash-consistency harness (tests/faults/, slow) reaches
these through strace; these tests reach each one alone, so `make mutants` sees them."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from buildctl.artifact_store.read import get_manifest
import buildctl.artifact_store.node.install_dir as idir
from buildctl.artifact_store.errors import InstallError
from buildctl.artifact_store.node.install_dir import (
    InstallOptions,
    current_artifact,
    install_artifact,
    previous_artifact,
)
from buildctl.core.digest import hex_of

HEX = "0123456789abcdef" * 2


def _raise(err: int):
    def f(*_a, **_k):
        raise OSError(err, os.strerror(err))
    return f


@pytest.mark.parametrize("err,mapped", [(errno.EROFS, True), (errno.EACCES, True), (errno.ELOOP, False)])
def test_the_lock_maps_disk_errors_to_install_errors_and_lets_others_through(tmp_path, monkeypatch, err, mapped):
    dest = tmp_path / "node"
    dest.mkdir()
    monkeypatch.setattr(idir.os, "open", _raise(err))
    with pytest.raises(InstallError if mapped else OSError) as exc:
        with idir._locked(dest):
            pass
    assert isinstance(exc.value, InstallError) == mapped
    if mapped:
        assert ".lock" in str(exc.value) and os.strerror(err) in str(exc.value)


@pytest.mark.parametrize("err,mapped", [(errno.ENOSPC, True), (errno.ELOOP, False)])
def test_prepare_and_dest_errors_map_only_disk_errors(tmp_path, monkeypatch, err, mapped):
    with pytest.raises(InstallError if mapped else OSError) as exc:
        with idir._dest_errors(tmp_path, "testing"):
            raise OSError(err, os.strerror(err), "f")
    assert isinstance(exc.value, InstallError) == mapped
    monkeypatch.setattr(idir.Path, "mkdir", _raise(err))
    with pytest.raises(InstallError if mapped else OSError) as exc:
        idir._prepare(tmp_path / "new")
    assert isinstance(exc.value, InstallError) == mapped


def test_the_lock_removes_what_a_killed_install_left_and_nothing_else(tmp_path):
    dest = tmp_path / "node"
    for d in (dest, dest / idir.MANIFESTS_DIR, dest / idir.STAGED_DIR):
        d.mkdir(parents=True, exist_ok=True)
    staging = dest / ".staging-x"
    (staging / "sub").mkdir(parents=True)
    (staging / "sub" / "f").write_bytes(b"1")
    os.chmod(staging / "sub" / "f", 0o444)
    os.chmod(staging / "sub", 0o555)
    os.symlink("versions/a", dest / f".current-{HEX}")
    os.symlink("versions/a", dest / f".previous-{HEX}")
    tmps = [dest / f".state.{HEX}.tmp", dest / idir.MANIFESTS_DIR / f".m.json.{HEX}.tmp",
            dest / idir.STAGED_DIR / f".s.json.{HEX}.tmp"]
    for t in tmps:
        t.write_bytes(b"partial")
    keep = [dest / "keepme", dest / f".current-{HEX[:-1]}", dest / idir.MANIFESTS_DIR / f".current-{HEX}",
            dest / idir.MANIFESTS_DIR / "a.json", dest / f".staging-y.txt"]
    for k in keep[:-1]:
        k.write_bytes(b"k")
    (dest / idir.MANIFESTS_DIR / "sub").mkdir()
    with idir._locked(dest):
        left = sorted(p.name for d in (dest, dest / idir.MANIFESTS_DIR, dest / idir.STAGED_DIR) for p in d.iterdir())
    assert not staging.exists() and not any(os.path.lexists(t) for t in tmps)
    assert not os.path.lexists(dest / f".current-{HEX}") and not os.path.lexists(dest / f".previous-{HEX}")
    assert all(k.exists() for k in keep[:-1]) and (dest / idir.MANIFESTS_DIR / "sub").is_dir()
    assert ".lock" in left


def test_leftovers_are_skipped_where_a_folder_cannot_be_listed(tmp_path):
    dest = tmp_path / "node"
    dest.mkdir()
    (dest / idir.MANIFESTS_DIR).write_bytes(b"a file, not a folder")  # listdir fails: skipped
    (dest / idir.STAGED_DIR).mkdir()
    (dest / idir.STAGED_DIR / f".s.{HEX}.tmp").write_bytes(b"")  # the folder after it is still cleaned
    (dest / f".x.{HEX}.tmp").write_bytes(b"")
    idir._remove_leftovers(dest)
    assert not (dest / f".x.{HEX}.tmp").exists() and (dest / idir.MANIFESTS_DIR).is_file()
    assert not (dest / idir.STAGED_DIR / f".s.{HEX}.tmp").exists()


def test_a_failed_link_swap_or_atomic_write_leaves_no_temporary(tmp_path, monkeypatch):
    monkeypatch.setattr(idir.os, "replace", _raise(errno.ENOSPC))
    with pytest.raises(OSError):
        idir._swap_link(tmp_path, "current", "versions/a")
    with pytest.raises(OSError):
        idir.write_atomic(tmp_path / "state.json", b"{}")
    assert os.listdir(tmp_path) == []


def test_quiet_helpers_swallow_only_os_errors(tmp_path, monkeypatch):
    idir._unlink_quietly(tmp_path / "missing")  # no error
    monkeypatch.setattr(idir, "fsync_dir", _raise(errno.EIO))
    idir._sync_quietly(tmp_path)
    monkeypatch.setattr(idir, "_prune", _raise(errno.EIO))
    idir._prune_quietly(tmp_path, 2)
    monkeypatch.setattr(idir, "_prune", lambda *_a: (_ for _ in ()).throw(ValueError("not a disk error")))
    with pytest.raises(ValueError):
        idir._prune_quietly(tmp_path, 2)


def _links(dest):
    return idir._link_target(dest / "current"), idir._link_target(dest / "previous")


@pytest.mark.parametrize("had_previous", [True, False])
def test_a_failed_current_swap_puts_previous_back(tmp_path, monkeypatch, had_previous):
    dest = tmp_path
    os.symlink("versions/a", dest / "current")
    if had_previous:
        os.symlink("versions/z", dest / "previous")
    real = idir._swap_link

    def swap(d, name, target):
        if name == "current":
            raise OSError(errno.ENOSPC, "full")
        real(d, name, target)

    monkeypatch.setattr(idir, "_swap_link", swap)
    with pytest.raises(OSError):
        idir._commit_links(dest, "versions/b")
    assert _links(dest) == ("versions/a", "versions/z" if had_previous else None)


def test_a_failure_after_current_moved_keeps_both_new_links(tmp_path, monkeypatch):
    dest = tmp_path
    os.symlink("versions/a", dest / "current")
    real = idir._swap_link

    def swap(d, name, target):
        real(d, name, target)
        if name == "current":
            raise KeyboardInterrupt  # after the rename: current moved
    monkeypatch.setattr(idir, "_swap_link", swap)
    with pytest.raises(KeyboardInterrupt):
        idir._commit_links(dest, "versions/b")
    assert _links(dest) == ("versions/b", "versions/a")


@pytest.mark.parametrize("had_previous", [True, False])
def test_putting_previous_back_may_fail_quietly(tmp_path, monkeypatch, had_previous):
    """The undo of previous is best effort: previous then equals current, still a complete engine."""
    dest = tmp_path
    os.symlink("versions/a", dest / "current")
    if had_previous:
        os.symlink("versions/z", dest / "previous")
    calls = []
    real = idir._swap_link

    def swap(d, name, target):
        calls.append(name)
        if name == "current" or len(calls) > 2:
            raise OSError(errno.EIO, "io")
        real(d, name, target)
    monkeypatch.setattr(idir, "_swap_link", swap)
    monkeypatch.setattr(idir.os, "unlink", _raise(errno.EIO))
    with pytest.raises(OSError) as exc:
        idir._commit_links(dest, "versions/b")
    assert exc.value.errno == errno.EIO and calls == ["previous", "current"] + (["previous"] if had_previous else [])
    assert _links(dest) == ("versions/a", "versions/a")


def test_commit_to_the_current_target_changes_nothing(tmp_path):
    os.symlink("versions/a", tmp_path / "current")
    os.symlink("versions/z", tmp_path / "previous")
    assert idir._commit_links(tmp_path, "versions/a") == ("versions/a", "versions/z")
    assert _links(tmp_path) == ("versions/a", "versions/z")


def test_make_writable_skips_a_missing_path_and_unchangeable_files(tmp_path, monkeypatch):
    idir._make_writable(tmp_path / "missing")
    d = tmp_path / "v"
    (d / "s").mkdir(parents=True)
    (d / "s" / "f").write_bytes(b"x")
    os.chmod(d / "s" / "f", 0o444)
    os.chmod(d / "s", 0o555)
    idir._make_writable(d)
    assert stat.S_IMODE(os.stat(d / "s").st_mode) == 0o755 and stat.S_IMODE(os.stat(d / "s" / "f").st_mode) == 0o644
    real = os.chmod
    monkeypatch.setattr(idir.os, "chmod", lambda p, m: _raise(errno.EPERM)() if str(p).endswith("/f") else real(p, m))
    idir._make_writable(d)  # a file it cannot chmod is skipped


def test_kept_manifests_are_checked_against_the_id(node_env):
    store, (a, b, *_), dest, _ = node_env
    install_artifact(store, a, dest)
    body = idir._kept_manifest(dest, a)
    assert body is not None and idir.digest_bytes(body) == a
    assert idir._kept_manifest(dest, b) is None  # none kept
    (dest / idir.MANIFESTS_DIR / f"{hex_of(b)}.json").write_bytes(body)  # a's bytes under b's name
    assert idir._kept_manifest(dest, b) is None
    assert list(idir.installed_manifests(dest)).count(body) == 2
    (dest / idir.MANIFESTS_DIR / "0-dir.json").mkdir()  # unreadable as a file, listed first: skipped
    assert len(list(idir.installed_manifests(dest))) == 2


@pytest.mark.parametrize("kept", [True, False])
def test_an_already_current_install_checks_the_binding_of_the_kept_or_stored_manifest(node_env, kept, monkeypatch):
    from buildctl.artifact_store.errors import CorruptObjectError
    from buildctl.core.digest import crypto_bytes

    store, (a, *_), dest, _ = node_env
    install_artifact(store, a, dest)
    body = idir.get_manifest_and_bytes(store, a)[1]
    if kept:  # the kept copy is enough: the store is not read
        monkeypatch.setattr(idir, "get_manifest_and_bytes", lambda *_a: pytest.fail("read the store"))
    else:
        os.unlink(dest / idir.MANIFESTS_DIR / f"{hex_of(a)}.json")
    r = install_artifact(store, a, dest, options=InstallOptions(bound=crypto_bytes(body)))
    assert not r.installed and current_artifact(dest) == a
    with pytest.raises(CorruptObjectError):
        install_artifact(store, a, dest, options=InstallOptions(bound="blake3:" + "0" * 64))
    assert current_artifact(dest) == a


def test_prune_removes_the_kept_manifests_of_pruned_versions_only(node_env):
    store, ids, dest, _ = node_env
    for aid in ids:
        install_artifact(store, aid, dest, options=InstallOptions(keep=2))
    kept = {p.name for p in (dest / idir.MANIFESTS_DIR).glob("*.json")}
    assert kept == {f"{hex_of(a)}.json" for a in ids[-2:]}
    assert (current_artifact(dest), previous_artifact(dest)) == (ids[-1], ids[-2])


def test_staged_entries_skip_what_is_malformed_and_read_stats(tmp_path):
    d = tmp_path / idir.STAGED_DIR
    d.mkdir()
    (d / "a.json").write_text("not json")
    (d / "b.json").write_text(json.dumps({"artifact_id": "x"}))  # keys missing
    (d / "c.json").write_text(json.dumps(["a list"]))
    assert idir.staged_engines(tmp_path) == []


def test_tree_problems_name_each_kind(tmp_path, node_env):
    store, (a, *_), dest, _ = node_env
    install_artifact(store, a, dest)
    m = get_manifest(store, a)
    root = (dest / "current").resolve()
    assert idir.tree_problems(m, dest / "current") == [idir.FileProblem(".", "symlink")]
    assert idir.tree_problems(m, tmp_path / "none") == [idir.FileProblem(".", "missing")]
    os.chmod(root, 0o755)
    (root / "extra-dir").mkdir()
    os.mkfifo(root / "fifo")
    kinds = {(p.path, p.kind, p.actual) for p in idir.tree_problems(m, root)}
    assert ("extra-dir", "extra", "a folder not in the manifest") in kinds
    assert ("fifo", "extra", "not a regular file") in kinds


def test_an_unreadable_folder_is_a_tree_problem(node_env, monkeypatch):
    store, (a, *_), dest, _ = node_env
    install_artifact(store, a, dest)
    m = get_manifest(store, a)
    real = os.scandir
    monkeypatch.setattr(idir.os, "scandir", lambda d: _raise(errno.EACCES)() if str(d).endswith("/tok") else real(d))
    problems = idir.tree_problems(m, (dest / "current").resolve())
    assert [(p.path, p.kind) for p in problems] == [("tok", "unreadable")]  # its files are not also "missing"


def test_a_staged_manifest_needs_one_trusted_builder_signature(tmp_path):
    from types import SimpleNamespace

    from buildctl.artifact_store.errors import SignatureError
    from buildctl.artifact_store.trust.signing import TrustedKeys

    from ...support.helpers import make_signer

    builder, stranger = make_signer(), make_signer()
    trusted = TrustedKeys({"builder": {builder.key_id: builder.private.public_key()}})
    body = b'{"manifest": 1}'
    entry = SimpleNamespace(artifact_id="xxh3-128:" + "1" * 32, manifest_body=body, manifest_signatures=[])
    with pytest.raises(SignatureError, match="unsigned"):
        idir._verify_staged_manifest(entry, trusted, "2026-12-05T00:00:00Z")
    entry.manifest_signatures = [stranger.sign(body), builder.sign(b"other bytes")]
    with pytest.raises(SignatureError) as exc:
        idir._verify_staged_manifest(entry, trusted, "2026-12-05T00:00:00Z")
    assert "manifest xxh3-128:" in str(exc.value)
    entry.manifest_signatures = [stranger.sign(body), builder.sign(body)]
    assert idir._verify_staged_manifest(entry, trusted, "2026-12-05T00:00:00Z") == builder.key_id
