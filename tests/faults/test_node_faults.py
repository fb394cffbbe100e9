"""Node-side faults: pull killed at random points, disk full, corrupted blobs, stale staging,
two pulls at once into the same destination."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest
from buildctl.artifact_store.errors import VerificationError
from buildctl.artifact_store.node.install_dir import current_artifact, install_artifact
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.layout import blob_key

from ..support.helpers import REPO, make_tree
from .conftest import kill_at_random_point, scale

PULLER = r"""
import sys
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.node.install_dir import InstallOptions, install_artifact
store = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
install_artifact(store, sys.argv[2], sys.argv[3], options=InstallOptions(workers=1))
"""


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def two_versions(tmp_path, draft):
    store = open_store(f"file://{tmp_path}/store")
    v1 = publish_tree(store, make_tree(tmp_path / "v1", {"rank0.engine": 300_000, "config.json": b"{}"}, seed=1), draft)
    v2 = publish_tree(store, make_tree(tmp_path / "v2", {f"rank{i}.engine": 3_000_000 for i in range(6)}, seed=2), draft)
    return store, v1.artifact_id, v2.artifact_id


@pytest.mark.slow
def test_pull_killed_at_random_points(tmp_path, two_versions, record_fault):
    store, v1, v2 = two_versions
    rng = random.Random(99)
    runs, bad = scale(30), 0
    dest = tmp_path / "node"
    install_artifact(store, v1, dest)
    v1_bytes = tree_bytes(dest / "current")
    landed = 0
    for i in range(runs):
        kill_at_random_point(PULLER, [store.uri, v2, str(dest)], rng.uniform(0, 0.08))
        cur = current_artifact(dest)
        if cur == v1:
            ok = tree_bytes(dest / "current") == v1_bytes
        else:
            ok = cur == v2 and (dest / "current" / "rank5.engine").stat().st_size == 3_000_000
            landed += 1
        bad += not ok
        if cur == v2:  # put v1 back for the next round
            install_artifact(store, v1, dest)
    install_artifact(store, v2, dest)  # a clean run afterwards cleans stale staging and installs
    assert not list(dest.glob(".staging-*")) and current_artifact(dest) == v2
    assert bad == 0
    record_fault("pull killed (SIGKILL)", "random kill time 0-80 ms into an 18 MB pull", runs, bad_installs=bad,
                 outcome=f"ok (current stayed v1 or became a complete v2 in every case; {landed} completed before the kill)")


def test_disk_full_during_pull(tmp_path, two_versions, record_fault):
    """A real full filesystem where one exists (root with loop mounts is not assumed): RLIMIT_FSIZE
    makes writes fail with EFBIG the way ENOSPC would; both are InstallError and leave current alone."""
    store, v1, v2 = two_versions
    dest = tmp_path / "node"
    install_artifact(store, v1, dest)
    before = tree_bytes(dest / "current")
    code = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.node.install_dir import InstallOptions, install_artifact
from buildctl.artifact_store.errors import InstallError
try:
    install_artifact(open_store(sys.argv[1]), sys.argv[2], sys.argv[3])
except InstallError as err:
    print("InstallError", err.detail)
    sys.exit(9)
"""
    r = subprocess.run([sys.executable, "-c", code, store.uri, v2, str(dest)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 9 and "File too large" in r.stdout, r.stderr[-500:]
    assert current_artifact(dest) == v1 and tree_bytes(dest / "current") == before
    assert not list(dest.glob(".staging-*"))
    record_fault("disk full during pull", "RLIMIT_FSIZE 1 MB under an 18 MB pull (EFBIG, as ENOSPC)", 1)


def test_corrupted_blobs(tmp_path, two_versions, record_fault):
    store, v1, v2 = two_versions
    dest = tmp_path / "node"
    install_artifact(store, v1, dest)
    before = tree_bytes(dest / "current")
    m = get_manifest(store, v2)
    rng = random.Random(5)
    cases = scale(12)
    for i in range(cases):
        f = rng.choice(m.files)
        p = store.root / blob_key(f.digest)
        original = p.read_bytes()
        p.chmod(0o644)
        data = bytearray(original)
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(data))
        with pytest.raises(VerificationError) as exc:
            install_artifact(store, v2, dest)
        assert [(x.path, x.kind) for x in exc.value.problems] == [(f.path, "digest")]
        assert current_artifact(dest) == v1 and tree_bytes(dest / "current") == before
        p.write_bytes(original)
    record_fault("corrupted blob", "one random bit flipped in a random blob", cases)


def test_stale_staging_is_cleaned(tmp_path, two_versions, record_fault):
    store, v1, v2 = two_versions
    dest = tmp_path / "node"
    install_artifact(store, v1, dest)
    for i in range(3):
        s = dest / f".staging-crashed{i}" / "sub"
        s.mkdir(parents=True)
        (s / "rank0.engine").write_bytes(b"half")
        (s / "rank0.engine").chmod(0o444)
    install_artifact(store, v2, dest)
    assert not list(dest.glob(".staging-*")) and current_artifact(dest) == v2
    record_fault("stale staging dir", "three staging dirs left by crashed pulls", 3)


def test_two_pulls_at_once(tmp_path, two_versions, record_fault):
    store, v1, v2 = two_versions
    dest = tmp_path / "node"
    results, errors = [], []

    def pull(aid):
        try:
            results.append(install_artifact(store, aid, dest))
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    rounds = scale(5)
    for _ in range(rounds):
        threads = [threading.Thread(target=pull, args=(a,)) for a in (v1, v2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cur = current_artifact(dest)
        assert cur in (v1, v2) and not errors
        expected = {v1: "rank0.engine", v2: "rank5.engine"}[cur]
        assert (dest / "current" / expected).exists()
        assert not list(dest.glob(".staging-*"))
    record_fault("two pulls into one dest", "two concurrent installs (a file lock serialises them)", rounds * 2)
