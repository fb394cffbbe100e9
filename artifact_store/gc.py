"""Garbage collection: remove artifacts no channel references, beyond the newest N per profile."""

from __future__ import annotations

from dataclasses import dataclass, field

from buildctl.store.backend import Store
from buildctl.store.channels import all_channel_records
from buildctl.store.layout import (
    attestation_prefix,
    blob_key,
    identity_key,
    manifest_key,
    manifest_signature_prefix,
    quarantine_prefix,
    verification_prefix,
)
from buildctl.store.manifest import Manifest
from buildctl.store.publish import build_key_owners
from buildctl.store.verify import list_artifacts


@dataclass
class GcResult:
    removed_artifacts: list[str] = field(default_factory=list)
    removed_blobs: int = 0
    freed_bytes: int = 0
    kept: int = 0


def gc(store: Store, *, keep: int = 3, dry_run: bool = False) -> GcResult:
    """Remove artifacts no channel references and older than the newest ``keep`` per profile.

    The manifest goes first (the artifact disappears atomically), then index records,
    attestations and signatures, then blobs that no remaining manifest uses.
    """
    referenced = {rec.artifact_id for rec in all_channel_records(store)}
    arts = list_artifacts(store)
    per_profile: dict[str, int] = {}
    doomed: list[tuple[str, Manifest]] = []
    survivors: list[Manifest] = []
    for artifact, m in arts:  # newest first
        n = per_profile.get(m.profile_name, 0)
        per_profile[m.profile_name] = n + 1
        if artifact in referenced or n < keep:
            survivors.append(m)
        else:
            doomed.append((artifact, m))
    result = GcResult(kept=len(survivors))
    live_blobs = set().union(*(m.blob_digests() for m in survivors)) if survivors else set()
    candidate_blobs: set[str] = set()
    for artifact, m in doomed:
        result.removed_artifacts.append(artifact)
        candidate_blobs |= m.blob_digests()
        if dry_run:
            continue
        store.delete(manifest_key(artifact))
        store.delete(identity_key(m.identity()))
        if m.build_key:
            for key, owner in build_key_owners(store, m.build_key):
                if owner == artifact:
                    store.delete(key)
        for key in [*store.list(attestation_prefix(artifact)), *store.list(manifest_signature_prefix(artifact)),
                    *store.list(verification_prefix(artifact)), *store.list(quarantine_prefix(artifact))]:
            store.delete(key)
    for digest in sorted(candidate_blobs - live_blobs):
        size = store.stat(blob_key(digest))
        if size is None:
            continue
        result.removed_blobs += 1
        result.freed_bytes += size
        if not dry_run:
            store.delete(blob_key(digest))
    return result
