"""Parallel ranged reads hashed in order (buildctl.artifact_store.backends.ranged): order, corruption, memory."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.publish import publish_tree
from buildctl.artifact_store.read import get_manifest, verify
from buildctl.artifact_store.node.checkpoints import download_checkpoint
from buildctl.artifact_store.errors import StoreUnavailableError, VerificationError
from buildctl.artifact_store.node.install_dir import InstallOptions, current_artifact, install_artifact
from buildctl.artifact_store.backends.ranged import RangedReader

from ...support.helpers import REPO, make_tree


class Jittery:
    """A store whose ranged reads finish in random order (random delays), optionally with one
    range's bytes flipped in transit; everything else goes to the real store. Ranged reads are on
    for both backends here (a local store normally streams)."""

    ranged_reads = True

    def __init__(self, store, seed: int = 0, corrupt_offset: int | None = None) -> None:
        self._store, self._rng, self._lock = store, random.Random(seed), threading.Lock()
        self.corrupt_offset = corrupt_offset
        self.completed: list[int] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with self._lock:
            delay = self._rng.random() * 0.02
        time.sleep(delay)
        data = self._store.read_range(key, offset, length)
        if offset == self.corrupt_offset:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        with self._lock:
            self.completed.append(offset)
        return data


def test_out_of_order_ranges_hash_correctly(store, tmp_path, draft):
    root = make_tree(tmp_path / "e", {"config.json": b"{}", "rank0.engine": 6 * 1024 * 1024 + 5,
                                      "rank1.engine": 3 * 1024 * 1024})
    art = publish_tree(store, root, draft).artifact_id
    jitter = Jittery(store, seed=7)
    res = install_artifact(jitter, art, tmp_path / "node", options=InstallOptions(range_slots=6))
    assert res.installed and current_artifact(tmp_path / "node") == art
    for name in ("rank0.engine", "rank1.engine"):
        assert (tmp_path / "node/current" / name).read_bytes() == (root / name).read_bytes()
    assert len(jitter.completed) == 7 + 3 and jitter.completed != sorted(jitter.completed), "ranges did complete out of order"
    # deep verify through the same path
    h = RangedReader(jitter, slots=4).hash_object(f"blobs/{get_manifest(store, art).files[1].digest[9:11]}/"
                                                  f"{get_manifest(store, art).files[1].digest[9:]}", 6 * 1024 * 1024 + 5)
    assert h.digest() == get_manifest(store, art).files[1].digest


def test_a_corrupted_range_is_caught_and_current_untouched(store, tmp_path, draft):
    v1 = publish_tree(store, make_tree(tmp_path / "v1", {"rank0.engine": 2 * 1024 * 1024}, seed=1), draft).artifact_id
    install_artifact(store, v1, tmp_path / "node")
    v2 = publish_tree(store, make_tree(tmp_path / "v2", {"rank0.engine": 5 * 1024 * 1024}, seed=2), draft).artifact_id
    with pytest.raises(VerificationError) as exc:
        install_artifact(Jittery(store, corrupt_offset=2 * 1024 * 1024), v2, tmp_path / "node")
    assert [(p.path, p.kind) for p in exc.value.problems] == [("rank0.engine", "digest")]
    assert current_artifact(tmp_path / "node") == v1
    assert not list((tmp_path / "node").glob(".staging-*"))
    with pytest.raises(VerificationError):  # deep verify reads the same way
        verify(Jittery(store, corrupt_offset=1024 * 1024), v2, deep=True)


def test_checkpoint_download_is_ranged_and_checked(store, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 11)
    (tmp_path / "shard").write_bytes(data)
    store.put_file("models/m/model-00001.safetensors", tmp_path / "shard", size=len(data))
    store.put_bytes("models/m/config.json", b'{"vocab_size": 1024}')
    jitter = Jittery(store, seed=3)
    out = download_checkpoint(jitter, tmp_path / "ckpt", "models/m/")
    assert (out / "model-00001.safetensors").read_bytes() == data and len(jitter.completed) == 4
    if store.uri.startswith("s3://"):  # S3 keeps a full-object CRC64NVME: a flipped range is caught
        with pytest.raises(StoreUnavailableError, match="CRC64NVME"):
            download_checkpoint(Jittery(store, corrupt_offset=1024 * 1024), tmp_path / "ckpt2", "models/m/")
        assert not (tmp_path / "ckpt2").exists()


MEASURE = r"""
import json, os, sys
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.backends import ranged
from buildctl.artifact_store.node.install_dir import InstallOptions, install_artifact
ranged.RANGE_SIZE = int(sys.argv[4])
store = open_store(sys.argv[1])
store.ranged_reads = True
def status(field):  # KiB; VmHWM is this process's peak RSS (ru_maxrss would include the parent's from before exec)
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))
before = status("VmRSS")
install_artifact(store, sys.argv[2], sys.argv[3], options=InstallOptions(range_slots=int(sys.argv[5]), workers=1))
after = status("VmHWM")
print(json.dumps({"before_kib": before, "after_kib": after}))
"""


@pytest.mark.slow
def test_memory_stays_bounded_by_the_reorder_window(tmp_path, draft):
    """Peak RSS while pulling a 1 GiB blob: the ranges in flight and waiting to be hashed, not the blob.
    (A local store with ranged reads switched on: the same code path as S3, without the server.)"""
    store = open_store(f"file://{tmp_path}/store")
    blob = tmp_path / "e" / "rank0.engine"
    blob.parent.mkdir()
    chunk = os.urandom(16 * 1024 * 1024)
    with open(blob, "wb") as f:
        for _ in range(64):
            f.write(chunk)
    art = publish_tree(store, blob.parent, draft).artifact_id
    blob.unlink()
    slots, size = 4, 8 * 1024 * 1024
    r = subprocess.run([sys.executable, "-c", MEASURE, store.uri, art, str(tmp_path / "node"), str(size), str(slots)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    grew_mib = (m["after_kib"] - m["before_kib"]) / 1024
    window_mib = slots * size / 2**20
    assert grew_mib < window_mib + 48, (grew_mib, window_mib)
    assert (tmp_path / "node" / "current" / "rank0.engine").stat().st_size == 1024 ** 3
