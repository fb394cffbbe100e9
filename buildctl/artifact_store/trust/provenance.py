"""Build provenance: an in-toto Statement v1 with a SLSA Provenance v1 predicate, in a DSSE envelope.

Every build writes one (:func:`buildctl.steps.build.publish`), signed with the builder key and
stored create-only at ``provenance/<artifact hex>.json``, beside the manifest. It says what built
what, in the standard form other tools read (docs/provenance.md has the field-by-field meaning):

- ``subject``: the manifest (named by the artifact id; BLAKE3-256, SHA-256 and xxh3-128 of its
  bytes) and every engine file (BLAKE3-256 and xxh3-128, from the manifest);
- ``buildDefinition``: the profile, backend and compat key asked for (``externalParameters``); the
  build key, the builder's fingerprint and the command lines the backend ran
  (``internalParameters``); the model checkpoint, the profile and the calibration set by digest
  (``resolvedDependencies``);
- ``runDetails``: the builder's identity and tool versions, when it ran, the build log's digest.

Digest names follow in-toto's DigestSet rules (lowercase, ``-`` as ``_``, lowercase hex):
``blake3`` is BLAKE3-256, ``xxh3_128`` is xxh3-128. A directory (checkpoint, calibration set) is
digested as the canonical JSON list of its files' path, size, digest and mode
(:func:`buildctl.artifact_store.manifest.tree_digests`): with xxh3-128 that is the digest build
keys have always used, with BLAKE3 the same list carrying each file's BLAKE3.

``promote`` to a production channel requires provenance (:func:`provenance_refusals`): signed by a
trusted builder key when keys are trusted, bound to the manifest's bytes, and with inputs that are
the ones the promoter's profile names.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json, crypto_bytes, hex_of
from buildctl.core.times import parse_utc
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.trust.binding import manifest_blake3
from buildctl.artifact_store.errors import CorruptObjectError, KeyNotFoundError, SignatureError
from buildctl.artifact_store.layout import manifest_key, provenance_key
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.trust.revocation import with_revocations
from buildctl.artifact_store.trust.signing import SigningKey, TrustedKeys, verify_signature

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
# What the fields of buildDefinition mean for a buildctl engine build: docs/provenance.md.
BUILD_TYPE = "https://buildctl.dev/provenance/engine-build/v1"
MANIFEST_MEDIA_TYPE = "application/vnd.buildctl.manifest.v2+json"


class TreeRef(Record):
    """A build input by digest: a checkpoint, a profile or a calibration set."""

    uri: str | None = Field(None, description="Where it was read from (a path or s3:// URI), when it has one.")
    digest: str = Field(..., description="xxh3-128 of it (of its file list, for a directory).")
    blake3: str = Field(..., description="BLAKE3-256 of it (of its file list with each file's BLAKE3, for a directory).")
    size: int | None = Field(None, description="Calibration sets: the number of samples the build used.")


class BuildFacts(Record):
    """What the build step knows about one build, from which the statement is written."""

    builder_id: str = Field(..., description="The builder's identity (a URI).")
    backend: str
    compat_key: str
    build_key: str | None
    profile_name: str
    profile: TreeRef
    model: TreeRef
    calibration: TreeRef | None = None
    fingerprint: dict[str, Any] = Field(..., description="The builder host's full fingerprint.")
    fingerprint_digest: str
    tool_versions: dict[str, str | None]
    commands: tuple[tuple[str, ...], ...] = Field(..., description="The command lines the backend ran, in order.")
    invocation: tuple[str, ...] = Field((), description="The buildctl command line (or flow run) that asked for the build.")
    invocation_id: str
    started_on: str
    finished_on: str


class ExpectedInputs(Record):
    """The inputs the promoter's profile names, which the provenance must show."""

    profile_name: str
    profile_hash: str
    calibration_uri: str | None = None
    calibration_size: int | None = None


class DsseSignature(Record):
    keyid: str
    sig: str


class DsseEnvelope(Record):
    """A DSSE envelope (secure-systems-lab/dsse protocol.md v1.0.0)."""

    payloadType: str
    payload: str
    signatures: tuple[DsseSignature, ...]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what a DSSE signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _digests(xxh3: str, blake3: str | None, **more: str) -> dict[str, str]:
    out = {"xxh3_128": hex_of(xxh3)}
    if blake3 is not None:
        out["blake3"] = blake3.split(":", 1)[1]
    out.update(more)
    return dict(sorted(out.items()))


def _ref(name: str, ref: TreeRef, **annotations: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "digest": _digests(ref.digest, ref.blake3)}
    if ref.uri:
        out["uri"] = ref.uri
    notes = {k: v for k, v in annotations.items() if v is not None}
    if notes:
        out["annotations"] = notes
    return out


def statement(artifact_id: str, body: bytes, manifest: Manifest, facts: BuildFacts) -> dict[str, Any]:
    """The in-toto Statement v1 (SLSA Provenance v1 predicate) for the artifact whose manifest
    bytes are ``body``."""
    subjects = [{"name": artifact_id, "mediaType": MANIFEST_MEDIA_TYPE,
                 "digest": _digests(artifact_id, crypto_bytes(body), sha256=hashlib.sha256(body).hexdigest())}]
    subjects += [{"name": f.path, "digest": _digests(f.digest, f.blake3)} for f in manifest.files]
    deps = [_ref("model", facts.model, tree="path, size, digest and mode of every file"),
            _ref("profile", facts.profile, profile=facts.profile_name,
                 digestOf="xxh3_128: the build-affecting fields; blake3: every field")]
    if facts.calibration is not None:
        deps.append(_ref("calibration", facts.calibration, samples=facts.calibration.size,
                         tree="path, size, digest and mode of every file"))
    byproducts = []
    if manifest.build_log is not None:
        byproducts.append({"name": "build.log", "mediaType": "text/plain",
                           "digest": _digests(manifest.build_log, manifest.build_log_blake3)})
    predicate: dict[str, Any] = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"profile": facts.profile_name, "backend": facts.backend,
                                   "compatKey": facts.compat_key},
            "internalParameters": {"buildKey": facts.build_key, "commands": [list(c) for c in facts.commands],
                                   "invocation": list(facts.invocation)},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {
                "id": facts.builder_id,
                "version": {k: v for k, v in sorted(facts.tool_versions.items()) if v is not None},
                "builderDependencies": [{"name": "host-fingerprint", "digest": _digests(facts.fingerprint_digest, None),
                                         "annotations": facts.fingerprint}],
            },
            "metadata": {"invocationId": facts.invocation_id, "startedOn": facts.started_on,
                         "finishedOn": facts.finished_on},
            "byproducts": byproducts,
        },
    }
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def envelope_bytes(stmt: dict[str, Any], signer: SigningKey | None) -> bytes:
    """The stored DSSE envelope: the statement's canonical JSON, signed by ``signer`` (none without one)."""
    payload = canonical_json(stmt)
    sigs = []
    if signer is not None:
        sig = signer.sign(pae(PAYLOAD_TYPE, payload))
        sigs.append({"keyid": sig["key_id"], "sig": sig["sig"]})
    return canonical_json({"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                           "signatures": sigs})


def write_provenance(store: Store, artifact_id: str, body: bytes, manifest: Manifest, facts: BuildFacts,
                     signer: SigningKey | None) -> bool:
    """Store the artifact's provenance create-only; False when it already has one (the first
    build of these bytes wrote it, and it stays)."""
    return store.put_bytes(provenance_key(artifact_id), envelope_bytes(statement(artifact_id, body, manifest, facts), signer))


@dataclass(frozen=True)
class StoredProvenance:
    """A provenance envelope as stored, and the statement it carries."""

    envelope: DsseEnvelope
    payload: bytes
    statement: dict[str, Any]

    def signed_at(self) -> str | None:
        when = _at(self.statement, "predicate", "runDetails", "metadata", "finishedOn")
        return when if isinstance(when, str) else None

    def build_seconds(self) -> float | None:
        """How long the build ran (``finishedOn - startedOn``); None when either is missing or unreadable."""
        started = _at(self.statement, "predicate", "runDetails", "metadata", "startedOn")
        finished = _at(self.statement, "predicate", "runDetails", "metadata", "finishedOn")
        try:
            return (parse_utc(finished) - parse_utc(started)).total_seconds()
        except (TypeError, ValueError):
            return None


def read_provenance(store: Store, artifact_id: str) -> StoredProvenance | None:
    """The artifact's provenance; None when it has none. A stored envelope that is not a DSSE
    envelope carrying an in-toto statement raises :class:`CorruptObjectError`."""
    key = provenance_key(artifact_id)
    try:
        raw = store.get_bytes(key)
    except KeyNotFoundError:
        return None
    try:
        env = DsseEnvelope.model_validate_json(raw)
        payload = base64.b64decode(env.payload, validate=True)
        stmt = json.loads(payload)
    except (ValidationError, ValueError) as err:
        raise CorruptObjectError(key, f"not a DSSE envelope with a JSON payload: {str(err).splitlines()[0]}") from None
    if env.payloadType != PAYLOAD_TYPE or not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise CorruptObjectError(key, f"not an in-toto Statement v1 ({PAYLOAD_TYPE})")
    return StoredProvenance(env, payload, stmt)


def verify_provenance_signature(store: Store, artifact_id: str, prov: StoredProvenance, trusted: TrustedKeys) -> str:
    """The trusted, unrevoked builder key whose DSSE signature over the provenance verifies; raises
    :class:`SignatureError` when none does."""
    errors = []
    for s in prov.envelope.signatures:
        try:
            return verify_signature(f"provenance of {artifact_id}", pae(prov.envelope.payloadType, prov.payload),
                                    {"key_id": s.keyid, "sig": s.sig}, with_revocations(store, trusted), "builder",
                                    signed_at=prov.signed_at())
        except SignatureError as err:
            errors.append(err.detail)
    raise SignatureError(f"provenance of {artifact_id}", "; ".join(errors) or "unsigned")


def _at(obj: Any, *path: str | int) -> Any:
    """``obj[path[0]][path[1]]...``, or None where the statement has another shape (a signed
    statement is still input: a malformed one is refused, never a crash)."""
    for step in path:
        if isinstance(step, int):
            obj = obj[step] if isinstance(obj, list) and 0 <= step < len(obj) else None
        else:
            obj = obj.get(step) if isinstance(obj, dict) else None
    return obj


def _dep(stmt: dict[str, Any], name: str) -> dict[str, Any] | None:
    deps = _at(stmt, "predicate", "buildDefinition", "resolvedDependencies")
    return next((d for d in deps if isinstance(d, dict) and d.get("name") == name), None) if isinstance(deps, list) else None


def provenance_refusals(store: Store, artifact_id: str, manifest: Manifest, auth: Authority,
                        expected: ExpectedInputs) -> list[str]:
    """Why a production channel refuses the artifact's provenance (empty: it passes): none stored,
    not signed by a trusted builder key (when keys are trusted), a subject that is not these
    manifest bytes, or inputs other than the manifest's and the promoter's profile."""
    try:
        prov = read_provenance(store, artifact_id)
    except CorruptObjectError as err:
        return [f"provenance: {err}"]
    if prov is None:
        return [f"no build provenance ({provenance_key(artifact_id)}): only a build writes one; an imported or "
                "pre-provenance artifact reaches production by --force --reason"]
    reasons = []
    if auth.trusted is not None:
        try:
            verify_provenance_signature(store, artifact_id, prov, auth.trusted)
        except SignatureError as err:
            reasons.append(f"provenance signature: {err.detail}")
    stmt = prov.statement
    if stmt.get("predicateType") != PREDICATE_TYPE:
        reasons.append(f"provenance predicate is {stmt.get('predicateType')!r}, not SLSA Provenance v1")
    name, blake3 = _at(stmt, "subject", 0, "name"), _at(stmt, "subject", 0, "digest", "blake3")
    now = manifest_blake3(store, artifact_id)
    if name != artifact_id or now is None or blake3 != now.split(":", 1)[1]:
        reasons.append(f"provenance subject {name!r} ({blake3}) is not the manifest bytes "
                       f"{manifest_key(artifact_id)} ({now})")
    built_for = _at(stmt, "predicate", "buildDefinition", "externalParameters", "profile")
    if built_for != expected.profile_name:
        reasons.append(f"provenance was built for profile {built_for!r}, the channel serves {expected.profile_name!r}")
    got = _at(_dep(stmt, "profile"), "digest", "xxh3_128")
    wants = {expected.profile_hash: "the promoter's profile"}
    wants.setdefault(manifest.profile_hash, "the manifest")
    for want, whose in wants.items():
        if got != hex_of(want):
            reasons.append(f"provenance profile digest {got} is not {whose}'s build hash {want}")
    if manifest.model_digest is not None:  # an import names none: nothing to hold the provenance's model to
        model = _at(_dep(stmt, "model"), "digest", "xxh3_128")
        if model != hex_of(manifest.model_digest):
            reasons.append(f"provenance model digest {model} is not the manifest's {manifest.model_digest}")
    calib = _dep(stmt, "calibration")
    uri, samples = _at(calib, "uri"), _at(calib, "annotations", "samples")
    if expected.calibration_uri is None and calib is not None:
        reasons.append(f"provenance names a calibration set ({uri}) the profile does not")
    elif expected.calibration_uri is not None and (calib is None or uri != expected.calibration_uri
                                                   or samples != expected.calibration_size):
        reasons.append(f"provenance calibration {None if calib is None else (uri, samples)} is not the profile's "
                       f"({expected.calibration_uri}, {expected.calibration_size} samples)")
    return reasons
