"""The pipeline steps as plain functions. The CLI and the Prefect flows both call these."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import buildctl
from artifact_store.digest import is_digest
from artifact_store.manifest import Manifest
from artifact_store.ops import ManifestDraft, PublishResult, publish_tree
from artifact_store.store import ProgressFn, Store
from buildctl.errors import BadInputError
from engines.buildkey import backend_version, build_key_for
from engines.fingerprint import Fingerprint, detect, load_fingerprint
from engines.profile import BuildProfile


def host_fingerprint(fingerprint_file: str | Path | None = None) -> Fingerprint:
    """This host's fingerprint, or the one saved in ``fingerprint_file``."""
    return load_fingerprint(fingerprint_file) if fingerprint_file else detect()


def manifest_draft(profile: BuildProfile, fingerprint: Fingerprint, *, model_digest: str | None = None,
                   extra_versions: dict[str, str | None] | None = None) -> ManifestDraft:
    """The manifest fields of an engine built for ``profile`` on ``fingerprint``."""
    backend = profile.engine.backend
    versions: dict[str, str | None] = {
        "buildctl": buildctl.__version__,
        "backend": backend_version(fingerprint, backend),
        "torch": fingerprint.torch_version,
        "tensorrt": fingerprint.tensorrt_version,
        "tensorrt_llm": fingerprint.tensorrt_llm_version,
    }
    versions.update(extra_versions or {})
    return ManifestDraft(
        profile_name=profile.name, profile_hash=profile.build_hash(), backend=backend,
        compat_key=fingerprint.compat_key(backend), fingerprint=fingerprint.model_dump(mode="json"),
        tool_versions=versions, model_digest=model_digest,
        build_key=build_key_for(profile, model_digest, fingerprint) if model_digest else None,
    )


def import_engine(store: Store, engine_dir: str | Path, profile: BuildProfile, fingerprint: Fingerprint, *,
                  model_digest: str | None = None, on_bytes: ProgressFn | None = None) -> PublishResult:
    """Publish an engine directory built elsewhere (e.g. by hand with ``trtllm-build``)."""
    if model_digest is not None and not is_digest(model_digest):
        raise BadInputError(f"--model-digest {model_digest!r} is not an xxh3-128:<32 hex> digest")
    return publish_tree(store, engine_dir, manifest_draft(profile, fingerprint, model_digest=model_digest),
                        on_bytes=on_bytes)


# Preflight loaders per backend, registered by the engine backends (engines/). A backend
# without one is installed after byte verification only.
PREFLIGHTS: dict[str, Callable[[Manifest, Path], None]] = {}


def preflight_for(backend: str) -> Callable[[Manifest, Path], None] | None:
    """The backend's preflight load for a staged engine, if it has one."""
    return PREFLIGHTS.get(backend)
