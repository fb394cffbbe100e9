"""One frozen settings object, built once from flags and the environment, then passed down.

This is the only module that reads environment variables. The CLI builds :class:`Settings`
from its flags (which win) and ``BUILDCTL_*`` variables; the flows build it from their
parameters and the worker's environment. Library code takes what it needs as arguments.
"""

from __future__ import annotations

import getpass
import os
import socket
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from buildctl.core.errors import BadInputError
from buildctl.core.times import MAX_DURATION_S

DEFAULT_BUILD_LIMIT = "buildctl-builds"


def _data_home() -> str:
    return os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")


def _cache_home() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def default_store_uri() -> str:
    return "file://" + os.path.join(_data_home(), "buildctl", "store")


def default_cache_dir() -> Path:
    return Path(_cache_home()) / "buildctl"


def default_profile_dir() -> Path:
    """``build_profiles`` in the working directory when it has one (a checkout's root), else the
    checkout buildctl runs from (an editable install, or ``BUILDCTL_REPO``): so `upgrade plan` and
    `node report` find the profiles from any directory."""
    here = Path("build_profiles")
    if here.is_dir():
        return here
    for root in (os.environ.get("BUILDCTL_REPO"), str(Path(__file__).resolve().parents[2])):
        if root and (Path(root) / "build_profiles").is_dir():
            return Path(root) / "build_profiles"
    return here


def detect_actor() -> str:
    """Who is acting: the CI identity when in CI, else user@host."""
    env = os.environ
    if env.get("GITHUB_ACTIONS"):
        return (f"github:{env.get('GITHUB_REPOSITORY', '?')}#{env.get('GITHUB_RUN_ID', '?')} "
                f"({env.get('GITHUB_ACTOR', '?')})")
    if env.get("GITLAB_CI"):
        return (f"gitlab:{env.get('CI_PROJECT_PATH', '?')}#{env.get('CI_PIPELINE_ID', '?')} "
                f"({env.get('GITLAB_USER_LOGIN', '?')})")
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in a container
        user = str(os.getuid())
    who = f"{user}@{socket.gethostname()}"
    return f"ci:{who}" if env.get("CI") else who


def _cxx() -> str | None:
    return os.environ.get("CXX") or None


class Settings(BaseSettings):
    """Everything buildctl is configured with. Environment: ``BUILDCTL_<FIELD>`` (upper case)."""

    model_config = SettingsConfigDict(env_prefix="BUILDCTL_", frozen=True, extra="forbid", case_sensitive=False)

    store: str = Field(default_factory=default_store_uri, description="Artifact store URI: file:///dir or s3://bucket/prefix.")
    endpoint_url: str | None = Field(None, description="S3 endpoint (default: boto3's own, e.g. AWS_ENDPOINT_URL).")
    signing_key: Path | None = Field(None, description="Ed25519 private key this process signs manifests, records and attestations with.")
    export_key: Path | None = Field(None, description="The promoter's ECDSA P-256 private key `export-signature` signs OpenSSF model-signing bundles with (model-signing verifies EC keys only).")
    trusted_keys: Path | None = Field(None, description="Directory of trusted *.pub keys; when set, pull enforces signatures.")
    require_crypto: bool = Field(False, description="Refuse engines bound by xxh3-128 only: a manifest without per-file BLAKE3 (schema 1) or a channel record without its manifest's BLAKE3 (pull, stage, activate, node agent, verify).")
    require_provenance: bool = Field(True, description="Promote to a production channel (prod, production) only an artifact with build provenance: signed by a trusted builder key (when keys are trusted), bound to its manifest bytes, with the inputs of the promoter's profile. 0 lets imported engines through without --force (docs/provenance.md).")
    profile_dir: Path = Field(default_factory=default_profile_dir, description="Where profiles are found by name (default: build_profiles here, else in the checkout buildctl runs from or BUILDCTL_REPO).")
    channels: tuple[str, ...] = Field(("staging", "prod"), description="The channels promote knows (JSON list, e.g. [\"staging\", \"canary\", \"prod\"]): a name outside them, not yet in the store, needs `promote --new-channel`, so a typo never creates a channel.")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Cache for tiny models and downloaded checkpoints.")
    vllm_log: Path | None = Field(None, description="Where the vLLM reference's own log lines go (appended; default <cache_dir>/logs/vllm.log), instead of stderr.")
    fingerprint_file: Path | None = Field(None, description="Use this fingerprint JSON instead of detecting the host.")
    fingerprint_python: str | None = Field(None, description="Detect the runtime's versions in this interpreter (a command: /opt/serve/bin/python, or docker exec -i serving python3) when the node agent runs outside the serving environment.")
    debug: bool = Field(False, description="Print tracebacks for errors.")
    verify_window_s: float = Field(24 * 3600.0, ge=0, le=MAX_DURATION_S, allow_inf_nan=False, description="How old a deep verify promote and rollback may trust; older ones are re-run (0: always re-hash).")
    record_ttl_s: float = Field(7 * 86400.0, ge=0, le=MAX_DURATION_S, allow_inf_nan=False, description="How long a signed channel record stays valid; the resign-channels flow re-signs it before (0: no expiry).")
    gc_grace_s: float = Field(24 * 3600.0, gt=0, le=MAX_DURATION_S, allow_inf_nan=False, description="Garbage collection never removes a blob a publish touched, or a manifest created, within this; publishes finish within half of it.")
    gc_delete_window_s: float = Field(5.0, ge=0, le=86400, allow_inf_nan=False, description="gc removes a blob within this of checking its touch; a publish re-checks a blob it reuses this long after touching it.")
    build_limit: str = Field(DEFAULT_BUILD_LIMIT, description="Prefect global concurrency limit that builds take a slot of.")
    build_slots: int = Field(1, ge=1, le=4096, description="Slots of the build limit when buildctl creates it.")
    trtllm_version: str = Field("1.2.1", description="The TensorRT-LLM release builds must run on (pinned: the last with trtllm-build).")
    trtllm_examples: str = Field("/app/tensorrt_llm/examples",
                                 description="TensorRT-LLM's examples directory; the converter paths under it depend on the release.")
    trtllm_convert: str | None = Field(None, description="TensorRT-LLM's llama convert_checkpoint.py (default: by release, under trtllm_examples).")
    trtllm_quantize: str | None = Field(None, description="TensorRT-LLM's (ModelOpt) quantize.py (default: under trtllm_examples).")
    trtllm_build: str = Field("trtllm-build", description="The trtllm-build executable.")
    trtllm_python: str | None = Field(None, description="Python that runs the convert/quantize scripts (default: this one).")
    actor: str = Field(default_factory=detect_actor, description="Who is acting, recorded in channel history.")
    cxx: str | None = Field(default_factory=_cxx, description="C++ compiler to fingerprint (CXX; default: g++ on PATH).")
    prefect_api_url: str | None = Field(None, validation_alias=AliasChoices("BUILDCTL_PREFECT_API_URL", "PREFECT_API_URL"),
                                        description="The Prefect API (PREFECT_API_URL) that `buildctl worker` commands talk to.")

    def with_flags(self, **flags: Any) -> "Settings":
        """A copy with the given flags set; ``None`` flags are left as they are."""
        return self.model_copy(update={k: v for k, v in flags.items() if v is not None})


def load_settings(**flags: Any) -> Settings:
    """Settings from the environment with ``flags`` (``None`` = not given) on top."""
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors())
        raise BadInputError(f"invalid settings: {detail}") from None
