"""Channel commands: promote, history, rollback."""

from __future__ import annotations


from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import JSON_OPT, context, emit_json, fail_on_skipped, out, short_id, want_json


TRUST_OPT = typer.Option(None, "--trust-verify-within", help="Trust a deep verify of the artifact this recent (1h, 30m) "
                         "instead of re-hashing every blob now; recorded in the channel record and shown by history.")

def _record_json(rec) -> dict:
    return rec.body()


def promote_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    channel: str = typer.Option(..., "--channel", help="Channel name, e.g. staging or prod."),
    force: bool = typer.Option(False, "--force", help="Break glass: skip the gates (needs --reason; recorded)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why; recorded in the history."),
    rollout: Optional[str] = typer.Option(None, "--rollout", help="Roll out in waves: cumulative percentages of nodes, e.g. 1,10,50,100 (default: every node at once)."),
    bake: Optional[str] = typer.Option(None, "--bake", help="With --rollout: how long each wave runs before the next (30m, 2h, 0; default 30m)."),
    max_failures: Optional[str] = typer.Option(None, "--max-failures", help="With --rollout: failed nodes each wave tolerates, a count or a share, one for all or one per wave (e.g. 0,1%,2%,2%; default 0)."),
    trust_verify_within: Optional[str] = TRUST_OPT,
    new_channel: bool = typer.Option(False, "--new-channel", help="Create a channel outside BUILDCTL_CHANNELS (default staging, prod) that the store does not have yet; without it such a name is refused as a typo."),
    json_out: bool = JSON_OPT,
) -> None:
    """Move a channel to an artifact that verifies and passed validation (with --rollout: in waves).
    Every blob is re-hashed first unless --trust-verify-within allows a recent deep verify. prod
    takes only an artifact that was on staging first; --force --reason overrides that and the
    attestation gate, and is recorded."""
    from buildctl.steps.promote import promote
    from buildctl.artifact_store.errors import StoreArgumentError
    from buildctl.artifact_store.fleet.waves import RolloutPlan, parse_waves
    from buildctl.core.times import parse_duration

    plan = None
    if rollout is not None:
        plan = RolloutPlan(waves=parse_waves(rollout, max_failures), bake_s=parse_duration(bake or "30m"))
    elif max_failures is not None or bake is not None:
        raise StoreArgumentError("--bake and --max-failures need --rollout")
    from buildctl.artifact_store.channels import pending_promotion

    c = context(ctx)
    rec = promote(c, artifact, channel, force=force, reason=reason, rollout=plan,
                           trust_verify_within_s=parse_duration(trust_verify_within) if trust_verify_within else 0.0,
                           new_channel=new_channel)
    store, trusted = c.store, c.auth.trusted
    pend = pending_promotion(store, rec.profile, rec.channel, rec.compat_key)
    if pend is not None and (pend.seq, pend.artifact_id) == (rec.seq, rec.artifact_id):  # waiting for more signatures
        have, need = len(rec.signers(trusted)) if trusted else 1, trusted.threshold(channel) if trusted else 1
        if want_json(ctx, json_out):
            emit_json({**_record_json(rec), "pending": True, "signatures": have, "required": need,
                       "missing": need - have})
        else:
            out().print(f"{rec.channel} #{rec.seq}: {rec.artifact_id} is pending: {have} of {need} promoter "
                        f"signatures, {need - have} still missing; each other promoter runs the same command "
                        "to add theirs", highlight=False)
        return
    told = None
    if rec.rollout is not None:
        # Tell the rollout-channel deployment at once (it turns its 5-minute schedule on); the one
        # place besides pull and node report that reaches the flows package, lazily.
        from buildctl.flows.events import emit_rollout_started

        told = emit_rollout_started(rec.profile, rec.channel, rec.compat_key, rec.artifact_id, rec.seq)
    if want_json(ctx, json_out):
        emit_json({**_record_json(rec), **({"rollout_event": told} if rec.rollout is not None else {})})
    else:
        out().print(f"{rec.channel} #{rec.seq}: {rec.profile} [{rec.compat_key}] -> {rec.artifact_id}"
                    f" (was {rec.previous or 'none'}){' FORCED' if rec.forced else ''}", highlight=False)
        if rec.rollout is not None:
            waves = ", ".join(f"{w.percent:g}% (max failures {w.max_failures})" for w in rec.rollout.waves)
            out().print(f"rollout started: waves {waves}; bake {rec.rollout.bake_s:g}s. Nodes outside the wave keep "
                        f"{rec.rollout.base}. Follow it: buildctl rollout status --profile {rec.profile} "
                        f"--channel {rec.channel}", highlight=False)
            if told is None:
                out().print("no Prefect API to tell (PREFECT_API_URL): the rollout-channel deployment's hourly run "
                            "picks it up", highlight=False)


def _verified(r) -> str:
    """What a record's gate relied on: a re-hash, a trusted earlier deep verify, or none (a rollout step)."""
    if r.verified_at is None:
        return ""
    if not r.verify_window_s:
        return f"re-hashed at the gate ({r.verified_at})"
    from buildctl.core.times import format_duration

    return f"trusted a verify within {format_duration(r.verify_window_s)} ({r.verified_at})"


def _history_table(records, problems: dict | None = None) -> Table:
    problems = problems or {}
    t = Table()
    for c in ("seq", "compat key", "action", "artifact", "previous", "who", "when", "bytes checked", "reason"):
        t.add_column(c)
    for r in records:
        bad = problems.get((r.compat_key, r.seq))
        t.add_row(str(r.seq), r.compat_key, (f"FORGED? {bad}: " if bad else "") + r.action
                  + (" (forced)" if r.forced else ""), short_id(r.artifact_id),
                  short_id(r.previous), r.who, r.when, _verified(r), r.reason or "")
    return t


def history_cmd(
    ctx: typer.Context,
    profile: str = typer.Option(..., "--profile", help="Profile name."),
    channel: str = typer.Option(..., "--channel", help="Channel name."),
    compat_key: Optional[str] = typer.Option(None, "--compat-key", help="Only this compat key."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the newest N records of each compat key."),
    since_seq: int = typer.Option(0, "--since-seq", min=0, help="Only records after this sequence number."),
    json_out: bool = JSON_OPT,
) -> None:
    """The channel's promotion history, oldest first; only the records shown are read. A record no
    reader may act on (ahead of the ref, unsigned on a signed channel, not linked to the record
    after it) is marked FORGED? with why (`problem` in --json)."""
    from buildctl.artifact_store.errors import ChannelNotFoundError
    from buildctl.artifact_store.channels import history, record_problems

    skipped: list[tuple[str, str]] = []
    c = context(ctx)
    recs = history(c.store, profile, channel, compat_key, skipped, since_seq=since_seq, limit=limit)
    if not recs and not skipped and not since_seq:  # after --since-seq, nothing newer is an empty answer
        from buildctl.artifact_store.node.pull import unknown_name

        raise ChannelNotFoundError(profile, channel, [compat_key or "<any>"],
                                   unknown_name(context(ctx).store, profile, channel))
    problems = record_problems(c.store, recs, c.auth.trusted)
    if want_json(ctx, json_out):
        emit_json([{**_record_json(r), **({"problem": problems[(r.compat_key, r.seq)]}
                                          if (r.compat_key, r.seq) in problems else {})} for r in recs])
    else:
        out().print(_history_table(recs, problems))
    fail_on_skipped("history", skipped)


def rollback_cmd(
    ctx: typer.Context,
    profile: str = typer.Option(..., "--profile", help="Profile name."),
    channel: str = typer.Option(..., "--channel", help="Channel name."),
    to: Optional[str] = typer.Option(None, "--to", help="Artifact to go back to (default: the one before the current)."),
    compat_key: Optional[str] = typer.Option(None, "--compat-key", help="Which compat key's ref, when there are several."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why; recorded in the history."),
    trust_verify_within: Optional[str] = TRUST_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Point the channel back at an earlier artifact (recorded as a new promotion), after
    re-hashing every blob of it unless --trust-verify-within allows a recent deep verify."""
    from buildctl.artifact_store.promotion import rollback
    from buildctl.core.times import parse_duration

    c = context(ctx)
    rec = rollback(c.store, profile, channel, auth=c.auth, to=to, compat_key=compat_key, reason=reason,
                   trust_verify_within_s=parse_duration(trust_verify_within) if trust_verify_within else 0.0)
    if want_json(ctx, json_out):
        emit_json(_record_json(rec))
    else:
        out().print(f"{rec.channel} #{rec.seq}: rolled back to {rec.artifact_id} (was {rec.previous})", highlight=False)
