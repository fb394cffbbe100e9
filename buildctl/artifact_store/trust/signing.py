"""Ed25519 signatures for manifests, channel records and attestations.

Checksums detect corruption; they do not stop someone with write access to the bucket from
publishing a new artifact or moving a channel. Signatures do, as long as the signing keys stay
with their holders: builders sign manifests, CI signs channel records, validators sign
attestations, and nodes configured with trusted public keys accept only what verifies.

Keys are raw Ed25519 keys in PEM files (private: PKCS8, mode 0600). A key's id is the first 16
hex of the xxh3-128 digest of its raw public key. Signatures cover canonical JSON bytes.

Trust is by **role**, so no one key holder can carry an engine to production alone: a manifest
counts only with a ``builder`` signature, an attestation only with a ``validator`` signature, a
channel record only with a ``promoter`` signature. ``BUILDCTL_TRUSTED_KEYS`` is a directory with
one subdirectory per role (``builder/``, ``validator/``, ``promoter/``), each holding ``*.pub``;
a key may be trusted in one role only.

The paths come from :class:`buildctl.core.settings.Settings` (``BUILDCTL_SIGNING_KEY``: the private
key this process signs with; ``BUILDCTL_TRUSTED_KEYS``: the role directories, and when it is set,
``pull`` refuses manifests and channel records without a signature of the right role, and channel
records older than the last one this node installed). This module reads no environment.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from buildctl.core.digest import canonical_json, digest_bytes, hex_of
from buildctl.artifact_store.backends.memo import manifest_bytes
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.errors import SignatureError, StoreArgumentError
from buildctl.artifact_store.layout import manifest_key, manifest_signature_key, manifest_signature_prefix
from buildctl.core.times import now_utc, parse_utc

ROLES = ("builder", "validator", "promoter")


@dataclass(frozen=True)
class TrustedKeys:
    """Trusted public keys by role, then by key id; and revoked keys with when and why
    (:func:`buildctl.artifact_store.trust.revocation.with_revocations` fills them from the store)."""

    by_role: dict[str, dict[str, Ed25519PublicKey]]
    revoked: dict[str, tuple[datetime, str]] = field(default_factory=dict)
    thresholds: dict[str, int] = field(default_factory=dict)  # channel -> promoter signatures required

    def threshold(self, channel: str) -> int:
        return self.thresholds.get(channel, 1)

    def role_of(self, kid: str) -> str | None:
        return next((r for r, keys in self.by_role.items() if kid in keys), None)

    def key(self, role: str, kid: str) -> Ed25519PublicKey | None:
        return self.by_role.get(role, {}).get(kid)


def signer_refusal(trusted: TrustedKeys, key_id: str, role: str, now: datetime | None = None) -> str | None:
    """Why nodes with ``trusted`` would refuse what ``key_id`` signs in ``role`` (None: they accept it)."""
    if trusted.key(role, key_id) is None:
        other = trusted.role_of(key_id)
        return f"is a {other} key" if other else "is not a trusted key"
    if key_id in trusted.revoked:
        at, reason = trusted.revoked[key_id]
        if (now or now_utc()) >= at:
            return f"was revoked from {at.isoformat()} ({reason})"
    return None


def _raw_public(pub: Ed25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(pub: Ed25519PublicKey) -> str:
    return hex_of(digest_bytes(_raw_public(pub)))[:16]


@dataclass(frozen=True)
class SigningKey:
    private: Ed25519PrivateKey
    key_id: str

    def sign(self, data: bytes) -> dict[str, str]:
        return {"key_id": self.key_id, "alg": "ed25519", "sig": base64.b64encode(self.private.sign(data)).decode()}


def write_key_pair(out_dir: str | Path, name: str, private: PrivateKeyTypes) -> tuple[Path, Path]:
    """Write ``private`` as ``NAME.key`` (PKCS8 PEM, 0600, never over an existing key) and its
    public key as ``NAME.pub`` into ``out_dir``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise StoreArgumentError(f"--out {out}: a file, not a directory (key pairs are written as NAME.key and "
                                 "NAME.pub into a directory)")
    out.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out / f"{name}.key", out / f"{name}.pub"
    if key_path.exists() or pub_path.exists():
        raise StoreArgumentError(f"{key_path} or {pub_path} already exists: refusing to overwrite a key")
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(key_path, 0o600)
    pub_path.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_path, pub_path


def generate(out_dir: str | Path, name: str = "buildctl") -> tuple[Path, Path, str]:
    """Write an Ed25519 ``NAME.key`` (0600) and ``NAME.pub`` into ``out_dir``; returns (key, pub, key id)."""
    private = Ed25519PrivateKey.generate()
    key_path, pub_path = write_key_pair(out_dir, name, private)
    return key_path, pub_path, key_id(private.public_key())


def load_signing_key(path: str | Path | None) -> SigningKey | None:
    """The signing key at ``path``; None when no path is given."""
    p = path
    if not p:
        return None
    try:
        private = serialization.load_pem_private_key(Path(p).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise StoreArgumentError(f"cannot load signing key {p}: {err}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise StoreArgumentError(f"{p} is not an Ed25519 private key")
    return SigningKey(private, key_id(private.public_key()))


def _layout_help(d: Path) -> str:
    return (f"trusted keys go in one directory per role: {d}/builder/, {d}/validator/ and {d}/promoter/, "
            "each holding *.pub (a manifest counts only with a builder signature, an attestation only with a "
            "validator signature, a channel record only with a promoter signature)")


def load_trusted_keys(directory: str | Path | None) -> TrustedKeys | None:
    """Trusted public keys by role from ``directory``'s role subdirectories; None when no directory
    is given. Keys loose at the top level, unknown subdirectories and a key trusted in two roles
    are refused, with the expected layout."""
    if not directory:
        return None
    d = Path(directory)
    if not d.is_dir():
        raise StoreArgumentError(f"trusted keys {d}: not a directory; {_layout_help(d)}")
    thresholds = _thresholds(d / "thresholds.json")
    loose = sorted(f.name for f in d.glob("*.pub"))
    if loose:
        raise StoreArgumentError(
            f"trusted keys {d}: {', '.join(loose)} at the top level; {_layout_help(d)}. To migrate a flat layout: "
            f"mkdir -p {d}/builder {d}/validator {d}/promoter, then move each key into its role's directory")
    unknown = sorted(x.name for x in d.iterdir() if x.is_dir() and x.name not in ROLES)
    if unknown:
        raise StoreArgumentError(f"trusted keys {d}: unknown role directories {', '.join(unknown)}; {_layout_help(d)}")
    by_role: dict[str, dict[str, Ed25519PublicKey]] = {}
    seen: dict[str, str] = {}
    for role in ROLES:
        keys: dict[str, Ed25519PublicKey] = {}
        for f in sorted((d / role).glob("*.pub")):
            try:
                pub = serialization.load_pem_public_key(f.read_bytes())
            except ValueError as err:
                raise StoreArgumentError(f"cannot load trusted key {f}: {err}") from None
            if not isinstance(pub, Ed25519PublicKey):
                raise StoreArgumentError(f"trusted key {f} is not an Ed25519 public key")
            kid = key_id(pub)
            if kid in seen and seen[kid] != role:
                raise StoreArgumentError(f"trusted key {kid} is in both {seen[kid]}/ and {role}/ of {d}: one key, one "
                                         "role (separation of duties)")
            seen[kid] = role
            keys[kid] = pub
        by_role[role] = keys
    if not seen:
        raise StoreArgumentError(f"no Ed25519 public keys in {d}; {_layout_help(d)}")
    for channel, k in thresholds.items():
        if k > len(by_role["promoter"]):
            raise StoreArgumentError(f"{d}/thresholds.json: {channel} needs {k} promoter signatures but only "
                                     f"{len(by_role['promoter'])} promoter key(s) are trusted")
    return TrustedKeys(by_role, thresholds=thresholds)


def _thresholds(path: Path) -> dict[str, int]:
    """``thresholds.json`` next to the role directories: ``{"channels": {"prod": 2}}`` (k-of-n
    promoter signatures per channel; 1 where not listed). Part of the trust root, like the keys."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        out = {str(c): int(k) for c, k in data["channels"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise StoreArgumentError(f"{path}: expected {{\"channels\": {{\"prod\": 2}}}}: {err}") from None
    bad = [c for c, k in out.items() if k < 1]
    if bad:
        raise StoreArgumentError(f"{path}: thresholds must be at least 1 ({', '.join(bad)})")
    return out


def promoter_signers(data: bytes, signatures: list[dict | None], trusted: TrustedKeys, signed_at: str | None) -> set[str]:
    """The distinct trusted, unrevoked promoter keys whose signatures over ``data`` verify."""
    out = set()
    for sig in signatures:
        try:
            out.add(verify_signature("co-signature", data, sig, trusted, "promoter", signed_at=signed_at))
        except SignatureError:
            continue
    return out


def verify_signature(what: str, data: bytes, signature: dict | None, trusted: TrustedKeys, role: str,
                     signed_at: str | None = None) -> str:
    """Check ``signature`` over ``data`` against the keys trusted for ``role``; returns the key id or
    raises. A revoked key's signature counts only on a record made (``signed_at``) before its revocation."""
    if not signature:
        raise SignatureError(what, "unsigned")
    if not isinstance(signature, dict) or not isinstance(signature.get("sig", ""), str):
        raise SignatureError(what, "malformed signature (not an object with key_id and sig)")
    kid = str(signature.get("key_id"))
    pub = trusted.key(role, kid)
    if pub is None:
        other = trusted.role_of(kid)
        if other is not None:
            raise SignatureError(what, f"signed by the {other} key {kid}; it counts only with a {role} signature "
                                       "(separation of duties)")
        raise SignatureError(what, f"signed by untrusted key {signature.get('key_id')!r}")
    try:
        pub.verify(base64.b64decode(signature.get("sig", "")), data)
    except (InvalidSignature, ValueError):
        raise SignatureError(what, f"bad signature by key {kid}") from None
    if kid in trusted.revoked:
        at, reason = trusted.revoked[kid]
        made = parse_utc(signed_at) if signed_at else None
        if made is None or made.astimezone(timezone.utc) >= at:
            raise SignatureError(what, f"signed by key {kid}, revoked from {at.isoformat()} ({reason})")
    return kid


def sign_manifest(store: Store, artifact_id: str, signer: SigningKey, body: bytes | None = None) -> str:
    """Store ``signer``'s signature of the manifest (create-only); returns the key id."""
    body = body if body is not None else manifest_bytes(store, artifact_id)
    store.put_bytes(manifest_signature_key(artifact_id, signer.key_id), canonical_json(signer.sign(body)))
    return signer.key_id


def manifest_signatures(store: Store, artifact_id: str) -> tuple[list[dict[str, str]], list[str]]:
    """The manifest's well-formed signatures, and the keys of signature files that are not (not
    JSON, or not an object with a string ``key_id`` and ``sig``): those count as no signature."""
    sigs, bad = [], []
    for key in store.list(manifest_signature_prefix(artifact_id)):
        try:
            sig = json.loads(store.get_bytes(key))
        except ValueError:
            bad.append(key)
            continue
        if isinstance(sig, dict) and isinstance(sig.get("key_id"), str) and isinstance(sig.get("sig"), str):
            sigs.append(sig)
        else:
            bad.append(key)
    return sigs, bad


def verify_manifest_signature(store: Store, artifact_id: str, trusted: TrustedKeys) -> str:
    """The id of a trusted builder key whose signature of the manifest verifies, or raise SignatureError."""
    body = manifest_bytes(store, artifact_id)
    sigs, bad = manifest_signatures(store, artifact_id)
    if not sigs:
        raise SignatureError(f"manifest {artifact_id}", "unsigned" + (
            f" ({len(bad)} malformed signature file(s), counted as none: {', '.join(bad[:3])})" if bad else ""))
    last: SignatureError | None = None
    for sig in sigs:
        try:
            return verify_signature(f"manifest {artifact_id}", body, sig, trusted, "builder",
                                    signed_at=json.loads(body).get("created_at"))
        except SignatureError as err:
            last = err
    raise last  # type: ignore[misc]
