"""Model checkpoints kept in a store location (``s3://bucket/models/llama``): download them to a
local directory, verified, for a build or a validation.

Each object's size is checked against the store's listing, and its bytes against the checksum
the server stored with it where the backend keeps one (S3's full-object CRC64NVME). Objects of
a range or more (the multi-GB safetensors shards) arrive as parallel ranged reads written at
their offsets and checksummed in order as they arrive (``buildctl.artifact_store.backends.ranged``); smaller ones
stream, botocore validating the checksum. A bad object fails the whole download; the
destination is replaced atomically only when every object arrived.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from buildctl.core.digest import BUFFER_SIZE, write_all
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.errors import StoreUnavailableError
from buildctl.artifact_store.backends.ranged import RangedReader, ShortRangeError
from buildctl.artifact_store.manifest import check_relpath

COMPLETE_SUFFIX = ".complete"


def download_checkpoint(store: Store, dest: str | Path, prefix: str = "") -> Path:
    """Download every object under ``prefix`` into ``dest``; a completed download is reused."""
    dest = Path(dest)
    marker = dest.parent / f"{dest.name}{COMPLETE_SUFFIX}"
    if dest.is_dir() and marker.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}-{uuid.uuid4().hex}"
    staging.mkdir()
    ranged = RangedReader(store)
    try:
        for key in store.list(prefix):
            rel = key[len(prefix):].lstrip("/")
            try:
                check_relpath(rel)
            except ValueError as err:
                raise StoreUnavailableError(store.uri, f"refusing object {key!r}: {err}") from None
            expected = store.stat(key)
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if expected is not None and ranged.applies(expected):
                _ranged_object(store, ranged, key, expected, target)
                continue
            written = 0
            buf = bytearray(BUFFER_SIZE)
            view = memoryview(buf)
            with store.open_read(key, verify_checksum=True) as src, open(target, "wb", buffering=0) as out:
                while n := src.readinto(buf):
                    write_all(out, view[:n])
                    written += n
            if written != expected:
                raise StoreUnavailableError(store.uri, f"{key}: got {written} of {expected} bytes")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
        marker.write_text("")
    finally:
        ranged.close()
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _ranged_object(store: Store, ranged: RangedReader, key: str, size: int, target: Path) -> None:
    check = store.stored_checksum(key)
    try:
        ranged.download(key, size, target, update=check.update if check else None)
    except ShortRangeError as err:
        raise StoreUnavailableError(store.uri, f"{key}: got {err.offset + err.got} of {size} bytes") from None
    if check is not None and check.actual() != check.expected:
        raise StoreUnavailableError(store.uri, f"{key}: {check.algorithm} {check.actual()} does not match the stored "
                                    f"{check.expected}")
