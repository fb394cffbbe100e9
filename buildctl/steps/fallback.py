"""Fallback runtimes of served models: what a fallback's validation is compared with, and the
check a node makes before it runs a fallback.

A fallback runtime (a vLLM bundle, say) may serve a model in place of its preferred runtime (an
engine) only when both were validated against the same vLLM reference: the same checkpoint, the
same parity prompts and the same reference outputs, each in parity with them. The fallback's
validation records that comparison in its attestation (``cross_runtime``,
:func:`preferred_validations` finds what to compare with); a node re-reads the preferred
attestation it names and recomputes the comparison (:func:`fallback_refusal`) before it installs
the fallback.
"""

from __future__ import annotations

from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import ChannelRecord
from buildctl.artifact_store.errors import SignatureError
from buildctl.artifact_store.layout import attestation_prefix
from buildctl.artifact_store.quarantine import active_quarantine
from buildctl.artifact_store.read import artifacts_built_from, get_manifest
from buildctl.artifact_store.trust.attestations import (
    StoredAttestation,
    latest_attestation,
    list_attestations,
    parity_basis_differences,
    parse_attestation,
    recomputed_verdict,
)
from buildctl.artifact_store.trust.revocation import with_revocations
from buildctl.artifact_store.trust.signing import verify_signature
from buildctl.core.errors import BuildctlError
from buildctl.engines.served import ServedModel
from buildctl.steps.context import Context
from buildctl.steps.profiles import profile_by_name, served_models
from buildctl.validators.validate import PreferredValidation

# The newest preferred validations a fallback's validation is compared with, per served model.
MAX_PREFERRED = 8


def preferred_validations(ctx: Context, profile: str) -> tuple[PreferredValidation, ...]:
    """For every served model in which ``profile`` is a fallback: the newest passing validations
    of its preferred runtime (artifacts built from the preferred profile as it is now, not
    quarantined), newest first. None when the profile is no fallback or the models directory does
    not exist."""
    out: list[PreferredValidation] = []
    for model in served_models(ctx.settings):
        if profile not in model.runtimes[1:]:
            continue
        pref = profile_by_name(ctx.settings, model.preferred)
        found: list[PreferredValidation] = []
        for aid, _ in artifacts_built_from(ctx.store, pref.name, pref.build_hash()):
            if active_quarantine(ctx.store, aid) is not None:
                continue
            for stored in reversed(list_attestations(ctx.store, aid)):
                if stored.attestation.passed and recomputed_verdict(stored.attestation)[0] == "pass":
                    found.append(PreferredValidation(model=model.name, profile=pref.name, artifact_id=aid,
                                                     key=stored.key, attestation=stored.attestation))
                    break
            if len(found) >= MAX_PREFERRED:
                break
        out += found
    return tuple(out)


def _signed(ctx: Context, what: str, stored: StoredAttestation) -> str | None:
    """Why ``stored`` is not signed by a trusted, unrevoked validator key (None: it is, or no keys are trusted)."""
    if ctx.auth.trusted is None:
        return None
    try:
        verify_signature(what, stored.signed_bytes, stored.attestation.signature,
                         with_revocations(ctx.store, ctx.auth.trusted), "validator",
                         signed_at=stored.attestation.created_at)
    except SignatureError as err:
        return f"{what}: {err.detail}"
    return None


def fallback_refusal(ctx: Context, model: ServedModel, record: ChannelRecord, artifact_id: str) -> str | None:
    """Why this node must not run ``artifact_id`` (a fallback runtime's artifact from ``record``)
    for ``model`` (None: it may). Its newest attestation for the record's compat key must pass and
    record parity with the model's preferred runtime; the preferred attestation it names is read
    again (its bytes must match its key) and the comparison recomputed; with trusted keys both
    must be signed by a validator key."""
    store: Store = ctx.store
    keys = {record.compat_key, get_manifest(store, artifact_id).compat_key}
    fallback = latest_attestation(store, artifact_id, keys)
    if fallback is None or not fallback.attestation.passed:
        return f"no passing attestation of {artifact_id} for compat key {record.compat_key}"
    bad = _signed(ctx, f"attestation of {artifact_id}", fallback)
    if bad:
        return bad
    records = [c for c in fallback.attestation.cross_runtime or () if c.preferred_profile == model.preferred]
    if not records:
        return (f"its attestation records no parity with {model.preferred} (validate {artifact_id} again once "
                f"{model.preferred} has a passing validation)")
    why: list[str] = []
    for c in records:
        if not c.preferred_attestation.startswith(attestation_prefix(c.preferred_artifact)):
            why.append(f"{c.preferred_attestation} is not an attestation of {c.preferred_artifact}")
            continue
        try:
            pref = parse_attestation(store.get_bytes(c.preferred_attestation), c.preferred_attestation)
        except BuildctlError as err:
            why.append(f"the preferred attestation {c.preferred_attestation} cannot be read: {str(err).splitlines()[0]}")
            continue
        bad = _signed(ctx, f"attestation of {c.preferred_artifact}", pref)
        if bad:
            why.append(bad)
            continue
        diffs = parity_basis_differences(pref.attestation, fallback.attestation)
        if not diffs and pref.attestation.profile.name == model.preferred:
            return None
        why.append("; ".join(diffs) or f"{c.preferred_attestation} validated {pref.attestation.profile.name}, "
                                       f"not {model.preferred}")
    return f"no cross-runtime parity with {model.preferred}: " + " | ".join(why)
