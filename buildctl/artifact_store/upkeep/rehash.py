"""Rehash: a schema 2 (BLAKE3) manifest for an artifact published before BLAKE3.

``buildctl rehash ARTIFACT`` re-reads every blob of a schema 1 artifact from the store, computing
xxh3-128 and BLAKE3-256 in one pass. Every xxh3 must match the old manifest (a mismatch is
damage: the artifact is quarantined, as ``verify --deep`` does). The new manifest lists the same
files with their BLAKE3, names the old artifact in ``rehashed_from`` (inside the signed bytes),
and is signed with the caller's key like a publish. The link is also kept as a marker
``index/rehashed/<old>/<new>``, written before the manifest, so ``show`` of the old artifact names
its successor. Rehashing again gives the same new artifact (the identity record).

The new artifact is a new id: promote it as usual. Its validation is the old one's: the promote
gate counts the predecessor's attestation for it, because the two list the same files
(:func:`buildctl.artifact_store.promotion.promotion_refusals`).

What it trusts: the store's bytes at the time, checked by xxh3 only (the old manifest has nothing
stronger). Rehash where the store has not been writable by an attacker since the artifact was
published, or compare with a copy known good first (``buildctl verify --deep`` on a copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.errors import FileProblem, KeyNotFoundError, VerificationError
from buildctl.artifact_store.upkeep.integrity import quarantine_on
from buildctl.artifact_store.layout import blob_key, identity_key, manifest_key, pair_key, rehash_key, rehash_prefix
from buildctl.artifact_store.manifest import MANIFEST_SCHEMA_VERSION, FileEntry, Manifest, content_problem
from buildctl.artifact_store.quarantine import check_not_quarantined
from buildctl.artifact_store.backends.ranged import RangedReader
from buildctl.artifact_store.trust.signing import sign_manifest
from buildctl.artifact_store.read import BUILD_LOG_PATH, blob_entries, get_manifest, parse_verified_manifest, stored_hash
from buildctl.core.digest import digest_bytes
from buildctl.core.times import utc_now


@dataclass(frozen=True)
class RehashResult:
    """What a rehash did."""

    old: str
    new: str
    existed: bool  # the schema 2 manifest was there already (a rehash run before)
    files: int
    bytes: int

    def to_json(self) -> dict:
        return {"artifact_id": self.old, "rehashed_as": self.new, "existed": self.existed, "files": self.files,
                "bytes": self.bytes}


def successors(store: Store, artifact_id: str) -> list[str]:
    """The artifacts ``buildctl rehash`` made of this one (their markers; the manifests may be gone)."""
    return ["xxh3-128:" + k.rsplit("/", 1)[1] for k in store.list(rehash_prefix(artifact_id))]


def rehash(store: Store, artifact_id: str, *, auth: Authority = Authority(),
           on_bytes: ProgressFn | None = None) -> RehashResult:
    """Publish a schema 2 manifest for the schema 1 artifact ``artifact_id`` (see the module
    docstring). An artifact already schema 2 is returned as it is."""
    old = get_manifest(store, artifact_id)
    if old.crypto:
        return RehashResult(artifact_id, artifact_id, True, len(old.files), old.total_size)
    check_not_quarantined(store, artifact_id, "not rehashing it: repair it first")
    problems: list[FileProblem] = []
    entries: list[FileEntry] = []
    log_blake3 = None
    with RangedReader(store) as ranged:
        for e in blob_entries(store, old):
            try:
                h, problem = stored_hash(store, ranged, e, crypto=True, on_bytes=on_bytes)
            except KeyNotFoundError:
                h, problem = None, FileProblem(e.path, "missing", actual=f"blob {blob_key(e.digest)} disappeared")
            if problem is None and h is not None:
                problem = content_problem(e.path, e.digest, None, h)  # the old manifest's xxh3 must hold
            if problem is not None or h is None:
                problems.append(problem or FileProblem(e.path, "unreadable"))
            elif e.path == BUILD_LOG_PATH:
                log_blake3 = h.crypto()
            else:
                entries.append(e.model_copy(update={"blake3": h.crypto()}))
    if problems:
        raise quarantine_on(store, VerificationError(artifact_id, problems), detector="rehash", auth=auth) from None
    new = old.model_copy(update={"schema_version": MANIFEST_SCHEMA_VERSION, "files": tuple(entries),
                                 "build_log_blake3": log_blake3, "rehashed_from": artifact_id,
                                 "created_at": utc_now()})
    new = Manifest.model_validate(new.model_dump(mode="json"))  # the schema 2 rules, checked
    body = new.canonical()
    ident = identity_key(new.identity())
    if not store.put_bytes(ident, body):  # rehashed before: the same artifact again
        body = store.get_bytes(ident)
        new = parse_verified_manifest(body, None, ident)
    new_id = digest_bytes(body)
    store.put_bytes(pair_key(new.profile_name, new.profile_hash, new_id), b"")  # before the manifest
    store.put_bytes(rehash_key(artifact_id, new_id), b"")
    existed = not store.put_bytes(manifest_key(new_id), body)
    if auth.signer is not None:
        sign_manifest(store, new_id, auth.signer, body)
    return RehashResult(artifact_id, new_id, existed, len(new.files), new.total_size)
