"""Rollout at fleet scale, in simulation: N nodes pull a 70 GB TP8 engine from S3 through waves.

    python -m benchmarks.rollout [--nodes 1000,10000] [--size-gb 70] [--node-gbps 25] [--egress-gbps 100]
                                 [--waves 1,10,50,100] [--bake-min 30] [--poll-s 60] [--tick-s 300] [--rack 32]

Nothing is timed: this is a fluid model, computed exactly from its parameters (seeded, so the same
table every run). Each node polls the channel every ``poll`` seconds, so it starts pulling at a
uniformly random moment within ``poll`` after its wave opens. A download runs at the node's
bandwidth, unless the store's egress limit is shared by more downloads than it can feed at that
rate: then every download from the store gets an equal share (``min(node, egress / active)``).
With waves, the rollout-channel flow (a run every ``tick`` seconds) opens the next wave at its
first run after the bake time; a wave's downloads need not have finished (the bake runs from the
wave's start, as buildctl's does). With a pull-through cache, one cache per ``rack`` nodes fetches
the engine from the store once (at the node bandwidth, sharing egress), and the rack's nodes then
read it from the cache at their own bandwidth (the cache's own limits are not modelled).

Reported per scenario: time until every node has the engine, when the first wave finished, the
peak store egress, and the bytes read from the store. Install time after the download (a local
copy and a preflight load) is not included.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from dataclasses import dataclass

from benchmarks.common import finish, table
from buildctl.artifact_store.fleet.waves import wave_bucket

GB = 1e9
GBIT = 1e9 / 8


@dataclass(frozen=True)
class Params:
    nodes: int
    size: float  # bytes
    node_bw: float  # bytes/s
    egress: float  # bytes/s
    waves: tuple[float, ...]  # cumulative percentages; (100,) is everything at once
    bake_s: float
    poll_s: float
    tick_s: float
    rack: int | None  # nodes per pull-through cache; None: no cache
    seed: int = 5


@dataclass
class Outcome:
    done_s: float  # every node has the engine
    first_wave_done_s: float
    peak_egress: float  # bytes/s
    store_bytes: float


def simulate(p: Params) -> Outcome:
    """The fluid model above; exact up to floating point, O(N log N)."""
    rng = random.Random(p.seed)
    ids = [f"node-{i:05d}" for i in range(p.nodes)]
    bucket = {n: wave_bucket("llama-3-70b-instruct-fp8-tp8", "prod", n) for n in ids}
    # wave opening times: the first flow run after each bake (the first wave opens at 0)
    opens = [0.0]
    for _ in p.waves[1:]:
        opens.append(math.ceil((opens[-1] + p.bake_s) / p.tick_s) * p.tick_s if p.tick_s else opens[-1] + p.bake_s)
    wave_of = {n: next(i for i, pct in enumerate(p.waves) if bucket[n] < pct or pct >= 100) for n in ids}
    starts = sorted((opens[wave_of[n]] + rng.uniform(0, p.poll_s), n) for n in ids)

    # Downloads from the store share the egress; the virtual clock V is the bytes each active one has
    # received since t=0 (all active origin downloads run at the same rate).
    t, V = 0.0, 0.0
    origin: list[tuple[float, str]] = []  # (V at which it completes, key)
    local: list[tuple[float, str]] = []  # (completion time, node)
    rack_state: dict[int, str] = {}
    waiting: dict[int, list[str]] = {}
    done: dict[str, float] = {}
    peak, store_bytes = 0.0, 0.0
    si = 0

    def rate() -> float:
        return min(p.node_bw, p.egress / len(origin)) if origin else 0.0

    while len(done) < p.nodes:
        r = rate()
        peak = max(peak, r * len(origin))
        t_origin = t + (origin[0][0] - V) / r if origin else math.inf
        t_local = local[0][0] if local else math.inf
        t_start = starts[si][0] if si < len(starts) else math.inf
        t_next = min(t_origin, t_local, t_start)
        V += r * (t_next - t)
        t = t_next
        if t_next == t_origin:
            _, key = heapq.heappop(origin)
            if key.startswith("rack:"):
                rk = int(key[5:])
                rack_state[rk] = "ready"
                for n in waiting.pop(rk, []):
                    heapq.heappush(local, (t + p.size / p.node_bw, n))
            else:
                done[key] = t
        elif t_next == t_local:
            _, n = heapq.heappop(local)
            done[n] = t
        else:
            _, n = starts[si]
            si += 1
            if p.rack is None:
                heapq.heappush(origin, (V + p.size, n))
                store_bytes += p.size
                continue
            rk = int(n.split("-")[1]) // p.rack
            state = rack_state.get(rk)
            if state == "ready":
                heapq.heappush(local, (t + p.size / p.node_bw, n))
            else:
                waiting.setdefault(rk, []).append(n)
                if state is None:
                    rack_state[rk] = "filling"
                    heapq.heappush(origin, (V + p.size, f"rack:{rk}"))
                    store_bytes += p.size
    first = [n for n in ids if wave_of[n] == 0]
    return Outcome(done_s=max(done.values()), first_wave_done_s=max(done[n] for n in first) if first else 0.0,
                   peak_egress=peak, store_bytes=store_bytes)


def hm(seconds: float) -> str:
    m = round(seconds / 60)
    return f"{m // 60}h{m % 60:02d}" if m >= 60 else f"{seconds / 60:.1f} min"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1000,10000")
    ap.add_argument("--size-gb", type=float, default=70.0)
    ap.add_argument("--node-gbps", type=float, default=25.0, help="per-node download bandwidth, Gbit/s")
    ap.add_argument("--egress-gbps", type=float, default=100.0, help="the store's egress limit, Gbit/s")
    ap.add_argument("--waves", default="1,10,50,100")
    ap.add_argument("--bake-min", type=float, default=30.0)
    ap.add_argument("--poll-s", type=float, default=60.0)
    ap.add_argument("--tick-s", type=float, default=300.0)
    ap.add_argument("--rack", type=int, default=32, help="nodes per pull-through cache in the cache rows")
    args = ap.parse_args(argv)
    waves = tuple(float(x) for x in args.waves.split(","))
    rows, results = [], {}
    for n in (int(x) for x in args.nodes.split(",")):
        for label, w, rack in (("all at once", (100.0,), None), (f"waves {args.waves}", waves, None),
                               ("all at once, cache", (100.0,), args.rack), (f"waves {args.waves}, cache", waves, args.rack)):
            p = Params(nodes=n, size=args.size_gb * GB, node_bw=args.node_gbps * GBIT, egress=args.egress_gbps * GBIT,
                       waves=w, bake_s=args.bake_min * 60, poll_s=args.poll_s, tick_s=args.tick_s, rack=rack)
            o = simulate(p)
            key = f"{n}/{label}"
            results[key] = {"done_s": round(o.done_s, 1), "first_wave_done_s": round(o.first_wave_done_s, 1),
                            "peak_egress_gbps": round(o.peak_egress / GBIT, 1), "store_tb": round(o.store_bytes / 1e12, 2)}
            rows.append([f"{n:,}", label, hm(o.done_s), hm(o.first_wave_done_s) if len(w) > 1 else "",
                         f"{o.peak_egress / GBIT:.0f}", f"{o.store_bytes / 1e12:.1f}"])
    text = table(f"rollout of a {args.size_gb:g} GB engine: {args.node_gbps:g} Gbit/s per node, store egress limit "
                 f"{args.egress_gbps:g} Gbit/s, poll {args.poll_s:g} s, bake {args.bake_min:g} min, flow every "
                 f"{args.tick_s:g} s, cache per {args.rack} nodes (a fluid model, not a measurement)",
                 ["nodes", "rollout", "time to 100%", "first wave done", "peak store egress, Gbit/s", "read from store, TB"],
                 rows)
    finish("rollout", text, {"params": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
