"""Fleet reconcile: the plan for 10k, 100k and 1M simulated nodes, 50 fingerprints, 20 profiles.

    python -m benchmarks.reconcile [--sizes 10000,100000,1000000]

Goal: linear growth, and < 1 s at 100k nodes.
"""

from __future__ import annotations

import argparse
import random

from benchmarks.common import finish, fmt_spread, spread, table, timed
from buildctl.steps.fleet import plan_builds


def fleet(n: int, n_fps: int = 50, n_profiles: int = 20, seed: int = 11):
    rng = random.Random(seed)
    fps = [{"trtllm": f"trtllm-{i:032x}", "aoti": f"aoti-{i % 7:032x}"} for i in range(n_fps)]
    profiles = {f"profile-{j:02d}": ("trtllm" if j % 5 else "aoti") for j in range(n_profiles)}
    names = sorted(profiles)
    combos = [tuple(rng.sample(names, rng.randint(1, 3))) for _ in range(256)]
    nodes = [(combos[rng.randrange(256)], fps[rng.randrange(n_fps)]) for _ in range(n)]
    have = {(p, fps[i][profiles[p]]) for i in range(0, n_fps, 3) for p in names}
    return nodes, profiles, have


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    rows, per_node, seconds = [], {}, {}
    for n in (int(x) for x in args.sizes.split(",")):
        nodes, profiles, have = fleet(n)
        ts = [timed(lambda: plan_builds(nodes, profiles, have))[0] for _ in range(args.reps)]
        t = spread(ts)[0]
        plan = plan_builds(nodes, profiles, have)
        seconds[n], per_node[n] = t, t / n * 1e6
        rows.append([f"{n:,}", fmt_spread(ts, 3), f"{per_node[n]:.2f}", len(plan)])
    sizes = sorted(seconds)
    growth = per_node[sizes[-1]] / per_node[sizes[0]]
    at_100k = seconds.get(100_000)
    text = table(f"reconcile plan (50 fingerprints, 20 profiles); median (min-max) of {args.reps}",
                 ["nodes", "seconds", "µs per node (median)", "builds planned"], rows)
    text += (f"\n\nGoal: linear (µs per node from {sizes[0]:,} to {sizes[-1]:,} nodes: x{growth:.2f}) and < 1 s at 100k"
             + (f" ({at_100k:.3f} s)." if at_100k is not None else " (not measured)."))
    finish("reconcile", text, {"seconds": {str(k): round(v, 4) for k, v in seconds.items()},
                               "per_node_growth": round(growth, 3), "goal_100k_s": 1.0,
                               "met": (at_100k is None or at_100k < 1.0) and growth < 2.0})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
