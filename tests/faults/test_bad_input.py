"""Bad input: property tests for manifest/profile parsing and the path rules, and every CLI
command given garbage, missing files, unreadable files and an unreachable store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from buildctl.artifact_store.errors import ManifestError, UnsafeTreeError
from buildctl.artifact_store.manifest import check_relpath, check_unique_paths, parse_manifest, scan_tree
from buildctl.engines.errors import ProfileError
from buildctl.engines.profile import parse_profile

from ..support.helpers import PROFILES, REPO
from .conftest import scale

D = "xxh3-128:" + "a" * 32
EXAMPLES: dict[str, int] = {}


def count(name: str) -> None:
    EXAMPLES[name] = EXAMPLES.get(name, 0) + 1


SETTINGS = settings(max_examples=scale(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=20)


@SETTINGS
@given(json_values)
def test_manifest_parser_only_raises_manifest_error(value):
    count("manifest JSON of any shape")
    try:
        parse_manifest(json.dumps(value).encode())
    except ManifestError:
        pass


@SETTINGS
@given(st.dictionaries(st.sampled_from(["path", "size", "digest", "executable", "extra"]),
                       json_values | st.text(max_size=300), max_size=5))
def test_file_entries_with_wrong_types(entry):
    count("file entries with wrong types")
    doc = {"schema_version": 1, "files": [entry], "profile_name": "p", "profile_hash": D, "backend": "aoti",
           "compat_key": "k", "fingerprint": {}, "created_at": "t"}
    try:
        m = parse_manifest(json.dumps(doc))
    except ManifestError:
        return
    check_relpath(m.files[0].path)  # whatever parsed is safe


@SETTINGS
@given(st.text(min_size=1, max_size=2000))
def test_path_rules_never_accept_escapes(path):
    count("paths: traversal, absolute, unicode, long names")
    try:
        check_relpath(path)
    except ValueError:
        return
    parts = path.split("/")
    assert ".." not in parts and "" not in parts and not path.startswith("/")
    assert unicodedata.normalize("NFC", path) == path and len(path.encode()) <= 1024


@SETTINGS
@given(st.lists(st.text(alphabet="abcABC/é", min_size=1, max_size=6), min_size=1, max_size=8))
def test_case_collisions_and_duplicates(paths):
    count("case collisions and duplicates")
    try:
        check_unique_paths(paths)
    except ValueError:
        return
    assert len({p.casefold() for p in paths}) == len(paths)


def test_unicode_normalisation_tricks_refused():
    for name in (unicodedata.normalize("NFD", "café.bin"), "a/../b", "a\u0000b", "a\\b", "/abs", "x" * 300):
        with pytest.raises(ValueError):
            check_relpath(name)


def test_huge_manifest_parses_in_bounded_time():
    files = sorted(({"path": f"d{i // 1000:04d}/f{i:06d}", "size": i, "digest": D, "executable": False}
                    for i in range(scale(50_000))), key=lambda f: f["path"])
    doc = {"schema_version": 1, "files": files, "profile_name": "p", "profile_hash": D, "backend": "aoti",
           "compat_key": "k", "fingerprint": {}, "created_at": "t"}
    import time

    t = time.perf_counter()
    m = parse_manifest(json.dumps(doc))
    assert len(m.files) == len(files) and time.perf_counter() - t < 60


@SETTINGS
@given(json_values)
def test_profile_parser_only_raises_profile_error(value):
    count("profiles of any shape")
    try:
        parse_profile(value, "fuzz.yaml")
    except ProfileError as err:
        assert err.source == "fuzz.yaml" and err.problems


def test_long_names_in_trees_refused(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / ("n" * 250)).write_bytes(b"x")  # fine
    scan_tree(d)
    deep = d
    for _ in range(6):
        deep = deep / ("p" * 200)
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    with pytest.raises(UnsafeTreeError):
        scan_tree(d)


# --- the CLI given garbage --------------------------------------------------------------------

def cli_cases(tmp_path):
    unreadable = tmp_path / "unreadable.yaml"
    unreadable.write_text("name: x")
    unreadable.chmod(0)
    garbage = tmp_path / "garbage.yaml"
    garbage.write_bytes(os.urandom(200))
    missing = tmp_path / "missing"
    dead = "s3://bucket-xyz/p"
    return [
        (["profile", "check", str(missing)], 3), (["profile", "check", str(garbage)], 2),
        (["profile", "show", str(garbage)], 2), (["profile", "check"], 2),
        (["fingerprint", "--bogus"], 2), (["nonsense"], 2),
        (["import", str(missing), "--profile", str(PROFILES / "tiny-llama-cpu.yaml")], 2),
        (["import", str(tmp_path), "--profile", str(missing)], 3),
        (["import", str(tmp_path), "--profile", str(garbage)], 2),
        (["show", "not-hex!"], 3), (["show", "deadbeefdeadbeef"], 3), (["verify", "zz"], 3),
        (["promote", "deadbeefdeadbeef", "--channel", "prod"], 3), (["promote", "x"], 2),
        (["history", "--profile", "p", "--channel", "c"], 3),
        (["rollback", "--profile", "p", "--channel", "c"], 3),
        (["pull", "--profile", "p", "--channel", "c", "--dest", str(tmp_path / "n")], 3),
        (["gc", "--keep", "-1"], 2), (["gc", "--keep", "abc"], 2),
        (["build", str(missing)], 3), (["build", str(garbage)], 2),
        (["validate", "deadbeefdeadbeef"], 3), (["validate", "deadbeefdeadbeef", "--prompts", str(missing)], 3),
        (["generate", str(tmp_path), "--prompt-ids", "1,2"], 2), (["generate", str(tmp_path), "--prompt-ids", "a,b"], 2),
        (["node", "report", "--node-id", "../x"], 2), (["key", "generate"], 2),
        (["model", "make-tiny", str(tmp_path), "--seed", "-3"], 2),
        (["--store", "ftp://x", "ls"], 2), (["--store", dead, "--endpoint-url", "http://127.0.0.1:9", "ls"], 9),
        (["--store", dead, "--endpoint-url", "http://127.0.0.1:9", "show", "deadbeefdeadbeef"], 9),
        # unreadable: a directory where a file belongs (root reads any mode-000 file, so that case is non-root only)
        (["profile", "check", str(tmp_path)], 2), (["import", str(tmp_path), "--profile", str(tmp_path)], 2),
    ] + ([(["profile", "check", str(unreadable)], 2)] if os.geteuid() != 0 else [])


def test_every_command_fails_cleanly(tmp_path, record_fault):
    env = {**os.environ, "BUILDCTL_STORE": f"file://{tmp_path}/store", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    env.pop("BUILDCTL_DEBUG", None)
    cases = cli_cases(tmp_path)
    for args, code in cases:
        r = subprocess.run([sys.executable, "-m", "buildctl", *args], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == code, (args, r.returncode, r.stderr[-800:])
        assert "Traceback" not in r.stderr, (args, r.stderr[-800:])
        assert r.stderr.strip(), args
    record_fault("CLI garbage", "garbage args, missing/unreadable/garbage files, unreachable store", len(cases))


def test_property_counts_recorded(record_fault):
    """Runs after the property tests of this module: records how many examples each checked."""
    for name, n in EXAMPLES.items():
        record_fault(f"property: {name}", "hypothesis-generated inputs", n)
    assert EXAMPLES, "the property tests ran before this one"
