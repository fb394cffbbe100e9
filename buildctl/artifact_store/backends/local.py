"""The local-directory store: the embedded default (``file:///dir``).

Writes go to a temp file in ``<root>/.tmp`` on the same filesystem, are fsynced, and are then
published with ``os.link`` (create-only: fails if the key exists) or, for refs, ``os.replace``
under an exclusive ``flock`` after comparing the version token. Immutable objects are made
read-only. Readers never see a partial object.
"""

from __future__ import annotations

import errno
import fcntl
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from buildctl.core.digest import BUFFER_SIZE, digest_bytes, fsync_dir, write_all
from buildctl.artifact_store.errors import KeyNotFoundError, StoreArgumentError, StoreUnavailableError
from buildctl.artifact_store.backends.store import ProgressFn

_RESERVED = (".tmp", ".locks")


class LocalStore:
    """A store in a local directory."""

    ranged_reads = False  # one stream per object reads at disk speed
    ranged_lists = False  # one walk of a folder beats 16 walks of its parts
    checksum_algorithm = None  # nothing stored besides the bytes: publish re-hashes a reused blob

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.uri = "file://" + str(self.root)
        self._created = False  # the directory is made by the first write: reading never creates a store

    def _ensure(self) -> None:
        if self._created:
            return
        try:
            for d in _RESERVED:
                (self.root / d).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreUnavailableError(self.uri, f"cannot create store directory: {err.strerror or err}") from None
        self._created = True

    # -- helpers --------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/") or key.split("/")[0] in _RESERVED:
            raise StoreArgumentError(f"bad store key {key!r}")
        return self.root / key

    def _tmp(self) -> Path:
        self._ensure()
        return self.root / ".tmp" / f"{uuid.uuid4().hex}.part"

    def _publish_create_only(self, tmp: Path, final: Path) -> bool:
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(tmp, 0o444)
            os.link(tmp, final)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(final.parent)
        return True

    # -- Store protocol -------------------------------------------------------------------

    def stat(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise KeyNotFoundError(key) from None

    @contextmanager
    def open_read(self, key: str, *, verify_checksum: bool = False) -> Iterator[BinaryIO]:
        # A local file has no server-side checksum: callers hash what they read.
        try:
            f = open(self._path(key), "rb", buffering=0)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyNotFoundError(key) from None
        with f:
            yield f  # type: ignore[misc]

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyNotFoundError(key) from None
        try:
            parts, done = [], 0
            while done < length:
                chunk = os.pread(fd, length - done, offset + done)
                if not chunk:
                    break
                parts.append(chunk)
                done += len(chunk)
            return b"".join(parts) if len(parts) != 1 else parts[0]
        finally:
            os.close(fd)

    def stored_checksum(self, key: str) -> None:
        if not self._path(key).is_file():
            raise KeyNotFoundError(key)
        return None  # a local file has no stored checksum: callers hash what they read

    def put_bytes(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        if final.exists():
            return False
        tmp = self._tmp()
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return self._publish_create_only(tmp, final)

    def _copy_to_tmp(self, path: Path, size: int, on_bytes: ProgressFn | None, what: str) -> Path:
        """Copy a local file into a fsynced temp file of this store; it must have ``size`` bytes."""
        tmp = self._tmp()
        buf = bytearray(BUFFER_SIZE)
        view = memoryview(buf)
        written = 0
        try:
            with open(path, "rb", buffering=0) as src, open(tmp, "xb", buffering=0) as dst:
                while n := src.readinto(buf):
                    write_all(dst, view[:n])
                    written += n
                    if on_bytes:
                        on_bytes(n)
                os.fsync(dst.fileno())
            if written != size:
                raise StoreUnavailableError(self.uri, f"{path} changed during {what} ({size} -> {written} bytes)")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def put_file(self, key: str, path: Path, *, size: int, on_bytes: ProgressFn | None = None) -> bool:
        final = self._path(key)
        if final.exists():
            return False
        return self._publish_create_only(self._copy_to_tmp(path, size, on_bytes, "upload"), final)

    def replace_object(self, key: str, path: Path, *, size: int) -> None:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._copy_to_tmp(path, size, None, "repair")
        try:
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)  # atomic: readers see the old bytes or the new, never a mix
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(final.parent)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / base if base else self.root
        if not start.is_dir():
            return iter(())
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            if Path(dirpath) == self.root:
                dirnames[:] = [d for d in dirnames if d not in _RESERVED]
            rel = os.path.relpath(dirpath, self.root)
            # Walk only the folders that can hold a key listed: under the prefix, and not wholly
            # before ``start_after`` (a ranged listing walks its range, not the whole prefix).
            here = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            dirnames[:] = [d for d in dirnames if _may_hold(here + d + "/", prefix, start_after)]
            for name in filenames:
                key = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
                if key.startswith(prefix) and not name.endswith(".part") and (start_after is None or key > start_after):
                    keys.append(key)
        return iter(sorted(keys))

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def get_ref(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return data, digest_bytes(data)

    @contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        self._ensure()
        lock = self.root / ".locks" / (digest_bytes(key.encode())[9:] + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def cas(self, key: str, data: bytes, expected: str | None) -> bool:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with self._lock(key):
            current = self.get_ref(key)
            token = current[1] if current else None
            if token != expected:
                return False
            tmp = self._tmp()
            try:
                with open(tmp, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except OSError as err:
                tmp.unlink(missing_ok=True)
                if err.errno == errno.ENOSPC:
                    raise StoreUnavailableError(self.uri, "no space left on device") from None
                raise
            fsync_dir(final.parent)
            return True


def _may_hold(folder: str, prefix: str, start_after: str | None) -> bool:
    """Whether keys under ``folder`` (``a/b/``) can start with ``prefix`` and sort after ``start_after``."""
    if not (folder.startswith(prefix) or prefix.startswith(folder)):
        return False
    return start_after is None or folder > start_after or start_after.startswith(folder)
