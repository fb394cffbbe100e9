"""Build cache: a repeated ``buildctl build`` of a built key against the first build.

    python -m benchmarks.cache

Goal: the cache hit takes < 2% of the build time, and no builder process is started (counted by
wrapping the one function that starts build subprocesses).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import finish, table, timed
from buildctl import pipeline
from buildctl.engines import isolate
from buildctl.engines.profile import load_profile
from buildctl.settings import load_settings
from buildctl.store.backend import open_store

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    started: list[str] = []
    real = isolate.run_step

    def counting(backend, step, cmd, **kw):
        started.append(step)
        return real(backend, step, cmd, **kw)

    isolate.run_step = counting
    import buildctl.engines.aoti as aoti

    aoti.run_step = counting
    profile = load_profile(REPO / "build_profiles" / "tiny-llama-cpu.yaml")
    with tempfile.TemporaryDirectory() as d:
        store = open_store(str(Path(d) / "store"))
        settings = load_settings()
        pipeline.resolve_model(settings, profile)  # the tiny model is made (or cached) before timing
        first_s, first = timed(lambda: pipeline.build(settings, store, profile, workdir=Path(d) / "work"))
        builders_first = len(started)
        hit_s, hit = timed(lambda: pipeline.build(settings, store, profile, workdir=Path(d) / "work"))
        builders_hit = len(started) - builders_first
    ratio = hit_s / first_s
    rows = [["first build (aoti, tiny model)", f"{first_s:.2f}", builders_first, "miss"],
            ["repeated build, same key", f"{hit_s:.3f}", builders_hit, "hit" if hit.cache_hit else "MISS"]]
    text = table("build cache", ["run", "seconds", "builder processes", "cache"], rows)
    text += f"\n\nGoal: hit < 2% of the build time ({ratio:.2%}) and no builder process ({builders_hit})."
    finish("cache", text, {"first_s": round(first_s, 3), "hit_s": round(hit_s, 4), "ratio": round(ratio, 5),
                           "builders_on_hit": builders_hit, "goal": 0.02,
                           "met": ratio < 0.02 and builders_hit == 0 and hit.cache_hit
                           and hit.artifact_id == first.artifact_id})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
