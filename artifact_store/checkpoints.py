"""Model checkpoints kept in a store location (``s3://bucket/models/llama``): download them to a
local directory, verified, for a build or a validation.

Each object's size is checked against the store's listing, and the backend checks the checksum
the server stored with the object where it keeps one (S3's full-object checksum, validated by
botocore while the body is read). A bad object fails the whole download; the destination is
replaced atomically only when every object arrived.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from buildctl.digest import BUFFER_SIZE, write_all
from buildctl.store.backend import Store
from buildctl.store.errors import StoreUnavailableError
from buildctl.store.manifest import check_relpath

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
        shutil.rmtree(staging, ignore_errors=True)
    return dest
