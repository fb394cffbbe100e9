"""``buildctl worth``: is a served model's engine worth its operational cost over its vLLM bundle?"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from buildctl.cli._common import context, emit_json, out, short_id, want_json


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _interval(r: dict | None) -> str:
    if r is None:
        return "-"
    return f"{r['median']:.2f} [{_fmt(r['low'])}, {_fmt(r['high'])}]"


def worth_cmd(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="Served model name (<profile dir>/models/NAME.yaml): its first runtime is the engine, its second the bundle."),
    channel: str = typer.Option("prod", "--channel", help="The channel both runtimes are served from."),
    traffic: Optional[Path] = typer.Option(None, "--traffic", help="Observed requests, JSON lines with output_tokens and timestamp (profile suggest's input): the tokens a day to serve."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, max=2**24, help="The level to decide at (default: the measured level nearest the traffic's median concurrency, else the highest)."),
    invalidations_per_month: Optional[float] = typer.Option(None, "--invalidations-per-month", min=0.0, max=10_000.0, help="Engine rebuilds a month forced by compat-key changes, instead of counting them in the channel's history."),
    min_history_days: float = typer.Option(7.0, "--min-history-days", min=0.0, max=3650.0, help="The shortest history span the invalidation rate is counted over."),
    json_out: bool = typer.Option(False, "--json", help="JSON output: per compat key, a ratio per level, the figures and the verdict."),
) -> None:
    """Is the engine worth it? Per compat key: engine-over-bundle ratios, GPU-hours saved against build cost, payback.

    From the attestations (the throughput and p99 TTFT ratios of engine over bundle, with their
    intervals), the traffic, the provenance (build GPU-seconds) and the history (invalidations):
    GPU-hours saved a day against the builds invalidations cost, payback in days, and a verdict.
    "not enough data" names what is missing; docs/validation.md has the formula."""
    from buildctl.engines.sizing import read_traffic
    from buildctl.steps.profiles import served_model_by_name
    from buildctl.steps.worth import WorthInputs, worth

    c = context(ctx)
    served = served_model_by_name(c.settings, model)
    inputs = WorthInputs(channel=channel, traffic=read_traffic(traffic) if traffic is not None else None,
                         concurrency=concurrency, invalidations_per_month=invalidations_per_month,
                         min_history_days=min_history_days)
    answers = worth(c, served, inputs)
    if want_json(ctx, json_out):
        emit_json({"model": served.name, "engine": served.runtimes[0], "bundle": served.runtimes[1],
                   "channel": channel, "keys": [a.to_json() for a in answers]})
        return
    if not answers:
        out().print(f"not enough data: {served.runtimes[0]} has no artifact on {channel}", highlight=False)
        return
    for a in (x.to_json() for x in answers):
        t = Table(title=f"{served.name}: {served.runtimes[0]} over {served.runtimes[1]}, compat key {a['compat_key']}")
        for col in ("concurrency", "throughput ratio", "p99 TTFT ratio", "bundle tok/s/GPU"):
            t.add_column(col)
        for lv in a["levels"]:
            mark = " *" if lv["concurrency"] == a["concurrency"] else ""
            t.add_row(f"{lv['concurrency']}{mark}", _interval(lv["ratio"]["throughput"]),
                      _interval(lv["ratio"]["ttft_p99"]), f"{lv['bundle_tok_s_per_gpu']:.1f}")
        out().print(t)
        out().print(f"engine {short_id(a['engine_artifact'])}, bundle {short_id(a['bundle_artifact'])} "
                    f"({a['bundle_compat_key'] or '-'})", highlight=False)
        if a["verdict"] == "not enough data":
            out().print("verdict: not enough data: " + "; ".join(a["missing"]), highlight=False)
            continue
        lo, mid, hi = a["gpu_hours_saved_per_day"]
        pay = a["payback_days"]
        out().print(f"traffic {a['tokens_per_day']:.0f} output tokens/day = {a['gpu_hours_per_day_bundle']:.3f} GPU-h/day "
                    f"on the bundle; saved {mid:.3f} [{lo:.3f}, {hi:.3f}] GPU-h/day at c={a['concurrency']}; "
                    f"builds cost {a['build_cost_gpu_hours_per_day']:.4f} GPU-h/day ({a['build_gpu_seconds']:.0f} "
                    f"GPU-s each, {a['invalidations_per_day'] * 30:.2f}/month, {a['invalidations_source']}); "
                    f"payback {_fmt(pay[1], '.2f')} days", highlight=False)
        out().print(f"verdict: {a['verdict']}" + "".join(f"; {n}" for n in a["notes"]), highlight=False)
