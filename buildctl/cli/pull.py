"""The node-side pull: install a channel's engine for this node, or stage it for after an upgrade."""

from __future__ import annotations

import time

from pathlib import Path
from typing import Optional

import typer

from buildctl.cli._common import JSON_OPT, REQUIRE_CRYPTO_OPT, context, emit_json, out, want_json
from buildctl.cli.progress import byte_progress
from buildctl.artifact_store.layout import node_key


def pull_cmd(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", help="Profile name (or --model)."),
    model: Optional[str] = typer.Option(None, "--model", help="Served model name (<profile dir>/models/NAME.yaml): install the first of its runtimes that fits this node, else the next (or --profile)."),
    channel: str = typer.Option(..., "--channel", help="Channel name."),
    dest: Path = typer.Option(..., "--dest", help="Install directory; DIR/current points at the engine."),
    keep: int = typer.Option(2, "--keep", min=2, max=10_000, help="Installed versions to keep (current and previous at least)."),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Install after byte verification only, without a test load (e.g. staging a cache on a host without the GPU)."),
    node_id: Optional[str] = typer.Option(None, "--node-id", help="This node's id: picks its side of a rollout (by wave bucket); its smoke-check verdict and any refused pull (exit 4 or 5) go into its inventory record, with a buildctl.node.* event."),
    health_cmd: Optional[str] = typer.Option(None, "--health-cmd", help="Smoke check to run after installing, via sh -c with the engine dir as $1 and the artifact id as $2 (default: load the engine and generate a few tokens)."),
    health_check: Optional[bool] = typer.Option(None, "--health-check/--no-health-check", help="Smoke-check a newly installed engine and switch back to the previous one if it fails (default: on with --node-id or --health-cmd)."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Install an artifact again although it failed its smoke check here before."),
    min_seq: int = typer.Option(0, "--min-seq", min=0, max=2**63 - 1, help="Refuse a channel record older than this sequence (exit 4); provisioning pins it so a new node cannot be handed a replayed record."),
    require_covered: bool = typer.Option(False, "--require-covered", help="Refuse (exit 5), before downloading, an engine not validated on this host's soft values (driver, GPU model, CUDA minor; see fingerprint --json)."),
    for_upgrade: Optional[Path] = typer.Option(None, "--for-upgrade", help="TARGET.yaml: pull the engine this node needs after that upgrade (its fingerprint with the target's fields); needs --stage-only."),
    stage_only: bool = typer.Option(False, "--stage-only", help="Download and deep-verify into DIR/versions/ without touching DIR/current; `buildctl node activate` swaps it in later, offline."),
    require_crypto: bool = REQUIRE_CRYPTO_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Install the channel's engine for this node: verify, preflight, swap atomically, smoke-check.
    With --for-upgrade TARGET --stage-only: stage the engine for after an upgrade instead."""
    from buildctl.artifact_store.node.pull import PullOptions
    from buildctl.steps.coverage import coverage
    from buildctl.core.errors import BadInputError, GateRefusedError, IntegrityError
    from buildctl.steps import node_agent
    from buildctl.steps.host import channel_target, report_pull_failure

    if (profile is None) == (model is None):
        raise BadInputError("give exactly one of --profile NAME and --model NAME")
    if model is not None and stage_only:
        raise BadInputError("--model with --stage-only: stage the runtime's profile with --profile instead "
                            "(the choice between runtimes is made when the node pulls or activates)")
    if for_upgrade is not None and not stage_only:
        raise BadInputError("--for-upgrade needs --stage-only: the engine for the upgraded host cannot load before "
                            "the upgrade; stage it now and run `buildctl node activate` after the upgrade")
    c = context(ctx, require_crypto=require_crypto)  # a bad trusted-key layout is reported before anything else
    fp = c.fingerprint
    quiet = want_json(ctx, json_out)
    checks = health_check if health_check is not None else bool(node_id or health_cmd)
    options = PullOptions(node_id=node_id, keep=keep, min_seq=min_seq, skip_preflight=skip_preflight,
                          health_check=checks, health_cmd=health_cmd, retry_failed=retry_failed,
                          require_covered=require_covered)
    if stage_only:
        _stage(c, profile, channel, dest, for_upgrade, options, quiet)
        return
    if model is not None:
        _pull_model(c, model, channel, dest, options, quiet)
        return
    rec, manifest = channel_target(c, profile, channel, fp, node_id=node_id)

    def on_health(state) -> None:
        if not node_id:
            return
        # The one place besides node report that reaches the flows package, lazily.
        from buildctl.flows.events import emit_engine_health

        emit_engine_health(node_id, state.model_dump(mode="json"))
        if state.status != "installed" and not quiet:
            out().print(f"smoke check: {state.status}" + (f" ({state.detail})" if state.detail else ""), highlight=False)

    t0 = time.monotonic()
    try:
        with byte_progress("downloading + verifying", manifest.total_size, enabled=not quiet) as on_bytes:
            got = node_agent.pull(c, profile, channel, dest, options, on_bytes=on_bytes, on_health=on_health,
                                  target=(rec, manifest))
    except (IntegrityError, GateRefusedError) as err:
        if node_id:
            failure = report_pull_failure(c, node_id, fp, rec, err, artifact_id=rec.artifact_for(node_id))
            if failure is not None:
                from buildctl.flows.events import emit_pull_failed

                event_id = emit_pull_failed(node_id, failure.model_dump(mode="json"))
                typer.echo(f"recorded in {node_key(node_id)}"
                           + (f"; emitted buildctl.node.pull-failed ({event_id})" if event_id else ""), err=True)
        raise
    res, rec = got.result, got.record
    if quiet:
        emit_json({"artifact_id": res.artifact_id, "installed": res.installed, "path": str(res.path),
                   "preflight": not skip_preflight,
                   "current": str(Path(dest) / "current"), "previous": res.previous, "seq": rec.seq,
                   "bytes": res.bytes, "health": got.state.status if got.state else None,
                   "health_recorded": got.reported if got.state and node_id else None,
                   "rollout": rec.rollout.state if rec.rollout else None,
                   "coverage": (got.coverage or coverage(c.store, res.artifact_id, manifest, fp)).to_json()})
    elif res.installed:
        secs = max(time.monotonic() - t0, 1e-6)
        out().print(f"installed {res.artifact_id} ({channel} #{rec.seq}) at {Path(dest) / 'current'}; "
                    f"previous: {res.previous or 'none'}; {len(manifest.files)} files, {res.bytes / 1e6:.1f} MB "
                    f"in {secs:.1f} s ({res.bytes / 1e6 / secs:.1f} MB/s, verified)", highlight=False)
    else:
        out().print(f"already installed: {res.artifact_id} ({channel} #{rec.seq}) is current in {dest}", highlight=False)
    if got.state is not None and node_id and not got.reported:
        typer.echo(f"warning: could not record the smoke-check verdict in {node_key(node_id)}", err=True)


def _stage(c, profile: str, channel: str, dest: Path, for_upgrade: Path | None, options, quiet: bool) -> None:
    from buildctl.steps import node_agent
    from buildctl.engines.fingerprint import load_target
    from buildctl.steps.host import channel_target

    target = load_target(for_upgrade) if for_upgrade is not None else None
    projected = target.apply(c.fingerprint) if target is not None else c.fingerprint
    rec, manifest = channel_target(c, profile, channel, projected, node_id=options.node_id)
    with byte_progress("staging: downloading + verifying", manifest.total_size, enabled=not quiet) as on_bytes:
        got = node_agent.stage(c, profile, channel, dest, target, options, on_bytes=on_bytes, target_record=rec)
    if quiet:
        emit_json(got.to_json())
        return
    out().print(f"staged {got.entry.artifact_id} ({channel} #{got.entry.record.seq}, {got.entry.compat_key}) in "
                f"{Path(dest) / 'versions'}; current untouched" + ("" if got.downloaded else " (already on disk, re-hashed)"),
                highlight=False)
    if not got.coverage.covered:
        out().print(f"note: {got.coverage.describe()}", highlight=False)
    out().print(f"after the upgrade: buildctl node activate --profile {profile} --channel {channel} --dest {dest}",
                highlight=False)


def _pull_model(c, name: str, channel: str, dest: Path, options, quiet: bool) -> None:
    """``pull --model``: the first runtime of the served model that fits (steps.runtimes)."""
    from buildctl.steps.profiles import served_model_by_name
    from buildctl.steps.runtimes import pull_model

    model = served_model_by_name(c.settings, name)

    def on_pass(p) -> None:
        if not quiet:
            out().print(f"{p.profile}: passed over: {p.reason}", highlight=False)

    chosen = pull_model(c, model, channel, dest, options, on_pass=on_pass)
    res, rec = chosen.pull.result, chosen.pull.record
    if options.node_id and chosen.moved:  # onto a fallback, or back: the fallback alert waits on these
        from buildctl.flows.events import emit_runtime_choice

        emit_runtime_choice(options.node_id, {**chosen.to_json(), "artifact_id": res.artifact_id,
                                              "compat_key": rec.compat_key})
    if quiet:
        emit_json({**chosen.to_json(), "artifact_id": res.artifact_id, "installed": res.installed,
                   "current": str(Path(dest) / "current"), "previous": res.previous, "seq": rec.seq,
                   "compat_key": rec.compat_key, "bytes": res.bytes,
                   "health": chosen.pull.state.status if chosen.pull.state else None})
        return
    what = f"installed {res.artifact_id}" if res.installed else f"already installed: {res.artifact_id}"
    out().print(f"{what} ({chosen.profile}, {channel} #{rec.seq}) at {Path(dest) / 'current'}; "
                f"{model.name} runs {chosen.profile}: {chosen.why()}", highlight=False)
