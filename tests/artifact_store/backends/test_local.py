"""The local-directory store's own rules (buildctl.artifact_store.backends.local): key checks, read-only objects,
short reads, listing around its reserved directories, clean-up after failed writes, and a full
disk. The behaviour both stores share is in test_store_contract.py."""

from __future__ import annotations

import errno
import os
import stat

import pytest

import buildctl.artifact_store.backends.local as local_mod
from buildctl.artifact_store.errors import KeyNotFoundError, StoreArgumentError, StoreUnavailableError
from buildctl.artifact_store.backends.local import LocalStore

KEY = "blobs/aa/" + "a" * 32


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def leftovers(store) -> list[str]:
    return sorted(p.name for p in (store.root / ".tmp").iterdir())


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "a/../b", "..", ".tmp/x", ".locks/y", ".tmp"])
def test_bad_keys_are_refused(store, bad):
    with pytest.raises(StoreArgumentError, match="bad store key"):
        store.put_bytes(bad, b"x")


def test_reserved_names_only_count_at_the_top(store):
    for key in ("x/.tmp", "x/.locks/y", "a..b/c"):
        assert store.put_bytes(key, b"x") and store.get_bytes(key) == b"x"


def test_an_unusable_root_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    store = LocalStore(tmp_path / "file" / "store")  # opening writes nothing; the first write says why not
    assert store.stat("blobs/x") is None
    with pytest.raises(StoreUnavailableError) as exc:
        store.put_bytes("blobs/x", b"x")
    assert str(exc.value).endswith("cannot create store directory: Not a directory")


def test_objects_are_read_only_whichever_way_they_were_written(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"y" * 100)
    store.put_bytes("a/one", b"x")
    store.put_file("a/two", src, size=100)
    store.replace_object("b/c/three", src, size=100)  # a new key, parents created
    store.replace_object("a/two", src, size=100)  # over an existing object
    for key in ("a/one", "a/two", "b/c/three"):
        assert mode(store.root / key) == 0o444, key
    assert store.get_bytes("b/c/three") == b"y" * 100 and leftovers(store) == []


def test_missing_keys(store):
    with pytest.raises(KeyNotFoundError):
        store.get_bytes("no/such")
    with pytest.raises(KeyNotFoundError):
        with store.open_read("no/such"):
            pass
    with pytest.raises(KeyNotFoundError):
        store.read_range("no/such", 0, 1)
    with pytest.raises(KeyNotFoundError):
        store.stored_checksum("no/such")
    store.put_bytes("a/file", b"x")
    with pytest.raises(KeyNotFoundError):  # a path through a file
        with store.open_read("a/file/below"):
            pass
    with pytest.raises(KeyNotFoundError):
        store.read_range("a/file/below", 0, 1)
    assert store.stat("no/such") is None and store.get_ref("no/such") is None
    store.delete("no/such")  # deleting what is not there is not an error


def test_read_range_assembles_short_reads(store, monkeypatch):
    """pread may return fewer bytes than asked: the store keeps reading, and never past the range."""
    data = bytes(range(256)) * 40
    store.put_bytes(KEY, data)
    real = os.pread
    calls = []

    def short(fd, n, offset):
        calls.append(n)
        return real(fd, min(n, 1000), offset)

    monkeypatch.setattr(local_mod.os, "pread", short)
    for offset, length in ((0, 1000), (0, 2000), (10, 2500), (5, 2990), (9000, 5000), (10240, 5), (3, 0)):
        assert store.read_range(KEY, offset, length) == data[offset:offset + length], (offset, length)
    assert max(calls) == 5000


def test_list_leaves_out_the_reserved_directories_and_temp_files(store):
    store.cas("channels/p/prod/k.json", b"{}", None)  # leaves a lock file in .locks/
    store.put_bytes("manifests/ab.json", b"{}")
    (store.root / ".tmp" / "stray.part").write_bytes(b"")
    (store.root / "manifests" / "half.json.part").write_bytes(b"")
    assert list(store.list("")) == ["channels/p/prod/k.json", "manifests/ab.json"]
    assert list(store.list("man")) == ["manifests/ab.json"]
    assert list(store.list("manifests/a")) == ["manifests/ab.json"]
    assert list(store.list("channels/p/prod/k")) == ["channels/p/prod/k.json"]


def test_a_failed_copy_leaves_no_temp_file(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"x" * 10)
    with pytest.raises(StoreUnavailableError, match=r"changed during upload \(11 -> 10 bytes\)"):
        store.put_file(KEY, src, size=11)
    with pytest.raises(IsADirectoryError):  # the source's own error, not one from the clean-up
        store.put_file(KEY, tmp_path, size=1)
    assert leftovers(store) == [] and store.stat(KEY) is None


@pytest.mark.parametrize("code,raised", [(errno.ENOSPC, StoreUnavailableError), (errno.EIO, OSError)])
def test_a_failed_ref_write_leaves_the_ref_and_no_temp_file(store, monkeypatch, code, raised):
    assert store.cas("channels/p/prod/k.json", b"old", None)
    token = store.get_ref("channels/p/prod/k.json")[1]

    def fail(*a, **k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(local_mod.os, "replace", fail)
    with pytest.raises(raised) as exc:
        store.cas("channels/p/prod/k.json", b"new", token)
    if raised is StoreUnavailableError:
        assert "no space left on device" in str(exc.value)
    monkeypatch.undo()
    assert store.get_bytes("channels/p/prod/k.json") == b"old" and leftovers(store) == []


def test_a_ref_write_that_cannot_even_open_its_temp_file(store, monkeypatch):
    def fail(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local_mod, "open", fail, raising=False)
    with pytest.raises(StoreUnavailableError, match="no space left"):
        store.cas("channels/p/prod/k.json", b"new", None)


def test_read_only_commands_never_create_a_store(cli, tmp_path):
    """#29 item 7: `ls` (or any read) on a mistyped file-store path created that store."""
    missing = tmp_path / "no-such-store"
    for args in (("ls",), ("history", "--profile", "p", "--channel", "prod"), ("gc", "--dry-run"),
                 ("pull", "--profile", "p", "--channel", "prod", "--dest", str(tmp_path / "dest"))):
        code, _, err = cli("--store", missing, *args)
        assert code in (0, 3), (args, err)
        assert not missing.exists(), args
    from buildctl.artifact_store.backends.local import LocalStore

    store = LocalStore(missing)
    assert not missing.exists() and store.stat("blobs/x") is None and list(store.list("")) == []
    assert store.put_bytes("blobs/x", b"x") and store.get_bytes("blobs/x") == b"x"  # the first write creates it


def test_list_walks_only_folders_that_can_hold_a_listed_key(store, monkeypatch):
    """The walk skips folders outside the prefix and wholly before ``start_after``, and still lists
    exactly the keys a filter of every key gives, for prefixes and bounds of every shape."""
    import random

    rng = random.Random(3)
    keys = sorted({"/".join(rng.choice(["a", "ab", "b", "b0", "c"]) for _ in range(rng.randint(1, 4))) + ".k"
                   for _ in range(300)})
    for k in keys:
        store.put_bytes(k, b"")
    cuts = ["", "a", "a/", "ab", "ab/", "b/b0", "b0/", "c/a/", "zz"] + rng.sample(keys, 10)
    for prefix in cuts:
        for after in [None] + cuts:
            want = [k for k in keys if k.startswith(prefix) and (after is None or k > after)]
            assert list(store.list(prefix, start_after=after)) == want, (prefix, after)
    walked = []
    real = os.walk
    monkeypatch.setattr(os, "walk", lambda top: ((d, n, f) for d, n, f in real(top) if walked.append(d) or True))
    assert list(store.list("b/", start_after="b/b0/")) == [k for k in keys if k.startswith("b/") and k > "b/b0/"]
    assert not any(p.endswith(("/b/a", "/b/ab")) for p in walked)  # before the bound: not walked
    assert not any(p.endswith("/a") for p in walked)  # outside the prefix
    walked.clear()
    assert list(store.list("b/b")) == [k for k in keys if k.startswith("b/b")]
    rel = {os.path.relpath(p, store.root) for p in walked}
    assert {"b", "b/b", "b/b0"} <= rel and not rel & {"b/a", "b/ab", "b/c"}  # siblings outside the prefix: not walked
