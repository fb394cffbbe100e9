"""Digests: ``xxh3-128:<32 hex>`` over bytes, streams, files and canonical JSON, and
``blake3:<64 hex>`` (BLAKE3-256) beside it where content must be bound cryptographically.

xxh3-128 detects corruption (bit rot, truncation, bad transfers) and is the content address of
blobs; it is not a defence against a deliberate attacker (a colliding pair is easy to construct:
tests/artifact_store/trust/test_binding.py builds one). BLAKE3-256 is: every file of a current
manifest carries both, and both are computed in the same pass over the bytes (:class:`Hasher` with
``crypto=True``). Files are hashed by streaming large buffers; callers that copy, upload or
download bytes hash them on the way through so no file is read twice for one operation.
"""

from __future__ import annotations

import base64
import io
import json
import mmap
import os
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO, Callable

import blake3
import xxhash

ALGORITHM = "xxh3-128"
PREFIX = ALGORITHM + ":"
DIGEST_RE = re.compile(r"^xxh3-128:[0-9a-f]{32}$")
CRYPTO_ALGORITHM = "blake3"
CRYPTO_PREFIX = CRYPTO_ALGORITHM + ":"
CRYPTO_RE = re.compile(r"^blake3:[0-9a-f]{64}$")
BUFFER_SIZE = 8 * 1024 * 1024


def _blake3() -> "blake3.blake3":
    # AUTO: large slices are hashed on every core (the Rust crate's rayon pool): 4.1 GB/s on one
    # thread, 7.8 GB/s with AUTO on this 2-core machine over 8 MiB slices (one-off measurement;
    # benchmarks/crypto_digest.py measures pull, publish and verify --deep with it).
    return blake3.blake3(max_threads=blake3.blake3.AUTO)


class Hasher:
    """Incremental xxh3-128 with a running byte count; with ``crypto``, BLAKE3-256 of the same
    bytes in the same pass (:meth:`crypto`). ``xxh=False`` (with ``crypto``): BLAKE3 alone, for a
    reader that checks a file whose manifest entry carries its BLAKE3 (a match pins the bytes;
    xxh3 would add a second hash of every byte and nothing else)."""

    __slots__ = ("_h", "_b", "size")

    def __init__(self, crypto: bool = False, *, xxh: bool = True) -> None:
        if not (crypto or xxh):
            raise ValueError("a Hasher computes xxh3-128, BLAKE3-256 or both")
        self._h = xxhash.xxh3_128() if xxh else None
        self._b = _blake3() if crypto else None
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._h is not None:
            self._h.update(data)
        if self._b is not None:
            self._b.update(data)
        self.size += len(data)

    @property
    def has_xxh(self) -> bool:
        return self._h is not None

    def hexdigest(self) -> str:
        if self._h is None:
            raise ValueError("this Hasher computes BLAKE3-256 only")
        return self._h.hexdigest()

    def digest(self) -> str:
        return PREFIX + self.hexdigest()

    def crypto(self) -> str | None:
        """``blake3:<64 hex>`` of the bytes so far, or None when this hasher computes none."""
        return None if self._b is None else CRYPTO_PREFIX + self._b.hexdigest()


def crypto_bytes(data: bytes) -> str:
    """BLAKE3-256 of an in-memory byte string (a manifest's bytes: what signed records carry)."""
    return CRYPTO_PREFIX + blake3.blake3(data).hexdigest()


def is_crypto_digest(value: object) -> bool:
    """Whether ``value`` is a well-formed ``blake3:<64 hex>`` digest."""
    return isinstance(value, str) and bool(CRYPTO_RE.match(value))


def digest_bytes(data: bytes) -> str:
    """The digest of an in-memory byte string."""
    return PREFIX + xxhash.xxh3_128_hexdigest(data)


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace, UTF-8. Equal data gives equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def digest_json(obj: Any) -> str:
    """The digest of an object's canonical JSON."""
    return digest_bytes(canonical_json(obj))


def hash_stream(stream: BinaryIO, buffer_size: int = BUFFER_SIZE, *,
                also: Callable[[memoryview], None] | None = None) -> tuple[str, int]:
    """Hash a binary stream to its end; returns ``(digest, size)``. ``also`` sees every slice
    (a second checksum computed in the same pass)."""
    h = stream_hasher(stream, buffer_size, also=also)
    return h.digest(), h.size


def stream_hasher(stream: BinaryIO, buffer_size: int = BUFFER_SIZE, *, crypto: bool = False, xxh: bool = True,
                  also: Callable[[memoryview], None] | None = None) -> Hasher:
    """:func:`hash_stream`, returning the :class:`Hasher` (``crypto``: BLAKE3 too; ``xxh=False``:
    BLAKE3 alone). A regular file of :data:`MMAP_MIN` or more, read from its start (a local
    store's blob), is hashed from a memory map, as :func:`file_hasher` does."""
    h = Hasher(crypto, xxh=xxh)
    if _mappable(stream):
        return _hash_mapped(stream.fileno(), h, buffer_size, also)
    buf = bytearray(buffer_size)
    view = memoryview(buf)
    while True:
        n = stream.readinto(buf)  # type: ignore[attr-defined]
        if not n:
            break
        h.update(view[:n])
        if also is not None:
            also(view[:n])
    return h


MMAP_MIN = 1024 * 1024


def hash_file(path: str | Path, buffer_size: int = BUFFER_SIZE, *,
              also: Callable[[memoryview], None] | None = None) -> tuple[str, int]:
    """Hash one file; returns ``(digest, size)``. ``also`` sees every slice, in order
    (:func:`file_hasher` does the work)."""
    h = file_hasher(path, buffer_size, also=also)
    return h.digest(), h.size


def file_hasher(path: str | Path, buffer_size: int = BUFFER_SIZE, *, crypto: bool = False, xxh: bool = True,
                also: Callable[[memoryview], None] | None = None) -> Hasher:
    """Hash one file into a :class:`Hasher` (``crypto``: BLAKE3 too, in the same pass; ``xxh=False``:
    BLAKE3 alone). ``also`` sees every slice, in order.

    Files of 1 MiB and more are hashed straight from a read-only memory map, in ``buffer_size``
    slices: the page cache is hashed in place, without copying it into a buffer first, and the
    xxhash binding releases the GIL per slice so several files hash in parallel.
    """
    with open(path, "rb", buffering=0) as f:
        return stream_hasher(f, buffer_size, crypto=crypto, xxh=xxh, also=also)


def _mappable(stream: BinaryIO) -> bool:
    """Whether ``stream`` is a regular file of :data:`MMAP_MIN` bytes or more, at its start."""
    try:
        st = os.fstat(stream.fileno())
        return stat.S_ISREG(st.st_mode) and st.st_size >= MMAP_MIN and stream.tell() == 0
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


#: Slices of a mapped file hashed by BLAKE3 alone: larger than :data:`BUFFER_SIZE`, since its
#: threads split each slice (8.5 GiB/s over 64 MiB slices on this 2-core machine, 7.9 over 8 MiB:
#: benchmarks/verify_read.py); two digests keep 8 MiB slices, which stay in cache between them.
CRYPTO_SLICE = 64 * 1024 * 1024


def _hash_mapped(fd: int, h: Hasher, buffer_size: int, also: Callable[[memoryview], None] | None) -> Hasher:
    if not h.has_xxh and also is None:
        buffer_size = max(buffer_size, CRYPTO_SLICE)
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            for i in range(0, len(m), buffer_size):
                piece = view[i:i + buffer_size]
                h.update(piece)
                if also is not None:
                    also(piece)
                piece.release()
        finally:
            view.release()
    return h


class Crc64Nvme:
    """S3's full-object CRC64NVME (awscrt, imported on first use: only S3 stores need it),
    fed slice by slice; :attr:`b64` is the value S3 reports as ``ChecksumCRC64NVME``."""

    __slots__ = ("_crc", "_fn")

    def __init__(self) -> None:
        from awscrt import checksums

        self._fn = checksums.crc64nvme
        self._crc = 0

    def update(self, data: bytes | memoryview) -> None:
        self._crc = self._fn(data, self._crc)

    @property
    def b64(self) -> str:
        return base64.b64encode(self._crc.to_bytes(8, "big")).decode()


def write_all(f: BinaryIO, data: memoryview | bytes) -> None:
    """Write every byte to an unbuffered file: raw writes may be short (e.g. at a file size limit)."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if n is None or n <= 0:
            raise OSError(28, "short write")
        view = view[n:]


def fsync_dir(d: str | Path) -> None:
    """Make a directory's entries (a new link, a rename) durable."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_digest(value: str) -> bool:
    """Whether ``value`` is a well-formed ``xxh3-128:<32 hex>`` digest."""
    return bool(DIGEST_RE.match(value))


def hex_of(digest: str) -> str:
    """The 32 hex characters of a well-formed digest."""
    return digest[len(PREFIX):]
