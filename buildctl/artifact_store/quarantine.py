"""Quarantine: a create-only, append-only record under an artifact that takes it out of service.

A quarantined artifact is never a build-cache hit, never promoted and never pulled, even while a
channel still points at it. Every place that finds an artifact's stored bytes wrong writes a
quarantine record (``verify --deep``, promote, the cache check, validation, scrub); a repair that
restores every blob writes a ``lift`` record. The artifact's state is its newest record.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, ValidationError

from buildctl.core.records import Record
from buildctl.core.digest import PREFIX as DIGEST_PREFIX, canonical_json, digest_bytes
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.trust.binding import manifest_blake3
from buildctl.artifact_store.errors import CorruptObjectError, QuarantinedError, StoreUnavailableError
from buildctl.artifact_store.layout import QUARANTINE, quarantine_key, quarantine_prefix
from buildctl.core.times import utc_now
from buildctl.artifact_store.trust.authority import Authority
from buildctl.artifact_store.trust.signing import SigningKey


class QuarantineRecord(Record):
    """One quarantine or lift of an artifact."""

    artifact_id: str = Field(..., description="The artifact.")
    manifest_blake3: str | None = Field(None, description="BLAKE3-256 of the artifact's manifest bytes when they hashed to its id at the time (absent: a damaged or missing manifest, or a record written before BLAKE3).")
    action: Literal["quarantine", "lift"] = Field(..., description="quarantine takes it out of service; lift restores it.")
    reason: str = Field(..., description="Why, in words (what detected it, or how it was repaired).")
    problems: tuple[str, ...] = Field((), description="Each bad file, as verify reported it.")
    who: str = Field(..., description="user@host, the CI identity, or the flow that wrote it.")
    when: str = Field(..., description="UTC ISO-8601 time.")
    signature: dict[str, str] | None = Field(None, description="Ed25519 signature over the record without this field.")

    def body(self) -> dict:
        """The stored form; an unset ``manifest_blake3`` is left out, as in records written before it."""
        return self.model_dump(mode="json", exclude={"manifest_blake3"} if self.manifest_blake3 is None else None)

    def signed_bytes(self) -> bytes:
        d = self.body()
        d.pop("signature", None)
        return canonical_json(d)


def _write(store: Store, rec: QuarantineRecord, signer: SigningKey | None) -> tuple[QuarantineRecord, str]:
    rec = rec.model_copy(update={"manifest_blake3": manifest_blake3(store, rec.artifact_id)})
    if signer is not None:
        rec = rec.model_copy(update={"signature": signer.sign(rec.signed_bytes())})
    body = canonical_json(rec.body())
    key = quarantine_key(rec.artifact_id, rec.when, digest_bytes(body))
    store.put_bytes(key, body)
    return rec, key


MALFORMED = "malformed quarantine record"


def quarantine_records(store: Store, artifact_id: str,
                       skipped: list[tuple[str, str]] | None = None) -> list[tuple[str, QuarantineRecord]]:
    """Every record of the artifact with its key, oldest first. A malformed one raises
    :class:`CorruptObjectError`; with ``skipped`` (store-wide commands) it is appended there as
    ``(key, why)`` and stands in the list as a quarantine (:func:`unreadable_record`): an artifact
    whose quarantine history cannot be read is treated as quarantined, never as clean."""
    return _read_records(store, artifact_id, list(store.list(quarantine_prefix(artifact_id))), skipped)


def _read_records(store: Store, artifact_id: str, keys: list[str],
                  skipped: list[tuple[str, str]] | None) -> list[tuple[str, QuarantineRecord]]:
    out, unreadable = [], []
    for key in keys:
        try:
            out.append((key, QuarantineRecord.model_validate(json.loads(store.get_bytes(key)))))
        except (ValueError, ValidationError):
            if skipped is None:
                raise CorruptObjectError(key, MALFORMED) from None
            skipped.append((key, MALFORMED))
            unreadable.append((key, unreadable_record(artifact_id)))
    return out + unreadable  # last: an unreadable record decides, wherever it sorted


def quarantine_records_by_artifact(store: Store, skipped: list[tuple[str, str]] | None = None,
                                   ) -> dict[str, list[tuple[str, QuarantineRecord]]]:
    """:func:`quarantine_records` for every artifact that has any, from one listing of
    ``quarantine/`` (gc: not one listing per artifact). Keyed by the artifact id."""
    by_hex: dict[str, list[str]] = {}
    for key in store.list(QUARANTINE):
        by_hex.setdefault(key[len(QUARANTINE):].split("/", 1)[0], []).append(key)
    out = {}
    for hexid, keys in by_hex.items():
        artifact_id = f"{DIGEST_PREFIX}{hexid}"
        out[artifact_id] = _read_records(store, artifact_id, keys, skipped)
    return out


def unreadable_record(artifact_id: str) -> QuarantineRecord:
    """What stands for a malformed quarantine record: a quarantine, dated now (so gc's forensic
    retention keeps the artifact until the record is fixed)."""
    return QuarantineRecord(artifact_id=artifact_id, action="quarantine", who="buildctl", when=utc_now(),
                            reason=f"{MALFORMED}: treated as quarantined until it is fixed")


def active_of(records: list[tuple[str, QuarantineRecord]]) -> tuple[str, QuarantineRecord] | None:
    """Of an artifact's records (oldest first), the one that quarantines it now: the newest, if
    that is a quarantine."""
    if records and records[-1][1].action == "quarantine":
        return records[-1]
    return None


def active_quarantine(store: Store, artifact_id: str,
                      skipped: list[tuple[str, str]] | None = None) -> tuple[str, QuarantineRecord] | None:
    """The record that quarantines the artifact now, if any (``skipped``: see :func:`quarantine_records`)."""
    return active_of(quarantine_records(store, artifact_id, skipped))


def check_not_quarantined(store: Store, artifact_id: str, what: str = "refusing it") -> None:
    """Raise :class:`QuarantinedError` (exit 5) naming the record when the artifact is quarantined."""
    active = active_quarantine(store, artifact_id)
    if active is not None:
        raise QuarantinedError(artifact_id, active[0], active[1].reason, what)


def quarantine(store: Store, artifact_id: str, reason: str, *, problems: tuple[str, ...] | list[str] = (),
               auth: Authority) -> tuple[str, QuarantineRecord]:
    """Quarantine the artifact (a no-op returning the active record when it already is)."""
    active = active_quarantine(store, artifact_id)
    if active is not None:
        return active
    rec, key = _write(store, QuarantineRecord(artifact_id=artifact_id, action="quarantine", reason=reason,
                                              problems=tuple(problems), who=auth.who, when=utc_now()), auth.signer)
    return key, rec


def try_quarantine(store: Store, artifact_id: str, reason: str, *, problems: tuple[str, ...] | list[str] = (),
                   auth: Authority) -> str | None:
    """Quarantine where this caller may write; a read-only caller (a node) gets ``None`` back and
    reports instead. Returns the record's key."""
    try:
        return quarantine(store, artifact_id, reason, problems=problems, auth=auth)[0]
    except StoreUnavailableError:
        return None


def lift(store: Store, artifact_id: str, reason: str, *, auth: Authority) -> tuple[str, QuarantineRecord] | None:
    """Lift an active quarantine with a record; ``None`` when the artifact was not quarantined."""
    if active_quarantine(store, artifact_id) is None:
        return None
    rec, key = _write(store, QuarantineRecord(artifact_id=artifact_id, action="lift", reason=reason, who=auth.who,
                                              when=utc_now()), auth.signer)
    return key, rec
