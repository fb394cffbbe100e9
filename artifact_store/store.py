"""The Store protocol: one small interface, two backends (local directory, S3).

Like restic's backend interface, it knows only keys and bytes. Everything else (manifests,
channels, verification) is built on top in :mod:`artifact_store.ops`, and one contract test
suite runs against every backend.

Two kinds of write exist:

* **create-only** (``put_bytes``/``put_file``): the key must not exist; an existing key is
  never overwritten and the call returns ``False``. Blobs, manifests, indexes, attestations
  and history records are written this way.
* **compare-and-swap** (``cas``): replace a ref only if its current version token is the one
  the caller read (``None``: only if absent). Channel refs and node records use it.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Protocol, runtime_checkable

from artifact_store.digest import hex_of
from artifact_store.errors import StoreUriError

ProgressFn = Callable[[int], None]


@runtime_checkable
class Store(Protocol):
    """Key/bytes storage with create-only writes and compare-and-swap refs."""

    uri: str

    def stat(self, key: str) -> int | None:
        """The object's size, or ``None`` if it does not exist."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The whole object; raises ``KeyNotFoundError``."""
        ...

    def open_read(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A streaming reader; raises ``KeyNotFoundError``."""
        ...

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Create-only write. ``False`` if the key already existed (nothing written)."""
        ...

    def put_file(self, key: str, path: Path, *, size: int, on_bytes: ProgressFn | None = None) -> bool:
        """Create-only upload of a local file. ``False`` if the key already existed."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """Keys starting with ``prefix``, in lexicographic order."""
        ...

    def delete(self, key: str) -> None:
        """Remove a key (missing keys are fine). Only garbage collection calls this."""
        ...

    def get_ref(self, key: str) -> tuple[bytes, str] | None:
        """A mutable ref's bytes and version token, or ``None`` if absent."""
        ...

    def cas(self, key: str, data: bytes, expected: str | None) -> bool:
        """Write ``data`` if the ref's version token is still ``expected`` (``None``: absent). ``False`` if another writer won."""
        ...


# --- key layout (docs/store-layout.md) -------------------------------------------------------


def blob_key(digest: str) -> str:
    h = hex_of(digest)
    return f"blobs/{h[:2]}/{h}"


def manifest_key(artifact_id: str) -> str:
    return f"manifests/{hex_of(artifact_id)}.json"


def identity_key(identity: str) -> str:
    return f"index/identity/{hex_of(identity)}.json"


def build_index_key(build_key: str) -> str:
    return f"index/build-keys/{hex_of(build_key)}.json"


def attestation_prefix(artifact_id: str) -> str:
    return f"attestations/{hex_of(artifact_id)}/"


def channel_key(profile: str, channel: str, compat_key: str) -> str:
    return f"channels/{profile}/{channel}/{compat_key}.json"


def history_prefix(profile: str, channel: str, compat_key: str) -> str:
    return f"history/{profile}/{channel}/{compat_key}/"


def history_key(profile: str, channel: str, compat_key: str, seq: int) -> str:
    return f"{history_prefix(profile, channel, compat_key)}{seq:012d}.json"


# --- opening -------------------------------------------------------------------------------


def default_store_uri() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return "file://" + os.path.join(base, "buildctl", "store")


def open_store(uri: str | None = None, *, endpoint_url: str | None = None) -> Store:
    """Open ``file:///dir`` (or a plain path) or ``s3://bucket/prefix``."""
    uri = uri or default_store_uri()
    if uri.startswith("s3://"):
        from artifact_store.s3 import S3Store  # the only boto3 importer

        return S3Store(uri, endpoint_url=endpoint_url)
    if uri.startswith("file://"):
        path = uri[len("file://"):]
    elif "://" in uri:
        raise StoreUriError(uri, "unsupported scheme (use file:// or s3://)")
    else:
        path = uri
    if not path:
        raise StoreUriError(uri, "empty path")
    from artifact_store.local import LocalStore

    return LocalStore(Path(path).expanduser().resolve())
