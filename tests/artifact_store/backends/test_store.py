"""One contract suite, run against every Store backend (local directory and SeaweedFS S3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildctl.artifact_store.channels import CasRetry, history, read_channel, set_channel
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.publish import lookup_build_key, publish_tree
from buildctl.artifact_store.read import get_manifest, list_artifacts, verify
from buildctl.artifact_store.errors import KeyNotFoundError
from buildctl.artifact_store.layout import manifest_key

from ...support.helpers import REPO, make_tree, write_attestation


def test_create_only_refuses_overwrite(store, tmp_path):
    assert store.put_bytes("x/one", b"first") is True
    assert store.put_bytes("x/one", b"second") is False
    assert store.get_bytes("x/one") == b"first"
    f = tmp_path / "f"
    f.write_bytes(b"file-content")
    assert store.put_file("x/two", f, size=f.stat().st_size) is True
    f.write_bytes(b"changed-content")
    assert store.put_file("x/two", f, size=f.stat().st_size) is False
    assert store.get_bytes("x/two") == b"file-content"
    assert store.stat("x/two") == len(b"file-content")
    assert store.stat("x/absent") is None
    with pytest.raises(KeyNotFoundError):
        store.get_bytes("x/absent")


def test_compare_and_swap(store):
    assert store.get_ref("refs/a") is None
    assert store.cas("refs/a", b"v1", None) is True
    assert store.cas("refs/a", b"v1-again", None) is False
    data, token = store.get_ref("refs/a")
    assert data == b"v1"
    assert store.cas("refs/a", b"v2", token) is True
    assert store.cas("refs/a", b"v3", token) is False  # stale token: someone else won
    assert store.get_ref("refs/a")[0] == b"v2"


def test_listing(store):
    for k in ("m/b.json", "m/a.json", "m/sub/c.json", "n/z.json"):
        store.put_bytes(k, b"{}")
    assert list(store.list("m/")) == ["m/a.json", "m/b.json", "m/sub/c.json"]
    assert list(store.list("m/a")) == ["m/a.json"]
    assert list(store.list("absent/")) == []
    store.delete("m/a.json")
    store.delete("m/never-existed.json")
    assert list(store.list("m/")) == ["m/b.json", "m/sub/c.json"]


def test_publish_is_idempotent(store, engine_tree, draft):
    first = publish_tree(store, engine_tree, draft)
    assert first.uploaded_blobs == 5 and first.skipped_blobs == 0 and not first.existed
    again = publish_tree(store, engine_tree, draft)
    assert again.artifact_id == first.artifact_id
    assert again.uploaded_blobs == 0 and again.uploaded_bytes == 0 and again.existed
    m = verify(store, first.artifact_id, deep=True)
    assert [f.path for f in m.files] == ["bin/run.sh", "build_config.json", "lora/adapter.bin", "rank0.engine", "rank1.engine"]
    assert {f.path for f in m.files if f.executable} == {"bin/run.sh"}
    assert [a for a, _ in list_artifacts(store)] == [first.artifact_id]


def test_manifest_verified_on_read(store, engine_tree, draft):
    res = publish_tree(store, engine_tree, draft)
    other = publish_tree(store, make_tree(engine_tree.parent / "other", {"a": b"a"}), draft)
    # a manifest stored under the wrong id is detected, not trusted
    store.put_bytes(manifest_key("xxh3-128:" + "0" * 32), store.get_bytes(manifest_key(res.artifact_id)))
    from buildctl.artifact_store.errors import CorruptObjectError

    with pytest.raises(CorruptObjectError):
        get_manifest(store, "xxh3-128:" + "0" * 32)
    assert get_manifest(store, other.artifact_id).files[0].path == "a"


class CrashAfter:
    """A store wrapper that dies (like a killed process) on the n-th write."""

    class Crash(Exception):
        pass

    def __init__(self, inner, n: int) -> None:
        self.inner, self.n, self.writes = inner, n, 0
        self.uri = inner.uri

    def _tick(self) -> None:
        self.writes += 1
        if self.writes == self.n:
            raise self.Crash()

    def put_bytes(self, key, data):
        self._tick()
        return self.inner.put_bytes(key, data)

    def put_file(self, key, path, *, size, on_bytes=None):
        self._tick()
        return self.inner.put_file(key, path, size=size, on_bytes=on_bytes)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_publish_killed_at_every_write_then_rerun(store_uri, engine_tree, draft):
    """Kill publish at each of its writes in turn, on a fresh store each time: nothing partial is
    ever visible, and a re-run finishes the job with one complete artifact."""
    from buildctl.artifact_store.backends.store import open_store

    n = 1
    while True:
        fresh = open_store(f"{store_uri}/crash-{n}")
        try:
            publish_tree(CrashAfter(fresh, n), engine_tree, draft, workers=1)
            break  # no n-th write: every crash point has been covered
        except CrashAfter.Crash:
            pass
        for artifact, _ in list_artifacts(fresh):  # whatever is visible is complete
            verify(fresh, artifact, deep=True)
        res = publish_tree(fresh, engine_tree, draft)
        assert [a for a, _ in list_artifacts(fresh)] == [res.artifact_id]
        verify(fresh, res.artifact_id, deep=True)
        n += 1
    assert n == 9, "5 blobs + identity record + pair marker + manifest = 8 writes, each one crashed once"


PROMOTER = r"""
import sys
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.promotion import promote
from buildctl.artifact_store.channels import CasRetry
store = open_store(sys.argv[1])
rec = promote(store, sys.argv[2], "staging", retry=CasRetry(attempts=200))
print(rec.seq)
"""


def test_eight_concurrent_promoters_lose_no_record(store, store_uri, tmp_path, draft, s3_env_if_needed):
    artifacts = []
    for i in range(8):
        res = publish_tree(store, make_tree(tmp_path / f"t{i}", {"rank0.engine": f"engine {i}".encode()}), draft)
        write_attestation(store, res.artifact_id, draft.compat_key, "pass", "2026-01-01T00:00:00.000000Z")
        artifacts.append(res.artifact_id)
    procs = [subprocess.Popen([sys.executable, "-c", PROMOTER, store_uri, a], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in artifacts]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1][-500:] for r in results]
    seqs = sorted(int(r[0]) for r in results)
    assert seqs == list(range(1, 9))
    hist = history(store, draft.profile_name, "staging")
    assert [r.seq for r in hist] == list(range(1, 9))
    assert sorted(r.artifact_id for r in hist) == sorted(artifacts)
    # a single linear chain: each record's previous is the record before it
    assert [r.previous for r in hist] == [None] + [r.artifact_id for r in hist[:-1]]
    current = read_channel(store, draft.profile_name, "staging", draft.compat_key)[0]
    assert current.seq == 8 and current.artifact_id == hist[-1].artifact_id


class AlwaysLoses:
    """A store on which every compare-and-swap loses, as if other promoters always won."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.cas_calls = 0

    def cas(self, key, data, expected):
        self.cas_calls += 1
        return False

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_lost_races_exit_6(store, store_uri, engine_tree, draft, cli, s3_env_if_needed):
    res = publish_tree(store, engine_tree, draft)
    write_attestation(store, res.artifact_id, draft.compat_key, "pass", "2026-01-01T00:00:00.000000Z")
    loser = AlwaysLoses(store)
    from buildctl.artifact_store.errors import CasConflictError

    slept = []
    with pytest.raises(CasConflictError) as exc:
        set_channel(loser, res.artifact_id, res.manifest, "prod", retry=CasRetry(attempts=5, sleep=slept.append))
    assert exc.value.attempts == 5 and loser.cas_calls == 5 and len(slept) == 5
    assert all(0 <= s <= 1 for s in slept)
    from buildctl.cli.main import exit_code_for

    assert exit_code_for(exc.value) == 6
    assert read_channel(store, draft.profile_name, "prod", draft.compat_key) is None


RACER = r"""
import sys
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.publish import ManifestDraft, publish_tree
store = open_store(sys.argv[1])
draft = ManifestDraft(profile_name="p", profile_hash="xxh3-128:" + "1" * 32, backend="aoti", compat_key="aoti-x",
                      fingerprint={}, build_key="xxh3-128:" + "2" * 32)
res = publish_tree(store, sys.argv[2], draft)
print(res.artifact_id, res.build_key_owner)
"""


def test_two_builds_of_one_key_end_with_one_owner(store, store_uri, tmp_path, s3_env_if_needed):
    trees = [make_tree(tmp_path / f"b{i}", {"model.pt2": 200_000 + i}, seed=i) for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", RACER, store_uri, str(t)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for t in trees]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-400:] for o in outs]
    pairs = [o[0].split() for o in outs]
    owners = {owner for _, owner in pairs}
    assert len(owners) == 1 and owners <= {a for a, _ in pairs}
    assert lookup_build_key(store, "xxh3-128:" + "2" * 32) == owners.pop()


def test_promoting_the_current_artifact_again_is_a_no_op(store, engine_tree, draft):
    res = publish_tree(store, engine_tree, draft)
    write_attestation(store, res.artifact_id, draft.compat_key, "pass", "2026-01-01T00:00:00.000000Z")
    first = promote(store, res.artifact_id, "staging")
    again = promote(store, res.artifact_id, "staging")
    assert again == first and [r.seq for r in history(store, draft.profile_name, "staging")] == [1]


def test_ranged_reads_and_stored_checksum(store, tmp_path):
    """Every backend serves byte ranges (the ranged pull's reads) and says what checksum it stored."""
    data = os.urandom(3 * 1024 * 1024 + 17)
    big = tmp_path / "big"
    big.write_bytes(data)
    store.put_file("blobs/ra/nge", big, size=len(data))
    assert store.read_range("blobs/ra/nge", 0, 10) == data[:10]
    assert store.read_range("blobs/ra/nge", 1_000_003, 2_000_000) == data[1_000_003:3_000_003]
    assert store.read_range("blobs/ra/nge", len(data) - 5, 100) == data[-5:], "past the end: what is there"
    with pytest.raises(KeyNotFoundError):
        store.read_range("blobs/no/such", 0, 10)
    with pytest.raises(KeyNotFoundError):
        store.stored_checksum("blobs/no/such")
    check = store.stored_checksum("blobs/ra/nge")
    if store.uri.startswith("s3://"):
        check.update(data[:5])
        check.update(data[5:])
        assert check.algorithm == "CRC64NVME" and check.actual() == check.expected, "full-object checksum over the bytes"
        other = store.stored_checksum("blobs/ra/nge")
        other.update(data[:-1] + b"x")
        assert other.actual() != other.expected
    else:
        assert check is None


# --- what the mutation run found unchecked in the local store (#20) ------------------------------

def test_read_range_at_the_start_middle_end_and_past_the_end(store):
    data = bytes(range(256)) * 40  # 10240 bytes
    assert store.put_bytes("blobs/aa/" + "a" * 32, data)
    key = "blobs/aa/" + "a" * 32
    for offset, length in ((0, 1), (0, 10240), (100, 1000), (10000, 240), (10200, 100), (10240, 10), (5000, 0)):
        assert store.read_range(key, offset, length) == data[offset:offset + length], (offset, length)


def test_list_by_partial_and_directory_prefixes(store):
    keys = ["manifests/ab12.json", "manifests/ab34.json", "manifests/cd56.json", "history/p/prod/k/000000000001.json",
            "history/p/prod/k/000000000002.json", "history/p/staging/k/000000000001.json", "channels/p/prod/k.json"]
    for k in keys:
        assert store.put_bytes(k, b"{}")
    assert list(store.list("manifests/ab")) == ["manifests/ab12.json", "manifests/ab34.json"]
    assert list(store.list("manifests/")) == ["manifests/ab12.json", "manifests/ab34.json", "manifests/cd56.json"]
    assert list(store.list("history/p/prod/")) == keys[3:5]
    assert list(store.list("history/p/")) == keys[3:6]
    assert list(store.list("history/p/prod/k/000000000002")) == [keys[4]]
    assert list(store.list("nothing/")) == [] and list(store.list("manifests/zz")) == []
    assert sorted(store.list("")) == sorted(keys)


def test_list_starts_after_a_key(store):
    """``start_after``: only the keys after it, whether or not it exists (a node asks for the
    history records newer than the one it holds: one request, however long the history)."""
    keys = [f"history/p/prod/k/{n:012d}.json" for n in (1, 2, 3, 10)] + ["history/p/prod/l/000000000001.json"]
    for k in keys:
        assert store.put_bytes(k, b"{}")
    prefix = "history/p/prod/k/"
    assert list(store.list(prefix, start_after=keys[1])) == keys[2:4]
    assert list(store.list(prefix, start_after=f"{prefix}{5:012d}.json")) == [keys[3]]  # no such key
    assert list(store.list(prefix, start_after=keys[3])) == []
    assert list(store.list(prefix, start_after="a")) == keys[:4]  # before the prefix: all of it
    assert list(store.list("history/p/prod/", start_after=keys[3])) == [keys[4]]


def test_bad_keys_are_refused_by_the_local_store(tmp_path):
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.errors import StoreArgumentError

    store = open_store(str(tmp_path / "store"))
    for bad in ("", "/etc/passwd", "blobs/../../x", "a/../b", ".tmp/x", ".locks/y"):
        with pytest.raises(StoreArgumentError):
            store.put_bytes(bad, b"x")
    assert store.put_bytes("blobs/ok/" + "b" * 32, b"x")


# --- create-only writes lose a race they did not see coming (guard: kills a mutant the suite once let through, #20) ---


def _race_local(store, monkeypatch, key: str, theirs: bytes) -> None:
    """The competitor creates ``key`` after this writer's existence check, right before its link."""
    import os

    real_link = os.link
    target = store.root / key

    def racing_link(src, dst, *a, **kw):
        if Path(dst) == target and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(theirs)
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "link", racing_link)


def _race_s3(store, monkeypatch, key: str, theirs: bytes) -> None:
    """The competitor's PUT lands right before this writer's conditional PUT or multipart completion."""
    client, full = store.client, store.prefix + key
    done = []

    def first(name):
        real = getattr(client, name)

        def call(*a, **kw):
            if kw.get("Key") == full and not done:
                done.append(1)
                real_put(Bucket=store.bucket, Key=full, Body=theirs)
            return real(*a, **kw)

        return call

    real_put = client.put_object
    for name in ("put_object", "complete_multipart_upload", "upload_part", "create_multipart_upload"):
        monkeypatch.setattr(client, name, first(name))


@pytest.mark.guard
@pytest.mark.parametrize("how", ["put_bytes", "put_file"])
def test_create_only_write_loses_to_a_writer_between_check_and_write(store, tmp_path, monkeypatch, how):
    key, theirs, ours = "blobs/ab/" + "ab" * 16, b"the other writer's bytes", b"our bytes, never written"
    (_race_local if store.uri.startswith("file://") else _race_s3)(store, monkeypatch, key, theirs)
    if how == "put_bytes":
        created = store.put_bytes(key, ours)
    else:
        (tmp_path / "f").write_bytes(ours)
        created = store.put_file(key, tmp_path / "f", size=len(ours))
    assert created is False
    assert store.get_bytes(key) == theirs  # never overwritten


def test_publish_confirms_a_reused_blob_and_repairs_it(store, engine_tree, draft, tmp_path):
    """A blob already in the store counts only once its content is confirmed (local: re-hashed; S3:
    its stored CRC64NVME against the local file's). A rotted one quarantines the artifacts that
    name it, is put back from the local bytes, and they deep-verify again."""
    import shutil

    from buildctl.artifact_store.quarantine import quarantine_records

    from ...support.helpers import rot

    first = publish_tree(store, engine_tree, draft)
    shared = next(f for f in first.manifest.files if f.path == "rank0.engine")
    rot(store, shared.digest, "flip")
    tree = tmp_path / "second"
    shutil.copytree(engine_tree, tree)
    (tree / "extra.txt").write_bytes(b"a second artifact sharing rank0.engine")
    second = publish_tree(store, tree, draft)
    assert second.artifact_id != first.artifact_id
    verify(store, second.artifact_id, deep=True)  # not corrupt from its first second
    verify(store, first.artifact_id, deep=True)
    assert second.reused_repaired == [shared.digest]
    records = [r for _, r in quarantine_records(store, first.artifact_id)]
    assert [r.action for r in records] == ["quarantine", "lift"]
    assert "rank0.engine" in " ".join(records[0].problems)
