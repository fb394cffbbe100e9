from __future__ import annotations

import json
import posixpath

import pytest
from hypothesis import given, strategies as st

from buildctl.core.digest import digest_bytes, hash_file
from buildctl.artifact_store.errors import ManifestError
from buildctl.artifact_store.manifest import MANIFEST_SCHEMA_VERSION, check_relpath, parse_manifest

D = "xxh3-128:" + "a" * 32
B3 = "blake3:" + "b" * 64


def manifest(files, **over):
    base = {"schema_version": MANIFEST_SCHEMA_VERSION, "files": files, "profile_name": "p",
            "profile_hash": D, "backend": "aoti", "compat_key": "aoti-x", "fingerprint": {},
            "created_at": "2026-01-01T00:00:00Z"}
    base.update(over)
    return json.dumps(base)


def f(path, size=1, digest=D, blake3=B3):
    return {"path": path, "size": size, "digest": digest, "executable": False, "blake3": blake3}


@pytest.mark.parametrize("files,needle", [
    ([f("../etc/passwd")], "'..'"),
    ([f("a/../../b")], "'..'"),
    ([f("/etc/passwd")], "absolute"),
    ([f("C:/x")], "absolute"),
    ([f("a\\b")], "backslash"),
    ([f("a//b")], "''"),
    ([f("a"), f("a")], "duplicate"),
    ([f("A"), f("a")], "case-only"),
    ([f("a"), f("a/b")], "both a file and a directory"),
    ([f("b"), f("a")], "sorted"),
    ([f("x", digest="md5:00")], "xxh3-128"),
    ([f("x", size=-1)], "greater than or equal"),
    ([], "at least 1"),
])
def test_bad_manifests_refused(files, needle):
    with pytest.raises(ManifestError) as exc:
        parse_manifest(manifest(files), "m.json")
    assert needle in str(exc.value)


def test_unknown_schema_version_refused():
    with pytest.raises(ManifestError) as exc:
        parse_manifest(manifest([f("a")], schema_version=3))
    assert "unknown manifest schema_version 3" in str(exc.value)


def test_unknown_field_and_garbage_refused():
    with pytest.raises(ManifestError):
        parse_manifest(manifest([f("a")], surprise=1))
    with pytest.raises(ManifestError):
        parse_manifest(b"\xff\xfe not json")
    with pytest.raises(ManifestError):
        parse_manifest("[1, 2]")


def test_artifact_id_is_digest_of_canonical_json():
    m = parse_manifest(manifest([f("a"), f("b/c")]))
    assert m.artifact_id() == digest_bytes(m.canonical())
    assert parse_manifest(m.canonical()).artifact_id() == m.artifact_id()
    later = m.model_copy(update={"created_at": "2027-01-01T00:00:00Z"})
    assert later.artifact_id() != m.artifact_id() and later.identity() == m.identity()


@given(st.text(min_size=1, max_size=80))
def test_accepted_paths_never_escape(path):
    try:
        check_relpath(path)
    except ValueError:
        return
    joined = posixpath.normpath(posixpath.join("/root/dest", path))
    assert joined.startswith("/root/dest/")
    assert ".." not in path.split("/")


def test_hash_file_matches_bytes(tmp_path):
    p = tmp_path / "x"
    data = bytes(range(256)) * 40000
    p.write_bytes(data)
    assert hash_file(p, buffer_size=4096) == (digest_bytes(data), len(data))


def test_path_limits_are_inclusive():
    from buildctl.artifact_store.manifest import MAX_COMPONENT_LEN, MAX_PATH_LEN

    assert (MAX_PATH_LEN, MAX_COMPONENT_LEN) == (1024, 255)
    longest = "/".join(["c" * 255] * 3 + ["d" * 254, "e"])  # 1024 bytes
    assert len(longest) == 1024 and check_relpath(longest) == longest
    with pytest.raises(ValueError, match="longer than 1024 bytes"):
        check_relpath(longest + "e")
    assert check_relpath("x" * 255) and check_relpath("é" * 127)  # 254 bytes
    with pytest.raises(ValueError, match="component longer than 255 bytes"):
        check_relpath("x" * 256)


@pytest.mark.parametrize("ok", ["a b", "a~", "ab:c", ":x", "a", "a.b/c..d", "x/.hidden"])
def test_ordinary_paths_are_accepted(ok):
    assert check_relpath(ok) == ok


@pytest.mark.parametrize("bad,why", [("", "empty path"), ("a\x1fb", "control"), ("\x01", "control"),
                                     ("a\x00", "control"), ("c:", "absolute"), ("c:x", "absolute"),
                                     (".", "'.'")])
def test_unsafe_paths_are_refused_with_the_reason(bad, why):
    with pytest.raises(ValueError, match=why):
        check_relpath(bad)


def test_entries_and_manifests_defaults_and_digests():
    from buildctl.artifact_store.manifest import FileEntry

    e = FileEntry(path="empty", size=0, digest=D)
    assert e.executable is False and e.size == 0
    body = json.loads(manifest([f("x", blake3=None)]))
    body["schema_version"] = 1  # what every manifest published before BLAKE3 says
    assert parse_manifest(json.dumps(body)).schema_version == 1
    assert parse_manifest(manifest([f("x")])).schema_version == 2  # the current default
    log = "xxh3-128:" + "b" * 32
    m = parse_manifest(manifest([f("x")], build_log=log, build_log_blake3=B3, model_digest="xxh3-128:" + "c" * 32))
    assert m.blob_digests() == {D, log}
    assert parse_manifest(manifest([f("x")])).blob_digests() == {D}
    for field in ("build_log", "model_digest"):
        with pytest.raises(ManifestError, match="bad digest"):
            parse_manifest(manifest([f("x")], **{field: "md5:00"}))


def test_scan_tree_walks_on_after_a_directory_and_refuses_what_it_cannot_hold(tmp_path):
    import dataclasses
    import os

    from buildctl.artifact_store.errors import UnsafeTreeError
    from buildctl.artifact_store.manifest import hash_tree, scan_tree

    root = tmp_path / "t"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x").write_bytes(b"1")
    (root / "b").write_bytes(b"22")
    (root / "c").write_bytes(b"333")
    files = scan_tree(root)
    assert [(s.path, s.size) for s in files] == [("a/x", 1), ("b", 2), ("c", 3)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        files[0].size = 5  # type: ignore[misc]
    assert hash_tree([]) == [] and hash_tree([], workers=4) == []
    assert [e.path for e in hash_tree(files)] == ["a/x", "b", "c"]  # the default worker count
    assert hash_tree(files, workers=1) == hash_tree(files, workers=3)
    os.symlink(root / "b", root / "link")
    with pytest.raises(UnsafeTreeError, match="symlink"):
        scan_tree(root)
    (root / "link").unlink()
    (root / "bad\x01name").write_bytes(b"")
    with pytest.raises(UnsafeTreeError, match="control character"):
        scan_tree(root)
    (root / "bad\x01name").unlink()
    (root / "B").write_bytes(b"")
    with pytest.raises(UnsafeTreeError, match="case-only"):
        scan_tree(root)


def test_entries_are_frozen_and_root_level_errors_are_named():
    from pydantic import ValidationError

    from buildctl.artifact_store.manifest import FileEntry

    e = FileEntry(path="x", size=1, digest=D)
    with pytest.raises(ValidationError):
        e.size = 2  # type: ignore[misc]
    with pytest.raises(ManifestError, match=r"<root>: Value error, files must be sorted by path"):
        parse_manifest(manifest([f("b"), f("a")]))


def test_schema_2_needs_blake3_on_every_file_and_the_build_log_and_schema_1_has_none():
    ok = parse_manifest(manifest([f("a"), f("b")], build_log=D, build_log_blake3=B3))
    assert ok.crypto and ok.files[0].blake3 == B3
    for bad, needle in [
        (manifest([f("a"), f("b", blake3=None)]), "need a blake3 digest"),
        (manifest([f("a")], build_log=D), "come together"),
        (manifest([f("a")], build_log_blake3=B3), "come together"),
        (manifest([f("a", blake3="blake3:" + "B" * 64)]), "blake3:<64 lowercase hex>"),
        (manifest([f("a", blake3="xxh3-128:" + "b" * 32)]), "blake3:<64 lowercase hex>"),
        (manifest([f("a")], schema_version=1), "have no a blake3"),
        (manifest([f("a", blake3=None)], schema_version=1, build_log=D, build_log_blake3=B3), "no build_log_blake3"),
        (manifest([f("a", blake3=None)], schema_version=1, rehashed_from=D), "or rehashed_from"),
        (manifest([f("a")], rehashed_from="md5:00"), "bad artifact id"),
    ]:
        with pytest.raises(ManifestError) as exc:
            parse_manifest(bad, "m.json")
        assert needle in str(exc.value)


def test_a_schema_1_manifest_dumps_byte_for_byte_as_written_so_its_id_still_holds():
    old = {"schema_version": 1, "files": [{"path": "a", "size": 1, "digest": D, "executable": False}],
           "profile_name": "p", "profile_hash": D, "build_key": None, "backend": "aoti", "compat_key": "k",
           "fingerprint": {}, "tool_versions": {}, "model_digest": None, "created_at": "2026-01-01T00:00:00Z",
           "build_log": None}
    body = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    m = parse_manifest(body)
    assert not m.crypto and m.files[0].blake3 is None
    assert m.canonical() == body and m.artifact_id() == digest_bytes(body)


# --- digests of files and trees, each alone (`make mutants` runs these for manifest.py) ---------------


def test_content_problem_checks_xxh3_first_then_blake3_only_where_given():
    from buildctl.artifact_store.manifest import content_problem
    from buildctl.core.digest import Hasher, crypto_bytes

    h = Hasher(crypto=True)
    h.update(b"engine bytes")
    ok, blake = digest_bytes(b"engine bytes"), crypto_bytes(b"engine bytes")
    assert content_problem("f", ok, None, h) is None and content_problem("f", ok, blake, h) is None
    rot = content_problem("f", digest_bytes(b"other"), blake, h)
    assert (rot.kind, rot.expected, rot.actual) == ("digest", digest_bytes(b"other"), ok)
    forged = content_problem("f", ok, crypto_bytes(b"other"), h)
    assert (forged.kind, forged.expected, forged.actual) == ("blake3", crypto_bytes(b"other"), blake)


def test_entry_problem_checks_the_size_before_the_digests():
    from buildctl.artifact_store.manifest import FileEntry, entry_problem
    from buildctl.core.digest import Hasher

    h = Hasher()
    h.update(b"12345")
    entry = FileEntry(path="f", size=5, digest=digest_bytes(b"12345"), executable=False)
    assert entry_problem(entry, h) is None
    short = entry_problem(entry.model_copy(update={"size": 6}), h)
    assert (short.kind, short.expected, short.actual) == ("size", 6, 5)


def test_same_files_ignores_blake3_and_nothing_else():
    m = parse_manifest(manifest([f("a", 3), f("b", 5)]))
    with_blake = m.model_copy(update={"files": tuple(f.model_copy(update={"blake3": "blake3:" + "1" * 64})
                                                     for f in m.files)})
    assert m.same_files(with_blake) and with_blake.same_files(m)
    bigger = m.model_copy(update={"files": tuple(f.model_copy(update={"size": f.size + 1}) for f in m.files)})
    assert not m.same_files(bigger)


def test_hash_tree_fills_each_files_crc64nvme_when_asked(tmp_path):
    from buildctl.artifact_store.manifest import hash_tree, scan_tree
    from buildctl.core.digest import Crc64Nvme

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.bin").write_bytes(b"a" * 5000)
    (tmp_path / "t" / "b.bin").write_bytes(b"b" * 7000)
    crcs: dict[str, str] = {}
    entries = hash_tree(scan_tree(tmp_path / "t"), crc64=crcs)
    for name, data in (("a.bin", b"a" * 5000), ("b.bin", b"b" * 7000)):
        c = Crc64Nvme()
        c.update(memoryview(data))
        assert crcs[name] == c.b64
    assert [e.path for e in hash_tree(scan_tree(tmp_path / "t"))] == [e.path for e in entries]  # and runs without


def test_tree_digests_are_one_read_of_the_tree_and_a_file_is_a_tree_of_one(tmp_path):
    from buildctl.artifact_store.manifest import hash_tree, scan_tree, tree_digest, tree_digests
    from buildctl.core.digest import canonical_json, crypto_bytes

    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_bytes(b'{"model_type": "llama"}')
    (root / "weights.bin").write_bytes(bytes(range(256)) * 40)
    plain, blake = tree_digests(root)
    assert plain == tree_digest(root)  # the build key's digest: xxh3 entries, no BLAKE3 in them
    entries = [e.model_dump(mode="json") for e in hash_tree(scan_tree(root), crypto=True)]
    assert all(e["blake3"] for e in entries) and blake == crypto_bytes(canonical_json(entries))
    one = tmp_path / "single"
    one.mkdir()
    (one / "weights.bin").write_bytes((root / "weights.bin").read_bytes())
    assert tree_digests(root / "weights.bin") == tree_digests(one)


def test_tree_stat_lists_every_file_with_what_a_write_changes(tmp_path):
    import os

    from buildctl.artifact_store.manifest import tree_stat

    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 10)
    (root / "sub" / "b.bin").write_bytes(b"b" * 20)
    got = tree_stat(root)
    assert [(p, size) for p, size, *_ in got] == [("a.bin", 10), ("sub/b.bin", 20)]
    st = os.stat(root / "a.bin")
    assert got[0][2:] == (st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    assert [p for p, *_ in tree_stat(root / "a.bin")] == ["a.bin"]  # a single file: a tree of one


# --- one read per byte: every reader of a schema 2 file hashes it once, by BLAKE3 alone (#51) ---


class _Tally:
    """Bytes fed to xxh3-128 and to BLAKE3-256 hashers, counted by wrapping their constructors."""

    def __init__(self, monkeypatch) -> None:
        import xxhash

        from buildctl.core import digest

        self.bytes = {"xxh3": 0, "blake3": 0}
        real_xxh, real_b3 = xxhash.xxh3_128, digest._blake3
        monkeypatch.setattr(digest.xxhash, "xxh3_128", lambda *a: self._wrap(real_xxh(*a), "xxh3"))
        monkeypatch.setattr(digest, "_blake3", lambda: self._wrap(real_b3(), "blake3"))

    def _wrap(self, inner, name):
        tally = self.bytes

        class Counted:
            def update(self, data):
                tally[name] += len(data)
                inner.update(data)

            def hexdigest(self):
                return inner.hexdigest()

        return Counted()

    def take(self) -> dict[str, int]:
        out, self.bytes = dict(self.bytes), {"xxh3": 0, "blake3": 0}
        return out


@pytest.mark.parametrize("ranged", [False, True], ids=["stream", "ranged"])
def test_every_reader_hashes_a_schema_2_file_once_by_blake3_alone(tmp_path, draft, monkeypatch, ranged):
    """Pull, stage, activate's re-hash, repair's check of a copy, a publish's read-back of a stored
    blob and verify --deep read each byte of a schema 2 artifact once, and hash it by BLAKE3-256
    alone: xxh3-128 sees no byte of it."""
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.channels import read_channel
    from buildctl.artifact_store.node.install_dir import install_artifact, local_problems, stage_artifact
    from buildctl.artifact_store.promotion import promote
    from buildctl.artifact_store.read import get_manifest, verify
    from buildctl.artifact_store.upkeep.repair import blob_holds, tree_source

    from ..support.helpers import RangedStore, publish_files, staged

    store = open_store(str(tmp_path / "store"))
    files = {"rank0.engine": 3 * 1024 * 1024 + 7, "config.json": b'{"a": 1}', "tok/vocab.bin": 70_000}
    aid = publish_files(store, tmp_path / "src", draft, files)
    m = get_manifest(store, aid)
    total = m.total_size
    reader = RangedStore(store) if ranged else store
    if ranged:
        from buildctl.artifact_store.backends import ranged as ranged_mod

        monkeypatch.setattr(ranged_mod, "RANGE_SIZE", 1024 * 1024)
    tally = _Tally(monkeypatch)

    install_artifact(reader, aid, tmp_path / "node")
    assert tally.take() == {"xxh3": 0, "blake3": total}, "pull"
    assert local_problems(m, (tmp_path / "node" / "current").resolve()) == []
    assert tally.take() == {"xxh3": 0, "blake3": total}, "activate's re-hash"
    verify(reader, aid, deep=True)
    assert tally.take() == {"xxh3": 0, "blake3": total}, "verify --deep"
    assert all(blob_holds(store, e.digest, e.size, blake3=e.blake3) for e in m.files)
    assert tally.take() == {"xxh3": 0, "blake3": total}, "a publish's read-back"
    source = tree_source(tmp_path / "src")
    from buildctl.artifact_store.manifest import file_problem

    assert all(file_problem(e, source(e)) is None for e in m.files)
    assert tally.take() == {"xxh3": 0, "blake3": total}, "repair's check of a copy"
    promote(store, staged(store, aid), "prod")
    rec = read_channel(store, m.profile_name, "prod", m.compat_key)[0]
    tally.take()
    stage_artifact(reader, rec, aid, tmp_path / "other", when="2026-12-05T00:00:00Z")
    assert tally.take() == {"xxh3": 0, "blake3": total}, "stage"


def test_a_blake3_mismatch_is_read_again_to_name_rot_or_a_collision(tmp_path):
    from buildctl.artifact_store.manifest import FileEntry, file_problem
    from buildctl.core.digest import file_hasher

    from ..support.helpers import xxh3_collision

    good, twin = xxh3_collision()
    p = tmp_path / "f"
    p.write_bytes(good)
    h = file_hasher(p, crypto=True)
    entry = FileEntry(path="f", size=len(good), digest=h.digest(), blake3=h.crypto())
    assert file_problem(entry, p) is None
    p.write_bytes(twin)  # the same xxh3-128, other bytes: made to collide
    got = file_problem(entry, p)
    assert (got.kind, got.expected, got.actual) == ("blake3", h.crypto(), file_hasher(p, crypto=True).crypto())
    p.write_bytes(bytes([good[0] ^ 1]) + good[1:])  # one flipped bit: rot
    assert file_problem(entry, p).kind == "digest"
    p.write_bytes(good[:-1])
    assert file_problem(entry, p).kind == "size"
    schema1 = entry.model_copy(update={"blake3": None})
    assert file_problem(schema1, p).kind == "size"
    p.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    assert file_problem(schema1, p).kind == "digest"  # xxh3-128 only, the size right: rot still found
    p.write_bytes(twin)
    assert file_problem(schema1, p) is None  # xxh3-128 only: the collision passes (why schema 2 exists)
