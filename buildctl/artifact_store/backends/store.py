"""The Store protocol: one small interface, two backends (local directory, S3).

Like restic's backend interface, it knows only keys and bytes. Everything else (manifests,
channels, verification) is built on top in the modules beside it, and one contract test
suite runs against every backend.

Two kinds of write exist:

* **create-only** (``put_bytes``/``put_file``): the key must not exist; an existing key is
  never overwritten and the call returns ``False``. Blobs, manifests, indexes, attestations
  and history records are written this way.
* **compare-and-swap** (``cas``): replace a ref only if its current version token is the one
  the caller read (``None``: only if absent). Channel refs and node records use it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Protocol, runtime_checkable

from buildctl.artifact_store.errors import StoreUriError

ProgressFn = Callable[[int], None]


@runtime_checkable
class ChecksumCheck(Protocol):
    """A server-side checksum to compare with: ``update`` with the object's bytes in order."""

    algorithm: str
    expected: str

    def update(self, data: bytes | memoryview) -> None:
        ...

    def actual(self) -> str:
        ...


class Store(Protocol):
    """Key/bytes storage with create-only writes and compare-and-swap refs."""

    uri: str
    # Whether large objects read faster as parallel ranges than as one stream (S3, where one
    # connection is capped); a local directory reads one stream at disk speed.
    ranged_reads: bool
    # Whether one large prefix lists faster as key ranges at once (S3: each LIST page waits on the
    # network; ``listing.list_ranges``); a local directory is walked once. Read with a default of
    # False, so a wrapper or test store without it lists plainly.
    ranged_lists: bool
    # The full-object checksum the server stores with every object it accepts ("CRC64NVME" on
    # S3), or None. Publish computes it over each local file in its hashing pass, so a blob that
    # is already stored is confirmed by comparing checksums instead of reading it back.
    checksum_algorithm: str | None

    def stat(self, key: str) -> int | None:
        """The object's size, or ``None`` if it does not exist."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The whole object; raises ``KeyNotFoundError``."""
        ...

    def open_read(self, key: str, *, verify_checksum: bool = False) -> AbstractContextManager[BinaryIO]:
        """A streaming reader; raises ``KeyNotFoundError``. ``verify_checksum``: have the backend
        check the checksum the server stored with the object, where it keeps one (S3)."""
        ...

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of the object from ``offset`` (fewer only past its end); raises
        ``KeyNotFoundError``. Many may run at once (``buildctl.artifact_store.backends.ranged``)."""
        ...

    def stored_checksum(self, key: str) -> "ChecksumCheck | None":
        """A check against the full-object checksum the server stored with the object (S3:
        CRC64NVME), fed the bytes in order; ``None`` where the backend keeps none. Raises
        ``KeyNotFoundError``."""
        ...

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Create-only write. ``False`` if the key already existed (nothing written)."""
        ...

    def put_file(self, key: str, path: Path, *, size: int, on_bytes: ProgressFn | None = None) -> bool:
        """Create-only upload of a local file. ``False`` if the key already existed."""
        ...

    def replace_object(self, key: str, path: Path, *, size: int) -> None:
        """Replace an immutable object's bytes: repair only, with bytes the caller has checked are
        the ones the key names (a blob's digest). Local: a temp file renamed over the old one.
        S3: delete, then a create-only put (with versioning, the bad version stays readable)."""
        ...

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        """Keys starting with ``prefix``, in lexicographic order; with ``start_after``, only the
        keys after it (S3's ``StartAfter``: the server skips the rest, so a check for records newer
        than one it knows is one request however long the prefix has grown)."""
        ...

    def delete(self, key: str) -> None:
        """Remove a key (missing keys are fine). Garbage collection calls this, and the writers of
        derived keys (a completed pending promotion, node-index markers a record no longer implies)."""
        ...

    def get_ref(self, key: str) -> tuple[bytes, str] | None:
        """A mutable ref's bytes and version token, or ``None`` if absent."""
        ...

    def cas(self, key: str, data: bytes, expected: str | None) -> bool:
        """Write ``data`` if the ref's version token is still ``expected`` (``None``: absent). ``False`` if another writer won."""
        ...


def fail_fast(store: Store) -> Store:
    """``store`` without retries and with short timeouts, where the backend has them (S3); a local
    store answers at once as it is."""
    quick = getattr(store, "fail_fast", None)
    return quick() if callable(quick) else store


def require_store(store: Store) -> Store:
    """``store`` when it exists; :class:`StoreNotFoundError` (exit 3) for a local folder that is not
    there (reading never creates a store: only a write does)."""
    root = getattr(store, "root", None)
    if isinstance(root, Path) and not root.is_dir():
        from buildctl.artifact_store.errors import StoreNotFoundError

        raise StoreNotFoundError(store.uri)
    return store


# --- opening -------------------------------------------------------------------------------


def open_store(uri: str, *, endpoint_url: str | None = None) -> Store:
    """Open ``file:///dir`` (or a plain path) or ``s3://bucket/prefix``. The default URI comes
    from :class:`buildctl.core.settings.Settings`, never from here."""
    if not uri:
        raise StoreUriError(str(uri), "no store given (--store or BUILDCTL_STORE)")
    if uri.startswith("s3://"):
        return _store_class("s3")(uri, endpoint_url=endpoint_url)  # the only boto3 importer
    if uri.startswith("file://"):
        path = uri[len("file://"):]
    elif "://" in uri:
        raise StoreUriError(uri, "unsupported scheme (use file:// or s3://)")
    else:
        path = uri
    if not path:
        raise StoreUriError(uri, "empty path")
    return _store_class("file")(Path(path).expanduser().resolve())


#: The store backends by URI scheme: one line per backend, each class imported on first use (the
#: backends import this module's interface, so it imports none of them: no import circle).
STORE_BACKENDS: dict[str, str] = {
    "file": "buildctl.artifact_store.backends.local:LocalStore",
    "s3": "buildctl.artifact_store.backends.s3:S3Store",
}


def _store_class(scheme: str) -> Callable[..., Store]:
    import importlib

    module, _, attr = STORE_BACKENDS[scheme].partition(":")
    return getattr(importlib.import_module(module), attr)
