"""This host's side of a pull: its compat keys, the channel record and manifest it would install, the
preflight load of a staged engine, and the record of a refused pull.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from buildctl.engines.backend import Runner
from buildctl.engines.errors import PreflightLoadError
from buildctl.engines.fingerprint import Fingerprint
from buildctl.engines.registry import backend_names, backend_of_engine_dir, get_backend
from buildctl.steps.fleet import record_pull_failure
from buildctl.artifact_store.fleet.inventory import PullFailure
from buildctl.steps.context import Context
from buildctl.core.errors import BuildctlError
from buildctl.core.settings import Settings
from buildctl.artifact_store.channels import ChannelRecord
from buildctl.artifact_store.errors import VerificationError
from buildctl.artifact_store.manifest import Manifest
from buildctl.core.times import utc_now
from buildctl.artifact_store.node.pull import resolve_channel
from buildctl.artifact_store.read import get_manifest


# --- preflight and engines -------------------------------------------------------------------

PREFLIGHT_TIMEOUT_S = 900


def preflight_for(settings: Settings) -> Callable[[Manifest, Path], None]:
    """The preflight load of a staged engine by its manifest's backend, run in a subprocess so
    that a crash while loading (a segfault in a C++ runtime, SIGILL from a foreign ISA) cannot take
    the caller down. Raises :class:`PreflightLoadError` with the output's tail."""

    def run(manifest: Manifest, staged: Path) -> None:
        backend = manifest.backend
        cmd = [sys.executable, "-m", "buildctl.engines.preflight", backend, str(staged)]
        if settings.fingerprint_file:
            cmd += ["--fingerprint-file", str(settings.fingerprint_file)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=PREFLIGHT_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PreflightLoadError(backend, f"timed out after {PREFLIGHT_TIMEOUT_S}s") from None
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-5:])
            how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
            raise PreflightLoadError(backend, f"({how}): {tail}")

    return run


def load_engine(settings: Settings, engine_dir: str | Path) -> Runner:
    """Load an engine directory with its backend's runner."""
    return get_backend(backend_of_engine_dir(engine_dir), settings).load(Path(engine_dir))


def host_compat_keys(fingerprint: Fingerprint) -> list[str]:
    """This host's compat key for every registered backend, in registration order, then its
    schema-1 keys: a channel written before the hard/soft split resolves until ``migrate-keys``
    gives it a ref under the new key, which then wins."""
    keys = [fingerprint.compat_key(b) for b in backend_names()]
    return list(dict.fromkeys(keys + [fingerprint.legacy_compat_key(b) for b in backend_names()]))


def channel_target(ctx: Context, profile: str, channel: str,
                   fingerprint: Fingerprint | None = None, node_id: str | None = None) -> tuple[ChannelRecord, Manifest]:
    """The record and the manifest a pull on this host (as ``node_id``, during a rollout) would install."""
    rec = resolve_channel(ctx.store, profile, channel, host_compat_keys(fingerprint or ctx.fingerprint))
    return rec, get_manifest(ctx.store, rec.artifact_for(node_id))


def report_pull_failure(ctx: Context, node_id: str, fingerprint: Fingerprint,
                        record: ChannelRecord, err: BuildctlError, artifact_id: str | None = None) -> PullFailure | None:
    """Record a refused pull of ``artifact_id`` (default: the record's) in the node's inventory
    record (the node cannot write anything else); ``None`` when even that write failed (the error
    is what the operator sees either way)."""
    failure = PullFailure(artifact_id=artifact_id or record.artifact_id, profile=record.profile, channel=record.channel,
                          compat_key=record.compat_key,
                          files=tuple(p.path for p in err.problems) if isinstance(err, VerificationError) else (),
                          error=f"{type(err).__name__}: {str(err).splitlines()[0]}", when=utc_now())
    try:
        record_pull_failure(ctx.store, node_id, fingerprint, failure)
    except BuildctlError:
        return None
    return failure
