"""Build keys: the identity of one build, so no build key is ever built twice.

The key is xxh3-128 over the canonical JSON of exactly four things:

* the profile's build-affecting hash (``BuildProfile.build_hash``),
* the model checkpoint's content digest,
* this host's ``compat_key`` for the profile's backend,
* the backend's tool version (``EngineBackend.tool_version``: TensorRT-LLM for trtllm, torch for aoti);

and, for a backend whose engine format is not 1 (aoti's format 2: prefill and decode graphs with
a KV cache), that format, so a new format never takes an old format's artifact as a cache hit
(the keys of format-1 backends are unchanged).

Soft fields are not in it: a host whose soft values changed gets the same key, and so the same
artifact, which it re-checks. Only when that re-check fails is the engine built again, under a key
that adds the soft values it failed on (``rebuild_for``), so the rebuild is also built once.
"""

from __future__ import annotations

from buildctl.core.digest import digest_json
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.profile import BuildProfile


def build_key(profile_hash: str, model_digest: str, compat_key: str, version: str | None,
              rebuild_for: dict | None = None, engine_format: int = 1) -> str:
    """The build key of these four inputs (and, for a rebuild after a failed re-check, the soft
    values it failed on; and an engine format other than 1)."""
    inputs: dict = {"profile_hash": profile_hash, "model_digest": model_digest, "compat_key": compat_key,
                    "backend_version": version}
    if engine_format != 1:
        inputs["engine_format"] = engine_format
    if rebuild_for is not None:
        inputs["rebuild_for"] = rebuild_for
    return digest_json(inputs)


def build_key_for(profile: BuildProfile, model_digest: str, fingerprint: Fingerprint, *, rebuild: bool = False) -> str:
    """The build key of ``profile`` on ``fingerprint``; ``rebuild``: the key of a rebuild for this
    host's soft values, after the artifact of the plain key failed its re-check here."""
    from buildctl.engines.registry import backend_class

    backend = profile.engine.backend
    return build_key(profile.build_hash(), model_digest, fingerprint.compat_key(backend),
                     fingerprint.tool_version(backend), fingerprint.soft_fields(backend) if rebuild else None,
                     backend_class(backend).engine_format)
