"""Pull on a node: faults never touch the installed engine."""

from __future__ import annotations

import re

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest, verify
from buildctl.artifact_store.errors import PreflightError, VerificationError
from buildctl.artifact_store.manifest import FileEntry
from buildctl.artifact_store.node.install_dir import InstallOptions, current_artifact, install_artifact
from buildctl.artifact_store.node.pull import pull, resolve_channel
from buildctl.artifact_store.layout import blob_key, manifest_key
from buildctl.engines.fingerprint import detect
from buildctl.artifact_store.backends.store import open_store

from ...support.helpers import REPO, make_tree, publish_files, staged

BIG = 4 * 1024 * 1024 + 123


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def publish_and_promote(store, root: Path, draft) -> str:
    aid = publish_files(store, root, draft)
    promote(store, staged(store, aid), "prod")
    return aid


def keys():
    fp = detect()
    return [fp.compat_key("trtllm"), fp.compat_key("aoti")]


@pytest.fixture
def installed(store, tmp_path, draft):
    """v1 installed as current; v2 (one big blob) promoted but not installed."""
    v1 = publish_and_promote(store, make_tree(tmp_path / "v1", {"config.json": b"{}", "rank0.engine": 100_000}, seed=1), draft)
    dest = tmp_path / "node"
    res = pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert res.installed and current_artifact(dest) == v1
    before = tree_bytes(dest / "current")
    v2 = publish_and_promote(store, make_tree(tmp_path / "v2", {"config.json": b"{ }", "rank0.engine": BIG}, seed=2), draft)
    return dest, v1, v2, before


def overwrite(store, key: str, data: bytes | None) -> None:
    """Damage a stored object behind the store's back (bit rot, a bad disk, an operator)."""
    if store.uri.startswith("file://"):
        p = store.root / key
        os.chmod(p, 0o644)
        if data is None:
            p.unlink()
        else:
            p.write_bytes(data)
    else:
        if data is None:
            store.client.delete_object(Bucket=store.bucket, Key=store.prefix + key)
        else:
            store.client.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=data)


def big_blob(store, v2) -> str:
    m = get_manifest(store, v2)
    return blob_key(next(f.digest for f in m.files if f.path == "rank0.engine"))


def assert_untouched(dest: Path, v1: str, before: dict[str, bytes]) -> None:
    assert current_artifact(dest) == v1
    assert tree_bytes(dest / "current") == before
    assert not list(dest.glob(".staging-*"))


def test_flipped_byte_in_middle_of_large_blob(store, installed, draft):
    dest, v1, v2, before = installed
    key = big_blob(store, v2)
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    overwrite(store, key, bytes(data))
    with pytest.raises(VerificationError) as exc:
        pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "digest")]
    assert_untouched(dest, v1, before)
    with pytest.raises(VerificationError):
        verify(store, v2, deep=True)
    verify(store, v2)  # shallow verify sees sizes only


def test_truncated_blob(store, installed, draft):
    dest, v1, v2, before = installed
    key = big_blob(store, v2)
    overwrite(store, key, store.get_bytes(key)[: BIG // 3])
    with pytest.raises(VerificationError) as exc:
        pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert [(p.path, p.kind, p.expected, p.actual) for p in exc.value.problems] == [("rank0.engine", "size", BIG, BIG // 3)]
    assert_untouched(dest, v1, before)


def test_missing_blob(store, installed, draft):
    dest, v1, v2, before = installed
    overwrite(store, big_blob(store, v2), None)
    with pytest.raises(VerificationError) as exc:
        pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "missing")]
    assert_untouched(dest, v1, before)


def test_manifest_naming_a_file_that_is_not_there(store, installed, draft, tmp_path):
    dest, v1, v2, before = installed
    m = get_manifest(store, v2)
    ghost = FileEntry(path="rank1.engine", size=10, digest="xxh3-128:" + "ab" * 16, blake3="blake3:" + "cd" * 32)
    forged = m.model_copy(update={"files": tuple(sorted(m.files + (ghost,), key=lambda f: f.path))})
    fid = forged.artifact_id()
    store.put_bytes(manifest_key(fid), forged.canonical())
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, fid, dest)
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank1.engine", "missing")]
    assert_untouched(dest, v1, before)


def test_interrupted_pull_and_stale_staging(store, installed, draft):
    dest, v1, v2, before = installed
    seen = 0

    def interrupt(n: int) -> None:
        nonlocal seen
        seen += n
        if seen > BIG // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        install_artifact(store, v2, dest, on_bytes=interrupt, options=InstallOptions(workers=1))
    assert_untouched(dest, v1, before)
    stale = dest / ".staging-deadbeef"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "half.engine").write_bytes(b"partial")
    res = pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert res.installed and current_artifact(dest) == v2 and not stale.exists()
    assert (dest / "previous").resolve().name == v1[9:]
    again = pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert not again.installed


def test_preflight_failure_never_becomes_current(store, installed, draft):
    dest, v1, v2, before = installed

    def cannot_load(manifest, staged: Path) -> None:
        assert (staged / "rank0.engine").stat().st_size == BIG
        raise RuntimeError("engine plan file is generated on an incompatible device")

    with pytest.raises(PreflightError):
        install_artifact(store, v2, dest, preflight=cannot_load)
    assert_untouched(dest, v1, before)


WRITE_LIMITED_PULL = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, 1024 * 1024))
from buildctl.cli.main import main
main(sys.argv[1:])
"""


def test_write_failure_during_pull(store, store_uri, installed, draft, s3_env_if_needed):
    """RLIMIT_FSIZE makes writes past 1 MiB fail (EFBIG), like a full disk: clean exit, nothing touched."""
    dest, v1, v2, before = installed
    r = subprocess.run([sys.executable, "-c", WRITE_LIMITED_PULL, "--store", store_uri, "pull", "--profile",
                        draft.profile_name, "--channel", "prod", "--dest", str(dest)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 12, r.stderr  # DestinationError: this host cannot write it
    assert "current engine untouched" in r.stderr and "Traceback" not in r.stderr
    assert_untouched(dest, v1, before)


def test_pulls_keep_current_and_previous_only(store, tmp_path, draft):
    dest = tmp_path / "node"
    ids = []
    for i in range(4):
        ids.append(publish_and_promote(store, make_tree(tmp_path / f"v{i}", {"e": f"engine-{i}".encode()}), draft))
        pull(store, resolve_channel(store, draft.profile_name, 'prod', keys()), dest)
    assert sorted(p.name for p in (dest / "versions").iterdir()) == sorted(a[9:] for a in ids[-2:])
    assert current_artifact(dest) == ids[-1]
    assert (dest / "previous").resolve().name == ids[-2][9:]


def test_pull_progress_bar_only_on_a_terminal(store_uri, tmp_path, draft, s3_env_if_needed):
    """A pull on a TTY shows one bar over all files with bytes, rate and ETA; piped or --json, none."""
    import pty
    import select

    store = open_store(store_uri)
    publish_and_promote(store, make_tree(tmp_path / "v", {"config.json": b"{}", "rank0.engine": BIG}, seed=5), draft)
    exe = os.path.join(os.path.dirname(sys.executable), "buildctl")
    base = [exe, "--store", store_uri, "pull", "--profile", draft.profile_name, "--channel", "prod", "--skip-preflight"]
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}

    def on_tty(dest: str) -> str:
        pid, fd = pty.fork()
        if pid == 0:  # the child: stdout and stderr are the terminal
            os.execve(exe, [*base, "--dest", dest], env)
        out = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 60)
            try:
                chunk = os.read(fd, 65536) if ready else b""
            except OSError:
                chunk = b""
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")
        return out.decode(errors="replace")

    shown = on_tty(str(tmp_path / "tty"))
    assert "downloading + verifying" in shown and "/s" in shown, shown
    piped = subprocess.run([*base, "--dest", str(tmp_path / "piped")], capture_output=True, text=True, env=env)
    assert piped.returncode == 0 and "downloading + verifying" not in piped.stderr + piped.stdout


# --- pull refuses any corrupted file, wherever it sorts (guard: kills a mutant the suite once let through, #20) ---


def _tree(root: Path) -> Path:
    return make_tree(root, {"a-first.json": b'{"first": 1}', "m-middle.bin": 70_000, "z-last.engine": 90_000}, seed=3)


@pytest.mark.guard
@pytest.mark.parametrize("which", ["a-first.json", "m-middle.bin", "z-last.engine"])
def test_pull_refuses_a_corrupted_first_middle_or_last_file(store, tmp_path, draft, which):
    from ...support.helpers import rot

    good = publish_tree(store, make_tree(tmp_path / "good", {"x": b"good"}), draft).artifact_id
    dest = tmp_path / "node"
    install_artifact(store, good, dest)
    bad = publish_tree(store, _tree(tmp_path / "bad"), draft).artifact_id
    rot(store, next(f.digest for f in get_manifest(store, bad).files if f.path == which), "flip")
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, bad, dest)
    assert [p.path for p in exc.value.problems] == [which]
    assert current_artifact(dest) == good and not list(dest.glob(".staging-*"))


@pytest.mark.guard
@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_in_any_file_is_refused(tmp_path_factory, draft, data):
    """Property: for a small tree, any file and any byte of it changed to any other value: the pull
    is refused naming that file, and ``current`` stays what it was."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.layout import blob_key

    root = tmp_path_factory.mktemp("prop")
    store = open_store("file://" + str(root / "store"))
    files = data.draw(st.dictionaries(st.sampled_from(["a", "b/c.bin", "d.json", "z"]), st.binary(min_size=1, max_size=64),
                                      min_size=1, max_size=4))
    src = make_tree(root / "tree", files)
    good = publish_tree(store, make_tree(root / "good", {"g": b"good"}), draft).artifact_id
    install_artifact(store, good, root / "node")
    aid = publish_tree(store, src, draft).artifact_id
    m = get_manifest(store, aid)
    entry = data.draw(st.sampled_from(sorted(m.files, key=lambda f: f.path)))
    blob = store.root / blob_key(entry.digest)
    body = bytearray(blob.read_bytes())
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] = (body[i] + data.draw(st.integers(1, 255))) % 256
    blob.chmod(0o644)
    blob.write_bytes(bytes(body))
    with pytest.raises(VerificationError) as exc:
        install_artifact(store, aid, root / "node")
    assert {p.path for p in exc.value.problems} == {f.path for f in m.files if f.digest == entry.digest}
    assert current_artifact(root / "node") == good
    json.dumps([p.path for p in exc.value.problems])  # the report is plain data


# --- which name is wrong, each alone (`make mutants` sees these) ------------------------------------


def test_a_miss_names_the_wrong_name_and_the_known_ones(tmp_path, draft):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import set_channel
    from buildctl.artifact_store.errors import ChannelNotFoundError, StoreNotFoundError
    from buildctl.artifact_store.node.pull import resolve_channel

    store = open_store(f"file://{tmp_path / 'store'}")
    with pytest.raises(StoreNotFoundError):
        resolve_channel(store, "p", "prod", ["k"])
    aid = publish_files(store, tmp_path / "t", draft, {"config.json": b"{}"})
    with pytest.raises(ChannelNotFoundError) as exc:  # objects, but no channel anywhere
        resolve_channel(store, "p", "prod", ["k"])
    assert "no profile has a channel there yet" in str(exc.value)
    set_channel(store, aid, get_manifest(store, aid), "staging")
    P = draft.profile_name
    with pytest.raises(ChannelNotFoundError) as exc:
        resolve_channel(store, P, "stagin", [draft.compat_key])
    assert f"profile {P!r} has no channel 'stagin'" in str(exc.value) and "its channels: staging" in str(exc.value)
    with pytest.raises(ChannelNotFoundError) as exc:
        resolve_channel(store, "other-profile", "staging", [draft.compat_key])
    assert re.search(rf"profiles with channels: {re.escape(P)}(?![\w/-])", str(exc.value)), str(exc.value)
    with pytest.raises(ChannelNotFoundError) as exc:  # the channel exists: only this host's key is missing
        resolve_channel(store, P, "staging", ["aoti-" + "9" * 32])
    assert "has no channel" not in str(exc.value)
    assert resolve_channel(store, P, "staging", ["aoti-" + "9" * 32, draft.compat_key]).artifact_id == aid


@pytest.mark.guard
def test_pull_options_default_to_the_safe_pull():
    """A caller that names no flag (a flow, `node activate`'s fallback pull) gets what `buildctl
    pull` gives without flags: preflight and smoke check on, an engine that failed here held back,
    coverage not required, ten minutes for the smoke check, current and previous kept. The check's
    time must be positive and the sequence floor non-negative."""
    from pydantic import ValidationError

    from buildctl.artifact_store.node.pull import PullOptions

    o = PullOptions()
    assert (o.skip_preflight, o.health_check, o.retry_failed, o.require_covered) == (False, True, False, False)
    assert (o.health_timeout_s, o.keep, o.min_seq, o.node_id, o.health_cmd) == (600.0, 2, 0, None, None)
    assert PullOptions(health_timeout_s=0.5).health_timeout_s == 0.5
    for bad in ({"health_timeout_s": 0}, {"min_seq": -1}, {"keep_versions": 3}):
        with pytest.raises(ValidationError):
            PullOptions(**bad)


@pytest.mark.parametrize("ranged", [False, True], ids=["stream", "ranged"])
def test_a_colliding_blob_is_refused_naming_the_blake3_its_bytes_have(tmp_path, draft, ranged):
    """A pull hashes a schema 2 file by BLAKE3 alone; a file that fails is read back with both
    digests, so the refusal names a collision (same xxh3-128, other bytes) as ``blake3``, with the
    BLAKE3 the bytes it got really have: the operator can tell it from rot."""
    from buildctl.core.digest import crypto_bytes

    from ...support.helpers import RangedStore, overwrite, xxh3_collision

    store = open_store(str(tmp_path / "store"))
    good, evil = xxh3_collision(2 * 1024 * 1024 + 99 if ranged else 40_000, seed=3)
    aid = publish_files(store, tmp_path / "src", draft, {"rank0.engine": good, "config.json": b"{}"})
    entry = next(e for e in get_manifest(store, aid).files if e.path == "rank0.engine")
    overwrite(store, blob_key(entry.digest), evil)  # the same key: xxh3-128 cannot tell them apart
    with pytest.raises(VerificationError) as exc:
        install_artifact(RangedStore(store) if ranged else store, aid, tmp_path / "node")
    (problem,) = exc.value.problems
    assert (problem.path, problem.kind, problem.expected, problem.actual) == (
        "rank0.engine", "blake3", crypto_bytes(good), crypto_bytes(evil))
    assert current_artifact(tmp_path / "node") is None

