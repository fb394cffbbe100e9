"""Publish: checksum a tree and store it as one immutable artifact, and the build-key index.

Write order (like oras-py's push): blobs first (skipping those already present), then an
identity record, then the manifest, then its signature, then the build-key index. An artifact
is visible only once its manifest exists, so a publish killed at any point leaves nothing
visible, and re-running it finishes the job with the same artifact id.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildctl.digest import canonical_json, digest_bytes, hash_file, is_digest
from buildctl.store.backend import ProgressFn, Store
from buildctl.store.errors import CorruptObjectError, KeyNotFoundError
from buildctl.store.layout import blob_key, build_index_key, identity_key, manifest_key
from buildctl.store.manifest import Manifest, hash_tree, scan_tree, utc_now
from buildctl.store.signing import SigningKey, sign_manifest
from buildctl.store.verify import parse_verified_manifest


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
    signer: SigningKey | None = None,
) -> PublishResult:
    """Checksum every file under ``source`` and publish it as one immutable artifact; with
    ``signer``, also store its signature of the manifest."""
    files = scan_tree(source)  # refuses unsafe trees before anything is written
    entries = hash_tree(files, on_bytes=on_bytes)
    by_path = {f.path: f for f in files}
    uploads: list[tuple[str, Path, int]] = []
    seen: set[str] = set()
    for e in entries:
        if e.digest not in seen:
            seen.add(e.digest)
            uploads.append((e.digest, by_path[e.path].abspath, e.size))
    log_digest = None
    if build_log is not None:
        log_digest, log_size = hash_file(build_log)
        if log_digest not in seen:
            uploads.append((log_digest, build_log, log_size))
    manifest = Manifest(
        files=tuple(entries), profile_name=draft.profile_name, profile_hash=draft.profile_hash,
        build_key=draft.build_key, backend=draft.backend, compat_key=draft.compat_key,
        fingerprint=draft.fingerprint, tool_versions=draft.tool_versions, model_digest=draft.model_digest,
        created_at=utc_now(), build_log=log_digest,
    )
    result = PublishResult(artifact_id="", manifest=manifest)

    def upload(item: tuple[str, Path, int]) -> tuple[bool, int]:
        digest, path, size = item
        existing = store.stat(blob_key(digest))
        if existing == size:
            return False, 0
        if existing is not None:
            raise CorruptObjectError(blob_key(digest), f"stored blob has size {existing}, expected {size}")
        created = store.put_file(blob_key(digest), path, size=size)
        return created, size if created else 0

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for created, nbytes in pool.map(upload, uploads):
            if created:
                result.uploaded_blobs += 1
                result.uploaded_bytes += nbytes
            else:
                result.skipped_blobs += 1

    # The identity record makes re-publishing the same content yield the same artifact id,
    # even when an earlier run died between this point and the manifest.
    body = manifest.canonical()
    if not store.put_bytes(identity_key(manifest.identity()), body):
        body = store.get_bytes(identity_key(manifest.identity()))
        manifest = parse_verified_manifest(body, None, identity_key(manifest.identity()))
        result.manifest = manifest
    artifact_id = digest_bytes(body)
    result.artifact_id = artifact_id
    result.existed = not store.put_bytes(manifest_key(artifact_id), body)
    if signer is not None:
        sign_manifest(store, artifact_id, signer, body)
    if manifest.build_key:
        result.build_key_owner = claim_build_key(store, manifest.build_key, artifact_id)
    return result


def claim_build_key(store: Store, build_key: str, artifact_id: str) -> str:
    """Record build key -> artifact (create-only). Returns the artifact that holds the key."""
    record = canonical_json({"build_key": build_key, "artifact_id": artifact_id, "created_at": utc_now()})
    if store.put_bytes(build_index_key(build_key), record):
        return artifact_id
    return lookup_build_key(store, build_key) or artifact_id


def build_key_owner(store: Store, build_key: str) -> str | None:
    """The artifact recorded for a build key (whether or not its manifest still exists)."""
    try:
        data = json.loads(store.get_bytes(build_index_key(build_key)))
    except KeyNotFoundError:
        return None
    except ValueError:
        raise CorruptObjectError(build_index_key(build_key), "malformed build-key record") from None
    artifact = data.get("artifact_id") if isinstance(data, dict) else None
    if not isinstance(artifact, str) or not is_digest(artifact):
        raise CorruptObjectError(build_index_key(build_key), "malformed build-key record")
    return artifact


def lookup_build_key(store: Store, build_key: str) -> str | None:
    """The artifact recorded for a build key, if its manifest still exists."""
    artifact = build_key_owner(store, build_key)
    if artifact is None or store.stat(manifest_key(artifact)) is None:
        return None
    return artifact
