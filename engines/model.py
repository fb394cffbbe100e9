"""Model checkpoints: where a profile's model comes from, and its content digest."""

from __future__ import annotations

from pathlib import Path

from artifact_store.digest import digest_json
from artifact_store.manifest import hash_tree, scan_tree
from engines.errors import ModelSourceError
from engines.profile import BuildProfile


def model_digest(model_dir: str | Path) -> str:
    """The xxh3 manifest digest of a checkpoint directory: every file's path, size, digest and mode."""
    entries = hash_tree(scan_tree(model_dir))
    return digest_json([e.model_dump(mode="json") for e in entries])


def resolve_model(profile: BuildProfile, override: str | None = None, *, endpoint_url: str | None = None,
                  cache_dir: Path | None = None) -> Path:
    """A local checkpoint directory for ``profile`` (``override`` replaces the profile's source).

    ``s3://`` checkpoints are downloaded (each object verified by size and, where the server
    stored one, its checksum) into the cache first; the tiny model is made or taken from its cache.
    """
    src = override or profile.model.path or profile.model.uri
    if src is None and profile.model.tiny is not None:
        from engines.tiny import make_tiny

        return make_tiny(profile.model.tiny)
    if src is None:
        raise ModelSourceError(profile.name, "the profile names no model source")
    if src.startswith("s3://"):
        from artifact_store.store import open_store

        store = open_store(src, endpoint_url=endpoint_url)
        dest = (cache_dir or Path.home() / ".cache" / "buildctl" / "models") / src[len("s3://"):].replace("/", "_")
        return store.download_tree("", dest)  # type: ignore[attr-defined]
    p = Path(src).expanduser()
    if not (p / "config.json").is_file():
        raise ModelSourceError(src, "not an HF checkpoint directory (no config.json)")
    return p
