"""The node agent's pull: install the channel's engine for this node, smoke-check it, report.

``buildctl pull --node-id`` runs :func:`pull`. The channel record gives the node its artifact
(during a rollout, by the node's wave bucket); the pull verifies, preflights and swaps it in as
``DIR/current``; then a smoke check runs against the installed engine: the backend loads it and
generates a few tokens in a subprocess, or the operator's ``--health-cmd`` runs. The node records
``installed``, then ``healthy`` or ``failed``, in its inventory record (compare-and-swap), and the
CLI emits ``buildctl.node.engine-health`` for each. On a failed check the node switches
``current`` back to the engine it replaced by itself, remembers the verdict in ``DIR`` and does
not install that artifact again until told (``--retry-failed``); the rollout flow sees the failure
in the inventory and halts the rollout when its wave's budget is exceeded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from buildctl.steps.coverage import Coverage, coverage
from buildctl.engines.fingerprint import Fingerprint, UpgradeTarget, host_fingerprint
from buildctl.engines.registry import backend_names
from buildctl.core.errors import BuildctlError, UnavailableError
from buildctl.steps.fleet import record_engine_state
from buildctl.artifact_store.fleet.inventory import EngineState, HealthStatus
from buildctl.steps.context import Context
from buildctl.steps.host import host_compat_keys, preflight_for
from buildctl.core.settings import Settings
from buildctl.core.times import now_utc, utc_now
from buildctl.artifact_store.backends.store import ProgressFn, Store, fail_fast
from buildctl.artifact_store.channels import ChannelRecord
from buildctl.artifact_store.errors import EngineUnhealthyError, NotCoveredError, StoreNotFoundError
from buildctl.artifact_store.node.install_dir import (
    PullResult,
    StagedEngine,
    activate_staged,
    channel_ref,
    current_artifact,
    health_marks,
    installed_seqs,
    mark_health,
    previous_artifact,
    stage_artifact,
    staged_engines,
    switch_back,
)
from buildctl.artifact_store.manifest import Manifest
import buildctl.artifact_store.node.pull
from buildctl.artifact_store.node.pull import HEALTH_TIMEOUT_S, PullOptions, resolve_channel
from buildctl.artifact_store.quarantine import check_not_quarantined
from buildctl.artifact_store.node.admission import check_fresh, check_trust
from buildctl.artifact_store.read import get_manifest

SMOKE_TOKENS = 8


@dataclass
class NodePull:
    """What a node's pull did."""

    result: PullResult
    record: ChannelRecord
    state: EngineState | None  # the smoke check's verdict; None when no check ran
    reported: bool = False  # whether the inventory record took the verdict
    coverage: Coverage | None = None  # the artifact's coverage of this host, when the pull checked it (require_covered)


def smoke_check(settings: Settings, manifest: Manifest, artifact_id: str, engine_dir: Path,
                health_cmd: str | None, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
    """Run the smoke check against an installed engine; ``None`` when it passed, else why not.
    ``health_cmd`` runs with ``sh -c``, the engine directory as ``$1`` and the artifact id as ``$2``;
    without it the backend loads the engine and generates a few tokens, in a subprocess."""
    if health_cmd:
        cmd = ["sh", "-c", health_cmd, "buildctl-health", str(engine_dir), artifact_id]
    else:
        cmd = [sys.executable, "-m", "buildctl.engines.preflight", manifest.backend, str(engine_dir),
               "--smoke", str(SMOKE_TOKENS)]
        if settings.fingerprint_file:
            cmd += ["--fingerprint-file", str(settings.fingerprint_file)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:g}s"
    if r.returncode == 0:
        return None
    tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
    how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
    return f"{'health command' if health_cmd else 'smoke generation'} {how}" + (f": {tail}" if tail else "")


def _record(store: Store, node_id: str, fp: Fingerprint, state: EngineState) -> bool:
    try:
        record_engine_state(store, node_id, fp, state)
    except BuildctlError:
        return False
    return True


def pull(ctx: Context, profile: str, channel: str, dest: str | Path, options: PullOptions = PullOptions(), *,
         on_bytes: ProgressFn | None = None, on_health: Callable[[EngineState], None] | None = None,
         target: tuple[ChannelRecord, Manifest] | None = None) -> NodePull:
    """Pull for this node (``ctx.fingerprint``), then smoke-check what was installed (see the
    module docstring). ``on_health`` is called with each state recorded (the CLI emits the event
    from it). Raises :class:`EngineUnhealthyError` (after switching back) when the check fails.
    ``target``: the channel record and manifest already resolved for this node
    (``host.channel_target``), so they are not read again. ``options.require_covered``: refuse,
    before downloading, an engine not validated on this host's soft values
    (:class:`NotCoveredError`, exit 5)."""
    settings, node_id = ctx.settings, options.node_id
    fp = ctx.fingerprint
    dest = Path(dest)
    rec = target[0] if target else resolve_channel(ctx.store, profile, channel, host_compat_keys(fp))
    manifest = target[1] if target else None
    target_id = rec.artifact_for(node_id)
    cov = (check_covered(ctx.store, target_id, manifest or get_manifest(ctx.store, target_id), fp)
           if options.require_covered else None)
    verdict = health_marks(dest).get(target_id, {})
    if verdict.get("status") == "failed" and not options.retry_failed and current_artifact(dest) != target_id:
        raise EngineUnhealthyError(target_id, verdict.get("detail") or "failed", current_artifact(dest), held_back=True)
    preflight = None if options.skip_preflight else preflight_for(settings)
    res = buildctl.artifact_store.node.pull.pull(ctx.store, rec, dest, auth=ctx.auth, options=options,
                                                 preflight=preflight, on_bytes=on_bytes)
    health_cmd = options.health_cmd
    runs_check = options.health_check and (health_cmd is not None or not options.skip_preflight)
    if not runs_check or (not res.installed and verdict.get("status") == "healthy"):
        if node_id and res.installed:  # what it runs and keeps, for rollouts and gc: no verdict to add
            reported = _record(ctx.store, node_id, fp, EngineState(
                profile=profile, channel=channel, compat_key=rec.compat_key, artifact_id=target_id, seq=rec.seq,
                status="installed", detail="no smoke check", current=target_id, previous=previous_artifact(dest),
                when=utc_now()))
            return NodePull(res, rec, None, reported, cov)
        return NodePull(res, rec, None, coverage=cov)
    reported = True

    def report(status: HealthStatus, detail: str | None, current: str | None) -> EngineState:
        nonlocal reported
        state = EngineState(profile=profile, channel=channel, compat_key=rec.compat_key, artifact_id=target_id,
                            seq=rec.seq, status=status, detail=detail, current=current,
                            previous=previous_artifact(dest), when=utc_now())
        if node_id and not _record(ctx.store, node_id, fp, state):
            reported = False  # the verdict still holds on this node; the caller says it was not recorded
        if on_health is not None:
            on_health(state)
        return state

    report("installed", None, target_id)
    detail = smoke_check(settings, manifest or get_manifest(ctx.store, target_id), target_id, dest / "current",
                         health_cmd, options.health_timeout_s)
    if detail is None:
        mark_health(dest, target_id, "healthy", utc_now())
        return NodePull(res, rec, report("healthy", None, target_id), reported, cov)
    if not res.installed:  # it was current already, without a verdict (a crash mid-check): undo like an install
        res = PullResult(target_id, installed=True, path=res.path, previous=previous_artifact(dest))
    now_current = switch_back(dest, res)
    mark_health(dest, target_id, "failed", utc_now(), detail)
    report("failed", detail, now_current)
    raise EngineUnhealthyError(target_id, detail, now_current)


# --- coverage, staging before an upgrade, activation after it ---------------------------------


def check_covered(store: Store, artifact_id: str, manifest: Manifest, fp: Fingerprint) -> Coverage:
    """The artifact's coverage of this host's soft values; :class:`NotCoveredError` (exit 5) when
    it is not validated on them (``pull --require-covered``)."""
    cov = coverage(store, artifact_id, manifest, fp)
    if not cov.covered:
        raise NotCoveredError(artifact_id, cov.describe())
    return cov


@dataclass
class Staged:
    """What ``pull --for-upgrade TARGET --stage-only`` did."""

    entry: StagedEngine
    downloaded: bool
    projected: Fingerprint
    coverage: Coverage

    def to_json(self) -> dict:
        return {**self.entry.to_json(), "staged": True, "downloaded": self.downloaded,
                "projected_compat_keys": {b: self.projected.compat_key(b) for b in backend_names()},
                "coverage": self.coverage.to_json()}


def stage(ctx: Context, profile: str, channel: str, dest: str | Path, target: UpgradeTarget | None = None,
          options: PullOptions = PullOptions(), *, on_bytes: ProgressFn | None = None,
          target_record: ChannelRecord | None = None) -> Staged:
    """Download and deep-verify the engine this node will need after ``target``'s upgrade into
    ``DIR/versions/`` without touching ``current`` (no preflight: this host cannot load it yet).
    The node's own fingerprint (``ctx.fingerprint``) is projected with the target's fields; the
    channel record is checked as a pull checks it (freshness against ``options.min_seq``, and with
    trusted keys signatures and rollback); ``options.node_id`` picks the node's side of a rollout.
    ``target_record``: the record already resolved for the projected host, so it is not read again."""
    store = ctx.store
    fp = ctx.fingerprint
    projected = target.apply(fp) if target is not None else fp
    dest = Path(dest)
    rec = target_record or resolve_channel(store, profile, channel, host_compat_keys(projected))
    check_fresh(rec, options.min_seq)
    aid = rec.artifact_for(options.node_id)
    if ctx.auth.trusted is not None:
        check_trust(store, rec, ctx.auth.trusted, seen=installed_seqs(dest).get(channel_ref(rec), 0), artifact_id=aid)
    cov = coverage(store, aid, get_manifest(store, aid), projected)
    entry, downloaded = stage_artifact(store, rec, aid, dest, when=utc_now(), on_bytes=on_bytes,
                                       require_crypto=ctx.auth.require_crypto)
    return Staged(entry, downloaded, projected, cov)


@dataclass
class Activation:
    """What ``node activate`` did: a staged engine swapped in offline, or a pull.
    ``quarantine_checked``: whether the store answered the quarantine look-up of a staged engine
    (``None`` for a pull, which checks it as every pull does); ``quarantine_note`` says why not."""

    result: PullResult
    staged: StagedEngine | None
    seconds: float
    quarantine_checked: bool | None = None
    quarantine_note: str | None = None

    def to_json(self) -> dict:
        return {"artifact_id": self.result.artifact_id, "activated": self.result.installed,
                "from_staged": self.staged is not None, "previous": self.result.previous,
                "compat_key": self.result.record.compat_key if self.result.record else None,
                "seq": self.result.record.seq if self.result.record else None, "seconds": round(self.seconds, 3),
                "quarantine_checked": self.quarantine_checked, "quarantine_note": self.quarantine_note}


DEFAULT_CHANNEL = "prod"


def _quarantine_check(store: Store, artifact_id: str) -> tuple[bool, str | None]:
    """Refuse a staged engine quarantined since it was staged (exit 5) when the store answers at
    once; ``(False, why)`` when it does not (activation is offline by design, so it goes on)."""
    try:
        check_not_quarantined(fail_fast(store), artifact_id, "not activating it; the current engine stays")
    except (UnavailableError, StoreNotFoundError) as err:  # offline, or the bucket is gone: say so, go on
        return False, f"could not check the store's quarantine records ({err})"
    return True, None


def activate(ctx: Context, profile: str, dest: str | Path, *, channel: str | None = None,
             node_id: str | None = None, fingerprint: Fingerprint | None = None,
             skip_preflight: bool = False) -> Activation:
    """After an upgrade: fingerprint this host and swap ``current`` to the engine staged from
    ``channel`` (default prod) for its compat key (:func:`activate_staged`: the tree checked
    against the manifest, changed files re-hashed, then preflighted). Before the swap the store's
    quarantine records are read when the store answers at once, and the result says when it did
    not. With nothing staged for it, pull from ``channel`` as ``buildctl pull`` does; an
    unreachable store then fails with ``current`` as it was."""
    t0 = time.monotonic()
    channel = channel or DEFAULT_CHANNEL
    ctx = ctx.with_fingerprint(fingerprint) if fingerprint is not None else ctx
    keys = host_compat_keys(ctx.fingerprint)
    found = sorted((e for e in staged_engines(dest) if e.record.profile == profile and e.compat_key in keys
                    and e.record.channel == channel),
                   key=lambda e: (keys.index(e.compat_key), -e.record.seq))
    if found:
        checked, note = _quarantine_check(ctx.store, found[0].artifact_id)
        res = activate_staged(dest, found[0], auth=ctx.auth, now=now_utc(),
                              preflight=None if skip_preflight else preflight_for(ctx.settings))
        return Activation(res, found[0], time.monotonic() - t0, checked, note)
    got = pull(ctx, profile, channel, dest, PullOptions(node_id=node_id, skip_preflight=skip_preflight))
    return Activation(got.result, None, time.monotonic() - t0)


def serving_environment(dest: str | Path, *, scratch: str | Path | None = None, rehash: bool = True,
                        settings: Settings | None = None) -> dict:
    """What a serving runtime needs to use the bundle installed at ``DIR/current`` (``buildctl node
    env``): its working directory (the installed version), environment, engine arguments and the
    command line (``vllm serve`` for a vllm bundle, ``trtllm-serve --config`` for a trtllm-torch
    one). The bundle is checked first: its tree against its kept manifest by ``lstat``, and every
    byte re-hashed unless ``rehash`` is off, so a damaged kernel file is refused here, before the
    runtime ever loads it; a trtllm-torch bundle's caches are also checked against this host
    (each cache's recorded device and versions). ``scratch`` (default ``DIR/serve-cache/<id>``)
    gets a fresh writable copy of the bundle's caches: the runtime writes into its caches at every
    start, and the verified copy stays read-only."""
    import shutil

    from buildctl.artifact_store.errors import VerificationError
    from buildctl.artifact_store.node.install_dir import installed_manifests, local_problems, tree_problems
    from buildctl.artifact_store.manifest import parse_manifest
    from buildctl.core.digest import digest_bytes, hex_of
    from buildctl.engines.errors import EngineLoadError
    from buildctl.engines.trtllm_torch import backend as trtllm_torch
    from buildctl.engines.vllm import bundle as vllm_bundle

    bundles = {"vllm": vllm_bundle, "trtllm-torch": trtllm_torch}

    dest = Path(dest)
    art = current_artifact(dest)
    if art is None:
        raise EngineLoadError(str(dest / "current"), "nothing is installed here (buildctl pull first)")
    body = next((b for b in installed_manifests(dest) if digest_bytes(b) == art), None)
    if body is None:
        raise EngineLoadError(str(dest / "current"), f"the kept manifest of {art} is missing or does not hash to its "
                                                     "id: pull again")
    manifest = parse_manifest(body, f"kept manifest of {art}")
    kind = bundles.get(manifest.backend)
    if kind is None:
        raise EngineLoadError(str(dest / "current"), f"{art} is a {manifest.backend} engine, not a bundle "
                                                     f"({' or '.join(bundles)})")
    root = (dest / "current").resolve()
    problems = local_problems(manifest, root) if rehash else tree_problems(manifest, root)
    if problems:
        raise VerificationError(art, problems)
    record = kind.read_record(root)
    if kind is trtllm_torch:
        trtllm_torch.check_bundle(root, record, host_fingerprint(settings or Settings()))
    caches = Path(scratch) if scratch is not None else dest / "serve-cache" / hex_of(art)
    shutil.rmtree(caches, ignore_errors=True)
    caches.parent.mkdir(parents=True, exist_ok=True)
    kind.scratch_caches(root, caches)
    return {"artifact_id": art, "backend": manifest.backend, **kind.serving_plan(root, record, caches), "rehashed": rehash}
