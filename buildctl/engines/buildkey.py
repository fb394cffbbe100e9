"""Build keys: the identity of one build, so no build key is ever built twice.

The key is xxh3-128 over the canonical JSON of exactly four things:

* the profile's build-affecting hash (``BuildProfile.build_hash``),
* the model checkpoint's content digest,
* this host's ``compat_key`` for the profile's backend,
* the backend's tool version (``EngineBackend.tool_version``: TensorRT-LLM for trtllm, torch for aoti).
"""

from __future__ import annotations

from buildctl.digest import digest_json
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile


def build_key(profile_hash: str, model_digest: str, compat_key: str, version: str | None) -> str:
    """The build key of these four inputs."""
    return digest_json({"profile_hash": profile_hash, "model_digest": model_digest,
                        "compat_key": compat_key, "backend_version": version})


def build_key_for(profile: BuildProfile, model_digest: str, fingerprint: Fingerprint) -> str:
    backend = profile.engine.backend
    return build_key(profile.build_hash(), model_digest, fingerprint.compat_key(backend),
                     fingerprint.tool_version(backend))
