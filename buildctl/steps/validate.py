"""Validation steps: validate an artifact against the vLLM reference, and find a passing attestation
that a later step may reuse.
"""

from __future__ import annotations

from pathlib import Path

from buildctl.engines.backend import Runner
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import profile_path
from buildctl.steps.coverage import coverage
from typing import Callable

from buildctl.steps.context import Context, Say, quiet
from buildctl.artifact_store.trust.attestations import StoredAttestation, latest_attestation, list_attestations
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.upkeep.integrity import verify_recent_or_quarantine
from buildctl.artifact_store.read import get_manifest, resolve_artifact
from buildctl.core.errors import BadInputError
from buildctl.steps.fallback import preferred_validations
from buildctl.steps.profiles import find_profile, resolve_model


# --- validation ------------------------------------------------------------------------------


def validate(ctx: Context, artifact_ref: str, *, profile_path: str | Path | None = None,
             prompts_file: str | Path | None = None, reference: Runner | None = None,
             wrap_candidate: Callable[[Runner], Runner] | None = None, speed_budget: float = 1.0, say: Say = quiet):
    """Validate one artifact on this host (``ctx.fingerprint``) against vLLM and store the attestation (see
    :func:`buildctl.validators.validate.run_validation`). Resolves the artifact's profile and
    model first. A failing verdict raises ``ValidationFailedError`` after the attestation is written
    (``ValidationInconclusiveError`` when the speed gate could not decide within its budget, which
    ``speed_budget`` scales)."""
    from buildctl.validators.validate import ValidationPlan, run_validation

    settings, store = ctx.settings, ctx.store
    artifact_id = resolve_artifact(store, artifact_ref)
    manifest = get_manifest(store, artifact_id)
    profile = find_profile(settings, manifest.profile_name, manifest.profile_hash, profile_path)
    try:
        preferred = preferred_validations(ctx, profile.name)
    except BadInputError as err:  # a malformed served-model file: validate, without the cross-runtime record
        say(f"warning: no cross-runtime parity recorded: {str(err).splitlines()[0]}")
        preferred = ()
    plan = ValidationPlan(artifact_id=artifact_id, profile=profile, model_dir=resolve_model(settings, profile),
                          fingerprint=ctx.fingerprint, prompts_file=prompts_file, speed_budget=speed_budget,
                          preferred=preferred)
    return run_validation(settings, store, plan, auth=ctx.auth, reference=reference, wrap_candidate=wrap_candidate,
                          say=say)


def passing_attestation(store: Store, artifact_id: str, compat_key: str) -> StoredAttestation | None:
    """The newest attestation of the artifact for ``compat_key`` (or for the manifest's own key,
    a schema-1 one whose hosts the new key includes), if it passed."""
    keys = {compat_key, get_manifest(store, artifact_id).compat_key}
    stored = latest_attestation(store, artifact_id, keys)
    return stored if stored is not None and stored.attestation.passed else None


def reusable_attestation(ctx: Context, artifact_id: str, compat_key: str,
                         fingerprint: Fingerprint | None = None) -> StoredAttestation | None:
    """A passing attestation that lets validation be skipped: the same bytes were judged on a host
    with this compat key and, with ``fingerprint``, the same soft values (else validation runs: a
    re-check), and the bytes are still those (a deep verify within the settings' window, or now; a
    mismatch quarantines the artifact and raises)."""
    if fingerprint is None:
        stored = passing_attestation(ctx.store, artifact_id, compat_key)
    else:
        cov = coverage(ctx.store, artifact_id, get_manifest(ctx.store, artifact_id), fingerprint)
        stored = next((a for a in list_attestations(ctx.store, artifact_id) if a.attestation_id == cov.attestation_id),
                      None) if cov.covered else None
    if stored is not None:
        verify_recent_or_quarantine(ctx.store, artifact_id, detector="validation skip check", auth=ctx.auth)
    return stored
