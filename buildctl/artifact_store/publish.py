"""Publish: checksum a tree and store it as one immutable artifact, and the build-key index.

Write order (like oras-py's push): touches of every blob (:mod:`buildctl.artifact_store.grace`: what
garbage collection honours), blobs (skipping those already present, checked again a delete
window later), then an identity record, then the manifest, then its signature, then the
build-key index. An artifact
is visible only once its manifest exists, so a publish killed at any point leaves nothing
visible, and re-running it finishes the job with the same artifact id.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildctl.core.digest import Crc64Nvme, canonical_json, digest_bytes, file_hasher, hash_file, is_digest
from buildctl.artifact_store import grace as grace_mod
from buildctl.artifact_store.backends import memo
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.errors import CorruptObjectError, KeyNotFoundError, StoreArgumentError, StoreUnavailableError
from buildctl.artifact_store.backends.pools import check, interruptible_pool
from buildctl.artifact_store.layout import (
    blob_key,
    build_index_key,
    build_index_prefix,
    identity_key,
    manifest_key,
    pair_key,
)
from buildctl.artifact_store.manifest import Manifest, hash_tree, scan_tree
from buildctl.core.times import utc_now
from buildctl.artifact_store.quarantine import active_quarantine, try_quarantine
from buildctl.artifact_store.upkeep.repair import blob_holds, referencing, repair, tree_source
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.trust.signing import sign_manifest
from buildctl.artifact_store.read import parse_verified_manifest


@dataclass
class PublishResult:
    """What publish did."""

    artifact_id: str
    manifest: Manifest
    uploaded_blobs: int = 0
    skipped_blobs: int = 0
    uploaded_bytes: int = 0
    existed: bool = False
    build_key_owner: str | None = None  # artifact that holds the build key (may differ on a lost race)
    repaired: list[str] = field(default_factory=list)  # files whose rotted blobs this publish put back
    reused_repaired: list[str] = field(default_factory=list)  # stored blobs that held wrong bytes, put back

    def to_json(self) -> dict:
        """What ``buildctl import --json`` prints."""
        return {"artifact_id": self.artifact_id, "existed": self.existed, "uploaded_blobs": self.uploaded_blobs,
                "skipped_blobs": self.skipped_blobs, "uploaded_bytes": self.uploaded_bytes,
                "compat_key": self.manifest.compat_key, "build_key": self.manifest.build_key}


@dataclass
class ManifestDraft:
    """Everything a manifest needs besides its files and its time."""

    profile_name: str
    profile_hash: str
    backend: str
    compat_key: str
    fingerprint: dict[str, Any]
    tool_versions: dict[str, str | None] = field(default_factory=dict)
    build_key: str | None = None
    model_digest: str | None = None


def publish_tree(
    store: Store,
    source: str | Path,
    draft: ManifestDraft,
    *,
    build_log: Path | None = None,
    workers: int = 4,
    on_bytes: ProgressFn | None = None,
    auth: Authority = Authority(),
    windows: grace_mod.GraceWindows = grace_mod.GraceWindows(),
) -> PublishResult:
    """Checksum every file under ``source`` and publish it as one immutable artifact; with
    ``auth``'s signer, also store its signature of the manifest. ``windows``: the grace period and
    delete window gc keeps (:mod:`buildctl.artifact_store.grace`).

    Publishing the same content as a quarantined artifact (a deterministic rebuild of a rotted
    one) yields the same artifact id; its bad blobs are then replaced from ``source``, whose
    digests prove it right, and the quarantine is lifted once the artifact deep-verifies."""
    files = scan_tree(source)  # refuses unsafe trees before anything is written
    # A store that keeps a full-object checksum gets it computed in the hashing pass: a blob it
    # already holds is then confirmed with a HEAD (else it is read back and re-hashed).
    crc_by_path: dict[str, str] | None = {} if store.checksum_algorithm else None
    entries = hash_tree(files, on_bytes=on_bytes, crc64=crc_by_path)
    by_path = {f.path: f for f in files}
    uploads: list[tuple[str, Path, int]] = []
    crc_of: dict[str, str | None] = {}
    for e in entries:
        if e.digest not in crc_of:
            crc_of[e.digest] = crc_by_path[e.path] if crc_by_path is not None else None
            uploads.append((e.digest, by_path[e.path].abspath, e.size))
    log_digest = log_blake3 = None
    if build_log is not None:
        crc = Crc64Nvme() if crc_by_path is not None else None
        log_h = file_hasher(build_log, crypto=True, also=crc.update if crc is not None else None)
        log_digest, log_blake3, log_size = log_h.digest(), log_h.crypto(), log_h.size
        if log_digest not in crc_of:
            crc_of[log_digest] = crc.b64 if crc is not None else None
            uploads.append((log_digest, build_log, log_size))
    manifest = Manifest(
        files=tuple(entries), profile_name=draft.profile_name, profile_hash=draft.profile_hash,
        build_key=draft.build_key, backend=draft.backend, compat_key=draft.compat_key,
        fingerprint=draft.fingerprint, tool_versions=draft.tool_versions, model_digest=draft.model_digest,
        created_at=utc_now(), build_log=log_digest, build_log_blake3=log_blake3,
    )
    result = PublishResult(artifact_id="", manifest=manifest)
    blake3_of = {e.digest: e.blake3 for e in entries}
    if log_digest is not None:
        blake3_of.setdefault(log_digest, log_blake3)

    confirmed: set[str] = set()
    rotted: list[tuple[str, Path, int]] = []

    def upload(item: tuple[str, Path, int]) -> tuple[bool, int]:
        digest, path, size = item
        check(stop)  # an interrupted publish starts no more uploads
        existing = store.stat(blob_key(digest))
        if existing == size:
            if digest not in confirmed:  # counts only once its content is confirmed
                if not blob_holds(store, digest, size, crc_of[digest], sized=True, blake3=blake3_of.get(digest)):
                    rotted.append(item)
                confirmed.add(digest)
            return False, 0
        if existing is not None:  # stored short or long: rotted, put back like any other mismatch
            if digest not in confirmed:
                rotted.append(item)
                confirmed.add(digest)
            return False, 0
        created = store.put_file(blob_key(digest), path, size=size)
        return created, size if created else 0

    # Touch every blob before relying on any, trust a blob found in the store only after looking
    # again a delete window later, and write the manifest within half the grace period of the
    # touches (buildctl.artifact_store.grace: what makes this safe next to garbage collection).
    grace, window = windows.seconds()
    clock = time.monotonic
    if window >= grace / 4:
        raise StoreArgumentError(f"delete window {window:g}s must be under a quarter of the grace period {grace:g}s")
    uploaded: set[str] = set()
    with interruptible_pool(workers, "buildctl-upload") as (pool, stop):
        for attempt in range(1, 6):
            touched = clock()
            grace_mod.touch(store, [u[0] for u in uploads], workers)
            todo = [u for u in uploads if u[0] not in uploaded]
            reused = []
            for item, (created, nbytes) in zip(todo, pool.map(upload, todo)):
                if created:
                    uploaded.add(item[0])
                    result.uploaded_blobs += 1
                    result.uploaded_bytes += nbytes
                else:
                    reused.append(item)
            if rotted:
                result.reused_repaired += _put_back(store, rotted, source, auth)
                rotted.clear()
            if reused:
                time.sleep(max(0.0, window - (clock() - touched)))
                for item, (created, nbytes) in zip(reused, pool.map(upload, reused)):  # gone meanwhile: upload again
                    if created:
                        uploaded.add(item[0])
                        result.uploaded_blobs += 1
                        result.uploaded_bytes += nbytes
            if clock() - touched < grace / 2:
                break
            if attempt == 5:
                raise StoreUnavailableError(store.uri, f"publishing took longer than half the {grace:g}s grace period "
                                            "five times over: the store is too slow for it (raise BUILDCTL_GC_GRACE_S)")
    result.skipped_blobs = len(uploads) - len(uploaded)

    # The identity record makes re-publishing the same content yield the same artifact id,
    # even when an earlier run died between this point and the manifest.
    body = manifest.canonical()
    if not store.put_bytes(identity_key(manifest.identity()), body):
        body = store.get_bytes(identity_key(manifest.identity()))
        manifest = parse_verified_manifest(body, None, identity_key(manifest.identity()))
        result.manifest = manifest
    artifact_id = digest_bytes(body)
    result.artifact_id = artifact_id
    store.put_bytes(pair_key(manifest.profile_name, manifest.profile_hash, artifact_id), b"")  # before the manifest
    result.existed = not store.put_bytes(manifest_key(artifact_id), body)
    if not result.existed:  # written just now: what the rest of the command reads (never re-read)
        memo.keep(store, artifact_id, (manifest, body))
    if auth.signer is not None:
        sign_manifest(store, artifact_id, auth.signer, body)
    if result.existed and active_quarantine(store, artifact_id) is not None:
        fixed = repair(store, artifact_id, tree_source(source), auth=auth,
                       reason="republished with identical content")
        result.repaired = fixed.replaced
    if manifest.build_key:
        result.build_key_owner = claim_build_key(store, manifest.build_key, artifact_id)
    return result


def _put_back(store: Store, rotted: list[tuple[str, Path, int]], source: str | Path, auth: Authority) -> list[str]:
    """Blobs found stored with the wrong bytes: quarantine every artifact that names one, put the
    blob back from the local file (whose digest was just computed), and repair and lift those
    artifacts where they then deep-verify. Returns the digests put back."""
    fixed = []
    for digest, path, size in rotted:
        users = referencing(store, digest)
        for artifact, paths in users:
            try_quarantine(store, artifact, f"publish found its blob {digest} stored with the wrong bytes",
                           problems=[f"{p}: stored blob {digest} does not hold its bytes" for p in paths], auth=auth)
        if hash_file(path) != (digest, size):
            raise StoreArgumentError(f"{path} changed during publish: not putting it back as {digest}")
        store.replace_object(blob_key(digest), path, size=size)
        fixed.append(digest)
        for artifact, _ in users:
            repair(store, artifact, tree_source(source), auth=auth, reason=f"blob {digest} put back by a publish")
    return fixed


def _in_service(store: Store, artifact_id: str) -> bool:
    return store.stat(manifest_key(artifact_id)) is not None and active_quarantine(store, artifact_id) is None


def claim_build_key(store: Store, build_key: str, artifact_id: str) -> str:
    """Record build key -> artifact (create-only). Returns the artifact that holds the key.

    A key whose owner was quarantined (or removed) is claimed again in its next generation
    (``index/build-keys/<k>.<n>.json``), so a rebuild of a rotted artifact becomes the cache entry;
    every generation is create-only, so concurrent builds still end with one owner."""
    record = canonical_json({"build_key": build_key, "artifact_id": artifact_id, "created_at": utc_now()})
    generation = 0
    while True:
        key = build_index_key(build_key, generation)
        if store.put_bytes(key, record):
            return artifact_id
        owner = _owner_at(store, key)
        if owner == artifact_id or (owner is not None and _in_service(store, owner)):
            return owner or artifact_id
        generation += 1


def _owner_at(store: Store, key: str) -> str | None:
    try:
        data = json.loads(store.get_bytes(key))
    except KeyNotFoundError:
        return None
    except ValueError:
        raise CorruptObjectError(key, "malformed build-key record") from None
    artifact = data.get("artifact_id") if isinstance(data, dict) else None
    if not isinstance(artifact, str) or not is_digest(artifact):
        raise CorruptObjectError(key, "malformed build-key record")
    return artifact


def _generation(key: str) -> int:
    parts = key.rsplit("/", 1)[1].split(".")  # <hex>.json or <hex>.<n>.json
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


def build_key_owners(store: Store, build_key: str) -> list[tuple[str, str]]:
    """Every generation's (record key, artifact) for a build key, oldest generation first."""
    keys = sorted(store.list(build_index_prefix(build_key)), key=_generation)
    return [(k, owner) for k in keys if (owner := _owner_at(store, k)) is not None]


def lookup_build_key(store: Store, build_key: str) -> str | None:
    """The artifact that serves a build key: the oldest generation whose artifact still exists and
    is not quarantined."""
    for _, artifact in build_key_owners(store, build_key):
        if _in_service(store, artifact):
            return artifact
    return None
