"""Pipeline stage times of the tiny CPU pipeline: model, build, publish, validate (reference
start-up, parity, speed), promote, pull. They show where the time goes.

    python -m benchmarks.pipeline
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import finish, table

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    os.chdir(REPO)
    from buildctl import pipeline
    from buildctl.engines.profile import load_profile
    from buildctl.engines.tiny import make_tiny
    from buildctl.settings import load_settings
    from buildctl.store.backend import open_store
    from buildctl.store.pull import install_artifact

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
        plan = pipeline.plan_build(settings, store, profile)
        stages.append(("fingerprint + model digest + cache lookup", time.perf_counter() - t))
        t = time.perf_counter()
        built = pipeline.run_build(settings, plan, workdir=work)
        stages.append(("build (aoti compile, subprocess)", time.perf_counter() - t))
        t = time.perf_counter()
        pub = pipeline.publish_build(settings, store, built)
        stages.append(("publish (hash + store)", time.perf_counter() - t))
        shutil.rmtree(built.run_dir, ignore_errors=True)
        marks: list[tuple[str, float]] = [("start", time.perf_counter())]

        def say(msg: str) -> None:
            for key in ("starting the vLLM reference", "parity:", "speed:"):
                if msg.startswith(key):
                    marks.append((key, time.perf_counter()))

        res = pipeline.validate_artifact(settings, store, pub.artifact_id, say=say)
        marks.append(("end", time.perf_counter()))
        names = {"start": "validate: pull + load the engine", "starting the vLLM reference": "validate: vLLM reference start-up",
                 "parity:": "validate: parity", "speed:": "validate: speed (paired repetitions)"}
        for (k, a), (_, b) in zip(marks, marks[1:]):
            stages.append((names[k], b - a))
        t = time.perf_counter()
        pipeline.promote_artifact(settings, store, res.artifact_id, "staging")
        stages.append(("promote", time.perf_counter() - t))
        t = time.perf_counter()
        install_artifact(store, res.artifact_id, work / "node", preflight=pipeline.preflight_for(settings))
        stages.append(("pull (download + verify + preflight + install)", time.perf_counter() - t))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(s for _, s in stages)
    rows = [[name, f"{s:.2f}", f"{s / total:.0%}"] for name, s in stages]
    text = table("tiny CPU pipeline stage times", ["stage", "seconds", "share"], rows)
    text += f"\n\nTotal {total:.1f} s."
    finish("pipeline", text, {"stages": {n: round(s, 3) for n, s in stages}, "total_s": round(total, 2)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
