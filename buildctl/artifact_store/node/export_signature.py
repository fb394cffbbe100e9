"""``buildctl export-signature``: an OpenSSF Model Signing bundle for an engine directory.

The bundle is what the ``model-signing`` package (sigstore/model-transparency, v1.x) writes and
verifies in public-key mode, so a node or an auditor can check an installed engine with a standard
tool and no buildctl: ``model_signing verify key --signature model.sig --public_key export.pub DIR``.
Its format, from model-transparency e343073 (src/model_signing/_signing/signing.py ``Payload``,
sign_ec_key.py, sign_sigstore_pb.py):

- a Sigstore bundle v0.3 (``application/vnd.dev.sigstore.bundle.v0.3+json``) whose
  ``verificationMaterial.publicKey.hint`` is the SHA-256 hex of the public key's PEM, with no
  transparency-log entries, holding a DSSE envelope;
- the envelope's payload is an in-toto Statement v1 with predicate type
  ``https://model_signing/signature/v1.0``: ``resources`` lists every file with its digest (here
  the manifest's BLAKE3-256, so no byte is read again), ``serialization`` says how a verifier
  re-hashes the directory (by files, BLAKE3, no symlinks), and the one subject is the model's name
  with the SHA-256 of the resource digests in order;
- the signature is ECDSA over the DSSE pre-authentication encoding, with the curve's hash.

The key is ECDSA (P-256, P-384 or P-521): model-signing's public-key verifier refuses every other
kind (``_check_supported_ec_key``), the project's Ed25519 keys included. So the promoter keeps a
second key for exports (``buildctl key generate --role promoter --ecdsa-p256``); buildctl's own
trust chain (manifests, channel records, attestations) stays Ed25519. docs/signing.md says why a
model-signing bundle and not a cosign signature.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from buildctl.core.digest import canonical_json, file_hasher
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.trust.binding import require_crypto_manifest
from buildctl.artifact_store.errors import FileProblem, StoreArgumentError, VerificationError
from buildctl.artifact_store.manifest import Manifest, entry_problem
from buildctl.artifact_store.trust.provenance import PAYLOAD_TYPE, STATEMENT_TYPE, pae
from buildctl.artifact_store.quarantine import check_not_quarantined
from buildctl.artifact_store.trust.revocation import with_revocations
from buildctl.artifact_store.trust.signing import verify_manifest_signature, write_key_pair
from buildctl.artifact_store.read import get_manifest, resolve_artifact

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
CURVES = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}


def generate_export_key(out_dir: str | Path, name: str) -> tuple[Path, Path, str]:
    """Write an ECDSA P-256 ``NAME.key`` (0600) and ``NAME.pub`` into ``out_dir``; returns (key,
    pub, the hint a bundle carries for it)."""
    private = ec.generate_private_key(ec.SECP256R1())
    key_path, pub_path = write_key_pair(out_dir, name, private)
    return key_path, pub_path, hashlib.sha256(_public_pem(private)).hexdigest()


def _public_pem(private: ec.EllipticCurvePrivateKey) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_export_key(path: str | Path | None) -> ec.EllipticCurvePrivateKey:
    """The ECDSA private key at ``path`` (P-256, P-384 or P-521: what model-signing verifies)."""
    if not path:
        raise StoreArgumentError("export-signature needs an ECDSA key: --key or BUILDCTL_EXPORT_KEY (make one with "
                                 "`buildctl key generate --role promoter --ecdsa-p256`)")
    try:
        private = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise StoreArgumentError(f"cannot load export key {path}: {err}") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey) or private.curve.name not in CURVES:
        raise StoreArgumentError(f"{path} is not an ECDSA P-256, P-384 or P-521 private key: model-signing's public-key "
                                 "verifier accepts no other kind (the buildctl role keys are Ed25519)")
    return private


def signing_statement(files: list[tuple[str, str]], model_name: str, algorithm: str = "blake3") -> dict:
    """model-signing's v1.0 statement over ``files`` (path, hex digest by ``algorithm``), sorted by path."""
    resources = [{"name": p, "algorithm": algorithm, "digest": d} for p, d in sorted(files)]
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    return {"_type": STATEMENT_TYPE, "subject": [{"name": model_name, "digest": {"sha256": root}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {"serialization": {"method": "files", "hash_type": algorithm, "allow_symlinks": False},
                          "resources": resources}}


def sha256_from_dir(artifact_id: str, manifest: Manifest, engine_dir: str | Path) -> list[tuple[str, str]]:
    """SHA-256 of every manifest file in an installed engine directory, each checked against the
    manifest's size, xxh3-128 and BLAKE3 in the same read (so the bundle signs only the bytes the
    signed manifest names)."""
    problems, out = [], []
    for f in manifest.files:
        p = Path(engine_dir) / f.path
        sha = hashlib.sha256()
        try:
            h = file_hasher(p, crypto=True, also=sha.update)
        except OSError as err:
            problems.append(FileProblem(f.path, "missing", actual=f"{p}: {err.strerror or err}"))
            continue
        problem = entry_problem(f, h)
        if problem is not None:
            problems.append(problem)
        else:
            out.append((f.path, sha.hexdigest()))
    if problems:
        raise VerificationError(artifact_id, problems)
    return out


def export_signature(store: Store, artifact_ref: str, key: ec.EllipticCurvePrivateKey, *,
                     auth: Authority = Authority(), model_name: str | None = None,
                     sha256_dir: str | Path | None = None) -> tuple[str, bytes]:
    """The model-signing bundle for the artifact's engine directory: (artifact id, bundle bytes).
    By default its digests are the manifest's BLAKE3 (nothing is read); with ``sha256_dir`` (an
    installed copy of the engine) they are SHA-256, for verifiers that re-hash with SHA-256 only.

    Refused: a manifest without per-file BLAKE3 (schema 1: ``buildctl rehash`` first), a
    quarantined artifact, with trusted keys a manifest no trusted builder signed, and a
    ``sha256_dir`` whose files are not the manifest's."""
    artifact_id = resolve_artifact(store, artifact_ref)
    manifest = get_manifest(store, artifact_id)
    require_crypto_manifest(artifact_id, manifest)
    check_not_quarantined(store, artifact_id)
    if auth.trusted is not None:
        verify_manifest_signature(store, artifact_id, with_revocations(store, auth.trusted))
    name = model_name or f"{manifest.profile_name}-{artifact_id.split(':', 1)[1][:12]}"
    if sha256_dir is not None:
        stmt = signing_statement(sha256_from_dir(artifact_id, manifest, sha256_dir), name, "sha256")
    else:
        stmt = signing_statement([(f.path, f.blake3.split(":", 1)[1]) for f in manifest.files if f.blake3], name)
    payload = canonical_json(stmt)
    sig = key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(CURVES[key.curve.name]()))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": hashlib.sha256(_public_pem(key)).hexdigest()}, "tlogEntries": []},
        "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]},
    }
    return artifact_id, canonical_json(bundle)
