"""Garbage collection: retention that follows references, and no race with a publish."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from buildctl.artifact_store.promotion import promote, rollback
from buildctl.artifact_store.grace import GraceWindows
from buildctl.artifact_store.publish import ManifestDraft, publish_tree
from buildctl.artifact_store.read import get_manifest, verify
from buildctl.core.times import utc_now
from buildctl.steps import fleet
from buildctl.steps.fleet import record_engine_state
from buildctl.artifact_store.fleet.inventory import EngineState
from buildctl.engines.fingerprint import detect
from buildctl.artifact_store import errors as ops_errors
from buildctl.artifact_store.errors import StoreUnavailableError
from buildctl.artifact_store.gc import gc
from buildctl.artifact_store.quarantine import quarantine
from buildctl.artifact_store.layout import blob_key, touch_key
from buildctl.artifact_store.trust.authority import Authority
from buildctl.steps.context import Context

from ..support.helpers import make_tree, publish_files, settings, staged
from buildctl.artifact_store.gc import GcPolicy

PROFILE = "tiny-llama-cpu"
LATER = datetime.now(timezone.utc) + timedelta(days=3)  # everything below is past the 24 h grace by then


def draft_for(key: str) -> ManifestDraft:
    return ManifestDraft(profile_name=PROFILE, profile_hash="xxh3-128:" + "1" * 32, backend="aoti",
                             compat_key=key, fingerprint={})


def publish(store, tmp_path, key: str, name: str) -> str:
    return publish_files(store, tmp_path / "trees" / key / name, draft_for(key),
                         {"config.json": b'{"shared": true}',  # one blob every artifact shares
                          "rank0.engine": f"{key}/{name}".encode() * 50})


def test_ten_compat_keys_four_rounds_every_rollback_target_survives(store, tmp_path, cli, s3_env_if_needed):
    keys = [f"aoti-{i:02d}" + "0" * 30 for i in range(10)]
    never_promoted, prod = {}, {k: [] for k in keys}
    for k in keys:  # older builds nobody promoted: the only thing gc may take
        never_promoted[k] = [publish(store, tmp_path, k, f"unpromoted-{j}") for j in range(2)]
    for rnd in range(4):
        for k in keys:
            aid = publish(store, tmp_path, k, f"round-{rnd}")
            promote(store, staged(store, aid), "prod")
            prod[k].append(aid)
    # a node that runs one of them reports what it keeps as previous: an artifact nothing else protects
    kept_by_node = never_promoted[keys[0]][0]
    record_engine_state(store, "gpu-node-7", detect(), EngineState(
        profile=PROFILE, channel="canary", compat_key=keys[0], artifact_id=prod[keys[0]][-1], seq=1,
        status="healthy", current=prod[keys[0]][-1], previous=kept_by_node, when=utc_now()))

    # The defaults (keep 3, keep-history 5), with a delete window of a minute: the tests' 50 ms
    # window (conftest) can pass between a blob's check and its delete on a busy machine, and gc
    # then rightly keeps the blob.
    ctx = Context.from_settings(settings(store=store.uri, gc_delete_window_s=60), store=store)
    res = fleet.gc(ctx, fleet.gc_policy(ctx.settings), now=LATER)
    removed = set(res.removed_artifacts)
    assert removed == {a for k in keys for a in never_promoted[k]} - {kept_by_node}
    why = {d.artifact_id: d.protected_by for d in res.decisions}
    assert "held by 1 node(s) (previous on 1): gpu-node-7" in why[kept_by_node]
    assert any(w.startswith("history prod #1") for w in why[prod[keys[3]][0]])  # round 0: only history protects it
    assert not any(w.startswith("newest") for w in why[prod[keys[3]][0]])
    assert res.removed_blobs == len(removed) and not res.not_removed  # each had one blob of its own; config.json is shared
    # rollback works for every compat key, back to each of its history records
    for k in keys:
        for target in reversed(prod[k][:-1]):
            rec = rollback(store, PROFILE, "prod", to=target, compat_key=k, reason="test")
            assert rec.artifact_id == target
    code, out, err = cli("--store", store.uri, "--json", "rollback", "--profile", PROFILE, "--channel", "prod",
                         "--compat-key", keys[5], "--to", prod[keys[5]][2])
    assert code == 0, err
    verify(store, kept_by_node, deep=True)


def test_keep_counts_per_profile_and_compat_key_and_dry_run_gives_reasons(store, tmp_path, cli, s3_env_if_needed):
    a = [publish(store, tmp_path, "aoti-a" + "0" * 30, f"v{i}") for i in range(3)]
    b = [publish(store, tmp_path, "aoti-b" + "0" * 30, f"v{i}") for i in range(3)]
    res = gc(store, GcPolicy(keep=2, keep_history=0), dry_run=True, now=LATER)
    assert set(res.removed_artifacts) == {a[0], b[0]}  # the oldest of each pair, not the 4 oldest of the profile
    d = {x.artifact_id: x for x in res.decisions}
    assert "not among the newest 2 of tiny-llama-cpu [aoti-b" in d[b[0]].why_removable
    assert d[b[2]].protected_by == [f"newest 1 of 2 for tiny-llama-cpu [{('aoti-b' + '0' * 30)[:20]}]"]
    assert all(get_manifest(store, x) for x in a + b)  # a dry run removes nothing
    # within the grace period nothing goes, whatever the counts
    assert gc(store, GcPolicy(keep=0, keep_history=0), dry_run=True).removed_artifacts == []
    code, out, err = cli("--store", store.uri, "gc", "--keep", "2", "--keep-history", "0", "--grace", "0", "--dry-run")
    assert code == 0 and f"would remove {a[0]}" in out and "keep " + b[2] in out and "newest 1 of 2" in out, out


def test_quarantined_artifacts_are_kept_for_their_retention(store, tmp_path):
    aid = publish(store, tmp_path, "aoti-q" + "0" * 30, "v0")
    from buildctl.artifact_store.quarantine import quarantine

    quarantine(store, aid, "segfaults past 4096 tokens", auth=Authority(who="test"))
    res = gc(store, GcPolicy(keep=0, keep_history=0), dry_run=True, now=LATER)
    assert res.removed_artifacts == [] and "for forensics" in res.decisions[0].protected_by[0]
    much_later = LATER + timedelta(days=31)
    assert gc(store, GcPolicy(keep=0, keep_history=0), now=much_later).removed_artifacts == [aid]
    assert list(store.list(f"quarantine/{aid[9:]}/")) == []  # its records go with it


class RaceStore:
    """The store, with a hook run right after publish has looked at one blob for the ``nth`` time:
    what a concurrent gc does at that moment of the publish."""

    def __init__(self, inner, key: str, nth: int, hook) -> None:
        self.inner, self.key, self.nth, self.hook, self.seen = inner, key, nth, hook, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def stat(self, key: str):
        got = self.inner.stat(key)
        if key == self.key:
            self.seen += 1
            if self.seen == self.nth:
                self.hook()
        return got


@pytest.mark.parametrize("nth,grace_s,whole", [(1, 1.0, True), (2, 1.0, True), (1, 0.0, True), (2, 0.0, False)])
def test_gc_between_a_publish_checking_a_blob_and_writing_its_manifest(store, tmp_path, nth, grace_s, whole):
    """The issue's interleaving: B reuses the big blob of unreferenced A; gc runs right after B
    looked at the blob (its first look, or its second, a delete window later) and before B's
    manifest. With a grace period, B's touch keeps the blob. Without one (`gc --grace 0`, an
    operator's override), the second look still catches a removal after the first (B uploads it
    again), but a removal after the second look breaks B: the control that shows the race is real
    and the touch is what closes it."""
    import time

    big = f"A's engine {nth} {grace_s}, reused by B ".encode() * 4000
    a = publish_tree(store, make_tree(tmp_path / "a", {"rank0.engine": big, "a.json": b"a"}), draft_for("k"),
                     windows=GraceWindows(grace_s=1.0)).artifact_id
    digest = next(f.digest for f in get_manifest(store, a).files if f.path == "rank0.engine")
    time.sleep(1.1)  # A is older than the 1 s grace, and so is its touch
    ran = []
    racing = RaceStore(store, blob_key(digest), nth,
                       lambda: ran.append(gc(store, GcPolicy(keep=0, keep_history=0, grace_s=grace_s))))
    b = publish_tree(racing, make_tree(tmp_path / "b", {"rank0.engine": big}), draft_for("k"),
                     windows=GraceWindows(grace_s=1.0))
    (g,) = ran
    assert g.removed_artifacts == [a]  # A went either way
    if whole:
        verify(store, b.artifact_id, deep=True)
    else:
        assert store.stat(blob_key(digest)) is None
        with pytest.raises(ops_errors.VerificationError):
            verify(store, b.artifact_id)


class LockedStore:
    """A bucket whose Object Lock (or policy) refuses deletes under one prefix, as S3 answers."""

    def __init__(self, inner, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def delete(self, key: str) -> None:
        if key.startswith(self.prefix):
            raise StoreUnavailableError(self.inner.uri, f"delete {key}: AccessDenied Access Denied because object protected by object lock")
        self.inner.delete(key)


def test_object_lock_refusals_are_reported_not_fatal(store, tmp_path):
    a = publish(store, tmp_path, "aoti-l" + "0" * 30, "v0")
    publish(store, tmp_path, "aoti-l" + "0" * 30, "v1")
    res = gc(LockedStore(store, 'blobs/'), GcPolicy(keep=1, keep_history=0), now=LATER)
    assert res.removed_artifacts == [a] and res.removed_blobs == 0
    assert res.not_removed and all(k.startswith("blobs/") and "object lock" in why for k, why in res.not_removed)
    res = gc(LockedStore(store, 'manifests/'), GcPolicy(keep=0, keep_history=0), now=LATER)
    assert [d.error for d in res.decisions if d.error] and all(d.error.startswith("manifest not removed")
                                                              for d in res.decisions if d.error)
    assert res.removed_artifacts == []  # refused: still there, and not counted as removed


def test_touch_markers_are_written_and_swept(store, tmp_path):
    aid = publish(store, tmp_path, "aoti-t" + "0" * 30, "v0")
    m = get_manifest(store, aid)
    for f in m.files:
        got = store.get_ref(touch_key(f.digest))
        assert got is not None and json.loads(got[0])["touched_at"] <= utc_now()
    gc(store, GcPolicy(keep=0, keep_history=0), now=LATER)
    assert list(store.list("touches/")) == [] and list(store.list("blobs/")) == []


def test_gc_never_deletes_the_blobs_of_an_artifact_whose_manifest_rotted(store, tmp_path, draft):
    """One digit flipped inside the manifest of an artifact prod points at: the manifest no longer
    verifies, so the artifact does not list; gc must still not delete its blobs (#29: it removed
    every one of them with --grace 1s --keep 0)."""
    from buildctl.artifact_store.gc import gc
    from buildctl.artifact_store.layout import blob_key

    from ..support.helpers import publish_files, rot_manifest

    aid = publish_files(store, tmp_path / "a", draft, {"config.json": b"{}", "rank0.engine": 50_000}, seed=1)
    promote(store, staged(store, aid), "prod")
    digests = [f.digest for f in get_manifest(store, aid).files]
    rot_manifest(store, aid)
    import time

    time.sleep(1.2)  # past a grace of 1 s: nothing protects the blobs but the manifest that names them
    res = gc(store, GcPolicy(keep=0, keep_history=0, grace_s=1.0, delete_window_s=0.2))
    assert all(store.stat(blob_key(d)) is not None for d in digests), res.to_json()
    assert res.removed_blobs == 0 and aid in json.dumps(res.to_json())  # reported, not silently skipped


def test_gc_reads_each_manifest_once_lists_quarantine_once_and_gives_one_reason_per_artifact(tmp_path):
    """Issue 32: gc's requests for A artifacts and N nodes. Each manifest is read once (the mark
    lists them again and reads only new ones), ``quarantine/`` is listed once for the store (not
    once per artifact), node records are read once each, and 300 nodes running one artifact give
    it one "held by" reason, not 300."""
    from benchmarks.counting import CountingStore
    from buildctl.artifact_store.backends.store import open_store

    store = open_store(str(tmp_path / "store"))
    keys = [f"aoti-{i:02d}" + "0" * 30 for i in range(3)]
    arts = [publish(store, tmp_path, k, f"b{j}") for k in keys for j in range(4)]
    quarantine(store, arts[0], "rotted", auth=Authority())
    fp = detect()
    for n in range(300):
        record_engine_state(store, f"node-{n:03d}", fp, EngineState(
            profile=PROFILE, channel="prod", compat_key=keys[0], artifact_id=arts[1], seq=1, status="healthy",
            current=arts[1], previous=arts[2] if n % 3 == 0 else None, when=utc_now()))
    counting = CountingStore(store)
    res = gc(counting, dry_run=True, now=LATER)
    c = counting.by_area
    assert c[("get_bytes", "manifests")] == len(arts), c
    assert c[("list", "quarantine")] == 1, c
    assert c[("get_ref", "inventory")] == 300, c  # every node record once
    why = {d.artifact_id: d.protected_by for d in res.decisions}
    held = [w for w in why[arts[1]] if w.startswith("held by")]
    assert held == ["held by 300 node(s) (current on 300; installed on 300): node-000, node-001, node-002 and 297 more"]
    assert [w for w in why[arts[2]] if w.startswith("held by")] == [
        "held by 100 node(s) (previous on 100): node-000, node-003, node-006 and 97 more"]
    assert any(w.startswith("quarantine record of") for w in why[arts[0]])
