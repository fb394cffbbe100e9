"""Repair: put back exactly the blobs whose bytes are wrong, from a copy whose digests prove it right.

Blobs are immutable and named by their digest, so any copy of a file whose xxh3-128 equals the
manifest's digest *is* the right content: a node's installed ``versions/<id>`` directory, another
store, or a rebuild that produced identical files. Only blobs that are missing, short or hash
wrong in the store are replaced (``Store.replace_object``); then the whole artifact is re-hashed
from the store, and only a clean pass lifts the quarantine.
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from buildctl.core.digest import BUFFER_SIZE, digest_bytes, stream_hasher, write_all
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.errors import KeyNotFoundError, VerificationError
from buildctl.artifact_store.layout import IDENTITY_INDEX, blob_key, manifest_key
from buildctl.artifact_store.manifest import FileEntry, file_problem
from buildctl.artifact_store.quarantine import lift
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.read import get_manifest, scan_manifests, verify

# A source gives, for a manifest entry, a local file that may hold its bytes (None: no copy).
SourceFn = Callable[[FileEntry], "Path | None"]


@dataclass
class RepairResult:
    artifact_id: str
    replaced: list[str] = field(default_factory=list)      # paths whose blobs were put back
    unrepaired: list[str] = field(default_factory=list)   # bad blobs with no matching copy
    healthy: bool = False                                  # a full deep verify passed afterwards
    lifted: str | None = None                              # the lift record's key

    def to_json(self) -> dict:
        return {"artifact_id": self.artifact_id, "replaced": self.replaced, "unrepaired": self.unrepaired,
                "healthy": self.healthy, "lift_record": self.lifted}


def stored_blob_ok(store: Store, entry: FileEntry) -> bool:
    return blob_holds(store, entry.digest, entry.size, blake3=entry.blake3)


def blob_holds(store: Store, digest: str, size: int, crc64: str | None = None, *, sized: bool = False,
               blake3: str | None = None) -> bool:
    """Whether the stored blob holds exactly the bytes of ``digest``: with ``crc64`` (the local
    file's CRC64NVME) and a store that keeps one, the object's stored full-object checksum is
    compared with it, a HEAD request; otherwise the blob is read back and hashed once: by BLAKE3-256
    alone when ``blake3`` is given (a match pins the bytes), else by xxh3-128. ``sized``: the caller
    has just seen the stored size equal ``size``."""
    key = blob_key(digest)
    if crc64 is not None and store.checksum_algorithm == "CRC64NVME":
        try:
            check = store.stored_checksum(key)
        except KeyNotFoundError:
            return False
        if check is not None:
            return check.expected == crc64 and (sized or store.stat(key) == size)
    if not sized and store.stat(key) != size:
        return False
    try:
        with store.open_read(key) as f:
            h = stream_hasher(f, crypto=blake3 is not None, xxh=blake3 is None)
    except KeyNotFoundError:
        return False
    return h.crypto() == blake3 if blake3 is not None else h.digest() == digest


def referencing(store: Store, digest: str) -> list[tuple[str, list[str]]]:
    """Every artifact whose manifest names the blob, with the paths it has it under."""
    out = []
    for artifact, manifest, _, _ in scan_manifests(store):
        if manifest is not None:
            paths = [e.path for e in manifest.files if e.digest == digest]
            if paths or manifest.build_log == digest:
                out.append((artifact, paths or ["build log"]))
    return out


def tree_source(root: str | Path) -> SourceFn:
    """Copies by path under a directory (a node's ``versions/<id>``, a build's output)."""
    root = Path(root)
    return lambda e: (root / e.path) if (root / e.path).is_file() else None


def store_source(other: Store, scratch: Path) -> SourceFn:
    """Copies from another store's blob of the same digest, downloaded into ``scratch``."""

    def fetch(e: FileEntry) -> Path | None:
        target = scratch / e.digest[len("xxh3-128:"):]
        try:
            with other.open_read(blob_key(e.digest)) as src, open(target, "wb", buffering=0) as dst:
                buf = bytearray(BUFFER_SIZE)
                view = memoryview(buf)
                while n := src.readinto(buf):
                    write_all(dst, view[:n])
        except KeyNotFoundError:
            return None
        return target

    return fetch


def repair(store: Store, artifact_id: str, source: SourceFn, *, auth: Authority,
           reason: str = "repaired") -> RepairResult:
    """Replace every bad blob of the artifact whose copy in ``source`` hashes right; lift the
    quarantine when the artifact then deep-verifies."""
    manifest = get_manifest(store, artifact_id)
    result = RepairResult(artifact_id)
    seen: set[str] = set()
    for entry in manifest.files:
        if entry.digest in seen or stored_blob_ok(store, entry):
            seen.add(entry.digest)
            continue
        seen.add(entry.digest)
        copy = source(entry)
        if copy is None or file_problem(entry, copy) is not None:
            result.unrepaired.append(entry.path)
            continue
        store.replace_object(blob_key(entry.digest), copy, size=entry.size)
        result.replaced.append(entry.path)
    try:
        verify(store, artifact_id, deep=True)
        result.healthy = True
    except VerificationError:
        return result
    lifted = lift(store, artifact_id, f"{reason}: {len(result.replaced)} blob(s) replaced, deep verify passed",
                  auth=auth)
    result.lifted = lifted[0] if lifted else None
    return result


def repair_from(store: Store, artifact_id: str, source_uri_or_dir: str, *, open_store: Callable[[str], Store],
                auth: Authority) -> RepairResult:
    """``repair`` from a directory or a store URI (``file://``, ``s3://``)."""
    if "://" in source_uri_or_dir:
        with tempfile.TemporaryDirectory(prefix="buildctl-repair-") as scratch:
            return repair(store, artifact_id, store_source(open_store(source_uri_or_dir), Path(scratch)), auth=auth,
                          reason=f"repaired from {source_uri_or_dir}")
    return repair(store, artifact_id, tree_source(source_uri_or_dir), auth=auth,
                  reason=f"repaired from {source_uri_or_dir}")


def manifest_copies(artifact_id: str, source: str, open_store: Callable[[str], Store]) -> Iterator[tuple[str, bytes]]:
    """Copies of the manifest's bytes outside the store, as (where, bytes): another store's
    manifest (``file://``, ``s3://``), or a node directory, whose staged and installed engines
    keep it."""
    if "://" in source:
        try:
            yield source, open_store(source).get_bytes(manifest_key(artifact_id))
        except KeyNotFoundError:
            return
        return
    from buildctl.artifact_store.node.install_dir import installed_manifests, staged_engines

    for entry in staged_engines(source):
        if entry.artifact_id == artifact_id:
            yield f"{source} (staged)", entry.manifest_body
    for body in installed_manifests(source):
        yield f"{source} (installed)", body  # restore_manifest keeps only the one that hashes to the id


def restore_manifest(store: Store, artifact_id: str, more: Iterable[tuple[str, bytes]] = ()) -> str | None:
    """Put back an artifact's manifest whose stored bytes no longer hash to its id, from a copy
    that does: the identity index keeps a byte-identical copy of every manifest published, and
    ``more`` offers others (:func:`manifest_copies`). The id proves which bytes are right. Returns
    where the copy came from (None: the manifest verifies, or no copy verifies)."""
    key = manifest_key(artifact_id)
    try:
        if digest_bytes(store.get_bytes(key)) == artifact_id:
            return None
    except KeyNotFoundError:
        pass
    own = ((k, store.get_bytes(k)) for k in store.list(IDENTITY_INDEX))
    for copy_key, body in itertools.chain(own, more):
        if digest_bytes(body) != artifact_id:
            continue
        with tempfile.NamedTemporaryFile(prefix="buildctl-manifest-") as f:
            f.write(body)
            f.flush()
            store.replace_object(key, Path(f.name), size=len(body))
        return copy_key
    return None
