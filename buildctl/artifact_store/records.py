"""Every kind of small record the store keeps, and one check that reads them all.

Store-wide commands pass over a malformed record of the kinds they read and name it (exit 10);
a record of a kind they never read (a touch, a verification, a revocation) would pass unseen.
``scrub`` therefore reads every record of every kind with :func:`check_records` and names each
one that its schema refuses, or whose create-only name no longer carries the digest of its bytes.
Manifests are checked apart (``scrub`` restores them from their copies).
"""

from __future__ import annotations

from typing import Callable

from pydantic import ValidationError

from buildctl.core.digest import digest_bytes
from buildctl.artifact_store.trust.attestations import parse_attestation
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import ChannelRecord
from buildctl.artifact_store.errors import CorruptObjectError, KeyNotFoundError
from buildctl.artifact_store.grace import Touch
from buildctl.artifact_store.upkeep.integrity import VerificationRecord
from buildctl.artifact_store.fleet.inventory import NodeRecord
from buildctl.artifact_store.layout import (
    ATTESTATIONS,
    CHANNELS,
    HISTORY,
    NODES,
    PENDING,
    QUARANTINE,
    REVOCATIONS,
    TOUCHES,
    VERIFICATIONS,
    timed_record_names_its_bytes,
)
from buildctl.artifact_store.quarantine import QuarantineRecord
from buildctl.artifact_store.trust.revocation import Revocation


def _model(model: type) -> Callable[[bytes, str], object]:
    def parse(body: bytes, key: str) -> None:
        model.model_validate_json(body)
    return parse


def _timed(model: type) -> Callable[[bytes, str], object]:
    """A create-only record whose key carries the digest of its bytes."""
    def parse(body: bytes, key: str) -> None:
        if not timed_record_names_its_bytes(key, digest_bytes(body)):
            raise CorruptObjectError(key, "its bytes do not match its name")
        model.model_validate_json(body)
    return parse


#: (kind, key prefix, parser); mutable records (refs) are read with ``get_ref``.
KINDS: tuple[tuple[str, str, Callable[[bytes, str], object], bool], ...] = (
    ("channel ref", CHANNELS, _model(ChannelRecord), True),
    ("history", HISTORY, _model(ChannelRecord), False),
    ("pending", PENDING, _model(ChannelRecord), True),
    ("quarantine", QUARANTINE, _timed(QuarantineRecord), False),
    ("verification", VERIFICATIONS, _timed(VerificationRecord), False),
    ("attestation", ATTESTATIONS, parse_attestation, False),
    ("touch", TOUCHES, _model(Touch), True),
    ("inventory", NODES, _model(NodeRecord), True),
    ("revocation", REVOCATIONS, _timed(Revocation), False),
)


def check_records(store: Store, skipped: list[tuple[str, str]]) -> int:
    """Read every record of every kind; append ``(key, why)`` to ``skipped`` for each malformed one
    (unless already there). Returns how many records were read. One GET per record: on S3 this is
    proportional to the records, as scrub's re-hash is to the bytes."""
    named = {k for k, _ in skipped}
    read = 0
    for kind, prefix, parse, mutable in KINDS:
        for key in store.list(prefix):
            try:
                if mutable:
                    got = store.get_ref(key)
                    if got is None:
                        continue  # deleted since the listing
                    body = got[0]
                else:
                    body = store.get_bytes(key)
            except KeyNotFoundError:
                continue
            read += 1
            try:
                parse(body, key)
            except CorruptObjectError as err:
                why = f"malformed {kind} record: {err.detail}"
            except (ValueError, ValidationError) as err:  # ValidationError is a ValueError; both named
                why = f"malformed {kind} record: {str(err).splitlines()[0]}"
            else:
                continue
            if key not in named:
                named.add(key)
                skipped.append((key, why))
    return read
