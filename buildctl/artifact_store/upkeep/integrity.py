"""Deep checks at the gates: re-hash every blob, quarantine on a mismatch, remember a pass.

``verify_deep_or_quarantine`` re-hashes an artifact's blobs from the store; a mismatch writes a quarantine
record (where the caller may write) and raises :class:`VerificationError` naming every bad file.
A pass writes a verification record, so a gate within a time window of it (``verify_recent_or_quarantine``)
can trust it instead of reading every byte again.
"""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import canonical_json, digest_bytes
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.errors import StoreUnavailableError, VerificationError
from buildctl.artifact_store.layout import verification_key, verification_prefix
from buildctl.artifact_store.manifest import Manifest
from buildctl.core.times import now_utc, parse_utc, utc_now
from buildctl.artifact_store.quarantine import check_not_quarantined, try_quarantine
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.read import verify

class VerificationRecord(Record):
    """A deep verify that passed: every blob re-hashed from the store matched the manifest."""

    artifact_id: str = Field(..., description="The artifact.")
    files: int = Field(..., ge=0, description="Files re-hashed.")
    bytes: int = Field(..., ge=0, description="Bytes re-hashed.")
    who: str = Field(..., description="Who verified.")
    when: str = Field(..., description="UTC ISO-8601 time the verify finished.")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")


def record_verification(store: Store, artifact_id: str, manifest: Manifest, *, auth: Authority) -> VerificationRecord:
    """Write a verification record where this caller may write (a read-only node cannot; then the
    record is returned unwritten)."""
    rec = VerificationRecord(artifact_id=artifact_id, files=len(manifest.files), bytes=manifest.total_size, who=auth.who,
                             when=utc_now())
    if auth.signer is not None:
        rec = rec.model_copy(update={"signature": auth.signer.sign(canonical_json(rec.model_dump(mode="json")))})
    body = canonical_json(rec.model_dump(mode="json"))
    try:
        store.put_bytes(verification_key(artifact_id, rec.when, digest_bytes(body)), body)
    except StoreUnavailableError:
        pass
    return rec


def last_verification(store: Store, artifact_id: str) -> VerificationRecord | None:
    """The newest verification record of the artifact (keys sort by time)."""
    keys = list(store.list(verification_prefix(artifact_id)))
    for key in reversed(keys):
        try:
            return VerificationRecord.model_validate(json.loads(store.get_bytes(key)))
        except (ValueError, ValidationError):
            continue  # a malformed record is no evidence; an older one may still be
    return None


def quarantine_on(store: Store, err: VerificationError, *, detector: str, auth: Authority) -> VerificationError:
    """Quarantine the artifact ``err`` found bad in the store (where the caller may write); returns
    the error to raise, naming the record."""
    problems = [p.render() for p in err.problems]
    key = try_quarantine(store, err.artifact, f"{detector}: {len(problems)} bad file(s) in the store",
                         problems=problems, auth=auth)
    return VerificationError(err.artifact, err.problems, quarantine_key=key)


def _checked(store: Store, artifact_id: str, *, deep: bool, detector: str, auth: Authority,
             on_bytes: ProgressFn | None = None) -> Manifest:
    try:
        return verify(store, artifact_id, deep=deep, on_bytes=on_bytes)
    except VerificationError as err:
        raise quarantine_on(store, err, detector=detector, auth=auth) from None


def verify_deep_or_quarantine(store: Store, artifact_id: str, *, detector: str, auth: Authority = Authority(),
                              on_bytes: ProgressFn | None = None) -> tuple[Manifest, VerificationRecord]:
    """Re-hash every blob. On a mismatch, quarantine (reason: ``detector`` and the bad files) and
    raise :class:`VerificationError` naming each bad file and the record. On a pass, record it."""
    manifest = _checked(store, artifact_id, deep=True, detector=detector, auth=auth, on_bytes=on_bytes)
    return manifest, record_verification(store, artifact_id, manifest, auth=auth)


def verify_recent_or_quarantine(store: Store, artifact_id: str, *, detector: str, auth: Authority = Authority(),
                                window_s: float | None = None, now: datetime | None = None) -> str:
    """The gate: refuse a quarantined artifact; trust a deep verify newer than ``window_s``
    (default: ``auth``'s verify window) after a cheap check that every blob is there with its
    size, else run one. Returns the time of the deep verify relied on."""
    window_s = auth.verify_window_s if window_s is None else window_s
    check_not_quarantined(store, artifact_id)
    if window_s > 0:
        rec = last_verification(store, artifact_id)
        now = now or now_utc()
        if rec is not None and (now - parse_utc(rec.when)).total_seconds() <= window_s:
            _checked(store, artifact_id, deep=False, detector=detector, auth=auth)
            return rec.when
    return verify_deep_or_quarantine(store, artifact_id, detector=detector, auth=auth)[1].when
