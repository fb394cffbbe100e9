"""``buildctl upgrade plan|prepare|ready`` and ``buildctl migrate-keys``: planned driver and
toolchain upgrades, and re-pointing channels written under schema-1 compat keys."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import context, emit_json, out, settings, short_id, want_json

upgrade_app = typer.Typer(help="Plan and prepare a driver or toolchain upgrade so that it costs each node a swap.",
                          no_args_is_help=True)

TO_OPT = typer.Option(..., "--to", help="TARGET.yaml: fingerprint fields after the upgrade, nested as in "
                      "`fingerprint --json` (driver_version: \"580.65.06\", cpu: {isa_level: x86-64-v3}).")
CHANNEL_OPT = typer.Option("prod", "--channel", help="The channel the nodes pull from.")
JSON_OPT = typer.Option(False, "--json", help="JSON output.")
NODES_OPT = typer.Option(None, "--nodes", help="Only nodes whose id matches this glob (gpu-a-*).")


def _plan_table(p) -> Table:
    t = Table(title=f"upgrade plan: {', '.join(f'{k}={v}' for k, v in p.target.items())} (channel {p.channel})")
    for c in ("gpu model", "profile", "nodes", "state", "compat key", "artifact", "detail"):
        t.add_column(c)
    for row in p.table():
        t.add_row(row["gpu model"], row["profile"], str(row["nodes"]), row["state"], row["compat key"],
                  short_id(row["artifact"] or None), row["detail"])
    return t


def _served_table(p) -> Table:
    """Per served model and node group: swap, fallback or idle, with node-minutes."""
    t = Table(title="served models: what the upgrade costs each node group")
    for c in ("model", "gpu model", "nodes", "outcome", "serves", "node-min without", "node-min on fallback",
              "until engine ready", "detail"):
        t.add_column(c)
    fmt = (lambda x: "unknown" if x is None else f"{x:,.1f}")
    for s in p.served:
        j = s.to_json()
        t.add_row(j["model"], j["gpu_model"], str(len(j["nodes"])), j["outcome"], j["runtime"] or "nothing",
                  fmt(j["node_minutes_without_runtime"]), fmt(j["node_minutes_on_fallback"]),
                  ("unknown" if j["ready_minutes"] is None else f"{j['ready_minutes']:.1f} min") + f" ({j['estimate']})",
                  j["detail"])
    return t


def _counts(p) -> str:
    return ", ".join(f"{n} {state}" for state, n in p.counts().items()) or "no (node, profile) pairs"


@upgrade_app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    to: Path = TO_OPT,
    channel: str = CHANNEL_OPT,
    nodes: Optional[str] = NODES_OPT,
    served_queue: list[str] = typer.Option([], "--served-queue", help="A work queue that has a worker (repeat); "
                                           "given, a key no listed queue serves is blocked."),
    json_out: bool = JSON_OPT,
) -> None:
    """For each node of the inventory and each profile it serves, what the upgrade to TARGET
    leaves it: ready, promote, re-check, build or blocked."""
    from buildctl.engines.fingerprint import load_target
    from buildctl.steps.profiles import load_profiles
    from buildctl.steps.upgrade import plan

    target = load_target(to)  # bad input first, before the store is looked at
    p = plan(context(ctx, existing=True), target, load_profiles(settings(ctx)), channel=channel, nodes_glob=nodes,
             served=set(served_queue) or None)
    if want_json(ctx, json_out):
        emit_json(p.to_json())
        return
    out().print(_plan_table(p))
    if p.served:
        out().print(_served_table(p))
    out().print(_counts(p))
    for s in p.skipped:
        out().print(f"skipped: {s}")


@upgrade_app.command("prepare")
def prepare_cmd(
    ctx: typer.Context,
    to: Path = TO_OPT,
    channel: str = CHANNEL_OPT,
    nodes: Optional[str] = NODES_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Run the plan's re-checks and builds here, as a worker of this host's fingerprint; new builds
    go to staging. For prod, print the `buildctl promote` commands CI runs."""
    from buildctl.engines.fingerprint import load_target
    from buildctl.steps.profiles import load_profiles
    from buildctl.steps.upgrade import prepare

    quiet = want_json(ctx, json_out)
    say = (lambda m: None) if quiet else (lambda m: typer.echo(f"[prepare] {m}", err=True))
    target = load_target(to)  # bad input first, before the store is looked at
    done, after = prepare(context(ctx, existing=True), target, load_profiles(settings(ctx)), channel=channel,
                          nodes_glob=nodes, say=say)
    if quiet:
        emit_json({"done": [d.to_json() for d in done], "plan": after.to_json()})
        return
    for d in done:
        out().print(f"{d.profile} [{d.compat_key}]: {d.action} {d.artifact_id or ''} ({d.detail}, {d.seconds:.0f} s)")
    out().print(_plan_table(after))
    out().print(_counts(after))
    commands = [c for d in done for c in d.promote_commands]
    if commands:
        out().print(f"{channel} is promoted from CI; run:")
        for c in commands:
            out().print(f"  {c}")


@upgrade_app.command("ready")
def ready_cmd(
    ctx: typer.Context,
    node: str = typer.Option(..., "--node", help="The node's id, as it reports."),
    to: Path = TO_OPT,
    channel: str = CHANNEL_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Exit 0 only when every profile the node serves is ready for the upgrade; else exit 5 and
    list what is missing (3: the node is not in the inventory). The gate a drain hook calls."""
    from buildctl.engines.fingerprint import load_target
    from buildctl.steps.profiles import load_profiles
    from buildctl.steps.upgrade import NotReadyError, ready

    try:
        target = load_target(to)  # bad input first, before the store is looked at
        p = ready(context(ctx, existing=True), node, target, load_profiles(settings(ctx)), channel=channel)
    except NotReadyError as err:
        if want_json(ctx, json_out):
            emit_json({"node_id": node, "ready": False, "missing": err.missing})
        raise
    if want_json(ctx, json_out):
        emit_json({"node_id": node, "ready": True, "profiles": {g.profile: g.to_json() for g in p.groups}})
        return
    for g in p.groups:
        out().print(f"{node} {g.profile}: ready ({g.detail})")


def migrate_keys_cmd(
    ctx: typer.Context,
    apply: bool = typer.Option(False, "--apply", help="Write the new refs (default: a dry run that lists them)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Give every channel ref under a schema-1 compat key a ref under its artifact's key now, as a
    history record; the old ref stays. Dry run unless --apply."""
    from buildctl.steps.upgrade import migrate_keys

    moves = migrate_keys(context(ctx, existing=True), apply=apply)
    if want_json(ctx, json_out):
        emit_json({"applied": apply, "moves": [m.to_json() for m in moves]})
        return
    if not moves:
        out().print("every channel ref is under its artifact's compat key: nothing to migrate")
    for m in moves:
        what = (f"#{m.seq}" if m.seq else ("would re-point" if m.action == "re-point" else m.action))
        out().print(f"{m.profile}/{m.channel}: {m.old_key} -> {m.new_key} {what} ({m.artifact_id})"
                    + (f": {m.detail}" if m.detail else ""))
    if moves and not apply:
        out().print("dry run: pass --apply to write them")
