"""Store operations: publish, read-with-verify, verify, channels, promotion, history, gc.

Write order for publish (like oras-py's push): blobs first (skipping those already present),
then an identity record, then the manifest, then the build-key index. An artifact is visible
only once its manifest exists, so a publish killed at any point leaves nothing visible, and
re-running it finishes the job with the same artifact id.
"""

from __future__ import annotations

import getpass
import json
import os
import random
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifact_store.digest import canonical_json, digest_bytes, hash_file, hash_stream, hex_of, is_digest
from artifact_store.errors import (
    ArtifactNotFoundError,
    CasConflictError,
    ChannelNotFoundError,
    CorruptObjectError,
    FileProblem,
    KeyNotFoundError,
    ManifestError,
    PromotionRefusedError,
    SignatureError,
    StoreArgumentError,
    StoreUnavailableError,
    VerificationError,
)
from artifact_store.signing import load_signing_key, load_trusted_keys, verify_signature
from artifact_store.manifest import FileEntry, Manifest, hash_tree, parse_manifest, scan_tree, utc_now
from artifact_store.store import (
    ProgressFn,
    Store,
    attestation_prefix,
    blob_key,
    build_index_key,
    channel_key,
    history_key,
    history_prefix,
    identity_key,
    manifest_key,
)

CHANNEL_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


# --- publish --------------------------------------------------------------------------------


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
) -> PublishResult:
    """Checksum every file under ``source`` and publish it as one immutable artifact."""
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
        build_key=draft.build_key, backend=draft.backend, compat_key=draft.compat_key,  # type: ignore[arg-type]
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
        manifest = _parse_verified_manifest(body, None, identity_key(manifest.identity()))
        result.manifest = manifest
    artifact_id = digest_bytes(body)
    result.artifact_id = artifact_id
    result.existed = not store.put_bytes(manifest_key(artifact_id), body)
    sign_manifest(store, artifact_id, body)
    if manifest.build_key:
        result.build_key_owner = claim_build_key(store, manifest.build_key, artifact_id)
    return result


def manifest_signature_prefix(artifact_id: str) -> str:
    return f"signatures/manifests/{hex_of(artifact_id)}/"


def sign_manifest(store: Store, artifact_id: str, body: bytes | None = None) -> str | None:
    """Store this process's signature of the manifest (create-only), when a signing key is configured."""
    key = load_signing_key()
    if key is None:
        return None
    body = body if body is not None else store.get_bytes(manifest_key(artifact_id))
    store.put_bytes(f"{manifest_signature_prefix(artifact_id)}{key.key_id}.json", canonical_json(key.sign(body)))
    return key.key_id


def verify_manifest_signature(store: Store, artifact_id: str, trusted: dict) -> str:
    """The id of a trusted key whose signature of the manifest verifies, or raise SignatureError."""
    body = store.get_bytes(manifest_key(artifact_id))
    sigs = [json.loads(store.get_bytes(k)) for k in store.list(manifest_signature_prefix(artifact_id))]
    if not sigs:
        raise SignatureError(f"manifest {artifact_id}", "unsigned")
    last: SignatureError | None = None
    for sig in sigs:
        try:
            return verify_signature(f"manifest {artifact_id}", body, sig, trusted)
        except SignatureError as err:
            last = err
    raise last  # type: ignore[misc]


def claim_build_key(store: Store, build_key: str, artifact_id: str) -> str:
    """Record build key -> artifact (create-only). Returns the artifact that holds the key."""
    record = canonical_json({"build_key": build_key, "artifact_id": artifact_id, "created_at": utc_now()})
    if store.put_bytes(build_index_key(build_key), record):
        return artifact_id
    return lookup_build_key(store, build_key) or artifact_id


def _build_key_owner(store: Store, build_key: str) -> str | None:
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
    artifact = _build_key_owner(store, build_key)
    if artifact is None or store.stat(manifest_key(artifact)) is None:
        return None
    return artifact


# --- reading --------------------------------------------------------------------------------


def _parse_verified_manifest(body: bytes, artifact_id: str | None, key: str) -> Manifest:
    if artifact_id is not None and digest_bytes(body) != artifact_id:
        raise CorruptObjectError(key, f"manifest bytes hash to {digest_bytes(body)}, not {artifact_id}")
    return parse_manifest(body, key)


def resolve_artifact(store: Store, ref: str) -> str:
    """A full artifact id from a full id, ``xxh3-128:``-less hex, or a unique hex prefix (>= 8)."""
    h = ref[len("xxh3-128:"):] if ref.startswith("xxh3-128:") else ref
    h = h.lower()
    if not (8 <= len(h) <= 32) or any(c not in "0123456789abcdef" for c in h):
        raise ArtifactNotFoundError(ref, "expected an artifact id or a hex prefix of at least 8 characters")
    if len(h) == 32:
        artifact = "xxh3-128:" + h
        if store.stat(manifest_key(artifact)) is None:
            raise ArtifactNotFoundError(artifact)
        return artifact
    matches = [k for k in store.list(f"manifests/{h}")]
    if not matches:
        raise ArtifactNotFoundError(ref)
    if len(matches) > 1:
        raise ArtifactNotFoundError(ref, f"prefix is ambiguous ({len(matches)} artifacts)")
    return "xxh3-128:" + matches[0][len("manifests/"):-len(".json")]


def get_manifest(store: Store, artifact_id: str) -> Manifest:
    """Read a manifest and verify it hashes to its id (dvc-style verify on read)."""
    key = manifest_key(artifact_id)
    try:
        body = store.get_bytes(key)
    except KeyNotFoundError:
        raise ArtifactNotFoundError(artifact_id) from None
    return _parse_verified_manifest(body, artifact_id, key)


def list_artifacts(store: Store, profile: str | None = None) -> list[tuple[str, Manifest]]:
    """Every artifact (optionally of one profile), newest first."""
    out = []
    for key in store.list("manifests/"):
        artifact = "xxh3-128:" + key[len("manifests/"):-len(".json")]
        try:
            m = get_manifest(store, artifact)
        except (ArtifactNotFoundError, ManifestError, CorruptObjectError):
            continue
        if profile is None or m.profile_name == profile:
            out.append((artifact, m))
    out.sort(key=lambda am: am[1].created_at, reverse=True)
    return out


# --- verify ---------------------------------------------------------------------------------


def verify(store: Store, artifact_id: str, *, deep: bool = False, workers: int = 4,
           on_bytes: ProgressFn | None = None) -> Manifest:
    """Check every blob exists with the right size; ``deep`` re-hashes every byte. Raises :class:`VerificationError`."""
    manifest = get_manifest(store, artifact_id)
    entries: list[FileEntry] = list(manifest.files)
    if manifest.build_log:
        entries.append(FileEntry(path="<build log>", size=store.stat(blob_key(manifest.build_log)) or 0,
                                 digest=manifest.build_log))

    def check(e: FileEntry) -> FileProblem | None:
        key = blob_key(e.digest)
        size = store.stat(key)
        if size is None:
            return FileProblem(e.path, "missing", actual=f"blob {key} does not exist")
        if e.path != "<build log>" and size != e.size:
            return FileProblem(e.path, "size", e.size, size)
        if deep:
            with store.open_read(key) as f:
                got, n = hash_stream(f)
            if on_bytes:
                on_bytes(n)
            if got != e.digest:
                return FileProblem(e.path, "digest", e.digest, got)
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems = [p for p in pool.map(check, entries) if p is not None]
    if problems:
        raise VerificationError(artifact_id, problems)
    return manifest


# --- attestations ---------------------------------------------------------------------------


def write_attestation(store: Store, artifact_id: str, attestation: dict[str, Any]) -> str:
    """Store an attestation (create-only) under the artifact; returns its digest."""
    for k in ("verdict", "compat_key", "created_at"):
        if k not in attestation:
            raise ValueError(f"attestation lacks {k!r}")
    content = {k: v for k, v in attestation.items() if k != "signature"} | {"artifact_id": artifact_id}
    key = load_signing_key()
    if key is not None:
        content["signature"] = key.sign(canonical_json(content))
    body = canonical_json(content)
    att_id = digest_bytes(body)
    store.put_bytes(f"{attestation_prefix(artifact_id)}{attestation['created_at']}-{hex_of(att_id)}.json", body)
    return att_id


def list_attestations(store: Store, artifact_id: str) -> list[dict[str, Any]]:
    """Every attestation of an artifact, oldest first (keys sort by creation time)."""
    out = []
    for key in store.list(attestation_prefix(artifact_id)):
        body = store.get_bytes(key)
        if not key.endswith(f"-{hex_of(digest_bytes(body))}.json"):
            raise CorruptObjectError(key, "attestation bytes do not match their name")
        out.append(json.loads(body))
    return out


def latest_attestation(store: Store, artifact_id: str, compat_key: str) -> dict[str, Any] | None:
    matching = [a for a in list_attestations(store, artifact_id) if a.get("compat_key") == compat_key]
    return matching[-1] if matching else None


# --- channels and promotion -----------------------------------------------------------------


class ChannelRecord(BaseModel):
    """One promotion: the channel ref's content and its append-only history entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(..., ge=1, description="Position in the channel's history, 1-based, no gaps.")
    profile: str = Field(..., description="Profile name.")
    channel: str = Field(..., description="Channel name.")
    compat_key: str = Field(..., description="Compat key the channel ref is for.")
    artifact_id: str = Field(..., description="The artifact the channel now points at.")
    previous: str | None = Field(None, description="The artifact it pointed at before, if any.")
    who: str = Field(..., description="user@host, or the CI identity.")
    when: str = Field(..., description="UTC ISO-8601 time of the promotion.")
    reason: str | None = Field(None, description="Why (required for forced promotions and rollbacks).")
    forced: bool = Field(False, description="Whether the promotion gates were overridden.")
    action: str = Field("promote", description="promote or rollback.")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")

    def signed_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", exclude={"signature"}))


def actor() -> str:
    """Who is acting: the CI identity when in CI, else user@host."""
    if os.environ.get("GITHUB_ACTIONS"):
        return f"github:{os.environ.get('GITHUB_REPOSITORY', '?')}#{os.environ.get('GITHUB_RUN_ID', '?')} ({os.environ.get('GITHUB_ACTOR', '?')})"
    if os.environ.get("GITLAB_CI"):
        return f"gitlab:{os.environ.get('CI_PROJECT_PATH', '?')}#{os.environ.get('CI_PIPELINE_ID', '?')} ({os.environ.get('GITLAB_USER_LOGIN', '?')})"
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    who = f"{user}@{socket.gethostname()}"
    return f"ci:{who}" if os.environ.get("CI") else who


def read_channel(store: Store, profile: str, channel: str, compat_key: str) -> tuple[ChannelRecord, str] | None:
    """The current channel record and its version token, or ``None``."""
    key = channel_key(profile, channel, compat_key)
    got = store.get_ref(key)
    if got is None:
        return None
    try:
        return ChannelRecord.model_validate_json(got[0]), got[1]
    except ValidationError as err:
        raise CorruptObjectError(key, f"malformed channel record: {err.error_count()} error(s)") from None


def _settle_history(store: Store, rec: ChannelRecord) -> None:
    """Make sure the current ref's record is in the history (a promoter may have died in between)."""
    store.put_bytes(history_key(rec.profile, rec.channel, rec.compat_key, rec.seq), canonical_json(rec.model_dump(mode="json")))


def set_channel(
    store: Store,
    artifact_id: str,
    manifest: Manifest,
    channel: str,
    *,
    reason: str | None = None,
    forced: bool = False,
    action: str = "promote",
    attempts: int = 30,
    sleep: Callable[[float], None] = time.sleep,
) -> ChannelRecord:
    """Move a channel to an artifact with compare-and-swap; retried with jitter; appends history."""
    if not re.match(CHANNEL_RE, channel):
        raise StoreArgumentError(f"bad channel name {channel!r}: lowercase letters, digits and dashes")
    profile, compat = manifest.profile_name, manifest.compat_key
    ref = channel_key(profile, channel, compat)
    key = load_signing_key()
    for attempt in range(attempts):
        current = read_channel(store, profile, channel, compat)
        if current is not None:
            _settle_history(store, current[0])
            signer = (current[0].signature or {}).get("key_id")
            if action == "promote" and current[0].artifact_id == artifact_id and signer == (key.key_id if key else None):
                return current[0]  # already there: promotions are idempotent (CI retries)
        rec = ChannelRecord(
            seq=(current[0].seq + 1) if current else 1, profile=profile, channel=channel, compat_key=compat,
            artifact_id=artifact_id, previous=current[0].artifact_id if current else None,
            who=actor(), when=utc_now(), reason=reason, forced=forced, action=action,
        )
        if key is not None:
            rec = rec.model_copy(update={"signature": key.sign(rec.signed_bytes())})
        if store.cas(ref, canonical_json(rec.model_dump(mode="json")), current[1] if current else None):
            _settle_history(store, rec)
            return rec
        sleep(random.uniform(0, min(1.0, 0.01 * 2 ** attempt)))
    raise CasConflictError(ref, attempts)


def promote(store: Store, artifact_ref: str, channel: str, *, force: bool = False, reason: str | None = None,
            attempts: int = 30) -> ChannelRecord:
    """Promote after the gates: the artifact verifies and its latest attestation for its compat key passed."""
    artifact_id = resolve_artifact(store, artifact_ref)
    if force and not reason:
        raise StoreArgumentError("--force needs --reason: a break-glass promotion is recorded with why")
    reasons: list[str] = []
    try:
        manifest = verify(store, artifact_id)
    except VerificationError as err:
        if not force:
            raise PromotionRefusedError(artifact_id, channel, [f"artifact does not verify: {p.render()}" for p in err.problems]) from None
        manifest = get_manifest(store, artifact_id)
    att = latest_attestation(store, artifact_id, manifest.compat_key)
    trusted = load_trusted_keys()
    if att is not None and trusted is not None:
        try:
            verify_signature(f"attestation of {artifact_id}", canonical_json({k: v for k, v in att.items() if k != "signature"}),
                             att.get("signature"), trusted)
        except SignatureError as err:
            reasons.append(f"attestation signature: {err.detail}")
    if att is None:
        reasons.append(f"no validation attestation for compat key {manifest.compat_key}")
    elif att.get("verdict") != "pass":
        reasons.append(f"latest validation attestation ({att.get('created_at')}) did not pass: verdict {att.get('verdict')!r}")
    if reasons and not force:
        raise PromotionRefusedError(artifact_id, channel, reasons)
    return set_channel(store, artifact_id, manifest, channel, reason=reason, forced=bool(reasons) and force,
                       attempts=attempts)


def history(store: Store, profile: str, channel: str, compat_key: str | None = None) -> list[ChannelRecord]:
    """The channel's records, oldest first, for one compat key or all of them.

    A promoter that died between its swap and its history write leaves the ref one record ahead:
    that record is included (and written, where this caller may write) so the chain has no gap.
    """
    prefix = history_prefix(profile, channel, compat_key) if compat_key else f"history/{profile}/{channel}/"
    out = {(r.compat_key, r.seq): r for r in
           (ChannelRecord.model_validate_json(store.get_bytes(k)) for k in store.list(prefix))}
    for key in (compat_key,) if compat_key else channel_compat_keys(store, profile, channel):
        got = read_channel(store, profile, channel, key)
        if got and (got[0].compat_key, got[0].seq) not in out:
            out[(got[0].compat_key, got[0].seq)] = got[0]
            try:
                _settle_history(store, got[0])
            except StoreUnavailableError:
                pass  # a read-only caller (a node): the record is still reported
    return sorted(out.values(), key=lambda r: (r.compat_key, r.seq))


def channel_compat_keys(store: Store, profile: str, channel: str) -> list[str]:
    return [k.rsplit("/", 1)[1][:-len(".json")] for k in store.list(f"channels/{profile}/{channel}/")]


def rollback(store: Store, profile: str, channel: str, *, to: str | None = None, compat_key: str | None = None,
             reason: str | None = None) -> ChannelRecord:
    """Point the channel at an earlier artifact, recorded as a new, higher history record."""
    keys = [compat_key] if compat_key else channel_compat_keys(store, profile, channel)
    if not keys or (compat_key and read_channel(store, profile, channel, compat_key) is None):
        raise ChannelNotFoundError(profile, channel, keys or ["<none>"])
    if len(keys) > 1:
        raise StoreArgumentError(f"channel {channel!r} of {profile!r} has refs for {len(keys)} compat keys; pass --compat-key")
    compat = keys[0]
    current = read_channel(store, profile, channel, compat)
    if current is None:
        raise ChannelNotFoundError(profile, channel, [compat])
    if to is not None:
        target = resolve_artifact(store, to)
    else:
        target = None
        for rec in reversed(history(store, profile, channel, compat)):
            if rec.artifact_id != current[0].artifact_id:
                target = rec.artifact_id
                break
        if target is None:
            raise ArtifactNotFoundError("<previous>", f"channel {channel!r} has no earlier artifact to roll back to")
    manifest = verify(store, target)
    if manifest.profile_name != profile or manifest.compat_key != compat:
        raise StoreArgumentError(f"artifact {target} is for {manifest.profile_name}/{manifest.compat_key}, not {profile}/{compat}")
    return set_channel(store, target, manifest, channel, reason=reason or "rollback", action="rollback")


def channels_pointing_at(store: Store, artifact_id: str) -> list[ChannelRecord]:
    out = []
    for key in store.list("channels/"):
        got = store.get_ref(key)
        if got is None:
            continue
        rec = ChannelRecord.model_validate_json(got[0])
        if rec.artifact_id == artifact_id:
            out.append(rec)
    return out


# --- garbage collection ---------------------------------------------------------------------


@dataclass
class GcResult:
    removed_artifacts: list[str] = field(default_factory=list)
    removed_blobs: int = 0
    freed_bytes: int = 0
    kept: int = 0


def gc(store: Store, *, keep: int = 3, dry_run: bool = False) -> GcResult:
    """Remove artifacts no channel references and older than the newest ``keep`` per profile.

    The manifest goes first (the artifact disappears atomically), then index records and
    attestations, then blobs that no remaining manifest uses.
    """
    referenced = set()
    for key in store.list("channels/"):
        got = store.get_ref(key)
        if got:
            referenced.add(ChannelRecord.model_validate_json(got[0]).artifact_id)
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
        if m.build_key and _build_key_owner(store, m.build_key) == artifact:
            store.delete(build_index_key(m.build_key))
        for key in [*store.list(attestation_prefix(artifact)), *store.list(manifest_signature_prefix(artifact))]:
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
