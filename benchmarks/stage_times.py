"""Pipeline stage times of the tiny CPU pipeline: model, build, publish, validate (reference
start-up, parity, speed), promote, pull. They show where the time goes: median (min-max) of
``--runs`` whole runs (5 by default), each from a cold tiny model and an empty store.

    python -m benchmarks.stage_times [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import finish, fmt_spread, spread, table
from buildctl.steps.context import Context

REPO = Path(__file__).resolve().parent.parent


def one_run() -> list[tuple[str, float]]:
    from buildctl.steps import build, host, promote, validate
    from buildctl.engines.profile import load_profile
    from buildctl.engines.tiny import make_tiny
    from buildctl.core.settings import load_settings
    from buildctl.artifact_store.backends.store import open_store
    from buildctl.artifact_store.node.install_dir import install_artifact

    profile = load_profile(REPO / "build_profiles" / "tiny-llama-cpu.yaml")
    work = Path(tempfile.mkdtemp(prefix="buildctl-bench-pipeline-"))
    settings = load_settings(cache_dir=work / "cache")  # a cold tiny model, made in this run
    stages: list[tuple[str, float]] = []
    try:
        t = time.perf_counter()
        make_tiny(profile.model.tiny, settings.cache_dir)
        stages.append(("model (make + train the tiny Llama)", time.perf_counter() - t))
        store = open_store(str(work / "store"))
        t = time.perf_counter()
        plan = build.plan_build(Context.from_settings(settings, store=store), profile)
        stages.append(("fingerprint + model digest + cache lookup", time.perf_counter() - t))
        t = time.perf_counter()
        built = build.run_build(settings, plan, workdir=work)
        stages.append(("build (aoti compile, subprocess)", time.perf_counter() - t))
        t = time.perf_counter()
        pub = build.publish(Context.from_settings(settings, store=store), built)
        stages.append(("publish (hash + store)", time.perf_counter() - t))
        shutil.rmtree(built.run_dir, ignore_errors=True)
        marks: list[tuple[str, float]] = [("start", time.perf_counter())]

        def say(msg: str) -> None:
            for key in ("starting the vLLM reference", "parity:", "speed:"):
                if msg.startswith(key):
                    marks.append((key, time.perf_counter()))

        res = validate.validate(Context.from_settings(settings, store=store), pub.artifact_id, say=say)
        marks.append(("end", time.perf_counter()))
        names = {"start": "validate: pull + load the engine", "starting the vLLM reference": "validate: vLLM reference start-up",
                 "parity:": "validate: parity", "speed:": "validate: speed (paired repetitions)"}
        for (k, a), (_, b) in zip(marks, marks[1:]):
            stages.append((names[k], b - a))
        t = time.perf_counter()
        promote.promote(Context.from_settings(settings, store=store), res.artifact_id, "staging")
        stages.append(("promote", time.perf_counter() - t))
        t = time.perf_counter()
        install_artifact(store, res.artifact_id, work / "node", preflight=host.preflight_for(settings))
        stages.append(("pull (download + verify + preflight + install)", time.perf_counter() - t))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return stages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--single", action="store_true", help="one run in this process; print its stages as JSON")
    args = ap.parse_args(argv)
    os.chdir(REPO)
    if args.single:
        print(json.dumps(one_run()))
        return 0
    runs = []
    for _ in range(args.runs):  # a process per run: vLLM keeps per-process state
        out = subprocess.run([sys.executable, "-m", "benchmarks.stage_times", "--single"], check=True, cwd=REPO,
                             capture_output=True, text=True).stdout
        runs.append([tuple(x) for x in json.loads(out.strip().splitlines()[-1])])
    names = [n for n, _ in runs[0]]
    per = {n: [dict(r)[n] for r in runs] for n in names}
    totals = [sum(s for _, s in r) for r in runs]
    total = spread(totals)[0]
    rows = [[n, fmt_spread(per[n]), f"{spread(per[n])[0] / total:.0%}"] for n in names]
    text = table(f"tiny CPU pipeline stage times; median (min-max) of {args.runs} runs",
                 ["stage", "seconds", "share of the median total"], rows)
    text += f"\n\nTotal {fmt_spread(totals, 1)} s."
    finish("stage_times", text, {"stages": {n: [round(x, 3) for x in v] for n, v in per.items()},
                              "total_s": [round(x, 2) for x in totals], "runs": args.runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
