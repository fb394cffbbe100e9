"""Signed records bound to a manifest's exact bytes by BLAKE3-256, and the ``--require-crypto`` policy.

An artifact id is the xxh3-128 of its manifest's bytes: a content address, not a cryptographic
binding. So every record that names an artifact and is signed (channel records, attestations,
quarantine records) also carries ``blake3:<64 hex>`` of the manifest bytes it meant, and the
reader checks the bytes it got against it. A schema 2 manifest in turn carries BLAKE3-256 per
file, so one signature binds every byte of the engine. Records and manifests written before this
carry none; they still serve, by xxh3 and the signatures, unless the reader requires crypto.
"""

from __future__ import annotations

from buildctl.core.digest import crypto_bytes, digest_bytes
from buildctl.artifact_store.backends.memo import manifest_bytes
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.errors import CorruptObjectError, CryptoRequiredError, KeyNotFoundError
from buildctl.artifact_store.layout import manifest_key
from buildctl.artifact_store.manifest import Manifest


def manifest_blake3(store: Store, artifact_id: str) -> str | None:
    """BLAKE3-256 of the stored manifest bytes that hash to ``artifact_id`` (one GET); None when the
    manifest is missing or its bytes do not hash to the id (nothing to bind)."""
    try:
        body = manifest_bytes(store, artifact_id)
    except KeyNotFoundError:
        return None
    return crypto_bytes(body) if digest_bytes(body) == artifact_id else None


def require_crypto_manifest(artifact_id: str, manifest: Manifest) -> None:
    """``--require-crypto``: refuse a manifest without per-file BLAKE3 (schema 1)."""
    if not manifest.crypto:
        raise CryptoRequiredError(artifact_id, f"its manifest (schema {manifest.schema_version}) has xxh3-128 "
                                  "digests only; `buildctl rehash` publishes a BLAKE3 manifest for it")


def check_bound(artifact_id: str, body: bytes, manifest: Manifest, expected: str | None, *,
                require_crypto: bool, what: str = "channel record") -> None:
    """Refuse manifest bytes that are not the ones ``what`` signed (``expected``: the record's BLAKE3
    of them) and, with ``require_crypto``, a manifest without per-file BLAKE3 (schema 1) or a record
    that binds no manifest bytes."""
    if expected is not None:
        got = crypto_bytes(body)
        if got != expected:
            raise CorruptObjectError(manifest_key(artifact_id), f"manifest bytes hash to {got}, the {what} "
                                     f"signed {expected}: other bytes with the same xxh3-128 id")
    if require_crypto:
        require_crypto_manifest(artifact_id, manifest)
        if expected is None:
            raise CryptoRequiredError(artifact_id, f"the {what} carries no BLAKE3 of its manifest (written before "
                                      "BLAKE3): promote the artifact again to write one that does")
