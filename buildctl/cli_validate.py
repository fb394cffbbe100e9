"""``buildctl validate``: parity and speed side by side with vLLM, stored as an attestation."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from buildctl.cli import app, emit_json, open_store_for, out, want_json


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def render(att: dict) -> list:
    """Tables for a human: parity, then speed side by side per concurrency level."""
    p = att["parity"]
    head = Table(title=f"validation of {att['artifact_id']}: {att['verdict'].upper()}", show_header=False)
    head.add_column("k")
    head.add_column("v")
    head.add_row("parity", f"{'pass' if p['passed'] else 'FAIL'}: {p['identical']} identical, {p['close']} close, "
                           f"{p['failed']} failed of {p['prompts']} prompts; max |Δlogprob| {p['max_abs_logprob_diff']:.2e}")
    head.add_row("prompt set", f"{att['prompt_set']['digest']} ({', '.join(att['prompt_set']['sets'])}"
                               + (f"; skipped {', '.join(att['prompt_set']['skipped'])}" if att['prompt_set']['skipped'] else "") + ")")
    head.add_row("reference", str(att["versions"]["vllm"]))
    head.add_row("compat key", att["compat_key"])
    for r in att["reasons"]:
        head.add_row("reason", r)
    speed = Table(title="speed (candidate | vLLM reference)")
    for c in ("conc", "tok/s", "ratio", "TTFT p50 ms", "TTFT p99 ms", "p99 ratio", "TPOT p50 ms", "ITL p99 ms", "tok/s CV", "gate"):
        speed.add_column(c)
    for lv in att["speed"]["levels"]:
        c, r = lv["candidate"], lv["reference"]
        speed.add_row(str(lv["concurrency"]), f"{c['output_tok_s']:.0f} | {r['output_tok_s']:.0f}", _fmt(lv["throughput_ratio"]),
                      f"{c['ttft_p50_ms']:.1f} | {r['ttft_p50_ms']:.1f}", f"{c['ttft_p99_ms']:.1f} | {r['ttft_p99_ms']:.1f}",
                      _fmt(lv["p99_ttft_ratio"]), f"{c['tpot_p50_ms']:.2f} | {r['tpot_p50_ms']:.2f}",
                      f"{c['itl_p99_ms']:.2f} | {r['itl_p99_ms']:.2f}",
                      f"{c['output_tok_s_cv']:.2f} | {r['output_tok_s_cv']:.2f}", "pass" if lv["passed"] else "FAIL")
    return [head, speed]


@app.command("validate")
def validate_cmd(
    ctx: typer.Context,
    artifact: str = typer.Argument(..., help="Artifact id or unique hex prefix."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Extra JSONL prompts: {\"prompt_token_ids\": [...]} or {\"prompt\": \"...\"} per line."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="The artifact's profile file (default: build_profiles/<name>.yaml)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output (the attestation)."),
) -> None:
    """Validate an artifact against vLLM (parity and speed); write an attestation; exit 5 on fail."""
    from validators.errors import ValidationFailedError
    from validators.validate import validate_artifact

    store = open_store_for(ctx)
    quiet = want_json(ctx, json_out)
    say = (lambda m: None) if quiet else (lambda m: typer.echo(f"[validate] {m}", err=True))
    try:
        res = validate_artifact(store, artifact, profile_file=profile, prompts_file=prompts, say=say)
        att, att_id = res.attestation, res.attestation_id
        failure = None
    except ValidationFailedError as err:
        from artifact_store.ops import list_attestations

        att = next(a for a in reversed(list_attestations(store, err.artifact_id)))
        att_id, failure = err.attestation_id, err
    if quiet:
        emit_json({"attestation_id": att_id, **att})
    else:
        for t in render(att):
            out().print(t)
        out().print(f"attestation {att_id}")
    if failure is not None:
        raise failure
