"""Build with the build cache: plan, build in an isolated step, hash the checkpoint once, publish with provenance; and import an engine built elsewhere.

The CLI and the Prefect flows both call these and add only their own concerns (argument
parsing and printing; retries, concurrency, artifacts and events).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager
from urllib.parse import quote

import buildctl
from buildctl.core.digest import canonical_json, crypto_bytes, is_digest
from buildctl.core.logtail import tailing
from buildctl.engines.buildkey import build_key_for
from buildctl.engines.errors import (
    EngineBuildError,
    EngineLoadError,
    HostRequirementsError,
    IncompatibleTargetError,
    ModelSourceError,
)
from buildctl.engines.fingerprint import Fingerprint, host_fingerprint
from buildctl.engines.profile import BuildProfile
from buildctl.engines.registry import backend_of_engine_dir, get_backend
from buildctl.steps.coverage import artifacts_for_key
from buildctl.steps.context import Context, Say, quiet
from buildctl.core.errors import BadInputError, BuildFailedError
from buildctl.core.settings import Settings
from buildctl.artifact_store.grace import GraceWindows
from buildctl.artifact_store.backends.store import ProgressFn, Store
from buildctl.artifact_store.errors import VerificationError
from buildctl.artifact_store.layout import provenance_key
from buildctl.artifact_store.manifest import tree_digests, tree_stat
from buildctl.artifact_store.trust.provenance import BuildFacts, TreeRef, write_provenance
from buildctl.core.times import utc_now
from buildctl.artifact_store.publish import ManifestDraft, PublishResult, lookup_build_key, publish_tree
from buildctl.artifact_store.upkeep.integrity import verify_deep_or_quarantine
from buildctl.artifact_store.read import get_manifest_and_bytes
from buildctl.steps.profiles import profile_file, resolve_model





# --- manifests and import --------------------------------------------------------------------


def manifest_draft(profile: BuildProfile, fingerprint: Fingerprint, *, model_digest: str | None = None,
                   extra_versions: dict[str, str | None] | None = None, build_key: str | None = None) -> ManifestDraft:
    """The manifest fields of an engine built for ``profile`` on ``fingerprint`` (``build_key``:
    the plan's, when it is a rebuild's)."""
    backend = profile.engine.backend
    versions: dict[str, str | None] = {
        "buildctl": buildctl.__version__,
        "backend": fingerprint.tool_version(backend),
        "torch": fingerprint.torch_version,
        "tensorrt": fingerprint.tensorrt_version,
        "tensorrt_llm": fingerprint.tensorrt_llm_version,
    }
    versions.update(extra_versions or {})
    return ManifestDraft(
        profile_name=profile.name, profile_hash=profile.build_hash(), backend=backend,
        compat_key=fingerprint.compat_key(backend), fingerprint=fingerprint.model_dump(mode="json"),
        tool_versions=versions, model_digest=model_digest,
        build_key=build_key or (build_key_for(profile, model_digest, fingerprint) if model_digest else None),
    )


def import_engine(ctx: Context, engine_dir: str | Path, profile: BuildProfile,
                  fingerprint: Fingerprint, *, model_digest: str | None = None,
                  on_bytes: ProgressFn | None = None) -> PublishResult:
    """Publish an engine directory built elsewhere (e.g. by hand with ``trtllm-build``), after the
    checks that need no runtime: a tree another backend recognises is refused under this profile,
    and a tree that records its host is checked against ``fingerprint`` (the builder's), so the
    manifest's compat key is the one the tree was made for (:meth:`~EngineBackend.check_tree`)."""
    if model_digest is not None and not is_digest(model_digest):
        raise BadInputError(f"--model-digest {model_digest!r} is not an xxh3-128:<32 hex> digest")
    tree, name = Path(engine_dir), profile.engine.backend
    backend = get_backend(name, ctx.settings)
    if tree.is_dir():
        if backend.recognises(tree):
            backend.check_tree(tree, fingerprint)
        else:
            try:
                theirs = backend_of_engine_dir(tree)
            except EngineLoadError:
                pass  # no backend's tree: published as it is
            else:
                raise BadInputError(f"{tree} is a {theirs} tree, and profile {profile.name} builds {name}: import "
                                    f"it with a {theirs} profile")
    return publish_tree(ctx.store, engine_dir, manifest_draft(profile, fingerprint, model_digest=model_digest),
                        on_bytes=on_bytes, auth=ctx.auth, windows=GraceWindows.from_settings(ctx.settings))


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

    def to_json(self) -> dict:
        """What ``buildctl build --json`` prints."""
        return {"artifact_id": self.artifact_id, "cache_hit": self.cache_hit, "adopted": self.adopted,
                "build_key": self.build_key, "model_digest": self.model_digest, "compat_key": self.compat_key,
                "build_s": round(self.build_s, 3), "publish_s": round(self.publish_s, 3), "total_s": round(self.total_s, 3)}


@dataclass
class BuildPlan:
    """A resolved build: inputs, key, and the cached artifact if the key already has one."""

    profile: BuildProfile
    fingerprint: Fingerprint
    model_dir: Path
    model_digest: str
    model_blake3: str  # the checkpoint's BLAKE3 tree digest, from the same read as model_digest
    model_stat: tuple  # its files' change stamps then (manifest.tree_stat): did one change since?
    build_key: str
    compat_key: str
    cached: str | None
    quarantined: list[str] = field(default_factory=list)  # cached artifacts the deep check took out of service
    rebuild_of: str | None = None  # the artifact whose failed re-check on these soft values this rebuilds


@dataclass
class BuiltEngine:
    """An engine built into a run directory, not yet published (the caller removes ``run_dir``)."""

    plan: BuildPlan
    run_dir: Path
    engine_dir: Path
    log_path: Path
    wall_s: float
    tool_versions: dict[str, str | None]
    commands: tuple[tuple[str, ...], ...] = ()  # what the backend ran (build provenance)
    started_at: str = ""
    finished_at: str = ""


def plan_build(ctx: Context, profile: BuildProfile, *, model: str | None = None,
               target_compat_key: str | None = None, fingerprint: Fingerprint | None = None,
               rebuild_of: str | None = None, say: Say = quiet) -> BuildPlan:
    """Check the target, resolve the model, compute the build key and look it up in the cache: by
    key first, then (for artifacts published under a schema-1 key) by the same inputs under this
    key. ``rebuild_of``: the artifact that failed its re-check here; the plan then has the rebuild's
    key (:func:`~buildctl.engines.buildkey.build_key_for`) and never takes that artifact."""
    settings, store = ctx.settings, ctx.store
    fp = fingerprint or host_fingerprint(settings)
    compat = fp.compat_key(profile.engine.backend)
    if target_compat_key and target_compat_key != compat:
        raise IncompatibleTargetError(
            f"this host ({compat}) cannot build for target {target_compat_key}: an engine built here would not "
            "load there", {"compat_key": (target_compat_key, compat)})
    unmet = get_backend(profile.engine.backend, settings).unmet_requirements(profile, fp)
    if unmet:  # before the checkpoint download and the build: both can take hours
        raise HostRequirementsError(profile.name, unmet)
    say(f"model: resolving {model or profile.model.path or profile.model.uri or 'tiny ' + str(profile.model.tiny)}")
    model_dir = resolve_model(settings, profile, model)
    model_stat = tree_stat(model_dir)
    digest, model_blake3 = tree_digests(model_dir)  # one read of the checkpoint, both digests provenance names
    key = build_key_for(profile, digest, fp, rebuild=rebuild_of is not None)
    say(f"build key {key} (model {digest}, compat {compat})" + (f", a rebuild of {rebuild_of}" if rebuild_of else ""))
    cached = lookup_build_key(store, key)
    if cached is None and rebuild_of is None:
        cached = same_inputs_artifact(store, profile, digest, fp)
        if cached is not None:
            say(f"{cached} was built from the same inputs under a schema-1 compat key: taking it")
    quarantined = []
    if cached is not None:
        # A cache hit is a hit only when every blob re-hashes right: seconds, against a build of
        # minutes to hours. A rotted artifact is quarantined (so it is never a hit again) and built anew.
        try:
            verify_deep_or_quarantine(store, cached, detector="build cache check", auth=ctx.auth)
            say(f"cache hit: {cached} (deep-verified)")
        except VerificationError as err:
            say(f"cached artifact {cached} does not verify ({len(err.problems)} problem(s)); quarantined "
                f"({err.quarantine_key}); rebuilding")
            quarantined.append(cached)
            cached = None
    return BuildPlan(profile, fp, model_dir, digest, model_blake3, model_stat, key, compat, cached, quarantined,
                     rebuild_of)


def same_inputs_artifact(store: Store, profile: BuildProfile, model_digest: str, fingerprint: Fingerprint) -> str | None:
    """The newest unquarantined artifact built from the same profile, model and tool version for
    this host's compat key, whatever key its manifest was published under (a schema-1 one)."""
    backend = profile.engine.backend
    compat, version = fingerprint.compat_key(backend), fingerprint.tool_version(backend)
    for artifact_id, m in artifacts_for_key(store, profile, compat):
        if (m.backend == backend and m.model_digest == model_digest and m.tool_versions.get("backend") == version
                and m.compat_key != compat):
            return artifact_id
    return None


def run_build(settings: Settings, plan: BuildPlan, *, workdir: Path | None = None, say: Say = quiet) -> BuiltEngine:
    """Run the backend's isolated build; a failure keeps the log and raises ``BuildFailedError``."""
    profile = plan.profile
    backend = get_backend(profile.engine.backend, settings)
    base = Path(workdir) if workdir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="buildctl-build-", dir=base))
    log_path = run_dir / "build.log"
    say(f"building with {profile.engine.backend} (timeout {profile.engine.build_timeout_s:.0f}s, log {log_path})")
    started = utc_now()
    try:
        with tailing(log_path, say):
            result = backend.build(profile, plan.model_dir, run_dir / "engine", plan.fingerprint, log_path,
                                   model_digest=plan.model_digest)
    except BuildFailedError as err:
        keep = _keep_log(log_path, base)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise _with_kept_log(err, keep) from None
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    say(f"built in {result.wall_s:.1f}s")
    return BuiltEngine(plan, run_dir, result.engine_dir, log_path, result.wall_s, result.tool_versions,
                       tuple(tuple(c) for c in result.commands), started, utc_now())


def build_in_slot(ctx: Context, plan: BuildPlan, slot: ContextManager, *, workdir: Path | None = None,
                  say: Say = quiet) -> BuiltEngine | str:
    """Run the plan's build holding ``slot`` (the build pool's concurrency limit), after looking its
    build key up again inside it: a run that waited while another built and published the same key
    takes that artifact (returned as its id, deep-verified) instead of building it twice."""
    with slot:
        cached = lookup_build_key(ctx.store, plan.build_key)
        if cached is not None and cached != plan.rebuild_of:
            try:
                verify_deep_or_quarantine(ctx.store, cached, detector="build cache check", auth=ctx.auth)
                say(f"{cached} was published for this build key while this run waited for its slot: taking it")
                return cached
            except VerificationError:
                say(f"{cached}, published meanwhile, does not verify: quarantined; building")
        return run_build(ctx.settings, plan, workdir=workdir, say=say)


def publish(ctx: Context, built: BuiltEngine, *, say: Say = quiet) -> PublishResult:
    """Publish a built engine with its log and claim its build key; idempotent, so safe to retry."""
    plan = built.plan
    draft = manifest_draft(plan.profile, plan.fingerprint, model_digest=plan.model_digest,
                           extra_versions=built.tool_versions, build_key=plan.build_key)
    facts = build_facts(ctx, built, draft)  # before publishing: a checkpoint changed meanwhile publishes nothing
    t0 = time.monotonic()
    pub = publish_tree(ctx.store, built.engine_dir, draft, build_log=built.log_path, auth=ctx.auth,
                       windows=GraceWindows.from_settings(ctx.settings))
    secs = max(time.monotonic() - t0, 1e-6)
    say(f"published {pub.artifact_id}: {len(pub.manifest.files)} files, {pub.manifest.total_size / 1e6:.1f} MB, "
        f"{pub.uploaded_bytes / 1e6:.1f} MB uploaded in {secs:.1f} s ({pub.uploaded_bytes / 1e6 / secs:.1f} MB/s; "
        f"{pub.skipped_blobs} blob(s) already stored)")
    if pub.repaired:
        say(f"the rebuild has the quarantined artifact's content: put back {', '.join(pub.repaired)}")
    if pub.build_key_owner and pub.build_key_owner != pub.artifact_id:
        say(f"a concurrent build of the same key won: adopting {pub.build_key_owner}")
    _, body = get_manifest_and_bytes(ctx.store, pub.artifact_id)
    if write_provenance(ctx.store, pub.artifact_id, body, pub.manifest, facts, ctx.auth.signer):
        say(f"provenance: {provenance_key(pub.artifact_id)} (in-toto Statement v1, SLSA Provenance v1"
            + (f", signed by {ctx.auth.signer.key_id})" if ctx.auth.signer else ", unsigned: no BUILDCTL_SIGNING_KEY)"))
    return pub


def _input_ref(path: Path, uri: str | None, size: int | None = None) -> TreeRef:
    digest, blake3 = tree_digests(path)
    return TreeRef(uri=uri, digest=digest, blake3=blake3, size=size)


def build_facts(ctx: Context, built: BuiltEngine, draft: ManifestDraft) -> BuildFacts:
    """What the provenance of ``built`` says: its inputs by digest (the checkpoint by the digests
    the plan computed in its one read of it, after checking that no file of it changed since: size,
    mtime, inode and ctime; the calibration set is read for its BLAKE3), the builder and what it ran."""
    plan, profile = built.plan, built.plan.profile
    uri = profile.model.path or profile.model.uri or (
        f"tiny:{profile.model.tiny.model_dump_json()}" if profile.model.tiny is not None else None)
    now = tree_stat(plan.model_dir)
    if now != plan.model_stat:
        changed = sorted({f[0] for f in set(now) ^ set(plan.model_stat)})
        raise ModelSourceError(str(plan.model_dir), f"the checkpoint changed during the build ({', '.join(changed[:3])}"
                               f"{', ...' if len(changed) > 3 else ''}): not writing provenance for inputs it "
                               "cannot name")
    model = TreeRef(uri=uri, digest=plan.model_digest, blake3=plan.model_blake3)
    where = profile_file(ctx.settings, profile.name)
    prof = TreeRef(uri=str(where) if where.is_file() else None, digest=profile.build_hash(),
                   blake3=crypto_bytes(canonical_json(profile.model_dump(mode="json"))))
    calib = profile.engine.calibration
    fp = plan.fingerprint
    return BuildFacts(
        builder_id="urn:buildctl:builder:" + quote(ctx.auth.who, safe="@.-_"), backend=draft.backend,
        compat_key=draft.compat_key, build_key=draft.build_key, profile_name=profile.name, profile=prof, model=model,
        calibration=_input_ref(Path(calib.dataset), calib.dataset, calib.size) if calib is not None else None,
        fingerprint=fp.model_dump(mode="json"), fingerprint_digest=fp.digest(), tool_versions=draft.tool_versions,
        commands=built.commands, invocation=tuple(sys.argv), invocation_id=uuid.uuid4().hex,
        started_on=built.started_at or utc_now(), finished_on=built.finished_at or utc_now())


def build(
    ctx: Context,
    profile: BuildProfile,
    *,
    model: str | None = None,
    target_compat_key: str | None = None,
    fingerprint: Fingerprint | None = None,
    workdir: Path | None = None,
    say: Say = quiet,
) -> BuildOutcome:
    """Build the profile for this host and publish it, unless its build key already has an
    artifact that verifies (then no builder runs at all)."""
    t0 = time.monotonic()
    plan = plan_build(ctx, profile, model=model, target_compat_key=target_compat_key,
                      fingerprint=fingerprint, say=say)
    if plan.cached is not None:
        return BuildOutcome(plan.cached, plan.build_key, plan.model_digest, plan.compat_key, cache_hit=True,
                            total_s=time.monotonic() - t0)
    built = run_build(ctx.settings, plan, workdir=workdir, say=say)
    try:
        t1 = time.monotonic()
        pub = publish(ctx, built, say=say)
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


def _with_kept_log(err: BuildFailedError, kept: Path | None) -> BuildFailedError:
    if isinstance(err, EngineBuildError) and kept is not None:
        return EngineBuildError(err.backend, err.kind, err.detail, returncode=err.returncode, signal=err.signal,
                                log_path=str(kept), log_tail=err.log_tail)
    return err
