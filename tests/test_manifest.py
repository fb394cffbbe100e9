from __future__ import annotations

import json
import posixpath

import pytest
from hypothesis import given, strategies as st

from buildctl.digest import digest_bytes, hash_file
from buildctl.store.errors import ManifestError
from buildctl.store.manifest import MANIFEST_SCHEMA_VERSION, check_relpath, parse_manifest

D = "xxh3-128:" + "a" * 32


def manifest(files, **over):
    base = {"schema_version": MANIFEST_SCHEMA_VERSION, "files": files, "profile_name": "p",
            "profile_hash": D, "backend": "aoti", "compat_key": "aoti-x", "fingerprint": {},
            "created_at": "2026-01-01T00:00:00Z"}
    base.update(over)
    return json.dumps(base)


def f(path, size=1, digest=D):
    return {"path": path, "size": size, "digest": digest, "executable": False}


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
        parse_manifest(manifest([f("a")], schema_version=2))
    assert "unknown manifest schema_version 2" in str(exc.value)


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
