"""``buildctl rollout status|pause|resume|abort``: follow and steer a channel's rollout."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import emit_json, context, fail_on_skipped, out, short_id, want_json

rollout_app = typer.Typer(help="Follow and steer rollouts started by `promote --rollout`.", no_args_is_help=True)

PROFILE_OPT = typer.Option(..., "--profile", help="Profile name.")
CHANNEL_OPT = typer.Option(..., "--channel", help="Channel name.")
COMPAT_OPT = typer.Option(None, "--compat-key", help="Only this compat key's channel ref.")
JSON_OPT = typer.Option(False, "--json", help="JSON output.")


def _wave_table(v) -> Table:
    t = Table(title=f"{v.record.profile}/{v.record.channel} [{short_id(v.record.compat_key)}] #{v.record.seq}")
    for c in ("wave", "share", "max failures", "nodes", "done", "healthy", "failed", "not reported", "state"):
        t.add_column(c)
    for w in v.waves:
        t.add_row(str(w.index + 1), f"{w.percent:g}%", f"{w.max_failures} (= {w.allowed})", str(w.nodes), str(w.done),
                  str(w.healthy), str(w.failed), str(w.pending + w.installed), w.state)
    return t


@rollout_app.command("status")
def status_cmd(ctx: typer.Context, profile: str = PROFILE_OPT, channel: str = CHANNEL_OPT,
               compat_key: Optional[str] = COMPAT_OPT, json_out: bool = JSON_OPT) -> None:
    """The rollout on the channel: its waves, with nodes done, healthy and failed, and what comes next."""
    from buildctl.steps.rollouts import status

    skipped: list[tuple[str, str]] = []
    views = status(context(ctx).store, profile, channel, compat_key, skipped)
    if want_json(ctx, json_out):
        emit_json([v.to_json() for v in views])
    else:
        for v in views:
            _print_view(profile, channel, v)
    fail_on_skipped("rollout status", skipped)


def _print_view(profile: str, channel: str, v) -> None:
    r = v.record.rollout
    if r is None:
        out().print(f"{profile}/{channel} [{short_id(v.record.compat_key)}]: no rollout; every node gets "
                    f"{v.record.artifact_id}", highlight=False)
        return
    out().print(f"rollout of {r.target} over {r.base}: {r.state}, wave {r.wave + 1} of {len(r.waves)}, "
                f"bake {r.bake_s:g}s, started {r.started_at}", highlight=False)
    out().print(_wave_table(v))
    for s in r.summaries:  # what the tick counted when it decided on each wave (kept in the record)
        out().print(f"wave {s.wave + 1} ({s.percent:g}%) {s.decision} at {s.at}: {s.healthy} healthy, {s.failed} failed "
                    f"(budget {s.allowed}), {s.installed + s.pending} not reported of {s.nodes}", highlight=False)
    out().print(f"next: {v.decision}: {v.why}", highlight=False)
    if r.failed_nodes:
        out().print(f"failed nodes: {', '.join(r.failed_nodes)}", highlight=False)


def _control(ctx: typer.Context, step: str, profile: str, channel: str, compat_key: str | None,
             reason: str | None, json_out: bool) -> None:
    from buildctl.steps.rollouts import control

    recs = control(context(ctx), step, profile, channel, compat_key, reason)
    if want_json(ctx, json_out):
        emit_json([r.body() for r in recs])
        return
    for r in recs:
        state = r.rollout.state if r.rollout else "?"
        out().print(f"{r.channel} #{r.seq} [{short_id(r.compat_key)}]: rollout {state}; the channel gives "
                    + (f"every node {r.artifact_id}" if state == "aborted" else f"wave nodes {r.artifact_id}"),
                    highlight=False)


def _control_command(step: str, doc: str):
    def command(ctx: typer.Context, profile: str = PROFILE_OPT, channel: str = CHANNEL_OPT,
                compat_key: Optional[str] = COMPAT_OPT,
                reason: Optional[str] = typer.Option(None, "--reason", help="Why; recorded in the history."),
                json_out: bool = JSON_OPT) -> None:
        _control(ctx, step, profile, channel, compat_key, reason, json_out)

    command.__doc__ = doc
    return command


for _step, _doc in (
    ("pause", "Stop advancing the rollout (nodes keep what they have; failures over budget still halt it)."),
    ("resume", "Let the rollout-channel flow advance a paused rollout again."),
    ("abort", "End the rollout and point the channel back at the artifact it started from, for every node."),
):
    rollout_app.command(_step)(_control_command(_step, _doc))
