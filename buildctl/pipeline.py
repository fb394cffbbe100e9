"""The pipeline steps as plain functions. The CLI and the Prefect flows both call these."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import buildctl
from artifact_store.digest import is_digest
from artifact_store.manifest import Manifest
from artifact_store.errors import VerificationError
from artifact_store.ops import ManifestDraft, PublishResult, lookup_build_key, publish_tree, verify
from artifact_store.store import ProgressFn, Store
from buildctl.errors import BadInputError, BuildFailedError
from engines.backend import get_backend
from engines.errors import EngineBuildError, EngineLoadError, IncompatibleTargetError
from engines.model import model_digest, resolve_model
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


# --- preflight ------------------------------------------------------------------------------

PREFLIGHT_TIMEOUT_S = 900


def preflight_for(backend: str) -> Callable[[Manifest, Path], None]:
    """The backend's preflight load for a staged engine, run in a subprocess so that a crash
    while loading (a segfault in a C++ runtime, SIGILL from a foreign ISA) cannot take the
    caller down. Raises :class:`PreflightFailed` with the output's tail."""

    def run(manifest: Manifest, staged: Path) -> None:
        cmd = [sys.executable, "-m", "engines.preflight", backend, str(staged)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=PREFLIGHT_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PreflightFailed(f"{backend} preflight timed out after {PREFLIGHT_TIMEOUT_S}s") from None
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-5:])
            how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
            raise PreflightFailed(f"{backend} preflight failed ({how}): {tail}")

    return run


class PreflightFailed(Exception):
    """The preflight subprocess could not load the engine."""


# --- build with the build cache --------------------------------------------------------------


@dataclass
class BuildOutcome:
    """What ``build`` did: a cache hit, a fresh build, or adopting a concurrent winner."""

    artifact_id: str
    build_key: str
    model_digest: str
    compat_key: str
    cache_hit: bool
    adopted: bool = False
    build_s: float = 0.0
    publish_s: float = 0.0
    total_s: float = 0.0
    uploaded_bytes: int = 0


@dataclass
class BuildPlan:
    """A resolved build: inputs, key, and the cached artifact if the key already has one."""

    profile: BuildProfile
    fingerprint: Fingerprint
    model_dir: Path
    model_digest: str
    build_key: str
    compat_key: str
    cached: str | None


@dataclass
class BuiltEngine:
    """An engine built into a run directory, not yet published (the caller removes ``run_dir``)."""

    plan: BuildPlan
    run_dir: Path
    engine_dir: Path
    log_path: Path
    wall_s: float
    tool_versions: dict[str, str | None]


def plan_build(store: Store, profile: BuildProfile, *, model: str | None = None, target_compat_key: str | None = None,
               fingerprint: Fingerprint | None = None, endpoint_url: str | None = None,
               say: Callable[[str], None] = lambda _: None) -> BuildPlan:
    """Check the target, resolve the model, compute the build key and look it up in the cache."""
    fp = fingerprint or detect()
    compat = fp.compat_key(profile.engine.backend)
    if target_compat_key and target_compat_key != compat:
        raise IncompatibleTargetError(
            f"this host ({compat}) cannot build for target {target_compat_key}: an engine built here would not "
            "load there", {"compat_key": (target_compat_key, compat)})
    say(f"model: resolving {model or profile.model.path or profile.model.uri or 'tiny ' + str(profile.model.tiny)}")
    model_dir = resolve_model(profile, model, endpoint_url=endpoint_url)
    digest = model_digest(model_dir)
    key = build_key_for(profile, digest, fp)
    say(f"build key {key} (model {digest}, compat {compat})")
    cached = lookup_build_key(store, key)
    if cached is not None:
        try:
            verify(store, cached)
            say(f"cache hit: {cached}")
        except VerificationError as err:
            say(f"cached artifact {cached} does not verify ({len(err.problems)} problem(s)); rebuilding")
            cached = None
    return BuildPlan(profile, fp, model_dir, digest, key, compat, cached)


def run_build(plan: BuildPlan, *, workdir: Path | None = None, say: Callable[[str], None] = lambda _: None) -> BuiltEngine:
    """Run the backend's isolated build; a failure keeps the log and raises ``BuildFailedError``."""
    profile = plan.profile
    backend = get_backend(profile.engine.backend)
    base = Path(workdir) if workdir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="buildctl-build-", dir=base))
    log_path = run_dir / "build.log"
    say(f"building with {profile.engine.backend} (timeout {profile.engine.build_timeout_s:.0f}s, log {log_path})")
    try:
        result = backend.build(profile, plan.model_dir, run_dir / "engine", plan.fingerprint, log_path,
                               model_digest=plan.model_digest)
    except BuildFailedError:
        keep = _keep_log(log_path, base)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise _with_kept_log(sys.exc_info()[1], keep) from None
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    say(f"built in {result.wall_s:.1f}s")
    return BuiltEngine(plan, run_dir, result.engine_dir, log_path, result.wall_s, result.tool_versions)


def publish_build(store: Store, built: BuiltEngine, *, say: Callable[[str], None] = lambda _: None) -> PublishResult:
    """Publish a built engine with its log and claim its build key; idempotent, so safe to retry."""
    plan = built.plan
    draft = manifest_draft(plan.profile, plan.fingerprint, model_digest=plan.model_digest,
                           extra_versions=built.tool_versions)
    pub = publish_tree(store, built.engine_dir, draft, build_log=built.log_path)
    if pub.build_key_owner and pub.build_key_owner != pub.artifact_id:
        say(f"a concurrent build of the same key won: adopting {pub.build_key_owner}")
    return pub


def build(
    store: Store,
    profile: BuildProfile,
    *,
    model: str | None = None,
    target_compat_key: str | None = None,
    fingerprint: Fingerprint | None = None,
    workdir: Path | None = None,
    endpoint_url: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> BuildOutcome:
    """Build the profile for this host and publish it, unless its build key already has an
    artifact that verifies (then no builder runs at all)."""
    t0 = time.monotonic()
    plan = plan_build(store, profile, model=model, target_compat_key=target_compat_key, fingerprint=fingerprint,
                      endpoint_url=endpoint_url, say=say)
    if plan.cached is not None:
        return BuildOutcome(plan.cached, plan.build_key, plan.model_digest, plan.compat_key, cache_hit=True,
                            total_s=time.monotonic() - t0)
    built = run_build(plan, workdir=workdir, say=say)
    try:
        t1 = time.monotonic()
        pub = publish_build(store, built, say=say)
        publish_s = time.monotonic() - t1
    finally:
        shutil.rmtree(built.run_dir, ignore_errors=True)
    owner = pub.build_key_owner or pub.artifact_id
    return BuildOutcome(owner, plan.build_key, plan.model_digest, plan.compat_key, cache_hit=False,
                        adopted=owner != pub.artifact_id, build_s=built.wall_s, publish_s=publish_s,
                        total_s=time.monotonic() - t0, uploaded_bytes=pub.uploaded_bytes)


def _keep_log(log_path: Path, base: Path) -> Path | None:
    """Move a failed build's log out of the run directory (which is removed) so it is kept."""
    if not log_path.exists():
        return None
    kept = base / f"buildctl-failed-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    shutil.copyfile(log_path, kept)
    return kept


def _with_kept_log(err: BaseException | None, kept: Path | None) -> BaseException:
    if isinstance(err, EngineBuildError) and kept is not None:
        return EngineBuildError(err.backend, err.kind, err.detail, returncode=err.returncode, signal=err.signal,
                                log_path=str(kept), log_tail=err.log_tail)
    return err if err is not None else RuntimeError("build failed")


def engine_backend_of(engine_dir: str | Path) -> str:
    """Which backend an engine directory belongs to, from its files."""
    d = Path(engine_dir)
    if (d / "engine.json").is_file() and (d / "model.pt2").is_file():
        return "aoti"
    if (d / "config.json").is_file() and (d / "rank0.engine").is_file():
        return "trtllm"
    raise EngineLoadError(str(d), "neither an aoti engine (engine.json, model.pt2) nor a trtllm engine (config.json, rank0.engine)")


def load_engine(engine_dir: str | Path):
    """Load an engine directory with its backend's runner."""
    return get_backend(engine_backend_of(engine_dir)).load(Path(engine_dir))
