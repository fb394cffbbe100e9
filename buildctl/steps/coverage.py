"""Coverage: which hosts an artifact is validated for, and the key it serves under.

An artifact's passing attestation records the validating host's whole fingerprint, so the artifact
is *covered* for that host's soft values (:mod:`buildctl.engines.compat`): a host with the same
compat key and the same soft values may serve it without a re-check. A host whose soft values
differ re-checks the bytes (preflight, parity and speed) before anything is rebuilt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from buildctl.artifact_store.trust.attestations import list_attestations
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.read import list_artifacts
from buildctl.engines.compat import differences
from buildctl.engines.errors import FingerprintError
from buildctl.engines.fingerprint import Fingerprint, parse_fingerprint
from buildctl.engines.profile import BuildProfile


def built_on(manifest: Manifest) -> Fingerprint | None:
    """The fingerprint an artifact was built on, as its manifest records it (None: unreadable)."""
    try:
        return parse_fingerprint(manifest.fingerprint, f"manifest of {manifest.profile_name}")
    except FingerprintError:
        return None


def serving_key(manifest: Manifest) -> str:
    """The compat key an artifact serves under now: its build fingerprint's key. It differs from
    the manifest's own only for an artifact published under a schema-1 key."""
    fp = built_on(manifest)
    return fp.compat_key(manifest.backend) if fp is not None else manifest.compat_key


# --- coverage: which soft values an artifact passed validation on ------------------------------


@dataclass
class Coverage:
    """Whether an artifact is validated for a host's soft values: a passing attestation made on a
    host with the same compat key and the same soft values covers it."""

    artifact_id: str
    compat_key: str
    covered: bool
    attestation_id: str | None  # the newest covering attestation
    soft: dict  # the host's soft values
    validated_on: list[dict]  # the soft values of every passing attestation under the key
    floor_problems: list[str]
    differences: dict  # soft value -> (host's, nearest validated) when not covered

    def to_json(self) -> dict:
        """What ``pull --json`` and ``upgrade plan --json`` print of it."""
        return {"artifact_id": self.artifact_id, "compat_key": self.compat_key, "covered": self.covered,
                "attestation_id": self.attestation_id, "soft": self.soft, "validated_on": self.validated_on,
                "floor_problems": self.floor_problems,
                "differences": {k: list(v) for k, v in self.differences.items()}}

    def describe(self) -> str:
        if self.covered:
            return f"covered by attestation {self.attestation_id}"
        if not self.validated_on:
            return "no passing validation under this compat key"
        return "not validated on " + ", ".join(f"{k}={v[0]}" for k, v in self.differences.items())


def coverage(store: Store, artifact_id: str, manifest: Manifest, fingerprint: Fingerprint) -> Coverage:
    """Whether the artifact is validated on ``fingerprint``'s soft values: the newest attestation
    made on a host with its compat key and those soft values passed (a later failure on the same
    values, a regression found by a re-validation, uncovers them again)."""
    backend = manifest.backend
    key = fingerprint.compat_key(backend)
    soft = fingerprint.soft_fields(backend)
    newest: dict[str, tuple[str, bool, dict]] = {}  # soft values -> the newest attestation on them
    for stored in list_attestations(store, artifact_id):  # oldest first
        try:
            on = parse_fingerprint(stored.attestation.validator_fingerprint, f"attestation {stored.attestation_id}")
        except FingerprintError:
            continue  # a record without the validating host's fingerprint covers nothing
        if on.compat_key(backend) == key:
            values = on.soft_fields(backend)
            newest[json.dumps(values, sort_keys=True)] = (stored.attestation_id, stored.attestation.passed, values)
    validated = [(aid, values) for aid, passed, values in newest.values() if passed]
    covering = [aid for aid, values in validated if values == soft]
    nearest = min((v for _, v in validated), key=lambda v: len(differences(soft, v)), default=None)
    return Coverage(artifact_id, key, bool(covering), covering[-1] if covering else None, soft,
                    [v for _, v in validated], fingerprint.floor_problems(backend, manifest.fingerprint),
                    differences(soft, nearest) if nearest is not None and not covering else {})


#: A list value longer than this (the CPU's feature flags) is shown by its length and a digest.
SHOWN_LIST = 4


def _soft_value(v: object) -> str:
    if not isinstance(v, list):
        return str(v)
    if len(v) <= SHOWN_LIST:
        return ",".join(map(str, v))
    from buildctl.core.digest import canonical_json, digest_bytes

    return f"[{len(v)} values, {digest_bytes(canonical_json(sorted(map(str, v)))).split(':', 1)[1][:8]}]"


def describe_soft(soft: dict) -> str:
    """A host's soft values in one line: ``driver_version=590.44.01, cuda_version=13.1``. A long
    list (21 CPU flags) is its length and a digest of its values, so two sets still read apart
    and the line fits a summary; ``fingerprint --json`` has every value."""
    return ", ".join(f"{k}={_soft_value(v)}" for k, v in soft.items()) or "no soft fields"


def recheck_outcome(store: Store, profile: BuildProfile, artifact_id: str, fingerprint: Fingerprint,
                    seconds: float | None = None) -> str:
    """What a re-check of ``artifact_id`` for this host came to, read back from the store: the
    line the driver-upgrade flow's summary gives."""
    soft = fingerprint.soft_fields(profile.engine.backend)
    took = f" ({seconds:.0f} s)" if seconds is not None else ""
    found = artifacts_for_key(store, profile, fingerprint.compat_key(profile.engine.backend))
    mine = next((m for aid, m in found if aid == artifact_id), None)
    if mine is not None and coverage(store, artifact_id, mine, fingerprint).covered:
        return f"re-checked on {describe_soft(soft)}, no rebuild{took}"
    failed = [a.attestation for a in list_attestations(store, artifact_id) if not a.attestation.passed]
    why = "; ".join(failed[-1].reasons) if failed and failed[-1].reasons else "it did not pass here"
    newer = next((aid for aid, m in found if aid != artifact_id and coverage(store, aid, m, fingerprint).covered), None)
    if newer is not None:
        return f"re-check failed ({why}): rebuilt as {newer}{took}"
    return f"re-check did not cover {describe_soft(soft)}{took}: {why}"


def artifacts_for_key(store: Store, profile: BuildProfile, compat_key: str) -> list[tuple[str, Manifest]]:
    """The unquarantined artifacts of ``profile``'s current build hash that serve under
    ``compat_key``, newest first (whatever key their manifests were published under)."""
    return [(aid, m) for aid, m in list_artifacts(store, profile.name)
            if m.profile_hash == profile.build_hash() and serving_key(m) == compat_key
            and active_quarantine(store, aid) is None]


def recheck_needs(store: Store, fingerprint: Fingerprint, profiles: dict[str, BuildProfile]) -> list[tuple[str, str, str]]:
    """(profile, compat key, artifact) for each profile whose newest artifact for this host's key
    is not validated on its soft values: what to re-check before any rebuild. A profile with no
    artifact for the key is a build, not a re-check, and is not listed."""
    out = []
    for name, profile in sorted(profiles.items()):
        key = fingerprint.compat_key(profile.engine.backend)
        found = artifacts_for_key(store, profile, key)
        if found and not any(coverage(store, aid, m, fingerprint).covered for aid, m in found):
            out.append((name, key, found[0][0]))
    return out
