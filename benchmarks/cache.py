"""Build cache: a repeated ``buildctl build`` of a built key against the first build.

    python -m benchmarks.cache

Goal: the cache hit takes < 2% of the build time, and no builder process is started (counted by
wrapping the one function that starts build subprocesses).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.common import finish, fmt_spread, spread, table, timed
from buildctl.steps import build, profiles
from buildctl.engines import isolate
from buildctl.engines.profile import load_profile
from buildctl.core.settings import load_settings
from buildctl.artifact_store.backends.store import open_store
from buildctl.steps.context import Context

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    started: list[str] = []
    real = isolate.run_step

    def counting(backend, step, cmd, **kw):
        started.append(step)
        return real(backend, step, cmd, **kw)

    isolate.run_step = counting
    import buildctl.engines.aoti.backend as aoti

    aoti.run_step = counting
    profile = load_profile(REPO / "build_profiles" / "tiny-llama-cpu.yaml")
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    reps = ap.parse_args(argv).reps
    firsts, hits, ratios, hit_builders, ok = [], [], [], [], True
    for _ in range(reps):  # each round: a new store, a first build, then the same key again
        with tempfile.TemporaryDirectory() as d:
            store = open_store(str(Path(d) / "store"))
            settings = load_settings()
            profiles.resolve_model(settings, profile)  # the tiny model is made (or cached) before timing
            first_s, first = timed(lambda: build.build(Context.from_settings(settings, store=store), profile, workdir=Path(d) / "work"))
            builders_first = len(started)
            hit_s, hit = timed(lambda: build.build(Context.from_settings(settings, store=store), profile, workdir=Path(d) / "work"))
            hit_builders.append(len(started) - builders_first)
            ok = ok and hit.cache_hit and hit.artifact_id == first.artifact_id
        firsts.append(first_s)
        hits.append(hit_s)
        ratios.append(hit_s / first_s)
    ratio = spread(ratios)[0]
    rows = [["first build (aoti, tiny model)", fmt_spread(firsts), "1 per build", "miss"],
            ["repeated build, same key", fmt_spread(hits, 3), max(hit_builders), "hit" if ok else "MISS"]]
    text = table(f"build cache; median (min-max) of {reps} rounds", ["run", "seconds", "builder processes", "cache"], rows)
    text += (f"\n\nGoal: hit < 2% of the build time (median per-round ratio {ratio:.2%}, "
             f"{fmt_spread([r * 100 for r in ratios], 3)} %) and no builder process ({max(hit_builders)}).")
    finish("cache", text, {"first_s": [round(x, 3) for x in firsts], "hit_s": [round(x, 4) for x in hits],
                           "ratio": round(ratio, 5), "ratios": [round(x, 5) for x in ratios], "reps": reps,
                           "builders_on_hit": max(hit_builders), "goal": 0.02,
                           "met": ratio < 0.02 and max(hit_builders) == 0 and ok})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
