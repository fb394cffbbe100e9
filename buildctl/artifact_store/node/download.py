"""Download an artifact's files from the store, verifying each while it arrives.

Every file is hashed as its bytes are written: by BLAKE3-256 alone where the manifest carries it
(schema 2), by xxh3-128 where it does not (:func:`~buildctl.artifact_store.manifest.checking_hasher`);
a file that fails is read back with both digests to name what is wrong. A file whose size or
digest differs from the manifest (or whose blob is missing) is reported as a :class:`FileProblem`,
never installed.
Large blobs are read as parallel ranges (:mod:`buildctl.artifact_store.backends.ranged`), hashed in order.
"""

from __future__ import annotations

import os
from pathlib import Path

from buildctl.core.digest import BUFFER_SIZE, file_hasher, write_all
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.errors import FileProblem, KeyNotFoundError
from buildctl.artifact_store.layout import blob_key
from buildctl.artifact_store.manifest import FileEntry, Manifest, checked_problem, checking_hasher
from buildctl.artifact_store.backends.pools import Stop, check, interruptible_pool
from buildctl.artifact_store.backends.ranged import RangedReader, ShortRangeError


def _download_ranged(store: Store, entry: FileEntry, target: Path, on_bytes: ProgressFn | None,
                     ranged: RangedReader) -> FileProblem | None:
    """A large blob: parallel ranged reads written at their offsets, hashed in order as they arrive."""
    key = blob_key(entry.digest)
    size = store.stat(key)
    if size is None:
        return FileProblem(entry.path, "missing", actual=f"blob {key} does not exist")
    if size != entry.size:
        return FileProblem(entry.path, "size", entry.size, size)
    try:
        h = ranged.download(key, size, target, on_bytes=on_bytes, crypto=entry.blake3 is not None,
                            xxh=entry.blake3 is None)
    except KeyNotFoundError:
        return FileProblem(entry.path, "missing", actual=f"blob {key} disappeared during the download")
    except ShortRangeError as err:
        return FileProblem(entry.path, "size", entry.size, err.offset + err.got)
    if problem := checked_problem(entry, h, lambda: file_hasher(target, crypto=True)):
        return problem
    os.chmod(target, 0o555 if entry.executable else 0o444)
    return None


def _download(store: Store, entry: FileEntry, target: Path, on_bytes: ProgressFn | None,
              ranged: RangedReader | None = None, stop: Stop | None = None) -> FileProblem | None:
    """Download one blob into ``target`` while hashing it; report what is wrong, or None. Blobs
    ``ranged`` applies to are read as ranges; others stream."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if ranged is not None and ranged.applies(entry.size):
        return _download_ranged(store, entry, target, on_bytes, ranged)
    h = checking_hasher(entry)
    buf = bytearray(min(BUFFER_SIZE, max(64 * 1024, entry.size + 1)))  # small files: small buffers, many at once
    view = memoryview(buf)
    try:
        with store.open_read(blob_key(entry.digest)) as src, open(target, "xb", buffering=0) as dst:
            while True:
                check(stop)  # an interrupted pull does not wait for this file
                n = src.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
                write_all(dst, view[:n])
                if on_bytes:
                    on_bytes(n)
                if h.size > entry.size:
                    return FileProblem(entry.path, "size", entry.size, f">{entry.size}")
            os.fsync(dst.fileno())
    except KeyNotFoundError:
        return FileProblem(entry.path, "missing", actual=f"blob {blob_key(entry.digest)} does not exist")
    if problem := checked_problem(entry, h, lambda: file_hasher(target, crypto=True)):
        return problem
    os.chmod(target, 0o555 if entry.executable else 0o444)
    return None


def download_verified(store: Store, manifest: Manifest, staging: Path, *, workers: int = 16,
                      range_slots: int | None = None, on_bytes: ProgressFn | None = None) -> list[FileProblem]:
    """Download every file of ``manifest`` under ``staging``, ``workers`` at once, large ones as
    ranged reads (``range_slots`` in flight over all of them); what is wrong with each, if anything.
    ``OSError`` from the local disk propagates."""
    with RangedReader(store, slots=range_slots) as ranged, interruptible_pool(workers, "buildctl-download") as (pool, stop):
        return [p for p in pool.map(lambda e: _download(store, e, staging / e.path, on_bytes, ranged, stop),
                                    manifest.files) if p]
