"""The profile steps: the profiles in the settings' profile directory, and the model a profile builds from."""

from __future__ import annotations

from pathlib import Path

from buildctl.engines.errors import (
    FieldProblem,
    ModelSourceError,
    ProfileError,
    ProfileNotFoundError,
    ServedModelNotFoundError,
)
from buildctl.engines.profile import BuildProfile, load_profile, profile_path
from buildctl.engines.served import MODELS_DIR, ServedModel, load_served_model
from buildctl.core.settings import Settings
from buildctl.artifact_store.backends.store import open_store
from buildctl.artifact_store.node.checkpoints import download_checkpoint


# --- profiles and models ---------------------------------------------------------------------


def profile_file(settings: Settings, name: str) -> Path:
    """Where the profile called ``name`` lives in the profile directory."""
    return profile_path(name, settings.profile_dir)


def profile_names(settings: Settings) -> tuple[str, ...]:
    """The names of the profiles in the profile directory, sorted."""
    return tuple(sorted(f.stem for f in Path(settings.profile_dir).glob("*.yaml")))


def profile_by_name(settings: Settings, name: str) -> BuildProfile:
    """The profile called ``name`` in the profile directory; a missing one lists those that exist."""
    path = profile_file(settings, name)
    if not path.is_file():
        raise ProfileNotFoundError(str(path), profile_names(settings))
    return load_profile(path)


def load_profiles(settings: Settings) -> dict[str, BuildProfile]:
    """Every profile in the profile directory, by name; a directory that does not exist is an
    error naming it (run from elsewhere, ``build_profiles`` is not found relative to it)."""
    if not Path(settings.profile_dir).is_dir():
        from buildctl.core.errors import NotFoundError

        raise NotFoundError(f"profile directory {settings.profile_dir} does not exist (set BUILDCTL_PROFILE_DIR)")
    out = {}
    for f in sorted(Path(settings.profile_dir).glob("*.yaml")):
        p = load_profile(f)
        out[p.name] = p
    return out


def models_dir(settings: Settings) -> Path:
    """Where served-model files live: ``<profile dir>/models/``."""
    return Path(settings.profile_dir) / MODELS_DIR


def served_model_names(settings: Settings) -> tuple[str, ...]:
    return tuple(sorted(f.stem for f in models_dir(settings).glob("*.yaml")))


def served_model_by_name(settings: Settings, name: str,
                         profiles: dict[str, BuildProfile] | None = None) -> ServedModel:
    """The served model called ``name``, checked against the profiles it names; a missing one
    lists those that exist (exit 3), a malformed one lists every problem (exit 2)."""
    path = models_dir(settings) / f"{name}.yaml"
    if not path.is_file():
        raise ServedModelNotFoundError(str(path), served_model_names(settings))
    return load_served_model(path, profiles if profiles is not None else load_profiles(settings))


def served_models(settings: Settings, profiles: dict[str, BuildProfile] | None = None) -> list[ServedModel]:
    """Every served model in the models directory (none when it does not exist)."""
    if not models_dir(settings).is_dir():
        return []
    profiles = profiles if profiles is not None else load_profiles(settings)
    return [served_model_by_name(settings, n, profiles) for n in served_model_names(settings)]


def fallback_alert_minutes(settings: Settings) -> float:
    """How long a node may serve a fallback before the alert fires: the smallest
    ``max_fallback_minutes`` of the served models (the default, 240, when there are none). A
    malformed served-model file raises its field-level error: the alert is never armed with a
    value nobody configured."""
    from buildctl.engines.served import DEFAULT_MAX_FALLBACK_MINUTES

    return min((m.max_fallback_minutes for m in served_models(settings)), default=DEFAULT_MAX_FALLBACK_MINUTES)


def find_profile(settings: Settings, name: str, expected_hash: str, path: str | Path | None = None) -> BuildProfile:
    """An artifact's profile: ``path``, else ``<profile dir>/<name>.yaml``. Its build-affecting hash
    must equal the artifact's (the gates may differ)."""
    where = Path(path) if path else profile_file(settings, name)
    profile = load_profile(where)
    if profile.name != name or profile.build_hash() != expected_hash:
        raise ProfileError(str(where), [FieldProblem("", "matches-artifact",
                           f"profile {profile.name} ({profile.build_hash()}) is not the one the artifact was built "
                           f"from ({name}, {expected_hash})")])
    return profile


def resolve_model(settings: Settings, profile: BuildProfile, override: str | None = None) -> Path:
    """A local checkpoint directory for ``profile`` (``override`` replaces the profile's source).

    ``s3://`` checkpoints are downloaded, verified, into the cache first; the tiny model is made or
    taken from its cache.
    """
    src = override or profile.model.path or profile.model.uri
    if src is None and profile.model.tiny is not None:
        from buildctl.engines.tiny import make_tiny

        return make_tiny(profile.model.tiny, settings.cache_dir)
    if src is None:
        raise ModelSourceError(profile.name, "the profile names no model source")
    if src.startswith("s3://"):
        dest = Path(settings.cache_dir) / "models" / src[len("s3://"):].replace("/", "_")
        return download_checkpoint(open_store(src, endpoint_url=settings.endpoint_url), dest)
    p = Path(src).expanduser()
    if not (p / "config.json").is_file():
        raise ModelSourceError(src, "not an HF checkpoint directory (no config.json)")
    return p
