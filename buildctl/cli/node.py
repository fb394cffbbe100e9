"""``buildctl node report|activate``: the node agent's report, on boot and after driver or CUDA changes,
and the activation of an engine staged before an upgrade."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from buildctl.cli._common import REQUIRE_CRYPTO_OPT, emit_json, context, out, settings, want_json
from buildctl.core.errors import EventNotDeliveredError

node_app = typer.Typer(help="Node agent commands.", no_args_is_help=True)


@node_app.command("report")
def report_cmd(
    ctx: typer.Context,
    node_id: str = typer.Option(..., "--node-id", help="This node's id."),
    profiles: list[str] = typer.Option([], "--profiles", help="Profiles this node serves (repeat, or comma-separate)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
    no_event: bool = typer.Option(False, "--no-event", help="Record only; do not emit the Prefect event."),
) -> None:
    """Record this host's fingerprint in the store's inventory; emit buildctl.node.driver-upgraded
    when a field its engines depend on changed since the last report: a hard one (its compat key
    changed: rebuild) or a soft one (re-check the engines it serves on the new values)."""
    from buildctl.steps import fleet, node_index
    from buildctl.engines.fingerprint import host_fingerprint

    names = sorted({p.strip() for item in profiles for p in item.split(",") if p.strip()})
    _check_profile_names(settings(ctx), names)
    store = context(ctx).store
    res = fleet.report_node(store, node_id, host_fingerprint(settings(ctx)), names)
    backends = _backends_of(settings(ctx), names)
    upgraded = res.upgraded_for(backends)
    owed = None if no_event else fleet.owed_event(res, backends)
    resent = owed is not None and not upgraded  # an earlier report's event, not delivered then
    event_id, undelivered = None, None
    if owed is not None:
        # The one place the CLI reaches the flows package, lazily: without Prefect installed
        # (a node agent's slim install) it records and says no event was emitted. The owed event
        # is marked in the inventory first and the mark is cleared only once the server has it.
        from buildctl.flows.events import emit_driver_upgraded

        if res.record.event_pending != owed:
            fleet.set_event_pending(store, node_id, owed)
        try:
            event_id = emit_driver_upgraded(node_id, owed.payload, list(owed.compat_keys))
        except EventNotDeliveredError as err:
            undelivered = err
        else:
            fleet.set_event_pending(store, node_id, None)
    summary = {"node_id": node_id, "profiles": names, "first_report": res.previous is None,
               "backends": sorted(backends), "upgraded": upgraded,
               "compat_changed": res.compat_changed, "compat_keys": res.record.compat_keys,
               "previous_compat_keys": node_index.node_compat_keys(res.previous) if res.previous else None,
               "soft_changed": {b: {k: list(v) for k, v in d.items()} for b, d in res.soft_changed.items()},
               "event_emitted": event_id is not None, "event_id": event_id, "event_resent": resent and event_id is not None,
               "event_pending": undelivered is not None}
    if undelivered is not None:
        if want_json(ctx, json_out):
            emit_json(summary)
        raise EventNotDeliveredError(f"{node_id}: report recorded, but {undelivered}; it stays pending in the "
                                     "inventory and the next report re-sends it")
    if want_json(ctx, json_out):
        emit_json(summary)
        return
    if resent:
        out().print(f"{node_id}: re-sent the {owed.event} event an earlier report ({owed.since}) could not deliver "
                    f"({event_id or 'no event API configured: cleared'})")
    if res.previous is None:
        out().print(f"{node_id}: first report recorded ({', '.join(names) or 'no profiles'})")
    elif res.upgraded and not upgraded:
        out().print(f"{node_id}: only fields that the engines of its profiles ({', '.join(sorted(backends))}) do not "
                    "depend on changed: recorded, no event")
    elif res.compat_changed:
        from buildctl.engines.fingerprint import parse_fingerprint

        before = parse_fingerprint(res.previous.fingerprint, "the previous report")
        after = parse_fingerprint(res.record.fingerprint, "this report")
        out().print(f"{node_id}: compat key changed; "
                    + (f"emitted buildctl.node.driver-upgraded ({event_id})" if event_id else "no event emitted"))
        previous = node_index.node_compat_keys(res.previous)
        for b, key in sorted(res.record.compat_keys.items()):
            was = previous.get(b)
            if key == was:
                continue
            out().print(f"  {b}: {was or 'none'} -> {key}")
            for name, (now, then) in sorted(after.compat_differences(before, b).items()):
                out().print(f"    {name}: {then} -> {now}")
    elif res.soft_changed:
        out().print(f"{node_id}: soft fields changed, compat keys kept (re-check, no rebuild); "
                    + (f"emitted buildctl.node.driver-upgraded ({event_id})" if event_id else "no event emitted"))
        for b, diff in sorted(res.soft_changed.items()):
            for name, (then, now) in diff.items():
                out().print(f"  {b} {name}: {then} -> {now}")
    else:
        out().print(f"{node_id}: unchanged since the last report")


def _check_profile_names(st, names: list[str]) -> None:
    """Refuse (exit 3) a profile name the profile directory does not have, listing those it has;
    a node without the profile directory records the names as given."""
    from buildctl.engines.errors import ProfileNotFoundError
    from buildctl.core.errors import BuildctlError
    from buildctl.steps.profiles import load_profiles

    try:
        known = load_profiles(st)
    except BuildctlError:
        return
    unknown = [n for n in names if n not in known]
    if known and unknown:
        raise ProfileNotFoundError(f"--profiles {', '.join(unknown)} (in {st.profile_dir})", tuple(sorted(known)))


def _backends_of(st, names: list[str]) -> set[str]:
    """The backends of the profiles a node serves, from the profile directory; every backend when
    none of them is found there (a node without the profiles: nothing is left out)."""
    from buildctl.engines.registry import backend_names
    from buildctl.core.errors import BuildctlError
    from buildctl.steps.profiles import load_profiles

    try:
        known = load_profiles(st)
    except BuildctlError:
        known = {}
    found = {known[n].engine.backend for n in names if n in known}
    return found or set(backend_names())


@node_app.command("activate")
def activate_cmd(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", help="Profile name (or --model)."),
    model: Optional[str] = typer.Option(None, "--model", help="Served model name: activate the first of its runtimes "
                                        "staged for this host (a fallback checked for cross-runtime parity), or pull "
                                        "as `pull --model` when none is staged (or --profile)."),
    dest: Path = typer.Option(..., "--dest", help="Install directory (as given to pull)."),
    channel: str = typer.Option("prod", "--channel", help="Only an engine staged from this channel; and the "
                                "channel to pull from when none is staged."),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Swap in after the tree and byte checks only, "
                                        "without a test load (as pull --skip-preflight)."),
    node_id: Optional[str] = typer.Option(None, "--node-id", help="This node's id, for a pull when nothing is staged."),
    require_crypto: bool = REQUIRE_CRYPTO_OPT,
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """After an upgrade: fingerprint this host and swap DIR/current to the engine staged for its
    compat key (`pull --for-upgrade TARGET --stage-only`), with no network; pull when none is staged."""
    from buildctl.core.errors import BadInputError
    from buildctl.steps import node_agent

    if (profile is None) == (model is None):
        raise BadInputError("give exactly one of --profile NAME and --model NAME")
    if model is not None:
        _activate_model(ctx, model, dest, channel, node_id, skip_preflight, require_crypto, json_out)
        return
    got = node_agent.activate(context(ctx, require_crypto=require_crypto), profile, dest, channel=channel,
                              node_id=node_id, skip_preflight=skip_preflight)
    if got.quarantine_note:
        typer.echo(f"warning: {got.quarantine_note}; activated from the staged copy as verified on this disk",
                   err=True)
    if want_json(ctx, json_out):
        emit_json(got.to_json())
        return
    res = got.result
    how = "staged engine, no network" if got.staged else "pulled: nothing was staged for this host"
    if res.installed:
        out().print(f"activated {res.artifact_id} at {Path(dest) / 'current'} in {got.seconds:.2f} s ({how}); "
                    f"previous: {res.previous or 'none'}")
    else:
        out().print(f"already current: {res.artifact_id} in {dest} ({how})")


def _activate_model(ctx: typer.Context, name: str, dest: Path, channel: str, node_id: str | None,
                    skip_preflight: bool, require_crypto: bool, json_out: bool) -> None:
    from buildctl.steps.profiles import served_model_by_name
    from buildctl.steps.runtimes import activate_model

    c = context(ctx, require_crypto=require_crypto)
    got = activate_model(c, served_model_by_name(c.settings, name), dest, channel=channel, node_id=node_id,
                         skip_preflight=skip_preflight)
    if node_id and got.choice.moved:  # onto a fallback, or back: the fallback alert waits on these
        from buildctl.flows.events import emit_runtime_choice

        emit_runtime_choice(node_id, got.to_json())
    if got.note or (got.activation is not None and got.activation.quarantine_note):
        typer.echo(f"warning: {got.note or got.activation.quarantine_note}; activated from the staged copy as "
                   "verified on this disk", err=True)
    if want_json(ctx, json_out):
        emit_json(got.to_json())
        return
    for p in got.choice.passed_over:
        out().print(f"{p.profile}: passed over: {p.reason}", highlight=False)
    res = got.choice.pull.result
    how = "staged, no network" if got.activation is not None else "pulled: nothing was staged for this host"
    out().print(f"{'activated' if res.installed else 'already current:'} {res.artifact_id} ({got.choice.profile}, "
                f"{how}) at {Path(dest) / 'current'}; {name} runs {got.choice.profile}: {got.choice.why()}",
                highlight=False)


@node_app.command("labels")
def labels_cmd(
    ctx: typer.Context,
    node: str = typer.Option("NODE", "--node", help="The Kubernetes node name for the printed kubectl command."),
    nfd: bool = typer.Option(False, "--nfd", help="One `label=value` line each: a Node Feature Discovery feature file "
                                                  "(docker/k8s/cluster.yaml's DaemonSet writes it)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Print this node's Kubernetes labels: its compat key per backend (what build jobs select on) and
    each hard field. Run it in the builder image on the node, so the key covers its toolchain. Exit 2
    when a GPU profile's backend sees no GPU (or lacks its build tool) in this runtime."""
    from buildctl.steps import fleet
    from buildctl.steps import profiles
    from buildctl.engines.errors import NoGpuLabelsError
    from buildctl.engines.fingerprint import host_fingerprint

    st = settings(ctx)
    fp = host_fingerprint(st)
    missing = fleet.unlabelled_gpu_backends(st, fp, profiles.load_profiles(st))
    if missing:
        raise NoGpuLabelsError(missing)
    labels = fleet.node_labels(st, fp)
    if want_json(ctx, json_out):
        emit_json(labels)
        return
    if nfd:
        for k, v in sorted(labels.items()):
            typer.echo(f"{k}={v}")
        return
    out().print(f"kubectl label node {node} --overwrite " + " ".join(f"{k}={v}" for k, v in sorted(labels.items())),
                soft_wrap=True)


@node_app.command("env")
def env_cmd(
    ctx: typer.Context,
    dest: Path = typer.Option(..., "--dest", help="Install directory (as given to pull) holding a vllm or trtllm-torch bundle."),
    scratch: Optional[Path] = typer.Option(None, "--scratch", help="Where the writable copy of the bundle's caches "
                                           "goes (default DIR/serve-cache/<id>; replaced on every call)."),
    quick: bool = typer.Option(False, "--quick", help="Check the tree by lstat only, without re-hashing every byte."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Print what the serving runtime needs to use the bundle installed at DIR/current: working
    directory, environment and the command (vllm serve, or trtllm-serve --config for a
    trtllm-torch bundle), as shell lines or --json. Verifies the bundle first (and a trtllm-torch
    bundle's caches against this host's device and versions) and makes a fresh writable copy of its
    caches: the runtime writes at every start, the installed copy stays read-only."""
    import shlex

    from buildctl.steps import node_agent

    plan = node_agent.serving_environment(dest, scratch=scratch, rehash=not quick, settings=settings(ctx))
    if want_json(ctx, json_out):
        emit_json(plan)
        return
    lines = [f"# {plan['backend']} bundle {plan['artifact_id']} ({'every byte re-hashed' if plan['rehashed'] else 'tree checked'})",
             f"cd {shlex.quote(plan['cwd'])}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(plan["env"].items())]
    lines.append(shlex.join(plan["command"]))
    typer.echo("\n".join(lines))
