"""When an artifact rots: quarantine, repair, scrub and heal."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import JSON_OPT, emit_json, context, fail_on_skipped, out, short_id, want_json

GIB = 1 << 30


def quarantine_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    reason: str = typer.Option(..., "--reason", help="Why; recorded (and signed, when a key is configured)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Take an artifact out of service: never a cache hit, never promoted, never pulled."""
    from buildctl.steps.healing import quarantine

    aid, key = quarantine(context(ctx), artifact, reason)
    if want_json(ctx, json_out):
        emit_json({"artifact_id": aid, "quarantine_record": key})
    else:
        out().print(f"quarantined {aid}: {key}")


def repair_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    source: str = typer.Option(..., "--from", help="A verified copy: a node's DIR/versions/<id> directory, or a store URI."),
    json_out: bool = JSON_OPT,
) -> None:
    """Put back exactly the blobs whose digests match the manifest, then lift the quarantine."""
    from buildctl.steps.healing import repair
    from buildctl.artifact_store.read import verify

    c = context(ctx)
    store = c.store
    res = repair(c, artifact, source)
    if want_json(ctx, json_out):
        emit_json(res.to_json())
    else:
        out().print(f"{res.artifact_id}: replaced {len(res.replaced)} blob(s) ({', '.join(res.replaced) or 'none'})"
                    + (f"; lifted the quarantine ({res.lifted})" if res.lifted else ""))
    if not res.healthy:
        verify(store, res.artifact_id, deep=True)  # raises, naming each file still wrong (exit 4)


def scrub_cmd(
    ctx: typer.Context,
    sample: float = typer.Option(1.0, "--sample", help="Fraction of the artifacts no channel references to check (0-1]."),
    channels_only: bool = typer.Option(False, "--channels-only", help="Only artifacts a channel points at."),
    budget_gib: Optional[float] = typer.Option(None, "--budget-gib", min=0, max=1e9, help="Stop after re-hashing this many GiB."),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, max=2**63 - 1, help="Seed of the sample (default: a new sample each run)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Deep-verify artifacts, channel-referenced first; quarantine every failure; exit 4 if any.
    Then read every small record of every kind: exit 10 names each malformed one."""
    from buildctl.steps.healing import scrub
    from buildctl.artifact_store.errors import ScrubFoundCorruptionError

    report = scrub(context(ctx, existing=True), sample=sample, channels_only=channels_only,
                   budget_bytes=int(budget_gib * GIB) if budget_gib is not None else None, seed=seed)
    if want_json(ctx, json_out):
        emit_json(report.to_json())
    else:
        t = Table(title=f"scrub: {len(report.rows)} artifacts, {report.checked_bytes} bytes re-hashed")
        for c in ("artifact", "profile", "channels", "bytes", "status", "problems"):
            t.add_column(c)
        for r in report.rows:
            t.add_row(short_id(r.artifact_id), r.profile, ", ".join(r.channels) or "-", str(r.bytes),
                      r.status.upper() if r.status == "corrupt" else r.status, "; ".join(r.problems))
        out().print(t)
        ix = report.node_index
        if ix is not None:
            out().print(f"node index: {ix.markers} marker(s) of {ix.nodes} node(s); "
                        f"{len(ix.missing)} missing written, {len(ix.stale)} stale deleted")
        for key, why in report.history:
            out().print(f"history: {key}: {why}", highlight=False)
    if report.failed:
        raise ScrubFoundCorruptionError([r.artifact_id for r in report.corrupt], report.history)
    fail_on_skipped("scrub", report.skipped)


def heal_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    source: Optional[str] = typer.Option(None, "--from", help="A verified copy to repair from (directory or store URI)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Deep verify; if the store's copy is bad: quarantine, roll channels back, repair or say what to rebuild."""
    from buildctl.steps.healing import heal_artifact

    rep = heal_artifact(context(ctx), artifact, repair_source=source)
    data = rep.to_json()
    if want_json(ctx, json_out):
        emit_json(data)
        return
    con = out()
    if rep.store_copy_ok:
        con.print(f"{rep.artifact_id}: the store's copy deep-verifies; nothing quarantined (a node's own copy was bad)")
        return
    con.print(f"{rep.artifact_id}: quarantined ({rep.quarantine_key}): {'; '.join(rep.problems)}")
    for r in rep.recoveries:
        con.print(f"  {r.profile}/{r.channel} [{r.compat_key}]: " + (f"rolled back to {r.rolled_back_to} (#{r.seq})"
                                                                   if r.rolled_back_to else r.detail))
    if rep.repair is not None:
        con.print(f"  repair: replaced {', '.join(rep.repair.replaced) or 'nothing'}; "
                  + ("healthy, quarantine lifted" if rep.repair.healthy else f"still bad: {', '.join(rep.repair.unrepaired)}"))
    for profile, key in rep.rebuild:
        con.print(f"  rebuild: buildctl build <profile file of {profile}> on a host with compat key {key}")
