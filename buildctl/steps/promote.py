"""Promotion steps: the gates a channel move passes (provenance for the protected channels, a known
channel name), signed and attributed as the settings say.
"""

from __future__ import annotations


from buildctl.engines.profile import load_profile
from buildctl.steps.coverage import serving_key
from buildctl.steps.context import Context
from buildctl.core.errors import BuildctlError
from buildctl.core.settings import Settings
from buildctl.artifact_store.backends.store import Store
from buildctl.artifact_store.channels import ChannelMove, ChannelRecord
from buildctl.artifact_store import promotion
from buildctl.artifact_store.promotion import PROTECTED_CHANNELS
from buildctl.artifact_store.errors import StoreArgumentError, UnknownChannelError
from buildctl.artifact_store.layout import CHANNELS
from buildctl.artifact_store.manifest import Manifest
from buildctl.artifact_store.trust.provenance import ExpectedInputs
from buildctl.artifact_store.fleet.waves import RolloutPlan
from buildctl.artifact_store.read import get_manifest, resolve_artifact
from buildctl.steps.profiles import profile_file


# --- promotion and pull ----------------------------------------------------------------------


def check_automatic_promotion(channel: str) -> None:
    """Flows promote only to non-production channels; CI promotes to the protected ones."""
    if channel in PROTECTED_CHANNELS:
        raise StoreArgumentError(f"the flow promotes to non-production channels only; promote to {channel!r} from CI")


def promote(ctx: Context, artifact_ref: str, channel: str, *, force: bool = False,
            reason: str | None = None, rollout: RolloutPlan | None = None,
            trust_verify_within_s: float = 0.0, new_channel: bool = False) -> ChannelRecord:
    """Promote through the gates, signed and attributed as the settings say; with ``rollout``,
    in waves (the rollout-channel flow moves it on). The gate re-hashes every blob unless
    ``trust_verify_within_s`` trusts a deep verify that recent. A channel outside the settings'
    ``channels`` that the store does not have yet is refused unless ``new_channel``
    (:class:`UnknownChannelError`, exit 2): a typo never creates a channel."""
    manifest = get_manifest(ctx.store, resolve_artifact(ctx.store, artifact_ref))
    check_channel_name(ctx, manifest.profile_name, channel, new_channel=new_channel)
    key = serving_key(manifest)
    # Artifacts published before provenance (schema 1 manifests, and their rehashed successors) have no
    # build to describe: they are exempt, as they were promoted before (docs/provenance.md).
    predates = manifest.schema_version < 2 or (manifest.rehashed_from is not None
                                               and _schema_of(ctx.store, manifest.rehashed_from) < 2)
    wanted = (expected_inputs(ctx.settings, manifest)
              if ctx.settings.require_provenance and channel in PROTECTED_CHANNELS and not predates else None)
    move = ChannelMove(reason=reason, forced=force, rollout=rollout,
                       compat_key=key if key != manifest.compat_key else None)
    return promotion.promote(ctx.store, artifact_ref, channel, auth=ctx.auth, move=move,
                             trust_verify_within_s=trust_verify_within_s, provenance=wanted)


def check_channel_name(ctx: Context, profile: str, channel: str, *, new_channel: bool = False) -> None:
    """A channel is known when the settings name it or the store has it for ``profile``."""
    if new_channel or channel in ctx.settings.channels:
        return
    if next(iter(ctx.store.list(f"{CHANNELS}{profile}/{channel}/")), None) is not None:
        return
    raise UnknownChannelError(channel, list(ctx.settings.channels))


def _schema_of(store: Store, artifact_id: str) -> int:
    """The schema of an artifact's manifest; one that cannot be read counts as current (no exemption)."""
    try:
        return get_manifest(store, artifact_id).schema_version
    except BuildctlError:
        return 2


def expected_inputs(settings: Settings, manifest: Manifest) -> ExpectedInputs:
    """The inputs a production channel's artifact must have been built from: the promoter's profile
    of that name where its profile directory has one (its build hash and calibration set), else the
    profile the manifest names."""
    where = profile_file(settings, manifest.profile_name)
    if not where.is_file():
        return ExpectedInputs(profile_name=manifest.profile_name, profile_hash=manifest.profile_hash)
    profile = load_profile(where)
    calib = profile.engine.calibration
    return ExpectedInputs(profile_name=profile.name, profile_hash=profile.build_hash(),
                          calibration_uri=calib.dataset if calib else None, calibration_size=calib.size if calib else None)
