"""Reading artifacts with verification (buildctl.artifact_store.read): id resolution, listing, and
``verify`` shallow and deep, streamed and ranged. Local store only: fast, and `make mutants`
runs it for this module."""

from __future__ import annotations

import pytest

from buildctl.core.digest import digest_bytes
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.errors import ArtifactNotFoundError, VerificationError
from buildctl.artifact_store.layout import blob_key, manifest_key
from buildctl.artifact_store.read import BUILD_LOG_PATH, get_manifest, list_artifacts, resolve_artifact, verify

from ..support.helpers import RangedStore as Ranged, publish_files, rot

MiB = 1024 * 1024


@pytest.fixture
def local(tmp_path):
    return open_store(f"file://{tmp_path / 'store'}")


def publish(store, tmp_path, draft, name: str, files=None, **kw) -> str:
    return publish_files(store, tmp_path / name, draft, files or {"config.json": name.encode(), "rank0.engine": 4096},
                         seed=len(name), verdict=None, **kw)


def test_resolve_full_ids_hex_and_unique_prefixes(local, tmp_path, draft):
    aid = publish(local, tmp_path, draft, "a")
    h = aid.removeprefix("xxh3-128:")
    assert resolve_artifact(local, aid) == aid
    assert resolve_artifact(local, h.upper()) == aid
    assert resolve_artifact(local, h[:8]) == aid  # the shortest prefix allowed
    assert resolve_artifact(local, "xxh3-128:" + h[:12]) == aid
    for bad in (h[:7], h + "0", h[:8] + "g", "", "z" * 32):
        with pytest.raises(ArtifactNotFoundError, match="at least 8 characters"):
            resolve_artifact(local, bad)
    other = "0" * 32 if not h.startswith("0") else "f" * 32
    with pytest.raises(ArtifactNotFoundError) as exc:
        resolve_artifact(local, other)
    assert exc.value.artifact == "xxh3-128:" + other
    with pytest.raises(ArtifactNotFoundError) as exc:
        resolve_artifact(local, other[:9])
    assert exc.value.artifact == other[:9]


def test_an_ambiguous_prefix_is_refused_with_the_count(local):
    for tail in ("0" * 24, "1" * 24):
        local.put_bytes(f"manifests/deadbeef{tail}.json", b"{}")
    with pytest.raises(ArtifactNotFoundError, match=r"ambiguous \(2 artifacts\)"):
        resolve_artifact(local, "deadbeef")
    assert resolve_artifact(local, "deadbeef0") == "xxh3-128:deadbeef" + "0" * 24


def test_get_manifest_of_a_missing_artifact(local):
    with pytest.raises(ArtifactNotFoundError):
        get_manifest(local, "xxh3-128:" + "0" * 32)


def test_list_is_newest_first_by_profile_and_skips_bad_manifests(local, tmp_path, draft):
    ids = [publish(local, tmp_path, draft, n) for n in ("first", "second", "third")]
    # Manifests that cannot be read are skipped, not fatal, wherever they sort.
    garbage = b'{"not": "a manifest"}'
    local.put_bytes(manifest_key(digest_bytes(garbage)), garbage)  # hashes to its id, does not parse
    local.put_bytes("manifests/" + "0" * 32 + ".json", b"bytes that hash to something else")
    listed = [a for a, _ in list_artifacts(local)]
    assert listed == ids[::-1]
    assert [a for a, _ in list_artifacts(local, "tiny-llama-cpu")] == ids[::-1]
    assert list_artifacts(local, "no-such-profile") == []


def test_list_skips_a_manifest_deleted_while_listing(local, tmp_path, draft):
    aid = publish(local, tmp_path, draft, "a")

    class Vanishing:
        def __getattr__(self, name):
            return getattr(local, name)

        def list(self, prefix):
            return ["manifests/" + "0" * 32 + ".json", *local.list(prefix)]

    assert [a for a, _ in list_artifacts(Vanishing())] == [aid]


def test_shallow_verify_checks_sizes_deep_checks_bytes(local, tmp_path, draft):
    aid = publish(local, tmp_path, draft, "a")
    m = verify(local, aid)
    assert m is not None and verify(local, aid, deep=True, workers=0) == m
    entry = next(f for f in m.files if f.path == "rank0.engine")
    rot(local, entry.digest, "flip")  # same size, other bytes
    verify(local, aid)  # sizes only: the default
    with pytest.raises(VerificationError) as exc:
        verify(local, aid, deep=True)
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "digest")]


def test_shallow_verify_catches_a_truncated_or_missing_blob(local, tmp_path, draft):
    aid = publish(local, tmp_path, draft, "a")
    entry = next(f for f in get_manifest(local, aid).files if f.path == "rank0.engine")
    rot(local, entry.digest, "truncate")
    with pytest.raises(VerificationError) as exc:
        verify(local, aid)
    (p,) = exc.value.problems
    assert (p.path, p.kind, p.expected, p.actual) == ("rank0.engine", "size", entry.size, entry.size // 2)
    local.delete(blob_key(entry.digest))
    with pytest.raises(VerificationError) as exc:
        verify(local, aid)
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "missing")]


def test_deep_verify_reports_progress(local, tmp_path, draft):
    aid = publish(local, tmp_path, draft, "a")
    seen: list[int] = []
    verify(local, aid, deep=True, on_bytes=seen.append)
    assert sum(seen) == sum(f.size for f in get_manifest(local, aid).files)


def test_ranged_deep_verify_catches_a_flipped_range_and_a_short_object(local, tmp_path, draft):
    aid = publish(local, tmp_path, draft, "big", {"config.json": b"{}", "rank0.engine": 3 * MiB + 7})
    verify(Ranged(local), aid, deep=True)
    entry = next(f for f in get_manifest(local, aid).files if f.path == "rank0.engine")
    with pytest.raises(VerificationError) as exc:
        verify(Ranged(local, short_from=2 * MiB), aid, deep=True)
    (p,) = exc.value.problems
    assert (p.path, p.kind, p.expected, p.actual) == ("rank0.engine", "size", entry.size, 2 * MiB + MiB // 4)
    rot(local, entry.digest, "flip")
    with pytest.raises(VerificationError) as exc:
        verify(Ranged(local), aid, deep=True)
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "digest")]


def test_the_build_log_is_checked_for_presence_and_bytes_not_size(local, tmp_path, draft):
    log = tmp_path / "build.log"
    log.write_bytes(b"compiling\n" * 100)
    aid = publish(local, tmp_path, draft, "a", build_log=log)
    m = verify(local, aid, deep=True)
    key = blob_key(m.build_log)
    rot(local, m.build_log, "flip")
    verify(local, aid)  # a log's size is not in the manifest
    with pytest.raises(VerificationError) as exc:
        verify(local, aid, deep=True)
    assert [(p.path, p.kind) for p in exc.value.problems] == [(BUILD_LOG_PATH, "digest")]
    local.delete(key)
    with pytest.raises(VerificationError) as exc:
        verify(local, aid)
    assert [(p.path, p.kind) for p in exc.value.problems] == [(BUILD_LOG_PATH, "missing")]


def test_artifacts_built_from_takes_only_its_hash_newest_first_whatever_a_pair_marker_says(tmp_path, draft):
    """The pair index is a hint: a marker under one build hash that names an artifact built from
    another (a misplaced or planted marker) is passed over, and the list is newest first."""
    import dataclasses

    from buildctl.artifact_store.layout import pair_key
    from buildctl.artifact_store.read import artifacts_built_from

    store = open_store(str(tmp_path / "store"))
    h1, h2 = "xxh3-128:" + "1" * 32, "xxh3-128:" + "2" * 32
    old, new = (publish_files(store, tmp_path / f"t{i}", dataclasses.replace(draft, profile_hash=h1),
                              {"config.json": f"{i}".encode()}, seed=i) for i in range(2))
    other = publish_files(store, tmp_path / "t2", dataclasses.replace(draft, profile_hash=h2),
                          {"config.json": b"2"}, seed=2)
    assert store.put_bytes(pair_key(draft.profile_name, h1, other), b"")
    got = artifacts_built_from(store, draft.profile_name, h1)
    assert [a for a, _ in got] == [new, old]
    assert [a for a, _ in artifacts_built_from(store, draft.profile_name, h2)] == [other]


# --- scan_manifests and stored_hash alone (`make mutants` sees them) ----------------------------------


def _rotted(local, tmp_path, draft, body: bytes) -> str:
    """A published artifact whose manifest no longer hashes to its id: ``body`` replaces it."""
    aid = publish(local, tmp_path, draft, "r")
    (local.root / manifest_key(aid)).write_bytes(body)
    return aid


def test_a_scan_names_what_a_rotted_manifest_still_names_and_says_why_in_one_line(local, tmp_path, draft):
    from buildctl.artifact_store.read import scan_manifests

    ok = publish(local, tmp_path, draft, "ok")
    blob = "xxh3-128:" + "b" * 32
    bad = _rotted(local, tmp_path, draft, f'{{"files": [{{"digest": "{blob}"}}]}}'.encode())
    with pytest.raises(Exception) as exc:
        get_manifest(local, bad)
    got = {a: (m, why, named) for a, m, why, named in scan_manifests(local)}
    assert got[ok][0] is not None and got[ok][1:] == ("", None)
    assert got[bad][0] is None and got[bad][2] == {blob}
    assert got[bad][1] == str(exc.value).splitlines()[0] and got[bad][1], got[bad]
    nothing = _rotted(local, tmp_path / "n", draft, b"not json")
    assert {a: n for a, _, _, n in scan_manifests(local)}[nothing] is None  # it names no blob


def test_a_scan_reads_again_what_failed_before_and_not_what_verified(local, tmp_path, draft, monkeypatch):
    import sys

    from buildctl.artifact_store.read import scan_manifests

    verify_module = sys.modules["buildctl.artifact_store.read"]

    aid = publish(local, tmp_path, draft, "a")
    first = {a: (m, why, named) for a, m, why, named in scan_manifests(local)}
    failed_then = {aid: (None, "unreadable then", None)}  # a store that flaked during the earlier scan
    assert next(scan_manifests(local, known=failed_then))[1] == first[aid][0]
    read: list[str] = []
    real = verify_module.get_manifest
    monkeypatch.setattr(verify_module, "get_manifest", lambda s, a: read.append(a) or real(s, a))
    assert next(scan_manifests(local, known=first))[1] == first[aid][0] and read == []


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), ArtifactNotFoundError("gone meanwhile")])
def test_a_rotted_manifest_that_cannot_be_read_again_names_nothing(local, tmp_path, draft, monkeypatch, error):
    from buildctl.artifact_store.read import scan_manifests

    bad = _rotted(local, tmp_path, draft, b"not json")
    real, calls = local.get_bytes, []

    def flaky(key):
        calls.append(key)
        if key == manifest_key(bad) and len([c for c in calls if c == key]) > 1:
            raise error
        return real(key)

    monkeypatch.setattr(local, "get_bytes", flaky)
    (row,) = [r for r in scan_manifests(local) if r[0] == bad]
    assert row[1] is None and row[3] is None and row[2]


def test_stored_hash_re_hashes_by_default(local, tmp_path, draft):
    from buildctl.artifact_store.backends.ranged import RangedReader
    from buildctl.artifact_store.read import stored_hash

    aid = publish(local, tmp_path, draft, "a")
    e = next(f for f in get_manifest(local, aid).files if f.path == "rank0.engine")
    with RangedReader(local) as ranged:
        h, problem = stored_hash(local, ranged, e, crypto=False)
    assert problem is None and h is not None and h.size == e.size


def test_a_scan_keeps_a_hostile_manifests_why_to_one_line(local, tmp_path, draft):
    """A manifest that hashes to its id but does not validate, written with a newline inside a field
    name: the scan's reason (a one-line report row) is the error's first line."""
    from buildctl.artifact_store.errors import ManifestError
    from buildctl.artifact_store.read import scan_manifests

    body = b'{"schema": 2, "zz\\nforged row": 1}'
    aid = digest_bytes(body)
    (local.root / manifest_key(aid)).parent.mkdir(parents=True, exist_ok=True)
    (local.root / manifest_key(aid)).write_bytes(body)
    with pytest.raises(ManifestError) as exc:
        get_manifest(local, aid)
    assert "\n" in str(exc.value)
    (why,) = [w for a, _, w, _ in scan_manifests(local) if a == aid]
    assert why == str(exc.value).splitlines()[0] and "forged row" not in why


@pytest.mark.parametrize("ranged", [False, True])
def test_deep_verify_hashes_each_byte_once_by_blake3_alone_and_rereads_only_a_failure(local, tmp_path, draft,
                                                                                   monkeypatch, ranged):
    """#51: one read per byte. A schema-2 artifact is checked by BLAKE3-256 alone (no xxh3 pass
    over its bytes), every blob hashed once; a rotted file is read again, with both digests, to
    name the damage (``digest``: rot)."""
    import buildctl.core.digest as digest_mod

    aid = publish(local, tmp_path, draft, "a", {"config.json": b"{}", "rank0.engine": 3 * MiB + 5,
                                                "rank1.engine": 2 * MiB, "lora/a.bin": 4096})
    m = get_manifest(local, aid)
    hashed: list[tuple[bool, bool, int]] = []  # (xxh, crypto, bytes) per hasher
    real_init, real_update = digest_mod.Hasher.__init__, digest_mod.Hasher.update

    def init(self, crypto=False, *, xxh=True):
        real_init(self, crypto, xxh=xxh)
        hashed.append([xxh, crypto, 0])

    monkeypatch.setattr(digest_mod.Hasher, "__init__", init)
    store = Ranged(local) if ranged else local
    verify(store, aid, deep=True)
    per_file = [h for h in hashed]
    assert all(not xxh and crypto for xxh, crypto, _ in per_file) and len(per_file) == len(m.files)

    counted: list[int] = []
    monkeypatch.setattr(digest_mod.Hasher, "update", lambda self, data: (counted.append(len(data)),
                                                                         real_update(self, data))[-1])
    verify(store, aid, deep=True)
    assert sum(counted) == m.total_size  # each byte hashed once
    rank0 = next(f for f in m.files if f.path == "rank0.engine")
    rot(local, rank0.digest, "flip")
    counted.clear()
    with pytest.raises(VerificationError) as err:
        verify(store, aid, deep=True)
    assert [(p.path, p.kind) for p in err.value.problems] == [("rank0.engine", "digest")]
    assert sum(counted) == m.total_size + rank0.size  # only the failing file a second time


def test_deep_verify_names_a_colliding_blob_by_both_digests_it_read_again(local, tmp_path, draft):
    """Other bytes under the same xxh3-128: BLAKE3 alone fails the file, and its second read (both
    digests) names it as ``blake3``, with the BLAKE3 the stored bytes really have."""
    from buildctl.core.digest import crypto_bytes

    from ..support.helpers import overwrite, xxh3_collision

    good, evil = xxh3_collision(1024 * 1024 + 512)
    aid = publish(local, tmp_path, draft, "c", {"config.json": b"{}", "rank0.engine": good})
    entry = next(f for f in get_manifest(local, aid).files if f.path == "rank0.engine")
    overwrite(local, blob_key(entry.digest), evil)
    with pytest.raises(VerificationError) as err:
        verify(local, aid, deep=True)
    (p,) = err.value.problems
    assert (p.path, p.kind, p.expected, p.actual) == ("rank0.engine", "blake3", entry.blake3, crypto_bytes(evil))
